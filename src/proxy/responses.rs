//! The Responses API (`/v1/responses`): planned and routed like a chat, except that a response the
//! worker stored lives only in that worker's memory (vLLM's `VLLM_ENABLE_RESPONSES_API_STORE`), so a
//! follow-up naming it (`previous_response_id`) and `GET`/`DELETE /v1/responses/{id}`,
//! `POST /v1/responses/{id}/cancel` are **pinned**: sent to that worker whatever the routing policy
//! says, never retried elsewhere (no other worker could answer).
//!
//! The worker of each id is learnt from the answers (`pools::ResponseStore`, fed at the end of the
//! relay); an id this router does not know (it restarted, or another replica served it and has not
//! said so) is asked of the pool's workers (`GET /v1/responses/{id}`, a few at a time within
//! `responses.probe_timeout_ms`), and the one answering 200 is remembered. A pin that cannot be
//! honoured is the client's clear error ([`PinError`]), never a silent re-route.

use std::borrow::Cow;
use std::sync::Arc;

use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use bytes::Bytes;
use futures_util::StreamExt;
use mmrouter_core::pipeline::RoutePlan;
use mmrouter_core::routing::Role;

use super::context::Ctx;
use super::forward;
use crate::error::ApiError;
use crate::pools::{valid_response_id, Pool};
use crate::state::AppState;
use crate::upstream::{Outgoing, Pieces};

/// Reads what pinning needs from a Responses body: its `previous_response_id`, and whether the worker
/// will store the answer (vLLM stores unless told `store: false`; an engine without the store
/// ignores it), noted in the context so the relay learns the answer's id.
pub fn read(ctx: &mut Ctx) -> Option<String> {
    let fields = serde_json::from_slice::<Fields>(&ctx.body).unwrap_or_default();
    ctx.learn_response_id = fields.store != Some(false);
    fields.previous_response_id.map(Cow::into_owned)
}

/// For `GET`/`DELETE /v1/responses/{id}` and cancel: the pool that stored `id` (when known; else
/// each pool in turn is asked, and with one pool it is that pool), planned as a passthrough, and the
/// worker holding it selected.
pub async fn by_id(st: &AppState, ctx: &mut Ctx, id: &str) -> Result<(), ApiError> {
    let known = valid_response_id(id).then(|| st.responses.lookup(id)).flatten();
    let pools = st.pools();
    let pool = match known.and_then(|p| pools.iter().find(|pool| *pool.name == *p.pool).cloned()) {
        Some(pool) => pool,
        None if pools.len() == 1 => pools[0].clone(),
        None => find_pool(st, &pools, id, ctx.headers.get(AUTHORIZATION).cloned()).await,
    };
    ctx.plan = Some(RoutePlan::passthrough(pool.pipeline.block_size()));
    ctx.pool = Some(pool);
    pin(st, ctx, id, Param::Path).await
}

/// The first pool one of whose workers has `id` (found by the probe, and remembered), else the first.
async fn find_pool(st: &AppState, pools: &[Arc<Pool>], id: &str, auth: Option<HeaderValue>) -> Arc<Pool> {
    if valid_response_id(id) {
        for pool in pools {
            if probe(st, pool, id, auth.clone()).await.is_some() {
                return pool.clone();
            }
        }
    }
    pools[0].clone()
}

/// The members of a Responses body read to pin it (the parse reads the rest).
#[derive(Default, serde::Deserialize)]
struct Fields<'a> {
    #[serde(borrow)]
    previous_response_id: Option<Cow<'a, str>>,
    store: Option<bool>,
}

/// Where the response id came from, for the error's `param`.
#[derive(Clone, Copy)]
pub enum Param {
    Previous,
    Path,
}

/// Why a request could not be pinned to the worker holding its response; the label is the metric's
/// `outcome` and the error's `code`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PinError {
    /// No worker of the pool has it (or the id is not one a worker could have given).
    NotFound,
    /// The worker that stored it has been removed from the pool.
    WorkerGone { worker: String },
    /// The worker that stored it is down, ejected or draining now.
    WorkerUnavailable { worker: String, state: &'static str },
}

impl PinError {
    pub fn label(&self) -> &'static str {
        match self {
            PinError::NotFound => "response_not_found",
            PinError::WorkerGone { .. } => "response_worker_gone",
            PinError::WorkerUnavailable { .. } => "response_worker_unavailable",
        }
    }

    fn to_api(&self, id: &str, param: Param) -> ApiError {
        let param = match param {
            Param::Previous => "previous_response_id",
            Param::Path => "response_id",
        };
        let (status, kind, message) = match self {
            PinError::NotFound => {
                (StatusCode::NOT_FOUND, "invalid_request_error", format!("Response with id '{id}' not found."))
            }
            PinError::WorkerGone { worker } => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!(
                    "Response with id '{id}' not found: worker '{worker}', which stored it, has been removed from the pool."
                ),
            ),
            PinError::WorkerUnavailable { worker, state } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                format!(
                    "Response with id '{id}' is stored on worker '{worker}', which is {state} now; no other worker holds it. Retry later."
                ),
            ),
        };
        ApiError::new(status, kind, self.label(), message).with_param(param)
    }
}

/// Pins the request to the worker of the context's pool that stored `id` (known, or found by the
/// probe); the outcome is noted for the observation phase either way.
pub async fn pin(st: &AppState, ctx: &mut Ctx, id: &str, param: Param) -> Result<(), ApiError> {
    let auth = ctx.headers.get(AUTHORIZATION).cloned();
    let found = match find(st, ctx.pool(), id, auth).await {
        Ok((w, recovered)) => select_pinned(ctx, w).map(|()| recovered),
        Err(e) => Err(e),
    };
    ctx.pinned = Some(match &found {
        Ok(true) => "recovered",
        Ok(false) => "known",
        Err(e) => e.label(),
    });
    found.map(drop).map_err(|e| e.to_api(id, param))
}

/// `pool`'s worker holding `id`, and whether the probe had to find it.
async fn find(st: &AppState, pool: &Arc<Pool>, id: &str, auth: Option<HeaderValue>) -> Result<(usize, bool), PinError> {
    if !valid_response_id(id) {
        return Err(PinError::NotFound);
    }
    if let Some(place) = st.responses.lookup(id).filter(|p| *p.pool == *pool.name) {
        return match pool.router.lookup(&place.worker) {
            Some((w, _)) => Ok((w, false)),
            None => Err(PinError::WorkerGone { worker: place.worker.to_string() }),
        };
    }
    probe(st, pool, id, auth).await.map(|w| (w, true)).ok_or(PinError::NotFound)
}

/// Asks `pool`'s workers that could hold a response whether they have `id` (`GET /v1/responses/{id}`,
/// with the client's `Authorization` as the front door left it), `responses.probe_concurrency` at a
/// time, all within `responses.probe_timeout_ms`, and at most `MAX_PROBING_REQUESTS` requests asking
/// at once in the process; the first to answer 200 is remembered and returned.
async fn probe(st: &AppState, pool: &Arc<Pool>, id: &str, auth: Option<HeaderValue>) -> Option<usize> {
    let cfg = &st.responses.config;
    let path = format!("/v1/responses/{id}");
    let mut headers = HeaderMap::new();
    if let Some(auth) = auth {
        headers.insert(AUTHORIZATION, auth);
    }
    let live = pool.router.live_workers();
    // Prefill and encode workers hold no responses: they never serve a whole one.
    let workers = live.into_iter().filter(|(_, w)| w.in_rotation() && matches!(w.role(), Role::Both | Role::Decode));
    let (path, headers) = (path.as_str(), &headers);
    let asks = futures_util::stream::iter(workers).map(|(i, w)| async move {
        let out = Outgoing { method: &Method::GET, path_and_query: path, headers };
        let answer = st.upstream.send(w.url(), &out, Pieces::from(Bytes::new())).await;
        answer.is_ok_and(|r| r.status() == StatusCode::OK).then_some((i, w))
    });
    let mut asks = asks.buffer_unordered(cfg.probe_concurrency);
    let first = async {
        // Held while asking; waiting for it counts against the probe's time.
        let _permit = st.responses.probes.acquire().await.ok()?;
        while let Some(answer) = asks.next().await {
            if answer.is_some() {
                return answer;
            }
        }
        None
    };
    let (w, worker) = tokio::time::timeout(cfg.probe_timeout(), first).await.ok().flatten()?;
    st.responses.learn(id, &pool.name, worker.name());
    tracing::info!(response_id = id, worker = %worker.name(), "response found by asking the pool's workers");
    Some(w)
}

/// Ranks only worker `w` (the request is planned as usual, for its load and accounting): a worker
/// not selectable now is the client's 503, not another worker.
fn select_pinned(ctx: &mut Ctx, w: usize) -> Result<(), PinError> {
    let worker = ctx.pool().router.worker(w);
    let selected = forward::select(ctx, worker.role()).is_ok();
    match ctx.decision.as_mut() {
        Some(d) if selected && d.candidates.contains(&w) => {
            d.candidates.retain(|&c| c == w);
            Ok(())
        }
        _ => {
            let state = if worker.is_draining() { "draining" } else { worker.availability().label() };
            Err(PinError::WorkerUnavailable { worker: worker.name().to_owned(), state })
        }
    }
}
