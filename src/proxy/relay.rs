//! Phase **relay**, then **observe**: the worker's answer streams back unchanged (the upstream room's
//! [`Relay`] holds the load guard and reads `usage` on the way); when the body ends — complete, cut by
//! the worker or a timeout, or abandoned by the client — the request is observed once, from its
//! context. A body cut by the worker or the idle timeout counts as `status="stream_error"` and feeds
//! the worker's failure record, whatever status went out first.

use std::sync::Arc;

use axum::body::{Body, HttpBody};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use mmrouter_core::routing::Failure;

use super::context::Ctx;
use super::forward::{report, Answer};
use crate::observe::{Ending, LegKind, LegOutcome};
use crate::state::AppState;
use crate::upstream::{end_to_end, EndReport, Outcome, Relay, RelayBody, RelayLimits};

pub fn relay(st: &Arc<AppState>, ctx: Ctx, answer: Answer) -> Response {
    let Answer { resp, guard, worker: w } = answer;
    let status = resp.status();
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
        h.insert("x-mmrouter-route", HeaderValue::from_static(ctx.plan().route.label()));
        if let Ok(v) = HeaderValue::from_str(guard.worker().name()) {
            h.insert("x-mmrouter-worker", v);
        }
        // Sent to the worker holding its stored response (`known`, `recovered`), whatever the policy.
        if let Some(how) = ctx.pinned {
            h.insert("x-mmrouter-pinned", HeaderValue::from_static(how));
        }
        // Disaggregated legs that served: where the prompt was prefilled and the images encoded.
        for leg in ctx.legs.iter().filter(|l| l.outcome == LegOutcome::Served) {
            let header = match leg.kind {
                LegKind::Prefill => "x-mmrouter-prefill-worker",
                LegKind::Encode => "x-mmrouter-encode-worker",
                LegKind::Decode => continue,
            };
            if let Some(v) = leg.worker.as_deref().and_then(|n| HeaderValue::from_str(n).ok()) {
                h.insert(header, v);
            }
        }
    }
    let limits = RelayLimits {
        deadline: tokio::time::Instant::now() + st.upstream.total_timeout(),
        idle: st.upstream.idle_timeout(),
    };
    let length = resp.body().size_hint().exact();
    let state = st.clone();
    // Only a success is a stored response (an error body's id names nothing).
    let watch_id = ctx.learn_response_id && status.is_success();
    // The context lives until the body ends: its decision holds the worker, so id `w` cannot be given
    // to another worker meanwhile.
    let on_end = Box::new(move |end: EndReport| ended(&state, ctx, (w, status), end));
    let spec = RelayBody { limits, sse, content_length: length, watch_id };
    let body = Relay::new(resp.into_body().into_data_stream(), spec, guard, on_end);
    builder.body(Body::from_stream(body)).unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// The response is over: a cut body counts against the worker (not a total timeout: that is our
/// limit), then the request is observed.
pub(crate) fn ended(st: &AppState, mut ctx: Ctx, (w, status): (usize, StatusCode), end: EndReport) {
    let predicted = ctx.plan().predicted_prompt_tokens();
    ctx.trace.usage = [end.usage_prompt_tokens, end.usage_cached_tokens];
    let drift = match (end.outcome, end.usage_prompt_tokens, predicted) {
        (Outcome::Complete, Some(actual), Some(pred)) => Some(actual as f64 - f64::from(pred)),
        _ => None,
    };
    if let (Outcome::Complete, Some(actual), Some(key)) =
        (end.outcome, end.usage_prompt_tokens, ctx.plan().unseen_key())
    {
        // A fallback's images as its engine counted them: the next turn weighs this prefix by it.
        let unseen = actual.saturating_sub(u64::from(ctx.plan().prompt_tokens));
        ctx.pool().router.learn_unseen(key, u32::try_from(unseen).unwrap_or(u32::MAX));
    }
    if let Some(id) = end.response_id.as_deref() {
        let pool = ctx.pool().clone();
        ctx.learnt = st.responses.learn(id, &pool.name, ctx.pool().router.worker(w).name());
    }
    let ending = match end.outcome.cut_reason() {
        Some(reason) => {
            if end.outcome != Outcome::Timeout {
                // Never the probe: the probe's outcome was its response head.
                let t = ctx.pool().router.failed(w, Failure::Error, false);
                report(&mut ctx, w, t);
            }
            Ending::Cut { reason }
        }
        None => Ending::Answered { status: status.as_u16() },
    };
    ctx.observe(&st.observe, ending, drift);
}
