//! A Responses API body (`POST /v1/responses`) read as the chat vLLM 0.32 renders for it — its
//! non-Harmony path: `construct_input_messages`, `construct_tool_dicts` and
//! `ResponsesRequest.build_chat_params`, after pydantic's parse of `input` (`input_item_parsing`).
//!
//! `instructions` becomes a system message, a string `input` one user message, and each `input` item
//! a chat message: role messages as sent (their `input_text`/`input_image` parts are the chat path's
//! parts, images with their byte spans), an assistant output message as its first part's text,
//! `function_call` items as tool calls and `reasoning` items as `reasoning` merged onto the assistant
//! message before them, `function_call_output` items as tool messages. Function tools (namespaced
//! ones flattened to `<namespace>__<name>`) become chat tools; `reasoning.effort` the chat's
//! `reasoning_effort`; a final partial assistant item continues that message.
//!
//! The items are parsed in the body's one serde pass by the chat path's message seed (`de.rs`); what
//! vLLM then does with each item happens here on the parsed items, never on the body again. What vLLM refuses,
//! and what the router does not reproduce (custom tools, tool outputs made of parts, a continued
//! stored conversation), leaves `messages` an `Err` with the reason: the request then routes by load
//! and the worker answers — vLLM's own 400 where it refuses. A `previous_response_id` is one such:
//! the prompt is then the worker's stored conversation plus this input, which the router never saw.

use serde_json::{json, Map, Value};

use super::{Entry, Message, Part};

/// Top-level keys of a Responses body kept for the pipeline and the template; `input`,
/// `instructions`, `tools` and `reasoning` are converted, everything else is skipped.
pub(super) const FIELDS: &[&str] = &[
    "model",
    "max_output_tokens",
    "cache_salt",
    "mm_processor_kwargs",
    "media_io_kwargs",
    "chat_template_kwargs",
    "stream",
    "previous_response_id",
    "prompt",
    "tool_choice",
    "background",
    "store",
];

/// `reasoning.effort` values vLLM's schema accepts.
const EFFORTS: &[&str] = &["none", "minimal", "low", "medium", "high", "xhigh"];

/// The part types vLLM's schema accepts in the content list of a role message passed on as sent.
const INPUT_PARTS: &[&str] = &["input_text", "input_image", "input_file"];

/// What the parse kept of the top-level keys that are converted.
#[derive(Default)]
pub(super) struct Converted {
    pub(super) input: Option<Input>,
    pub(super) instructions: Value,
    pub(super) tools: Value,
    pub(super) reasoning: Value,
}

/// What `input` held.
pub(super) enum Input {
    Text(String),
    /// Each item parsed as a message (`None`: not an object).
    Items(Vec<Option<Message>>),
    /// Neither a string nor an array.
    Invalid,
}

/// The chat vLLM renders: messages, and in `fields` the chat's `tools`, `reasoning_effort` and
/// generation flags.
pub(super) fn convert(fields: &mut Map<String, Value>, got: Converted) -> Result<Vec<Message>, String> {
    refused(fields)?;
    check_tool_choice(fields.get("tool_choice").unwrap_or(&Value::Null), &got.tools)?;
    if let Some(tools) = chat_tools(&got.tools)? {
        fields.insert("tools".into(), Value::Array(tools));
    }
    if let Some(effort) = effort(&got.reasoning)? {
        fields.insert("reasoning_effort".into(), effort.into());
    }
    let mut out = Vec::new();
    match got.instructions {
        Value::Null => {}
        Value::String(s) if s.is_empty() => {}
        Value::String(s) => out.push(text_message("system", s)),
        _ => return Err("`instructions` must be a string".into()),
    }
    match got.input {
        None => return Err("`input` is required".into()),
        Some(Input::Invalid) => return Err("`input` must be a string or an array of items".into()),
        Some(Input::Text(s)) => out.push(text_message("user", s)),
        Some(Input::Items(items)) => {
            if continues_final(&items) {
                fields.insert("add_generation_prompt".into(), false.into());
                fields.insert("continue_final_message".into(), true.into());
            }
            for (i, item) in items.into_iter().enumerate() {
                let item = item.ok_or_else(|| format!("input[{i}] must be an object"))?;
                push_item(&mut out, i, item)?;
            }
        }
    }
    Ok(out)
}

/// Requests vLLM refuses before converting anything, or whose prompt the router cannot know.
fn refused(fields: &Map<String, Value>) -> Result<(), String> {
    let set = |k: &str| fields.get(k).filter(|v| !v.is_null());
    if set("prompt").is_some() {
        return Err("prompt template is not supported".into());
    }
    if set("previous_response_id").is_some() {
        return Err("previous_response_id: the prompt continues a conversation stored on a worker".into());
    }
    if set("background").and_then(Value::as_bool) == Some(true) && set("store").and_then(Value::as_bool) == Some(false)
    {
        return Err("background can only be used when `store` is true".into());
    }
    Ok(())
}

fn text_message(role: &str, text: String) -> Message {
    Message { entries: vec![("role".into(), Entry::Json(role.into())), ("content".into(), Entry::Json(text.into()))] }
}

/// `construct_tool_dicts`: each function tool as a chat tool (namespaced ones flattened), other
/// built-in tools dropped (a non-Harmony model is never shown them); no tools, `None`.
fn chat_tools(tools: &Value) -> Result<Option<Vec<Value>>, String> {
    let list = match tools {
        Value::Null => return Ok(None),
        Value::Array(list) if list.is_empty() => return Ok(None),
        Value::Array(list) => list,
        _ => return Err("`tools` must be an array".into()),
    };
    let mut out = Vec::new();
    for (i, tool) in list.iter().enumerate() {
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => out.push(chat_tool(tool, None).ok_or_else(|| format!("tools[{i}] needs a name"))?),
            Some("namespace") => {
                let (Some(ns), Some(inner)) =
                    (tool.get("name").and_then(Value::as_str), tool.get("tools").and_then(Value::as_array))
                else {
                    return Err(format!("tools[{i}]: a namespace needs a name and tools"));
                };
                for f in inner.iter().filter(|t| t.get("type").and_then(Value::as_str) == Some("function")) {
                    out.push(chat_tool(f, Some(ns)).ok_or_else(|| format!("tools[{i}]: a function needs a name"))?);
                }
            }
            // vLLM shows custom tools as a one-string function shim the router does not build.
            Some("custom") => return Err(format!("tools[{i}]: custom tools are not planned by the router")),
            Some(_) => {}
            None => return Err(format!("tools[{i}] needs a type")),
        }
    }
    Ok(Some(out))
}

/// A flat Responses function tool as the chat tool vLLM renders (`conversation::tools` then keeps
/// the keys vLLM's `FunctionDefinition` keeps).
fn chat_tool(tool: &Value, namespace: Option<&str>) -> Option<Value> {
    let obj = tool.as_object()?;
    let name = obj.get("name")?.as_str()?;
    let mut function: Map<String, Value> =
        obj.iter().filter(|(k, _)| *k != "type").map(|(k, v)| (k.clone(), v.clone())).collect();
    if let Some(ns) = namespace {
        function.insert("name".into(), format!("{ns}__{name}").into());
    }
    Some(json!({"type": "function", "function": function}))
}

/// `check_tool_usage`: a tool choice vLLM refuses for the tools sent.
fn check_tool_choice(choice: &Value, tools: &Value) -> Result<(), String> {
    let tools = tools.as_array().map(Vec::as_slice).unwrap_or_default();
    let named = matches!(choice.get("type").and_then(Value::as_str), Some("function" | "custom"));
    if tools.is_empty() {
        if choice.as_str() == Some("required") {
            return Err("Tool choice 'required' must be specified with 'tools' parameter.".into());
        }
        if named {
            return Err("Tool choice 'function' not found in 'tools' parameter.".into());
        }
        return Ok(());
    }
    if !named {
        return Ok(());
    }
    let name = choice.get("name").and_then(Value::as_str).filter(|n| !n.is_empty());
    let name = name.ok_or("Tool choice 'function' not found in 'tools' parameter.")?;
    let mut exact = false;
    let mut local = 0;
    for tool in tools {
        let tool_name = tool.get("name").and_then(Value::as_str);
        if tool.get("type").and_then(Value::as_str) != Some("namespace") {
            exact |= tool_name == Some(name);
            continue;
        }
        let inner = tool.get("tools").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
        for t in inner.iter().filter_map(|t| t.get("name").and_then(Value::as_str)) {
            exact |= tool_name.is_some_and(|ns| name == format!("{ns}__{t}"));
            local += usize::from(t == name);
        }
    }
    match (exact, local) {
        (true, _) | (false, 1) => Ok(()),
        (false, 0) => Err("Tool choice 'function' not found in 'tools' parameter.".into()),
        _ => Err(format!("Tool choice '{name}' is ambiguous: it is defined in more than one namespace.")),
    }
}

/// `reasoning.effort`, the chat's `reasoning_effort`.
fn effort(reasoning: &Value) -> Result<Option<&str>, String> {
    let effort = match reasoning {
        Value::Null => return Ok(None),
        Value::Object(r) => r.get("effort").unwrap_or(&Value::Null),
        _ => return Err("`reasoning` must be an object".into()),
    };
    match effort {
        Value::Null => Ok(None),
        Value::String(e) if EFFORTS.contains(&e.as_str()) => Ok(Some(e)),
        _ => Err(format!("reasoning.effort must be one of {}", EFFORTS.join(", "))),
    }
}

/// `should_continue_final_message`: the last item is a message or reasoning item still in progress.
fn continues_final(items: &[Option<Message>]) -> bool {
    let Some(Some(last)) = items.last() else { return false };
    let kind = last.get("type").map_or(Some("message"), Value::as_str);
    matches!(kind, Some("message" | "reasoning"))
        && matches!(last.get("status").and_then(Value::as_str), Some("in_progress" | "incomplete"))
}

/// `_construct_message_from_response_item`: one item into the messages (a new one, or merged).
fn push_item(out: &mut Vec<Message>, i: usize, item: Message) -> Result<(), String> {
    let kind = item.get("type").and_then(Value::as_str).map(str::to_owned);
    match kind.as_deref() {
        Some("function_call") => {
            let call = function_call(&item).ok_or_else(|| format!("input[{i}]: invalid function_call item"))?;
            merge_tool_call(out, call);
            return Ok(());
        }
        Some("reasoning") => {
            let text = reasoning(i, &item)?;
            merge(out, "reasoning", text.into());
            return Ok(());
        }
        Some("custom_tool_call") => return Err(format!("input[{i}]: custom tool calls are not planned by the router")),
        Some("function_call_output" | "custom_tool_call_output") => {
            out.push(tool_output(i, &item)?);
            return Ok(());
        }
        Some("message") if item.role() == Some("assistant") => {
            if let Some(text) = output_message(i, &item) {
                merge(out, "content", text?.into());
                return Ok(());
            }
        }
        _ => {}
    }
    if item.role() == Some("assistant") {
        if let Some(text) = assistant_text(i, &item)? {
            merge(out, "content", text.into());
            return Ok(());
        }
    }
    if item.entries.iter().any(|(k, _)| k == "role") {
        check_role_message(i, &item)?;
        out.push(item);
        return Ok(());
    }
    Err(format!("Unsupported input item type: {}", kind.as_deref().unwrap_or("None")))
}

/// Sets `key` on the assistant message before when it has none (vLLM's merge), else starts one.
fn merge(out: &mut Vec<Message>, key: &str, value: Value) {
    if let Some(prev) = out.last_mut().filter(|m| m.role() == Some("assistant")) {
        if unset(prev, key) {
            prev.entries.retain(|(k, _)| k != key);
            prev.entries.push((key.into(), Entry::Json(value)));
            return;
        }
    }
    out.push(Message {
        entries: vec![("role".into(), Entry::Json("assistant".into())), (key.into(), Entry::Json(value))],
    });
}

/// Python's `msg.get(key) is None`.
fn unset(m: &Message, key: &str) -> bool {
    match m.entries.iter().find(|(k, _)| k == key) {
        None | Some((_, Entry::Json(Value::Null))) => true,
        Some(_) => false,
    }
}

/// A tool call joins the assistant message before (its `tool_calls` list), else starts one.
fn merge_tool_call(out: &mut Vec<Message>, call: Value) {
    if let Some(prev) = out.last_mut().filter(|m| m.role() == Some("assistant")) {
        if unset(prev, "tool_calls") {
            prev.entries.retain(|(k, _)| k != "tool_calls");
            prev.entries.push(("tool_calls".into(), Entry::Json(Value::Array(vec![call]))));
            return;
        }
        if let Some((_, Entry::Json(Value::Array(calls)))) = prev.entries.iter_mut().find(|(k, _)| k == "tool_calls") {
            calls.push(call);
            return;
        }
    }
    let calls = Entry::Json(Value::Array(vec![call]));
    out.push(Message { entries: vec![("role".into(), Entry::Json("assistant".into())), ("tool_calls".into(), calls)] });
}

fn str_of<'m>(m: &'m Message, key: &str) -> Option<&'m str> {
    m.get(key).and_then(Value::as_str)
}

/// Optional string keys are absent, null or strings.
fn optional_str(m: &Message, key: &str) -> bool {
    matches!(m.get(key), None | Some(Value::Null | Value::String(_)))
}

fn optional_status(m: &Message) -> bool {
    matches!(m.get("status"), None | Some(Value::Null))
        || matches!(str_of(m, "status"), Some("in_progress" | "completed" | "incomplete"))
}

/// A `function_call` item as vLLM's `ResponseFunctionToolCall` parses it, as a chat tool call.
fn function_call(item: &Message) -> Option<Value> {
    let (call_id, name, arguments) = (str_of(item, "call_id")?, str_of(item, "name")?, str_of(item, "arguments")?);
    if !optional_str(item, "id") || !optional_str(item, "namespace") || !optional_status(item) {
        return None;
    }
    let name = match str_of(item, "namespace").filter(|ns| !ns.is_empty()) {
        Some(ns) => format!("{ns}__{name}"),
        None => name.to_owned(),
    };
    Some(json!({"id": call_id, "function": {"name": name, "arguments": arguments}, "type": "function"}))
}

/// A `reasoning` item's text as vLLM takes it: its first content text, else its first summary text.
fn reasoning(i: usize, item: &Message) -> Result<String, String> {
    let invalid = || format!("input[{i}]: invalid reasoning item");
    let typed = |kind: Option<&Value>, text: Option<&Value>, want: &str| match (kind, text) {
        (Some(Value::String(k)), Some(Value::String(t))) if k == want => Some(t.clone()),
        _ => None,
    };
    // The message seed parsed `summary` as plain JSON and `content` as content parts.
    let summary = match item.get("summary") {
        Some(Value::Array(list)) => list.iter().map(|p| typed(p.get("type"), p.get("text"), "summary_text")).collect(),
        _ => None,
    };
    let content = match item.content() {
        None | Some(Entry::Json(Value::Null)) => Some(Vec::new()),
        Some(Entry::Parts(parts)) => parts
            .iter()
            .map(|p| match p {
                Part::Object(f) => {
                    let get = |k: &str| f.iter().find(|(key, _)| key == k).map(|(_, v)| v);
                    typed(get("type"), get("text"), "reasoning_text")
                }
                _ => None,
            })
            .collect(),
        Some(Entry::Json(_)) => None,
    };
    let (Some(summary), Some(content)) = (summary, content) else { return Err(invalid()) };
    if !optional_str(item, "id") || !optional_str(item, "encrypted_content") || !optional_status(item) {
        return Err(invalid());
    }
    if str_of(item, "encrypted_content").is_some_and(|e| !e.is_empty()) {
        return Err("Encrypted content is not supported.".into());
    }
    let first = |list: Vec<String>| list.into_iter().next();
    Ok(first(content).or_else(|| first(summary)).unwrap_or_default())
}

/// A `function_call_output` item as a tool message.
fn tool_output(i: usize, item: &Message) -> Result<Message, String> {
    let call_id = str_of(item, "call_id").ok_or_else(|| format!("input[{i}]: call_id must be a string"))?;
    let output = match item.get("output") {
        Some(Value::String(s)) => s.clone(),
        // vLLM passes a list of parts on as the tool message's content; not reproduced here.
        Some(Value::Array(_)) => return Err(format!("input[{i}]: tool outputs made of parts are not planned")),
        _ => return Err(format!("input[{i}]: output must be a string")),
    };
    Ok(Message {
        entries: vec![
            ("role".into(), Entry::Json("tool".into())),
            ("content".into(), Entry::Json(output.into())),
            ("tool_call_id".into(), Entry::Json(call_id.into())),
        ],
    })
}

/// An assistant `message` item with a content list that vLLM's `ResponseOutputMessage` parse
/// accepts (output text and refusal parts): its first part's text. `None`: the typed parse fails and
/// vLLM reads the item as a plain dict.
fn output_message(i: usize, item: &Message) -> Option<Result<String, String>> {
    let Some(Entry::Parts(parts)) = item.content() else { return None };
    if !optional_str(item, "id")
        || !matches!(str_of(item, "status").unwrap_or("completed"), "in_progress" | "completed" | "incomplete")
    {
        return None;
    }
    let mut texts = Vec::with_capacity(parts.len());
    for part in parts {
        let Part::Object(fields) = part else { return None };
        let get = |k: &str| fields.iter().find(|(key, _)| key == k).map(|(_, v)| v);
        let text = match (get("type").and_then(Value::as_str), get("text"), get("refusal")) {
            (Some("output_text"), Some(Value::String(t)), _) => Some(t.clone()),
            (Some("refusal"), _, Some(Value::String(_))) => None,
            _ => return None,
        };
        if !matches!(get("annotations"), None | Some(Value::Array(_))) {
            return None;
        }
        texts.push(text);
    }
    Some(match texts.into_iter().next() {
        Some(Some(text)) => Ok(text),
        // vLLM reads `content[0].text`: a refusal first, or no part, fails there (a 500).
        _ => Err(format!("input[{i}]: an assistant output message must start with an output_text part")),
    })
}

/// A plain assistant message item's text as vLLM takes it (string content, or the first part's
/// `text`); `None` leaves the item as sent.
fn assistant_text(i: usize, item: &Message) -> Result<Option<String>, String> {
    let parts = match item.content() {
        Some(Entry::Json(Value::String(s))) => return Ok(Some(s.clone())),
        Some(Entry::Parts(parts)) if !parts.is_empty() => parts,
        _ => return Ok(None),
    };
    let text = match &parts[0] {
        Part::Object(fields) => match fields.iter().find(|(k, _)| k == "text").map(|(_, v)| v) {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(format!("input[{i}].content[0].text must be a string")),
        },
        Part::Image(_) | Part::Video => return Ok(None),
        Part::Json(_) => return Err(format!("input[{i}].content[0] must be an object")),
    };
    // vLLM keeps the text only: media in the list would be read by the router and not by the engine.
    if parts.iter().any(|p| matches!(p, Part::Image(_) | Part::Video)) {
        return Err(format!("input[{i}]: an assistant message's media parts are dropped by vLLM"));
    }
    Ok(Some(text))
}

/// What vLLM's schema accepts of a role message passed on as sent.
fn check_role_message(i: usize, item: &Message) -> Result<(), String> {
    if !matches!(item.role(), Some("user" | "system" | "developer" | "assistant")) {
        return Err(format!("input[{i}].role must be one of user, system, developer, assistant"));
    }
    let parts = match item.content() {
        Some(Entry::Json(Value::String(_))) => return Ok(()),
        Some(Entry::Parts(parts)) => parts,
        _ => return Err(format!("input[{i}].content must be a string or a list of parts")),
    };
    for (j, part) in parts.iter().enumerate() {
        let ok = match part {
            Part::Image(_) => true,
            Part::Object(fields) => {
                let get = |k: &str| fields.iter().find(|(key, _)| key == k).map(|(_, v)| v);
                match get("type").and_then(Value::as_str) {
                    Some("input_text") => matches!(get("text"), Some(Value::String(_))),
                    Some(t) => INPUT_PARTS.contains(&t),
                    None => false,
                }
            }
            Part::Video | Part::Json(_) => false,
        };
        if !ok {
            return Err(format!("input[{i}].content[{j}]: not an input_text, input_image or input_file part"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use serde_json::json;

    use super::super::{Endpoint, ParseError, Request};
    use super::*;

    fn parse(body: &str) -> Request<'_> {
        Request::parse(Endpoint::Responses, body.as_bytes()).unwrap()
    }

    /// Each message as plain JSON (parts as `{"type": "image"}` markers or their fields).
    fn messages(r: &Request<'_>) -> Value {
        let msgs = r.messages.as_ref().unwrap_or_else(|e| panic!("not rendered: {e}"));
        Value::Array(msgs.iter().map(message_json).collect())
    }

    fn message_json(m: &Message) -> Value {
        let entry = |e: &Entry| match e {
            Entry::Json(v) => v.clone(),
            Entry::Parts(parts) => Value::Array(
                parts
                    .iter()
                    .map(|p| match p {
                        Part::Image(_) => json!({"type": "image"}),
                        Part::Video => json!({"type": "video"}),
                        Part::Object(f) => Value::Object(f.iter().cloned().collect()),
                        Part::Json(v) => v.clone(),
                    })
                    .collect(),
            ),
        };
        Value::Object(m.entries.iter().map(|(k, e)| (k.clone(), entry(e))).collect())
    }

    fn refusal(body: &str) -> String {
        parse(body).messages.unwrap_err()
    }

    #[test]
    fn instructions_and_a_string_input_are_a_system_and_a_user_message() {
        let r = parse(r#"{"model":"m","input":"hi","instructions":"be brief","max_output_tokens":9}"#);
        assert_eq!(messages(&r), json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]));
        assert_eq!((r.str_field("model"), r.field("max_output_tokens")), (Some("m"), Some(&json!(9))));
        // Empty instructions add nothing, as in vLLM (`if request_instructions:`).
        assert_eq!(messages(&parse(r#"{"instructions":"","input":""}"#)), json!([{"role": "user", "content": ""}]));
    }

    #[test]
    fn chat_only_keys_are_not_read_from_a_responses_body() {
        let r = parse(
            r#"{"input":"x","messages":[{"role":"user","content":"y"}],"max_tokens":3,"add_generation_prompt":false,"chat_template":"{{x}}","reasoning_effort":"high"}"#,
        );
        assert_eq!(messages(&r), json!([{"role": "user", "content": "x"}]));
        for key in ["max_tokens", "add_generation_prompt", "chat_template", "reasoning_effort"] {
            assert!(r.field(key).is_none(), "{key}");
        }
        let r = parse(r#"{"input":"x","reasoning":{"effort":"low","summary":"auto"}}"#);
        assert_eq!(r.str_field("reasoning_effort"), Some("low"));
        assert!(parse(r#"{"input":"x","reasoning":{"effort":"max"}}"#).messages.is_err());
    }

    #[test]
    fn tool_calls_and_reasoning_merge_onto_the_assistant_message_before() {
        let r = parse(
            r#"{"input":[
            {"role":"user","content":"w?"},
            {"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"think"}]},
            {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Checking."}]},
            {"type":"function_call","call_id":"c1","name":"w","arguments":"{}"},
            {"type":"function_call","call_id":"c2","name":"route","namespace":"maps","arguments":"{\"a\":1}"},
            {"type":"function_call_output","call_id":"c1","output":"sun"},
            {"type":"function_call","call_id":"c3","name":"w","arguments":"{}"}]}"#,
        );
        let call = |id: &str, name: &str, args: &str| json!({"id": id, "function": {"name": name, "arguments": args}, "type": "function"});
        assert_eq!(
            messages(&r),
            json!([
                {"role": "user", "content": "w?"},
                {"role": "assistant", "reasoning": "think", "content": "Checking.",
                 "tool_calls": [call("c1", "w", "{}"), call("c2", "maps__route", "{\"a\":1}")]},
                {"role": "tool", "content": "sun", "tool_call_id": "c1"},
                {"role": "assistant", "tool_calls": [call("c3", "w", "{}")]}
            ])
        );
    }

    #[test]
    fn a_reasoning_item_takes_its_content_else_its_summary_and_never_encrypted_content() {
        let r = parse(
            r#"{"input":[{"type":"reasoning","summary":[{"type":"summary_text","text":"s"}]},{"role":"assistant","content":"a"},{"type":"reasoning","summary":[]}]}"#,
        );
        assert_eq!(
            messages(&r),
            json!([{"role": "assistant", "reasoning": "s", "content": "a"}, {"role": "assistant", "reasoning": ""}])
        );
        let encrypted = r#"{"input":[{"type":"reasoning","summary":[],"encrypted_content":"gAAA"}]}"#;
        assert_eq!(refusal(encrypted), "Encrypted content is not supported.");
        assert!(refusal(r#"{"input":[{"type":"reasoning"}]}"#).contains("invalid reasoning item"));
    }

    #[test]
    fn assistant_messages_become_their_first_text() {
        let r = parse(
            r#"{"input":[{"role":"assistant","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]},{"role":"user","content":"u"},{"type":"message","role":"assistant","status":"completed","content":[{"type":"output_text","text":"x","annotations":[]},{"type":"output_text","text":"y"}]}]}"#,
        );
        assert_eq!(
            messages(&r),
            json!([{"role": "assistant", "content": "a"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "x"}])
        );
        // vLLM fails on a refusal first (a 500): not claimed.
        let refused =
            r#"{"input":[{"type":"message","role":"assistant","content":[{"type":"refusal","refusal":"no"}]}]}"#;
        assert!(refusal(refused).contains("output_text"));
    }

    #[test]
    fn role_messages_pass_as_sent_and_others_are_vllms_400() {
        let r = parse(
            r#"{"input":[{"role":"developer","content":"d"},{"type":"message","role":"user","content":[{"type":"input_text","text":"t"}]}]}"#,
        );
        assert_eq!(
            messages(&r),
            json!([{"role": "developer", "content": "d"}, {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "t"}]}])
        );
        assert_eq!(
            refusal(r#"{"input":[{"type":"item_reference","id":"x"}]}"#),
            "Unsupported input item type: item_reference"
        );
        assert_eq!(refusal(r#"{"input":[{"id":"x"}]}"#), "Unsupported input item type: None");
        assert!(refusal(r#"{"input":[{"role":"tool","content":"x"}]}"#).contains("role"));
        assert!(refusal(r#"{"input":[{"role":"user","content":[{"type":"text","text":"x"}]}]}"#).contains("content[0]"));
        assert!(refusal(r#"{"input":[{"role":"user"}]}"#).contains("content"));
        assert!(refusal(r#"{"input":[{"role":"user","content":[{"type":"output_text","text":"x"}]}]}"#)
            .contains("content[0]"));
        assert!(refusal(r#"{"input":[{"role":"user","content":[{"type":"input_text"}]}]}"#).contains("content[0]"));
        assert!(refusal(r#"{"input":[7]}"#).contains("input[0] must be an object"));
        assert!(refusal(r#"{"input":{"role":"user"}}"#).contains("`input`"));
        assert!(refusal(r#"{"model":"m"}"#).contains("`input` is required"));
        assert!(refusal(r#"{"input":[{"type":"custom_tool_call","call_id":"c","name":"n","input":"x"}]}"#)
            .contains("custom"));
        assert!(refusal(
            r#"{"input":[{"type":"function_call_output","call_id":"c","output":[{"type":"input_text","text":"x"}]}]}"#
        )
        .contains("parts"));
        assert_eq!(Request::parse(Endpoint::Responses, b"[]").unwrap_err(), ParseError::NotAnObject);
    }

    #[test]
    fn requests_vllm_refuses_or_the_router_cannot_see_are_not_rendered() {
        let r = parse(r#"{"input":"x","previous_response_id":"resp_1"}"#);
        assert!(r.messages.is_err());
        assert_eq!(r.str_field("previous_response_id"), Some("resp_1"), "the server pins by it");
        assert!(refusal(r#"{"input":"x","prompt":{"id":"p"}}"#).contains("prompt"));
        assert!(refusal(r#"{"input":"x","background":true,"store":false}"#).contains("background"));
        assert!(parse(r#"{"input":"x","background":true}"#).messages.is_ok());
    }

    #[test]
    fn function_tools_become_chat_tools_and_others_are_dropped() {
        let r = parse(
            r#"{"input":"x","tools":[{"type":"function","name":"f","parameters":{"type":"object"},"strict":true},{"type":"web_search"},{"type":"namespace","name":"ns","tools":[{"type":"function","name":"g"}]}]}"#,
        );
        assert_eq!(
            r.field("tools").unwrap(),
            &json!([
                {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": true}},
                {"type": "function", "function": {"name": "ns__g"}}
            ])
        );
        assert_eq!(parse(r#"{"input":"x","tools":[{"type":"web_search"}]}"#).field("tools"), Some(&json!([])));
        assert!(parse(r#"{"input":"x","tools":[]}"#).field("tools").is_none());
        assert!(refusal(r#"{"input":"x","tools":[{"type":"custom","name":"c"}]}"#).contains("custom"));
        assert!(refusal(r#"{"input":"x","tools":[{"type":"function"}]}"#).contains("name"));
    }

    #[test]
    fn tool_choices_vllm_refuses_are_not_rendered() {
        let f = r#"[{"type":"function","name":"f"},{"type":"namespace","name":"a","tools":[{"type":"function","name":"g"}]},{"type":"namespace","name":"b","tools":[{"type":"function","name":"g"}]}]"#;
        let with = |choice: &str| {
            let body = format!(r#"{{"input":"x","tools":{f},"tool_choice":{choice}}}"#);
            parse(&body).messages.is_ok()
        };
        assert!(with(r#""none""#) && with(r#""required""#) && with(r#"{"type":"function","name":"f"}"#));
        assert!(with(r#"{"type":"function","name":"a__g"}"#));
        assert!(!with(r#"{"type":"function","name":"g"}"#), "ambiguous between namespaces");
        assert!(!with(r#"{"type":"function","name":"h"}"#));
        assert!(refusal(r#"{"input":"x","tool_choice":"required"}"#).contains("required"));
        assert!(refusal(r#"{"input":"x","tool_choice":{"type":"function","name":"f"}}"#).contains("not found"));
        assert!(parse(r#"{"input":"x","tool_choice":"auto"}"#).messages.is_ok());
    }

    #[test]
    fn a_final_partial_assistant_item_is_continued() {
        let r = parse(
            r#"{"input":[{"role":"user","content":"c"},{"type":"message","role":"assistant","status":"incomplete","content":[{"type":"output_text","text":"1, 2"}]}]}"#,
        );
        assert_eq!(
            (r.field("add_generation_prompt"), r.field("continue_final_message")),
            (Some(&json!(false)), Some(&json!(true)))
        );
        let r = parse(r#"{"input":[{"role":"user","content":"c","status":"in_progress"}]}"#);
        assert_eq!(r.field("continue_final_message"), Some(&json!(true)), "vLLM reads any message item's status");
        let r = parse(r#"{"input":[{"role":"assistant","content":"x","status":"completed"}]}"#);
        assert!(r.field("continue_final_message").is_none());
    }

    #[test]
    fn input_images_are_media_with_spans_and_other_media_falls_back() {
        let body = r#"{"input":[{"role":"user","content":[{"type":"input_text","text":"t"},{"type":"input_image","image_url":"data:image/png;base64,AAAA","detail":"low","uuid":"u"}]}]}"#;
        let r = parse(body);
        assert_eq!(r.images.len(), 1);
        let img = &r.images[0];
        assert!(matches!(img.url, Cow::Borrowed("data:image/png;base64,AAAA")));
        assert_eq!(&body[img.image_url_span.clone()], r#""data:image/png;base64,AAAA""#);
        assert_eq!((&body[img.uuid_span.clone().unwrap()], img.uuid.as_deref()), (r#""u""#, Some("u")));
        assert_eq!(messages(&r)[0]["content"][1], json!({"type": "image"}));
        assert!(r.media_issue.is_none() && r.body_digest().is_some());
        // `{"url": ...}` is the chat's shape: vLLM's schema refuses it here.
        let r = parse(r#"{"input":[{"role":"user","content":[{"type":"input_image","image_url":{"url":"data:x"}}]}]}"#);
        assert_eq!(
            r.media_issue.unwrap().to_string(),
            "invalid image URL: input[0].content[0].image_url: expected a string"
        );
        // A stored file: nothing to read, never a guess.
        let r =
            parse(r#"{"input":[{"role":"user","content":[{"type":"input_image","file_id":"f","detail":"auto"}]}]}"#);
        assert_eq!(r.media_issue.unwrap().label(), "invalid_url");
        let r = parse(r#"{"input":[{"role":"user","content":[{"type":"input_file","file_id":"f"}]}]}"#);
        assert_eq!(r.media_issue.unwrap().label(), "unsupported_media");
        // A chat-style image part is no image here, and vLLM's 400.
        let r = parse(r#"{"input":[{"role":"user","content":[{"type":"image_url","image_url":"data:x"}]}]}"#);
        assert!(r.images.is_empty() && r.messages.is_err());
        // An assistant message keeps only its text in vLLM: its images would be read for nothing.
        let r = parse(
            r#"{"input":[{"role":"assistant","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"data:x"}]}]}"#,
        );
        assert!(r.messages.unwrap_err().contains("media"));
    }

    #[test]
    fn a_responses_body_and_a_chat_body_of_the_same_bytes_digest_apart() {
        let body = br#"{"input":"hi","messages":[{"role":"user","content":"hi"}]}"#;
        let chat = Request::parse(Endpoint::Chat, body).unwrap().body_digest();
        let responses = Request::parse(Endpoint::Responses, body).unwrap().body_digest();
        assert!(chat.is_some() && responses.is_some() && chat != responses);
    }
}
