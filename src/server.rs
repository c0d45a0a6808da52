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

/// 200 `ok` while a worker is healthy; 503 `unavailable` without one, and 503 `draining` once shutdown
/// has started (so a load balancer stops sending first).
async fn health_page(State(st): State<Arc<AppState>>) -> Response {
    let draining = st.is_draining();
    let workers: Vec<_> = st.pools().iter().flat_map(|p| p.router.workers()).filter(|w| !w.is_removed()).collect();
    let healthy: Vec<&str> = workers.iter().filter(|w| w.is_healthy()).map(|w| w.name()).collect();
    let label = match (draining, healthy.is_empty()) {
        (true, _) => "draining",
        (false, true) => "unavailable",
        (false, false) => "ok",
    };
    let status = if label == "ok" { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let body = serde_json::json!({
        "status": label,
        "healthy_workers": healthy,
        "workers": workers.len(),
    });
    (status, axum::Json(body)).into_response()
}

async fn metrics_page(State(st): State<Arc<AppState>>) -> Response {
    let pools = st.pools();
    let page = st.observe.render(pools.iter().map(|p| (p.name.as_str(), &p.router, p.feeds())));
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
