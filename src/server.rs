//! The one place that composes the rooms (linkerd2-proxy's one-place stack): the routes, the front
//! door around them, the connection layer under it, and what runs beside requests — KV-event feeds,
//! health checks, config reloads.
//!
//! ```text
//! conn ─► front (access ─► auth ─► admission) ─► routes ─┬─ /v1/chat/completions, /v1/completions, /v1/responses ─► proxy
//!                                                        ├─ /v1/models ─► ops (or a worker) ; /v1/* ─► proxy passthrough
//!                                                        ├─ /health, /metrics, /admin/* ─► ops
//!                                                        └─ /debug/route ─► proxy::debug
//! ```

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::Response;
use axum::routing::{any, get, post};
use mmrouter_core::request::Endpoint;

use crate::config::Settings;
use crate::front::{conn, Front};
use crate::{cluster, ops, picker, pools, proxy};

pub use crate::ops::metrics_text;
pub use crate::state::AppState;

/// Every route, over the shared state.
fn routes(state: Arc<AppState>) -> axum::Router {
    axum::Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/responses", post(responses))
        .route("/v1/responses/{id}", get(response_by_id).delete(response_by_id))
        .route("/v1/responses/{id}/cancel", post(response_by_id))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route("/v1/{*rest}", any(proxy::passthrough))
        // vLLM's tokenizer endpoints sit outside /v1: the pool of the body's `model` answers them.
        .route("/tokenize", post(proxy::passthrough))
        .route("/detokenize", post(proxy::passthrough))
        .route("/health", get(ops::health_page))
        .route("/metrics", get(ops::metrics_page))
        .route("/debug/route", post(proxy::debug_route))
        .merge(ops::admin_routes(cluster::routes()))
        .fallback(unknown_route)
        .with_state(state)
}

/// Anything else: OpenAI's JSON 404, never a bare one.
async fn unknown_route(method: axum::http::Method, uri: axum::http::Uri) -> axum::response::Response {
    use axum::response::IntoResponse;
    crate::error::ApiError::unknown_route(method.as_str(), uri.path()).into_response()
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
/// `server.watch_config_ms` watches it (see `pools::reload`).
pub async fn serve_file(
    cfg: Settings,
    path: std::path::PathBuf,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let state = AppState::new(&cfg)?;
    let _ = state.pools.config_path.set(path.clone());
    if let Some(every) = cfg.server.watch_config {
        pools::spawn_watch(&state.pools, path.clone(), every);
    }
    spawn_sighup(&state.pools, path);
    serve_state(&cfg, state, listener, shutdown).await;
    Ok(())
}

/// [`serve`] for a config that has no file to re-read (`serve` from flags). SIGHUP, whose default
/// action ends the process, is logged and ignored; `POST /admin/reload` answers that there is no file.
pub async fn serve_fixed(
    cfg: Settings,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let state = AppState::new(&cfg)?;
    spawn_sighup_ignored();
    serve_state(&cfg, state, listener, shutdown).await;
    Ok(())
}

#[cfg(unix)]
fn spawn_sighup_ignored() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hup) = signal(SignalKind::hangup()) else { return };
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            tracing::warn!("SIGHUP ignored: this router's config came from flags, there is no file to re-read");
        }
    });
}

#[cfg(not(unix))]
fn spawn_sighup_ignored() {}

#[cfg(unix)]
fn spawn_sighup(pools: &Arc<pools::Pools>, path: std::path::PathBuf) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hup) = signal(SignalKind::hangup()) else { return };
    let weak = Arc::downgrade(pools);
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            let Some(pools) = weak.upgrade() else { return };
            if let Err(e) = pools::reload_file(&pools, &path) {
                tracing::error!("SIGHUP: {} not applied: {e}", path.display());
            }
        }
    });
}

#[cfg(not(unix))]
fn spawn_sighup(_: &Arc<pools::Pools>, _: std::path::PathBuf) {}

/// Like [`serve`], around a prepared state. Returns once drained (at most `server.drain_delay_ms` +
/// `server.drain_timeout_ms` after `shutdown` resolves).
pub async fn serve_state(
    cfg: &Settings,
    state: Arc<AppState>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    // Before the feeds: a replica's feeds hold their live batches while it bootstraps; the bootstrap
    // runs once they exist, as it resumes them.
    let bootstrap = cluster::start(cfg, &state);
    state.pools.start_feeds();
    if let Some(bootstrap) = bootstrap {
        tokio::spawn(bootstrap);
    }
    pools::spawn_checks(&state.pools, cfg.server.health_interval);
    if let Err(e) = picker::spawn(cfg, &state).await {
        tracing::error!("{e}");
    }
    pools::spawn_dns(&state.pools, &cfg.discovery);
    let front = Front::new(cfg, state.observe.clone(), state.draining.clone());
    let shared = Arc::new(conn::Shared {
        settings: cfg.server.conn.clone(),
        observe: state.observe.clone(),
        draining: state.draining.clone(),
    });
    conn::serve(listener, front.layer(routes(state)), shared, shutdown).await;
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

async fn responses(State(st): State<Arc<AppState>>, req: Request) -> Response {
    proxy::responses(st, req).await
}

/// `GET`/`DELETE /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`: to the worker that stored it.
async fn response_by_id(
    State(st): State<Arc<AppState>>,
    axum::extract::Path(id): axum::extract::Path<String>,
    req: Request,
) -> Response {
    proxy::response_by_id(st, id, req).await
}

/// `GET /v1/models/{id}` (ids may hold `/`, as HF names do).
async fn model(State(st): State<Arc<AppState>>, axum::extract::Path(id): axum::extract::Path<String>) -> Response {
    ops::model(&st, &id)
}

async fn models(State(st): State<Arc<AppState>>, req: Request) -> Response {
    match ops::models(&st) {
        Some(list) => list,
        None => proxy::passthrough(State(st), req).await,
    }
}
