//! Phases **select** and **forward**: rank the pool's workers for the plan, then try the candidates in
//! order — hold the load, record the blocks, send the original bytes. A connect error, a timeout to
//! the response head, a transport error, a 5xx or a 429 moves on to the next candidate, within
//! `retries.max_attempts` and the retry budget; nothing has reached the client yet, so the held bytes
//! can be sent again. When no retry is left, the client gets the last worker's own answer (its 5xx or
//! 429 with `retry-after`) or our error. Every attempt is noted in the context.

use std::time::Instant;

use bytes::Bytes;
use mmrouter_core::pipeline::{spliced_pieces, Piece, PlannedImage, Route, RoutePlan};
use mmrouter_core::routing::{Engine, Failure, ImageUse, Load, LoadGuard, Role, SelectRequest, Transition};

use super::context::Ctx;
use crate::error::ApiError;
use crate::observe::{Attempt, AttemptStatus};
use crate::state::AppState;
use crate::upstream::{Outgoing, Pieces, RetryReason, UpstreamError, UpstreamResponse};

/// The worker's answer to relay: its response head, the load it holds, which worker.
pub struct Answer {
    pub resp: UpstreamResponse,
    pub guard: LoadGuard,
    pub worker: usize,
}

/// The last failed attempt, kept until it is retried (dropped) or returned to the client.
struct Failed {
    reason: RetryReason,
    answer: Result<Answer, ApiError>,
}

/// Ranks the pool's workers of `role` (those serving whole requests) for the plan.
pub fn select(ctx: &mut Ctx, role: Role) -> Result<(), ApiError> {
    let t = Instant::now();
    let req = select_request(ctx.plan());
    let decision = ctx.pool().router.select_model(&req, role, ctx.adapter.as_deref());
    let decision = decision.ok_or_else(|| no_worker_for(ctx))?;
    // Kept for dispatch, which records them on the worker it sends the request to.
    let SelectRequest { images, .. } = req;
    ctx.images = images;
    ctx.decision = Some(decision);
    ctx.select = Some(t.elapsed());
    Ok(())
}

/// Nothing selectable: a LoRA adapter no worker serves is the client's 404 (OpenAI's answer for an
/// unknown model); otherwise every worker is down or busy.
pub fn no_worker_for(ctx: &Ctx) -> ApiError {
    match ctx.adapter.as_deref() {
        Some(a) if !ctx.pool().router.serves_adapter(a) => ApiError::adapter_not_served(a),
        _ => ApiError::no_worker(),
    }
}

/// What selection needs to know about a plan.
pub fn select_request(plan: &RoutePlan) -> SelectRequest<'_> {
    SelectRequest {
        blocks: &plan.blocks,
        block_size: plan.block_size,
        prompt_tokens: plan.prompt_tokens,
        decode_tokens: plan.decode_tokens,
        images: image_uses(plan),
        unseen: plan.placeholder_blocks.is_some(),
    }
}

/// The images an engine caches under the router's names: an exact plan's, unless the request's
/// kwargs make vLLM hash them into other names. Empty for every other plan (a fallback names none).
fn image_uses(plan: &RoutePlan) -> Vec<ImageUse> {
    if plan.route != Route::Exact || plan.images_rehashed || plan.images.len() != plan.spans.len() {
        return Vec::new();
    }
    let uses = plan.images.iter().zip(&plan.spans);
    uses.map(|(i, s)| ImageUse { key: s.hash, tokens: i.feature_tokens, end: s.end() }).collect()
}

/// Tries the ranked candidates in order (see the module docs).
pub async fn forward(st: &AppState, ctx: &mut Ctx) -> Result<Answer, ApiError> {
    st.retry_budget.deposit();
    let pool = ctx.pool().clone();
    let candidates = ctx.decision.as_ref().map_or(0, |d| d.candidates.len());
    let mut last: Option<Failed> = None;
    let mut attempts = 0;
    for i in 0..candidates {
        let w = ctx.decision.as_ref().expect("selected").candidates[i];
        if attempts == st.retries.max_attempts {
            break;
        }
        // Ejected, down, or its half-open probe already out since the ranking: not an attempt.
        let Some(admission) = pool.router.admit(w) else { continue };
        if let Some(prev) = last.take() {
            if !spend_retry(st, ctx, &prev) {
                last = Some(prev);
                break;
            }
            // `prev` drops here, unread: its connection closes and its load is released.
        }
        attempts += 1;
        match attempt(st, ctx, w, attempts == 1, admission.is_probe()).await {
            Ok(answer) => return Ok(answer),
            Err(failed) => last = Some(failed),
        }
    }
    last.map_or_else(|| Err(ApiError::no_worker()), |f| f.answer)
}

/// Takes a retry from the budget for the failure `prev`; false when it is used up.
fn spend_retry(st: &AppState, ctx: &mut Ctx, prev: &Failed) -> bool {
    if !st.retry_budget.try_withdraw() {
        ctx.retry_budget_exhausted = true;
        return false;
    }
    if let Some(a) = ctx.attempts.last_mut() {
        a.retried = Some(prev.reason.label());
    }
    true
}

/// One upstream attempt on worker `w`: the answer to relay, or the failure (fed to the worker's state
/// either way, and noted in the context).
async fn attempt(st: &AppState, ctx: &mut Ctx, w: usize, first: bool, probe: bool) -> Result<Answer, Failed> {
    let router = ctx.pool().router.clone();
    let worker = router.worker(w);
    let body = match &ctx.leg_body {
        Some(leg) => Pieces::from(leg.clone()),
        None => body_for(ctx, worker.engine()),
    };
    let guard = dispatch(ctx, w, first);
    ctx.trace_send(&st.observe, None);
    let out = Outgoing { method: &ctx.method, path_and_query: &ctx.path, headers: &ctx.headers };
    let sent_at = Instant::now();
    let sent = st.upstream.send(worker.url(), &out, body).await;
    let head_after = Some(sent_at.elapsed());
    match sent {
        Ok(resp) => {
            let status = AttemptStatus::Http(resp.status());
            ctx.attempts.push(Attempt { worker: worker.clone(), status, head_after, retried: None });
            let Some(reason) = RetryReason::of_status(resp.status()) else {
                report(ctx, w, router.succeeded(w, probe));
                return Ok(Answer { resp, guard, worker: w });
            };
            // A 429 says "busy", not "broken": it neither ejects nor recovers the worker.
            if reason == RetryReason::ServerError {
                report(ctx, w, router.failed(w, Failure::Error, probe));
            }
            Err(Failed { reason, answer: Ok(Answer { resp, guard, worker: w }) })
        }
        Err(e) => {
            let status = AttemptStatus::Failed(e.label());
            ctx.attempts.push(Attempt { worker: worker.clone(), status, head_after: None, retried: None });
            drop(guard);
            let failure = if matches!(e, UpstreamError::Connect(_)) { Failure::Connect } else { Failure::Error };
            report(ctx, w, router.failed(w, failure, probe));
            tracing::warn!(worker = %worker.name(), "upstream attempt failed: {e}");
            Err(Failed { reason: e.retry_reason(), answer: Err(e.to_api(worker.name())) })
        }
    }
}

/// Logs a worker's state change; an ejection is noted for the observation phase.
pub fn report(ctx: &mut Ctx, w: usize, t: Option<Transition>) {
    let worker = ctx.pool().router.worker(w);
    match t {
        Some(Transition::Ejected { length, clear_index }) => {
            let ms = length.as_millis() as u64;
            tracing::warn!(worker = %worker.name(), ejected_ms = ms, clear_index, "worker ejected");
            ctx.ejected.push(worker);
        }
        Some(Transition::Recovered) => {
            tracing::info!(worker = %worker.name(), "worker recovered (half-open probe succeeded)")
        }
        None => {}
    }
}

/// The bytes a worker receives: the received ones, except that on the exact route to vLLM each image
/// part carries the image's content digest as its `uuid` (vLLM then names the image as the router
/// does, in its caches and its KV events). Built once per request, only when needed, as slices of the
/// received body around the uuids (nothing copied).
pub fn body_for(ctx: &mut Ctx, engine: Engine) -> Pieces {
    let plan = ctx.plan();
    let splice = engine == Engine::Vllm && plan.route == Route::Exact && plan.images.iter().any(|i| i.splice.is_some());
    if !splice {
        return Pieces::from(ctx.body.clone());
    }
    if ctx.spliced.is_none() {
        ctx.spliced = Some(spliced(&ctx.body, &ctx.plan().images));
    }
    ctx.spliced.clone().expect("just built")
}

/// `body` with the plan's uuids written in, as slices of it around them (see `spliced_pieces`).
fn spliced(body: &Bytes, images: &[PlannedImage]) -> Pieces {
    Pieces::new(spliced_pieces(body, images).into_iter().map(|piece| match piece {
        Piece::Received(slice) => body.slice_ref(slice),
        Piece::Uuid(text) => Bytes::from(text),
    }))
}

/// Holds the request's load on worker `w` and records its blocks there (at dispatch, so a
/// concurrent request with the same prefix already sees them; a text-prefix plan has no image keys,
/// and its affinity tail is recorded as approximate: no engine announces those keys).
pub fn dispatch(ctx: &mut Ctx, w: usize, first: bool) -> LoadGuard {
    let (plan, router) = (ctx.plan(), &ctx.pool().router);
    let decision = ctx.decision.as_ref().expect("selected");
    let overlap = decision.overlap_tokens(w, plan.block_size).min(plan.prompt_tokens);
    let load = Load {
        prefill_tokens: decision.prefill_tokens(w, plan.prompt_tokens, plan.block_size),
        decode_tokens: plan.decode_tokens,
        image_tokens: plan.exact_image_tokens(),
    };
    let guard = router.begin(w, load);
    if let Some(adapter) = &ctx.adapter {
        router.worker(w).adapter_sent(adapter);
    }
    record_after_send(ctx, w);
    if first {
        ctx.dispatched_overlap = Some(overlap);
    }
    guard
}

/// Records the prompt's blocks and images on worker `w` in a task of its own, spawned before the send:
/// it runs once this task waits for the worker's answer — usually after the connection task has written
/// the request (tokio runs the task woken last first) or beside it on the other worker thread — so a
/// long prompt's index writes (~50–80 µs for 8 000 tokens) overlap the worker's prefill instead of
/// delaying its start. A request selected in between does not see these blocks yet: a window of
/// about one send's first poll (a conversation's next turn, sent after this answer, finds them).
fn record_after_send(ctx: &Ctx, w: usize) {
    let plan = ctx.plan();
    let router = ctx.pool().router.clone();
    let uuid_named = plan.route == Route::Exact && !plan.images_rehashed;
    let (blocks, image_from, images) = (plan.blocks.clone(), plan.first_image_block(), ctx.images.clone());
    tokio::spawn(async move {
        router.record_prompt(w, &blocks, image_from, uuid_named);
        router.images_sent(w, &images);
    });
}
