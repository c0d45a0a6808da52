//! What the model sees: a model's chat template (rendered with Hugging Face parity) and its
//! tokenizer, loaded from an HF model directory or from a profile bundled into the binary.
//!
//! `PromptModel` is immutable after loading and cheap to clone (one `Arc`), so one instance serves
//! every request.

mod bundled;
mod context;
mod env;
mod error;
mod pyjson;
mod segments;

use std::collections::HashMap;
use std::fmt;
use std::io::Read;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use minijinja::value::{Serde, Value};
use serde_json::Value as Json;
use tokenizers::Tokenizer;

pub use error::PromptError;

use crate::request::{Entry, Part, Request};

/// Upper bound on a decompressed `tokenizer.json.gz` (real tokenizers are 2–35 MB).
const MAX_TOKENIZER_BYTES: u64 = 512 << 20;

/// Name of the template used when a model ships a single one (HF's convention).
const DEFAULT_TEMPLATE: &str = "default";
/// HF picks this named template instead of the default when the request has tools.
const TOOL_USE_TEMPLATE: &str = "tool_use";

/// A model's tokenizer and compiled chat template(s).
#[derive(Clone)]
pub struct PromptModel {
    inner: Arc<Inner>,
}

struct Inner {
    tokenizer: Tokenizer,
    segments: segments::SegmentEncoder,
    env: minijinja::Environment<'static>,
    template_names: Vec<String>,
    /// `bos_token`, `eos_token`, … as HF passes them to every render.
    special_tokens: Vec<(String, Value)>,
}

impl fmt::Debug for PromptModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PromptModel")
            .field("templates", &self.inner.template_names)
            .field("vocab_size", &self.inner.tokenizer.get_vocab_size(true))
            .finish()
    }
}

impl PromptModel {
    /// A profile compiled into the binary ("qwen3-vl" or "qwen2.5-vl"). Loaded once per process
    /// and shared afterwards.
    pub fn bundled(name: &str) -> Result<PromptModel, PromptError> {
        static CACHE: OnceLock<Mutex<HashMap<&'static str, PromptModel>>> = OnceLock::new();
        let profile = bundled::profile(name).ok_or_else(|| PromptError::ModelLoadFailed {
            source_name: name.to_owned(),
            detail: format!("no bundled profile of that name (known: {})", bundled::NAMES.join(", ")),
        })?;
        let cache = CACHE.get_or_init(Default::default);
        // A poisoned lock only means another loader panicked; the map itself is still valid.
        let mut guard = cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(model) = guard.get(profile.name) {
            return Ok(model.clone());
        }
        let load_err =
            |detail: String| PromptError::ModelLoadFailed { source_name: format!("bundled:{}", profile.name), detail };
        let json = gunzip(bundled::QWEN_TOKENIZER_GZ).map_err(load_err)?;
        let tokenizer = tokenizer_without(&json, profile.drop_added_tokens).map_err(load_err)?;
        let config: Json = serde_json::from_slice(profile.tokenizer_config)
            .map_err(|e| load_err(format!("tokenizer_config.json: {e}")))?;
        let model = PromptModel::assemble(tokenizer, &config, None).map_err(load_err)?;
        guard.insert(profile.name, model.clone());
        Ok(model)
    }

    /// Names accepted by [`PromptModel::bundled`].
    pub fn bundled_names() -> &'static [&'static str] {
        &bundled::NAMES
    }

    /// The raw bytes of a bundled profile's file: "config.json", "preprocessor_config.json",
    /// "tokenizer_config.json", or "tokenizer.json.gz" (the shared Qwen tokenizer, compressed).
    pub fn bundled_file(name: &str, file: &str) -> Option<&'static [u8]> {
        let profile = bundled::profile(name)?;
        match file {
            "config.json" => Some(profile.config),
            "preprocessor_config.json" => Some(profile.preprocessor_config),
            "tokenizer_config.json" => Some(profile.tokenizer_config),
            "tokenizer.json.gz" => Some(bundled::QWEN_TOKENIZER_GZ),
            _ => None,
        }
    }

    /// Loads an HF model directory: `tokenizer.json` (or `tokenizer.json.gz`), and the chat
    /// template from `chat_template.jinja`, else `chat_template.json`, else
    /// `tokenizer_config.json`'s `chat_template` (a string or a list of `{name, template}`) —
    /// the processor's template first, as vLLM resolves it. A model without a template loads;
    /// rendering a chat for it fails with `template_failed`.
    pub fn from_dir(dir: &Path) -> Result<PromptModel, PromptError> {
        let load_err = |file: &str, detail: String| PromptError::ModelLoadFailed {
            source_name: dir.join(file).display().to_string(),
            detail,
        };
        let plain = dir.join("tokenizer.json");
        let tokenizer = if plain.is_file() {
            let bytes = std::fs::read(&plain).map_err(|e| load_err("tokenizer.json", e.to_string()))?;
            Tokenizer::from_bytes(&bytes).map_err(|e| load_err("tokenizer.json", e.to_string()))?
        } else {
            let gz = dir.join("tokenizer.json.gz");
            let bytes = std::fs::read(&gz).map_err(|e| {
                load_err("tokenizer.json", format!("neither tokenizer.json nor tokenizer.json.gz: {e}"))
            })?;
            let json = gunzip(&bytes).map_err(|e| load_err("tokenizer.json.gz", e))?;
            Tokenizer::from_bytes(&json).map_err(|e| load_err("tokenizer.json.gz", e.to_string()))?
        };
        let config: Json = match std::fs::read(dir.join("tokenizer_config.json")) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes).map_err(|e| load_err("tokenizer_config.json", e.to_string()))?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Json::Object(Default::default()),
            Err(e) => return Err(load_err("tokenizer_config.json", e.to_string())),
        };
        let processor_template = read_processor_template(dir).map_err(|(file, e)| load_err(file, e))?;
        PromptModel::assemble(tokenizer, &config, processor_template).map_err(|e| load_err("chat template", e))
    }

    fn assemble(
        tokenizer: Tokenizer,
        config: &Json,
        processor_template: Option<String>,
    ) -> Result<PromptModel, String> {
        let templates = match processor_template {
            Some(t) => vec![(DEFAULT_TEMPLATE.to_owned(), t)],
            None => templates_from_config(config)?,
        };
        let env = env::build(&templates).map_err(|e| format!("template does not compile: {e:#}"))?;
        let mut special_tokens = Vec::new();
        for key in ["bos_token", "eos_token", "unk_token", "pad_token"] {
            if let Some(text) = config.get(key).and_then(token_text) {
                special_tokens.push((key.to_owned(), Value::from(text)));
            }
        }
        if let Some(list) = config.get("additional_special_tokens").and_then(Json::as_array) {
            let texts: Vec<Value> = list.iter().filter_map(token_text).map(Value::from).collect();
            if !texts.is_empty() {
                special_tokens.push(("additional_special_tokens".to_owned(), Value::from(texts)));
            }
        }
        Ok(PromptModel {
            inner: Arc::new(Inner {
                segments: segments::SegmentEncoder::new(&tokenizer),
                tokenizer,
                env,
                template_names: templates.into_iter().map(|(n, _)| n).collect(),
                special_tokens,
            }),
        })
    }

    /// Renders the chat template for an OpenAI chat request: `messages`, `tools`,
    /// `add_generation_prompt` (default true), `continue_final_message` (default false) and
    /// `chat_template_kwargs`, with the same variables HF's `apply_chat_template` passes.
    pub fn render_chat(&self, request: &Request<'_>) -> Result<String, PromptError> {
        let add_generation_prompt = bool_field(request, "add_generation_prompt")?.unwrap_or(true);
        let continue_final = bool_field(request, "continue_final_message")?.unwrap_or(false);
        if add_generation_prompt && continue_final {
            return Err(PromptError::InvalidRequest(
                "`add_generation_prompt` and `continue_final_message` cannot both be true".into(),
            ));
        }
        let messages = context::messages(&request.messages)?;
        let tools = request.field("tools").map(context::tools).transpose()?;
        let has_tools = tools.as_ref().is_some_and(|t| t.len().unwrap_or(0) > 0);
        let name = self.template_name(has_tools)?;

        let mut ctx: Vec<(String, Value)> = self.inner.special_tokens.clone();
        // HF always passes these (as None when absent): `tools is none` must hold without tools.
        ctx.push(("tools".into(), tools.unwrap_or(Value::from(()))));
        let documents = request.field("documents").map_or(Value::from(()), |d| Value::from(Serde(d)));
        ctx.push(("documents".into(), documents));
        ctx.push(("add_generation_prompt".into(), Value::from(add_generation_prompt)));
        match request.field("chat_template_kwargs") {
            None => {}
            Some(Json::Object(kwargs)) => {
                for (k, v) in kwargs.iter().filter(|(k, _)| k.as_str() != "messages") {
                    ctx.push((k.clone(), Value::from(Serde(v))));
                }
            }
            Some(_) => return Err(PromptError::InvalidRequest("`chat_template_kwargs` must be an object".into())),
        }
        ctx.push(("messages".into(), messages));
        let template = self.inner.env.get_template(name).map_err(|e| PromptError::TemplateFailed(e.to_string()))?;
        let text =
            template.render(Value::from_pairs(ctx)).map_err(|e| PromptError::TemplateFailed(format!("{e:#}")))?;
        if continue_final {
            return cut_after_final_message(text, request);
        }
        Ok(text)
    }

    fn template_name(&self, has_tools: bool) -> Result<&str, PromptError> {
        let names = &self.inner.template_names;
        let find = |n: &str| names.iter().find(|x| x.as_str() == n).map(String::as_str);
        if has_tools {
            if let Some(n) = find(TOOL_USE_TEMPLATE) {
                return Ok(n);
            }
        }
        find(DEFAULT_TEMPLATE).ok_or_else(|| {
            PromptError::TemplateFailed(if names.is_empty() {
                "the model has no chat template".into()
            } else {
                format!("the model has chat templates {names:?} but none named \"default\"")
            })
        })
    }

    /// Token ids of `text`, adding no special tokens (the template already has them), as vLLM
    /// tokenizes a rendered chat.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, PromptError> {
        self.inner.segments.encode(&self.inner.tokenizer, text).map_err(|e| PromptError::TokenizeFailed(e.to_string()))
    }

    #[cfg(test)]
    pub(crate) fn tokenizer(&self) -> &Tokenizer {
        &self.inner.tokenizer
    }

    /// Token ids with the tokenizer's post-processor specials (e.g. BOS) when `add_special`.
    pub(crate) fn encode_with(&self, text: &str, add_special: bool) -> Result<Vec<u32>, PromptError> {
        self.inner
            .tokenizer
            .encode_fast(text, add_special)
            .map(|enc| enc.get_ids().to_vec())
            .map_err(|e| PromptError::TokenizeFailed(e.to_string()))
    }

    /// The id of a token given by its literal text (e.g. "<|image_pad|>"), if it is one token.
    pub fn token_id(&self, literal: &str) -> Option<u32> {
        self.inner.tokenizer.token_to_id(literal)
    }
}

/// `chat_template.jinja` (raw) or `chat_template.json` (`{"chat_template": "..."}`) beside the
/// tokenizer files: transformers' processor template, which vLLM prefers.
fn read_processor_template(dir: &Path) -> Result<Option<String>, (&'static str, String)> {
    match std::fs::read_to_string(dir.join("chat_template.jinja")) {
        Ok(t) => return Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(("chat_template.jinja", e.to_string())),
    }
    match std::fs::read(dir.join("chat_template.json")) {
        Ok(bytes) => {
            let json: Json = serde_json::from_slice(&bytes).map_err(|e| ("chat_template.json", e.to_string()))?;
            match json.get("chat_template").and_then(Json::as_str) {
                Some(t) => Ok(Some(t.to_owned())),
                None => Err(("chat_template.json", "no string field `chat_template`".into())),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(("chat_template.json", e.to_string())),
    }
}

/// `chat_template` of a tokenizer config: absent, a string, or `[{"name", "template"}, …]`.
fn templates_from_config(config: &Json) -> Result<Vec<(String, String)>, String> {
    match config.get("chat_template") {
        None | Some(Json::Null) => Ok(Vec::new()),
        Some(Json::String(t)) => Ok(vec![(DEFAULT_TEMPLATE.to_owned(), t.clone())]),
        Some(Json::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let name = item.get("name").and_then(Json::as_str);
                let template = item.get("template").and_then(Json::as_str);
                match (name, template) {
                    (Some(n), Some(t)) => Ok((n.to_owned(), t.to_owned())),
                    _ => Err(format!("chat_template[{i}] needs string fields `name` and `template`")),
                }
            })
            .collect(),
        Some(_) => Err("`chat_template` must be a string or a list of {name, template}".into()),
    }
}

/// A special-token entry: a plain string or an AddedToken object `{"content": ...}`.
fn token_text(v: &Json) -> Option<&str> {
    v.as_str().or_else(|| v.get("content").and_then(Json::as_str))
}

fn bool_field(request: &Request<'_>, key: &str) -> Result<Option<bool>, PromptError> {
    match request.field(key) {
        None => Ok(None),
        Some(Json::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(PromptError::InvalidRequest(format!("`{key}` must be a boolean"))),
    }
}

/// transformers' `continue_final_message`: cut the rendered text right after the final
/// message's content, keeping its trailing whitespace only if the template kept it.
fn cut_after_final_message(text: String, request: &Request<'_>) -> Result<String, PromptError> {
    let last = request.messages.as_ref().ok().and_then(|m| m.last()).and_then(|m| m.content());
    let final_text = match last {
        Some(Entry::Json(Json::String(s))) => s.as_str(),
        Some(Entry::Parts(parts)) => parts.iter().rev().find_map(part_text).ok_or_else(|| {
            PromptError::InvalidRequest("continue_final_message: the final message has no text part".into())
        })?,
        _ => {
            return Err(PromptError::InvalidRequest("continue_final_message: the final message has no content".into()))
        }
    };
    let stripped = final_text.trim_matches(py_is_space);
    let left_stripped = final_text.trim_start_matches(py_is_space);
    let loc = text.rfind(stripped).ok_or_else(|| {
        PromptError::TemplateFailed(
            "continue_final_message: the final message does not appear in the rendered chat".into(),
        )
    })?;
    let keep =
        if text.get(loc..loc + left_stripped.len()) == Some(final_text) { left_stripped.len() } else { stripped.len() };
    let mut text = text;
    text.truncate(loc + keep);
    Ok(text)
}

/// The `text` of an object part, if it has one.
fn part_text(part: &Part) -> Option<&str> {
    match part {
        Part::Object(fields) => fields.iter().find(|(k, _)| k == "text").and_then(|(_, v)| v.as_str()),
        _ => None,
    }
}

/// Python's `str.isspace` (Rust's `char::is_whitespace` lacks U+001C–U+001F).
fn py_is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

fn gunzip(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .take(MAX_TOKENIZER_BYTES + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("gzip: {e}"))?;
    if out.len() as u64 > MAX_TOKENIZER_BYTES {
        return Err(format!("decompressed tokenizer exceeds {MAX_TOKENIZER_BYTES} bytes"));
    }
    Ok(out)
}

/// Loads `tokenizer.json` bytes, first removing the named added tokens (for profiles whose real
/// tokenizer is the shared one minus a few additions).
fn tokenizer_without(json: &[u8], drop: &[&str]) -> Result<Tokenizer, String> {
    if drop.is_empty() {
        return Tokenizer::from_bytes(json).map_err(|e| format!("tokenizer.json: {e}"));
    }
    let mut value: Json = serde_json::from_slice(json).map_err(|e| format!("tokenizer.json: {e}"))?;
    let added =
        value.get_mut("added_tokens").and_then(Json::as_array_mut).ok_or("tokenizer.json: no `added_tokens` list")?;
    added.retain(|t| !t.get("content").and_then(Json::as_str).is_some_and(|c| drop.contains(&c)));
    let bytes = serde_json::to_vec(&value).map_err(|e| format!("tokenizer.json: {e}"))?;
    Tokenizer::from_bytes(&bytes).map_err(|e| format!("tokenizer.json: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_list_form_and_selection() {
        let config = serde_json::json!({"chat_template": [
            {"name": "default", "template": "D{{ messages | length }}"},
            {"name": "tool_use", "template": "T{{ tools | length }}"}
        ], "eos_token": {"content": "</s>"}});
        let templates = templates_from_config(&config).unwrap();
        assert_eq!(templates.len(), 2);
        let bad = serde_json::json!({"chat_template": [{"name": "x"}]});
        assert!(templates_from_config(&bad).unwrap_err().contains("chat_template[0]"));
        assert_eq!(token_text(&config["eos_token"]), Some("</s>"));
    }

    #[test]
    fn continue_final_keeps_or_drops_trailing_space() {
        let body = br#"{"messages": [{"role": "assistant", "content": "Hi  "}]}"#;
        let req = Request::parse(crate::request::Endpoint::Chat, body).unwrap();
        // The template kept the trailing spaces: keep them.
        let kept = cut_after_final_message("<a>Hi  </a>".into(), &req).unwrap();
        assert_eq!(kept, "<a>Hi  ");
        // The template trimmed them: cut right after the stripped text.
        let trimmed = cut_after_final_message("<a>Hi</a>".into(), &req).unwrap();
        assert_eq!(trimmed, "<a>Hi");
        let missing = cut_after_final_message("<a>other</a>".into(), &req).unwrap_err();
        assert_eq!(missing.label(), "template_failed");
    }

    #[test]
    fn gunzip_rejects_garbage() {
        assert!(gunzip(b"not gzip").is_err());
    }
}
