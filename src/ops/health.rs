//! `GET /health`: whether the router can take a request, for a load balancer in front: per pool, the
//! workers that selection would rank now (in rotation — not draining or removed — and healthy, or
//! half-open with its probe free).
//!
//! * 200 `ok`: every pool has such workers to serve a request whole: a `both` worker, or a prefill and
//!   a decode worker (a disaggregated pool whose decode workers are all down serves nothing).
//! * 200 `degraded`: some pools have none (their models get 503 `no_healthy_worker`), others serve:
//!   the router is still useful, and its replicas, sharing the config, would say the same.
//! * 503 `unavailable`: no pool can take a request (every worker drained, removed, ejected or down).
//! * 503 `draining`: shutdown has started (so a load balancer stops sending first).
//! * 503 `bootstrapping`: a cluster replica is still grafting its peers' or engines' state (bounded by
//!   `cluster.bootstrap_timeout_ms`); the body's `bootstrap` says where it stands, and after the
//!   wait ran out, `"state": "incomplete"` while it serves.
//!
//! The body names each pool's state and selectable workers, and per role its workers and the
//! selectable ones (`roles`).

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use mmrouter_core::routing::{Role, Worker};

use crate::pools::{BootstrapState, Pool};
use crate::state::AppState;

pub async fn health_page(State(st): State<Arc<AppState>>) -> Response {
    let now = std::time::Instant::now();
    let pools: Vec<Value> = st.pools().iter().map(|p| pool_json(p, now)).collect();
    let serving = pools.iter().filter(|p| p["status"] == "ok").count();
    let bootstrap = st.pools.bootstrap.state();
    let label = match (st.draining.is_on(), serving) {
        (true, _) => "draining",
        // A replica's view of the caches is not whole yet: a load balancer sends elsewhere.
        _ if !bootstrap.ready() => "bootstrapping",
        (false, 0) => "unavailable",
        (false, n) if n < pools.len() => "degraded",
        (false, _) => "ok",
    };
    let status = if matches!(label, "ok" | "degraded") { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let healthy: Vec<&Value> =
        pools.iter().flat_map(|p| p["healthy_workers"].as_array().into_iter().flatten()).collect();
    let workers: u64 = pools.iter().map(|p| p["workers"].as_u64().unwrap_or(0)).sum();
    let mut body = json!({"status": label, "healthy_workers": healthy, "workers": workers, "pools": pools});
    if bootstrap != BootstrapState::Off {
        let b = &st.pools.bootstrap;
        body["bootstrap"] = json!({
            "state": bootstrap.label(),
            "source": b.source(),
            "state_age_secs": b.state_age_secs(),
            "duration_secs": b.duration_secs(),
        });
    }
    (status, axum::Json(body)).into_response()
}

fn pool_json(p: &Pool, now: std::time::Instant) -> Value {
    let live = p.router.live_workers();
    let ready: Vec<&Worker> = live.iter().map(|(_, w)| w.as_ref()).filter(|w| w.selectable(now)).collect();
    let draining = live.iter().filter(|(_, w)| w.is_draining()).count();
    let status = if serves(&ready) { "ok" } else { "unavailable" };
    let names: Vec<&str> = ready.iter().map(|w| w.name()).collect();
    let mut roles = serde_json::Map::new();
    for role in Role::ALL {
        let workers = live.iter().filter(|(_, w)| w.role() == role).count();
        if workers > 0 {
            let healthy: Vec<&str> = ready.iter().filter(|w| w.role() == role).map(|w| w.name()).collect();
            roles.insert(role.label().into(), json!({"workers": workers, "healthy_workers": healthy}));
        }
    }
    json!({
        "name": p.name, "status": status, "healthy_workers": names, "workers": live.len(), "draining": draining,
        "roles": roles,
    })
}

/// Whether a request can be served whole: by a `both` worker, or by a prefill and a decode worker
/// (encode workers alone serve no request).
fn serves(ready: &[&Worker]) -> bool {
    let has = |role: Role| ready.iter().any(|w| w.role() == role);
    has(Role::Both) || (has(Role::Prefill) && has(Role::Decode))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mmrouter_core::routing::WorkerSpec;

    fn workers(roles: &[Role]) -> Vec<Worker> {
        let spec = |(i, r): (usize, &Role)| WorkerSpec::new(format!("w{i}"), "http://127.0.0.1:1").with_role(*r);
        roles.iter().enumerate().map(spec).map(Worker::new).collect()
    }

    #[test]
    fn a_pool_serves_with_a_whole_worker_or_both_legs() {
        use Role::*;
        for (roles, want) in [
            (&[Both][..], true),
            (&[Prefill, Decode], true),
            (&[Encode, Prefill, Decode], true),
            (&[Encode, Both], true),
            (&[Prefill, Encode], false),
            (&[Decode], false),
            (&[Encode], false),
            (&[], false),
        ] {
            let ws = workers(roles);
            let ready: Vec<&Worker> = ws.iter().collect();
            assert_eq!(serves(&ready), want, "{roles:?}");
        }
    }
}
