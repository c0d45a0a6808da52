//! `GET /health`: whether the router can take a request, for a load balancer in front: per pool, the
//! workers that selection would rank now (in rotation — not draining or removed — and healthy, or
//! half-open with its probe free).
//!
//! * 200 `ok`: every pool has such a worker.
//! * 200 `degraded`: some pools have none (their models get 503 `no_healthy_worker`), others serve:
//!   the router is still useful, and its replicas, sharing the config, would say the same.
//! * 503 `unavailable`: no pool can take a request (every worker drained, removed, ejected or down).
//! * 503 `draining`: shutdown has started (so a load balancer stops sending first).
//! * 503 `bootstrapping`: a cluster replica is still grafting its peers' or engines' state (bounded by
//!   `cluster.bootstrap_timeout_ms`); the body's `bootstrap` says where it stands, and after the
//!   wait ran out, `"state": "incomplete"` while it serves.
//!
//! The body names each pool's state and selectable workers.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

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
    let ready: Vec<&str> = live.iter().filter(|(_, w)| w.selectable(now)).map(|(_, w)| w.name()).collect();
    let draining = live.iter().filter(|(_, w)| w.is_draining()).count();
    let status = if ready.is_empty() { "unavailable" } else { "ok" };
    json!({"name": p.name, "status": status, "healthy_workers": ready, "workers": live.len(), "draining": draining})
}
