//! The conversation a chat template sees, built from the parsed request the way vLLM builds it before
//! `apply_chat_template` (vLLM 0.34 `renderers/chat_utils/chat_message.py`; transformers 5.22 for the
//! reasoning aliases):
//!
//! * content `None`/missing → no parts; a string → one text part; text-like parts (`text`,
//!   `input_text`, `output_text`, `refusal`, `thinking`) → `{"type": "text", "text": …}` (a `null`
//!   value is skipped); image and video parts → `{"type": "image"}` / `{"type": "video"}`, their URL
//!   never reaching the template;
//! * **openai** content format: content stays a list of those parts; **string** format: the non-empty
//!   texts joined by `"\n"`, with every image's placeholder string in front (each followed by `"\n"`),
//!   less the placeholders the user already typed;
//! * the message is rebuilt key by key — `role`, `content`, then `tool_calls` (arguments parsed from
//!   JSON strings; invalid or non-object JSON becomes `{}`), `reasoning`/`reasoning_content`
//!   (assistant), `tool_call_id` (tool), `name`, `task`; other keys are dropped, as vLLM's schema
//!   drops them;
//! * `tool` messages whose parts are all text are joined by `"\n"`;
//! * `developer` messages become `system` when the template never mentions `developer`, and all system
//!   messages are merged into one at the front when needed.
//!
//! What vLLM answers with a 400 is a [`PromptError::InvalidRequest`] (the router forwards the request
//! unchanged and routes it by load; the worker gives the client its error).

use minijinja::value::{Serde, Value};
use serde_json::{Map, Value as Json};

use super::format::ContentFormat;
use super::PromptError;
use crate::request::{Entry, Message, Part};

/// How a conversation is shaped for one template.
pub(crate) struct Shape<'a> {
    pub format: ContentFormat,
    /// The string-format placeholder of the n-th image of the request (1-based), if the model has one.
    pub placeholder: Option<&'a dyn Fn(usize) -> String>,
    /// The template text mentions `developer` (then developer messages are kept as they are).
    pub knows_developer: bool,
}

/// One normalised content part.
#[derive(Debug, Clone, PartialEq)]
enum Item {
    Text(String),
    Image,
    Video,
}

/// One normalised message, keys in vLLM's order.
struct Msg {
    role: String,
    content: Content,
    extra: Vec<(&'static str, Json)>,
}

enum Content {
    Parts(Vec<Item>),
    Text(String),
}

fn invalid(why: String) -> PromptError {
    PromptError::InvalidRequest(why)
}

/// `messages` as the template sees them. `continue_tag` (transformers' `continue_final_message`
/// marker) is appended to the final message's text.
pub(crate) fn messages(
    messages: &Result<Vec<Message>, String>,
    shape: &Shape<'_>,
    continue_tag: Option<&str>,
) -> Result<Value, PromptError> {
    let messages = messages.as_ref().map_err(|why| invalid(why.clone()))?;
    messages_of(messages.iter(), shape, continue_tag)
}

/// [`messages`] for some of a request's messages (a conversation's stub and new turns, see `resume`).
pub(crate) fn messages_of<'m>(
    messages: impl ExactSizeIterator<Item = &'m Message>,
    shape: &Shape<'_>,
    continue_tag: Option<&str>,
) -> Result<Value, PromptError> {
    if messages.len() == 0 {
        return Err(invalid("Cannot apply chat template to an empty conversation".into()));
    }
    let mut images_seen = 0;
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.enumerate() {
        out.push(message(i, m, shape, &mut images_seen)?);
    }
    if !shape.knows_developer && out.iter().any(|m| m.role == "developer") {
        out = merge_system(out);
    }
    if let (Some(tag), Some(last)) = (continue_tag, out.last_mut()) {
        append_tag(&mut last.content, tag)?;
    }
    Ok(Value::from(out.into_iter().map(to_value).collect::<Vec<_>>()))
}

fn message(i: usize, m: &Message, shape: &Shape<'_>, images_seen: &mut usize) -> Result<Msg, PromptError> {
    let role = match m.get("role") {
        Some(Json::String(r)) => r.clone(),
        _ => return Err(invalid(format!("messages[{i}].role must be a string"))),
    };
    let items = items(i, &role, m)?;
    let mut content = match shape.format {
        ContentFormat::OpenAi => Content::Parts(items),
        ContentFormat::String => Content::Text(flatten(i, &items, shape, images_seen)?),
    };
    if role == "tool" {
        // A tool result made of text parts only reaches the template as one string.
        if let Content::Parts(parts) = &content {
            if let Some(texts) = parts
                .iter()
                .map(|p| if let Item::Text(t) = p { Some(t.as_str()) } else { None })
                .collect::<Option<Vec<_>>>()
            {
                content = Content::Text(texts.join("\n"));
            }
        }
    }
    let mut extra = Vec::new();
    if role == "assistant" {
        if let Some(calls) = m.get("tool_calls").filter(|v| !v.is_null()) {
            let calls = tool_calls(i, calls)?;
            if !calls.is_empty() {
                extra.push(("tool_calls", Json::Array(calls)));
            }
        }
        let reasoning =
            m.get("reasoning").filter(|v| !v.is_null()).or_else(|| m.get("reasoning_content")).filter(|v| !v.is_null());
        if let Some(r) = reasoning {
            extra.push(("reasoning", r.clone()));
            extra.push(("reasoning_content", r.clone()));
        }
    }
    if role == "tool" {
        if let Some(id) = m.get("tool_call_id") {
            extra.push(("tool_call_id", id.clone()));
        }
    }
    for key in ["name", "task"] {
        if let Some(v @ Json::String(_)) = m.get(key) {
            extra.push((key, v.clone()));
        }
    }
    if role == "developer" {
        extra.push(("tools", m.get("tools").cloned().unwrap_or(Json::Null)));
    }
    Ok(Msg { role, content, extra })
}

/// The parts of a message's content, normalised (§4.1–4.2 of vLLM's parser).
fn items(i: usize, role: &str, m: &Message) -> Result<Vec<Item>, PromptError> {
    let parts = match m.content() {
        // vLLM's request schema allows `null` content on assistant messages only (a tool-call turn);
        // every other role's `null` is a 400 there, so no ids could be right here.
        Some(Entry::Json(Json::Null)) if role != "assistant" => {
            return Err(invalid(format!("messages[{i}].content is null (allowed on assistant messages only)")))
        }
        None | Some(Entry::Json(Json::Null)) => return Ok(Vec::new()),
        Some(Entry::Json(Json::String(s))) => return Ok(vec![Item::Text(s.clone())]),
        Some(Entry::Json(_)) => {
            return Err(invalid(format!("messages[{i}].content must be a string or a list of parts")))
        }
        Some(Entry::Parts(parts)) => parts,
    };
    let mut out = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        let item = match part {
            Part::Image(_) => Some(Item::Image),
            Part::Video => Some(Item::Video),
            Part::Json(Json::String(s)) => Some(Item::Text(s.clone())),
            Part::Json(_) => return Err(invalid(format!("messages[{i}].content[{j}] must be an object or a string"))),
            Part::Object(fields) => text_part(i, j, fields)?,
        };
        out.extend(item);
    }
    Ok(out)
}

/// A text-like part's text (`None` when its value is null: vLLM skips it).
fn text_part(i: usize, j: usize, fields: &[(String, Json)]) -> Result<Option<Item>, PromptError> {
    let get = |k: &str| fields.iter().find(|(key, _)| key == k).map(|(_, v)| v);
    let key = match get("type") {
        None => return Err(invalid(format!("messages[{i}].content[{j}]: Missing 'type' field in multimodal part"))),
        Some(Json::String(t)) => match t.as_str() {
            "text" | "input_text" | "output_text" => "text",
            "refusal" => "refusal",
            "thinking" => "thinking",
            other => {
                return Err(invalid(format!("messages[{i}].content[{j}]: Unsupported chat content part type: {other}")))
            }
        },
        Some(_) => return Err(invalid(format!("messages[{i}].content[{j}]: Invalid 'type' field"))),
    };
    match get(key) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(Item::Text(s.clone()))),
        Some(_) => Err(invalid(format!("messages[{i}].content[{j}].{key} must be a string"))),
    }
}

/// String content format: texts joined by "\n", the images' placeholders in front.
fn flatten(i: usize, items: &[Item], shape: &Shape<'_>, images_seen: &mut usize) -> Result<String, PromptError> {
    let texts: Vec<&str> = items
        .iter()
        .filter_map(|p| if let Item::Text(t) = p { Some(t.as_str()) } else { None })
        .filter(|t| !t.is_empty())
        .collect();
    let text = texts.join("\n");
    let mut wanted: Vec<String> = Vec::new();
    for item in items {
        if *item == Item::Image {
            *images_seen += 1;
            if let Some(p) = shape.placeholder {
                wanted.push(p(*images_seen));
            }
        }
    }
    // Placeholders the user typed count as present; more than there are images is vLLM's 400.
    let mut missing = Vec::new();
    let mut distinct: Vec<&String> = Vec::new();
    for p in &wanted {
        if !distinct.contains(&p) {
            distinct.push(p);
        }
    }
    for p in distinct {
        let want = wanted.iter().filter(|w| *w == p).count();
        let typed = text.matches(p.as_str()).count();
        if typed > want {
            return Err(invalid(format!(
                "messages[{i}]: Found more '{p}' placeholders in input prompt than actual multimodal data items"
            )));
        }
        missing.extend(std::iter::repeat_n(p.clone(), want - typed));
    }
    if !text.is_empty() {
        missing.push(text);
    }
    Ok(missing.join("\n"))
}

/// vLLM's post-processing of assistant tool calls: objects of type function, arguments as objects.
fn tool_calls(i: usize, calls: &Json) -> Result<Vec<Json>, PromptError> {
    let Json::Array(calls) = calls else {
        return Err(invalid(format!("messages[{i}].tool_calls must be a list")));
    };
    calls
        .iter()
        .enumerate()
        .map(|(j, call)| {
            let bad = || invalid(format!("messages[{i}].tool_calls[{j}]: chat completions only support assistant tool_calls of type 'function'"));
            let Json::Object(call) = call else { return Err(bad()) };
            if call.get("type").is_some_and(|t| t.as_str() != Some("function")) {
                return Err(bad());
            }
            let Some(Json::Object(function)) = call.get("function") else { return Err(bad()) };
            // The schema's order: id, function {arguments, name}, type.
            let mut f = Map::new();
            f.insert("arguments".into(), arguments(function.get("arguments")));
            if let Some(name) = function.get("name") {
                f.insert("name".into(), name.clone());
            }
            let mut out = Map::new();
            if let Some(id) = call.get("id") {
                out.insert("id".into(), id.clone());
            }
            out.insert("function".into(), Json::Object(f));
            out.insert("type".into(), Json::from("function"));
            Ok(Json::Object(out))
        })
        .collect()
}

/// `function.arguments`: an object stays; a JSON string is parsed; anything else (empty, invalid JSON,
/// JSON that is not an object) becomes `{}` — vLLM only logs a warning for those.
fn arguments(v: Option<&Json>) -> Json {
    match v {
        Some(obj @ Json::Object(_)) => obj.clone(),
        Some(Json::String(s)) => match serde_json::from_str::<Json>(s) {
            Ok(obj @ Json::Object(_)) => obj,
            _ => Json::Object(Map::new()),
        },
        _ => Json::Object(Map::new()),
    }
}

/// Developer messages become system messages; several (or a late) system message merge into one at the
/// front, their texts joined by a blank line.
fn merge_system(messages: Vec<Msg>) -> Vec<Msg> {
    let mut messages: Vec<Msg> = messages
        .into_iter()
        .map(|mut m| {
            if m.role == "developer" {
                m.role = "system".into();
                m.extra.retain(|(k, _)| *k != "tools");
            }
            m
        })
        .collect();
    let systems = messages.iter().filter(|m| m.role == "system").count();
    let first_is_system = messages.first().is_some_and(|m| m.role == "system");
    if systems == 0 || (systems == 1 && first_is_system) {
        return messages;
    }
    let texts: Vec<String> = messages
        .iter()
        .filter(|m| m.role == "system")
        .map(|m| content_text(&m.content))
        .filter(|t| !t.is_empty())
        .collect();
    messages.retain(|m| m.role != "system");
    let merged = Msg { role: "system".into(), content: Content::Text(texts.join("\n\n")), extra: Vec::new() };
    messages.insert(0, merged);
    messages
}

/// Appends the marker to the text of a content string, or to its last text part.
fn append_tag(content: &mut Content, tag: &str) -> Result<(), PromptError> {
    let text = match content {
        Content::Text(t) => Some(t),
        Content::Parts(parts) => {
            parts.iter_mut().rev().find_map(|p| if let Item::Text(t) = p { Some(t) } else { None })
        }
    };
    let text = text.ok_or_else(|| invalid("continue_final_message: the final message has no text part".into()))?;
    text.push_str(tag);
    Ok(())
}

fn content_text(c: &Content) -> String {
    match c {
        Content::Text(t) => t.clone(),
        Content::Parts(parts) => parts
            .iter()
            .filter_map(|p| if let Item::Text(t) = p { Some(t.as_str()) } else { None })
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

/// The message as a template value. transformers adds a `thinking` key first (and keeps
/// `reasoning_content`) to a message with reasoning.
fn to_value(m: Msg) -> Value {
    let mut pairs: Vec<(&str, Value)> = Vec::with_capacity(m.extra.len() + 3);
    let reasoning = m.extra.iter().find(|(k, _)| *k == "reasoning_content").map(|(_, v)| v.clone());
    if let Some(r) = &reasoning {
        pairs.push(("thinking", Value::from(Serde(r))));
    }
    pairs.push(("role", Value::from(m.role.as_str())));
    let content = match &m.content {
        Content::Text(t) => Value::from(t.as_str()),
        Content::Parts(parts) => Value::from(parts.iter().map(item_value).collect::<Vec<_>>()),
    };
    pairs.push(("content", content));
    for (k, v) in &m.extra {
        pairs.push((k, Value::from(Serde(v))));
    }
    Value::from_pairs(pairs)
}

fn item_value(item: &Item) -> Value {
    match item {
        Item::Text(t) => Value::from_pairs([("type", Value::from("text")), ("text", Value::from(t.as_str()))]),
        Item::Image => Value::from_pairs([("type", "image")]),
        Item::Video => Value::from_pairs([("type", "video")]),
    }
}

/// `tools` as vLLM's `ChatCompletionToolsParam.model_dump()` produces them: `type`, then `function`
/// with `name`, `description`, `parameters` always present (null when absent) and `strict` /
/// `defer_loading` only when set; unknown keys dropped.
pub(crate) fn tools(tools: &Json) -> Result<Value, PromptError> {
    let list = tools.as_array().ok_or_else(|| invalid("`tools` must be an array".into()))?;
    list.iter()
        .enumerate()
        .map(|(i, tool)| {
            let func = tool
                .get("function")
                .and_then(Json::as_object)
                .ok_or_else(|| invalid(format!("tools[{i}].function must be an object")))?;
            let mut f: Vec<(&str, Value)> = ["name", "description", "parameters"]
                .iter()
                .map(|k| (*k, func.get(*k).map_or(Value::from(()), |v| Value::from(Serde(v)))))
                .collect();
            for k in ["strict", "defer_loading"] {
                if let Some(v) = func.get(k).filter(|v| !v.is_null()) {
                    f.push((k, Value::from(Serde(v))));
                }
            }
            let mut pairs = vec![("type", Value::from("function")), ("function", Value::from_pairs(f))];
            if let Some(v) = tool.get("defer_loading").filter(|v| !v.is_null()) {
                pairs.push(("defer_loading", Value::from(Serde(v))));
            }
            Ok(Value::from_pairs(pairs))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Value::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{Endpoint, Request};
    use serde_json::json;

    fn render(body: &str, format: ContentFormat) -> Result<Json, PromptError> {
        let req = Request::parse(Endpoint::Chat, body.as_bytes()).unwrap();
        let qwen = |_: usize| "<|vision_start|><|image_pad|><|vision_end|>".to_owned();
        let shape = Shape { format, placeholder: Some(&qwen), knows_developer: false };
        messages(&req.messages, &shape, None).map(|v| serde_json::to_value(&v).unwrap())
    }

    #[test]
    fn string_content_is_one_text_part_in_openai_format() {
        let body = r#"{"messages":[{"role":"assistant","content":"","tool_calls":[{"type":"function","id":"c1","function":{"name":"f","arguments":"{\"a\": 1}"}}]}]}"#;
        let call = json!({"id": "c1", "function": {"arguments": {"a": 1}, "name": "f"}, "type": "function"});
        let want = json!([{"role": "assistant", "content": [{"type": "text", "text": ""}], "tool_calls": [call]}]);
        assert_eq!(render(body, ContentFormat::OpenAi).unwrap(), want);
        // key order is part of what the template sees (e.g. through tojson)
        let v = render(body, ContentFormat::OpenAi).unwrap();
        let keys: Vec<&String> = v[0]["tool_calls"][0].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["id", "function", "type"]);
    }

    #[test]
    fn string_format_puts_placeholders_first_and_joins_texts() {
        let body = r#"{"messages":[{"role":"user","content":[{"type":"text","text":"A"},{"type":"image_url","image_url":"data:x"},{"type":"text","text":""},{"type":"text","text":"B"}]}]}"#;
        let v = render(body, ContentFormat::String).unwrap();
        assert_eq!(v[0]["content"], "<|vision_start|><|image_pad|><|vision_end|>\nA\nB");
        // a typed placeholder consumes one image's; more typed than images is vLLM's 400
        let typed = r#"{"messages":[{"role":"user","content":[{"type":"text","text":"<|vision_start|><|image_pad|><|vision_end|> x <|vision_start|><|image_pad|><|vision_end|>"},{"type":"image_url","image_url":"data:x"}]}]}"#;
        assert_eq!(render(typed, ContentFormat::String).unwrap_err().label(), "invalid_request");
    }

    #[test]
    fn bad_tool_arguments_become_an_empty_object() {
        let body = r#"{"messages":[{"role":"assistant","tool_calls":[{"id":"x","type":"function","function":{"name":"f","arguments":"{not json"}}]}]}"#;
        let v = render(body, ContentFormat::OpenAi).unwrap();
        assert_eq!(v[0]["tool_calls"][0]["function"]["arguments"], json!({}));
        assert_eq!(v[0]["content"], json!([]));
        let err = render(
            r#"{"messages":[{"role":"assistant","tool_calls":[{"type":"custom","function":{}}]}]}"#,
            ContentFormat::OpenAi,
        )
        .unwrap_err();
        assert_eq!(err.label(), "invalid_request");
    }

    #[test]
    fn unknown_keys_are_dropped_and_reasoning_aliased() {
        let body = r#"{"messages":[{"role":"assistant","content":"4","reasoning_content":"add","foo":1}]}"#;
        let v = render(body, ContentFormat::String).unwrap();
        let keys: Vec<&String> = v[0].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["thinking", "role", "content", "reasoning", "reasoning_content"]);
        assert_eq!(v[0]["thinking"], "add");
    }

    #[test]
    fn tool_results_of_text_parts_are_joined() {
        let body = r#"{"messages":[{"role":"tool","tool_call_id":"c1","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}"#;
        assert_eq!(
            render(body, ContentFormat::OpenAi).unwrap(),
            json!([{"role": "tool", "content": "a\nb", "tool_call_id": "c1"}])
        );
    }

    #[test]
    fn developer_becomes_system_and_systems_merge_to_the_front() {
        let body = r#"{"messages":[{"role":"user","content":"hi"},{"role":"developer","content":"be brief"},{"role":"system","content":"in French"}]}"#;
        let want = json!([{"role": "system", "content": "be brief\n\nin French"}, {"role": "user", "content": "hi"}]);
        assert_eq!(render(body, ContentFormat::String).unwrap(), want);
    }

    #[test]
    fn vllm_rejections_are_invalid_requests() {
        for body in [
            r#"{"messages":[]}"#,
            r#"{"messages":[{"content":"no role"}]}"#,
            r#"{"messages":[{"role":"user","content":[{"type":"mystery","x":1}]}]}"#,
            r#"{"messages":[{"role":"user","content":[{"text":"untyped"}]}]}"#,
            r#"{"messages":[{"role":"user","content":5}]}"#,
        ] {
            assert_eq!(render(body, ContentFormat::OpenAi).unwrap_err().label(), "invalid_request", "{body}");
        }
    }
}
