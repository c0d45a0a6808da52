//! The HTTP front: the routes, and starting/stopping the proxy around an [`AppState`].
//!
//! The request's path lives in [`crate::proxy`]; this module only wires endpoints to it and serves
//! the operational ones (`/health`, `/metrics`). The routes sit behind the front door
//! ([`crate::front`]: request ids, auth, admission) and are served by [`crate::conn`] (timeouts,
//! connection cap, drain).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use mmrouter_core::request::Endpoint;

use crate::config::Settings;
use crate::front::Front;
pub use crate::state::AppState;
use crate::{conn, front, health, proxy};

pub fn app(state: Arc<AppState>) -> axum::Router {
    axum::Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/{*rest}", any(proxy::passthrough))
        .route("/health", get(health_page))
        .route("/metrics", get(metrics_page))
        .route("/debug/route", post(proxy::debug_route))
        .merge(crate::admin::routes())
        .with_state(state)
}

/// [`app`] behind the front door of `front`.
pub fn front_app(front: &Arc<Front>) -> axum::Router {
    front::layer(app(front.state.clone()), front)
}

/// Starts health checks and serves until `shutdown` resolves.
pub async fn serve(
    cfg: Settings,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_state(&cfg, AppState::new(&cfg)?, listener, shutdown).await;
    Ok(())
}

/// [`serve`] for a config read from `path`: SIGHUP (Unix) and `POST /admin/reload` re-read it, and
/// `server.watch_config_ms` watches it (see [`crate::reload`]).
pub async fn serve_file(
    cfg: Settings,
    path: std::path::PathBuf,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let state = AppState::new(&cfg)?;
    let _ = state.config_path.set(path.clone());
    if let Some(every) = cfg.server.watch_config {
        crate::reload::spawn_watch(&state, path.clone(), every);
    }
    spawn_sighup(&state, path);
    serve_state(&cfg, state, listener, shutdown).await;
    Ok(())
}

#[cfg(unix)]
fn spawn_sighup(state: &Arc<AppState>, path: std::path::PathBuf) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hup) = signal(SignalKind::hangup()) else { return };
    let weak = Arc::downgrade(state);
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            let Some(st) = weak.upgrade() else { return };
            if let Err(e) = crate::reload::reload_file(&st, &path) {
                tracing::error!("SIGHUP: {} not applied: {e}", path.display());
            }
        }
    });
}

#[cfg(not(unix))]
fn spawn_sighup(_: &Arc<AppState>, _: std::path::PathBuf) {}

/// Like [`serve`], around a prepared state. Returns once drained (at most `server.drain_delay_ms` +
/// `server.drain_timeout_ms` after `shutdown` resolves).
pub async fn serve_state(
    cfg: &Settings,
    state: Arc<AppState>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    state.start_feeds(cfg);
    health::spawn_checks(&state, cfg.server.health_interval);
    let front = Front::new(state, cfg.server.conn.clone(), &cfg.auth);
    conn::serve(listener, front_app(&front), front, shutdown).await;
}

/// Starts a proxy on an already-bound listener in the background (tests, embedding); returns its
/// address and state.
pub async fn spawn(cfg: Settings, listener: tokio::net::TcpListener) -> anyhow::Result<(SocketAddr, Arc<AppState>)> {
    let state = AppState::new(&cfg)?;
    spawn_state(&cfg, state, listener).await
}

/// Like [`spawn`], around a prepared state.
pub async fn spawn_state(
    cfg: &Settings,
    state: Arc<AppState>,
    listener: tokio::net::TcpListener,
) -> anyhow::Result<(SocketAddr, Arc<AppState>)> {
    let addr = listener.local_addr()?;
    let (cfg, st) = (cfg.clone(), state.clone());
    tokio::spawn(async move { serve_state(&cfg, st, listener, std::future::pending()).await });
    Ok((addr, state))
}

async fn chat(State(st): State<Arc<AppState>>, req: Request) -> Response {
    proxy::inference(st, Endpoint::Chat, req).await
}

async fn completions(State(st): State<Arc<AppState>>, req: Request) -> Response {
    proxy::inference(st, Endpoint::Completion, req).await
}

/// Whether the router can take a request, for a load balancer in front: per pool, the workers that
/// selection would rank now (in rotation — not draining or removed — and healthy, or half-open with
/// its probe free).
///
/// * 200 `ok`: every pool has such a worker.
/// * 200 `degraded`: some pools have none (their models get 503 `no_healthy_worker`), others serve:
///   the router is still useful, and its replicas, sharing the config, would say the same.
/// * 503 `unavailable`: no pool can take a request (every worker drained, removed, ejected or down).
/// * 503 `draining`: shutdown has started (so a load balancer stops sending first).
///
/// The body names each pool's state and selectable workers.
async fn health_page(State(st): State<Arc<AppState>>) -> Response {
    let now = std::time::Instant::now();
    let pools: Vec<serde_json::Value> = st
        .pools()
        .iter()
        .map(|p| {
            let live = p.router.live_workers();
            let ready: Vec<&str> = live.iter().filter(|(_, w)| w.selectable(now)).map(|(_, w)| w.name()).collect();
            let draining = live.iter().filter(|(_, w)| w.is_draining()).count();
            let status = if ready.is_empty() { "unavailable" } else { "ok" };
            serde_json::json!({"name": p.name, "status": status, "healthy_workers": ready, "workers": live.len(), "draining": draining})
        })
        .collect();
    let serving = pools.iter().filter(|p| p["status"] == "ok").count();
    let label = match (st.is_draining(), serving) {
        (true, _) => "draining",
        (false, 0) => "unavailable",
        (false, n) if n < pools.len() => "degraded",
        (false, _) => "ok",
    };
    let status = if matches!(label, "ok" | "degraded") { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let healthy: Vec<&serde_json::Value> =
        pools.iter().flat_map(|p| p["healthy_workers"].as_array().into_iter().flatten()).collect();
    let workers: u64 = pools.iter().map(|p| p["workers"].as_u64().unwrap_or(0)).sum();
    let body = serde_json::json!({"status": label, "healthy_workers": healthy, "workers": workers, "pools": pools});
    (status, axum::Json(body)).into_response()
}

async fn metrics_page(State(st): State<Arc<AppState>>) -> Response {
    let pools = st.pools();
    let feeds: Vec<_> = pools.iter().map(|p| p.feeds()).collect();
    let page = st.observe.render(pools.iter().zip(&feeds).map(|(p, f)| (p.name.as_str(), &p.router, f.as_slice())));
    ([("content-type", "text/plain; version=0.0.4; charset=utf-8")], page).into_response()
}

/// `GET /v1/models`: every pool's served names, in OpenAI's list shape. A config without `[[pools]]`
/// declares none, so the workers answer (they know their `--served-model-name`).
async fn models(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let pools = st.pools();
    let served = || pools.iter().flat_map(|p| p.models.iter().map(move |m| (m, &p.name)));
    if served().next().is_none() {
        return proxy::passthrough(State(st), req).await;
    }
    let data: Vec<serde_json::Value> = served()
        .map(|(id, pool)| serde_json::json!({"id": id, "object": "model", "created": 0, "owned_by": "mmrouter", "pool": pool}))
        .collect();
    axum::Json(serde_json::json!({"object": "list", "data": data})).into_response()
}
