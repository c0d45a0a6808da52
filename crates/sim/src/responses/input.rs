//! A Responses request as the chat its prompt is rendered from, as vLLM 0.32 builds it
//! (`construct_input_messages`): `instructions` as a system message, then the previous response's
//! stored messages without their system messages, then the previous output texts as assistant
//! messages, then the new `input` (a string is one user message; items become chat messages: message
//! items as given, `function_call` items as assistant tool calls, `function_call_output` items as tool
//! messages). The sim plans that chat with its prompter, so a follow-up's prefix is really shared.

use serde_json::{json, Map, Value};

use crate::error::SimError;

/// Top-level request fields the chat template or the block keys read, passed on to the chat.
const CHAT_FIELDS: [&str; 5] =
    ["model", "cache_salt", "chat_template_kwargs", "mm_processor_kwargs", "media_io_kwargs"];

fn bad(message: impl Into<String>, param: &'static str) -> SimError {
    SimError::BadRequest { message: message.into(), param: Some(param) }
}

/// The previous turn a `previous_response_id` names: its stored messages and output items.
pub(crate) struct Previous<'a> {
    pub messages: &'a [Value],
    pub output: &'a [Value],
}

/// The chat messages of `body`'s prompt, after `previous`.
pub(crate) fn messages(body: &Value, previous: Option<Previous<'_>>) -> Result<Vec<Value>, SimError> {
    let mut messages = Vec::new();
    match body.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) if text.is_empty() => {}
        Some(Value::String(text)) => messages.push(json!({"role": "system", "content": text})),
        Some(_) => return Err(bad("Input should be a valid string", "instructions")),
    }
    if let Some(previous) = previous {
        // Instructions do not carry over to the next response (OpenAI's rule, vLLM's filter).
        messages.extend(previous.messages.iter().filter(|m| m.get("role") != Some(&json!("system"))).cloned());
        for item in previous.output.iter().filter(|i| i.get("type") == Some(&json!("message"))) {
            for part in item.get("content").and_then(Value::as_array).into_iter().flatten() {
                messages
                    .push(json!({"role": "assistant", "content": part.get("text").cloned().unwrap_or(Value::Null)}));
            }
        }
    }
    match body.get("input") {
        None | Some(Value::Null) => return Err(bad("Field required", "input")),
        Some(Value::String(text)) => messages.push(json!({"role": "user", "content": text})),
        Some(Value::Array(items)) => {
            for item in items {
                add_item(&mut messages, item)?;
            }
        }
        Some(_) => return Err(bad("Input should be a valid string or a valid list", "input")),
    }
    Ok(messages)
}

/// One input item as a chat message, or merged into the assistant message before it.
fn add_item(messages: &mut Vec<Value>, item: &Value) -> Result<(), SimError> {
    let Some(fields) = item.as_object() else {
        return Err(bad("Input items should be objects", "input"));
    };
    let kind = fields.get("type").and_then(Value::as_str);
    let previous_assistant = messages.last_mut().filter(|m| m.get("role") == Some(&json!("assistant")));
    match kind {
        Some("function_call") => {
            let text = |k: &str| fields.get(k).and_then(Value::as_str).map(str::to_owned);
            let (Some(call_id), Some(name), Some(arguments)) = (text("call_id"), text("name"), text("arguments"))
            else {
                return Err(bad("A function_call item needs `call_id`, `name` and `arguments`", "input"));
            };
            let name = match text("namespace").filter(|ns| !ns.is_empty()) {
                Some(ns) => format!("{ns}__{name}"),
                None => name,
            };
            let call = json!({"id": call_id, "function": {"name": name, "arguments": arguments}, "type": "function"});
            match previous_assistant.and_then(Value::as_object_mut) {
                Some(last) => match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                    Some(calls) => calls.push(call),
                    None => {
                        last.insert("tool_calls".to_owned(), json!([call]));
                    }
                },
                None => messages.push(json!({"role": "assistant", "tool_calls": [call]})),
            }
        }
        Some("function_call_output" | "custom_tool_call_output") => messages.push(json!({
            "role": "tool",
            "content": fields.get("output").cloned().unwrap_or(Value::Null),
            "tool_call_id": fields.get("call_id").cloned().unwrap_or(Value::Null),
        })),
        Some("reasoning") => {
            let text = |list: &str| fields.get(list)?.get(0)?.get("text").cloned();
            let reasoning = text("content").or_else(|| text("summary")).unwrap_or(json!(""));
            match previous_assistant.and_then(Value::as_object_mut) {
                Some(last) if !last.contains_key("reasoning") => {
                    last.insert("reasoning".to_owned(), reasoning);
                }
                _ => messages.push(json!({"role": "assistant", "reasoning": reasoning})),
            }
        }
        _ if fields.get("role") == Some(&json!("assistant")) => {
            let text = match fields.get("content") {
                Some(Value::String(text)) => Some(json!(text)),
                Some(Value::Array(parts)) => parts.first().and_then(|p| p.get("text")).cloned(),
                _ => None,
            };
            let Some(text) = text else { return Ok(()) };
            match previous_assistant.and_then(Value::as_object_mut) {
                Some(last) if last.get("content").is_none_or(Value::is_null) => {
                    last.insert("content".to_owned(), text);
                }
                _ => messages.push(json!({"role": "assistant", "content": text})),
            }
        }
        // A user, system or developer message: rendered as given (vLLM passes the item on).
        _ if fields.contains_key("role") => messages.push(item.clone()),
        other => return Err(bad(format!("Unsupported input item type: {}", other.unwrap_or("None")), "input")),
    }
    Ok(())
}

/// Whether the last input item is an unfinished assistant message the model continues (vLLM's
/// `should_continue_final_message`).
fn continues_final(body: &Value) -> bool {
    let Some(last) = body.get("input").and_then(Value::as_array).and_then(|items| items.last()) else {
        return false;
    };
    let kind = last.get("type").and_then(Value::as_str).unwrap_or("message");
    matches!(kind, "message" | "reasoning")
        && matches!(last.get("status").and_then(Value::as_str), Some("in_progress" | "incomplete"))
}

/// The chat-completions body the prompt is rendered from: the messages, the request's tools in the
/// chat shape, and the fields that change the rendering or the block keys.
pub(crate) fn chat_body(body: &Value, messages: &[Value]) -> Value {
    let mut chat = Map::new();
    for key in CHAT_FIELDS {
        if let Some(v) = body.get(key).filter(|v| !v.is_null()) {
            chat.insert(key.to_owned(), v.clone());
        }
    }
    chat.insert("messages".to_owned(), Value::Array(messages.to_vec()));
    let tools = chat_tools(body);
    if !tools.is_empty() {
        chat.insert("tools".to_owned(), Value::Array(tools));
    }
    if continues_final(body) {
        chat.insert("add_generation_prompt".to_owned(), json!(false));
        chat.insert("continue_final_message".to_owned(), json!(true));
    }
    if let Some(effort) = body.pointer("/reasoning/effort").and_then(Value::as_str) {
        // vLLM passes the effort to the template, and `enable_thinking` unless the client set it.
        let kwargs = chat.entry("chat_template_kwargs").or_insert_with(|| json!({}));
        if let Some(kwargs) = kwargs.as_object_mut() {
            kwargs.entry("reasoning_effort").or_insert_with(|| json!(effort));
            kwargs.entry("enable_thinking").or_insert_with(|| json!(effort != "none"));
        }
    }
    Value::Object(chat)
}

/// The request's function tools as chat tools (vLLM's `construct_tool_dicts`, whatever the tool
/// choice): each function tool's fields but `type` under `function`, a namespace's functions named
/// `<namespace>__<name>`; other tools are not shown to the model. The chat path then keeps the keys
/// vLLM's `FunctionDefinition` keeps.
fn chat_tools(body: &Value) -> Vec<Value> {
    let Some(tools) = body.get("tools").and_then(Value::as_array) else { return Vec::new() };
    let mut out = Vec::new();
    for tool in tools {
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => out.extend(chat_tool(tool, None)),
            Some("namespace") => {
                let ns = tool.get("name").and_then(Value::as_str);
                let inner = tool.get("tools").and_then(Value::as_array).into_iter().flatten();
                out.extend(
                    inner.filter(|t| t.get("type") == Some(&json!("function"))).filter_map(|t| chat_tool(t, ns)),
                );
            }
            _ => {}
        }
    }
    out
}

fn chat_tool(tool: &Value, namespace: Option<&str>) -> Option<Value> {
    let mut function: Map<String, Value> =
        tool.as_object()?.iter().filter(|(k, _)| *k != "type").map(|(k, v)| (k.clone(), v.clone())).collect();
    if let Some(ns) = namespace {
        let name = function.get("name")?.as_str()?;
        function.insert("name".to_owned(), json!(format!("{ns}__{name}")));
    }
    Some(json!({"type": "function", "function": function}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_string_input_is_one_user_message_after_the_instructions() {
        let m = messages(&json!({"input": "hi", "instructions": "be brief"}), None).expect("messages");
        assert_eq!(m, vec![json!({"role": "system", "content": "be brief"}), json!({"role": "user", "content": "hi"})]);
        assert_eq!(messages(&json!({}), None).expect_err("no input").to_string(), "Field required");
    }

    #[test]
    fn a_follow_up_drops_old_instructions_and_adds_the_previous_output() {
        let stored = [json!({"role": "system", "content": "old"}), json!({"role": "user", "content": "q1"})];
        let output = [
            json!({"type": "message", "content": [{"type": "output_text", "text": "a1"}]}),
            json!({"type": "reasoning"}),
        ];
        let previous = Previous { messages: &stored, output: &output };
        let m = messages(&json!({"input": "q2", "instructions": "new"}), Some(previous)).expect("messages");
        let roles: Vec<&str> = m.iter().map(|m| m["role"].as_str().unwrap_or("")).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert_eq!((m[0]["content"].as_str(), m[2]["content"].as_str()), (Some("new"), Some("a1")));
    }

    #[test]
    fn items_become_chat_messages() {
        let input = json!({"input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "checking"}]},
            {"type": "function_call", "call_id": "c1", "name": "get", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"role": "assistant", "content": "It is sunny."},
        ]});
        let m = messages(&input, None).expect("messages");
        assert_eq!(m.len(), 4);
        assert_eq!(m[0]["content"][0]["type"], "input_text");
        assert_eq!((m[1]["content"].as_str(), m[1]["tool_calls"][0]["id"].as_str()), (Some("checking"), Some("c1")));
        assert_eq!((m[2]["role"].as_str(), m[2]["tool_call_id"].as_str()), (Some("tool"), Some("c1")));
        assert_eq!(m[3]["content"], "It is sunny.");
        let unknown = messages(&json!({"input": [{"type": "file_search_call"}]}), None).expect_err("unknown item");
        assert_eq!(unknown.to_string(), "Unsupported input item type: file_search_call");
    }

    #[test]
    fn the_chat_body_carries_tools_salt_and_continuation() {
        let body = json!({
            "model": "m", "cache_salt": "s", "input": [{"role": "assistant", "content": "Once", "status": "incomplete"}],
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": true}],
            "reasoning": {"effort": "low"},
        });
        let chat = chat_body(&body, &messages(&body, None).expect("messages"));
        assert_eq!((chat["model"].as_str(), chat["cache_salt"].as_str()), (Some("m"), Some("s")));
        let f = &chat["tools"][0]["function"];
        assert_eq!(*f, json!({"name": "f", "parameters": {"type": "object"}, "strict": true}));
        assert_eq!((&chat["continue_final_message"], &chat["add_generation_prompt"]), (&json!(true), &json!(false)));
        assert_eq!(chat["chat_template_kwargs"], json!({"reasoning_effort": "low", "enable_thinking": true}));
        // Shown whatever the tool choice; a namespace's flattened, built-in tools dropped.
        let tools = json!([{"type": "function", "name": "f"}, {"type": "web_search"},
            {"type": "namespace", "name": "maps", "tools": [{"type": "function", "name": "route"}]}]);
        let chat = chat_body(&json!({"tools": tools, "tool_choice": "none"}), &[]);
        let names: Vec<&str> =
            chat["tools"].as_array().expect("tools").iter().filter_map(|t| t["function"]["name"].as_str()).collect();
        assert_eq!(names, ["f", "maps__route"]);
    }
}
