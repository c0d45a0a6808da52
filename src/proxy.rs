//! The request's path, top to bottom:
//!
//! ```text
//! read body ─► parse ─► plan (intake → account → gate → plan) ─► select ─► forward ─► relay
//!                         mmrouter-core                            core      upstream
//! ```
//!
//! with the observe stage recording what each step reports. The received bytes are what is
//! forwarded — the parse only reads them — with one exception: on the exact route to a vLLM worker each
//! image part gets its content digest spliced in as `uuid` (every other byte as received).

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::BodyExt;
use mmrouter_core::pipeline::{splice_uuids, Planned, Route, RoutePlan};
use mmrouter_core::request::{Endpoint, Request as ParsedRequest};
use mmrouter_core::routing::{Decision, Engine, Load, LoadGuard, SelectRequest};

use crate::error::ApiError;
use crate::observe::stage;
use crate::state::AppState;
use crate::upstream::{is_hop_by_hop, EndReport, Outcome, Relay, UpstreamError};

/// Upstream attempts per request: the chosen worker, and one more candidate if it cannot be
/// connected to (nothing was sent, so retrying cannot duplicate work).
const MAX_ATTEMPTS: usize = 2;

/// `POST /v1/chat/completions` and `/v1/completions`.
pub async fn inference(st: Arc<AppState>, endpoint: Endpoint, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = match read_body(body, st.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => return rejected(&st, e),
    };
    let planned = match plan(&st, endpoint, &bytes).await {
        Ok(p) => p,
        Err(e) => return rejected(&st, e),
    };
    let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or(endpoint.path()).to_owned();
    forward(&st, &planned.plan, parts.method, &path, &parts.headers, bytes).await
}

/// Text (bytes of the body outside image URLs) up to which a request is planned on the async
/// runtime: rendering and tokenizing cost ~1 µs per token, so 64 KiB is at most a few ms.
const INLINE_PLAN_BYTES: usize = 64 * 1024;

/// Parse and plan; the observe stage records what planning took. Large prompts are planned on the
/// blocking pool, at most one per core at a time.
async fn plan(st: &Arc<AppState>, endpoint: Endpoint, bytes: &Bytes) -> Result<Planned, ApiError> {
    let request = ParsedRequest::parse(endpoint, bytes)?;
    let text_bytes = bytes.len().saturating_sub(request.images.iter().map(|i| i.url.len()).sum());
    let planned = if text_bytes <= INLINE_PLAN_BYTES {
        st.pipeline.plan(&request).await?
    } else {
        drop(request);
        plan_blocking(st, endpoint, bytes.clone()).await?
    };
    st.observe.planned(&planned);
    Ok(planned)
}

/// Plans on the blocking pool under a planning permit; image fetches still run on the runtime.
async fn plan_blocking(st: &Arc<AppState>, endpoint: Endpoint, bytes: Bytes) -> Result<Planned, ApiError> {
    let _permit = st.planners.acquire().await.map_err(|_| ApiError::internal("planning pool closed"))?;
    let (st, runtime) = (Arc::clone(st), tokio::runtime::Handle::current());
    tokio::task::spawn_blocking(move || {
        let request = ParsedRequest::parse(endpoint, &bytes)?;
        Ok(runtime.block_on(st.pipeline.plan(&request))?)
    })
    .await
    .map_err(|e| ApiError::internal(format!("planning failed: {e}")))?
}

/// Select, then try the candidates in order: hold the load, record the blocks, send the original
/// bytes, relay the answer.
async fn forward(
    st: &Arc<AppState>,
    plan: &RoutePlan,
    method: Method,
    path: &str,
    headers: &HeaderMap,
    bytes: Bytes,
) -> Response {
    let t = Instant::now();
    let Some(decision) = st.router.select(&select_request(plan)) else {
        return finish_error(st, plan, ApiError::no_worker());
    };
    st.observe.stage(stage::SELECT, t.elapsed());
    let mut last_error = None;
    let mut spliced = None;
    for (attempt, &w) in decision.candidates.iter().take(MAX_ATTEMPTS).enumerate() {
        let worker = st.router.worker(w).clone();
        if attempt > 0 && !worker.is_healthy() {
            continue; // went down since the ranking
        }
        let body = body_for(worker.engine(), plan, &bytes, &mut spliced);
        let guard = dispatch(st, plan, &decision, w, attempt == 0);
        let sent_at = Instant::now();
        match st.upstream.send(worker.url(), method.clone(), path, headers, body).await {
            Ok(resp) => {
                st.observe.stage(stage::FORWARD_TTFB, sent_at.elapsed());
                return relay(st, plan, resp, guard);
            }
            Err(e) => {
                st.observe.upstream(worker.name(), e.label());
                drop(guard);
                let err = e.to_api(worker.name());
                if !matches!(e, UpstreamError::Connect(_)) {
                    return finish_error(st, plan, err);
                }
                if st.router.mark_down(w) {
                    tracing::warn!(worker = %worker.name(), "connect failed, trying the next candidate: {e}");
                }
                // After a failed connect, the client learns about that failure, not about an empty pool.
                last_error = Some(err);
            }
        }
    }
    finish_error(st, plan, last_error.unwrap_or_else(ApiError::no_worker))
}

/// The bytes a worker receives: the received ones, except that on the exact route to vLLM each image
/// part carries the image's content digest as its `uuid` (vLLM then names the image as the router
/// does, in its caches and its KV events). Built once per request, only when needed.
fn body_for(engine: Engine, plan: &RoutePlan, received: &Bytes, spliced: &mut Option<Bytes>) -> Bytes {
    let splice = engine == Engine::Vllm && plan.route == Route::Exact && plan.images.iter().any(|i| i.splice.is_some());
    if !splice {
        return received.clone();
    }
    spliced.get_or_insert_with(|| Bytes::from(splice_uuids(received, &plan.images))).clone()
}

/// What selection needs to know about a plan.
fn select_request(plan: &RoutePlan) -> SelectRequest<'_> {
    SelectRequest {
        blocks: &plan.blocks,
        block_size: plan.block_size,
        prompt_tokens: plan.prompt_tokens,
        decode_tokens: plan.decode_tokens,
    }
}

/// Holds the request's load on worker `w` and records its blocks there (at dispatch, so a
/// concurrent request with the same prefix already sees them; a text-prefix plan has no image keys).
fn dispatch(st: &AppState, plan: &RoutePlan, decision: &Decision, w: usize, first: bool) -> LoadGuard {
    let overlap = decision.overlap_tokens(w, plan.block_size).min(plan.prompt_tokens);
    let load = Load {
        prefill_tokens: plan.prompt_tokens - overlap,
        decode_tokens: plan.decode_tokens,
        image_tokens: plan.exact_image_tokens(),
    };
    let guard = st.router.begin(w, load);
    if first {
        // Counted once per request, at dispatch, whatever the worker answers.
        st.observe.dispatched(plan, overlap);
    }
    st.router.record_prompt(w, &plan.blocks, plan.first_image_block(), !plan.images_rehashed);
    guard
}

/// Streams the worker's answer back; the relay holds the load guard and reports `usage` at the end.
fn relay(st: &Arc<AppState>, plan: &RoutePlan, resp: reqwest::Response, guard: LoadGuard) -> Response {
    let status = resp.status();
    let worker = guard.worker().name().to_owned();
    st.observe.upstream(&worker, status.as_str());
    st.observe.finished(plan.route, status.as_u16());
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
        if let Ok(v) = HeaderValue::from_str(&worker) {
            h.insert("x-mmrouter-worker", v);
        }
    }
    let predicted = plan.predicted_prompt_tokens();
    let drift = st.observe.drift();
    let on_end = Box::new(move |end: EndReport| {
        if let (Outcome::Complete, Some(actual), Some(pred)) = (end.outcome, end.usage_prompt_tokens, predicted) {
            drift.record(actual as f64 - f64::from(pred));
        }
    });
    let deadline = tokio::time::Instant::now() + st.upstream.total_timeout();
    let length = resp.content_length();
    let body = Relay::new(resp.bytes_stream(), deadline, guard, sse, length, on_end);
    builder.body(Body::from_stream(body)).unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// An error after planning: counted under the plan's route.
fn finish_error(st: &AppState, plan: &RoutePlan, err: ApiError) -> Response {
    st.observe.finished(plan.route, err.status.as_u16());
    let mut resp = err.into_response();
    resp.headers_mut().insert("x-mmrouter-route", HeaderValue::from_static(plan.route.label()));
    resp
}

/// Rejected before a route was known (bad body, unreachable image with reject_blocked_urls…).
fn rejected(st: &AppState, err: ApiError) -> Response {
    st.observe.rejected(err.status.as_u16(), err.code);
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
pub async fn passthrough(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = match read_body(body, st.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => return rejected(&st, e),
    };
    let plan = RoutePlan::passthrough(st.pipeline.block_size());
    let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/").to_owned();
    forward(&st, &plan, parts.method, &path, &parts.headers, bytes).await
}

/// `?tokens=true` on `/debug/route` adds the rendered text, token ids and image spans.
#[derive(serde::Deserialize, Default)]
pub struct DebugParams {
    #[serde(default)]
    tokens: bool,
}

/// `POST /debug/route`: the plan and the choice for a chat request, as JSON, without forwarding or
/// holding any load.
pub async fn debug_route(State(st): State<Arc<AppState>>, Query(params): Query<DebugParams>, req: Request) -> Response {
    let bytes = match read_body(req.into_body(), st.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let request = match ParsedRequest::parse(Endpoint::Chat, &bytes) {
        Ok(r) => r,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let planned = match st.pipeline.plan_with(&request, params.tokens).await {
        Ok(p) => p,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let decision = st.router.select(&select_request(&planned.plan));
    let mut out = debug_json(&st, &planned.plan, decision.as_ref());
    if params.tokens {
        let trace = crate::render::report(&planned);
        for key in ["text", "token_ids", "image_spans"] {
            out[key] = trace[key].clone();
        }
    }
    axum::Json(out).into_response()
}

fn debug_json(st: &AppState, plan: &RoutePlan, d: Option<&Decision>) -> serde_json::Value {
    let reason = match plan.route {
        Route::TextPrefix { reason } => Some(reason),
        _ => None,
    };
    let name = |w: usize| st.router.worker(w).name().to_owned();
    serde_json::json!({
        "route": plan.route.label(),
        "reason": reason,
        "prompt_tokens": plan.prompt_tokens,
        "prompt_tokens_exact": plan.prompt_exact,
        "image_tokens": plan.images.iter().map(|i| i.tokens).collect::<Vec<_>>(),
        "images": plan.images,
        "block_size": plan.block_size,
        "blocks": plan.blocks.len(),
        "decode_tokens": plan.decode_tokens,
        "overlap_blocks": d.map(|d| &d.overlap_blocks),
        "overlap_sources": d.map(|d| &d.overlap_sources),
        "overlap_sources": d.map(|d| &d.overlap_sources),
        "costs": d.map(|d| &d.costs),
        "policy": d.map(|d| d.policy),
        "worker": d.map(|d| name(d.worker())),
        "candidates": d.map(|d| d.candidates.iter().map(|&w| name(w)).collect::<Vec<_>>()),
        "workers": st.router.workers().iter().map(|w| w.name()).collect::<Vec<_>>(),
    })
}
