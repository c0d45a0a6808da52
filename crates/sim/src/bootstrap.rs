//! SGLang P/D's bootstrap as the simulator plays it. A prefill sim with `--bootstrap-port` serves
//! `GET /sim/bootstrap/{room}`: 200 `{"done": true}` once that room's prefill is over, 404 before. A
//! decode sim given `bootstrap_host`/`bootstrap_port`/`bootstrap_room` polls it ([`wait`]) until done or
//! `--bootstrap-timeout-ms`, then pulls the KV. The real protocol differs (SGLang's bootstrap server
//! registers ranks and the KV moves over Mooncake or NIXL); what the router sees is the same: both legs
//! sent at once, the decode leg waiting on the prefill's.
//!
//! The poll is a plain HTTP/1.1 GET over a TCP connection to a loopback address (the caller refuses
//! any other host), so the sim needs no HTTP client.

use std::collections::{HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::disagg::Bootstrap;
use crate::error::SimError;

/// Rooms remembered as done; the oldest are forgotten beyond this (their decode legs are long gone).
const ROOMS_KEPT: usize = 1 << 16;
/// Between two polls of a room not yet done.
const POLL_EVERY: Duration = Duration::from_millis(5);
/// One poll's connect, send and read, at most (loopback: anything slower is a stuck server).
const POLL_TIMEOUT: Duration = Duration::from_secs(1);
/// Bytes of a poll's answer read: the status line is all that is needed.
const ANSWER_BYTES: usize = 512;

/// The rooms whose prefill is over, bounded.
#[derive(Debug, Default)]
pub(crate) struct Rooms(Mutex<(HashSet<u64>, VecDeque<u64>)>);

impl Rooms {
    pub fn finish(&self, room: u64) {
        let mut guard = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (done, order) = &mut *guard;
        if !done.insert(room) {
            return;
        }
        order.push_back(room);
        if order.len() > ROOMS_KEPT {
            if let Some(old) = order.pop_front() {
                done.remove(&old);
            }
        }
    }

    pub fn is_done(&self, room: u64) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).0.contains(&room)
    }
}

/// The bootstrap endpoint's routes over a prefill sim's rooms.
pub(crate) fn router(rooms: Arc<Rooms>) -> Router {
    Router::new().route("/sim/bootstrap/{room}", get(room)).with_state(rooms)
}

async fn room(State(rooms): State<Arc<Rooms>>, Path(room): Path<u64>) -> Response {
    if rooms.is_done(room) {
        return Json(json!({"done": true})).into_response();
    }
    (StatusCode::NOT_FOUND, Json(json!({"done": false}))).into_response()
}

/// Polls the prefill's bootstrap until `b.room` is done, or fails after `timeout` (SGLang answers a
/// decode whose transfer never came with 500).
pub(crate) async fn wait(b: &Bootstrap, timeout: Duration) -> Result<(), SimError> {
    let addr = SocketAddr::new(b.ip, b.port);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if poll(addr, b.room).await == Some(200) {
            return Ok(());
        }
        if tokio::time::Instant::now() + POLL_EVERY > deadline {
            let waited_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
            return Err(SimError::BootstrapTimeout { room: b.room, waited_ms });
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// One GET of the room's state: the answer's status, or `None` when there was no answer (not yet
/// listening, gone, too slow).
async fn poll(addr: SocketAddr, room: u64) -> Option<u16> {
    let ask = async {
        let mut conn = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request = format!("GET /sim/bootstrap/{room} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        conn.write_all(request.as_bytes()).await.ok()?;
        let mut answer = Vec::with_capacity(ANSWER_BYTES);
        let mut chunk = [0u8; ANSWER_BYTES];
        while answer.len() < 12 {
            let n = conn.read(&mut chunk).await.ok()?;
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&chunk[..n]);
        }
        status(&answer)
    };
    tokio::time::timeout(POLL_TIMEOUT, ask).await.ok().flatten()
}

/// The status code of an HTTP/1.x answer's first line.
fn status(answer: &[u8]) -> Option<u16> {
    let line = answer.strip_prefix(b"HTTP/1.")?;
    let code = line.get(2..5)?;
    std::str::from_utf8(code).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rooms_are_bounded_and_forget_the_oldest() {
        let rooms = Rooms::default();
        assert!(!rooms.is_done(1));
        rooms.finish(1);
        rooms.finish(1);
        assert!(rooms.is_done(1));
        for r in 2..=ROOMS_KEPT as u64 + 1 {
            rooms.finish(r);
        }
        assert!(!rooms.is_done(1), "the oldest room is forgotten");
        assert!(rooms.is_done(2) && rooms.is_done(ROOMS_KEPT as u64 + 1));
    }

    #[test]
    fn status_reads_the_first_line() {
        assert_eq!(status(b"HTTP/1.1 200 OK\r\n"), Some(200));
        assert_eq!(status(b"HTTP/1.0 404 Not Found\r\n"), Some(404));
        assert_eq!(status(b"HTTP/2 200"), None);
        assert_eq!(status(b"HTTP/1.1 2"), None);
    }

    async fn serve(rooms: Arc<Rooms>) -> (Bootstrap, tokio::task::JoinHandle<std::io::Result<()>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(std::future::IntoFuture::into_future(axum::serve(listener, router(rooms))));
        (Bootstrap { ip: addr.ip(), port: addr.port(), room: 9 }, server)
    }

    #[tokio::test]
    async fn wait_times_out_on_a_room_never_done() {
        let (b, server) = serve(Arc::new(Rooms::default())).await;
        let started = tokio::time::Instant::now();
        let err = wait(&b, Duration::from_millis(40)).await.expect_err("never done");
        assert_eq!(err.label(), "bootstrap_timeout");
        assert!(started.elapsed() >= Duration::from_millis(35), "{:?}", started.elapsed());
        server.abort();
    }

    #[tokio::test]
    async fn wait_ends_once_the_room_is_done() {
        let rooms = Arc::new(Rooms::default());
        let (b, server) = serve(rooms.clone()).await;
        let finisher = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            rooms.finish(9);
        });
        let started = tokio::time::Instant::now();
        wait(&b, Duration::from_secs(5)).await.expect("done");
        assert!(started.elapsed() >= Duration::from_millis(30));
        finisher.await.expect("finisher");
        server.abort();
    }
}
