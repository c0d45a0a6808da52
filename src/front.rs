//! The client-facing front door: what every request passes before its handler, in order:
//!
//! ```text
//! access (request id, log line) ─► auth (client / admin keys) ─► admission (in-flight cap, body deadline) ─► route
//! ```
//!
//! and the [`Front`] they share with the connection layer ([`crate::conn`]).
//! The three stages run in one layer: one boxed future and one wrapped response body per request
//! instead of one per stage (issue 14).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::Response;
use tokio::sync::Semaphore;

use crate::access::Access;
use crate::admission::{admit, mark_draining};
use crate::auth::{refusal, Auth};
use crate::bodies::Guarded;
use crate::config::{AuthSettings, ConnSettings};
use crate::state::AppState;

/// What the front-door layers and the connection layer share.
pub struct Front {
    pub state: Arc<AppState>,
    pub conn: ConnSettings,
    pub auth: Auth,
    /// `None`: no cap on requests in flight.
    pub inflight: Option<Arc<Semaphore>>,
}

impl Front {
    pub fn new(state: Arc<AppState>, conn: ConnSettings, auth: &AuthSettings) -> Arc<Front> {
        Arc::new(Front {
            state,
            inflight: conn.max_inflight_requests.map(|n| Arc::new(Semaphore::new(n))),
            conn,
            auth: Auth::new(auth),
        })
    }

    /// See [`AppState::start_draining`].
    pub fn start_draining(&self) {
        self.state.start_draining();
    }

    pub fn is_draining(&self) -> bool {
        self.state.is_draining()
    }
}

/// `router` behind the front door.
pub fn layer(router: axum::Router, front: &Arc<Front>) -> axum::Router {
    router.layer(from_fn_with_state(front.clone(), middleware))
}

async fn middleware(State(front): State<Arc<Front>>, mut req: Request, next: Next) -> Response {
    let access = Access::begin(&front, &mut req);
    let (mut resp, slot) = match admitted(&front, req).await {
        Ok((req, slot)) => {
            let mut resp = next.run(req).await;
            mark_draining(&front, &mut resp);
            (resp, slot)
        }
        Err(resp) => (resp, None),
    };
    // The in-flight slot and the log line last as long as the response body.
    match (slot, access.finish(&mut resp)) {
        (None, None) => resp,
        (slot, line) => Guarded::wrap(resp, (slot, line)),
    }
}

/// Auth, then admission: the request with its body in memory and its in-flight slot, or the answer
/// that refuses it.
async fn admitted(front: &Front, mut req: Request) -> Result<(Request, Option<crate::admission::Slot>), Response> {
    match refusal(front, &mut req) {
        Some(resp) => Err(resp),
        None => admit(front, req).await,
    }
}

/// `/health` and `/metrics` stay answerable under load: they are never shed.
pub fn is_operational(path: &str) -> bool {
    path == "/health" || path == "/metrics"
}
