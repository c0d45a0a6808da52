//! The connection layer: our own accept loop around hyper, because `axum::serve` exposes none of
//! hyper's timeouts and has no drain deadline.
//!
//! * Open connections are capped (`server.max_connections`): beyond the cap a new connection gets a
//!   minimal HTTP/1.1 503 with `retry-after` written straight to the socket and is closed, without
//!   reading its request (cheaper than serving it; counted as `mmrouter_shed_total{reason="connections"}`).
//! * HTTP/1 request heads must arrive within `server.header_read_timeout_ms` (hyper's timer, which also
//!   runs while a keep-alive connection waits for its next request); a connection with no request in
//!   flight for `server.idle_timeout_ms` is closed (HTTP/1 and HTTP/2, and a client that never sends
//!   its first bytes).
//! * Shutdown: `/health` turns `draining`, new connections are still accepted for
//!   `server.drain_delay_ms`, then the listener closes, every connection is asked to finish its current
//!   request and close, and whatever is still open after `server.drain_timeout_ms` is cut.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::bodies::Guarded;
use super::drain::Draining;
use crate::config::ConnSettings;
use crate::observe::Observer;

/// Refusals written at once at most; beyond, an over-cap connection is simply closed.
const MAX_REFUSING: usize = 256;

/// What the connection layer is given: its own settings, the observer, the drain flag.
pub struct Shared {
    pub settings: ConnSettings,
    pub observe: Arc<Observer>,
    pub draining: Draining,
}

/// Serves `app` on `listener` until `shutdown` resolves, then drains (see the module doc).
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    shared: Arc<Shared>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let mut server = Server::new(app, shared);
    tokio::pin!(shutdown);
    server.accept_until(&listener, &mut shutdown).await;
    tracing::info!("shutting down: draining");
    server.shared.draining.start();
    server.accept_until(&listener, tokio::time::sleep(server.shared.settings.drain_delay)).await;
    drop(listener);
    server.drain().await;
}

struct Server {
    shared: Arc<Shared>,
    app: axum::Router,
    builder: Arc<auto::Builder<TokioExecutor>>,
    /// `None`: no connection cap.
    slots: Option<Arc<Semaphore>>,
    refusing: Arc<Semaphore>,
    conns: JoinSet<()>,
    /// Flipped once to ask every connection to finish and close.
    stop: watch::Sender<bool>,
}

impl Server {
    fn new(app: axum::Router, shared: Arc<Shared>) -> Server {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder.http1().timer(TokioTimer::new()).header_read_timeout(shared.settings.header_read_timeout);
        builder.http2().timer(TokioTimer::new());
        Server {
            slots: shared.settings.max_connections.map(|n| Arc::new(Semaphore::new(n))),
            shared,
            app,
            builder: Arc::new(builder),
            refusing: Arc::new(Semaphore::new(MAX_REFUSING)),
            conns: JoinSet::new(),
            stop: watch::channel(false).0,
        }
    }

    /// Accepts connections until `until` resolves, reaping finished connection tasks on the way.
    async fn accept_until(&mut self, listener: &TcpListener, until: impl Future<Output = ()>) {
        tokio::pin!(until);
        loop {
            tokio::select! {
                _ = &mut until => return,
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => self.admit(stream, peer),
                    Err(e) => {
                        // Typically out of file descriptors: back off instead of spinning.
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                Some(_) = self.conns.join_next(), if !self.conns.is_empty() => {}
            }
        }
    }

    fn admit(&mut self, stream: TcpStream, peer: SocketAddr) {
        let permit = match &self.slots {
            None => None,
            Some(slots) => match slots.clone().try_acquire_owned() {
                Ok(p) => Some(p),
                Err(_) => return self.refuse(stream),
            },
        };
        let _ = stream.set_nodelay(true);
        let conn = Conn {
            shared: self.shared.clone(),
            app: self.app.clone(),
            builder: self.builder.clone(),
            stop: self.stop.subscribe(),
            peer,
            _permit: permit,
        };
        self.conns.spawn(conn.run(stream));
    }

    /// Over the connection cap: a fast 503, then close.
    fn refuse(&self, stream: TcpStream) {
        self.shared.observe.shed("connections");
        let Ok(slot) = self.refusing.clone().try_acquire_owned() else { return };
        let retry_after = self.shared.settings.shed_retry_after_secs;
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(2), write_refusal(stream, retry_after)).await;
            drop(slot);
        });
    }

    /// Asks every connection to close after its current request; cuts the rest at the deadline.
    async fn drain(mut self) {
        let _ = self.stop.send(true);
        let deadline = tokio::time::sleep(self.shared.settings.drain_timeout);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut deadline => break,
                next = self.conns.join_next() => if next.is_none() { return },
            }
        }
        tracing::warn!(connections = self.conns.len(), "drain deadline reached: closing the connections left");
        for _ in 0..self.conns.len() {
            self.shared.observe.client_timeout("drain");
        }
        // Dropping a connection's task closes its socket.
        self.conns.shutdown().await;
    }
}

async fn write_refusal(mut stream: TcpStream, retry_after: u64) {
    let body = r#"{"error":{"message":"the router has too many open connections (server.max_connections); retry later","type":"server_error","code":"overloaded"}}"#;
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: {retry_after}\r\nx-mmrouter-error: overloaded\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    if stream.write_all(format!("{head}{body}").as_bytes()).await.is_err() {
        return;
    }
    let _ = stream.shutdown().await;
    // Read a little of what the client sent before closing: closing with unread bytes makes the
    // kernel send a reset, which can destroy the 503 before the client reads it.
    let mut sink = [0u8; 4096];
    let mut budget = 64 * 1024;
    let drain = async {
        while budget > 0 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => budget -= n.min(budget),
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_millis(250), drain).await;
}

/// One client connection.
struct Conn {
    shared: Arc<Shared>,
    app: axum::Router,
    builder: Arc<auto::Builder<TokioExecutor>>,
    stop: watch::Receiver<bool>,
    peer: SocketAddr,
    _permit: Option<OwnedSemaphorePermit>,
}

impl Conn {
    async fn run(mut self, stream: TcpStream) {
        let obs = &self.shared.observe;
        let open = obs.connections_open();
        open.increment(1.0);
        let activity = Arc::new(Activity::new());
        let service = self.service(activity.clone());
        let conn = self.builder.serve_connection(TokioIo::new(stream), service);
        tokio::pin!(conn);
        let mut closing = *self.stop.borrow();
        if closing {
            conn.as_mut().graceful_shutdown();
        }
        let idle = self.shared.settings.idle_timeout;
        loop {
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(e) = result {
                        if is_header_timeout(e.as_ref()) {
                            obs.client_timeout("header");
                        }
                    }
                    break;
                }
                _ = self.stop.changed(), if !closing => {
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
                _ = activity.idle_for(idle), if !closing => {
                    closing = true;
                    obs.client_timeout("idle");
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
        open.decrement(1.0);
    }

    /// The router as a hyper service that marks the connection busy while a response is out.
    fn service(
        &self,
        activity: Arc<Activity>,
    ) -> impl hyper::service::Service<
        hyper::Request<Incoming>,
        Response = axum::response::Response,
        Error = std::convert::Infallible,
        Future = impl Future<Output = Result<axum::response::Response, std::convert::Infallible>> + Send,
    > + Clone {
        let router = TowerToHyperService::new(self.app.clone());
        let peer = self.peer;
        hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
            req.extensions_mut().insert(ConnectInfo(peer));
            let busy = Busy::new(activity.clone());
            let fut = hyper::service::Service::call(&router, req);
            async move { fut.await.map(|resp| Guarded::wrap(resp, busy)) }
        })
    }
}

fn is_header_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    e.downcast_ref::<hyper::Error>().is_some_and(hyper::Error::is_timeout)
}

/// Requests in flight on one connection, and since when it has had none.
struct Activity {
    inflight: AtomicUsize,
    idle_since: Mutex<Instant>,
}

impl Activity {
    fn new() -> Activity {
        Activity { inflight: AtomicUsize::new(0), idle_since: Mutex::new(Instant::now()) }
    }

    /// Resolves once the connection has had no request in flight for `idle`.
    async fn idle_for(&self, idle: Duration) {
        loop {
            let since = *self.idle_since.lock().unwrap_or_else(|e| e.into_inner());
            if self.inflight.load(Ordering::Acquire) > 0 {
                tokio::time::sleep(idle).await;
            } else if since.elapsed() >= idle {
                return;
            } else {
                tokio::time::sleep_until(since + idle).await;
            }
        }
    }
}

/// Held from a request's arrival until its response is gone.
struct Busy(Arc<Activity>);

impl Busy {
    fn new(a: Arc<Activity>) -> Busy {
        a.inflight.fetch_add(1, Ordering::AcqRel);
        Busy(a)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        *self.0.idle_since.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        self.0.inflight.fetch_sub(1, Ordering::AcqRel);
    }
}
