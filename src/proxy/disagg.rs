//! Phase **forward** for a pool whose workers have roles (docs/disaggregated.md): the request served in
//! legs — encode (images, when an encoder stage exists and some image is not already inside the
//! chosen worker's cached prefix), prefill (one token; its KV cache kept for decode), decode (the
//! client's answer, relayed like an aggregated one).
//!
//! ```text
//! pick prefill (exact plan's KV overlap, images included, and prefill load)
//!   └► encode leg?  (encoder by residency: `Router::select_encoder`)   failed → skipped, counted
//!   └► prefill leg  (up to two prefill workers)                         failed → aggregated on decode
//!   └► decode leg   (its own cached prefix and load; `forward`'s attempts and retries)
//! ```
//!
//! Failure is a smaller path, never an error the client did not cause: a failed encode leg is
//! skipped (prefill encodes locally), a failed prefill leg is tried on another prefill worker, then
//! the request is served whole by a decode worker (it computes the prompt itself). Every leg is
//! bounded by the upstream deadlines; a client that goes away drops this future, which drops the
//! legs' connections. SGLang P/D sends both legs at once with a bootstrap room.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use mmrouter_core::pipeline::{Route, RoutePlan};
use mmrouter_core::routing::{
    Decision, EncodeRequest, Engine, Failure, ImageUse, Load, PoolShape, Role, SelectRequest,
};
use serde_json::value::RawValue;

use super::context::Ctx;
use super::forward::{self, report, Answer};
use crate::error::ApiError;
use crate::observe::{Attempt, AttemptStatus, Leg, LegKind, LegOutcome};
use crate::state::AppState;
use crate::upstream::legs::{self, LegError, MAX_PREFILL_ANSWER};
use crate::upstream::{Outgoing, Pieces, UpstreamError};

/// Prefill workers one request tries before it is served whole by a decode worker.
const PREFILL_TRIES: usize = 2;

/// Serves the planned request in legs; the decode leg's answer (or the whole request's) to relay.
pub async fn serve(st: &Arc<AppState>, ctx: &mut Ctx, shape: PoolShape) -> Result<Answer, ApiError> {
    let t = Instant::now();
    let first = if shape.pd { Role::Prefill } else { shape.whole };
    let router = ctx.pool().router.clone();
    let req = forward::select_request(ctx.plan());
    let mut decision = router.select_model(&req, first, ctx.adapter.as_deref());
    // No prefill worker selectable: the request is served whole.
    let no_prefill = decision.is_none() && first != shape.whole;
    if no_prefill {
        decision = router.select_model(&req, shape.whole, ctx.adapter.as_deref());
    }
    let SelectRequest { images, .. } = req;
    ctx.images = images;
    if no_prefill {
        ctx.legs.push(Leg::skipped(LegKind::Prefill, "no_prefill_worker"));
    }
    let decision = decision.ok_or_else(|| forward::no_worker_for(ctx))?;
    let pd = shape.pd && ctx.pool().router.worker(decision.worker()).role() == Role::Prefill;
    ctx.decision = Some(decision);
    ctx.select = Some(t.elapsed());
    if shape.encode {
        encode_leg(st, ctx).await;
    }
    if !pd {
        return whole(st, ctx, shape.whole, shape.pd).await;
    }
    if ctx.pool().router.worker(ctx.decision.as_ref().expect("selected").worker()).engine() == Engine::Sglang {
        return sglang(st, ctx).await;
    }
    match prefill_leg(st, ctx).await {
        Some(params) => decode_leg(st, ctx, &params).await,
        None => whole(st, ctx, shape.whole, true).await,
    }
}

/// The request served whole by a worker of `role` (a P/D pool's fallback strips any transfer
/// parameters a client sent: its engines have connectors that would act on them).
async fn whole(st: &AppState, ctx: &mut Ctx, role: Role, strip: bool) -> Result<Answer, ApiError> {
    if ctx.pool().router.worker(ctx.decision.as_ref().expect("selected").worker()).role() != role {
        let req = forward::select_request(ctx.plan());
        ctx.decision =
            Some(ctx.pool().router.select_model(&req, role, ctx.adapter.as_deref()).ok_or_else(ApiError::no_worker)?);
    }
    if strip {
        let body = forward::body_for(ctx, Engine::Vllm).into_bytes();
        ctx.leg_body = Some(legs::without_params(&body).map_err(leg_refused)?);
    }
    forward::forward(st, ctx).await
}

/// The decode leg: the client's request with the prefill's parameters, on the decode worker that
/// holds most of the prompt already (what it need not pull) for its load.
async fn decode_leg(st: &AppState, ctx: &mut Ctx, params: &RawValue) -> Result<Answer, ApiError> {
    let req = forward::select_request(ctx.plan());
    let Some(decision) = ctx.pool().router.select_model(&req, Role::Decode, ctx.adapter.as_deref()) else {
        return Err(ApiError::no_worker());
    };
    let prefill_overlap = ctx.dispatched_overlap;
    let body = forward::body_for(ctx, Engine::Vllm).into_bytes();
    ctx.leg_body = Some(legs::decode_body(&body, params).map_err(leg_refused)?);
    ctx.decision = Some(decision);
    let t = Instant::now();
    let answer = forward::forward(st, ctx).await;
    // The request's KV routing was the prefill's: its predicted overlap is the one observed.
    ctx.dispatched_overlap = prefill_overlap.or(ctx.dispatched_overlap);
    let worker = answer.as_ref().ok().map(|a| ctx.pool().router.worker(a.worker).name().to_owned());
    let outcome = if answer.is_ok() { LegOutcome::Served } else { LegOutcome::Failed("decode_failed") };
    ctx.legs.push(Leg { kind: LegKind::Decode, worker, outcome, elapsed: Some(t.elapsed()) });
    answer
}

/// The prefill leg on up to [`PREFILL_TRIES`] prefill workers in the decision's order: the checked
/// `kv_transfer_params` of the first that answers, or `None` (each failure counted).
async fn prefill_leg(st: &AppState, ctx: &mut Ctx) -> Option<Box<RawValue>> {
    let body = forward::body_for(ctx, Engine::Vllm).into_bytes();
    let body = match legs::prefill_body(&body) {
        Ok(b) => b,
        Err(e) => {
            ctx.legs.push(Leg::skipped(LegKind::Prefill, e.label()));
            return None;
        }
    };
    let candidates = ctx.decision.as_ref().expect("selected").candidates.clone();
    for (i, w) in candidates.into_iter().take(PREFILL_TRIES).enumerate() {
        let Some(admission) = ctx.pool().router.admit(w) else { continue };
        let t = Instant::now();
        let guard = forward::dispatch(ctx, w, i == 0);
        let sent = leg_send(st, ctx, w, body.clone()).await;
        drop(guard);
        let name = ctx.pool().router.worker(w).name().to_owned();
        let outcome = sent.and_then(|answer| legs::kv_transfer_params(&answer).map_err(LegFailure::Params));
        match outcome {
            Ok(params) => {
                report(ctx, w, ctx.pool().router.succeeded(w, admission.is_probe()));
                ctx.legs.push(Leg {
                    kind: LegKind::Prefill,
                    worker: Some(name),
                    outcome: LegOutcome::Served,
                    elapsed: Some(t.elapsed()),
                });
                return Some(params);
            }
            Err(failure) => {
                let f = failure.worker_failure();
                report(ctx, w, ctx.pool().router.failed(w, f, admission.is_probe()));
                tracing::warn!(worker = %name, reason = failure.label(), "prefill leg failed");
                ctx.legs.push(Leg {
                    kind: LegKind::Prefill,
                    worker: Some(name),
                    outcome: LegOutcome::Failed(failure.label()),
                    elapsed: Some(t.elapsed()),
                });
            }
        }
    }
    None
}

/// The encode leg, when the pool has an encoder stage and some image of the request is not already
/// inside the chosen worker's cached prefix: its failure is skipped (prefill encodes locally).
async fn encode_leg(st: &AppState, ctx: &mut Ctx) {
    let needed = match images_to_encode(ctx.plan(), &ctx.images, ctx.decision.as_ref().expect("selected")) {
        Ok(needed) => needed,
        Err(None) => return,
        Err(Some(reason)) => return ctx.legs.push(Leg::skipped(LegKind::Encode, reason)),
    };
    let req = EncodeRequest { images: &needed };
    let Some(decision) = ctx.pool().router.select_encoder(&req) else {
        ctx.legs.push(Leg::skipped(LegKind::Encode, "no_encode_worker"));
        return;
    };
    let tokens = req.tokens();
    let body = forward::body_for(ctx, Engine::Vllm).into_bytes();
    let body = match legs::encode_body(&body) {
        Ok(b) => b,
        Err(e) => return ctx.legs.push(Leg::skipped(LegKind::Encode, e.label())),
    };
    let w = decision.worker();
    let Some(admission) = ctx.pool().router.admit(w) else {
        return ctx.legs.push(Leg::skipped(LegKind::Encode, "no_encode_worker"));
    };
    let t = Instant::now();
    let guard = ctx.pool().router.begin(w, Load { prefill_tokens: 0, decode_tokens: 0, image_tokens: tokens });
    let sent = leg_send(st, ctx, w, body).await;
    drop(guard);
    let name = ctx.pool().router.worker(w).name().to_owned();
    let outcome = match sent {
        Ok(_) => {
            report(ctx, w, ctx.pool().router.succeeded(w, admission.is_probe()));
            // Only an exact plan names images (a fallback records no image state).
            ctx.pool().router.images_sent(w, &needed);
            LegOutcome::Served
        }
        Err(failure) => {
            report(ctx, w, ctx.pool().router.failed(w, failure.worker_failure(), admission.is_probe()));
            tracing::warn!(worker = %name, reason = failure.label(), "encode leg failed; prefill encodes locally");
            LegOutcome::Failed(failure.label())
        }
    };
    ctx.legs.push(Leg { kind: LegKind::Encode, worker: Some(name), outcome, elapsed: Some(t.elapsed()) });
}

/// The images the encode leg must encode: those of an exact plan that end past the chosen worker's
/// cached prefix (the engine skips the encoder for the rest), or none named on a fallback route or
/// when the engine renames the images (the leg is then chosen by load). `Err(Some(reason))`: the leg is skipped, counted; `Err(None)`: the request
/// has no media.
pub fn images_to_encode(
    plan: &RoutePlan,
    images: &[ImageUse],
    chosen: &Decision,
) -> Result<Vec<ImageUse>, Option<&'static str>> {
    match plan.route {
        Route::TextPrefix { .. } => return Ok(Vec::new()),
        // Images the engine renames (request kwargs rehash them): encoded, but by load, unnamed.
        Route::Exact if images.is_empty() && !plan.images.is_empty() => return Ok(Vec::new()),
        Route::Exact if !images.is_empty() => {}
        _ => return Err(None),
    }
    let overlap = u64::from(chosen.overlap_tokens(chosen.worker(), plan.block_size));
    let needed: Vec<ImageUse> = images.iter().filter(|i| i.end > overlap).copied().collect();
    if needed.is_empty() {
        return Err(Some("cached_prefix"));
    }
    Ok(needed)
}

/// SGLang P/D: both legs at once, naming the prefill's bootstrap server and one room; the client gets
/// the decode leg's answer, the prefill's is read and dropped in a task of its own.
async fn sglang(st: &Arc<AppState>, ctx: &mut Ctx) -> Result<Answer, ApiError> {
    let router = ctx.pool().router.clone();
    let p = ctx.decision.as_ref().expect("selected").worker();
    let prefill = router.worker(p);
    let host = url::Url::parse(prefill.url()).ok().and_then(|u| u.host_str().map(str::to_owned));
    let (Some(host), Some(port)) = (host, prefill.bootstrap_port()) else {
        ctx.legs.push(Leg::skipped(LegKind::Prefill, "no_bootstrap"));
        return whole(st, ctx, Role::Both, true).await;
    };
    let room = rand::random::<u64>() >> 1;
    let body = ctx.body.clone();
    let leg = legs::sglang_body(&body, &host, port, room).map_err(leg_refused)?;
    let req = forward::select_request(ctx.plan());
    let decode = router.select_model(&req, Role::Decode, ctx.adapter.as_deref()).ok_or_else(ApiError::no_worker)?;
    let guard = forward::dispatch(ctx, p, true);
    ctx.trace_send(&st.observe, Some("prefill"));
    let (method, path, headers) = (ctx.method.clone(), ctx.path.clone(), ctx.headers.clone());
    let (state, worker, body) = (st.clone(), prefill.clone(), Pieces::from(leg.clone()));
    let total = st.upstream.total_timeout();
    let started = Instant::now();
    let prefill_leg = async move {
        let out = Outgoing { method: &method, path_and_query: &path, headers: &headers };
        let answer = match state.upstream.send(worker.url(), &out, body).await {
            Ok(resp) if resp.status().is_success() => read_bounded(resp.into_body(), total).await,
            Ok(resp) => Err(LegFailure::Status(resp.status().as_u16())),
            Err(e) => Err(LegFailure::Upstream(e.label())),
        };
        drop(guard);
        answer.map(|_| ())
    };
    let prefill_task = tokio::spawn(prefill_leg);
    ctx.leg_body = Some(leg);
    ctx.decision = Some(decode);
    let answer = forward::forward(st, ctx).await;
    let name = prefill.name().to_owned();
    let outcome = match (&answer, prefill_task.is_finished()) {
        (Err(_), true) => match prefill_task.await {
            Ok(Err(f)) => LegOutcome::Failed(f.label()),
            _ => LegOutcome::Served,
        },
        _ => LegOutcome::Served,
    };
    ctx.legs.push(Leg { kind: LegKind::Prefill, worker: Some(name), outcome, elapsed: Some(started.elapsed()) });
    answer
}

/// Why a leg failed (its label is the fallback reason).
#[derive(Debug)]
enum LegFailure {
    Upstream(&'static str),
    Status(u16),
    Read(&'static str),
    Params(LegError),
}

impl LegFailure {
    fn label(&self) -> &'static str {
        match self {
            LegFailure::Upstream(label) | LegFailure::Read(label) => label,
            LegFailure::Status(s) if *s == 429 => "busy",
            LegFailure::Status(s) if *s >= 500 => "server_error",
            LegFailure::Status(_) => "refused",
            LegFailure::Params(e) => e.label(),
        }
    }

    /// What the worker's state machine is told: a refused connection forgets its blocks.
    fn worker_failure(&self) -> Failure {
        match self {
            LegFailure::Upstream("connect_error") => Failure::Connect,
            _ => Failure::Error,
        }
    }
}

/// Sends `body` to worker `w` as the request's method and path; the whole answer body of a 2xx
/// (bounded), noted in the context as an attempt.
async fn leg_send(st: &AppState, ctx: &mut Ctx, w: usize, body: Bytes) -> Result<Bytes, LegFailure> {
    let worker = ctx.pool().router.worker(w);
    ctx.trace_send(&st.observe, None);
    let out = Outgoing { method: &ctx.method, path_and_query: &ctx.path, headers: &ctx.headers };
    let sent_at = Instant::now();
    let sent = st.upstream.send(worker.url(), &out, Pieces::from(body)).await;
    let (status, result) = match sent {
        Ok(resp) if resp.status().is_success() => {
            let status = AttemptStatus::Http(resp.status());
            (status, read_bounded(resp.into_body(), st.upstream.total_timeout()).await)
        }
        Ok(resp) => (AttemptStatus::Http(resp.status()), Err(LegFailure::Status(resp.status().as_u16()))),
        Err(e) => (AttemptStatus::Failed(e.label()), Err(upstream_failure(&e))),
    };
    let head_after = matches!(status, AttemptStatus::Http(_)).then(|| sent_at.elapsed());
    ctx.attempts.push(Attempt { worker, status, head_after, retried: None });
    result
}

fn upstream_failure(e: &UpstreamError) -> LegFailure {
    LegFailure::Upstream(e.label())
}

/// An answer body read whole within `deadline`, at most [`MAX_PREFILL_ANSWER`] bytes.
async fn read_bounded(body: axum::body::Body, deadline: Duration) -> Result<Bytes, LegFailure> {
    let limited = http_body_util::Limited::new(body, MAX_PREFILL_ANSWER);
    match tokio::time::timeout(deadline, limited.collect()).await {
        Err(_) => Err(LegFailure::Read("timeout")),
        Ok(Err(_)) => Err(LegFailure::Read("answer_too_large_or_cut")),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
    }
}

/// A leg body the router could not build: the client's body is not a JSON object.
fn leg_refused(e: LegError) -> ApiError {
    ApiError::bad_request("invalid_body", e.to_string())
}
