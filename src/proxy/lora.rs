//! Runtime LoRA loading, between plan and select (opt-in, `[model] load_lora_adapters`): a request
//! naming a configured adapter that no worker in its pool lists has it loaded first on the worker
//! selection would pick for the base model (`pools::AdapterLoader`: one load per adapter at a time),
//! with the `Authorization` the proxy sends workers. A failed load is the client's 503
//! `adapter_load_failed`, naming the worker and its reason. An adapter neither listed nor configured
//! is left to selection (a 404, as before).

use axum::http::header::AUTHORIZATION;
use axum::http::StatusCode;
use mmrouter_core::routing::{Engine, Role, Worker};

use super::context::Ctx;
use super::forward::select_request;
use crate::error::ApiError;
use crate::pools::{LoadError, Requester};
use crate::state::AppState;

/// Loads the request's adapter on a worker when the pool may and no worker lists it.
pub async fn ensure_adapter(st: &AppState, ctx: &Ctx) -> Result<(), ApiError> {
    let Some(adapter) = ctx.adapter.as_deref() else { return Ok(()) };
    let pool = ctx.pool();
    let router = &pool.router;
    if router.serves_adapter(adapter) || !pool.loader.loadable(adapter) {
        return Ok(());
    }
    let role = router.shape().map_or(Role::Both, |s| s.whole);
    let req = select_request(ctx.plan());
    // Only vLLM engines load adapters this way: the best-ranked of them for the base model.
    let pick = || {
        let decision = router.select_model(&req, role, None)?;
        let mut ranked = decision.candidates.iter().map(|&i| router.worker(i));
        ranked.find(|w: &std::sync::Arc<Worker>| w.engine() == Engine::Vllm)
    };
    let authorization = ctx.headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok());
    let by = Requester { authorization, observe: &st.observe };
    pool.loader.ensure(router, adapter, pick, by).await.map_err(|e| load_failed(adapter, &e))
}

/// The client's answer to a failed load.
fn load_failed(adapter: &str, e: &LoadError) -> ApiError {
    if *e == LoadError::NoWorker {
        return ApiError::no_worker();
    }
    let message = format!("The LoRA adapter `{adapter}` could not be loaded: {e}.");
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "adapter_load_failed", message).with_param("model")
}
