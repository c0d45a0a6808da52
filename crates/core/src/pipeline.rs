//! Stages **intake → account → plan** and **the gate**: turn one request into one [`RoutePlan`].
//!
//! The gate (after Dynamo PR #16947): a request with images is planned `Exact` only if *every* image
//! was fetched/decoded, probed, accounted and expanded. Any failure anywhere makes the whole request a
//! `TextPrefix { reason }` plan whose blocks are only those before the first image; nothing from the
//! images that did succeed survives into the plan (no image tokens, no image spans, no image blocks).
//! Nothing here records metrics: [`Pipeline::plan`] returns the finished plan with its stage timings
//! as values, and the server's observe stage records them, so a fallback can never leave a partial
//! image-token sample behind.

use std::collections::HashSet;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::accounting::{AccountingError, Counter, ImageTokens, RequestContext, RunPart, TextExpansion};
use crate::keys::image_key;
use crate::media::{ImageInfo, Intake, MediaConfig, MediaError, ProbeTiming};
use crate::model::ModelSpec;
use crate::plan::{self, ChatTokens, ImageSpan, PlanError};
use crate::prompt::{PromptError, PromptModel, RenderOptions};
use crate::request::{Endpoint, ImagePart, Request};

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
    /// The image's identifier: the hex BLAKE3 digest of its bytes (the `uuid` written for vLLM), or the
    /// client's own uuid under `trust_client_uuids`.
    pub hash: String,
    /// Where to write `"uuid": hash` into the forwarded body (nothing when the client's uuid is trusted).
    #[serde(skip)]
    pub splice: Option<UuidSplice>,
    pub width: u32,
    pub height: u32,
    pub feature_tokens: u32,
    /// Tokens that replace the image's placeholder in the prompt.
    pub tokens: u32,
}

/// Where an image part's `uuid` goes in the received body: replacing the client's value, or as a new
/// field right after the part's `image_url` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UuidSplice {
    pub image_url: Range<usize>,
    pub existing: Option<Range<usize>>,
}

/// The body with each exact image's `uuid` written in (vLLM then names the image as the router does);
/// every other byte stays as received.
pub fn splice_uuids(body: &[u8], images: &[PlannedImage]) -> Vec<u8> {
    let mut edits: Vec<(Range<usize>, String)> = images
        .iter()
        .filter_map(|img| {
            let splice = img.splice.as_ref()?;
            Some(match &splice.existing {
                Some(value) => (value.clone(), format!("\"{}\"", img.hash)),
                None => (splice.image_url.end..splice.image_url.end, format!(",\"uuid\":\"{}\"", img.hash)),
            })
        })
        .collect();
    edits.sort_by_key(|(r, _)| r.start);
    let mut out = Vec::with_capacity(body.len() + 80 * edits.len());
    let mut at = 0;
    for (range, text) in edits {
        out.extend_from_slice(&body[at..range.start]);
        out.extend_from_slice(text.as_bytes());
        at = range.end;
    }
    out.extend_from_slice(&body[at..]);
    out
}

/// What the pipeline decided about one request's prompt: the route and what routing matches on.
/// Selection results are not part of it: the caller holds the selection's decision.
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
    /// The request carries `mm_processor_kwargs` or `media_io_kwargs`: vLLM then hashes each image's
    /// uuid together with them, so its KV events name these images differently from the router.
    pub images_rehashed: bool,
}

impl RoutePlan {
    fn empty(route: Route, block_size: u32, decode_tokens: u32) -> RoutePlan {
        RoutePlan {
            route,
            blocks: Vec::new(),
            block_size,
            prompt_tokens: 0,
            prompt_exact: false,
            images: Vec::new(),
            spans: Vec::new(),
            decode_tokens,
            images_rehashed: false,
        }
    }

    /// A non-inference `/v1/*` call: forwarded as is, routed by load.
    pub fn passthrough(block_size: u32) -> RoutePlan {
        RoutePlan::empty(Route::Passthrough, block_size, 0)
    }

    /// Index of the first block holding image tokens; `blocks.len()` when none does.
    pub fn first_image_block(&self) -> usize {
        let first = self.spans.first().map(|s| (s.offset / self.block_size.max(1)) as usize);
        first.unwrap_or(self.blocks.len()).min(self.blocks.len())
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

    /// The fallback reason of a text-prefix plan.
    pub fn fallback_reason(&self) -> Option<&'static str> {
        match self.route {
            Route::TextPrefix { reason } => Some(reason),
            _ => None,
        }
    }
}

/// Time spent in each stage of [`Pipeline::plan`] (the `mmrouter_stage_duration_seconds` samples).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StageTimings {
    /// `None` for completions (no images to read or account).
    pub intake: Option<Duration>,
    pub account: Option<Duration>,
    pub plan: Duration,
}

/// The outcome of planning: the plan, and what happened on the way (for the observe stage).
#[derive(Debug)]
pub struct Planned {
    pub plan: RoutePlan,
    pub timings: StageTimings,
    /// One sample per image read (data URL or fetch).
    pub probes: Vec<ProbeTiming>,
    /// The prompt as routing saw it, when asked for ([`Pipeline::plan_with`]).
    pub trace: Option<PromptTrace>,
}

/// What the model sees, as the router computed it: for operators to compare with the worker's own
/// rendering (`/debug/route?tokens=true`, `mmrouter render`).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PromptTrace {
    /// The rendered chat (before image expansion); `None` for completions.
    pub text: Option<String>,
    /// The token ids the plan's blocks are cut from: the whole prompt, or the text prefix of a
    /// fallback.
    pub ids: Vec<u32>,
    /// Where each image's tokens sit in `ids` (exact plans only).
    pub spans: Vec<ImageSpan>,
}

/// A plan being built, with its trace if one was asked for.
struct Draft {
    plan: RoutePlan,
    trace: Option<PromptTrace>,
}

/// A request the pipeline refuses to route (the proxy answers it with a client error).
#[derive(Debug, thiserror::Error)]
pub enum Rejection {
    /// `media.reject_blocked_urls` is on and an image URL is blocked by the SSRF guard.
    #[error("{0}")]
    BlockedImageUrl(MediaError),
    /// An image part names its own `uuid` where the router cannot replace it with a content hash (the
    /// request falls back, or the part has no image at all), and `media.trust_client_uuids` is off:
    /// vLLM would trust that name verbatim across every tenant of the worker.
    #[error("image part uuid is not accepted: {0} (media.trust_client_uuids is off)")]
    ClientUuid(String),
    /// The prompt is over `model.max_prompt_bytes` (checked before tokenizing) or
    /// `model.max_prompt_tokens`: bounded work per request.
    #[error("{0}")]
    PromptTooLong(PlanError),
}

impl Rejection {
    pub fn label(&self) -> &'static str {
        match self {
            Rejection::BlockedImageUrl(_) => "image_url_blocked",
            Rejection::ClientUuid(_) => "client_uuid_untrusted",
            Rejection::PromptTooLong(_) => "prompt_too_long",
        }
    }
}

/// Why a pipeline could not be built (at start-up, not per request).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("model '{model}': {source}")]
    Prompt { model: String, source: PromptError },
    #[error("{0}")]
    Media(String),
}

/// What the pipeline is built from: the served model and the image intake settings.
#[derive(Clone, Debug)]
pub struct PipelineConfig {
    pub model: ModelSpec,
    pub media: MediaConfig,
}

/// What the gate needs from accounting. [`Counter`] implements it; tests inject counters that fail on
/// chosen images to exercise the gate independently of any model family.
pub trait ImageCounter: Send + Sync {
    /// Literal text of the one token the chat template emits per image.
    fn placeholder(&self) -> &str;
    /// The placeholder vLLM writes into string-format content for the n-th image (1-based), if any.
    fn prompt_placeholder(&self, _n: usize) -> Option<String> {
        None
    }
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

    fn prompt_placeholder(&self, n: usize) -> Option<String> {
        Counter::prompt_placeholder(self, n)
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
    max_prompt_bytes: usize,
    max_prompt_tokens: u32,
    intake: Intake,
    reject_blocked_urls: bool,
    trust_client_uuids: bool,
}

/// Why a request with images is not exact: the fallback reason label.
type Fallback = &'static str;

/// Why intake has no images for the plan: an image failed, or reading was skipped (the label).
enum Unread {
    Media(MediaError),
    Skipped(Fallback),
}

impl Unread {
    fn label(&self) -> Fallback {
        match self {
            Unread::Media(e) => e.label(),
            Unread::Skipped(reason) => reason,
        }
    }
}

impl Pipeline {
    /// Loads the model's prompt files and its image-token counter. A model without an accounting
    /// profile still loads: its requests with images fall back with the reason.
    pub fn new(cfg: &PipelineConfig) -> Result<Pipeline, LoadError> {
        let m = &cfg.model;
        let prompt_err = |source| LoadError::Prompt { model: m.source.label(), source };
        let mut model = m.source.load_prompt().map_err(prompt_err)?;
        if m.chat_template.is_some() || m.content_format.is_some() {
            model = model.with_overrides(m.chat_template.as_deref(), m.content_format).map_err(prompt_err)?;
        }
        let counter =
            m.source.load_counter(m.family, &m.processor_kwargs).map(|c| Arc::new(c) as Arc<dyn ImageCounter>);
        Self::with_counter(cfg, model, counter)
    }

    /// A pipeline with an explicit counter (tests use failing fakes to exercise the gate).
    pub fn with_counter(
        cfg: &PipelineConfig,
        model: PromptModel,
        counter: Result<Arc<dyn ImageCounter>, AccountingError>,
    ) -> Result<Pipeline, LoadError> {
        let m = &cfg.model;
        if let Err(e) = &counter {
            tracing::warn!("image accounting unavailable for model '{}': {e}; requests with images will route on their text prefix", m.source.label());
        }
        let placeholder = counter.as_ref().ok().map(|c| c.placeholder().to_owned());
        Ok(Pipeline {
            model: Arc::new(model),
            counter,
            placeholder,
            model_name: m.name.clone(),
            block_size: m.block_size,
            lora_adapters: m.lora_adapters.iter().cloned().collect(),
            exact_accounting: m.exact_accounting,
            default_decode_tokens: m.default_decode_tokens,
            max_model_len: m.max_model_len,
            max_prompt_bytes: m.max_prompt_bytes,
            max_prompt_tokens: m.max_prompt_tokens,
            intake: Intake::new(cfg.media.clone()).map_err(LoadError::Media)?,
            reject_blocked_urls: cfg.media.reject_blocked_urls,
            trust_client_uuids: cfg.media.trust_client_uuids,
        })
    }

    /// Token ids of this model's prompts are below this.
    pub fn vocab_size(&self) -> u32 {
        self.model.vocab_size()
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// The model identity that seeds block keys (`[model] name`).
    pub fn model_name(&self) -> &str {
        &self.model_name
    }

    /// Builds the plan for one parsed request: intake → tokenize → account → gate → plan. Only a
    /// policy refusal is an error; every other failure is a fallback route with its reason.
    pub async fn plan(&self, req: &Request<'_>) -> Result<Planned, Rejection> {
        self.plan_with(req, false).await
    }

    /// [`Pipeline::plan`], keeping the prompt's text, ids and image spans when `trace` is set.
    pub async fn plan_with(&self, req: &Request<'_>, trace: bool) -> Result<Planned, Rejection> {
        let seed = self.seed(req);
        let decode_tokens = ["max_completion_tokens", "max_tokens"]
            .iter()
            .find_map(|k| req.field(k).and_then(|v| v.as_u64()))
            .map(|v| v.min(u32::MAX as u64) as u32)
            .unwrap_or(self.default_decode_tokens);
        let plan = RoutePlan::empty(Route::NoMedia, self.block_size, decode_tokens);
        let mut out = Draft { plan, trace: trace.then(PromptTrace::default) };
        if req.endpoint == Endpoint::Completion {
            let t = Instant::now();
            match plan::tokenize_completion(&self.model, req, Some(self.max_prompt_bytes)) {
                Ok(ids) => self.set_blocks(&mut out, &ids, &[], seed, true),
                Err(e @ PlanError::PromptTooLong { .. }) => return Err(Rejection::PromptTooLong(e)),
                Err(e) => tracing::debug!("completion prompt not tokenized ({}): routing by load", e.label()),
            }
            self.check_prompt_tokens(&out.plan)?;
            let timings = StageTimings { intake: None, account: None, plan: t.elapsed() };
            return Ok(Planned { plan: out.plan, timings, probes: Vec::new(), trace: out.trace });
        }

        if req.uuid_only_parts > 0 && !self.trust_client_uuids {
            return Err(Rejection::ClientUuid("an image part names a uuid but carries no image".into()));
        }
        let t = Instant::now();
        let (images, probes) = self.intake(req).await?;
        let intake = t.elapsed();
        let has_media = !matches!(&images, Ok(v) if v.is_empty());

        // The template does not depend on the images (each part renders as one placeholder), and
        // request-wide accounting needs the text token count, so tokenize first.
        let t = Instant::now();
        let tokens = self.tokenize(req);
        let tokenize = t.elapsed();
        if let Err(e @ PlanError::PromptTooLong { .. }) = tokens {
            return Err(Rejection::PromptTooLong(e));
        }

        let t = Instant::now();
        let accounted = images.and_then(|infos| self.account(req, &tokens, infos));
        let account = t.elapsed();

        let t = Instant::now();
        if let (Some(trace), Ok(tokens)) = (&mut out.trace, &tokens) {
            trace.text = Some(tokens.text.clone());
        }
        self.gate(&mut out, tokens, accounted, has_media, seed);
        self.check_prompt_tokens(&out.plan)?;
        out.plan.images_rehashed = !out.plan.images.is_empty() && rehashes_images(req);
        let client_uuid = req.images.iter().any(|i| i.uuid_span.is_some());
        if client_uuid && out.plan.route != Route::Exact && !self.trust_client_uuids {
            // Only an exact plan replaces client uuids; forwarding one unchanged would let it name
            // another image's cached features.
            let reason = out.plan.fallback_reason().unwrap_or("no image accounted");
            return Err(Rejection::ClientUuid(format!("the request is not routed exactly ({reason})")));
        }
        let timings = StageTimings { intake: Some(intake), account: Some(account), plan: tokenize + t.elapsed() };
        Ok(Planned { plan: out.plan, timings, probes, trace: out.trace })
    }

    /// Stage **intake**: every image read and probed, or the fallback reason. With
    /// `reject_blocked_urls`, a URL the SSRF guard refuses is a [`Rejection`] whatever else happens to
    /// the request: a request that falls back is forwarded with its URLs, which the worker fetches.
    async fn intake(
        &self,
        req: &Request<'_>,
    ) -> Result<(Result<Vec<ImageInfo>, Fallback>, Vec<ProbeTiming>), Rejection> {
        let urls: Vec<&str> = req.images.iter().map(|i| i.url.as_ref()).collect();
        let (read, probes) = self.read_images(req, &urls).await;
        match read {
            Ok(infos) => Ok((Ok(infos), probes)),
            Err(Unread::Media(e)) if e.is_blocked() && self.reject_blocked_urls => Err(Rejection::BlockedImageUrl(e)),
            Err(unread) => {
                if self.reject_blocked_urls {
                    // Not every URL was checked by a fetch: screen them all before forwarding.
                    match self.intake.screen(&urls).await {
                        Err(e) if e.is_blocked() => return Err(Rejection::BlockedImageUrl(e)),
                        _ => {}
                    }
                }
                Ok((Err(unread.label()), probes))
            }
        }
    }

    /// Reads every image (each fetch under the SSRF guard), or says why not.
    async fn read_images(
        &self,
        req: &Request<'_>,
        urls: &[&str],
    ) -> (Result<Vec<ImageInfo>, Unread>, Vec<ProbeTiming>) {
        if let Some(issue) = &req.media_issue {
            return (Err(Unread::Skipped(issue.label())), Vec::new());
        }
        if urls.is_empty() {
            return (Ok(Vec::new()), Vec::new());
        }
        if !self.exact_accounting {
            // Exact accounting off: never fetch; the request is a text-prefix plan by configuration.
            return (Err(Unread::Skipped("exact_disabled")), Vec::new());
        }
        let report = self.intake.process(urls).await;
        (report.images.map_err(Unread::Media), report.probes)
    }

    /// The chat rendered and tokenized, placeholders located (when the model has an accounting
    /// profile; without one the image positions are unknown and only the text routes).
    fn tokenize(&self, req: &Request<'_>) -> Result<ChatTokens, PlanError> {
        let counter = self.counter.as_ref().ok();
        let placeholder = |n: usize| counter.and_then(|c| c.prompt_placeholder(n)).unwrap_or_default();
        let has_string_placeholder = counter.is_some_and(|c| c.prompt_placeholder(1).is_some());
        let opts = RenderOptions {
            image_placeholder: has_string_placeholder.then_some(&placeholder as &dyn Fn(usize) -> String),
            max_prompt_bytes: Some(self.max_prompt_bytes),
        };
        match self.placeholder.as_deref() {
            Some(p) => plan::tokenize_chat(&self.model, req, p, &opts),
            None => {
                let text = self.model.render_chat(req, &opts)?;
                plan::check_prompt_bytes(text.len(), opts.max_prompt_bytes)?;
                let ids = plan::encode_rendered(&self.model, req, &text)?;
                Ok(ChatTokens { ids, placeholders: Vec::new(), text })
            }
        }
    }

    /// **The gate**: an exact plan only if every image was accounted and expanded; otherwise a
    /// text-prefix plan with the reason, carrying nothing of the images.
    fn gate(
        &self,
        out: &mut Draft,
        tokens: Result<ChatTokens, PlanError>,
        accounted: Result<Vec<Accounted>, Fallback>,
        has_media: bool,
        seed: u64,
    ) {
        match (tokens, accounted) {
            // An image that cannot be accounted is the reason, whatever else also failed.
            (tokens, Err(reason)) => {
                out.plan.route = Route::TextPrefix { reason };
                // Without a known placeholder the image position is unknown: route by load only.
                if let (Ok(tokens), Some(_)) = (&tokens, &self.placeholder) {
                    self.set_blocks(out, plan::text_prefix(tokens), &[], seed, false);
                }
            }
            (Err(e), Ok(_)) if has_media => out.plan.route = Route::TextPrefix { reason: e.label() },
            (Err(e), Ok(_)) => tracing::debug!("chat template failed ({e}); routing by load only"),
            // Without images nothing is expanded: a placeholder the user typed stays the one token it is.
            (Ok(tokens), Ok(acc)) if acc.is_empty() && !has_media => {
                self.set_blocks(out, &tokens.ids, &[], seed, true);
            }
            (Ok(tokens), Ok(acc)) => match self.expand(&tokens, &acc) {
                Ok(expanded) => {
                    out.plan.route = Route::Exact;
                    self.set_blocks(out, &expanded.ids, &expanded.spans, seed, true);
                    out.plan.spans = expanded.spans;
                    out.plan.images = acc.into_iter().map(|a| a.planned).collect();
                }
                Err(e) => {
                    out.plan.route = Route::TextPrefix { reason: e.label() };
                    self.set_blocks(out, plan::text_prefix(&tokens), &[], seed, false);
                }
            },
        }
    }

    /// Each image's placeholder replaced by its run: in token space, or in text space for families
    /// whose expansion merges with its neighbours.
    fn expand(&self, tokens: &ChatTokens, acc: &[Accounted]) -> Result<plan::Expanded, PlanError> {
        let texts: Option<Vec<(u128, &TextExpansion)>> = acc
            .iter()
            .map(|a| match &a.expansion {
                Expansion::Text(t) => Some((a.hash, t)),
                Expansion::Tokens(_) => None,
            })
            .collect();
        if let (Some(texts), Some(p)) = (texts, &self.placeholder) {
            return plan::expand_text(&self.model, tokens, p, &texts);
        }
        let runs: Option<Vec<(u128, &[RunPart])>> = acc
            .iter()
            .map(|a| match &a.expansion {
                Expansion::Tokens(run) => Some((a.hash, run.as_slice())),
                Expansion::Text(_) => None,
            })
            .collect();
        let runs = runs.ok_or(PlanError::InvalidRequest("mixed image expansions".into()))?;
        plan::expand(&self.model, tokens, &runs)
    }

    /// Stage **account**: all images of the request, or the first failure's label.
    fn account(
        &self,
        req: &Request<'_>,
        tokens: &Result<ChatTokens, PlanError>,
        infos: Vec<ImageInfo>,
    ) -> Result<Vec<Accounted>, Fallback> {
        if infos.is_empty() {
            return Ok(Vec::new());
        }
        let counter = self.counter.as_ref().map_err(|e| e.label())?;
        let text_tokens = tokens.as_ref().ok().map(|t| (t.ids.len() - t.placeholders.len()).min(u32::MAX as usize));
        let ctx = RequestContext { max_model_len: self.max_model_len, text_tokens: text_tokens.map(|n| n as u32) };
        let request_kwargs = req.field("mm_processor_kwargs").and_then(|v| v.as_object());
        let sizes: Vec<(u32, u32)> = infos.iter().map(|i| (i.width, i.height)).collect();
        let counts = counter.count_request(&sizes, &ctx, request_kwargs).map_err(|e| e.label())?;
        if counts.len() != infos.len() {
            return Err("placeholder_mismatch");
        }
        let trust = self.trust_client_uuids;
        infos
            .into_iter()
            .zip(counts)
            .zip(&req.images)
            .map(|((info, tokens), part)| Accounted::new(info, tokens, part, trust))
            .collect()
    }

    fn set_blocks(&self, out: &mut Draft, ids: &[u32], spans: &[ImageSpan], seed: u64, whole: bool) {
        let plan = &mut out.plan;
        plan.prompt_tokens = ids.len().min(u32::MAX as usize) as u32;
        plan.prompt_exact = whole;
        plan.blocks = plan::block_keys(ids, spans, self.block_size as usize, seed);
        if let Some(trace) = &mut out.trace {
            trace.ids = ids.to_vec();
            trace.spans = spans.to_vec();
        }
    }

    /// Refuses a plan whose prompt (text and image tokens) is over `model.max_prompt_tokens`.
    fn check_prompt_tokens(&self, plan: &RoutePlan) -> Result<(), Rejection> {
        let (size, limit) = (plan.prompt_tokens, self.max_prompt_tokens);
        if size <= limit {
            return Ok(());
        }
        Err(Rejection::PromptTooLong(PlanError::PromptTooLong {
            unit: "tokens",
            size: size as usize,
            limit: limit as usize,
        }))
    }

    /// Block-hash seed: the model identity, the LoRA adapter the request names, and its cache_salt.
    fn seed(&self, req: &Request<'_>) -> u64 {
        let lora = req.str_field("model").filter(|m| self.lora_adapters.contains(*m));
        plan::seed(&self.model_name, lora, req.str_field("cache_salt"))
    }
}

/// How an accounted image enters the prompt.
enum Expansion {
    /// A token run replacing the placeholder token.
    Tokens(Vec<RunPart>),
    /// Text replacing the placeholder before tokenization.
    Text(TextExpansion),
}

/// One image that passed accounting: its identity, its expansion, and its plan entry.
struct Accounted {
    hash: u128,
    expansion: Expansion,
    planned: PlannedImage,
}

impl Accounted {
    /// The image's identity is its content digest, written as its `uuid` — or, when trusted, the
    /// client's own uuid, left as sent.
    fn new(info: ImageInfo, tokens: ImageTokens, part: &ImagePart<'_>, trust: bool) -> Result<Accounted, Fallback> {
        let (expansion, len) = match (tokens.run(), tokens.text_expansion()) {
            (Some(run), _) => {
                let len = run.iter().map(|p| p.repeat).try_fold(0u32, |a, r| a.checked_add(r)).ok_or("overflow")?;
                (Expansion::Tokens(run), len)
            }
            // The image's own tokens; the merged newlines around them belong to the text.
            (None, Some(text)) => (Expansion::Text(text.clone()), text.embed_count),
            (None, None) => return Err("expansion_unknown"),
        };
        let (hash, key, splice) = match (&part.uuid, trust) {
            (Some(client), true) => (client.clone(), image_key(client), None),
            _ => {
                let splice = UuidSplice { image_url: part.image_url_span.clone(), existing: part.uuid_span.clone() };
                (info.digest.hex(), info.digest.key(), Some(splice))
            }
        };
        let planned = PlannedImage {
            hash,
            splice,
            width: info.width,
            height: info.height,
            feature_tokens: tokens.feature_tokens,
            tokens: len,
        };
        Ok(Accounted { hash: key, expansion, planned })
    }
}

/// Whether vLLM names this request's images by something other than their uuid alone: per-request
/// processor or media kwargs are hashed together with it (a null or empty object changes nothing).
fn rehashes_images(req: &Request<'_>) -> bool {
    ["mm_processor_kwargs", "media_io_kwargs"].iter().any(|k| match req.field(k) {
        None | Some(serde_json::Value::Null) => false,
        Some(serde_json::Value::Object(m)) => !m.is_empty(),
        Some(_) => true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(hash: &str, splice: Option<UuidSplice>) -> PlannedImage {
        PlannedImage { hash: hash.into(), splice, width: 1, height: 1, feature_tokens: 1, tokens: 1 }
    }

    #[test]
    fn uuids_are_spliced_in_and_client_ones_replaced() {
        let body = br#"{"messages":[{"content":[{"type":"image_url","image_url":{"url":"a"}},{"type":"image_url","uuid":"evil","image_url":"b"}]}]}"#;
        let req = Request::parse(Endpoint::Chat, body).unwrap();
        let splices: Vec<UuidSplice> = req
            .images
            .iter()
            .map(|i| UuidSplice { image_url: i.image_url_span.clone(), existing: i.uuid_span.clone() })
            .collect();
        let images = [image("aaaa", Some(splices[0].clone())), image("bbbb", Some(splices[1].clone()))];
        let out = String::from_utf8(splice_uuids(body, &images)).unwrap();
        assert_eq!(
            out,
            r#"{"messages":[{"content":[{"type":"image_url","image_url":{"url":"a"},"uuid":"aaaa"},{"type":"image_url","uuid":"bbbb","image_url":"b"}]}]}"#
        );
        let parsed: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(parsed["messages"][0]["content"][1]["uuid"], "bbbb");
        // A trusted client uuid (no splice) leaves the body as received.
        assert_eq!(splice_uuids(body, &[image("evil", None)]), body.to_vec());
    }

    #[test]
    fn only_non_empty_request_kwargs_rehash_images() {
        let rehash = |extra: &str| {
            let body = format!(r#"{{"messages":[]{extra}}}"#);
            rehashes_images(&Request::parse(Endpoint::Chat, body.as_bytes()).unwrap())
        };
        assert!(!rehash(""));
        assert!(!rehash(r#","mm_processor_kwargs":null,"media_io_kwargs":{}"#));
        assert!(rehash(r#","mm_processor_kwargs":{"max_pixels":1000}"#));
        assert!(rehash(r#","media_io_kwargs":{"image":{"mode":"RGB"}}"#));
    }
}
