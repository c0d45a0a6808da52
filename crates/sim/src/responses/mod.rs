//! vLLM 0.32's Responses API (`POST /v1/responses`, `GET /v1/responses/{id}`, `POST
//! /v1/responses/{id}/cancel`), as its OpenAI server answers a model without tool or reasoning
//! parsers: the prompt is the chat vLLM builds from `instructions`, the stored history of a
//! `previous_response_id` and `input` (`input.rs`), planned by the sim's prompter like any chat, so
//! it takes the same slot, prefix hit, timing and faults (`crate::server::Turn`); the answer is one
//! assistant message of the sim's deterministic text, `usage` with `input_tokens_details.cached_tokens`.
//! Streamed (`stream.rs`): vLLM's event sequence, each event `event: <type>` and `data: <json>`,
//! numbered by `sequence_number`, no `[DONE]`.
//!
//! The store (`store.rs`) mirrors `VLLM_ENABLE_RESPONSES_API_STORE`: off by default, as in vLLM, where
//! `store` is silently ignored and every `previous_response_id` is answered 404.

mod input;
mod job;
pub(crate) mod store;
mod stream;

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use serde_json::{json, Value};

use crate::error::SimError;
use crate::server::{AppState, Turn};

use job::{message_item, new_id, Job};

/// The Responses routes (merged into the sim's router).
pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/responses", post(create))
        .route("/v1/responses/{response_id}", get(retrieve))
        .route("/v1/responses/{response_id}/cancel", post(cancel))
}

async fn create(State(state): State<Arc<AppState>>, raw: Bytes) -> Response {
    if let Err(e) = state.arrive().await {
        return e.into_response();
    }
    let job = match prepare(&state, &raw) {
        Ok(job) => job,
        Err(e) => return e.into_response(),
    };
    if let Some(failed) = state.injected() {
        return failed;
    }
    let turn = Turn::new(&state);
    if job.stream {
        return stream::response(state, job, turn);
    }
    match whole(&state, &job, turn).await {
        Ok(body) => Json(body).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn whole(state: &Arc<AppState>, job: &Job, mut turn: Turn) -> Result<Value, SimError> {
    let cached = turn.prefill(&job.prompt).await?;
    turn.decode_all(job.tokens()).await?;
    turn.finish();
    let output = vec![message_item(&new_id("msg"), &job.text(), "completed")];
    let response = job.response(job.status(), output, job.usage(cached, state.opts.usage_drift));
    job.keep(state, &response);
    Ok(response)
}

fn bad(message: impl Into<String>, param: &'static str) -> SimError {
    SimError::BadRequest { message: message.into(), param: Some(param) }
}

/// Reads and checks the request in vLLM's order (its validators, the model, the store rules, the
/// previous response), then renders and plans its prompt.
fn prepare(state: &AppState, raw: &[u8]) -> Result<Job, SimError> {
    let body: Value = serde_json::from_slice(raw).map_err(|e| SimError::InvalidJson(e.to_string()))?;
    if !body.is_object() {
        return Err(SimError::InvalidJson("the body must be a JSON object".to_owned()));
    }
    let flag = |k: &'static str, default: bool| match body.get(k) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(bad("Input should be a valid boolean", k)),
    };
    let (stream, store, background) = (flag("stream", false)?, flag("store", true)?, flag("background", false)?);
    check_fields(&body, store, background)?;
    let model = served_model(state, &body)?;
    if background {
        return Err(background_refusal(state.responses.enabled()));
    }
    let store = store && state.responses.enabled();
    let previous = match body.get("previous_response_id").and_then(Value::as_str) {
        Some(id) => Some(state.responses.get(id).ok_or_else(|| SimError::ResponseNotFound { id: id.to_owned() })?),
        None => None,
    };
    let previous = previous.as_deref().map(|p| input::Previous {
        messages: &p.messages,
        output: p.response.get("output").and_then(Value::as_array).map_or(&[], Vec::as_slice),
    });
    let messages = input::messages(&body, previous)?;
    let chat = input::chat_body(&body, &messages);
    let chat_bytes = serde_json::to_vec(&chat).map_err(|e| SimError::Prompt(e.to_string()))?;
    let opts = &state.opts;
    let prompt = state.prompter().prompt("/v1/chat/completions", &chat, &chat_bytes, opts.block_size);
    let prompt = prompt.map_err(SimError::Prompt)?;
    let room = opts.max_model_len.saturating_sub(prompt.prompt_tokens);
    if room == 0 {
        let message = format!(
            "The engine prompt length {} exceeds the max_model_len {}. Please reduce prompt.",
            prompt.prompt_tokens, opts.max_model_len
        );
        return Err(bad(message, "input"));
    }
    let (tokens, finish, max_tokens) = output_budget(&body, opts, room)?;
    let id = body.get("request_id").and_then(Value::as_str).map_or_else(|| new_id("resp"), str::to_owned);
    Ok(Job {
        id,
        created_at: crate::server::unix_now(),
        model,
        messages: Arc::new(messages),
        prompt: Arc::new(prompt),
        pieces: (0..tokens).map(|i| crate::answer::word(0, i)).collect(),
        finish,
        max_tokens,
        store,
        stream,
        drop_at: if stream { state.drop_at(tokens) } else { None },
        body,
    })
}

/// vLLM's request validators the sim can meet: no prompt templates, `background` needs `store`,
/// not both `previous_input_messages` and `previous_response_id`.
fn check_fields(body: &Value, store: bool, background: bool) -> Result<(), SimError> {
    if body.get("prompt").is_some_and(|p| !p.is_null()) {
        return Err(bad("prompt template is not supported", "prompt"));
    }
    if background && !store {
        return Err(bad("background can only be used when `store` is true", "background"));
    }
    let set = |k: &str| body.get(k).is_some_and(|v| !v.is_null());
    if set("previous_input_messages") && set("previous_response_id") {
        return Err(bad(
            "Only one of `previous_input_messages` and `previous_response_id` can be set.",
            "previous_response_id",
        ));
    }
    if body.get("previous_response_id").is_some_and(|v| !v.is_null() && !v.is_string()) {
        return Err(bad("Input should be a valid string", "previous_response_id"));
    }
    Ok(())
}

/// `background: true`: vLLM's refusal without its store; with it, not simulated (yet).
fn background_refusal(store_enabled: bool) -> SimError {
    if store_enabled {
        return SimError::Unsupported("background responses are not simulated".to_owned());
    }
    bad(
        "This vLLM engine does not support `store=True` and therefore does not support the background mode. \
         To enable these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when \
         launching the vLLM server.",
        "background",
    )
}

/// The served name the request names (the base model, or a LoRA adapter), as vLLM's `_check_model`
/// accepts it: absent or empty means the base model; anything else not served is 404.
pub(crate) fn served_model(state: &AppState, body: &Value) -> Result<String, SimError> {
    let opts = &state.opts;
    let model = match body.get("model") {
        None | Some(Value::Null) => return Ok(opts.model.clone()),
        Some(Value::String(m)) if m.is_empty() => return Ok(opts.model.clone()),
        Some(Value::String(m)) => m,
        Some(_) => return Err(bad("Input should be a valid string", "model")),
    };
    if *model == opts.model || opts.lora_modules.contains(model) || state.lora.names().contains(model) {
        return Ok(model.clone());
    }
    Err(SimError::ModelNotFound { model: model.clone(), served: opts.model.clone() })
}

/// Output tokens, finish and the reported `max_output_tokens`: the request's limit ends with
/// "length" (capped at `--max-output-tokens`); without one the sim's model stops after
/// `--default-output-tokens`; both within the context left (`room`).
fn output_budget(
    body: &Value,
    opts: &crate::options::SimOptions,
    room: u32,
) -> Result<(u32, &'static str, u32), SimError> {
    match body.get("max_output_tokens") {
        None | Some(Value::Null) => {
            let tokens = opts.default_output_tokens.min(opts.max_output_tokens);
            Ok((tokens.min(room), if tokens > room { "length" } else { "stop" }, room))
        }
        Some(v) => {
            let n = v
                .as_u64()
                .filter(|n| *n >= 1)
                .ok_or_else(|| bad("max_tokens must be at least 1", "max_output_tokens"))?;
            let max_tokens = u32::try_from(n).unwrap_or(u32::MAX).min(room);
            Ok((max_tokens.min(opts.max_output_tokens), "length", max_tokens))
        }
    }
}

async fn retrieve(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let Some(stored) = state.responses.get(&id) else {
        return SimError::ResponseNotFound { id }.into_response();
    };
    if query.get("stream").is_some_and(|s| s == "true") {
        // `stream=true` replays a background stream in vLLM; the sim runs none.
        return bad(format!("Unknown response_id: {id}"), "response_id").into_response();
    }
    Json(stored.response.clone()).into_response()
}

async fn cancel(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    let Some(stored) = state.responses.get(&id) else {
        return SimError::ResponseNotFound { id }.into_response();
    };
    match stored.response.get("status").and_then(Value::as_str) {
        Some("queued" | "in_progress") => {
            let cancelled = state.responses.update(&id, |r| r["status"] = json!("cancelled"));
            Json(cancelled.unwrap_or_else(|| stored.response.clone())).into_response()
        }
        _ => SimError::CannotCancel.into_response(),
    }
}
