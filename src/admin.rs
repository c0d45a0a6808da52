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
//! may call them. Workers added here have no KV-event feed (approximate routing) and last until the
//! process ends: the config file stays the source of truth across restarts.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use mmrouter_core::routing::{Engine, Router, WorkerSpec};
use serde_json::{json, Value};

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

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NewWorker {
    name: String,
    url: String,
    #[serde(default)]
    engine: Engine,
}

async fn add(State(st): State<Arc<AppState>>, Path(pool): Path<String>, Json(new): Json<NewWorker>) -> Response {
    let pools = st.pools();
    let Some(p) = pools.iter().find(|p| p.name == pool) else {
        return not_found(format!("no pool named '{pool}'"));
    };
    if let Err(e) = crate::config::check_worker_url(&new.url) {
        return ApiError::bad_request("invalid_worker", e.to_string()).into_response();
    }
    let active = |p: &Arc<Pool>| p.router.find(&new.name).is_some_and(|w| p.router.worker(w).in_rotation());
    if pools.iter().any(active) {
        return conflict(format!("a worker named '{}' exists", new.name));
    }
    let spec = WorkerSpec { name: new.name.clone(), url: new.url.clone(), engine: new.engine };
    match p.router.add_worker(spec) {
        Ok(_) => {
            tracing::info!(pool = %pool, worker = %new.name, url = %new.url, "admin: worker added");
            (StatusCode::CREATED, Json(json!({"pool": pool, "workers": workers_json(&p.router)}))).into_response()
        }
        Err(e) => conflict(e.to_string()),
    }
}

async fn drain(State(st): State<Arc<AppState>>, Path(name): Path<String>) -> Response {
    let Some((pool, w)) = locate(&st, &name) else {
        return not_found(format!("no worker named '{name}'"));
    };
    pool.router.drain(w);
    tracing::info!(worker = %name, "admin: worker draining");
    (StatusCode::ACCEPTED, Json(json!({"worker": name, "draining": true}))).into_response()
}

/// Drains the worker now and removes it once its in-flight requests have ended (a background task),
/// so no request is cut.
async fn remove(State(st): State<Arc<AppState>>, Path(name): Path<String>) -> Response {
    let Some((pool, w)) = locate(&st, &name) else {
        return not_found(format!("no worker named '{name}'"));
    };
    retire(&pool, w);
    (StatusCode::ACCEPTED, Json(json!({"worker": name, "draining": true, "removing": true}))).into_response()
}

/// Drains worker `w` of `pool` now and removes it once its in-flight requests have ended.
pub fn retire(pool: &Arc<Pool>, w: usize) {
    pool.router.drain(w);
    let (weak, worker) = (Arc::downgrade(pool), pool.router.worker(w));
    tokio::spawn(async move {
        while worker.inflight().requests > 0 {
            tokio::time::sleep(REMOVAL_POLL).await;
        }
        if let Some(pool) = weak.upgrade() {
            pool.router.remove(w);
            tracing::info!(worker = %worker.name(), "worker removed");
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

fn locate(st: &AppState, name: &str) -> Option<(Arc<Pool>, usize)> {
    st.pools().iter().find_map(|p| p.router.find(name).map(|w| (p.clone(), w)))
}

fn not_found(message: String) -> Response {
    ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", "not_found", message).into_response()
}

fn conflict(message: String) -> Response {
    ApiError::new(StatusCode::CONFLICT, "invalid_request_error", "conflict", message).into_response()
}
