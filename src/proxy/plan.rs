//! Phase **plan**: intake, accounting and planning by the pool's pipeline (the core crate). Small
//! prompts are planned on the async runtime; large ones on the blocking pool, at most one per core,
//! so they queue for CPU among themselves instead of starving `/health` and small requests.

use std::sync::Arc;

use bytes::Bytes;
use mmrouter_core::pipeline::Planned;
use mmrouter_core::request::{Endpoint, Request as ParsedRequest};

use super::context::Ctx;
use crate::error::ApiError;
use crate::pools::Pool;
use crate::state::AppState;

/// Text (bytes of the body outside image URLs) up to which a request is planned on the async
/// runtime: tokenizing costs ~0.1 µs per token (~1 µs on the HF fallback path), so 64 KiB of text
/// (~16 k tokens) is at most a few ms.
const INLINE_PLAN_BYTES: usize = 64 * 1024;

pub async fn plan(st: &AppState, ctx: &mut Ctx, request: ParsedRequest<'_>) -> Result<(), ApiError> {
    let pool = ctx.pool().clone();
    let text_bytes = ctx.body.len().saturating_sub(request.images.iter().map(|i| i.url.len()).sum());
    let planned = if text_bytes <= INLINE_PLAN_BYTES {
        pool.pipeline.plan(&request).await?
    } else {
        let endpoint = request.endpoint;
        drop(request);
        plan_blocking(st, pool, endpoint, ctx.body.clone()).await?
    };
    ctx.planned(planned);
    Ok(())
}

/// Plans on the blocking pool under a planning permit; image fetches still run on the runtime.
async fn plan_blocking(st: &AppState, pool: Arc<Pool>, endpoint: Endpoint, bytes: Bytes) -> Result<Planned, ApiError> {
    let _permit = st.planners.acquire().await.map_err(|_| ApiError::internal("planning pool closed"))?;
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let request = ParsedRequest::parse(endpoint, &bytes)?;
        Ok(runtime.block_on(pool.pipeline.plan(&request))?)
    })
    .await
    .map_err(|e| ApiError::internal(format!("planning failed: {e}")))?
}
