//! The admin API: list, add, drain and remove workers of a pool while the router runs.
//!
//! ```text
//! GET    /admin/workers                      every pool and its workers (state, in-flight requests)
//! POST   /admin/pools/{pool}/workers         {"name", "url", "engine"?}: a new worker, in rotation at once
//! POST   /admin/workers/{name}/drain         no new requests; those in flight finish
//! DELETE /admin/workers/{name}               drain, then remove once its in-flight requests have ended
//! POST   /admin/reload                       re-read the config file, apply its worker changes
//! ```
//!
//! With `[auth] admin_keys` these need an admin key (the auth layer); without, only loopback clients
//! may call them. A new worker is a `[[workers]]` entry as JSON, validated by the same rules as the
//! config file (`config::worker_settings`: name 1–128 bytes without control characters, http(s) URL,
//! `kv_events` and the other event keys): a 400 `invalid_worker` names the key. With `kv_events` its
//! feed starts at once. Workers added here last until the process ends: the config file stays the
//! source of truth across restarts. Each change takes the state's change lock (`AppState::running`),
//! so it is checked against what is in force and applied whole.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use mmrouter_core::routing::{Router, Worker};
use serde_json::{json, Value};

use crate::config::WorkerSection;
use crate::error::ApiError;
use crate::state::{AppState, Pool};

/// How often a removal checks whether the drained worker's requests have ended.
const REMOVAL_POLL: Duration = Duration::from_millis(50);

pub fn routes() -> axum::Router<Arc<AppState>> {
    axum::Router::new()
        .route("/admin/workers", axum::routing::get(list))
        .route("/admin/pools/{pool}/workers", axum::routing::post(add))
        .route("/admin/workers/{name}/drain", axum::routing::post(drain))
        .route("/admin/workers/{name}", axum::routing::delete(remove))
        .route("/admin/reload", axum::routing::post(reload))
        .layer(axum::middleware::from_fn(loopback_without_admin_keys))
}

/// Without admin keys the auth layer lets `/admin/*` through: then only a loopback peer may call it.
async fn loopback_without_admin_keys(req: Request, next: Next) -> Response {
    let authorized = req.extensions().get::<crate::auth::AdminAuthorized>().is_some();
    let peer = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0);
    if authorized || peer.is_none_or(|p| p.ip().is_loopback()) {
        return next.run(req).await;
    }
    ApiError::new(
        StatusCode::FORBIDDEN,
        "invalid_request_error",
        "admin_forbidden",
        "the admin API answers loopback clients only unless [auth] admin_keys is set",
    )
    .into_response()
}

async fn list(State(st): State<Arc<AppState>>) -> Json<Value> {
    let pools: Vec<Value> = st
        .pools()
        .iter()
        .map(|p| json!({"name": p.name, "models": p.models, "workers": workers_json(&p.router)}))
        .collect();
    Json(json!({ "pools": pools }))
}

fn workers_json(router: &Router) -> Vec<Value> {
    router
        .workers()
        .iter()
        .filter(|w| !w.is_removed())
        .map(|w| {
            json!({
                "name": w.name(),
                "url": w.url(),
                "engine": w.engine(),
                "state": w.availability().label(),
                "draining": w.is_draining(),
                "inflight_requests": w.inflight().requests,
            })
        })
        .collect()
}

async fn add(State(st): State<Arc<AppState>>, Path(pool): Path<String>, body: Bytes) -> Response {
    let new: WorkerSection = match serde_json::from_slice(&body) {
        Ok(w) => w,
        Err(e) => return ApiError::bad_request("invalid_worker", format!("worker: {e}")).into_response(),
    };
    let settings = match crate::config::worker_settings("worker", &new) {
        Ok(s) => s,
        Err(e) => return ApiError::bad_request("invalid_worker", format!("{e:#}")).into_response(),
    };
    let _changes = st.running.lock().unwrap_or_else(|e| e.into_inner());
    let pools = st.pools();
    let Some(p) = pools.iter().find(|p| p.name == pool) else {
        return not_found(format!("no pool named '{pool}'"));
    };
    let name = &settings.spec.name;
    if pools.iter().any(|p| p.router.lookup(name).is_some_and(|(_, w)| w.in_rotation())) {
        return conflict(format!("a worker named '{name}' exists"));
    }
    let id = match p.router.change(&[], vec![settings.spec.clone()]) {
        Ok(change) => change.commit()[0],
        Err(e) => return conflict(e.to_string()),
    };
    p.start_feed(&st, id, &settings);
    tracing::info!(pool = %pool, worker = %name, url = %settings.spec.url, "admin: worker added");
    (StatusCode::CREATED, Json(json!({"pool": pool, "workers": workers_json(&p.router)}))).into_response()
}

async fn drain(State(st): State<Arc<AppState>>, Path(name): Path<String>) -> Response {
    let _changes = st.running.lock().unwrap_or_else(|e| e.into_inner());
    let Some((pool, w, _held)) = locate(&st, &name) else {
        return not_found(format!("no worker named '{name}'"));
    };
    pool.router.drain(w);
    tracing::info!(worker = %name, "admin: worker draining");
    (StatusCode::ACCEPTED, Json(json!({"worker": name, "draining": true}))).into_response()
}

/// Drains the worker now and removes it once its in-flight requests have ended (a background task),
/// so no request is cut.
async fn remove(State(st): State<Arc<AppState>>, Path(name): Path<String>) -> Response {
    let _changes = st.running.lock().unwrap_or_else(|e| e.into_inner());
    let Some((pool, w, _held)) = locate(&st, &name) else {
        return not_found(format!("no worker named '{name}'"));
    };
    retire(&st, &pool, w);
    (StatusCode::ACCEPTED, Json(json!({"worker": name, "draining": true, "removing": true}))).into_response()
}

/// Drains worker `w` of `pool` now; once its in-flight requests have ended it is removed (out of the
/// pool, its feeds stopped, its index entries and metric series dropped), and once nothing refers to
/// it any more (its feed tasks have drained, no decision names it) what was still written for it is
/// dropped, which frees its slot for a new worker.
pub fn retire(st: &Arc<AppState>, pool: &Arc<Pool>, w: usize) {
    pool.router.drain(w);
    let (weak_st, weak, worker) = (Arc::downgrade(st), Arc::downgrade(pool), pool.router.worker(w));
    tokio::spawn(async move {
        while worker.inflight().requests > 0 {
            tokio::time::sleep(REMOVAL_POLL).await;
        }
        let Some(pool) = weak.upgrade() else { return };
        pool.router.remove(w);
        pool.stop_feed(w);
        drop(pool);
        if let Some(st) = weak_st.upgrade() {
            st.observe.retain_workers(&crate::observe::live_worker_names(&st.pools()));
        }
        tracing::info!(worker = %worker.name(), "worker removed");
        loop {
            let Some(pool) = weak.upgrade() else { return };
            if pool.router.forget_removed(w, &worker) {
                return;
            }
            drop(pool);
            tokio::time::sleep(REMOVAL_POLL).await;
        }
    });
}

/// `POST /admin/reload`: re-reads the config file (see [`crate::reload`]).
async fn reload(State(st): State<Arc<AppState>>) -> Response {
    let Some(path) = st.config_path.get().cloned() else {
        return conflict("this router was not started from a config file".into());
    };
    match crate::reload::reload_file(&st, &path) {
        Ok(applied) => Json(json!({"reloaded": path, "applied": applied})).into_response(),
        Err(e) => ApiError::bad_request("config_rejected", e).into_response(),
    }
}

/// The pool and id of the worker named `name`, with the worker (held: the id cannot name another
/// worker meanwhile).
fn locate(st: &AppState, name: &str) -> Option<(Arc<Pool>, usize, Arc<Worker>)> {
    st.pools().iter().find_map(|p| p.router.lookup(name).map(|(id, w)| (p.clone(), id, w)))
}

fn not_found(message: String) -> Response {
    ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", "not_found", message).into_response()
}

fn conflict(message: String) -> Response {
    ApiError::new(StatusCode::CONFLICT, "invalid_request_error", "conflict", message).into_response()
}
