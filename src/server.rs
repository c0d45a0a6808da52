//! The HTTP front: routes, the per-request path (read → plan → select → forward → observe), worker
//! health, and the `/metrics`, `/health` and `/debug/route` endpoints.
//!
//! The request's path is [`inference`], readable top to bottom; the stages it calls live in
//! `pipeline` (intake, account, plan), `routing` (select) and `upstream` (forward).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use bytes::Bytes;
use http_body_util::BodyExt;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::config::{Config, WorkerConfig};
use crate::error::ApiError;
use crate::metrics as m;
use crate::pipeline::{Endpoint, Pipeline, RoutePlan};
use crate::routing::{Load, Router};
use crate::upstream::{is_hop_by_hop, EndReport, Outcome, Relay, Upstream};

/// Everything a request handler needs; shared by all requests.
pub struct AppState {
    pub workers: Vec<WorkerConfig>,
    pub healthy: Arc<Vec<AtomicBool>>,
    pub router: Router,
    pub upstream: Upstream,
    pub pipeline: Pipeline,
    pub prom: PrometheusHandle,
    pub max_body_bytes: usize,
}

impl AppState {
    pub fn new(cfg: &Config) -> anyhow::Result<Arc<AppState>> {
        Self::with_pipeline(cfg, Pipeline::new(cfg)?)
    }

    /// State around an already-built pipeline (tests inject counters through it).
    pub fn with_pipeline(cfg: &Config, pipeline: Pipeline) -> anyhow::Result<Arc<AppState>> {
        let names = cfg.workers.iter().map(|w| w.name.clone()).collect();
        let router = Router::new(cfg.routing.clone(), names).map_err(|e| anyhow::anyhow!("routing: {e}"))?;
        Ok(Arc::new(AppState {
            workers: cfg.workers.clone(),
            healthy: Arc::new(cfg.workers.iter().map(|_| AtomicBool::new(true)).collect()),
            router,
            upstream: Upstream::new(&cfg.server)?,
            pipeline,
            prom: m::install(),
            max_body_bytes: cfg.server.max_body_bytes,
        }))
    }

    fn healthy_mask(&self) -> Vec<bool> {
        self.healthy.iter().map(|h| h.load(Ordering::Relaxed)).collect()
    }
}

pub fn app(state: Arc<AppState>) -> axum::Router {
    axum::Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/{*rest}", any(passthrough))
        .route("/health", get(health))
        .route("/metrics", get(metrics_page))
        .route("/debug/route", post(debug_route))
        .with_state(state)
}

/// Binds, starts health checks, and serves until `shutdown` resolves.
pub async fn serve(
    cfg: Config,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let state = AppState::new(&cfg)?;
    spawn_health_checks(&state, cfg.server.health_interval_ms);
    axum::serve(listener, app(state)).with_graceful_shutdown(shutdown).await?;
    Ok(())
}

/// Starts a proxy on an already-bound listener in the background (tests, embedding); returns its
/// address and state.
pub async fn spawn(cfg: Config, listener: tokio::net::TcpListener) -> anyhow::Result<(SocketAddr, Arc<AppState>)> {
    let state = AppState::new(&cfg)?;
    spawn_state(&cfg, state, listener).await
}

/// Like [`spawn`], around a prepared state.
pub async fn spawn_state(
    cfg: &Config,
    state: Arc<AppState>,
    listener: tokio::net::TcpListener,
) -> anyhow::Result<(SocketAddr, Arc<AppState>)> {
    let addr = listener.local_addr()?;
    spawn_health_checks(&state, cfg.server.health_interval_ms);
    let app = app(state.clone());
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("proxy stopped: {e}");
        }
    });
    Ok((addr, state))
}

/// Polls every worker's `/health` each `interval_ms` (0: no active checks).
fn spawn_health_checks(state: &Arc<AppState>, interval_ms: u64) {
    if interval_ms == 0 {
        return;
    }
    let every = Duration::from_millis(interval_ms);
    let client = match crate::http_client_builder().timeout(every.max(Duration::from_millis(500))).build() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("health checks disabled: {e}");
            return;
        }
    };
    // Holding only a weak reference lets an embedded proxy (tests, demo) be dropped cleanly.
    let weak = Arc::downgrade(state);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(st) = weak.upgrade() else { return };
            let checks = st.workers.iter().map(|w| {
                let url = format!("{}/health", w.url.trim_end_matches('/'));
                let client = client.clone();
                async move { matches!(client.get(url).send().await, Ok(r) if r.status().is_success()) }
            });
            let results = futures_util::future::join_all(checks).await;
            for (i, ok) in results.into_iter().enumerate() {
                let was = st.healthy[i].swap(ok, Ordering::Relaxed);
                if was != ok {
                    tracing::warn!(worker = %st.workers[i].name, healthy = ok, "worker health changed");
                    if !ok {
                        // A worker that went away may come back with an empty cache.
                        st.router.remove_worker(i);
                    }
                }
            }
        }
    });
}

async fn chat(State(st): State<Arc<AppState>>, req: Request) -> Response {
    inference(st, Endpoint::Chat, req).await
}

async fn completions(State(st): State<Arc<AppState>>, req: Request) -> Response {
    inference(st, Endpoint::Completion, req).await
}

/// The request's whole path: read the bytes, plan, select, forward, observe.
async fn inference(st: Arc<AppState>, endpoint: Endpoint, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = match read_body(body, st.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => return rejected(e),
    };
    let json: serde_json::Value = match serde_json::from_slice(&bytes) {
        Ok(v @ serde_json::Value::Object(_)) => v,
        Ok(_) => return rejected(ApiError::bad_request("invalid_json", "request body must be a JSON object")),
        Err(e) => {
            return rejected(ApiError::bad_request("invalid_json", format!("request body is not valid JSON: {e}")))
        }
    };
    let mut plan = match st.pipeline.plan(endpoint, &bytes, &json).await {
        Ok(p) => p,
        Err(e) => return rejected(e),
    };
    let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or(endpoint.path()).to_owned();
    forward_planned(&st, &mut plan, parts.method, &path, &parts.headers, bytes).await
}

/// Select a worker for the plan, forward, and relay. One retry on another worker if the first cannot
/// be connected to (nothing was sent, so retrying cannot duplicate work).
async fn forward_planned(
    st: &Arc<AppState>,
    plan: &mut RoutePlan,
    method: Method,
    path: &str,
    headers: &axum::http::HeaderMap,
    bytes: Bytes,
) -> Response {
    let mut healthy = st.healthy_mask();
    let mut last_error = None;
    for attempt in 0..2 {
        let t = Instant::now();
        let Some(decision) = st.router.select(&plan.select_request(), &healthy) else {
            // After a failed connect, the client learns about that failure, not about an empty pool.
            return finish_error(plan, last_error.unwrap_or_else(ApiError::no_worker));
        };
        m::stage(m::stage::SELECT, t.elapsed());
        let w = decision.worker;
        let overlap = decision.overlap_tokens(plan.block_size).min(plan.prompt_tokens);
        plan.decision = Some(decision);
        let guard = st.router.begin(
            w,
            Load {
                prefill_tokens: plan.prompt_tokens - overlap,
                decode_tokens: plan.decode_tokens,
                image_tokens: plan.exact_image_tokens(),
            },
        );
        let worker = &st.workers[w];
        if attempt == 0 {
            // Counted once per request, at dispatch, whatever the worker answers.
            plan.observe_dispatch(overlap);
        }
        // Approximate index: the worker holds these blocks from admission on, so a concurrent request
        // with the same prefix already sees them (text-prefix plans carry no image keys).
        st.router.record(w, &plan.blocks);
        let sent_at = Instant::now();
        let result = st.upstream.send(&worker.url, method.clone(), path, headers, bytes.clone()).await;
        let resp = match result {
            Ok(r) => r,
            Err(e) => {
                metrics::counter!(m::UPSTREAM_REQUESTS_TOTAL, "worker" => worker.name.clone(), "status" => e.label())
                    .increment(1);
                drop(guard);
                if matches!(e, crate::upstream::UpstreamError::Connect(_)) {
                    if st.healthy[w].swap(false, Ordering::Relaxed) {
                        st.router.remove_worker(w);
                    }
                    healthy[w] = false;
                    if attempt == 0 {
                        tracing::warn!(worker = %worker.name, "connect failed, retrying on another worker: {e}");
                        last_error = Some(e.to_api(&worker.name));
                        continue;
                    }
                }
                return finish_error(plan, e.to_api(&worker.name));
            }
        };
        m::stage(m::stage::FORWARD_TTFB, sent_at.elapsed());
        let status = resp.status();
        metrics::counter!(m::UPSTREAM_REQUESTS_TOTAL, "worker" => worker.name.clone(), "status" => status.as_str().to_owned())
            .increment(1);
        metrics::counter!(m::REQUESTS_TOTAL, "route" => plan.route.label(), "status" => status.as_str().to_owned())
            .increment(1);
        return relay(st, plan, resp, guard, &worker.name);
    }
    finish_error(plan, ApiError::no_worker())
}

fn relay(
    st: &Arc<AppState>,
    plan: &RoutePlan,
    resp: reqwest::Response,
    guard: crate::routing::LoadGuard,
    worker: &str,
) -> Response {
    let status = resp.status();
    let mut builder = Response::builder().status(status);
    let sse = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if let Some(h) = builder.headers_mut() {
        for (name, value) in resp.headers() {
            if !is_hop_by_hop(name) {
                h.append(name.clone(), value.clone());
            }
        }
        h.insert("x-mmrouter-route", HeaderValue::from_static(plan.route.label()));
        if let Ok(v) = HeaderValue::from_str(worker) {
            h.insert("x-mmrouter-worker", v);
        }
    }
    let predicted = plan.predicted_prompt_tokens();
    let on_end = Box::new(move |end: EndReport| {
        if let (Outcome::Complete, Some(actual), Some(pred)) = (end.outcome, end.usage_prompt_tokens, predicted) {
            metrics::histogram!(m::PROMPT_TOKENS_DRIFT).record(actual as f64 - pred as f64);
        }
    });
    let deadline = tokio::time::Instant::now() + st.upstream.total_timeout();
    let length = resp.content_length();
    let body = Relay::new(resp.bytes_stream(), deadline, guard, sse, length, on_end);
    builder.body(Body::from_stream(body)).unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// An error after planning: counted under the plan's route.
fn finish_error(plan: &RoutePlan, err: ApiError) -> Response {
    metrics::counter!(m::REQUESTS_TOTAL, "route" => plan.route.label(), "status" => err.status.as_str().to_owned())
        .increment(1);
    let mut resp = err.into_response();
    resp.headers_mut().insert("x-mmrouter-route", HeaderValue::from_static(plan.route.label()));
    resp
}

/// Rejected before a route was known (bad body, unreachable image with reject_blocked_urls…).
fn rejected(err: ApiError) -> Response {
    metrics::counter!(m::REQUESTS_TOTAL, "route" => "rejected", "status" => err.status.as_str().to_owned())
        .increment(1);
    err.into_response()
}

async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    match http_body_util::Limited::new(body, limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ApiError::too_large(limit)),
        Err(e) => Err(ApiError::bad_request("body_read_failed", format!("could not read the request body: {e}"))),
    }
}

/// Other `/v1/*` calls (models, embeddings, …) go to a healthy worker as they are.
async fn passthrough(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = match read_body(body, st.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => return rejected(e),
    };
    let mut plan = RoutePlan::passthrough(st.pipeline.block_size());
    let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/").to_owned();
    forward_planned(&st, &mut plan, parts.method, &path, &parts.headers, bytes).await
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    let healthy: Vec<&str> = st
        .workers
        .iter()
        .zip(st.healthy.iter())
        .filter(|(_, h)| h.load(Ordering::Relaxed))
        .map(|(w, _)| w.name.as_str())
        .collect();
    let status = if healthy.is_empty() { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
    let body = serde_json::json!({
        "status": if healthy.is_empty() { "unavailable" } else { "ok" },
        "healthy_workers": healthy,
        "workers": st.workers.len(),
    });
    (status, axum::Json(body)).into_response()
}

async fn metrics_page(State(st): State<Arc<AppState>>) -> Response {
    ([("content-type", "text/plain; version=0.0.4; charset=utf-8")], st.prom.render()).into_response()
}

/// The plan and the choice for a chat request, as JSON, without forwarding or holding any load.
async fn debug_route(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let bytes = match read_body(req.into_body(), st.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let json: serde_json::Value = match serde_json::from_slice(&bytes) {
        Ok(v @ serde_json::Value::Object(_)) => v,
        _ => return ApiError::bad_request("invalid_json", "request body must be a JSON object").into_response(),
    };
    let mut plan = match st.pipeline.plan(Endpoint::Chat, &bytes, &json).await {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    plan.decision = st.router.select(&plan.select_request(), &st.healthy_mask());
    let chosen = plan.decision.as_ref().map(|d| st.workers[d.worker].name.clone());
    let mut out = plan.debug_json();
    out["worker"] = serde_json::json!(chosen);
    out["workers"] = serde_json::json!(st.workers.iter().map(|w| &w.name).collect::<Vec<_>>());
    axum::Json(out).into_response()
}
