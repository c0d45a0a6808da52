//! vLLM's runtime LoRA loading (`POST /v1/load_lora_adapter`, served by an engine started with
//! `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`), as vLLM 0.32 answers it: `{"lora_name", "lora_path"}`;
//! 200 with a plain-text success line; 400 when a name is missing or already loaded (without
//! `load_inplace`); 404 when nothing is at the path. A loaded adapter is listed by `/v1/models`
//! beside `--lora-modules`. `GET /sim/lora` shows what was loaded and how many loads were asked for
//! (simulator only: tests count the router's loads with it).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::server::AppState;

/// The sim's LoRA routes (merged into its router).
pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/v1/load_lora_adapter", post(load)).route("/sim/lora", get(status))
}

/// vLLM's `LoadLoRAAdapterRequest`, as far as the sim reads it.
struct LoadRequest {
    lora_name: String,
    lora_path: String,
    load_inplace: bool,
}

impl LoadRequest {
    fn parse(body: &[u8]) -> Option<LoadRequest> {
        let v: Value = serde_json::from_slice(body).ok()?;
        let text = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
        let load_inplace = v.get("load_inplace").and_then(Value::as_bool).unwrap_or(false);
        Some(LoadRequest { lora_name: text("lora_name"), lora_path: text("lora_path"), load_inplace })
    }
}

async fn load(State(state): State<Arc<AppState>>, body: axum::body::Bytes) -> Response {
    state.lora.requests.fetch_add(1, Ordering::Relaxed);
    let Some(req) = LoadRequest::parse(&body) else {
        return error(StatusCode::BAD_REQUEST, "BadRequestError", "The request body is not a JSON object.");
    };
    if req.lora_name.is_empty() || req.lora_path.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            "InvalidUserInput",
            "Both 'lora_name' and 'lora_path' must be provided.",
        );
    }
    let known = state.opts.lora_modules.contains(&req.lora_name) || state.lora.names().contains(&req.lora_name);
    if known && !req.load_inplace {
        let msg = format!(
            "The lora adapter '{}' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True.",
            req.lora_name
        );
        return error(StatusCode::BAD_REQUEST, "InvalidUserInput", &msg);
    }
    if !std::path::Path::new(&req.lora_path).exists() {
        let msg = format!("Loading lora {} failed: No adapter found for {}", req.lora_name, req.lora_path);
        return error(StatusCode::NOT_FOUND, "NotFoundError", &msg);
    }
    if !known {
        state.lora.names.lock().unwrap_or_else(|e| e.into_inner()).push(req.lora_name.clone());
    }
    format!("Success: LoRA adapter '{}' added successfully.", req.lora_name).into_response()
}

async fn status(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"loads": state.lora.requests.load(Ordering::Relaxed), "loaded": state.lora.names()}))
}

/// vLLM's `ErrorResponse`.
fn error(status: StatusCode, kind: &str, message: &str) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "param": null, "code": status.as_u16()}});
    (status, Json(body)).into_response()
}
