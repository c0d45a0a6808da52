//! vLLM 0.32's `POST /tokenize` and `POST /detokenize`, as its serving layer answers them: a chat
//! (`messages`, with `add_generation_prompt`, `continue_final_message`, `tools`,
//! `chat_template_kwargs`, `add_special_tokens`) or a `prompt` string is rendered and tokenized as the
//! sim plans a completion request — the same ids its prefix cache is keyed by, images expanded — and
//! answered `{count, max_model_len, tokens, token_strs}`; `{tokens}` is decoded to `{prompt}`. A
//! `model` the worker does not serve is 404, as in vLLM. Needs a prompter that knows token ids (the
//! exact one); otherwise 501.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use bytes::Bytes;
use serde_json::{json, Value};

use crate::error::SimError;
use crate::responses::served_model;
use crate::server::AppState;

/// The tokenizer routes (merged into the sim's router).
pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/tokenize", post(tokenize)).route("/detokenize", post(detokenize))
}

fn bad(message: impl Into<String>, param: Option<&'static str>) -> SimError {
    SimError::BadRequest { message: message.into(), param }
}

fn object(raw: &[u8]) -> Result<Value, SimError> {
    let body: Value = serde_json::from_slice(raw).map_err(|e| SimError::InvalidJson(e.to_string()))?;
    if !body.is_object() {
        return Err(SimError::InvalidJson("the body must be a JSON object".to_owned()));
    }
    Ok(body)
}

async fn tokenize(State(state): State<Arc<AppState>>, raw: Bytes) -> Response {
    match answer_tokenize(&state, &raw) {
        Ok(body) => Json(body).into_response(),
        Err(e) => e.into_response(),
    }
}

fn answer_tokenize(state: &AppState, raw: &[u8]) -> Result<Value, SimError> {
    let body = object(raw)?;
    // vLLM's union tries the completion shape (`prompt`) first, then the chat shape.
    let path = match (body.get("prompt"), body.get("messages")) {
        (Some(Value::String(_)), _) => "/v1/completions",
        (Some(p), None) if !p.is_null() => return Err(bad("Input should be a valid string", Some("prompt"))),
        (_, Some(Value::Array(_))) => "/v1/chat/completions",
        (_, Some(_)) => return Err(bad("Input should be a valid list", Some("messages"))),
        (_, None) => return Err(bad("Field required", Some("prompt"))),
    };
    let flag = |k: &str| body.get(k).and_then(Value::as_bool);
    if path != "/v1/completions"
        && flag("continue_final_message") == Some(true)
        && flag("add_generation_prompt") == Some(true)
    {
        return Err(bad("Cannot set both `continue_final_message` and `add_generation_prompt` to True.", None));
    }
    served_model(state, &body)?;
    let prompt = state.prompter().prompt(path, &body, raw, state.opts.block_size).map_err(SimError::Prompt)?;
    let ids = prompt.token_ids;
    // A prompter without ids, or a plan whose ids do not cover the prompt (an image it could not
    // expand), cannot answer exactly (an empty prompt is planned as one token with no ids).
    let empty = body.get("prompt").and_then(Value::as_str) == Some("");
    let covered = ids.len() == prompt.prompt_tokens as usize || (ids.is_empty() && empty);
    if !covered {
        return Err(SimError::Unsupported("the simulator cannot tokenize this request exactly".to_owned()));
    }
    let token_strs = match flag("return_token_strs") {
        Some(true) => json!(state.prompter().id_tokens(&ids).map_err(SimError::Unsupported)?),
        _ => Value::Null,
    };
    Ok(json!({"count": ids.len(), "max_model_len": state.opts.max_model_len, "tokens": ids, "token_strs": token_strs}))
}

async fn detokenize(State(state): State<Arc<AppState>>, raw: Bytes) -> Response {
    match answer_detokenize(&state, &raw) {
        Ok(body) => Json(body).into_response(),
        Err(e) => e.into_response(),
    }
}

fn answer_detokenize(state: &AppState, raw: &[u8]) -> Result<Value, SimError> {
    let body = object(raw)?;
    let ids = match body.get("tokens") {
        None | Some(Value::Null) => return Err(bad("Field required", Some("tokens"))),
        Some(Value::Array(items)) => items
            .iter()
            .map(|t| t.as_u64().and_then(|id| u32::try_from(id).ok()))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| bad("Input should be a list of token ids (integers of at least 0)", Some("tokens")))?,
        Some(_) => return Err(bad("Input should be a valid list", Some("tokens"))),
    };
    served_model(state, &body)?;
    let text = state.prompter().decode(&ids).map_err(SimError::Unsupported)?;
    Ok(json!({"prompt": text}))
}
