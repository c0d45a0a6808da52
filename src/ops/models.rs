//! `GET /v1/models`: every pool's served names, in OpenAI's list shape, each with two members of
//! mmrouter's own: `pool` (the pool serving it) and `workers` (its workers in rotation by role, e.g.
//! `{"prefill": 1, "decode": 2}`). A config without `[[pools]]`
//! declares none: then the workers answer (they know their `--served-model-name`), which `server.rs`
//! routes.

use std::collections::HashMap;

use axum::response::{IntoResponse, Response};
use mmrouter_core::routing::{Role, Router};
use serde_json::{json, Map, Value};

use crate::state::AppState;

/// The list, or `None` when no pool declares its served names.
pub fn models(st: &AppState) -> Option<Response> {
    let pools = st.pools();
    let served = || pools.iter().flat_map(|p| p.models.iter().map(move |m| (m, &p.name)));
    served().next()?;
    let workers: HashMap<&str, Value> = pools.iter().map(|p| (p.name.as_str(), workers_by_role(&p.router))).collect();
    let data: Vec<Value> = served()
        .map(|(id, pool)| {
            let workers = &workers[pool.as_str()];
            json!({"id": id, "object": "model", "created": 0, "owned_by": "mmrouter", "pool": pool, "workers": workers})
        })
        .collect();
    Some(axum::Json(json!({"object": "list", "data": data})).into_response())
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
