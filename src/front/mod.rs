//! The front door: what every client request passes before its handler, in order,
//!
//! ```text
//! conn (accept, caps, timeouts, drain) ─► access (request id, log line) ─► auth (client / admin keys)
//!   ─► admission (in-flight cap, body read within its deadline) ─► the routes
//! ```
//!
//! and its refusals (shed, auth, client timeouts), counted here: the front door's own observation
//! phase. Each stage gets only its own settings and the observer. The three request stages run in one
//! layer: one boxed future and one wrapped response body per request instead of one per stage.
//!
//! Architecture invariant: the front door knows nothing of pools, the proxy, upstream or the app state —
//! it passes a request on with its body read ([`ReceivedBody`]) or answers it itself.

pub mod access;
pub mod admission;
pub mod auth;
mod bodies;
pub mod conn;
pub mod drain;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::Response;

pub use admission::ReceivedBody;
pub use auth::AdminAuthorized;
pub use drain::Draining;

use crate::config::Settings;
use crate::observe::Observer;
use access::Access;
use admission::{Admission, Slot};
use auth::Auth;
use bodies::Guarded;

/// The request stages' settings, the observer and the drain flag.
pub struct Front {
    access_log: bool,
    auth: Auth,
    admission: Admission,
    observe: Arc<Observer>,
    draining: Draining,
}

impl Front {
    pub fn new(cfg: &Settings, observe: Arc<Observer>, draining: Draining) -> Arc<Front> {
        Arc::new(Front {
            access_log: cfg.server.conn.access_log,
            auth: Auth::new(&cfg.auth),
            admission: Admission::new(cfg),
            observe,
            draining,
        })
    }

    /// `router` behind the front door.
    pub fn layer(self: &Arc<Self>, router: axum::Router) -> axum::Router {
        router.layer(from_fn_with_state(self.clone(), middleware))
    }

    /// Auth, then admission: the request with its body in memory and its in-flight slot, or the answer
    /// that refuses it.
    async fn admitted(&self, mut req: Request) -> Result<(Request, Option<Slot>), Response> {
        match self.auth.refusal(&mut req, &self.observe) {
            Some(resp) => Err(resp),
            None => self.admission.admit(req, &self.observe).await,
        }
    }
}

async fn middleware(State(front): State<Arc<Front>>, mut req: Request, next: Next) -> Response {
    let access = Access::begin(front.access_log, &mut req);
    let (mut resp, slot) = match front.admitted(req).await {
        Ok((req, slot)) => {
            let mut resp = next.run(req).await;
            front.draining.mark(&mut resp);
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
