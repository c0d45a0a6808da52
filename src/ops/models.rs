//! `GET /v1/models`: every pool's served names, in OpenAI's list shape, each with two members of
//! mmrouter's own: `pool` (the pool serving it) and `workers` (its workers in rotation by role, e.g.
//! `{"prefill": 1, "decode": 2}`); then the LoRA adapters the pools' workers list (each with its base
//! model as `parent`, as vLLM lists them, and `workers`: how many serve it). A config without
//! `[[pools]]` declares none: then the workers answer (they know their `--served-model-name`), which
//! `server.rs` routes.
//!
//! `GET /v1/models/{id}` (the SDKs' `models.retrieve`): that entry, from the declared names, or from
//! what the workers listed at their last health round; OpenAI's 404 otherwise.

use std::collections::HashMap;

use axum::response::{IntoResponse, Response};
use mmrouter_core::routing::{Role, Router};
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::pools::Pool;
use crate::state::AppState;

/// The list, or `None` when no pool declares its served names.
pub fn models(st: &AppState) -> Option<Response> {
    let pools = st.pools();
    let served = || pools.iter().flat_map(|p| p.models.iter().map(move |m| (m, &p.name)));
    served().next()?;
    let workers: HashMap<&str, Value> = pools.iter().map(|p| (p.name.as_str(), workers_by_role(&p.router))).collect();
    let mut data: Vec<Value> = served()
        .map(|(id, pool)| {
            let workers = &workers[pool.as_str()];
            json!({"id": id, "object": "model", "created": 0, "owned_by": "mmrouter", "pool": pool, "workers": workers})
        })
        .collect();
    data.extend(pools.iter().flat_map(|p| adapters(p)));
    Some(axum::Json(json!({"object": "list", "data": data})).into_response())
}

/// The pool's LoRA adapters its workers list (not its declared names), with their parent model.
fn adapters(pool: &Pool) -> Vec<Value> {
    let live = pool.router.live_workers();
    let names = pool.router.adapters().into_iter().filter(|a| !pool.models.contains(a));
    names
        .map(|a| {
            let serving: Vec<_> =
                live.iter().filter(|(_, w)| w.in_rotation() && w.serves_adapter(&a) == Some(true)).collect();
            // The base model its workers list (vLLM's `parent`), else the pool's first declared name.
            let listed = serving.iter().filter_map(|(_, w)| w.served_models()).find_map(|s| s.base.first().cloned());
            let parent = listed.or_else(|| pool.models.first().cloned());
            json!({"id": a, "object": "model", "created": 0, "owned_by": "mmrouter", "parent": parent,
                   "pool": pool.name, "workers": {"serving": serving.len()}})
        })
        .collect()
}

/// `GET /v1/models/{id}`: the model's entry, or OpenAI's 404.
pub fn model(st: &AppState, id: &str) -> Response {
    let pools = st.pools();
    for pool in pools.iter() {
        if pool.models.iter().any(|m| m == id) {
            let workers = workers_by_role(&pool.router);
            let entry = json!({"id": id, "object": "model", "created": 0, "owned_by": "mmrouter",
                               "pool": pool.name, "workers": workers});
            return axum::Json(entry).into_response();
        }
        if let Some(entry) = adapters(pool).into_iter().find(|e| e["id"] == id) {
            return axum::Json(entry).into_response();
        }
        // A pool that declares no names serves what its workers list.
        let listed = pool
            .router
            .live_workers()
            .iter()
            .filter_map(|(_, w)| w.served_models())
            .any(|s| s.base.iter().any(|b| b == id));
        if pool.models.is_empty() && listed {
            let entry = json!({"id": id, "object": "model", "created": 0, "owned_by": "mmrouter", "pool": pool.name,
                               "workers": workers_by_role(&pool.router)});
            return axum::Json(entry).into_response();
        }
    }
    ApiError::model_not_found(Some(id)).into_response()
}

/// The pool's workers in rotation by role (`{"prefill": 1, "decode": 2}`; roles without one left
/// out): whether a model is served aggregated or disaggregated, and how wide.
fn workers_by_role(router: &Router) -> Value {
    let live = router.live_workers();
    let mut counts = Map::new();
    for role in Role::ALL {
        let n = live.iter().filter(|(_, w)| w.in_rotation() && w.role() == role).count();
        if n > 0 {
            counts.insert(role.label().into(), n.into());
        }
    }
    Value::Object(counts)
}
