//! The proxy room: a request's phases, in order, over one per-request context ([`Ctx`]):
//!
//! ```text
//! parse ─► pick pool ─► plan ─► select ─► forward ─► relay ─► observe
//!          by `model`    core:   core:     upstream   upstream  once, when the
//!                        intake  routing   attempts,  stream    response has ended
//!                        account           retries
//!                        plan
//! ```
//!
//! The received bytes are what is forwarded — the parse only reads them — with one exception: on the
//! exact route to a vLLM worker each image part gets its content digest spliced in as `uuid` (every
//! other byte as received). A request refused in a phase is answered and observed there.
//!
//! Architecture invariant: the proxy records no metric along the way; the observation phase hands
//! the context's record to the observer when the response ends ([`Ctx::observe`]).

mod context;
mod debug;
mod disagg;
mod forward;
mod lora;
mod plan;
mod relay;
mod responses;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use mmrouter_core::pipeline::RoutePlan;
use mmrouter_core::request::{Endpoint, Request as ParsedRequest};
use mmrouter_core::routing::Role;

pub use context::Ctx;
pub use debug::{debug_route, trace_json};
// For the endpoint picker, which sends nothing itself: the splice, the load held at dispatch, the end.
pub(crate) use forward::{body_for, dispatch, report};
pub(crate) use relay::ended;

use crate::error::ApiError;
use crate::observe::Ending;
use crate::state::AppState;

/// `POST /v1/chat/completions` and `/v1/completions` (`/v1/responses`: [`responses`]).
pub async fn inference(st: Arc<AppState>, endpoint: Endpoint, req: Request) -> Response {
    let mut ctx = Ctx::new(req);
    match phases(&st, &mut ctx, endpoint).await {
        Ok(answer) => relay::relay(&st, ctx, answer),
        Err(e) => finish_error(&st, ctx, e),
    }
}

/// parse → pick pool → plan → select → forward: the worker's answer to relay, or the error to send.
async fn phases(st: &Arc<AppState>, ctx: &mut Ctx, endpoint: Endpoint) -> Result<forward::Answer, ApiError> {
    understand(st, ctx, endpoint).await?;
    route(st, ctx).await
}

/// parse → pick pool → plan.
async fn understand(st: &Arc<AppState>, ctx: &mut Ctx, endpoint: Endpoint) -> Result<(), ApiError> {
    let body = ctx.body.clone();
    let request = ParsedRequest::parse(endpoint, &body)?;
    pick_pool(st, ctx, request.str_field("model"))?;
    plan::plan(st, ctx, request).await?;
    lora::ensure_adapter(st, ctx).await
}

/// parse → pick pool → plan → select, for a front door that forwards elsewhere (the endpoint picker):
/// the ranking is left in `ctx.decision`. A pool with roles ranks its workers that serve whole requests.
pub(crate) async fn decide(st: &Arc<AppState>, ctx: &mut Ctx, endpoint: Endpoint) -> Result<(), ApiError> {
    understand(st, ctx, endpoint).await?;
    let role = ctx.pool().router.shape().map_or(Role::Both, |s| s.whole);
    forward::select(ctx, role)
}

/// select → forward, through the pool's legs when it has roles.
async fn route(st: &Arc<AppState>, ctx: &mut Ctx) -> Result<forward::Answer, ApiError> {
    if let Some(shape) = ctx.pool().router.shape() {
        return disagg::serve(st, ctx, shape).await;
    }
    forward::select(ctx, Role::Both)?;
    forward::forward(st, ctx).await
}

/// `POST /v1/responses`: planned like a chat; a follow-up (`previous_response_id`) pinned to the
/// worker that stored the response it continues (see [`responses`]).
pub async fn responses(st: Arc<AppState>, req: Request) -> Response {
    let mut ctx = Ctx::new(req);
    match responses_phases(&st, &mut ctx).await {
        Ok(answer) => relay::relay(&st, ctx, answer),
        Err(e) => finish_error(&st, ctx, e),
    }
}

/// parse → pick pool → plan (as a chat), then the pinned worker or the policy's ranking.
async fn responses_phases(st: &Arc<AppState>, ctx: &mut Ctx) -> Result<forward::Answer, ApiError> {
    let previous = responses::read(ctx);
    understand(st, ctx, Endpoint::Responses).await?;
    match previous {
        Some(id) => responses::pin(st, ctx, &id, responses::Param::Previous).await?,
        // A pool with roles serves Responses on its whole-request workers: vLLM's Responses API
        // takes no disaggregated legs (no `kv_transfer_params` in its request).
        None => forward::select(ctx, ctx.pool().router.shape().map_or(Role::Both, |s| s.whole))?,
    }
    forward::forward(st, ctx).await
}

/// `GET`/`DELETE /v1/responses/{id}` and `POST /v1/responses/{id}/cancel`: to the worker that stored
/// `id`, the body as received (unplanned).
pub async fn response_by_id(st: Arc<AppState>, id: String, req: Request) -> Response {
    let mut ctx = Ctx::new(req);
    let answer = match responses::by_id(&st, &mut ctx, &id).await {
        Ok(()) => forward::forward(&st, &mut ctx).await,
        Err(e) => Err(e),
    };
    match answer {
        Ok(answer) => relay::relay(&st, ctx, answer),
        Err(e) => finish_error(&st, ctx, e),
    }
}

/// Other `/v1/*` calls (models, embeddings, …) go to a healthy worker as they are: no plan, the
/// pool of the body's `model` when it names one, else the first.
pub async fn passthrough(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let mut ctx = Ctx::new(req);
    let model = serde_json::from_slice::<ModelField>(&ctx.body).ok().and_then(|m| m.model);
    let pool = st.pools.pool_for(model.as_deref()).unwrap_or_else(|| st.pools()[0].clone());
    // An adapter's call (`/tokenize` with `"model": ADAPTER`) only to workers that serve the adapter.
    ctx.adapter = model.filter(|m| pool.pipeline.is_adapter(m));
    ctx.plan = Some(RoutePlan::passthrough(pool.pipeline.block_size()));
    ctx.pool = Some(pool);
    // A pool with roles serves passthrough calls on the workers that serve whole requests.
    let role = ctx.pool().router.shape().map_or(Role::Both, |s| s.whole);
    let answer = match forward::select(&mut ctx, role) {
        Ok(()) => forward::forward(&st, &mut ctx).await,
        Err(e) => Err(e),
    };
    match answer {
        Ok(answer) => relay::relay(&st, ctx, answer),
        Err(e) => finish_error(&st, ctx, e),
    }
}

/// Observes a request the router answered itself with `err` (see [`finish_error`]).
pub(crate) fn observe_error(st: &AppState, ctx: &Ctx, err: &ApiError) {
    let status = err.status.as_u16();
    let ending =
        if ctx.plan.is_some() { Ending::Answered { status } } else { Ending::Rejected { status, code: err.code } };
    ctx.observe(&st.observe, ending, None);
}

/// The `model` of a body, when it is a JSON object naming one.
#[derive(serde::Deserialize)]
struct ModelField {
    model: Option<String>,
}

/// The pool serving the request's `model`, and the LoRA adapter it names there.
fn pick_pool(st: &AppState, ctx: &mut Ctx, model: Option<&str>) -> Result<(), ApiError> {
    let pool = st.pools.pool_for(model).ok_or_else(|| ApiError::model_not_found(model))?;
    ctx.adapter = model.filter(|m| pool.pipeline.is_adapter(m)).map(str::to_owned);
    ctx.pool = Some(pool);
    Ok(())
}

/// An error answered by the router itself: counted under the plan's route once planned, else as a
/// rejection (bad body, unknown model, prompt refused…).
fn finish_error(st: &AppState, ctx: Ctx, err: ApiError) -> Response {
    observe_error(st, &ctx, &err);
    let route = ctx.plan.as_ref().map(|p| p.route.label());
    let mut resp = err.into_response();
    if let Some(route) = route {
        resp.headers_mut().insert("x-mmrouter-route", HeaderValue::from_static(route));
    }
    resp
}
