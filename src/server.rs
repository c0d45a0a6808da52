//! The HTTP front: the routes, and starting/stopping the proxy around an [`AppState`].
//!
//! The request's path lives in [`crate::proxy`]; this module only wires endpoints to it and serves
//! the operational ones (`/health`, `/metrics`).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use mmrouter_core::request::Endpoint;

use crate::config::Settings;
pub use crate::state::AppState;
use crate::{health, proxy};

pub fn app(state: Arc<AppState>) -> axum::Router {
    axum::Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/{*rest}", any(proxy::passthrough))
        .route("/health", get(health_page))
        .route("/metrics", get(metrics_page))
        .route("/debug/route", post(proxy::debug_route))
        .with_state(state)
}

/// Starts health checks and serves until `shutdown` resolves.
pub async fn serve(
    cfg: Settings,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let state = AppState::new(&cfg)?;
    state.start_feeds(&cfg);
    health::spawn_checks(&state, cfg.server.health_interval);
    axum::serve(listener, app(state)).with_graceful_shutdown(shutdown).await?;
    Ok(())
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
    state.start_feeds(cfg);
    health::spawn_checks(&state, cfg.server.health_interval);
    let app = app(state.clone());
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("proxy stopped: {e}");
        }
    });
    Ok((addr, state))
}

async fn chat(State(st): State<Arc<AppState>>, req: Request) -> Response {
    proxy::inference(st, Endpoint::Chat, req).await
}

async fn completions(State(st): State<Arc<AppState>>, req: Request) -> Response {
    proxy::inference(st, Endpoint::Completion, req).await
}

async fn health_page(State(st): State<Arc<AppState>>) -> Response {
    let workers = st.router.workers();
    let healthy: Vec<&str> = workers.iter().filter(|w| w.is_healthy()).map(|w| w.name()).collect();
    let status = if healthy.is_empty() { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
    let body = serde_json::json!({
        "status": if healthy.is_empty() { "unavailable" } else { "ok" },
        "healthy_workers": healthy,
        "workers": workers.len(),
    });
    (status, axum::Json(body)).into_response()
}

async fn metrics_page(State(st): State<Arc<AppState>>) -> Response {
    let page = st.observe.render(&st.router, st.feeds());
    ([("content-type", "text/plain; version=0.0.4; charset=utf-8")], page).into_response()
}
