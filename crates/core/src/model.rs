//! Where a model's files come from — a profile bundled into the binary, or an HF model directory —
//! and what the pipeline needs to know about the served model. One loader for every user (the proxy,
//! the simulator, `mmrouter count`), so a bundled profile and its directory twin load the same way.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::accounting::video::{VideoCounter, VideoIo};
use crate::accounting::{AccountingError, Counter, Family};
use crate::prompt::{ContentFormat, PromptError, PromptModel};

/// A model's files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSource {
    /// A profile compiled into the binary (`qwen3-vl`, `qwen2.5-vl`).
    Bundled(&'static str),
    /// An HF model directory (`config.json`, `preprocessor_config.json`, `tokenizer.json`, …).
    Dir(PathBuf),
}

impl ModelSource {
    /// A bundled profile name, or an existing directory.
    pub fn parse(s: &str) -> Result<ModelSource, String> {
        if let Some(name) = PromptModel::bundled_names().iter().find(|n| **n == s) {
            return Ok(ModelSource::Bundled(name));
        }
        let dir = Path::new(s);
        if s.trim().is_empty() || !dir.is_dir() {
            return Err(format!(
                "'{s}' is neither a bundled profile ({}) nor a directory",
                PromptModel::bundled_names().join(", ")
            ));
        }
        Ok(ModelSource::Dir(dir.to_path_buf()))
    }

    /// The name as configured (the default model identity for block hashes).
    pub fn label(&self) -> String {
        match self {
            ModelSource::Bundled(name) => (*name).to_owned(),
            ModelSource::Dir(dir) => dir.display().to_string(),
        }
    }

    /// The chat template(s) and tokenizer.
    pub fn load_prompt(&self) -> Result<PromptModel, PromptError> {
        self.load_prompt_as(TokenizerMode::Auto)
    }

    /// The prompt builder for `mode` (resolved as vLLM resolves `auto`).
    pub fn load_prompt_as(&self, mode: TokenizerMode) -> Result<PromptModel, PromptError> {
        match (self, self.resolve_mode(mode)) {
            (ModelSource::Bundled(name), _) => PromptModel::bundled(name),
            (ModelSource::Dir(dir), TokenizerMode::Mistral) => PromptModel::from_mistral_dir(dir),
            (ModelSource::Dir(dir), _) => PromptModel::from_dir(dir),
        }
    }

    /// vLLM's `auto`: Mistral mode for a Mistral-format checkpoint (`tekken.json` beside
    /// `consolidated*.safetensors`). A directory with `tekken.json` and no `tokenizer.json` (the router
    /// needs no weights) can only be read that way, so it is Mistral too.
    pub fn resolve_mode(&self, mode: TokenizerMode) -> TokenizerMode {
        let ModelSource::Dir(dir) = self else { return TokenizerMode::Hf };
        if mode != TokenizerMode::Auto {
            return mode;
        }
        let has = |f: &str| dir.join(f).is_file() || dir.join(format!("{f}.gz")).is_file();
        let consolidated = std::fs::read_dir(dir).into_iter().flatten().flatten().any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("consolidated") && name.ends_with(".safetensors")
        });
        match has("tekken.json") && (consolidated || !has("tokenizer.json")) {
            true => TokenizerMode::Mistral,
            false => TokenizerMode::Hf,
        }
    }

    /// The image-token counter, with the server's `processor_kwargs` applied.
    pub fn load_counter(
        &self,
        family: Option<Family>,
        kwargs: &Map<String, Value>,
    ) -> Result<Counter, AccountingError> {
        match self {
            ModelSource::Bundled(name) => {
                let file = |f: &'static str| -> Result<Value, AccountingError> {
                    let bytes = PromptModel::bundled_file(name, f).ok_or_else(|| AccountingError::ConfigFile {
                        file: f.to_owned(),
                        detail: format!("bundled profile '{name}' lacks it"),
                    })?;
                    serde_json::from_slice(bytes)
                        .map_err(|e| AccountingError::ConfigFile { file: f.to_owned(), detail: e.to_string() })
                };
                Counter::from_json(&file("preprocessor_config.json")?, &file("config.json")?, family, kwargs)
            }
            ModelSource::Dir(dir) => Counter::from_model_dir(dir, family, kwargs),
        }
    }

    /// The video-token counter of a model of `family`: the video processor's settings from
    /// `video_preprocessor_config.json`, else (as transformers falls back) `preprocessor_config.json`,
    /// the server's `processor_kwargs` (not modelled for video: an error when any is set) and the
    /// engines' `--media-io-kwargs` (`media_io_kwargs`, its `video` object).
    pub fn load_video_counter(
        &self,
        family: Family,
        processor_kwargs: &Map<String, Value>,
        media_io_kwargs: &Map<String, Value>,
    ) -> Result<VideoCounter, AccountingError> {
        let io = VideoIo::parse(media_io_kwargs)?;
        let parse = |file: &str, bytes: &[u8]| -> Result<Value, AccountingError> {
            serde_json::from_slice(bytes)
                .map_err(|e| AccountingError::ConfigFile { file: file.to_owned(), detail: e.to_string() })
        };
        let processor = match self {
            ModelSource::Bundled(name) => {
                let found = ["video_preprocessor_config.json", "preprocessor_config.json"]
                    .into_iter()
                    .find_map(|f| PromptModel::bundled_file(name, f).map(|b| (f, b)));
                let (file, bytes) = found.ok_or_else(|| AccountingError::ConfigFile {
                    file: "preprocessor_config.json".into(),
                    detail: format!("bundled profile '{name}' lacks it"),
                })?;
                parse(file, bytes)?
            }
            ModelSource::Dir(dir) => {
                let video = dir.join("video_preprocessor_config.json");
                let path = if video.is_file() { video } else { dir.join("preprocessor_config.json") };
                let bytes = std::fs::read(&path).map_err(|e| AccountingError::ConfigFile {
                    file: path.display().to_string(),
                    detail: e.to_string(),
                })?;
                parse(&path.display().to_string(), &bytes)?
            }
        };
        VideoCounter::new(family, &processor, processor_kwargs, io)
    }
}

/// How the workers build prompt ids (vLLM's `--tokenizer-mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TokenizerMode {
    /// As vLLM decides: Mistral for Mistral-format checkpoints, else HF.
    #[default]
    Auto,
    /// The HF chat template and `tokenizer.json`.
    Hf,
    /// mistral_common on `tekken.json` (no template).
    Mistral,
}

impl TokenizerMode {
    pub fn parse(s: &str) -> Result<TokenizerMode, String> {
        match s {
            "auto" => Ok(TokenizerMode::Auto),
            "hf" => Ok(TokenizerMode::Hf),
            "mistral" => Ok(TokenizerMode::Mistral),
            other => Err(format!("'{other}' is not auto, hf or mistral")),
        }
    }
}

/// The served model as the pipeline sees it (the `[model]` section, validated).
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSpec {
    pub source: ModelSource,
    /// Model identity used to seed block hashes. Workers sharing a cache must agree.
    pub name: String,
    /// Accounting family override; auto-detected from the HF files when `None`.
    pub family: Option<Family>,
    /// KV block size of the pool (vLLM `--block-size`).
    pub block_size: u32,
    /// Mirrors the workers' `--mm-processor-kwargs`; applied on top of `preprocessor_config.json`.
    pub processor_kwargs: Map<String, Value>,
    /// Request `model` values that name LoRA adapters: they seed block hashes differently.
    pub lora_adapters: Vec<String>,
    /// false: never account images; requests with images route on their text prefix only.
    pub exact_accounting: bool,
    /// Decode tokens assumed for load when the request sets no `max_tokens`.
    pub default_decode_tokens: u32,
    /// The workers' `--max-model-len`; only request-wide accounting families (Nemotron Omni) need it.
    pub max_model_len: Option<u32>,
    /// A chat template that replaces the model's own (the workers' `--chat-template`), as text.
    pub chat_template: Option<String>,
    /// The workers' `--chat-template-content-format`; `None` is vLLM's `auto` (detected per template).
    pub content_format: Option<ContentFormat>,
    /// The workers' `--tokenizer-mode`.
    pub tokenizer_mode: TokenizerMode,
    /// Largest rendered prompt (bytes of text, before tokenizing) a request may have; beyond it the
    /// request is refused rather than tokenized (bounded work per request).
    pub max_prompt_bytes: usize,
    /// Largest prompt in tokens (text and image tokens) a request may have.
    pub max_prompt_tokens: u32,
    /// Mirrors the workers' `--media-io-kwargs` (its `video` object changes a video's count).
    pub media_io_kwargs: Map<String, Value>,
    /// Mirrors the workers' `--trust-request-mm-kwargs`: a request's own `media_io_kwargs` /
    /// `mm_processor_kwargs` are counted for its videos only when set (vLLM refuses them otherwise).
    pub trust_request_mm_kwargs: bool,
}

/// Default `max_prompt_bytes`: 4 MiB, about a million tokens of English, above every context here.
pub const DEFAULT_MAX_PROMPT_BYTES: usize = 4 * 1024 * 1024;
/// Default `max_prompt_tokens`.
pub const DEFAULT_MAX_PROMPT_TOKENS: u32 = 1 << 20;

impl ModelSpec {
    /// The defaults for `source`: block size 16, exact accounting on, 256 decode tokens assumed.
    pub fn new(source: ModelSource) -> ModelSpec {
        ModelSpec {
            name: source.label(),
            source,
            family: None,
            block_size: 16,
            processor_kwargs: Map::new(),
            lora_adapters: Vec::new(),
            exact_accounting: true,
            default_decode_tokens: 256,
            max_model_len: None,
            chat_template: None,
            content_format: None,
            tokenizer_mode: TokenizerMode::Auto,
            max_prompt_bytes: DEFAULT_MAX_PROMPT_BYTES,
            max_prompt_tokens: DEFAULT_MAX_PROMPT_TOKENS,
            media_io_kwargs: Map::new(),
            trust_request_mm_kwargs: false,
        }
    }
}
