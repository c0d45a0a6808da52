//! What a completion request asks of its answer besides the prompt — `messages` present, `n`,
//! `logprobs`/`top_logprobs`, `stream_options`, `tools`/`tool_choice`, `response_format` — read and
//! refused where vLLM's OpenAI server refuses them (its `ChatCompletionRequest` validators and sampling
//! checks), so a client sees through a proxy what it would see from a real worker.
//!
//! The simulated model is deterministic. With `tools`:
//! - `tool_choice` `"none"`: text;
//! - `"auto"` (the default with tools): a call to the first tool (in `tools` order) whose name the last
//!   user message contains (case-insensitive), else text;
//! - `"required"`: that tool, else the first one;
//! - a named function: that function.
//!
//! The arguments are an instance of the tool's `parameters` schema ([`crate::schema`]). As in vLLM, a
//! call chosen by `"auto"`/`"required"` finishes with `"tool_calls"` and a named one with `"stop"`.

use serde_json::Value;

use crate::error::SimError;
use crate::schema;

/// vLLM's default `--max-logprobs`.
pub(crate) const MAX_LOGPROBS: i64 = 20;
/// The sim's own bound on `n` (vLLM has none): each choice is generated and held in memory.
pub(crate) const MAX_CHOICES: u64 = 128;

/// The endpoint's request flavour, as the checks differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flavour {
    Chat,
    Completion,
}

/// What the answer must hold.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Params {
    /// Choices to generate (`n`).
    pub n: u32,
    /// `Some(k)`: every token with its logprob and `k` alternatives.
    pub logprobs: Option<u32>,
    pub output: Output,
}

/// What each choice says.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Output {
    /// The deterministic word sequence.
    Text,
    /// This JSON text (`response_format` `json_object` / `json_schema`).
    Json(String),
    /// A call of one of the request's tools.
    Tool(ToolCall),
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ToolCall {
    pub name: String,
    /// The arguments as the JSON text OpenAI carries them in.
    pub arguments: String,
    /// `"tool_calls"` for a call chosen by the model, `"stop"` for a named one (vLLM's rule).
    pub finish_reason: &'static str,
    /// The message's `content` beside the call: `null` after `"auto"` (the parser found no text), `""`
    /// otherwise (vLLM's guided call leaves an empty string).
    pub content: Value,
}

impl Params {
    /// Reads `body`'s answer fields, refusing what vLLM refuses with its message and `param`.
    pub(crate) fn read(flavour: Flavour, body: &Value) -> Result<Params, SimError> {
        if flavour == Flavour::Chat {
            check_messages(body)?;
        }
        check_stream_options(body)?;
        let n = read_n(body)?;
        let logprobs = match flavour {
            Flavour::Chat => chat_logprobs(body)?,
            Flavour::Completion => completion_logprobs(body)?,
        };
        let tool = if flavour == Flavour::Chat { tool_call(body)? } else { None };
        let json = json_output(body)?;
        let output = match (tool, json) {
            (Some(call), _) => Output::Tool(call),
            (None, Some(text)) => Output::Json(text),
            (None, None) => Output::Text,
        };
        Ok(Params { n, logprobs, output })
    }
}

fn bad(message: impl Into<String>, param: &'static str) -> SimError {
    SimError::BadRequest { message: message.into(), param: Some(param) }
}

/// Absent or not a list: pydantic's refusal. Empty: the chat template reads the first message, and
/// vLLM answers the template's error with 400.
fn check_messages(body: &Value) -> Result<(), SimError> {
    match body.get("messages") {
        None | Some(Value::Null) => Err(bad("Field required", "messages")),
        Some(Value::Array(m)) if m.is_empty() => {
            Err(bad("`messages` must hold at least one message: the chat template reads the first", "messages"))
        }
        Some(Value::Array(_)) => Ok(()),
        Some(_) => Err(bad("Input should be a valid list", "messages")),
    }
}

fn check_stream_options(body: &Value) -> Result<(), SimError> {
    let options = body.get("stream_options").is_some_and(truthy);
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    if options && !stream {
        return Err(bad("Stream options can only be defined when `stream=True`.", "stream_options"));
    }
    Ok(())
}

/// Python truthiness of a JSON value (vLLM's validators test `data.get(...)`).
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

fn read_n(body: &Value) -> Result<u32, SimError> {
    let n = match body.get("n") {
        None | Some(Value::Null) => return Ok(1),
        Some(v) => v.as_i64().ok_or_else(|| bad("Input should be a valid integer", "n"))?,
    };
    if n < 1 {
        return Err(bad(format!("n must be at least 1, got {n}."), "n"));
    }
    if n as u64 > MAX_CHOICES {
        return Err(bad(format!("the simulator generates at most {MAX_CHOICES} choices, got n={n}"), "n"));
    }
    Ok(n as u32)
}

/// Chat: `logprobs` a boolean, `top_logprobs` alternatives per token (only with `logprobs`).
fn chat_logprobs(body: &Value) -> Result<Option<u32>, SimError> {
    let on = match body.get("logprobs") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("Input should be a valid boolean", "logprobs")),
    };
    let top = match body.get("top_logprobs") {
        None | Some(Value::Null) => 0,
        Some(v) => v.as_i64().ok_or_else(|| bad("`top_logprobs` must be an integer.", "top_logprobs"))?,
    };
    if top < -1 {
        return Err(bad("`top_logprobs` must be a positive value or -1.", "top_logprobs"));
    }
    if top != 0 && !on {
        return Err(bad("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs"));
    }
    if !on {
        return Ok(None);
    }
    within_max(top, "top_logprobs").map(Some)
}

/// Completions: `logprobs` is the number of alternatives per token.
fn completion_logprobs(body: &Value) -> Result<Option<u32>, SimError> {
    let k = match body.get("logprobs") {
        None | Some(Value::Null) => return Ok(None),
        Some(v) => v.as_i64().ok_or_else(|| bad("Input should be a valid integer", "logprobs"))?,
    };
    if k < -1 {
        return Err(bad("`logprobs` must be a positive value or -1.", "logprobs"));
    }
    within_max(k, "logprobs").map(Some)
}

/// vLLM's engine refuses more alternatives than `--max-logprobs` (-1: the whole vocabulary).
fn within_max(k: i64, param: &'static str) -> Result<u32, SimError> {
    if k == -1 || k > MAX_LOGPROBS {
        let asked = if k == -1 { "-1 (the whole vocabulary)".to_owned() } else { k.to_string() };
        return Err(bad(
            format!("Requested sample logprobs of {asked}, which is greater than max allowed: {MAX_LOGPROBS}"),
            param,
        ));
    }
    Ok(k as u32)
}

/// The tool call the simulated model makes, if any, after vLLM's `check_tool_usage`.
fn tool_call(body: &Value) -> Result<Option<ToolCall>, SimError> {
    let tools = match body.get("tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(t)) if t.is_empty() => {
            return Err(bad(
                "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely.",
                "tools",
            ))
        }
        Some(Value::Array(t)) => Some(functions(t)?),
        Some(_) => return Err(bad("Input should be a valid list", "tools")),
    };
    let choice = match body.get("tool_choice") {
        None if tools.is_some() => &Value::String("auto".to_owned()),
        None | Some(Value::Null) => return Ok(None),
        Some(c) => c,
    };
    if choice == "none" {
        return Ok(None);
    }
    let Some(tools) = tools else {
        return Err(bad("When using `tool_choice`, `tools` must be set.", "tool_choice"));
    };
    let mentioned = mentioned_tool(body, &tools);
    let (tool, finish_reason, content) = match choice {
        Value::String(s) if s == "auto" => match mentioned {
            Some(t) => (t, "tool_calls", Value::Null),
            None => return Ok(None),
        },
        Value::String(s) if s == "required" => (mentioned.unwrap_or(tools[0]), "tool_calls", Value::from("")),
        Value::Object(_) => (named(choice, &tools)?, "stop", Value::from("")),
        other => {
            return Err(bad(
                format!(
                    "Invalid value for `tool_choice`: {other}! Only named tools, \"none\", \"auto\" or \"required\" are supported."
                ),
                "tool_choice",
            ))
        }
    };
    Ok(Some(ToolCall { name: tool.name.to_owned(), arguments: arguments(tool.parameters), finish_reason, content }))
}

/// One `tools` entry: its function's name and parameter schema.
#[derive(Clone, Copy)]
struct Function<'a> {
    name: &'a str,
    parameters: Option<&'a Value>,
}

fn functions(tools: &[Value]) -> Result<Vec<Function<'_>>, SimError> {
    tools
        .iter()
        .map(|t| {
            let f = t.get("function").filter(|f| f.is_object()).ok_or_else(|| bad("Field required", "tools"))?;
            let name = f.get("name").and_then(Value::as_str).ok_or_else(|| bad("Field required", "tools"))?;
            Ok(Function { name, parameters: f.get("parameters") })
        })
        .collect()
}

const CORRECT_USAGE: &str = "Correct usage: `{\"type\": \"function\", \"function\": {\"name\": \"my_function\"}}`";

/// The function a named `tool_choice` picks, which must be one of `tools`.
fn named<'a>(choice: &Value, tools: &[Function<'a>]) -> Result<Function<'a>, SimError> {
    let Some(function) = choice.get("function").filter(|f| f.is_object()) else {
        let shown = choice.get("function").map_or("None".to_owned(), Value::to_string);
        return Err(bad(
            format!("Invalid value for `function`: `{shown}` in `tool_choice`! {CORRECT_USAGE}"),
            "tool_choice.function",
        ));
    };
    let name = match function.get("name") {
        None => {
            return Err(bad(
                format!("Expected field `name` in `function` in `tool_choice`! {CORRECT_USAGE}"),
                "tool_choice.function.name",
            ))
        }
        Some(Value::String(s)) if !s.is_empty() => s.as_str(),
        Some(other) => {
            return Err(bad(
                format!("Invalid `name` in `function`: `{other}` in `tool_choice`! {CORRECT_USAGE}"),
                "tool_choice.function.name",
            ))
        }
    };
    tools.iter().copied().find(|t| t.name == name).ok_or_else(|| {
        bad("The tool specified in `tool_choice` does not match any of the specified `tools`", "tool_choice")
    })
}

/// The first tool (in `tools` order) whose name the last user message contains.
fn mentioned_tool<'a>(body: &Value, tools: &[Function<'a>]) -> Option<Function<'a>> {
    let text = last_user_text(body).to_lowercase();
    tools.iter().copied().find(|t| !t.name.is_empty() && text.contains(&t.name.to_lowercase()))
}

fn last_user_text(body: &Value) -> String {
    let messages = body.get("messages").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let Some(last) = messages.iter().rev().find(|m| m.get("role").and_then(Value::as_str) == Some("user")) else {
        return String::new();
    };
    match last.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join(" ")
        }
        _ => String::new(),
    }
}

fn arguments(parameters: Option<&Value>) -> String {
    let value = parameters.map_or_else(|| Value::Object(Default::default()), schema::instance);
    value.to_string()
}

/// `response_format`: `json_object` and `json_schema` answer JSON; `text` (and vLLM's
/// `structural_tag`, whose grammar the sim does not follow) answer text.
fn json_output(body: &Value) -> Result<Option<String>, SimError> {
    let format = match body.get("response_format") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(f)) => f,
        Some(_) => return Err(bad("Input should be a valid dictionary or object", "response_format")),
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text" | "structural_tag") => Ok(None),
        Some("json_object") => Ok(Some(r#"{"answer": "The quick brown fox"}"#.to_owned())),
        Some("json_schema") => json_schema(format.get("json_schema")).map(Some),
        _ => {
            Err(bad("Input should be 'text', 'json_object', 'json_schema' or 'structural_tag'", "response_format.type"))
        }
    }
}

fn json_schema(spec: Option<&Value>) -> Result<String, SimError> {
    let Some(spec) = spec.filter(|s| !s.is_null()) else {
        return Err(bad(
            "When response_format type is 'json_schema', the 'json_schema' field must be provided.",
            "response_format",
        ));
    };
    if spec.get("name").and_then(Value::as_str).is_none() {
        return Err(bad("Field required", "response_format.json_schema.name"));
    }
    let schema = spec.get("schema").cloned().unwrap_or(Value::Object(Default::default()));
    Ok(schema::instance(&schema).to_string())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn chat(extra: Value) -> Value {
        let mut body = json!({"messages": [{"role": "user", "content": "What is the weather in Paris?"}]});
        body.as_object_mut().expect("object").extend(extra.as_object().expect("object").clone());
        body
    }

    fn param_of(extra: Value) -> Option<&'static str> {
        match Params::read(Flavour::Chat, &chat(extra)) {
            Err(SimError::BadRequest { param, .. }) => param,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    const WEATHER: &str = r#"[{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "weather"}}]"#;

    #[test]
    fn auto_calls_a_tool_the_user_names_else_answers_text() {
        let tools: Value = serde_json::from_str(WEATHER).expect("tools");
        let p = Params::read(Flavour::Chat, &chat(json!({"tools": tools}))).expect("ok");
        let Output::Tool(call) = p.output else { panic!("the message mentions `weather`: {p:?}") };
        assert_eq!((call.name.as_str(), call.finish_reason), ("weather", "tool_calls"));
        assert_eq!(call.arguments, "{}");
        let quiet = json!({"messages": [{"role": "user", "content": "hi"}], "tools": tools});
        assert_eq!(Params::read(Flavour::Chat, &quiet).expect("ok").output, Output::Text);
        let required =
            json!({"messages": [{"role": "user", "content": "hi"}], "tools": tools, "tool_choice": "required"});
        let Output::Tool(call) = Params::read(Flavour::Chat, &required).expect("ok").output else { panic!() };
        assert_eq!(call.name, "get_weather");
        assert_eq!(call.arguments, r#"{"city":"sample city"}"#);
        let named =
            chat(json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}));
        let Output::Tool(call) = Params::read(Flavour::Chat, &named).expect("ok").output else { panic!() };
        assert_eq!((call.name.as_str(), call.finish_reason), ("get_weather", "stop"));
        let none = chat(json!({"tools": tools, "tool_choice": "none"}));
        assert_eq!(Params::read(Flavour::Chat, &none).expect("ok").output, Output::Text);
    }

    #[test]
    fn refusals_name_their_param() {
        let tools: Value = serde_json::from_str(WEATHER).expect("tools");
        assert_eq!(param_of(json!({"messages": []})), Some("messages"));
        assert_eq!(param_of(json!({"n": 0})), Some("n"));
        assert_eq!(param_of(json!({"n": "2"})), Some("n"));
        assert_eq!(param_of(json!({"top_logprobs": 2})), Some("top_logprobs"));
        assert_eq!(param_of(json!({"logprobs": true, "top_logprobs": 21})), Some("top_logprobs"));
        assert_eq!(param_of(json!({"logprobs": true, "top_logprobs": -2})), Some("top_logprobs"));
        assert_eq!(param_of(json!({"tool_choice": "required"})), Some("tool_choice"));
        assert_eq!(param_of(json!({"tools": []})), Some("tools"));
        assert_eq!(param_of(json!({"tools": tools, "tool_choice": "always"})), Some("tool_choice"));
        let unknown = json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "nope"}}});
        assert_eq!(param_of(unknown), Some("tool_choice"));
        assert_eq!(param_of(json!({"response_format": {"type": "yaml"}})), Some("response_format.type"));
        assert_eq!(param_of(json!({"response_format": {"type": "json_schema"}})), Some("response_format"));
        assert_eq!(param_of(json!({"stream_options": {"include_usage": true}})), Some("stream_options"));
    }

    #[test]
    fn defaults_and_completions() {
        let p = Params::read(Flavour::Chat, &chat(json!({}))).expect("ok");
        assert_eq!(p, Params { n: 1, logprobs: None, output: Output::Text });
        let p = Params::read(Flavour::Chat, &chat(json!({"n": 3, "logprobs": true}))).expect("ok");
        assert_eq!((p.n, p.logprobs), (3, Some(0)));
        let p = Params::read(Flavour::Completion, &json!({"prompt": "x", "logprobs": 2})).expect("ok");
        assert_eq!(p.logprobs, Some(2));
        let fmt = json!({"response_format": {"type": "json_object"}});
        let Output::Json(text) = Params::read(Flavour::Completion, &fmt).expect("ok").output else { panic!() };
        assert!(serde_json::from_str::<Value>(&text).expect("json").is_object());
    }
}
