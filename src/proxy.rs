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

use axum::body::{Body, HttpBody};
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::BodyExt;
use mmrouter_core::pipeline::{splice_uuids, Planned, Route, RoutePlan};
use mmrouter_core::request::{Endpoint, Request as ParsedRequest};
use mmrouter_core::routing::{Decision, Engine, Failure, Load, LoadGuard, Router, SelectRequest, Transition};

use crate::error::ApiError;
use crate::observe::stage;
use crate::retry::RetryReason;
use crate::state::{AppState, Pool};
use crate::upstream::{end_to_end, EndReport, Outcome, Relay, RelayLimits, UpstreamError, UpstreamResponse};

/// `POST /v1/chat/completions` and `/v1/completions`.
pub async fn inference(st: Arc<AppState>, endpoint: Endpoint, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = match read_body(body, st.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => return rejected(&st, e),
    };
    let request = match ParsedRequest::parse(endpoint, &bytes) {
        Ok(r) => r,
        Err(e) => return rejected(&st, e.into()),
    };
    let Some(pool) = st.pool_for(request.str_field("model")) else {
        return rejected(&st, ApiError::model_not_found(request.str_field("model")));
    };
    st.observe.pool_request(&pool.name);
    let planned = match plan(&st, &pool, request, &bytes).await {
        Ok(planned) => planned,
        Err(e) => return rejected(&st, e),
    };
    let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or(endpoint.path()).to_owned();
    forward(&st, &pool, &planned.plan, parts.method, &path, &parts.headers, bytes).await
}

/// Text (bytes of the body outside image URLs) up to which a request is planned on the async
/// runtime: tokenizing costs ~0.1 µs per token (~1 µs on the HF fallback path), so 64 KiB of text
/// (~16 k tokens) is at most a few ms.
const INLINE_PLAN_BYTES: usize = 64 * 1024;

/// Parse and plan; the observe stage records what planning took. Large prompts are planned on the
/// blocking pool, at most one per core at a time.
async fn plan(
    st: &Arc<AppState>,
    pool: &Arc<Pool>,
    request: ParsedRequest<'_>,
    bytes: &Bytes,
) -> Result<Planned, ApiError> {
    let text_bytes = bytes.len().saturating_sub(request.images.iter().map(|i| i.url.len()).sum());
    let planned = if text_bytes <= INLINE_PLAN_BYTES {
        pool.pipeline.plan(&request).await?
    } else {
        let endpoint = request.endpoint;
        drop(request);
        plan_blocking(st, pool, endpoint, bytes.clone()).await?
    };
    st.observe.planned(&planned);
    Ok(planned)
}

/// Plans on the blocking pool under a planning permit; image fetches still run on the runtime.
async fn plan_blocking(st: &AppState, pool: &Arc<Pool>, endpoint: Endpoint, bytes: Bytes) -> Result<Planned, ApiError> {
    let _permit = st.planners.acquire().await.map_err(|_| ApiError::internal("planning pool closed"))?;
    let (pool, runtime) = (Arc::clone(pool), tokio::runtime::Handle::current());
    tokio::task::spawn_blocking(move || {
        let request = ParsedRequest::parse(endpoint, &bytes)?;
        Ok(runtime.block_on(pool.pipeline.plan(&request))?)
    })
    .await
    .map_err(|e| ApiError::internal(format!("planning failed: {e}")))?
}

/// Select, then try the candidates in order: hold the load, record the blocks, send the original
/// bytes, relay the answer. A connect error, a timeout to the response head, a transport error, a
/// 5xx or a 429 moves on to the next candidate, within `retries.max_attempts` and the retry budget;
/// nothing has reached the client yet, so the held bytes can be sent again. When no retry is left,
/// the client gets the last worker's own answer (its 5xx or 429 with `retry-after`) or our error.
async fn forward(
    st: &Arc<AppState>,
    pool: &Arc<Pool>,
    plan: &RoutePlan,
    method: Method,
    path: &str,
    headers: &HeaderMap,
    bytes: Bytes,
) -> Response {
    let t = Instant::now();
    let router = &pool.router;
    let Some(decision) = router.select(&select_request(plan)) else {
        return finish_error(st, plan, ApiError::no_worker());
    };
    st.observe.stage(stage::SELECT, t.elapsed());
    st.retry_budget.deposit();
    let out = Outgoing { method: &method, path, headers };
    let mut spliced = None;
    let mut last: Option<Failed> = None;
    let mut attempts = 0;
    for &w in &decision.candidates {
        if attempts == st.retries.max_attempts {
            break;
        }
        // Ejected, down, or its half-open probe already out since the ranking: not an attempt.
        let Some(admission) = router.admit(w) else { continue };
        if let Some(prev) = last.take() {
            if !spend_retry(st, router, &prev) {
                last = Some(prev);
                break;
            }
            // `prev` drops here, unread: its connection closes and its load is released.
        }
        attempts += 1;
        let body = body_for(router.worker(w).engine(), plan, &bytes, &mut spliced);
        let guard = dispatch(st, router, plan, &decision, w, attempts == 1);
        match attempt(st, router, w, &out, body, guard, admission.is_probe()).await {
            Ok((resp, guard)) => {
                drop(admission);
                return relay(st, pool, plan, resp, w, guard);
            }
            Err(failed) => last = Some(failed),
        }
    }
    match last {
        Some(Failed { answer: Answer::Worker(resp, guard), worker, .. }) => relay(st, pool, plan, resp, worker, guard),
        Some(Failed { answer: Answer::Ours(err), .. }) => finish_error(st, plan, err),
        None => finish_error(st, plan, ApiError::no_worker()),
    }
}

/// What is sent upstream, besides the body.
struct Outgoing<'a> {
    method: &'a Method,
    path: &'a str,
    headers: &'a HeaderMap,
}

/// One upstream attempt on worker `w`: the response to relay, or the failure (fed to the worker's
/// state either way).
async fn attempt(
    st: &AppState,
    router: &Router,
    w: usize,
    out: &Outgoing<'_>,
    body: Bytes,
    guard: LoadGuard,
    probe: bool,
) -> Result<(UpstreamResponse, LoadGuard), Failed> {
    let worker = router.worker(w);
    let sent_at = Instant::now();
    match st.upstream.send(worker.url(), out.method.clone(), out.path, out.headers, body).await {
        Ok(resp) => {
            st.observe.stage(stage::FORWARD_TTFB, sent_at.elapsed());
            let Some(reason) = RetryReason::of_status(resp.status()) else {
                report(st, router, w, router.succeeded(w, probe));
                return Ok((resp, guard));
            };
            // A 429 says "busy", not "broken": it neither ejects nor recovers the worker.
            if reason == RetryReason::ServerError {
                report(st, router, w, router.failed(w, Failure::Error, probe));
            }
            Err(Failed { reason, answer: Answer::Worker(resp, guard), worker: w })
        }
        Err(e) => {
            st.observe.upstream(worker.name(), e.label());
            drop(guard);
            let failure = if matches!(e, UpstreamError::Connect(_)) { Failure::Connect } else { Failure::Error };
            report(st, router, w, router.failed(w, failure, probe));
            tracing::warn!(worker = %worker.name(), "upstream attempt failed: {e}");
            let answer = Answer::Ours(e.to_api(worker.name()));
            Err(Failed { reason: RetryReason::of_error(&e), answer, worker: w })
        }
    }
}

/// Takes a retry from the budget for the failure `prev`; false (and counted) when it is used up.
fn spend_retry(st: &AppState, router: &Router, prev: &Failed) -> bool {
    if !st.retry_budget.try_withdraw() {
        st.observe.retry_budget_exhausted();
        return false;
    }
    st.observe.retry(prev.reason.label());
    if let Answer::Worker(resp, _) = &prev.answer {
        // Its status is counted here, since it is never relayed.
        st.observe.upstream(router.worker(prev.worker).name(), resp.status().as_str());
    }
    true
}

/// The last failed attempt, kept until it is retried (dropped) or returned to the client.
struct Failed {
    reason: RetryReason,
    answer: Answer,
    worker: usize,
}

enum Answer {
    /// The worker's own answer (a 5xx or 429), relayed as it is if no retry follows.
    Worker(UpstreamResponse, LoadGuard),
    /// No answer (connect error, timeout, transport error): the client gets our error.
    Ours(ApiError),
}

/// Logs and counts a worker's state change.
fn report(st: &AppState, router: &Router, w: usize, t: Option<Transition>) {
    let worker = router.worker(w);
    let name = worker.name();
    match t {
        Some(Transition::Ejected { length, clear_index }) => {
            st.observe.ejected(name);
            tracing::warn!(worker = %name, ejected_ms = length.as_millis() as u64, clear_index, "worker ejected");
        }
        Some(Transition::Recovered) => tracing::info!(worker = %name, "worker recovered (half-open probe succeeded)"),
        None => {}
    }
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
fn dispatch(st: &AppState, router: &Router, plan: &RoutePlan, decision: &Decision, w: usize, first: bool) -> LoadGuard {
    let overlap = decision.overlap_tokens(w, plan.block_size).min(plan.prompt_tokens);
    let load = Load {
        prefill_tokens: plan.prompt_tokens - overlap,
        decode_tokens: plan.decode_tokens,
        image_tokens: plan.exact_image_tokens(),
    };
    let guard = router.begin(w, load);
    if first {
        // Counted once per request, at dispatch, whatever the worker answers.
        st.observe.dispatched(plan, overlap);
    }
    router.record_prompt(w, &plan.blocks, plan.first_image_block(), !plan.images_rehashed);
    guard
}

/// Streams the worker's answer back; the relay holds the load guard and reports `usage` at the end.
/// The request is counted when its body ends: a body cut by the worker or a timeout counts as
/// `status="stream_error"` (and feeds the worker's failure record), whatever status went out first.
fn relay(
    st: &Arc<AppState>,
    pool: &Arc<Pool>,
    plan: &RoutePlan,
    resp: UpstreamResponse,
    w: usize,
    guard: LoadGuard,
) -> Response {
    let status = resp.status();
    let worker = guard.worker().name();
    st.observe.upstream(worker, status.as_str());
    let mut builder = Response::builder().status(status);
    let sse = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if let Some(h) = builder.headers_mut() {
        for (name, value) in end_to_end(resp.headers()) {
            h.append(name.clone(), value.clone());
        }
        h.insert("x-mmrouter-route", HeaderValue::from_static(plan.route.label()));
        if let Ok(v) = HeaderValue::from_str(worker) {
            h.insert("x-mmrouter-worker", v);
        }
    }
    let predicted = plan.predicted_prompt_tokens();
    let (state, pool, route) = (st.clone(), pool.clone(), plan.route);
    // Held until the body ends: while it is, id `w` cannot be given to another worker.
    let held = guard.worker().clone();
    let on_end = Box::new(move |end: EndReport| {
        let _worker = &held;
        if let (Outcome::Complete, Some(actual), Some(pred)) = (end.outcome, end.usage_prompt_tokens, predicted) {
            state.observe.drift().record(actual as f64 - f64::from(pred));
        }
        match end.outcome.cut_reason() {
            Some(reason) => {
                state.observe.stream_cut(route, reason);
                // The total timeout is our limit, not the worker's failure.
                if end.outcome != Outcome::Timeout {
                    // Never the probe: the probe's outcome was its response head.
                    let router = &pool.router;
                    report(&state, router, w, router.failed(w, Failure::Error, false));
                }
            }
            None => state.observe.finished(route, status.as_u16()),
        }
    });
    let limits = RelayLimits {
        deadline: tokio::time::Instant::now() + st.upstream.total_timeout(),
        idle: st.upstream.idle_timeout(),
    };
    let length = resp.body().size_hint().exact();
    let body = Relay::new(resp.into_body().into_data_stream(), limits, guard, sse, length, on_end);
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
    // The pool of the body's `model` when it names one (embeddings, tokenize, …), else the first.
    let model = serde_json::from_slice::<ModelField>(&bytes).ok().and_then(|m| m.model);
    let pool = st.pool_for(model.as_deref()).unwrap_or_else(|| st.pools()[0].clone());
    let plan = RoutePlan::passthrough(pool.pipeline.block_size());
    let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/").to_owned();
    forward(&st, &pool, &plan, parts.method, &path, &parts.headers, bytes).await
}

/// The `model` of a body, when it is a JSON object naming one.
#[derive(serde::Deserialize)]
struct ModelField {
    model: Option<String>,
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
    let Some(pool) = st.pool_for(request.str_field("model")) else {
        return ApiError::model_not_found(request.str_field("model")).into_response();
    };
    let planned = match pool.pipeline.plan_with(&request, params.tokens).await {
        Ok(p) => p,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let decision = pool.router.select(&select_request(&planned.plan));
    let mut out = debug_json(&pool.router, &planned.plan, decision.as_ref());
    out["pool"] = pool.name.clone().into();
    if params.tokens {
        let trace = crate::render::report(&planned);
        for key in ["text", "token_ids", "image_spans"] {
            out[key] = trace[key].clone();
        }
    }
    axum::Json(out).into_response()
}

fn debug_json(router: &Router, plan: &RoutePlan, d: Option<&Decision>) -> serde_json::Value {
    let reason = match plan.route {
        Route::TextPrefix { reason } => Some(reason),
        _ => None,
    };
    let name = |w: usize| router.worker(w).name().to_owned();
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
        "workers": router.workers().iter().map(|w| w.name()).collect::<Vec<_>>(),
    })
}
