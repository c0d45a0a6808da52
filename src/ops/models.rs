//! `GET /v1/models`: every pool's served names, in OpenAI's list shape. A config without `[[pools]]`
//! declares none: then the workers answer (they know their `--served-model-name`), which `server.rs`
//! routes.

use axum::response::{IntoResponse, Response};

use crate::state::AppState;

/// The list, or `None` when no pool declares its served names.
pub fn models(st: &AppState) -> Option<Response> {
    let pools = st.pools();
    let served = || pools.iter().flat_map(|p| p.models.iter().map(move |m| (m, &p.name)));
    served().next()?;
    let data: Vec<serde_json::Value> = served()
        .map(|(id, pool)| serde_json::json!({"id": id, "object": "model", "created": 0, "owned_by": "mmrouter", "pool": pool}))
        .collect();
    Some(axum::Json(serde_json::json!({"object": "list", "data": data})).into_response())
}
