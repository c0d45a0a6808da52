//! A TCP forwarder between the router and an engine that keeps every byte the router sent, per
//! connection: the fallback check compares them with the client's body. (One buffer for all
//! connections let a health check's or a metrics scrape's bytes land between two reads of the body.)

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub struct Tee {
    addr: std::net::SocketAddr,
    /// One buffer per connection accepted.
    received: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Tee {
    pub async fn start(upstream: &str) -> Tee {
        let target = upstream.trim_start_matches("http://").to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let sink = received.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (target, sink) = (target.clone(), sink.clone());
                let conn = {
                    let mut all = sink.lock().unwrap();
                    all.push(Vec::new());
                    all.len() - 1
                };
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(&target).await else { return };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = async move {
                        let mut buf = vec![0u8; 64 * 1024];
                        while let Ok(n) = cr.read(&mut buf).await {
                            // Kept before it is forwarded: once forwarded, the engine may answer (and
                            // the test look) before this task runs again on a loaded machine.
                            sink.lock().unwrap()[conn].extend_from_slice(&buf[..n]);
                            if n == 0 || sw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                        let _ = sw.shutdown().await;
                    };
                    let down = async move {
                        let _ = tokio::io::copy(&mut sr, &mut cw).await;
                    };
                    tokio::join!(up, down);
                });
            }
        });
        Tee { addr, received }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn received_contains(&self, body: &[u8]) -> bool {
        self.received.lock().unwrap().iter().any(|conn| conn.windows(body.len()).any(|w| w == body))
    }
}
