//! The chat-template context built from a parsed chat request, shaped the way vLLM hands it to
//! `apply_chat_template`: image parts become `{"type": "image"}` (video parts `{"type": "video"}`),
//! assistant tool-call arguments sent as JSON strings are parsed into objects, and tools are
//! normalised like vLLM's pydantic `model_dump` (`type`, then `function` with `name`,
//! `description`, `parameters` always present, then any extra keys).
//!
//! The input is the borrowed parse of [`crate::request`]: an image part is a marker there already, so
//! no data URL is ever copied or converted. Only the values the template can see (text, roles, tool
//! data) become minijinja values.

use minijinja::value::{Serde, Value};
use serde_json::Value as Json;

use super::PromptError;
use crate::request::{Entry, Message, Part};

/// `messages` as the template sees them.
pub(crate) fn messages(messages: &Result<Vec<Message>, String>) -> Result<Value, PromptError> {
    let messages = messages.as_ref().map_err(|why| PromptError::InvalidRequest(why.clone()))?;
    messages.iter().enumerate().map(|(i, m)| message(i, m)).collect::<Result<Vec<Value>, _>>().map(Value::from)
}

fn message(index: usize, msg: &Message) -> Result<Value, PromptError> {
    let is_assistant = msg.role() == Some("assistant");
    let mut pairs = Vec::with_capacity(msg.entries.len());
    for (key, entry) in &msg.entries {
        let converted = match (key.as_str(), entry) {
            (_, Entry::Parts(parts)) => Value::from(parts.iter().map(content_part).collect::<Vec<_>>()),
            ("tool_calls", Entry::Json(Json::Array(calls))) if is_assistant => Value::from(
                calls.iter().enumerate().map(|(j, c)| tool_call(index, j, c)).collect::<Result<Vec<_>, _>>()?,
            ),
            (_, Entry::Json(value)) => Value::from(Serde(value)),
        };
        pairs.push((key.as_str(), converted));
    }
    Ok(Value::from_pairs(pairs))
}

fn content_part(part: &Part) -> Value {
    match part {
        Part::Image(_) => Value::from_pairs([("type", "image")]),
        Part::Video => Value::from_pairs([("type", "video")]),
        Part::Object(fields) => Value::from_pairs(fields.iter().map(|(k, v)| (k.as_str(), Value::from(Serde(v))))),
        Part::Json(v) => Value::from(Serde(v)),
    }
}

/// vLLM parses `function.arguments` (a JSON string on the wire) into an object; empty → `{}`.
fn tool_call(msg: usize, index: usize, call: &Json) -> Result<Value, PromptError> {
    let Some(obj) = call.as_object() else {
        return Ok(Value::from(Serde(call)));
    };
    let mut pairs = Vec::with_capacity(obj.len());
    for (key, value) in obj {
        let converted = match (key.as_str(), value) {
            ("function", Json::Object(func)) => {
                let mut fpairs = Vec::with_capacity(func.len());
                for (fk, fv) in func {
                    let fv = match (fk.as_str(), fv) {
                        ("arguments", Json::String(s)) if !s.is_empty() => {
                            let parsed: Json = serde_json::from_str(s).map_err(|e| {
                                PromptError::InvalidRequest(format!(
                                    "messages[{msg}].tool_calls[{index}].function.arguments is not JSON: {e}"
                                ))
                            })?;
                            Value::from(Serde(&parsed))
                        }
                        ("arguments", Json::String(_) | Json::Null) => {
                            Value::from(Serde(&Json::Object(Default::default())))
                        }
                        _ => Value::from(Serde(fv)),
                    };
                    fpairs.push((fk.as_str(), fv));
                }
                Value::from_pairs(fpairs)
            }
            _ => Value::from(Serde(value)),
        };
        pairs.push((key.as_str(), converted));
    }
    Ok(Value::from_pairs(pairs))
}

/// `tools` as vLLM's `ChatCompletionToolsParam.model_dump()` produces them.
pub(crate) fn tools(tools: &Json) -> Result<Value, PromptError> {
    let list = tools.as_array().ok_or_else(|| PromptError::InvalidRequest("`tools` must be an array".into()))?;
    Ok(Value::from(list.iter().map(tool).collect::<Vec<_>>()))
}

fn tool(tool: &Json) -> Value {
    let (Some(obj), Some(func)) = (tool.as_object(), tool.get("function").and_then(Json::as_object)) else {
        return Value::from(Serde(tool));
    };
    const DECLARED: [&str; 3] = ["name", "description", "parameters"];
    let mut fpairs: Vec<(&str, Value)> =
        DECLARED.iter().map(|k| (*k, func.get(*k).map_or(Value::from(()), |v| Value::from(Serde(v))))).collect();
    fpairs.extend(
        func.iter().filter(|(k, _)| !DECLARED.contains(&k.as_str())).map(|(k, v)| (k.as_str(), Value::from(Serde(v)))),
    );
    let kind = obj.get("type").map_or(Value::from("function"), |v| Value::from(Serde(v)));
    let mut pairs = vec![("type", kind), ("function", Value::from_pairs(fpairs))];
    pairs.extend(
        obj.iter()
            .filter(|(k, _)| k.as_str() != "type" && k.as_str() != "function")
            .map(|(k, v)| (k.as_str(), Value::from(Serde(v)))),
    );
    Value::from_pairs(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{Endpoint, Request};

    fn render(body: &[u8]) -> Result<Value, PromptError> {
        messages(&Request::parse(Endpoint::Chat, body).unwrap().messages)
    }

    #[test]
    fn image_parts_become_bare_markers() {
        let body = br#"{"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}, "uuid": "x"},
            {"image": "data:..."},
            {"type": "text", "text": "hi"},
            {"type": "video_url", "video_url": {"url": "v"}}
        ]}]}"#;
        let msgs = render(body).unwrap();
        let rendered = format!("{msgs:?}");
        assert!(!rendered.contains("base64"), "{rendered}");
        let content = msgs.get_item(&Value::from(0)).unwrap().get_attr("content").unwrap();
        let kinds: Vec<String> = content.try_iter().unwrap().map(|p| p.get_attr("type").unwrap().to_string()).collect();
        assert_eq!(kinds, ["image", "image", "text", "video"]);
    }

    #[test]
    fn bad_tool_arguments_are_invalid_request() {
        let body = br#"{"messages": [{"role": "assistant", "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]}"#;
        let err = render(body).unwrap_err();
        assert_eq!(err.label(), "invalid_request");
        assert!(err.to_string().contains("tool_calls[0].function.arguments"), "{err}");
    }

    #[test]
    fn messages_must_be_an_array() {
        let err = render(br#"{"messages": "hi"}"#).unwrap_err();
        assert_eq!(err.label(), "invalid_request");
    }
}
