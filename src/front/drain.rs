//! The drain flag: set once shutdown starts. `/health` answers `draining` from it (so a load balancer
//! stops sending first), the connection layer stops accepting after `server.drain_delay_ms`, and every
//! response asks its client to close the connection.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::http::header::CONNECTION;
use axum::http::HeaderValue;
use axum::response::Response;

/// Shared by whoever must know shutdown started; cloning shares the flag.
#[derive(Clone, Debug, Default)]
pub struct Draining(Arc<AtomicBool>);

impl Draining {
    pub fn start(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn is_on(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// While draining, asks the client to close the connection after this response (HTTP/1: it
    /// reconnects, elsewhere, for its next request).
    pub fn mark(&self, resp: &mut Response) {
        if self.is_on() {
            resp.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
        }
    }
}
