//! Stages **intake → account → plan** and **the gate**: turn one request into one [`RoutePlan`].
//!
//! The gate (after Dynamo PR #16947): a request with images is planned `Exact` only if *every* image
//! was fetched/decoded, probed, accounted and expanded. Any failure anywhere makes the whole request a
//! `TextPrefix { reason }` plan whose blocks are only those before the first image; nothing from the
//! images that did succeed survives into the plan (no image tokens, no image spans, no image blocks).
//! Nothing here records metrics: [`Pipeline::plan`] returns the finished plan with its stage timings
//! as values, and the server's observe stage records them, so a fallback can never leave a partial
//! image-token sample behind.
//!
//! Layout, one file per job: [`output`] (the plan and what comes with it), [`read`] (intake), the
//! accounting seam ([`ImageCounter`]) and stage (`account`), [`gate`] (exact or text prefix, and the
//! block keys), [`splice`] (the `uuid`s into the body), [`error`] (refusals, load errors, fallback
//! labels). This file holds the [`Pipeline`] and reads top to bottom as the stage calls.

mod account;
mod counter;
mod error;
mod gate;
mod memo;
mod output;
mod read;
mod splice;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use crate::accounting::video::{self as video_accounting, VideoCounter, VideoIo};
use crate::accounting::{AccountingError, Counter};
use crate::media::MediaConfig;
use crate::model::ModelSpec;
use crate::plan::{self, ChatTokens, PlanError};
use crate::prompt::{PromptModel, RenderOptions};
use crate::request::{Endpoint, Request};

use self::account::Accounting;
use self::gate::{Draft, Gate};
use self::read::ImageReader;

pub use self::counter::ImageCounter;
pub use self::error::{LoadError, Rejection};
pub use self::output::{Planned, PlannedImage, PlannedVideo, PromptTrace, Route, RoutePlan, StageTimings, UuidSplice};
pub use self::splice::{splice_uuids, spliced_pieces, Piece};

/// What the pipeline is built from: the served model and the image intake settings.
#[derive(Clone, Debug, PartialEq)]
pub struct PipelineConfig {
    pub model: ModelSpec,
    pub media: MediaConfig,
}

/// The model-specific machinery, loaded once at start.
pub struct Pipeline {
    model: Arc<PromptModel>,
    /// `Err` when the model has no accounting profile: requests with images then fall back with its label.
    counter: Result<Arc<dyn ImageCounter>, AccountingError>,
    placeholder: Option<String>,
    /// The video counter (`Err`: requests with videos fall back with its label, nothing read).
    video: Result<VideoCounter, AccountingError>,
    /// The video placeholder token's text, where the family has one (even if its videos cannot be
    /// counted: a fallback's text prefix still stops at the first video).
    video_placeholder: Option<&'static str>,
    /// `[model] trust_request_mm_kwargs`: a request's own media kwargs are counted for its videos.
    trust_request_mm_kwargs: bool,
    model_name: String,
    block_size: u32,
    /// The pool's LoRA adapters: configured, and learnt from its workers' `/v1/models`.
    lora_adapters: parking_lot::RwLock<HashSet<String>>,
    default_decode_tokens: u32,
    max_model_len: Option<u32>,
    max_prompt_bytes: usize,
    max_prompt_tokens: u32,
    reader: ImageReader,
    trust_client_uuids: bool,
    /// Recent bodies' rendered and tokenized prompts; none when a template reads the clock.
    memo: Option<memo::TokenMemo>,
}

impl Pipeline {
    /// Loads the model's prompt files and its image-token counter. A model without an accounting
    /// profile still loads: its requests with images fall back with the reason.
    pub fn new(cfg: &PipelineConfig) -> Result<Pipeline, LoadError> {
        let m = &cfg.model;
        let prompt_err = |source| LoadError::Prompt { model: m.source.label(), source };
        let mut model = m.source.load_prompt_as(m.tokenizer_mode).map_err(prompt_err)?;
        if m.chat_template.is_some() || m.content_format.is_some() {
            model = model.with_overrides(m.chat_template.as_deref(), m.content_format).map_err(prompt_err)?;
        }
        let counter = match model.is_mistral() {
            // mistral_common sizes images from `tekken.json`, not from HF processor files.
            true => match model.mistral_image_config() {
                Some(c) => Counter::for_tekken(c.image_patch_size, c.max_image_size, c.spatial_merge_size),
                None => Err(AccountingError::UnsupportedModel { detail: "tekken.json has no image section".into() }),
            },
            false => m.source.load_counter(m.family, &m.processor_kwargs),
        };
        let video = match (&counter, model.is_mistral()) {
            (Ok(c), false) => m.source.load_video_counter(c.family(), &m.processor_kwargs, &m.media_io_kwargs),
            (Ok(_), true) => Err(AccountingError::VideoUnsupported { detail: "tokenizer mode mistral".into() }),
            (Err(e), _) => Err(e.clone()),
        };
        let video_placeholder = counter.as_ref().ok().and_then(|c| video_accounting::placeholder(c.family()));
        let counter = counter.map(|c| Arc::new(c) as Arc<dyn ImageCounter>);
        let mut pipeline = Self::with_counter(cfg, model, counter)?;
        if let Err(e) = &video {
            tracing::debug!("video accounting unavailable for model '{}': {e}", m.source.label());
        }
        (pipeline.video, pipeline.video_placeholder) = (video, video_placeholder);
        Ok(pipeline)
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
        let media = MediaConfig { report_transposed: model.is_mistral(), ..cfg.media.clone() };
        Ok(Pipeline {
            memo: model.renders_purely().then(memo::TokenMemo::default),
            model: Arc::new(model),
            counter,
            placeholder,
            video: Err(AccountingError::VideoUnsupported { detail: "no video counter".into() }),
            video_placeholder: None,
            trust_request_mm_kwargs: m.trust_request_mm_kwargs,
            model_name: m.name.clone(),
            block_size: m.block_size,
            lora_adapters: parking_lot::RwLock::new(m.lora_adapters.iter().cloned().collect()),
            default_decode_tokens: m.default_decode_tokens,
            max_model_len: m.max_model_len,
            max_prompt_bytes: m.max_prompt_bytes,
            max_prompt_tokens: m.max_prompt_tokens,
            reader: ImageReader::new(&media, m.exact_accounting)?,
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
        let plan = RoutePlan::empty(Route::NoMedia, self.block_size, self.decode_tokens(req));
        let out = Draft { plan, trace: trace.then(PromptTrace::default) };
        match req.endpoint {
            Endpoint::Completion => self.plan_completion(req, out, seed),
            Endpoint::Chat | Endpoint::Responses => self.plan_chat(req, out, seed).await,
        }
    }

    /// A `/v1/completions` prompt: no images, so tokenize and cut the blocks.
    fn plan_completion(&self, req: &Request<'_>, mut out: Draft, seed: u64) -> Result<Planned, Rejection> {
        let t = Instant::now();
        match plan::tokenize_completion(&self.model, req, Some(self.max_prompt_bytes)) {
            Ok(ids) => self.gate().set_blocks(&mut out, &ids, &[], seed, true),
            Err(e @ PlanError::PromptTooLong { .. }) => return Err(Rejection::PromptTooLong(e)),
            Err(e) => tracing::debug!("completion prompt not tokenized ({}): routing by load", e.label()),
        }
        self.check_prompt_tokens(&out.plan)?;
        let timings = StageTimings { intake: None, account: None, plan: t.elapsed() };
        Ok(Planned { plan: out.plan, timings, probes: Vec::new(), trace: out.trace })
    }

    /// A chat: intake → tokenize → account → gate, each stage timed.
    async fn plan_chat(&self, req: &Request<'_>, mut out: Draft, seed: u64) -> Result<Planned, Rejection> {
        if req.uuid_only_parts > 0 && !self.trust_client_uuids {
            return Err(Rejection::ClientUuid("an image part names a uuid but carries no image".into()));
        }
        let t = Instant::now();
        let video = self.video_counter(req);
        let (images, probes) = self.reader.read(req, video.as_ref().err().copied()).await?;
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
        let video = video.ok().flatten();
        let accounted = images.and_then(|media| self.accounting(video.as_ref()).account(req, &tokens, media));
        let account = t.elapsed();

        let t = Instant::now();
        if let (Some(trace), Ok(tokens)) = (&mut out.trace, &tokens) {
            trace.text = Some(tokens.text.clone());
        }
        self.gate().gate(&mut out, tokens, accounted, has_media, seed);
        self.check_prompt_tokens(&out.plan)?;
        out.plan.images_rehashed = !out.plan.images.is_empty() && rehashes_images(req);
        self.check_client_uuids(req, &out.plan)?;
        let timings = StageTimings { intake: Some(intake), account: Some(account), plan: tokenize + t.elapsed() };
        Ok(Planned { plan: out.plan, timings, probes, trace: out.trace })
    }

    /// The chat rendered and tokenized, placeholders located (when the model has an accounting
    /// profile; without one the image positions are unknown and only the text routes); from the memo
    /// when the same body was planned recently (see `memo`).
    fn tokenize(&self, req: &Request<'_>) -> Result<Arc<ChatTokens>, PlanError> {
        let Some((memo, key)) = self.memo.as_ref().zip(req.body_digest()) else {
            return Ok(Arc::new(self.render_and_tokenize(req)?));
        };
        let seen = match memo.lookup(key) {
            memo::Lookup::Hit(tokens) => return Ok(tokens),
            memo::Lookup::Seen => true,
            memo::Lookup::New => false,
        };
        let tokens = Arc::new(self.render_and_tokenize(req)?);
        match seen {
            true => memo.keep(key, tokens.clone()),
            false => memo.note(key),
        }
        Ok(tokens)
    }

    fn render_and_tokenize(&self, req: &Request<'_>) -> Result<ChatTokens, PlanError> {
        let counter = self.counter.as_ref().ok();
        let placeholder = |n: usize| counter.and_then(|c| c.prompt_placeholder(n)).unwrap_or_default();
        let has_string_placeholder = counter.is_some_and(|c| c.prompt_placeholder(1).is_some());
        let opts = RenderOptions {
            image_placeholder: has_string_placeholder.then_some(&placeholder as &dyn Fn(usize) -> String),
            max_prompt_bytes: Some(self.max_prompt_bytes),
        };
        match self.placeholder.as_deref() {
            Some(p) => plan::tokenize_media_chat(&self.model, req, p, self.video_placeholder, &opts),
            None => {
                let (text, ids) = plan::chat_ids(&self.model, req, &opts)?;
                Ok(ChatTokens { ids, placeholders: Vec::new(), videos: Vec::new(), text })
            }
        }
    }

    fn accounting<'a>(&'a self, video: Option<&'a VideoCounter>) -> Accounting<'a> {
        Accounting {
            counter: &self.counter,
            max_model_len: self.max_model_len,
            trust_client_uuids: self.trust_client_uuids,
            video,
        }
    }

    /// The counter for this request's videos (`None` without videos): the pool's, under the request's
    /// own `media_io_kwargs` when the engines trust them; or why its videos cannot be counted, decided
    /// before anything is read. Untrusted request kwargs: vLLM refuses the request, whichever worker.
    fn video_counter(&self, req: &Request<'_>) -> Result<Option<VideoCounter>, &'static str> {
        if !req.has_videos() {
            return Ok(None);
        }
        let pool = self.video.as_ref().map_err(|e| e.label())?;
        let set = |key: &str| match req.field(key) {
            None => None,
            Some(serde_json::Value::Object(m)) if m.is_empty() => None,
            Some(v) => Some(v),
        };
        let (io, processor) = (set("media_io_kwargs"), set("mm_processor_kwargs"));
        if io.is_none() && processor.is_none() {
            return Ok(Some(pool.clone()));
        }
        if !self.trust_request_mm_kwargs {
            let key = if io.is_some() { "media_io_kwargs" } else { "mm_processor_kwargs" };
            return Err(AccountingError::RequestMmKwargs { key }.label());
        }
        if processor.is_some() {
            // The video processor's kwargs are not modelled: the count would be a guess.
            return Err("processor_kwargs");
        }
        let io = match io {
            Some(serde_json::Value::Object(m)) => VideoIo::parse(m).map_err(|e| e.label())?,
            _ => return Err("media_io_kwargs"),
        };
        Ok(Some(pool.with_io(pool.io().merged(io))))
    }

    fn gate(&self) -> Gate<'_> {
        Gate { model: &self.model, placeholder: self.placeholder.as_deref(), block_size: self.block_size }
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

    /// Refuses client uuids a plan would forward unchanged (unless trusted): only an exact plan
    /// replaces them, and one forwarded as sent could name another image's cached features.
    fn check_client_uuids(&self, req: &Request<'_>, plan: &RoutePlan) -> Result<(), Rejection> {
        let client_uuid = req.images.iter().any(|i| i.uuid_span.is_some());
        if client_uuid && plan.route != Route::Exact && !self.trust_client_uuids {
            let reason = plan.fallback_reason().unwrap_or("no image accounted");
            return Err(Rejection::ClientUuid(format!("the request is not routed exactly ({reason})")));
        }
        Ok(())
    }

    /// Block-hash seed: the model identity, the LoRA adapter the request names, and its cache_salt.
    fn seed(&self, req: &Request<'_>) -> u64 {
        let adapters = self.lora_adapters.read();
        let lora = req.str_field("model").filter(|m| adapters.contains(*m));
        plan::seed(&self.model_name, lora, req.str_field("cache_salt"))
    }

    /// Whether `model` names one of the pool's LoRA adapters (its requests are keyed and routed by it).
    pub fn is_adapter(&self, model: &str) -> bool {
        self.lora_adapters.read().contains(model)
    }

    /// Adds LoRA adapters a worker lists (names already known are kept): their requests are then keyed
    /// as the engine keys them, with the adapter's name in the chain's seed.
    pub fn learn_adapters(&self, names: &[String]) {
        if names.iter().any(|n| !self.lora_adapters.read().contains(n)) {
            self.lora_adapters.write().extend(names.iter().cloned());
        }
    }

    /// Expected decode tokens: the request's `max_completion_tokens` or `max_tokens` (a Responses
    /// body's `max_output_tokens`), else the default.
    fn decode_tokens(&self, req: &Request<'_>) -> u32 {
        ["max_completion_tokens", "max_tokens", "max_output_tokens"]
            .iter()
            .find_map(|k| req.field(k).and_then(|v| v.as_u64()))
            .map(|v| v.min(u32::MAX as u64) as u32)
            .unwrap_or(self.default_decode_tokens)
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
    use crate::model::{ModelSource, ModelSpec};

    fn qwen(chat_template: Option<&str>) -> Pipeline {
        let mut model = ModelSpec::new(ModelSource::Bundled("qwen3-vl"));
        model.chat_template = chat_template.map(str::to_owned);
        Pipeline::new(&PipelineConfig { model, media: MediaConfig::default() }).expect("pipeline")
    }

    fn plan(p: &Pipeline, body: &str) -> Planned {
        let req = Request::parse(Endpoint::Chat, body.as_bytes()).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(p.plan_with(&req, true)).unwrap()
    }

    /// What a plan routes on and what it says it saw.
    fn routed(p: &Planned) -> (Vec<u64>, u32, Option<String>, Vec<u32>) {
        let trace = p.trace.as_ref().unwrap();
        (p.plan.blocks.clone(), p.plan.prompt_tokens, trace.text.clone(), trace.ids.clone())
    }

    #[test]
    fn a_body_sent_again_is_planned_from_the_memo_and_the_same() {
        let p = qwen(None);
        let bodies = [
            r#"{"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Hi there, how are you today?"}]}"#,
            r#"{"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Hi there, how are you today!"}]}"#,
            r#"{"messages":[{"role":"user","content":"Weather?"}],"tools":[{"type":"function","function":{"name":"w","parameters":{}}}]}"#,
        ];
        let first: Vec<_> = bodies.iter().map(|b| routed(&plan(&p, b))).collect();
        assert_ne!(first[0], first[1], "one byte apart: two prompts");
        for (b, want) in bodies.iter().zip(&first) {
            let req = Request::parse(Endpoint::Chat, b.as_bytes()).unwrap();
            let again = p.tokenize(&req).unwrap(); // the second sighting: kept
            assert!(Arc::ptr_eq(&again, &p.tokenize(&req).unwrap()), "served from the memo");
            assert_eq!(&routed(&plan(&p, b)), want, "the same plan from the memo");
        }
    }

    #[test]
    fn a_template_that_reads_the_clock_is_rendered_every_time() {
        let clock = "{{ strftime_now('%Y-%m-%d %H:%M:%S') }}{% for m in messages %}{{ m.content }}{% endfor %}";
        let p = qwen(Some(clock));
        assert!(p.memo.is_none());
        assert!(qwen(None).memo.is_some());
        let req = Request::parse(Endpoint::Chat, br#"{"messages":[{"role":"user","content":"hi"}]}"#).unwrap();
        assert!(!Arc::ptr_eq(&p.tokenize(&req).unwrap(), &p.tokenize(&req).unwrap()));
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
