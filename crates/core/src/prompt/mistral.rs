//! vLLM `--tokenizer-mode mistral`: no Jinja template and no `tokenizer.json`. vLLM hands the OpenAI
//! messages to `mistral_common`, which validates, normalises and encodes them with the checkpoint's
//! `tekken.json`. This module does the same for the tekken versions the supported checkpoints use
//! (v3: Pixtral-12B-2409; v7: Mistral-Small-3.1-2503), as `docs/mistral-mode.md` sets out, checked
//! against `vllm launch render` (`tests/fixtures/parity/mistral/`).
//!
//! Every request mistral_common refuses (a 400 from the worker) is an `invalid_request` here, so the
//! router never routes on ids the worker would not prefill. Where the rules are not known for certain
//! the request is refused too: routing it by load loses cache affinity, never correctness.
//!
//! Each image becomes one `[IMG]` id in the ids returned; the pipeline expands it to the image's run
//! (`[IMG]`×cols + `[IMG_BREAK]` per row, `[IMG_END]` last) from the accounting of its size.

use mmrouter_tokenize::{TekkenImageConfig, TekkenTokenizer};
use serde_json::{Map, Value as Json};

use super::pyjson::{self, DumpOptions};
use super::PromptError;
use crate::request::{Entry, Message, Part, Request};

/// `reasoning_effort` values vLLM accepts for Mistral tokenizers (they change no v3/v7 id).
const REASONING_EFFORTS: [&str; 7] = ["none", "minimal", "low", "medium", "high", "xhigh", "max"];

/// The instruct versions modelled: they differ in system prompts and tool results.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Version {
    V3,
    V7,
}

/// A loaded `tekken.json` and the special ids its prompts use.
pub(crate) struct MistralModel {
    tok: TekkenTokenizer,
    version: Version,
    ids: Specials,
}

struct Specials {
    bos: u32,
    eos: u32,
    inst: u32,
    inst_end: u32,
    tools: u32,
    tools_end: u32,
    results: u32,
    results_end: u32,
    calls: u32,
    img: u32,
    /// v7 only.
    system: Option<(u32, u32)>,
    content: Option<u32>,
}

fn invalid(why: impl Into<String>) -> PromptError {
    PromptError::InvalidRequest(why.into())
}

impl MistralModel {
    pub(crate) fn from_json(bytes: &[u8]) -> Result<MistralModel, String> {
        let tok = TekkenTokenizer::from_json(bytes).map_err(|e| e.to_string())?;
        let version = match tok.version() {
            "v3" => Version::V3,
            "v7" => Version::V7,
            other => return Err(format!("tekken version {other} is not modelled (v3 and v7 are)")),
        };
        let id = |name: &str| tok.special_id(name).ok_or_else(|| format!("tekken.json has no {name} token"));
        let system = match version {
            Version::V7 => Some((id("[SYSTEM_PROMPT]")?, id("[/SYSTEM_PROMPT]")?)),
            Version::V3 => None,
        };
        let content = if version == Version::V7 { Some(id("[TOOL_CONTENT]")?) } else { None };
        let ids = Specials {
            bos: tok.bos_id().ok_or("tekken.json has no <s> token")?,
            eos: tok.eos_id().ok_or("tekken.json has no </s> token")?,
            inst: id("[INST]")?,
            inst_end: id("[/INST]")?,
            tools: id("[AVAILABLE_TOOLS]")?,
            tools_end: id("[/AVAILABLE_TOOLS]")?,
            results: id("[TOOL_RESULTS]")?,
            results_end: id("[/TOOL_RESULTS]")?,
            calls: id("[TOOL_CALLS]")?,
            img: id("[IMG]")?,
            system,
            content,
        };
        Ok(MistralModel { tok, version, ids })
    }

    pub(crate) fn image_config(&self) -> Option<TekkenImageConfig> {
        self.tok.image_config()
    }

    pub(crate) fn vocab_size(&self) -> u32 {
        self.tok.vocab_size()
    }

    /// A special token's id by name (`[IMG]`, `[IMG_BREAK]`, …); text never encodes to one.
    pub(crate) fn special_id(&self, name: &str) -> Option<u32> {
        self.tok.special_id(name)
    }

    pub(crate) fn encode(&self, text: &str) -> Result<Vec<u32>, PromptError> {
        self.tok.try_encode(text).map_err(|e| PromptError::TokenizeFailed(e.to_string()))
    }

    pub(crate) fn bos(&self) -> u32 {
        self.ids.bos
    }

    /// The chat's ids as mistral_common builds them (one `[IMG]` per image) and a readable
    /// rendering (special tokens by name) for traces.
    pub(crate) fn encode_chat(&self, request: &Request<'_>) -> Result<(String, Vec<u32>), PromptError> {
        let flags = check_request(request)?;
        let messages = request.messages.as_ref().map_err(|e| invalid(e.clone()))?;
        if messages.is_empty() {
            return Err(invalid("messages is empty"));
        }
        let mut msgs = messages.iter().enumerate().map(|(i, m)| convert(i, m)).collect::<Result<Vec<_>, _>>()?;
        apply_continue(&mut msgs, flags.continue_final)?;
        let tools = tools(request.field("tools"))?;
        validate(&msgs, self.version)?;
        let (system, msgs) = normalize(msgs, self.version);
        let mut out = Out::new(self);
        out.special(self.ids.bos, "<s>");
        let last_user = msgs.iter().rposition(|m| m.role == Role::User);
        for (i, m) in msgs.iter().enumerate() {
            match m.role {
                Role::User => {
                    let last = Some(i) == last_user;
                    out.user(
                        m,
                        last.then_some(tools.as_deref()).flatten(),
                        last.then_some(system.as_deref()).flatten(),
                    )?
                }
                Role::System => out.system(m)?,
                Role::Assistant => out.assistant(m)?,
                Role::Tool => out.tool(m)?,
            }
        }
        Ok((out.text, out.ids))
    }
}

struct Flags {
    continue_final: bool,
}

/// What vLLM refuses before mistral_common sees the request.
fn check_request(request: &Request<'_>) -> Result<Flags, PromptError> {
    for key in ["chat_template", "chat_template_kwargs"] {
        if request.field(key).is_some() {
            return Err(invalid(format!("{key} is not supported for Mistral tokenizers")));
        }
    }
    if let Some(effort) = request.field("reasoning_effort") {
        if !effort.as_str().is_some_and(|e| REASONING_EFFORTS.contains(&e)) {
            return Err(invalid("reasoning_effort must be one of none, minimal, low, medium, high, xhigh, max"));
        }
    }
    let flag = |k: &str, default: bool| request.field(k).and_then(Json::as_bool).unwrap_or(default);
    let (generation, continue_final) = (flag("add_generation_prompt", true), flag("continue_final_message", false));
    if generation && continue_final {
        return Err(invalid("add_generation_prompt and continue_final_message cannot both be set"));
    }
    Ok(Flags { continue_final })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    System,
    User,
    Assistant,
    Tool,
}

#[derive(Clone, Debug, PartialEq)]
enum Chunk {
    Text(String),
    Image,
}

#[derive(Clone, Debug)]
struct Call {
    name: String,
    arguments: Json,
    id: String,
}

#[derive(Clone, Debug)]
struct Msg {
    role: Role,
    /// `None`: no content (an assistant's `null`).
    content: Option<Vec<Chunk>>,
    calls: Vec<Call>,
    /// Tool messages: the (truncated) id of the call answered.
    call_id: Option<String>,
    /// continue_final_message: the assistant turn is left open.
    prefix: bool,
}

impl Msg {
    fn text(&self) -> String {
        let texts: Vec<&str> = self
            .content
            .iter()
            .flatten()
            .filter_map(|c| match c {
                Chunk::Text(t) if !t.is_empty() => Some(t.as_str()),
                _ => None,
            })
            .collect();
        texts.join("\n\n")
    }

    fn has_image(&self) -> bool {
        self.content.iter().flatten().any(|c| *c == Chunk::Image)
    }
}

/// One OpenAI message as `ChatCompletionRequest.from_openai` reads it.
fn convert(i: usize, m: &Message) -> Result<Msg, PromptError> {
    let role = match m.role() {
        Some("user") => Role::User,
        Some("system") | Some("developer") => Role::System,
        Some("assistant") => Role::Assistant,
        Some("tool") => Role::Tool,
        Some(other) => return Err(invalid(format!("messages[{i}]: role '{other}' is not supported by Mistral"))),
        None => return Err(invalid(format!("messages[{i}].role must be a string"))),
    };
    let content = content(i, role, m)?;
    let mut msg = Msg { role, content, calls: Vec::new(), call_id: None, prefix: false };
    if role == Role::Assistant {
        let reasoning = ["reasoning", "reasoning_content"].iter().any(|k| m.get(k).is_some_and(|v| !v.is_null()));
        if reasoning {
            return Err(invalid(format!("messages[{i}]: Mistral v3/v7 tokenizers refuse reasoning content")));
        }
        if let Some(calls) = m.get("tool_calls").filter(|v| !v.is_null()) {
            msg.calls = tool_calls(i, calls)?;
        }
    }
    if role == Role::Tool {
        let id = m
            .get("tool_call_id")
            .and_then(Json::as_str)
            .ok_or_else(|| invalid(format!("messages[{i}].tool_call_id must be a string")))?;
        msg.call_id = Some(call_id(i, id)?);
    }
    Ok(msg)
}

fn content(i: usize, role: Role, m: &Message) -> Result<Option<Vec<Chunk>>, PromptError> {
    let parts = match m.content() {
        None | Some(Entry::Json(Json::Null)) if role == Role::Assistant => return Ok(None),
        Some(Entry::Json(Json::Null)) => {
            return Err(invalid(format!("messages[{i}].content is null (allowed on assistant messages only)")))
        }
        None => return Err(invalid(format!("messages[{i}] has no content"))),
        Some(Entry::Json(Json::String(s))) => return Ok(Some(vec![Chunk::Text(s.clone())])),
        Some(Entry::Json(_)) => return Err(invalid(format!("messages[{i}].content must be a string or a list"))),
        Some(Entry::Parts(parts)) => parts,
    };
    let mut out = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        match part {
            Part::Image(_) if role == Role::User => out.push(Chunk::Image),
            Part::Image(_) => return Err(invalid(format!("messages[{i}]: images are accepted in user messages only"))),
            Part::Object(fields) => {
                let get = |k: &str| fields.iter().find(|(key, _)| key == k).map(|(_, v)| v);
                match (get("type").and_then(Json::as_str), get("text")) {
                    (Some("text"), Some(Json::String(t))) => out.push(Chunk::Text(t.clone())),
                    _ => return Err(invalid(format!("messages[{i}].content[{j}]: only text and image parts"))),
                }
            }
            Part::Video | Part::Json(_) => {
                return Err(invalid(format!("messages[{i}].content[{j}]: only text and image parts")))
            }
        }
    }
    Ok(Some(out))
}

/// vLLM keeps the last 9 characters of a longer id; mistral_common wants exactly 9 alphanumerics.
fn call_id(i: usize, id: &str) -> Result<String, PromptError> {
    let chars: Vec<char> = id.chars().collect();
    let cut: String = chars[chars.len().saturating_sub(9)..].iter().collect();
    if cut.len() != 9 || !cut.chars().all(|c| c.is_ascii_alphanumeric()) || cut == "null" {
        return Err(invalid(format!("messages[{i}]: tool call id {cut:?} must be 9 characters a-z, A-Z, 0-9")));
    }
    Ok(cut)
}

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn tool_calls(i: usize, calls: &Json) -> Result<Vec<Call>, PromptError> {
    let calls = calls.as_array().ok_or_else(|| invalid(format!("messages[{i}].tool_calls must be a list")))?;
    calls
        .iter()
        .map(|call| {
            let f =
                call.get("function").ok_or_else(|| invalid(format!("messages[{i}]: tool call without function")))?;
            let name = f.get("name").and_then(Json::as_str).filter(|n| valid_name(n));
            let name =
                name.ok_or_else(|| invalid(format!("messages[{i}]: tool call name must match [a-zA-Z0-9_-]{{1,64}}")))?;
            let id =
                call.get("id").and_then(Json::as_str).ok_or_else(|| invalid(format!("messages[{i}]: tool call id")))?;
            Ok(Call { name: name.to_owned(), arguments: arguments(f.get("arguments")), id: call_id(i, id)? })
        })
        .collect()
}

/// vLLM's post-processing: a JSON object (or its text) is kept; anything else becomes `{}`.
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

/// `continue_final_message` opens the final assistant turn; a final assistant turn without it is a 400.
fn apply_continue(msgs: &mut [Msg], continue_final: bool) -> Result<(), PromptError> {
    let last = msgs.last_mut().ok_or_else(|| invalid("messages is empty"))?;
    match (last.role == Role::Assistant, continue_final) {
        (true, true) => last.prefix = true,
        (false, true) => return Err(invalid("continue_final_message needs a final assistant message")),
        (true, false) => {
            return Err(invalid("the last message must be user or tool (or assistant with continue_final_message)"))
        }
        (false, false) => {}
    }
    Ok(())
}

/// The request's tools dumped as mistral_common writes them, or `None` when there are none.
fn tools(v: Option<&Json>) -> Result<Option<String>, PromptError> {
    let Some(list) = v else { return Ok(None) };
    let list = list.as_array().ok_or_else(|| invalid("tools must be a list"))?;
    if list.is_empty() {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(list.len());
    for tool in list {
        let f = tool.get("function").ok_or_else(|| invalid("a tool has no function"))?;
        let name = f.get("name").and_then(Json::as_str).filter(|n| valid_name(n));
        let name = name.ok_or_else(|| invalid("tool names must match [a-zA-Z0-9_-]{1,64}"))?;
        let description = match f.get("description") {
            None | Some(Json::Null) => Json::String(String::new()),
            Some(d @ Json::String(_)) => d.clone(),
            Some(_) => return Err(invalid("a tool's description must be a string")),
        };
        let parameters = match f.get("parameters") {
            None | Some(Json::Null) => Json::Object(Map::new()),
            Some(p @ Json::Object(_)) => p.clone(),
            Some(_) => return Err(invalid("a tool's parameters must be a JSON Schema object")),
        };
        let mut function = Map::new();
        function.insert("name".into(), Json::String(name.to_owned()));
        function.insert("description".into(), description);
        function.insert("parameters".into(), parameters);
        let mut entry = Map::new();
        entry.insert("type".into(), Json::String("function".into()));
        entry.insert("function".into(), Json::Object(function));
        out.push(Json::Object(entry));
    }
    dumps(&Json::Array(out)).map(Some)
}

fn dumps(v: &Json) -> Result<String, PromptError> {
    pyjson::dumps(v, &DumpOptions::default()).map_err(|e| invalid(format!("unserialisable JSON: {e}")))
}

/// mistral_common's validator (test mode), on the messages as received.
fn validate(msgs: &[Msg], version: Version) -> Result<(), PromptError> {
    if msgs.len() == 1 && !matches!(msgs[0].role, Role::User | Role::System) {
        return Err(invalid("a single message must be a user or system message"));
    }
    let last = msgs.last().ok_or_else(|| invalid("messages is empty"))?;
    let last_ok = matches!(last.role, Role::User | Role::Tool) || (last.role == Role::Assistant && last.prefix);
    // A lone system message passes: the single-message rule above already allows it.
    let lone_system = msgs.len() == 1 && last.role == Role::System;
    if !last_ok && !lone_system {
        return Err(invalid("the last message must be user or tool (or assistant with continue_final_message)"));
    }
    let mut pending: Vec<&str> = Vec::new();
    for (i, pair) in msgs.windows(2).enumerate() {
        let (prev, next) = (pair[0].role, pair[1].role);
        let allowed = match prev {
            Role::System => matches!(next, Role::User | Role::Assistant | Role::System),
            Role::User => matches!(next, Role::Assistant | Role::System | Role::User),
            Role::Assistant => matches!(next, Role::Assistant | Role::User | Role::Tool),
            Role::Tool => matches!(next, Role::Assistant | Role::Tool | Role::User),
        };
        if !allowed {
            return Err(invalid(format!("messages[{}]: unexpected role {next:?} after {prev:?}", i + 1)));
        }
    }
    for (i, m) in msgs.iter().enumerate() {
        match m.role {
            Role::Assistant => {
                if !pending.is_empty() {
                    return Err(invalid(format!("messages[{i}]: tool calls {pending:?} have no result")));
                }
                check_assistant(i, m, version)?;
                pending = m.calls.iter().map(|c| c.id.as_str()).collect();
            }
            Role::Tool => {
                let id = m.call_id.as_deref().unwrap_or_default();
                match pending.iter().position(|p| *p == id) {
                    Some(at) => {
                        pending.remove(at);
                    }
                    None => return Err(invalid(format!("messages[{i}]: tool result {id:?} answers no pending call"))),
                }
            }
            Role::User | Role::System => {}
        }
    }
    Ok(())
}

/// v3: content or tool calls, not both; either version: at least one. (Empty content with tool
/// calls is refused too: whether mistral_common counts `""` as content is not known here.)
fn check_assistant(i: usize, m: &Msg, version: Version) -> Result<(), PromptError> {
    let has_content = m.content.is_some();
    let has_calls = !m.calls.is_empty();
    if !has_content && !has_calls {
        return Err(invalid(format!("messages[{i}]: an assistant message needs content or tool calls")));
    }
    if version == Version::V3 && has_content && has_calls {
        return Err(invalid(format!("messages[{i}]: content or tool_calls, not both (tekken v3)")));
    }
    Ok(())
}

/// Merges runs of one role (tools excepted), texts joined by `"\n\n"`; v3 lifts the system messages
/// into one system prompt and starts with a user message.
fn normalize(msgs: Vec<Msg>, version: Version) -> (Option<String>, Vec<Msg>) {
    let mut merged: Vec<Msg> = Vec::with_capacity(msgs.len());
    for m in msgs {
        match merged.last_mut() {
            Some(prev) if prev.role == m.role && m.role != Role::Tool => {
                match (&mut prev.content, m.content) {
                    (Some(a), Some(b)) => a.extend(b),
                    (slot @ None, b) => *slot = b,
                    (Some(_), None) => {}
                }
                prev.calls.extend(m.calls);
                prev.prefix = m.prefix;
            }
            _ => merged.push(m),
        }
    }
    for m in &mut merged {
        if let Some(chunks) = &mut m.content {
            *chunks = join_texts(std::mem::take(chunks));
        }
    }
    if version == Version::V7 {
        return (None, merged);
    }
    let (systems, mut rest): (Vec<Msg>, Vec<Msg>) = merged.into_iter().partition(|m| m.role == Role::System);
    let texts: Vec<String> = systems.iter().map(Msg::text).filter(|t| !t.is_empty()).collect();
    let system = (!texts.is_empty()).then(|| texts.join("\n\n"));
    if rest.first().is_none_or(|m| m.role != Role::User) {
        let empty =
            Msg { role: Role::User, content: Some(Vec::new()), calls: Vec::new(), call_id: None, prefix: false };
        rest.insert(0, empty);
    }
    (system, rest)
}

/// Adjacent texts become one, joined by `"\n\n"`; empty texts vanish.
fn join_texts(chunks: Vec<Chunk>) -> Vec<Chunk> {
    let mut out: Vec<Chunk> = Vec::with_capacity(chunks.len());
    for c in chunks {
        match (out.last_mut(), c) {
            (_, Chunk::Text(t)) if t.is_empty() => {}
            (Some(Chunk::Text(prev)), Chunk::Text(t)) => {
                prev.push_str("\n\n");
                prev.push_str(&t);
            }
            (_, c) => out.push(c),
        }
    }
    out
}

/// The ids being built, and their readable rendering.
struct Out<'m> {
    model: &'m MistralModel,
    ids: Vec<u32>,
    text: String,
}

impl<'m> Out<'m> {
    fn new(model: &'m MistralModel) -> Out<'m> {
        Out { model, ids: Vec::new(), text: String::new() }
    }

    fn special(&mut self, id: u32, name: &str) {
        self.ids.push(id);
        self.text.push_str(name);
    }

    fn encode(&mut self, s: &str) -> Result<(), PromptError> {
        let ids = self.model.encode(s)?;
        self.ids.extend(ids);
        self.text.push_str(s);
        Ok(())
    }

    fn user(&mut self, m: &Msg, tools: Option<&str>, system: Option<&str>) -> Result<(), PromptError> {
        let ids = &self.model.ids;
        let (inst, inst_end, img) = (ids.inst, ids.inst_end, ids.img);
        if let Some(tools) = tools {
            self.special(self.model.ids.tools, "[AVAILABLE_TOOLS]");
            self.encode(tools)?;
            self.special(self.model.ids.tools_end, "[/AVAILABLE_TOOLS]");
        }
        self.special(inst, "[INST]");
        if !m.has_image() {
            let text = m.text();
            match system {
                Some(sp) => self.encode(&format!("{sp}\n\n{text}"))?,
                None => self.encode(&text)?,
            }
        } else {
            if let Some(sp) = system {
                self.encode(&format!("{sp}\n\n"))?;
            }
            for chunk in image_first(m.content.as_deref().unwrap_or_default()) {
                match chunk {
                    Chunk::Text(t) => self.encode(t)?,
                    Chunk::Image => self.special(img, "[IMG]"),
                }
            }
        }
        self.special(inst_end, "[/INST]");
        Ok(())
    }

    fn system(&mut self, m: &Msg) -> Result<(), PromptError> {
        let (open, close) = self.model.ids.system.ok_or_else(|| invalid("system message in tekken v3"))?;
        self.special(open, "[SYSTEM_PROMPT]");
        self.encode(&m.text())?;
        self.special(close, "[/SYSTEM_PROMPT]");
        Ok(())
    }

    fn assistant(&mut self, m: &Msg) -> Result<(), PromptError> {
        if m.content.is_some() {
            let text = m.text();
            self.encode(text.trim_end_matches(' '))?;
        }
        if !m.calls.is_empty() {
            let calls: Vec<Json> = m
                .calls
                .iter()
                .map(|c| {
                    let mut call = Map::new();
                    call.insert("name".into(), Json::String(c.name.clone()));
                    call.insert("arguments".into(), c.arguments.clone());
                    call.insert("id".into(), Json::String(c.id.clone()));
                    Json::Object(call)
                })
                .collect();
            self.special(self.model.ids.calls, "[TOOL_CALLS]");
            self.encode(&dumps(&Json::Array(calls))?)?;
        }
        if !m.prefix {
            self.special(self.model.ids.eos, "</s>");
        }
        Ok(())
    }

    fn tool(&mut self, m: &Msg) -> Result<(), PromptError> {
        let id = m.call_id.clone().unwrap_or_default();
        let content = m.text();
        self.special(self.model.ids.results, "[TOOL_RESULTS]");
        match self.model.ids.content {
            // v7: the id, then the content as sent.
            Some(content_id) => {
                self.encode(&id)?;
                self.special(content_id, "[TOOL_CONTENT]");
                self.encode(&content)?;
            }
            // v3: one JSON object, the content parsed when it is JSON (empty content is `{}`).
            None => {
                let value = match content.is_empty() {
                    true => Json::Object(Map::new()),
                    false => serde_json::from_str::<Json>(&content).unwrap_or(Json::String(content)),
                };
                let mut result = Map::new();
                result.insert("content".into(), value);
                result.insert("call_id".into(), Json::String(id));
                self.encode(&dumps(&Json::Object(result))?)?;
            }
        }
        self.special(self.model.ids.results_end, "[/TOOL_RESULTS]");
        Ok(())
    }
}

/// mistral_common's `_maybe_put_image_first`: `[text…, image]` becomes `[image, text…]`.
fn image_first(chunks: &[Chunk]) -> Vec<&Chunk> {
    let mut out: Vec<&Chunk> = chunks.iter().collect();
    let n = chunks.len();
    if n >= 2 && chunks[n - 1] == Chunk::Image && chunks[..n - 1].iter().all(|c| matches!(c, Chunk::Text(_))) {
        out.rotate_right(1);
    }
    out
}
