//! The admin API: list, add, drain and remove workers of a pool while the router runs.
//!
//! ```text
//! GET    /admin/workers                      every pool and its workers (role, state, in-flight requests)
//! POST   /admin/pools/{pool}/workers         {"name", "url", "engine"?, "role"?, "bootstrap_port"?}: a new
//!                                            worker, in rotation at once
//! POST   /admin/workers/{name}/drain         no new requests; those in flight finish
//! DELETE /admin/workers/{name}               drain, then remove once its in-flight requests have ended
//! POST   /admin/reload                       re-read the config file, apply its worker changes
//! ```
//!
//! With `[auth] admin_keys` these need an admin key (the auth layer); without, only loopback clients
//! may call them. A new worker is a `[[workers]]` entry as JSON, validated by the same rules as the
//! config file (`config::worker_settings`: name 1–128 bytes without control characters, http(s) URL,
//! `kv_events` and the other event keys, `role`, `bootstrap_port` for SGLang prefill workers only): a
//! 400 `invalid_worker` names the key. With `kv_events` its feed starts at once.
//!
//! A pool's roles obey the file's pool rules (`config::check_roles`) after every change, over the
//! workers in rotation: an add, drain or removal that would leave a disaggregated pool without a
//! prefill or a decode worker (or its encode workers without prefill/decode or both workers, or mix
//! engines across its prefill/decode pairs) is refused with 409 `conflict` naming the pool, and
//! nothing changes: a slip of the hand must not break every request of a pool. To replace the last
//! decode worker, add its successor first; to turn an aggregated pool into a disaggregated one, reload
//! a file with both legs (one transaction). `?force=true` on any of the three applies the change
//! anyway (taking a whole disaggregated pool out of service, one worker at a time). Workers added here last until the process ends: the config file stays the
//! source of truth across restarts. The operations are the pools room's (`pools::Pools`); this is
//! their HTTP side.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use mmrouter_core::routing::Router;
use serde_json::{json, Value};

use crate::config::WorkerSection;
use crate::error::ApiError;
use crate::front::{AdminAuthorized, ReceivedBody};
use crate::pools::{reload_file, ChangeError};
use crate::state::AppState;

/// The admin API, with `extra` admin routes of other rooms (the cluster's snapshot) under the same
/// guard.
pub fn routes(extra: axum::Router<Arc<AppState>>) -> axum::Router<Arc<AppState>> {
    axum::Router::new()
        .merge(extra)
        .route("/admin/workers", axum::routing::get(list))
        .route("/admin/pools/{pool}/workers", axum::routing::post(add))
        .route("/admin/workers/{name}/drain", axum::routing::post(drain))
        .route("/admin/workers/{name}", axum::routing::delete(remove))
        .route("/admin/reload", axum::routing::post(reload))
        .layer(axum::middleware::from_fn(loopback_without_admin_keys))
}

/// Without admin keys the auth layer lets `/admin/*` through: then only a loopback peer may call it.
async fn loopback_without_admin_keys(req: Request, next: Next) -> Response {
    let authorized = req.extensions().get::<AdminAuthorized>().is_some();
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
    // Only the live workers are cloned: a removed worker's slot is reusable only while nothing but
    // the router holds it.
    router
        .live_workers()
        .iter()
        .map(|(_, w)| {
            let mut entry = json!({
                "name": w.name(),
                "url": w.url(),
                "engine": w.engine(),
                "role": w.role().label(),
                "state": w.availability().label(),
                "draining": w.is_draining(),
                "inflight_requests": w.inflight().requests,
            });
            if let Some(port) = w.bootstrap_port() {
                entry["bootstrap_port"] = port.into();
            }
            entry
        })
        .collect()
}

/// `?force=true`: apply a change even when it breaks the pool's role rules (see the module docs).
#[derive(serde::Deserialize)]
struct Force {
    #[serde(default)]
    force: bool,
}

async fn add(
    State(st): State<Arc<AppState>>,
    Path(pool): Path<String>,
    Query(Force { force }): Query<Force>,
    Extension(body): Extension<ReceivedBody>,
) -> Response {
    let new: WorkerSection = match serde_json::from_slice(&body.0) {
        Ok(w) => w,
        Err(e) => return ApiError::bad_request("invalid_worker", format!("worker: {e}")).into_response(),
    };
    let settings = match crate::config::worker_settings("worker", &new) {
        Ok(s) => s,
        Err(e) => return ApiError::bad_request("invalid_worker", format!("{e:#}")).into_response(),
    };
    match st.pools.add_worker(&pool, &settings, force) {
        Ok(p) => (StatusCode::CREATED, Json(json!({"pool": pool, "workers": workers_json(&p.router)}))).into_response(),
        Err(e) => refused(e),
    }
}

async fn drain(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    Query(Force { force }): Query<Force>,
) -> Response {
    match st.pools.drain_worker(&name, force) {
        Ok(()) => (StatusCode::ACCEPTED, Json(json!({"worker": name, "draining": true}))).into_response(),
        Err(e) => refused(e),
    }
}

/// Drains the worker now and removes it once its in-flight requests have ended, so no request is cut.
async fn remove(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    Query(Force { force }): Query<Force>,
) -> Response {
    match st.pools.remove_worker(&name, force) {
        Ok(()) => {
            (StatusCode::ACCEPTED, Json(json!({"worker": name, "draining": true, "removing": true}))).into_response()
        }
        Err(e) => refused(e),
    }
}

/// `POST /admin/reload`: re-reads the config file (see `pools::reload`).
async fn reload(State(st): State<Arc<AppState>>) -> Response {
    let Some(path) = st.pools.config_path.get().cloned() else {
        return refused(ChangeError::Conflict("this router was not started from a config file".into()));
    };
    match reload_file(&st.pools, &path) {
        Ok(applied) => Json(json!({"reloaded": path, "applied": applied})).into_response(),
        Err(e) => ApiError::bad_request("config_rejected", e).into_response(),
    }
}

fn refused(e: ChangeError) -> Response {
    let (status, code) = match e {
        ChangeError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
        ChangeError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
    };
    ApiError::new(status, "invalid_request_error", code, e.to_string()).into_response()
}
