//! What the model sees: a model's chat template (rendered with Hugging Face parity) and its
//! tokenizer, loaded from an HF model directory or from a profile bundled into the binary.
//!
//! `PromptModel` is immutable after loading and cheap to clone (one `Arc`), so one instance serves
//! every request.

mod bundled;
mod conversation;
mod env;
mod error;
mod format;
mod mistral;
mod prefix;
#[cfg(test)]
mod prefix_tests;
mod pyjson;
mod resume;
mod segments;

use std::collections::HashMap;
use std::fmt;
use std::io::Read;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use minijinja::value::{Serde, Value};
use mmrouter_tokenize::FastTokenizer;
use serde_json::{Map, Value as Json};
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::Tokenizer;

pub use error::PromptError;
pub use format::ContentFormat;

use crate::request::{Entry, Message, Part, Request};

/// Upper bound on a decompressed `tokenizer.json.gz` (real tokenizers are 2–35 MB).
const MAX_TOKENIZER_BYTES: u64 = 512 << 20;

/// Name of the template used when a model ships a single one (HF's convention).
const DEFAULT_TEMPLATE: &str = "default";
/// HF picks this named template instead of the default when the request has tools.
const TOOL_USE_TEMPLATE: &str = "tool_use";
/// The processor's template (`chat_template.jinja` / `chat_template.json`), which vLLM prefers for
/// requests without tools.
const PROCESSOR_TEMPLATE: &str = "processor";
/// An operator-given template (`[model] chat_template`, vLLM's `--chat-template`): used for every request.
const EXPLICIT_TEMPLATE: &str = "explicit";
/// transformers' `continue_final_message` marker, appended to the final message before rendering.
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";
/// Keys a request's `chat_template_kwargs` may not set: vLLM refuses a request template unless the
/// server trusts it, and `messages`/`conversation` collide with the conversation argument.
const FORBIDDEN_KWARGS: [&str; 3] = ["chat_template", "messages", "conversation"];

/// A model's tokenizer and compiled chat template(s).
#[derive(Clone)]
pub struct PromptModel {
    inner: Arc<Inner>,
    /// Mistral tokenizer mode: the ids come from `tekken.json` through [`mistral`]; `inner` then has
    /// no template and an empty tokenizer, and every method below asks this first.
    mistral: Option<Arc<mistral::MistralModel>>,
}

struct Inner {
    tokenizer: Tokenizer,
    /// Encodes with `mmrouter-tokenize` when it accepts the tokenizer, else with `tokenizers`.
    segments: segments::SegmentEncoder,
    /// Adding special tokens changes no id (no post-processor, or a `ByteLevel` one): `encode_with(_,
    /// true)` may then take the fast path too.
    specials_inert: bool,
    env: minijinja::Environment<'static>,
    templates: Vec<TemplateInfo>,
    /// `bos_token`, `eos_token`, … (and a model's named extra tokens) as transformers passes them.
    special_tokens: Vec<(String, Value)>,
    /// The operator's `chat_template_content_format`; `None` = vLLM's `auto` detection.
    forced_format: Option<ContentFormat>,
    /// Conversations' kept renderings, for requests that resend them (`resume`).
    resume: resume::Resume,
}

/// One compiled template and what vLLM's renderer derives from its text.
#[derive(Debug, Clone)]
struct TemplateInfo {
    name: String,
    format: ContentFormat,
    knows_developer: bool,
    mentions_content: bool,
    /// Calls `strftime_now`: its output depends on when it renders.
    reads_clock: bool,
}

impl TemplateInfo {
    fn new(name: &str, source: &str) -> TemplateInfo {
        TemplateInfo {
            name: name.to_owned(),
            format: format::detect(source),
            knows_developer: source.contains("\"developer\"") || source.contains("'developer'"),
            mentions_content: source.contains("content"),
            reads_clock: source.contains("strftime_now"),
        }
    }
}

/// What rendering needs to know about the served model beyond its files.
#[derive(Default)]
pub struct RenderOptions<'a> {
    /// The placeholder vLLM puts in string-format content for the n-th image (1-based), if any.
    pub image_placeholder: Option<&'a dyn Fn(usize) -> String>,
    /// The longest rendered prompt (bytes) the caller will tokenize; `None`: any.
    pub max_prompt_bytes: Option<usize>,
}

impl fmt::Debug for PromptModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PromptModel")
            .field("templates", &self.inner.templates)
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
        let json = json_without(json, profile.drop_added_tokens).map_err(load_err)?;
        let tokenizer = Tokenizer::from_bytes(&json).map_err(|e| load_err(format!("tokenizer.json: {e}")))?;
        let fast = fast_tokenizer(&json);
        let config: Json = serde_json::from_slice(profile.tokenizer_config)
            .map_err(|e| load_err(format!("tokenizer_config.json: {e}")))?;
        let model = PromptModel::assemble(tokenizer, fast, &config, None).map_err(load_err)?;
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

    /// Loads an HF model directory: `tokenizer.json` (or `tokenizer.json.gz`), `tokenizer_config.json`
    /// (or `.gz`) with its `chat_template` (a string or a list of `{name, template}`), and the
    /// processor's template from `chat_template.jinja`, else `chat_template.json`. Which one renders a
    /// request is decided per request, as vLLM decides it (see [`PromptModel::render_chat`]). A model
    /// without a template loads; rendering a chat for it fails with `template_failed`.
    pub fn from_dir(dir: &Path) -> Result<PromptModel, PromptError> {
        let load_err = |file: &str, detail: String| PromptError::ModelLoadFailed {
            source_name: dir.join(file).display().to_string(),
            detail,
        };
        let config: Json =
            match read_maybe_gz(dir, "tokenizer_config.json").map_err(|e| load_err("tokenizer_config.json", e))? {
                Some(bytes) => {
                    serde_json::from_slice(&bytes).map_err(|e| load_err("tokenizer_config.json", e.to_string()))?
                }
                None => Json::Object(Default::default()),
            };
        let model_type = std::fs::read(dir.join("config.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<Json>(&b).ok())
            .and_then(|c| c.get("model_type").and_then(Json::as_str).map(str::to_owned));
        let json = read_maybe_gz(dir, "tokenizer.json").map_err(|e| load_err("tokenizer.json", e))?;
        let json =
            json.ok_or_else(|| load_err("tokenizer.json", "neither tokenizer.json nor tokenizer.json.gz".into()))?;
        let json = transformers_architecture(json, &config, model_type.as_deref())
            .map_err(|e| load_err("tokenizer.json", e))?;
        let tokenizer = Tokenizer::from_bytes(&json).map_err(|e| load_err("tokenizer.json", e.to_string()))?;
        let fast = fast_tokenizer(&json);
        drop(json);
        let processor_template = read_processor_template(dir).map_err(|(file, e)| load_err(file, e))?;
        PromptModel::assemble(tokenizer, fast, &config, processor_template).map_err(|e| load_err("chat template", e))
    }

    fn assemble(
        tokenizer: Tokenizer,
        fast: Option<FastTokenizer>,
        config: &Json,
        processor_template: Option<ProcessorTemplate>,
    ) -> Result<PromptModel, String> {
        let mut templates = templates_from_config(config)?;
        if let Some(t) = processor_template {
            // transformers' tokenizer loads `chat_template.jinja` too, in place of its config's templates:
            // so requests with tools (which vLLM renders with the tokenizer's) get it as well.
            if t.from_jinja {
                templates = vec![(DEFAULT_TEMPLATE.to_owned(), t.source.clone())];
            }
            templates.push((PROCESSOR_TEMPLATE.to_owned(), t.source));
        }
        Self::build(tokenizer, fast, config, templates)
    }

    fn build(
        tokenizer: Tokenizer,
        fast: Option<FastTokenizer>,
        config: &Json,
        templates: Vec<(String, String)>,
    ) -> Result<PromptModel, String> {
        let templates: Vec<(String, String)> =
            templates.into_iter().map(|(n, t)| (n, env::without_generation_tags(&t))).collect();
        let env = env::build(&templates).map_err(|e| format!("template does not compile: {e:#}"))?;
        let infos = templates.iter().map(|(n, t)| TemplateInfo::new(n, t)).collect();
        Ok(PromptModel {
            inner: Arc::new(Inner {
                segments: segments::SegmentEncoder::new(&tokenizer, fast.map(Arc::new)),
                specials_inert: specials_inert(&tokenizer),
                tokenizer,
                env,
                templates: infos,
                special_tokens: special_tokens(config),
                forced_format: None,
                resume: Default::default(),
            }),
            mistral: None,
        })
    }

    /// The same model with an operator's choices: a template that replaces every other one (vLLM's
    /// `--chat-template`) and a forced content format (vLLM's `--chat-template-content-format`).
    pub fn with_overrides(
        &self,
        template: Option<&str>,
        format: Option<ContentFormat>,
    ) -> Result<PromptModel, PromptError> {
        if self.mistral.is_some() && template.is_some() {
            return Err(PromptError::TemplateFailed("a chat template cannot apply in Mistral tokenizer mode".into()));
        }
        let mut templates: Vec<(String, String)> = Vec::new();
        for info in &self.inner.templates {
            let source = self.inner.env.get_template(&info.name).map(|t| t.source().to_owned());
            templates.push((info.name.clone(), source.map_err(|e| PromptError::TemplateFailed(e.to_string()))?));
        }
        if let Some(t) = template {
            templates.push((EXPLICIT_TEMPLATE.to_owned(), t.to_owned()));
        }
        let env = env::build(
            &templates.iter().map(|(n, t)| (n.clone(), env::without_generation_tags(t))).collect::<Vec<_>>(),
        )
        .map_err(|e| PromptError::TemplateFailed(format!("chat_template does not compile: {e:#}")))?;
        let infos = templates.iter().map(|(n, t)| TemplateInfo::new(n, t)).collect();
        let inner = &self.inner;
        Ok(PromptModel {
            inner: Arc::new(Inner {
                tokenizer: inner.tokenizer.clone(),
                segments: segments::SegmentEncoder::new(&inner.tokenizer, inner.segments.fast().cloned()),
                specials_inert: inner.specials_inert,
                env,
                templates: infos,
                special_tokens: inner.special_tokens.clone(),
                forced_format: format,
                resume: Default::default(),
            }),
            mistral: self.mistral.clone(),
        })
    }

    /// Renders the chat template for an OpenAI chat request as vLLM does: the template resolved for
    /// the request (an explicit one; else the processor's when the request has no tools; else the
    /// tokenizer's `tool_use`/`default`), the conversation normalised in that template's content format
    /// (see `conversation`), and the variables transformers passes (`messages`, `tools`, `documents`,
    /// `add_generation_prompt`, the special tokens, and `chat_template_kwargs` merged with the request's
    /// top-level `add_generation_prompt`, `continue_final_message`, `documents` and `reasoning_effort`).
    pub fn render_chat(&self, request: &Request<'_>, opts: &RenderOptions<'_>) -> Result<String, PromptError> {
        if let Some(m) = &self.mistral {
            return m.encode_chat(request).map(|(text, _)| text);
        }
        let kwargs = TemplateKwargs::from_request(request)?;
        let info = self.resolve_template(kwargs.tools.is_none())?;
        let shape = conversation::Shape {
            format: self.inner.forced_format.unwrap_or(info.format),
            placeholder: opts.image_placeholder,
            knows_developer: info.knows_developer,
        };
        let continue_final = kwargs.flag("continue_final_message");
        if continue_final && !info.mentions_content {
            return Err(PromptError::InvalidRequest(
                "continue_final_message needs a template that reads message content".into(),
            ));
        }
        if let Some(list) = resumable(request, &kwargs, info, shape.format) {
            let render =
                |messages: &[&Message], generation: bool| self.render_plain(info, &shape, messages, generation);
            return self.inner.resume.render(list, shape.format == ContentFormat::OpenAi, &render);
        }
        let messages = conversation::messages(&request.messages, &shape, continue_final.then_some(CONTINUE_TAG))?;
        let text = self.render_template(info, kwargs.into_context(messages)?)?;
        if continue_final {
            return cut_at_continue_tag(text);
        }
        Ok(text)
    }

    /// Some messages of a plain request (see [`resumable`]), with or without the generation prompt.
    fn render_plain(
        &self,
        info: &TemplateInfo,
        shape: &conversation::Shape<'_>,
        messages: &[&Message],
        generation: bool,
    ) -> Result<String, PromptError> {
        let messages = conversation::messages_of(messages.iter().copied(), shape, None)?;
        self.render_template(info, TemplateKwargs::plain(generation).into_context(messages)?)
    }

    /// The template under the special tokens and `vars` (later entries override earlier ones).
    fn render_template(&self, info: &TemplateInfo, vars: Vec<(String, Value)>) -> Result<String, PromptError> {
        let mut ctx: Vec<(String, Value)> = self.inner.special_tokens.clone();
        ctx.extend(vars);
        let template =
            self.inner.env.get_template(&info.name).map_err(|e| PromptError::TemplateFailed(e.to_string()))?;
        template.render(Value::from_pairs(ctx)).map_err(|e| PromptError::TemplateFailed(format!("{e:#}")))
    }

    /// How many chat renders resumed a conversation's kept prefix (see `resume`).
    pub fn resumed_renders(&self) -> u64 {
        self.inner.resume.resumed()
    }

    /// How many tokenized prompts reused a kept prompt's ids (see `prefix`), for benchmarks.
    #[doc(hidden)]
    pub fn prefix_hits(&self) -> usize {
        self.inner.segments.prefix_hits()
    }

    /// vLLM's `resolve_chat_template`: explicit, else the processor's (requests without tools only),
    /// else the tokenizer's (`tool_use` when the request has tools and it exists, else `default`).
    fn resolve_template(&self, no_tools: bool) -> Result<&TemplateInfo, PromptError> {
        let find = |n: &str| self.inner.templates.iter().find(|t| t.name == n);
        let explicit = find(EXPLICIT_TEMPLATE);
        let processor = if no_tools { find(PROCESSOR_TEMPLATE) } else { None };
        let tool_use = if no_tools { None } else { find(TOOL_USE_TEMPLATE) };
        explicit.or(processor).or(tool_use).or_else(|| find(DEFAULT_TEMPLATE)).ok_or_else(|| {
            let names: Vec<&str> = self.inner.templates.iter().map(|t| t.name.as_str()).collect();
            PromptError::TemplateFailed(if names.is_empty() {
                "the model has no chat template".into()
            } else {
                format!("the model has chat templates {names:?} but none named \"default\"")
            })
        })
    }

    /// Token ids the tokenizer can produce are below this: its largest id, added tokens included, plus
    /// one (ids may have gaps, so this is not the vocabulary's size). Walks the vocabulary: call once.
    /// Whether rendering depends only on the request: no template of the model reads the clock
    /// (`strftime_now`, as Llama 3's do for "Today Date"). Renders may then be reused for equal requests.
    pub fn renders_purely(&self) -> bool {
        self.inner.templates.iter().all(|t| !t.reads_clock)
    }

    pub fn vocab_size(&self) -> u32 {
        if let Some(m) = &self.mistral {
            return m.vocab_size();
        }
        let max = self.inner.tokenizer.get_vocab(true).into_values().max();
        max.map_or(0, |m| m.saturating_add(1))
    }

    /// Token ids of `text`, adding no special tokens (the template already has them), as vLLM
    /// tokenizes a rendered chat.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, PromptError> {
        self.encode_keeping(text, true)
    }

    /// [`PromptModel::encode`]; `keep` says whether the prompt may be extended by a later one (a
    /// conversation's), and so is worth keeping in the prefix cache even if it extended none itself.
    fn encode_keeping(&self, text: &str, keep: bool) -> Result<Vec<u32>, PromptError> {
        if let Some(m) = &self.mistral {
            return m.encode(text);
        }
        let segments = &self.inner.segments;
        segments.encode(&self.inner.tokenizer, text, keep).map_err(|e| PromptError::TokenizeFailed(e.to_string()))
    }

    #[cfg(test)]
    pub(crate) fn tokenizer(&self) -> &Tokenizer {
        &self.inner.tokenizer
    }

    /// The same model encoding with `tokenizers` only (no `mmrouter-tokenize`), for comparisons in
    /// benchmarks and tests. Its ids are the same; it is slower on text it has not cached.
    #[doc(hidden)]
    pub fn with_hf_tokenizer_only(&self) -> PromptModel {
        self.with_segments(segments::SegmentEncoder::new(&self.inner.tokenizer, None))
    }

    /// The same model without reuse of earlier prompts' prefixes (each text is split and served piece by
    /// piece from the segment cache), for comparisons in benchmarks. Its ids are the same.
    #[doc(hidden)]
    pub fn without_prefix_reuse(&self) -> PromptModel {
        let inner = &self.inner;
        self.with_segments(
            segments::SegmentEncoder::new(&inner.tokenizer, inner.segments.fast().cloned()).without_prefix_reuse(),
        )
    }

    /// The same model rendering every chat whole (no resumed conversations), for comparisons in
    /// benchmarks. Its texts are the same.
    #[doc(hidden)]
    pub fn without_render_resume(&self) -> PromptModel {
        let inner = &self.inner;
        let segments = segments::SegmentEncoder::new(&inner.tokenizer, inner.segments.fast().cloned());
        self.with_caches(segments, resume::Resume::off())
    }

    /// The same model with another segment encoder (and so empty caches).
    fn with_segments(&self, segments: segments::SegmentEncoder) -> PromptModel {
        self.with_caches(segments, Default::default())
    }

    fn with_caches(&self, segments: segments::SegmentEncoder, resume: resume::Resume) -> PromptModel {
        let inner = &self.inner;
        PromptModel {
            inner: Arc::new(Inner {
                tokenizer: inner.tokenizer.clone(),
                segments,
                specials_inert: inner.specials_inert,
                env: inner.env.clone(),
                templates: inner.templates.clone(),
                special_tokens: inner.special_tokens.clone(),
                forced_format: inner.forced_format,
                resume,
            }),
            mistral: self.mistral.clone(),
        }
    }

    /// Whether [`PromptModel::encode`] uses `mmrouter-tokenize` (the model's `tokenizer.json` is one it
    /// reproduces exactly) rather than `tokenizers`.
    pub fn fast_tokenizer(&self) -> bool {
        self.inner.segments.fast().is_some()
    }

    /// Token ids with the tokenizer's post-processor specials (e.g. BOS) when `add_special`.
    pub(crate) fn encode_with(&self, text: &str, add_special: bool) -> Result<Vec<u32>, PromptError> {
        if let Some(m) = &self.mistral {
            // mistral_common's `encode(text, bos=add_special, eos=False)`.
            let mut ids = if add_special { vec![m.bos()] } else { Vec::new() };
            ids.extend(m.encode(text)?);
            return Ok(ids);
        }
        if add_special && self.inner.specials_inert {
            // The post-processor adds nothing (Qwen's `ByteLevel`): the ids `encode` gives.
            return self.encode(text);
        }
        self.inner
            .tokenizer
            .encode_fast(text, add_special)
            .map(|enc| enc.get_ids().to_vec())
            .map_err(|e| PromptError::TokenizeFailed(e.to_string()))
    }

    /// The id of a token given by its literal text (e.g. "<|image_pad|>"), if it is one token.
    pub fn token_id(&self, literal: &str) -> Option<u32> {
        match &self.mistral {
            Some(m) => m.special_id(literal),
            None => self.inner.tokenizer.token_to_id(literal),
        }
    }

    /// The chat's rendering and ids: the template's text tokenized, or in Mistral tokenizer mode the ids
    /// mistral_common builds (one `[IMG]` per image) with a readable rendering.
    pub(crate) fn chat_ids(
        &self,
        request: &Request<'_>,
        opts: &RenderOptions<'_>,
    ) -> Result<(String, Vec<u32>), ChatIdsError> {
        let too_long = |text: &str| match opts.max_prompt_bytes.filter(|&l| text.len() > l) {
            Some(limit) => Err(ChatIdsError::TooLong { size: text.len(), limit }),
            None => Ok(()),
        };
        if let Some(m) = &self.mistral {
            let (text, ids) = m.encode_chat(request)?;
            too_long(&text)?;
            return Ok((text, ids));
        }
        let text = self.render_chat(request, opts)?;
        too_long(&text)?;
        // A chat with an assistant turn is a conversation under way: its next turn will extend it. A
        // one-off prompt is kept only if it extended a kept one (see `segments`).
        let history = request.messages.as_ref().is_ok_and(|m| m.iter().any(|m| m.role() == Some("assistant")));
        let ids = match request.field("add_special_tokens") {
            Some(Json::Bool(true)) => self.encode_with(&text, true)?,
            _ => self.encode_keeping(&text, history)?,
        };
        Ok((text, ids))
    }

    /// Loads a Mistral-format directory (`tekken.json`, or `tekken.json.gz`) for vLLM's
    /// `--tokenizer-mode mistral`.
    pub fn from_mistral_dir(dir: &Path) -> Result<PromptModel, PromptError> {
        let load_err = |detail: String| PromptError::ModelLoadFailed {
            source_name: dir.join("tekken.json").display().to_string(),
            detail,
        };
        let bytes = read_maybe_gz(dir, "tekken.json").map_err(load_err)?;
        let bytes = bytes.ok_or_else(|| load_err("neither tekken.json nor tekken.json.gz".into()))?;
        let mistral = mistral::MistralModel::from_json(&bytes).map_err(load_err)?;
        let tokenizer = Tokenizer::new(tokenizers::models::bpe::BPE::default());
        let mut model = PromptModel::build(tokenizer, None, &Json::Null, Vec::new()).map_err(load_err)?;
        model.mistral = Some(Arc::new(mistral));
        Ok(model)
    }

    /// In Mistral tokenizer mode, the image geometry `tekken.json` declares (`None` otherwise, or when
    /// it declares none).
    pub fn mistral_image_config(&self) -> Option<mmrouter_tokenize::TekkenImageConfig> {
        self.mistral.as_ref().and_then(|m| m.image_config())
    }

    pub fn is_mistral(&self) -> bool {
        self.mistral.is_some()
    }
}

/// Why [`PromptModel::chat_ids`] gave no ids.
#[derive(Debug)]
pub(crate) enum ChatIdsError {
    Prompt(PromptError),
    /// The rendered text is over `max_prompt_bytes` (not tokenized).
    TooLong {
        size: usize,
        limit: usize,
    },
}

impl From<PromptError> for ChatIdsError {
    fn from(e: PromptError) -> Self {
        ChatIdsError::Prompt(e)
    }
}

/// A processor template and where it came from.
struct ProcessorTemplate {
    source: String,
    /// Read from `chat_template.jinja`, which the tokenizer loads as its own template as well.
    from_jinja: bool,
}

/// `chat_template.jinja` (raw) or `chat_template.json` (`{"chat_template": "..."}`) beside the
/// tokenizer files: transformers' processor template, which vLLM prefers.
fn read_processor_template(dir: &Path) -> Result<Option<ProcessorTemplate>, (&'static str, String)> {
    match std::fs::read_to_string(dir.join("chat_template.jinja")) {
        Ok(source) => return Ok(Some(ProcessorTemplate { source, from_jinja: true })),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(("chat_template.jinja", e.to_string())),
    }
    match std::fs::read(dir.join("chat_template.json")) {
        Ok(bytes) => {
            let json: Json = serde_json::from_slice(&bytes).map_err(|e| ("chat_template.json", e.to_string()))?;
            match json.get("chat_template").and_then(Json::as_str) {
                Some(t) => Ok(Some(ProcessorTemplate { source: t.to_owned(), from_jinja: false })),
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

/// The template's variables besides `messages` and the special tokens, assembled as vLLM assembles
/// them (`build_chat_params` + `merge_kwargs`): the request's `chat_template_kwargs`, overridden by its
/// top-level `add_generation_prompt`, `continue_final_message`, `documents` and `reasoning_effort`
/// (null or `"auto"` values do not override); `tools` from the request unless the kwargs set it.
struct TemplateKwargs {
    tools: Option<Json>,
    vars: Map<String, Json>,
}

impl TemplateKwargs {
    fn from_request(req: &Request<'_>) -> Result<TemplateKwargs, PromptError> {
        let invalid = |why: String| PromptError::InvalidRequest(why);
        let mut vars = match req.field("chat_template_kwargs") {
            None => Map::new(),
            Some(Json::Object(kw)) => kw.clone(),
            Some(_) => return Err(invalid("`chat_template_kwargs` must be an object".into())),
        };
        if let Some(k) = FORBIDDEN_KWARGS.iter().find(|k| vars.contains_key(**k)) {
            return Err(invalid(format!("chat_template_kwargs.{k} is not accepted")));
        }
        if req.field("chat_template").is_some() {
            // vLLM refuses a request's own template unless started with --trust-request-chat-template.
            return Err(invalid("a request `chat_template` is refused by vLLM by default".into()));
        }
        let add_generation_prompt = bool_field(req, "add_generation_prompt")?.unwrap_or(true);
        let continue_final = bool_field(req, "continue_final_message")?.unwrap_or(false);
        if add_generation_prompt && continue_final {
            return Err(invalid("`add_generation_prompt` and `continue_final_message` cannot both be true".into()));
        }
        vars.insert("add_generation_prompt".into(), add_generation_prompt.into());
        vars.insert("continue_final_message".into(), continue_final.into());
        if let Some(d) = req.field("documents") {
            vars.insert("documents".into(), d.clone());
        }
        if let Some(effort) = req.field("reasoning_effort").filter(|v| v.as_str() != Some("auto")) {
            if !vars.contains_key("enable_thinking") {
                vars.insert("enable_thinking".into(), (effort.as_str() != Some("none")).into());
            }
            vars.insert("reasoning_effort".into(), effort.clone());
        }
        let tools = match vars.remove("tools") {
            Some(t) => Some(t).filter(|t| !t.is_null()),
            None => match req.field("tools") {
                Some(Json::Array(list)) if list.is_empty() => None,
                Some(t) => Some(t.clone()),
                None => None,
            },
        };
        Ok(TemplateKwargs { tools, vars })
    }

    /// What a request without tools, documents or template kwargs passes, `add_generation_prompt`
    /// aside.
    fn plain(generation: bool) -> TemplateKwargs {
        let mut vars = Map::new();
        vars.insert("add_generation_prompt".into(), generation.into());
        vars.insert("continue_final_message".into(), false.into());
        TemplateKwargs { tools: None, vars }
    }

    /// Whether these are [`TemplateKwargs::plain`]`(true)`.
    fn is_plain(&self) -> bool {
        self.tools.is_none()
            && self.vars.len() == 2
            && self.vars.get("add_generation_prompt") == Some(&Json::Bool(true))
            && self.vars.get("continue_final_message") == Some(&Json::Bool(false))
    }

    fn flag(&self, key: &str) -> bool {
        self.vars.get(key).and_then(Json::as_bool).unwrap_or(false)
    }

    /// The context entries after the special tokens (later entries override earlier ones).
    fn into_context(self, messages: Value) -> Result<Vec<(String, Value)>, PromptError> {
        // transformers always passes these, as None when absent: `tools is none` must hold without tools.
        let tools = match &self.tools {
            Some(t) => conversation::tools(t)?,
            None => Value::from(()),
        };
        let mut ctx = vec![("tools".to_owned(), tools), ("documents".to_owned(), Value::from(()))];
        ctx.extend(self.vars.into_iter().map(|(k, v)| (k, Value::from(Serde(&v)))));
        ctx.push(("messages".to_owned(), messages));
        Ok(ctx)
    }
}

/// The messages of a request whose rendering may resume a kept prefix (`resume`): plain kwargs, a
/// template that does not read the clock, no developer message (those may be merged into the
/// system prompt), and no image part when images become numbered placeholders in string content.
fn resumable<'r>(
    request: &'r Request<'_>,
    kwargs: &TemplateKwargs,
    info: &TemplateInfo,
    format: ContentFormat,
) -> Option<&'r [Message]> {
    let messages = request.messages.as_deref().ok()?;
    let image =
        |m: &Message| matches!(m.content(), Some(Entry::Parts(p)) if p.iter().any(|p| matches!(p, Part::Image(_))));
    let numbered_images = format == ContentFormat::String && messages.iter().any(image);
    let developer = messages.iter().any(|m| m.role() == Some("developer"));
    (kwargs.is_plain() && !info.reads_clock && !developer && !numbered_images).then_some(messages)
}

fn bool_field(request: &Request<'_>, key: &str) -> Result<Option<bool>, PromptError> {
    match request.field(key) {
        None => Ok(None),
        Some(Json::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(PromptError::InvalidRequest(format!("`{key}` must be a boolean"))),
    }
}

/// transformers 5's `continue_final_message`: the final message carried [`CONTINUE_TAG`]; cut the
/// rendered text right before it (keeping the content's trailing whitespace), or, if the template
/// trimmed the tag's space, before the bare tag with trailing whitespace stripped.
fn cut_at_continue_tag(mut text: String) -> Result<String, PromptError> {
    if let Some(at) = text.rfind(CONTINUE_TAG) {
        text.truncate(at);
        return Ok(text);
    }
    let bare = CONTINUE_TAG.trim_end();
    let at = text.rfind(bare).ok_or_else(|| {
        PromptError::TemplateFailed(
            "continue_final_message: the final message does not appear in the rendered chat".into(),
        )
    })?;
    text.truncate(at);
    let kept = text.trim_end_matches(py_is_space).len();
    text.truncate(kept);
    Ok(text)
}

/// Python's `str.isspace` (Rust's `char::is_whitespace` lacks U+001C–U+001F).
fn py_is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// The special tokens transformers 5 passes to a template: `bos_token`, `eos_token`, `unk_token`,
/// `pad_token`, `mask_token` and the model's named `extra_special_tokens` (e.g. Gemma 3's
/// `boi_token`, `image_token`), as strings.
fn special_tokens(config: &Json) -> Vec<(String, Value)> {
    let mut out: Vec<(String, Value)> = ["bos_token", "eos_token", "unk_token", "pad_token", "mask_token"]
        .iter()
        .filter_map(|k| config.get(*k).and_then(token_text).map(|t| ((*k).to_owned(), Value::from(t))))
        .collect();
    if let Some(extra) = config.get("extra_special_tokens").and_then(Json::as_object) {
        for (k, v) in extra {
            if let Some(t) = token_text(v) {
                out.push((k.clone(), Value::from(t)));
            }
        }
    }
    out
}

/// `name` from `dir`, or `name.gz` decompressed; `None` when neither exists.
fn read_maybe_gz(dir: &Path, name: &str) -> Result<Option<Vec<u8>>, String> {
    match std::fs::read(dir.join(name)) {
        Ok(bytes) => return Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.to_string()),
    }
    match std::fs::read(dir.join(format!("{name}.gz"))) {
        Ok(bytes) => gunzip(&bytes).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.to_string()),
    }
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

/// Tokenizer classes whose transformers 5 implementation replaces the file's normalizer and
/// pre-tokenizer with a SentencePiece-style `Metaspace` (`LlamaTokenizer`, also used for Mistral
/// checkpoints), and the model types that select it when `tokenizer_class` is absent.
const LLAMA_CLASSES: [&str; 2] = ["LlamaTokenizer", "LlamaTokenizerFast"];
const LLAMA_MODEL_TYPES: [&str; 2] = ["llama", "mistral"];
/// Model types whose hub `tokenizer_class` transformers (5.19, vLLM 0.32's) overrides with the file
/// as it is (`MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS`): LLaVA's `Prepend` normalizer stays, so a
/// `▁` follows every special token (checked against `vllm launch render`).
const FILE_AS_IS_MODEL_TYPES: [&str; 7] = ["llava", "llava_next", "vipllava", "phi3", "phi3_v", "smolvlm", "qwen2"];

/// transformers 5 (what vLLM ≥ 0.30 runs) takes only the vocabulary and merges from `tokenizer.json`
/// and builds the rest from the tokenizer class. For `LlamaTokenizer` that is: no normalizer, and a
/// `Metaspace("▁")` pre-tokenizer that prepends to the first piece of the input only (`legacy=false`,
/// `add_prefix_space=true` by default; `legacy=true` prepends to every piece, `add_prefix_space=false`
/// to none). Other classes, and the model types transformers loads from the file whatever their
/// class, keep the file as it is.
fn transformers_architecture(json: Vec<u8>, config: &Json, model_type: Option<&str>) -> Result<Vec<u8>, String> {
    if model_type.is_some_and(|t| FILE_AS_IS_MODEL_TYPES.contains(&t)) {
        return Ok(json);
    }
    let class = config.get("tokenizer_class").and_then(Json::as_str);
    let llama = match class {
        Some(c) => LLAMA_CLASSES.contains(&c),
        None => model_type.is_some_and(|t| LLAMA_MODEL_TYPES.contains(&t)),
    };
    if !llama {
        return Ok(json);
    }
    let flag = |key: &str, default: bool| config.get(key).and_then(Json::as_bool).unwrap_or(default);
    let scheme = match (flag("add_prefix_space", true), flag("legacy", false)) {
        (false, _) => "never",
        (true, true) => "always",
        (true, false) => "first",
    };
    let mut value: Json = serde_json::from_slice(&json).map_err(|e| e.to_string())?;
    value["normalizer"] = Json::Null;
    value["pre_tokenizer"] =
        serde_json::json!({"type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": scheme, "split": false});
    serde_json::to_vec(&value).map_err(|e| e.to_string())
}

/// `tokenizer.json` bytes without the named added tokens (for profiles whose real tokenizer is the
/// shared one minus a few additions).
fn json_without(json: Vec<u8>, drop: &[&str]) -> Result<Vec<u8>, String> {
    if drop.is_empty() {
        return Ok(json);
    }
    let mut value: Json = serde_json::from_slice(&json).map_err(|e| format!("tokenizer.json: {e}"))?;
    let added =
        value.get_mut("added_tokens").and_then(Json::as_array_mut).ok_or("tokenizer.json: no `added_tokens` list")?;
    added.retain(|t| !t.get("content").and_then(Json::as_str).is_some_and(|c| drop.contains(&c)));
    serde_json::to_vec(&value).map_err(|e| format!("tokenizer.json: {e}"))
}

/// `mmrouter-tokenize`'s encoder for the `tokenizer.json` bytes `tokenizers` loaded, or `None` when
/// it does not reproduce that configuration exactly (then `tokenizers` encodes everything).
fn fast_tokenizer(json: &[u8]) -> Option<FastTokenizer> {
    match FastTokenizer::from_json(json) {
        // An idle router cuts a long prompt's text into parts tokenized on the spare cores.
        Ok(fast) => Some(fast.with_parallel_parts(true)),
        Err(why) => {
            tracing::debug!(reason = why.reason(), "tokenizer not supported by mmrouter-tokenize; using tokenizers");
            None
        }
    }
}

/// True when `encode_fast(text, true)` gives the same ids as `encode_fast(text, false)`: the
/// post-processor is absent or `ByteLevel` (which only trims offsets). Anything else may add ids.
fn specials_inert(tokenizer: &Tokenizer) -> bool {
    matches!(tokenizer.get_post_processor(), None | Some(PostProcessorWrapper::ByteLevel(_)))
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
    fn continue_final_cuts_at_the_tag() {
        // The template kept the content as is: cut right before the tag, trailing spaces kept.
        assert_eq!(cut_at_continue_tag(format!("<a>Hi  {CONTINUE_TAG}</a>")).unwrap(), "<a>Hi  ");
        // The template trimmed the content (and the tag's space): cut and strip.
        assert_eq!(cut_at_continue_tag("<a>Hi  CONTINUE_FINAL_MESSAGE_TAG</a>".into()).unwrap(), "<a>Hi");
        let missing = cut_at_continue_tag("<a>other</a>".into()).unwrap_err();
        assert_eq!(missing.label(), "template_failed");
    }

    #[test]
    fn special_tokens_are_the_named_ones() {
        let config = serde_json::json!({"bos_token": "<bos>", "eos_token": {"content": "<eot>"}, "pad_token": null,
            "additional_special_tokens": ["<x>"], "extra_special_tokens": {"image_token": "<img>"}});
        let names: Vec<String> = special_tokens(&config).into_iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(names, ["bos_token=<bos>", "eos_token=<eot>", "image_token=<img>"]);
    }

    #[test]
    fn gunzip_rejects_garbage() {
        assert!(gunzip(b"not gzip").is_err());
    }
}
