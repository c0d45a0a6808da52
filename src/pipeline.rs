//! Stages **intake → account → plan** and **the gate**: turn one request into one [`RoutePlan`].
//!
//! The gate (after Dynamo PR #16947): a request with images is planned `Exact` only if *every* image
//! was fetched/decoded, probed, accounted and expanded. Any failure anywhere makes the whole request a
//! `TextPrefix { reason }` plan whose blocks are only those before the first image; nothing from the
//! images that did succeed survives into the plan (no image tokens, no image spans, no image blocks).
//! Metrics are recorded from the finished plan in [`RoutePlan::observe_dispatch`], so a fallback can
//! never leave a partial image-token sample behind.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use crate::accounting::{AccountingError, Counter, Family, ImageTokens, RequestContext};
use crate::config::Config;
use crate::error::ApiError;
use crate::media::{self, Intake};
use crate::metrics as m;
use crate::plan::{self, ImageSpan};
use crate::prompt::PromptModel;
use crate::routing::{Decision, SelectRequest};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completion => "/v1/completions",
        }
    }
}

/// How a request is routed (the `x-mmrouter-route` header and the `route` metric label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Every image accounted exactly: blocks cover the whole prompt, images included.
    Exact,
    /// Some image (or the model) could not be accounted: blocks cover only the text before the first image.
    TextPrefix { reason: &'static str },
    /// No media in the request: blocks cover the whole prompt.
    NoMedia,
    /// A non-inference `/v1/*` call forwarded as is.
    Passthrough,
}

impl Route {
    pub fn label(&self) -> &'static str {
        match self {
            Route::Exact => "exact",
            Route::TextPrefix { .. } => "text_prefix",
            Route::NoMedia => "no_media",
            Route::Passthrough => "passthrough",
        }
    }
}

/// One accounted image of an exact plan.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PlannedImage {
    pub hash: String,
    pub width: u32,
    pub height: u32,
    pub feature_tokens: u32,
    /// Tokens that replace the image's placeholder in the prompt.
    pub tokens: u32,
}

/// The decision for one request: what routing knows about its prompt, and (after select) the worker.
#[derive(Debug)]
pub struct RoutePlan {
    pub route: Route,
    /// Chained KV block keys routing matches against the index.
    pub blocks: Vec<u64>,
    pub block_size: u32,
    /// Prompt tokens routing is based on: the whole prompt (exact, no_media) or the text prefix.
    pub prompt_tokens: u32,
    /// True when `prompt_tokens` is the whole prompt the model sees (drift is then measurable).
    pub prompt_exact: bool,
    /// Exact plans only.
    pub images: Vec<PlannedImage>,
    pub spans: Vec<ImageSpan>,
    pub decode_tokens: u32,
    pub decision: Option<Decision>,
}

impl RoutePlan {
    pub fn passthrough(block_size: u32) -> RoutePlan {
        RoutePlan {
            route: Route::Passthrough,
            blocks: Vec::new(),
            block_size,
            prompt_tokens: 0,
            prompt_exact: false,
            images: Vec::new(),
            spans: Vec::new(),
            decode_tokens: 0,
            decision: None,
        }
    }

    pub fn select_request(&self) -> SelectRequest<'_> {
        SelectRequest {
            blocks: &self.blocks,
            block_size: self.block_size,
            prompt_tokens: self.prompt_tokens,
            decode_tokens: self.decode_tokens,
        }
    }

    /// Image tokens this request puts on its worker; zero unless the plan is exact.
    pub fn exact_image_tokens(&self) -> u32 {
        match self.route {
            Route::Exact => self.images.iter().map(|i| i.tokens).sum(),
            _ => 0,
        }
    }

    pub fn predicted_prompt_tokens(&self) -> Option<u32> {
        self.prompt_exact.then_some(self.prompt_tokens)
    }

    /// Stage **observe**: metrics recorded once the request is dispatched.
    pub fn observe_dispatch(&self, overlap_tokens: u32) {
        match self.route {
            Route::Exact => {
                metrics::histogram!(m::IMAGE_TOKENS_PER_REQUEST).record(self.exact_image_tokens() as f64);
                metrics::histogram!(m::IMAGES_PER_REQUEST).record(self.images.len() as f64);
            }
            Route::TextPrefix { reason } => {
                metrics::counter!(m::MM_FALLBACK_TOTAL, "reason" => reason).increment(1);
            }
            Route::NoMedia | Route::Passthrough => {}
        }
        if self.route != Route::Passthrough {
            metrics::histogram!(m::KV_OVERLAP_TOKENS, "route" => self.route.label()).record(overlap_tokens as f64);
        }
    }

    pub fn debug_json(&self) -> serde_json::Value {
        let reason = match self.route {
            Route::TextPrefix { reason } => Some(reason),
            _ => None,
        };
        let d = self.decision.as_ref();
        serde_json::json!({
            "route": self.route.label(),
            "reason": reason,
            "prompt_tokens": self.prompt_tokens,
            "prompt_tokens_exact": self.prompt_exact,
            "image_tokens": self.images.iter().map(|i| i.tokens).collect::<Vec<_>>(),
            "images": self.images,
            "block_size": self.block_size,
            "blocks": self.blocks.len(),
            "decode_tokens": self.decode_tokens,
            "overlap_blocks": d.map(|d| &d.overlap_blocks),
            "costs": d.map(|d| &d.costs),
            "policy": d.map(|d| d.policy),
        })
    }
}

/// What the gate needs from accounting. [`Counter`] implements it; tests inject counters that fail on
/// chosen images to exercise the gate independently of any model family.
pub trait ImageCounter: Send + Sync {
    /// Literal text of the one token the chat template emits per image.
    fn placeholder(&self) -> &str;
    /// Tokens for every image of one request (in order), or the first failure.
    fn count_request(
        &self,
        sizes: &[(u32, u32)],
        ctx: &RequestContext,
        request_kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<Vec<ImageTokens>, AccountingError>;
}

impl ImageCounter for Counter {
    fn placeholder(&self) -> &str {
        Counter::placeholder(self)
    }

    fn count_request(
        &self,
        sizes: &[(u32, u32)],
        ctx: &RequestContext,
        request_kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<Vec<ImageTokens>, AccountingError> {
        match request_kwargs {
            Some(kw) if !kw.is_empty() => self.with_request_kwargs(kw)?.count_all(sizes, ctx),
            _ => self.count_all(sizes, ctx),
        }
    }
}

/// The model-specific machinery, loaded once at start.
pub struct Pipeline {
    model: Arc<PromptModel>,
    /// `Err` when the model has no accounting profile: requests with images then fall back with its label.
    counter: Result<Arc<dyn ImageCounter>, AccountingError>,
    placeholder: Option<String>,
    model_name: String,
    block_size: u32,
    lora_adapters: HashSet<String>,
    exact_accounting: bool,
    default_decode_tokens: u32,
    max_model_len: Option<u32>,
    intake: Intake,
    reject_blocked_urls: bool,
}

/// Loads the prompt model and the accounting counter for `[model] dir` (bundled name or HF dir).
pub fn load_model(cfg: &crate::config::ModelConfig) -> anyhow::Result<(PromptModel, Result<Counter, AccountingError>)> {
    let family = match &cfg.family {
        Some(f) => Some(f.parse::<Family>().map_err(|_| anyhow::anyhow!("model.family: unknown family '{f}'"))?),
        None => None,
    };
    if PromptModel::bundled_names().contains(&cfg.dir.as_str()) {
        let prompt = PromptModel::bundled(&cfg.dir).map_err(|e| anyhow::anyhow!("model.dir '{}': {e}", cfg.dir))?;
        let file = |f: &str| -> anyhow::Result<serde_json::Value> {
            let bytes = PromptModel::bundled_file(&cfg.dir, f)
                .ok_or_else(|| anyhow::anyhow!("bundled profile '{}' lacks {f}", cfg.dir))?;
            Ok(serde_json::from_slice(bytes)?)
        };
        let counter = Counter::from_json(
            &file("preprocessor_config.json")?,
            &file("config.json")?,
            family,
            &cfg.processor_kwargs,
        );
        Ok((prompt, counter))
    } else {
        let dir = Path::new(&cfg.dir);
        if !dir.is_dir() {
            anyhow::bail!(
                "model.dir: '{}' is neither a bundled profile ({}) nor a directory",
                cfg.dir,
                PromptModel::bundled_names().join(", ")
            );
        }
        let prompt = PromptModel::from_dir(dir).map_err(|e| anyhow::anyhow!("model.dir '{}': {e}", cfg.dir))?;
        let counter = Counter::from_model_dir(dir, family, &cfg.processor_kwargs);
        Ok((prompt, counter))
    }
}

/// Why a request with images is not exact: the fallback reason label.
type Fallback = &'static str;

impl Pipeline {
    pub fn new(cfg: &Config) -> anyhow::Result<Pipeline> {
        let (model, counter) = load_model(&cfg.model)?;
        let counter = counter.map(|c| Arc::new(c) as Arc<dyn ImageCounter>);
        Self::with_counter(cfg, model, counter)
    }

    /// A pipeline with an explicit counter (tests use failing fakes to exercise the gate).
    pub fn with_counter(
        cfg: &Config,
        model: PromptModel,
        counter: Result<Arc<dyn ImageCounter>, AccountingError>,
    ) -> anyhow::Result<Pipeline> {
        if let Err(e) = &counter {
            tracing::warn!("image accounting unavailable for model.dir '{}': {e}; requests with images will route on their text prefix", cfg.model.dir);
        }
        let placeholder = counter.as_ref().ok().map(|c| c.placeholder().to_owned());
        Ok(Pipeline {
            model: Arc::new(model),
            counter,
            placeholder,
            model_name: cfg.model.name.clone().unwrap_or_else(|| cfg.model.dir.clone()),
            block_size: cfg.model.block_size,
            lora_adapters: cfg.model.lora_adapters.iter().cloned().collect(),
            exact_accounting: cfg.model.exact_accounting,
            default_decode_tokens: cfg.model.default_decode_tokens,
            max_model_len: cfg.model.max_model_len,
            intake: Intake::new(cfg.media.clone()).map_err(|e| anyhow::anyhow!("{e}"))?,
            reject_blocked_urls: cfg.media.reject_blocked_urls,
        })
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Builds the plan for one parsed request. Errors are client errors answered without forwarding.
    pub async fn plan(&self, endpoint: Endpoint, raw: &[u8], json: &serde_json::Value) -> Result<RoutePlan, ApiError> {
        let seed = self.seed(json);
        let decode_tokens = ["max_completion_tokens", "max_tokens"]
            .iter()
            .find_map(|k| json.get(*k).and_then(|v| v.as_u64()))
            .map(|v| v.min(u32::MAX as u64) as u32)
            .unwrap_or(self.default_decode_tokens);
        let mut out = RoutePlan {
            route: Route::NoMedia,
            blocks: Vec::new(),
            block_size: self.block_size,
            prompt_tokens: 0,
            prompt_exact: false,
            images: Vec::new(),
            spans: Vec::new(),
            decode_tokens,
            decision: None,
        };
        if endpoint == Endpoint::Completion {
            let t = Instant::now();
            match plan::tokenize_completion(&self.model, json) {
                Ok(ids) => self.set_blocks(&mut out, &ids, &[], seed, true),
                Err(e) => tracing::debug!("completion prompt not tokenized ({}): routing by load", e.label()),
            }
            m::stage(m::stage::PLAN, t.elapsed());
            return Ok(out);
        }

        // intake
        let t = Instant::now();
        let images: Result<Vec<media::ImageInfo>, Fallback> = match media::find_images(raw) {
            Err(e) => Err(e.label()),
            Ok(refs) if refs.is_empty() => Ok(Vec::new()),
            // Exact accounting off: never fetch; the request is a text-prefix plan by configuration.
            Ok(_) if !self.exact_accounting => Err("exact_disabled"),
            Ok(refs) => match self.intake.process(&refs).await {
                Ok(infos) => Ok(infos),
                Err(e) if e.is_blocked() && self.reject_blocked_urls => {
                    return Err(ApiError::bad_request("image_url_blocked", e.to_string()));
                }
                Err(e) => Err(e.label()),
            },
        };
        m::stage(m::stage::INTAKE, t.elapsed());
        let has_media = !matches!(&images, Ok(v) if v.is_empty());

        // The template does not depend on the images (each part renders as one placeholder), and
        // request-wide accounting needs the text token count, so tokenize first.
        let t = Instant::now();
        let tokens = match self.placeholder.as_deref() {
            Some(p) => plan::tokenize_chat(&self.model, json, p),
            // No accounting profile: the image positions are unknown, the text still routes.
            None => self
                .model
                .render_chat(json)
                .and_then(|text| self.model.encode(&text))
                .map(|ids| plan::ChatTokens { ids, placeholders: Vec::new() }),
        };
        let plan_time = t.elapsed();

        // account: every image or none
        let t = Instant::now();
        let ctx = RequestContext {
            max_model_len: self.max_model_len,
            text_tokens: tokens
                .as_ref()
                .ok()
                .map(|t| (t.ids.len() - t.placeholders.len()).min(u32::MAX as usize) as u32),
        };
        let accounted = images.and_then(|infos| self.account(json, &ctx, infos));
        m::stage(m::stage::ACCOUNT, t.elapsed());

        // plan
        let t = Instant::now();
        match (tokens, accounted) {
            // An image that cannot be accounted is the reason, whatever else also failed.
            (tokens, Err(reason)) => {
                out.route = Route::TextPrefix { reason };
                // Without a known placeholder the image position is unknown: route by load only.
                if let (Ok(tokens), Some(_)) = (&tokens, &self.placeholder) {
                    self.set_blocks(&mut out, plan::text_prefix(tokens), &[], seed, false);
                }
            }
            (Err(e), Ok(_)) if has_media => out.route = Route::TextPrefix { reason: e.label() },
            (Err(e), Ok(_)) => tracing::debug!("chat template failed ({e}); routing by load only"),
            (Ok(tokens), Ok(acc)) if acc.is_empty() && tokens.placeholders.is_empty() => {
                self.set_blocks(&mut out, &tokens.ids, &[], seed, true);
            }
            (Ok(tokens), Ok(acc)) => {
                let runs: Vec<(u128, &[crate::accounting::RunPart])> =
                    acc.iter().map(|a| (a.hash, a.run.as_slice())).collect();
                match plan::expand(&self.model, &tokens, &runs) {
                    Ok(expanded) => {
                        out.route = Route::Exact;
                        self.set_blocks(&mut out, &expanded.ids, &expanded.spans, seed, true);
                        out.spans = expanded.spans;
                        out.images = acc.into_iter().map(|a| a.planned).collect();
                    }
                    Err(e) => {
                        out.route = Route::TextPrefix { reason: e.label() };
                        self.set_blocks(&mut out, plan::text_prefix(&tokens), &[], seed, false);
                    }
                }
            }
        }
        m::stage(m::stage::PLAN, plan_time + t.elapsed());
        Ok(out)
    }

    /// Accounts all images of the request, or returns the first failure's label.
    fn account(
        &self,
        json: &serde_json::Value,
        ctx: &RequestContext,
        infos: Vec<media::ImageInfo>,
    ) -> Result<Vec<Accounted>, Fallback> {
        if infos.is_empty() {
            return Ok(Vec::new());
        }
        let counter = self.counter.as_ref().map_err(|e| e.label())?;
        let request_kwargs = json.get("mm_processor_kwargs").and_then(|v| v.as_object());
        let sizes: Vec<(u32, u32)> = infos.iter().map(|i| (i.width, i.height)).collect();
        let counts = counter.count_request(&sizes, ctx, request_kwargs).map_err(|e| e.label())?;
        if counts.len() != infos.len() {
            return Err("placeholder_mismatch");
        }
        infos
            .into_iter()
            .zip(counts)
            .map(|(info, tokens)| {
                let run = tokens.run().ok_or("expansion_unknown")?;
                let len = run.iter().map(|p| p.repeat).try_fold(0u32, |a, r| a.checked_add(r)).ok_or("overflow")?;
                Ok(Accounted {
                    hash: info.hash,
                    run,
                    planned: PlannedImage {
                        hash: format!("{:032x}", info.hash),
                        width: info.width,
                        height: info.height,
                        feature_tokens: tokens.feature_tokens,
                        tokens: len,
                    },
                })
            })
            .collect()
    }

    fn set_blocks(&self, out: &mut RoutePlan, ids: &[u32], spans: &[ImageSpan], seed: u64, whole: bool) {
        out.prompt_tokens = ids.len().min(u32::MAX as usize) as u32;
        out.prompt_exact = whole;
        out.blocks = plan::block_keys(ids, spans, self.block_size as usize, seed);
    }

    /// Block-hash seed: the model identity, the LoRA adapter the request names, and its cache_salt.
    fn seed(&self, json: &serde_json::Value) -> u64 {
        let lora = json.get("model").and_then(|v| v.as_str()).filter(|m| self.lora_adapters.contains(*m));
        let salt = json.get("cache_salt").and_then(|v| v.as_str());
        plan::seed(&self.model_name, lora, salt)
    }
}

struct Accounted {
    hash: u128,
    run: Vec<crate::accounting::RunPart>,
    planned: PlannedImage,
}
