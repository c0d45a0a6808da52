//! One accepted Responses request ([`Job`]) and the JSON vLLM 0.32 answers it with: the response
//! object (`ResponsesResponse.from_request`'s fields in its order), its `usage`, the message item.

use std::sync::Arc;

use serde_json::{json, Value};

use super::store::Stored;
use crate::prompt::SimPrompt;
use crate::server::AppState;

/// One accepted Responses request.
pub(super) struct Job {
    pub(super) id: String,
    pub(super) created_at: u64,
    /// The served name the answer reports (the adapter's when the request names one).
    pub(super) model: String,
    /// The request, for the fields the answer echoes.
    pub(super) body: Value,
    /// The chat messages the prompt was rendered from (stored for a follow-up).
    pub(super) messages: Arc<Vec<Value>>,
    pub(super) prompt: Arc<SimPrompt>,
    /// The output tokens' text pieces.
    pub(super) pieces: Vec<String>,
    /// The engine's finish: "length" makes the answer `incomplete`.
    pub(super) finish: &'static str,
    /// The `max_output_tokens` the answer reports (vLLM's sampling `max_tokens`).
    pub(super) max_tokens: u32,
    pub(super) store: bool,
    pub(super) stream: bool,
    /// Stream only: cut before this token (`--drop-mid-stream-rate`).
    pub(super) drop_at: Option<u32>,
}

impl Job {
    pub(super) fn text(&self) -> String {
        self.pieces.concat()
    }

    pub(super) fn tokens(&self) -> u32 {
        u32::try_from(self.pieces.len()).unwrap_or(u32::MAX)
    }

    pub(super) fn status(&self) -> &'static str {
        if self.finish == "length" {
            "incomplete"
        } else {
            "completed"
        }
    }

    /// The response object (vLLM's `ResponsesResponse.from_request`, its fields in its order).
    pub(super) fn response(&self, status: &str, output: Vec<Value>, usage: Value) -> Value {
        let b = &self.body;
        let echo = |k: &str| b.get(k).cloned().unwrap_or(Value::Null);
        let number = |k: &str, default: f64| b.get(k).filter(|v| v.is_number()).cloned().unwrap_or(json!(default));
        let has_tools = b.get("tools").and_then(Value::as_array).is_some_and(|t| !t.is_empty());
        let tool_choice = match b.get("tool_choice") {
            // vLLM's validator: without tools, "auto" (the default) and "none" become "none".
            None | Some(Value::Null) if !has_tools => json!("none"),
            Some(Value::String(c)) if !has_tools && c == "auto" => json!("none"),
            None | Some(Value::Null) => json!("auto"),
            Some(c) => c.clone(),
        };
        let incomplete = (status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
        json!({
            "id": self.id,
            "created_at": self.created_at,
            "incomplete_details": incomplete,
            "instructions": echo("instructions"),
            "metadata": echo("metadata"),
            "model": self.model,
            "object": "response",
            "output": output,
            "parallel_tool_calls": b.get("parallel_tool_calls").and_then(Value::as_bool).unwrap_or(true),
            "temperature": number("temperature", 1.0),
            "tool_choice": tool_choice,
            "tools": b.get("tools").filter(|t| !t.is_null()).cloned().unwrap_or(json!([])),
            "top_p": number("top_p", 1.0),
            "background": b.get("background").and_then(Value::as_bool).unwrap_or(false),
            "max_output_tokens": self.max_tokens,
            "max_tool_calls": echo("max_tool_calls"),
            "previous_response_id": echo("previous_response_id"),
            "prompt": null,
            "reasoning": echo("reasoning"),
            "service_tier": b.get("service_tier").filter(|v| v.is_string()).cloned().unwrap_or(json!("auto")),
            "status": status,
            "text": echo("text"),
            "top_logprobs": null,
            "truncation": b.get("truncation").filter(|v| v.is_string()).cloned().unwrap_or(json!("disabled")),
            "usage": usage,
            "user": echo("user"),
            "presence_penalty": number("presence_penalty", 0.0),
            "frequency_penalty": number("frequency_penalty", 0.0),
            "kv_transfer_params": null,
            "ec_transfer_params": null,
            "input_messages": null,
            "output_messages": null,
        })
    }

    /// vLLM's `ResponseUsage` (one turn: the per-turn lists stay empty); `usage_drift` skews the input.
    pub(super) fn usage(&self, cached_tokens: u32, drift: i64) -> Value {
        let input = i64::from(self.prompt.prompt_tokens).saturating_add(drift).max(0);
        let output = self.tokens();
        json!({
            "input_tokens": input,
            "input_tokens_details": {
                "cached_tokens": cached_tokens,
                "cache_write_tokens": 0,
                "input_tokens_per_turn": [],
                "cached_tokens_per_turn": [],
            },
            "output_tokens": output,
            "output_tokens_details": {
                "reasoning_tokens": 0,
                "tool_output_tokens": 0,
                "output_tokens_per_turn": [],
                "tool_output_tokens_per_turn": [],
            },
            "total_tokens": input.saturating_add(i64::from(output)),
        })
    }

    /// Keeps the finished answer when the store is on and the request asked for it.
    pub(super) fn keep(&self, state: &AppState, response: &Value) {
        if self.store {
            state.responses.put(&self.id, Stored::new(response.clone(), self.messages.clone()));
        }
    }
}

/// An assistant message output item (its one `output_text` part, none for empty text).
pub(super) fn message_item(id: &str, text: &str, status: &str) -> Value {
    let content = if text.is_empty() { json!([]) } else { json!([output_text(text, Value::Null)]) };
    json!({"id": id, "content": content, "role": "assistant", "status": status, "type": "message", "phase": null})
}

pub(super) fn output_text(text: &str, logprobs: Value) -> Value {
    json!({"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs})
}

/// vLLM's ids: a prefix and 16 hex digits (`random_uuid()`).
pub(super) fn new_id(prefix: &str) -> String {
    format!("{prefix}_{:016x}", rand::random::<u64>())
}
