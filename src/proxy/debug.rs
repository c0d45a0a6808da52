//! `POST /debug/route`: the plan and the choice for a chat request, as JSON, without forwarding,
//! holding any load or observing anything; `?tokens=true` adds the rendered text, token ids and image
//! spans (what `mmrouter render` prints). A request for a LoRA adapter is ranked among the workers
//! serving it, and `adapter` shows which workers serve it and which have it active.

use std::sync::Arc;

use axum::extract::{Query, Request, State};
use axum::response::{IntoResponse, Response};
use mmrouter_core::pipeline::{Planned, RoutePlan};
use mmrouter_core::request::{Endpoint, Request as ParsedRequest};
use mmrouter_core::routing::{Decision, EncodeRequest, ImageUse, PoolShape, Role, Router, SelectRequest, Worker};

use super::context::Ctx;
use super::disagg::images_to_encode;
use super::forward::select_request;
use crate::error::ApiError;
use crate::pools::Pool;
use crate::state::AppState;

/// `?tokens=true` on `/debug/route` adds the rendered text, token ids and image spans.
#[derive(serde::Deserialize, Default)]
pub struct DebugParams {
    #[serde(default)]
    tokens: bool,
}

pub async fn debug_route(State(st): State<Arc<AppState>>, Query(params): Query<DebugParams>, req: Request) -> Response {
    match explain(&st, Ctx::new(req), params.tokens).await {
        Ok(json) => axum::Json(json).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn explain(st: &AppState, ctx: Ctx, tokens: bool) -> Result<serde_json::Value, ApiError> {
    let request = ParsedRequest::parse(Endpoint::Chat, &ctx.body)?;
    let model = request.str_field("model");
    let pool = st.pools.pool_for(model).ok_or_else(|| ApiError::model_not_found(model))?;
    let planned = pool.pipeline.plan_with(&request, tokens).await?;
    let plan = &planned.plan;
    let req = select_request(plan);
    let shape = pool.router.shape();
    let first = shape.map_or(Role::Both, |s| if s.pd { Role::Prefill } else { s.whole });
    let adapter = model.filter(|m| pool.pipeline.is_adapter(m));
    let decision = pool.router.select_model(&req, first, adapter);
    let mut out = decision_json(&pool.router, plan, decision.as_ref());
    out["adapter"] = adapter.map_or(serde_json::Value::Null, |a| adapter_json(&pool, a));
    if let (Some(shape), Some(d)) = (shape, decision.as_ref()) {
        out["legs"] = legs_json(&pool.router, (plan, &req), shape, d);
    }
    out["image_residency"] = residency_json(&pool.router, &req.images);
    out["pool"] = pool.name.clone().into();
    if tokens {
        let trace = trace_json(&planned);
        for key in ["text", "token_ids", "image_spans"] {
            out[key] = trace[key].clone();
        }
    }
    Ok(out)
}

fn decision_json(router: &Router, plan: &RoutePlan, d: Option<&Decision>) -> serde_json::Value {
    let reason = plan.reason();
    let name = |w: usize| router.worker(w).name().to_owned();
    serde_json::json!({
        "route": plan.route.label(),
        "reason": reason,
        "prompt_tokens": plan.prompt_tokens,
        "prompt_tokens_exact": plan.prompt_exact,
        "image_tokens": plan.images.iter().map(|i| i.tokens).collect::<Vec<_>>(),
        "images": plan.images,
        // Per video of an exact plan (in prompt order): what its count comes from.
        "videos": videos_json(plan),
        "block_size": plan.block_size,
        "blocks": plan.blocks.len(),
        // Text-prefix plans: the leading blocks before the first image; the rest is the affinity tail.
        "text_blocks": plan.text_blocks,
        "decode_tokens": plan.decode_tokens,
        "overlap_blocks": d.map(|d| &d.overlap_blocks),
        "overlap_sources": d.map(|d| &d.overlap_sources),
        "costs": d.map(|d| &d.costs),
        "image_credit": d.map(|d| &d.image_credit),
        // Text-prefix plans with images: what engines counted beyond `prompt_tokens` on earlier turns
        // (`per_worker`: of it, inside each worker's overlap).
        "unseen_tokens": d.map(|d| &d.unseen),
        "policy": d.map(|d| d.policy),
        "worker": d.map(|d| name(d.worker())),
        "candidates": d.map(|d| d.candidates.iter().map(|&w| name(w)).collect::<Vec<_>>()),
        "workers": router.live_workers().iter().map(|(_, w)| w.name()).collect::<Vec<_>>(),
        // Per worker slot (as `overlap_blocks`): this replica's in-flight load and other replicas'.
        "inflight": router.workers().iter().map(|w| serde_json::json!({
            "worker": w.name(), "local": w.inflight(), "remote": w.remote_inflight(),
        })).collect::<Vec<_>>(),
    })
}

/// Each video of an exact plan: its frames after sampling, its groups of two frames, the tokens of
/// each group and of its whole run (Qwen3-VL's timestamps included), and its encoder tokens.
fn videos_json(plan: &RoutePlan) -> serde_json::Value {
    let videos = plan.images.iter().filter_map(|i| {
        let v = i.video.as_ref()?;
        Some(serde_json::json!({
            "hash": i.hash, "format": v.format, "width": i.width, "height": i.height,
            "frames": v.frames, "groups": v.groups, "tokens_per_group": v.tokens_per_group,
            "resized": [v.resized.0, v.resized.1], "timestamps": v.timestamps,
            "feature_tokens": i.feature_tokens, "tokens": i.tokens,
        }))
    });
    serde_json::Value::Array(videos.collect())
}

/// A pool with roles: which worker each leg would use and why (the decode leg's own ranking, the
/// encode leg's by residency, or why it would be skipped).
fn legs_json(
    router: &Router,
    (plan, req): (&RoutePlan, &SelectRequest<'_>),
    shape: PoolShape,
    first: &Decision,
) -> serde_json::Value {
    let name = |w: usize| router.worker(w).name().to_owned();
    let ranking = |d: &Decision| {
        serde_json::json!({
            "policy": d.policy,
            "worker": name(d.worker()),
            "candidates": d.candidates.iter().map(|&w| name(w)).collect::<Vec<_>>(),
            "costs": &d.costs,
            "overlap_blocks": &d.overlap_blocks,
            "image_credit": &d.image_credit,
        })
    };
    let mut legs = serde_json::Map::new();
    if shape.encode {
        let encode = match images_to_encode(plan, &req.images, first) {
            Ok(needed) => {
                let er = EncodeRequest { images: &needed };
                match router.select_encoder(&er) {
                    Some(d) => ranking(&d),
                    None => serde_json::json!({"skipped": "no_encode_worker"}),
                }
            }
            Err(reason) => serde_json::json!({"skipped": reason.unwrap_or("no_media")}),
        };
        legs.insert("encode".into(), encode);
    }
    if shape.pd && router.worker(first.worker()).role() == Role::Prefill {
        legs.insert("prefill".into(), ranking(first));
        let decode = router.select_for(req, Role::Decode);
        legs.insert("decode".into(), decode.as_ref().map_or(serde_json::Value::Null, ranking));
    } else {
        legs.insert("whole".into(), ranking(first));
    }
    serde_json::Value::Object(legs)
}

/// The request's LoRA adapter: the workers in rotation that list it (`serving`), those of them with
/// it likely in a LoRA slot (`active`: no swap; the `kv` cost prefers them), and whether the router may
/// load it (`loadable`, `[model] load_lora_adapters`).
fn adapter_json(pool: &Pool, adapter: &str) -> serde_json::Value {
    let live = pool.router.live_workers();
    let serving: Vec<&Worker> = live
        .iter()
        .map(|(_, w)| w.as_ref())
        .filter(|w| w.in_rotation() && w.serves_adapter(adapter) == Some(true))
        .collect();
    let names = |ws: &[&Worker]| ws.iter().map(|w| w.name().to_owned()).collect::<Vec<_>>();
    let active: Vec<&Worker> = serving.iter().copied().filter(|w| w.adapter_active(adapter)).collect();
    serde_json::json!({
        "name": adapter,
        "serving": names(&serving),
        "active": names(&active),
        "loadable": pool.loader.loadable(adapter),
    })
}

/// Per worker slot, how likely its engine still holds each of the request's images (processor and
/// encoder cache, in [0, 1]): the model behind `image_credit`.
fn residency_json(router: &Router, images: &[ImageUse]) -> serde_json::Value {
    let workers = router.workers();
    let per_worker = workers.iter().map(|w| {
        serde_json::json!({
            "worker": w.name(), "images_resident": w.images_resident(), "held": w.images_held(images),
        })
    });
    serde_json::Value::Array(per_worker.collect())
}

/// The plan and its trace as JSON (what `/debug/route?tokens=true` adds, and `mmrouter render` prints).
pub fn trace_json(planned: &Planned) -> serde_json::Value {
    let plan = &planned.plan;
    let trace = planned.trace.as_ref();
    serde_json::json!({
        "route": plan.route.label(),
        "reason": plan.reason(),
        "prompt_tokens": plan.prompt_tokens,
        "prompt_tokens_exact": plan.prompt_exact,
        "text": trace.and_then(|t| t.text.as_deref()),
        "token_ids": trace.map(|t| &t.ids),
        // Each image and video of an exact plan, in prompt order (a video with its frames and groups).
        "images": plan.images,
        "image_spans": trace.map(|t| t.spans.iter().map(|s| serde_json::json!({
            "offset": s.offset, "length": s.len, "hash": format!("{:032x}", s.hash)
        })).collect::<Vec<_>>()),
    })
}
