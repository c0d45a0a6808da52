//! The client-facing front door: what every request passes before its handler, outermost first:
//!
//! ```text
//! access (request id, log line) ─► auth (client / admin keys) ─► admission (in-flight cap, body deadline) ─► route
//! ```
//!
//! and the [`Front`] they share with the connection layer ([`crate::conn`]) and `/health` (drain).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::middleware::from_fn_with_state;
use tokio::sync::Semaphore;

use crate::auth::Auth;
use crate::config::{AuthSettings, ConnSettings};
use crate::state::AppState;

/// What the front-door layers and the connection layer share.
pub struct Front {
    pub state: Arc<AppState>,
    pub conn: ConnSettings,
    pub auth: Auth,
    /// `None`: no cap on requests in flight.
    pub inflight: Option<Arc<Semaphore>>,
    draining: AtomicBool,
}

impl Front {
    pub fn new(state: Arc<AppState>, conn: ConnSettings, auth: &AuthSettings) -> Arc<Front> {
        Arc::new(Front {
            state,
            inflight: conn.max_inflight_requests.map(|n| Arc::new(Semaphore::new(n))),
            conn,
            auth: Auth::new(auth),
            draining: AtomicBool::new(false),
        })
    }

    /// Set once shutdown starts: `/health` answers 503 `draining`, responses ask to close the connection.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }
}

/// `router` behind the front-door layers (axum runs the last added first).
pub fn layer(router: axum::Router, front: &Arc<Front>) -> axum::Router {
    router
        .layer(from_fn_with_state(front.clone(), crate::admission::middleware))
        .layer(from_fn_with_state(front.clone(), crate::auth::middleware))
        .layer(from_fn_with_state(front.clone(), crate::access::middleware))
}

/// `/health` and `/metrics` stay answerable under load: they are never shed.
pub fn is_operational(path: &str) -> bool {
    path == "/health" || path == "/metrics"
}
