//! Ground truth for the simulator: the sim's prompt is computed with the router's own core pipeline
//! (chat template, tokenizer, exact image expansion, block hashing), so its prefix cache — and the
//! `cached_tokens` it reports — reflect what a real worker would reuse. That makes cache figures
//! measured against sims self-consistent with the router's planning, not an independent check.
//!
//! The prompt it returns also carries what a real engine publishes in its KV events: the token ids,
//! each image's run with the name the engine gives it, and the `cache_salt`. Like vLLM, the sim trusts
//! a client's image `uuid` and names the image by it verbatim; an image without one gets the sim's own
//! content hash, deliberately not the router's identity (a real vLLM names it by its own `mm_hash`).
//! With per-request `mm_processor_kwargs` / `media_io_kwargs` the name is hashed with them, as vLLM does.
//!
//! Where the engine itself refuses an image (the reference processor raises, or the bytes are not an
//! image), the sim answers 400 as vLLM does; where only the router's own limits or profiles stop the
//! exact count, it serves the request and caches the text before the first image.

use std::io::Read as _;
use std::sync::{Arc, OnceLock};

use mmrouter_core::media::MediaConfig;
use mmrouter_core::model::{ModelSource, ModelSpec};
use mmrouter_core::pipeline::{Pipeline, PipelineConfig, PromptTrace, Route, RoutePlan};
use mmrouter_core::prompt::PromptModel;
use mmrouter_core::request::{Endpoint, Request};

use crate::handle::SimHandle;
use crate::options::SimOptions;
use crate::prompt::{Prompter, SimImage, SimPrompt};
use tokenizers::Tokenizer;

/// The prompter that plans with `mmrouter-core`.
pub struct ExactPrompter {
    pipeline: Pipeline,
    rt: tokio::runtime::Handle,
    /// The model's files, for the tokenizer `/detokenize` decodes with.
    source: ModelSource,
    /// Loaded on the first decode (`/detokenize`, `token_strs`): most sims never need it.
    decoder: OnceLock<Result<Tokenizer, String>>,
}

impl ExactPrompter {
    /// `model` is a bundled profile name or an HF model directory; image URLs are fetched only from
    /// `fetch_cidrs` and the hosts `fetch_hosts`, never from anywhere else. Needs a tokio runtime.
    pub fn new(
        model: &str,
        block_size: u32,
        fetch_cidrs: &[String],
        fetch_hosts: &[String],
    ) -> anyhow::Result<ExactPrompter> {
        let source = ModelSource::parse(model).map_err(|e| anyhow::anyhow!("--model-dir: {e}"))?;
        let model = ModelSpec { block_size, ..ModelSpec::new(source.clone()) };
        // A real worker fetches whatever URL it is given; the sim is confined to an allowlist (loopback
        // by default) so a forwarded test URL can never reach another machine. It trusts client uuids
        // as a worker does: the router's refusal of untrusted ones is a router policy, not an engine's.
        let media = MediaConfig {
            allow_public: false,
            allow_cidrs: fetch_cidrs.to_vec(),
            allow_hosts: fetch_hosts.to_vec(),
            trust_client_uuids: true,
            ..MediaConfig::default()
        };
        let pipeline = Pipeline::new(&PipelineConfig { model, media })?;
        Ok(ExactPrompter { pipeline, rt: tokio::runtime::Handle::current(), source, decoder: OnceLock::new() })
    }

    fn decoder(&self) -> Result<&Tokenizer, String> {
        self.decoder.get_or_init(|| load_decoder(&self.source)).as_ref().map_err(Clone::clone)
    }
}

/// Largest `tokenizer.json` the decoder loads, decompressed.
const MAX_TOKENIZER_BYTES: u64 = 64 << 20;

/// The model's `tokenizer.json` as `tokenizers` loads it (vLLM decodes with the same library). A
/// Mistral-format model (`tekken.json` only) has none.
fn load_decoder(source: &ModelSource) -> Result<Tokenizer, String> {
    let json = match source {
        ModelSource::Bundled(name) => {
            let gz = PromptModel::bundled_file(name, "tokenizer.json.gz").ok_or("no bundled tokenizer")?;
            gunzip(gz)?
        }
        ModelSource::Dir(dir) => match std::fs::read(dir.join("tokenizer.json")) {
            Ok(json) => json,
            Err(_) => gunzip(
                &std::fs::read(dir.join("tokenizer.json.gz"))
                    .map_err(|_| format!("{} has no tokenizer.json to decode with", dir.display()))?,
            )?,
        },
    };
    Tokenizer::from_bytes(&json).map_err(|e| format!("tokenizer.json: {e}"))
}

fn gunzip(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut reader = flate2::read::GzDecoder::new(bytes).take(MAX_TOKENIZER_BYTES + 1);
    reader.read_to_end(&mut out).map_err(|e| format!("tokenizer.json.gz: {e}"))?;
    if out.len() as u64 > MAX_TOKENIZER_BYTES {
        return Err(format!("tokenizer.json exceeds {MAX_TOKENIZER_BYTES} bytes"));
    }
    Ok(out)
}

impl Prompter for ExactPrompter {
    fn prompt(
        &self,
        path: &str,
        _body: &serde_json::Value,
        raw: &[u8],
        _block_size: usize,
    ) -> Result<SimPrompt, String> {
        let endpoint = if path.ends_with("/completions") && !path.ends_with("/chat/completions") {
            Endpoint::Completion
        } else {
            Endpoint::Chat
        };
        let request = Request::parse(endpoint, raw).map_err(|e| e.to_string())?;
        let planned = tokio::task::block_in_place(|| self.rt.block_on(self.pipeline.plan_with(&request, true)))
            .map_err(|e| e.to_string())?;
        let plan = planned.plan;
        if let Route::TextPrefix { reason } = plan.route {
            if ENGINE_REJECTS.contains(&reason) {
                // What the engine's own processor refuses, vLLM answers 400: so does the sim, rather
                // than serve the text before the image.
                return Err(format!("the model's processor rejects an image of this request ({reason})"));
            }
            // A limit of ours, not the engine's (our own media limits, a model we lack): the engine
            // would serve it; the sim caches the prompt's text prefix.
            tracing::debug!("sim: image not accountable ({reason}); caching the text prefix only");
        }
        let trace = planned.trace.unwrap_or_default();
        let (token_ids, images) = match name_images(&request, &plan, &trace) {
            Some(images) => (trace.ids, images),
            // Unknown image names: cache the prompt, but announce nothing rather than something wrong.
            None => (Vec::new(), Vec::new()),
        };
        Ok(SimPrompt {
            prompt_tokens: plan.prompt_tokens.max(1),
            block_keys: plan.blocks,
            token_ids,
            images,
            cache_salt: request.str_field("cache_salt").map(str::to_owned),
        })
    }

    /// transformers' `decode(ids)` (special tokens kept; ids the vocabulary lacks are skipped).
    fn decode(&self, ids: &[u32]) -> Result<String, String> {
        self.decoder()?.decode(ids, false).map_err(|e| e.to_string())
    }

    fn id_tokens(&self, ids: &[u32]) -> Result<Vec<String>, String> {
        let tokenizer = self.decoder()?;
        ids.iter()
            .map(|&id| tokenizer.id_to_token(id).ok_or_else(|| format!("Token id {id} is out of vocabulary")))
            .collect()
    }
}

/// Fallback reasons (`mmrouter_mm_fallback_total{reason}` labels) where the engine itself fails the
/// request: the reference processor raises (zero side, Qwen's aspect-ratio limit, a side resized to
/// nothing, Kimi's position-embedding limit, no token budget left), or the image cannot be read at all.
const ENGINE_REJECTS: &[&str] = &[
    "zero_size",
    "aspect_ratio",
    "too_small",
    "position_embedding_exceeded",
    "budget_underflow",
    "invalid_data_url",
    "decode_failed",
    "unsupported_format",
    "probe_failed",
    // vLLM 0.32 fails a one-frame clip (Qwen2.5-VL divides by zero, Qwen3-VL's resize refuses it) and
    // refuses per-request media kwargs without --trust-request-mm-kwargs.
    "video_too_short",
    "request_mm_kwargs",
];

/// Each image run of the prompt with its engine name: the part's `uuid` verbatim, else the sim's own
/// hash of the image's bytes. Runs, planned images and request image parts are all in request order;
/// `None` if they disagree.
fn name_images(request: &Request<'_>, plan: &RoutePlan, trace: &PromptTrace) -> Option<Vec<SimImage>> {
    if trace.spans.is_empty() {
        return Some(Vec::new());
    }
    if trace.spans.len() != plan.images.len() || plan.images.len() != request.images.len() {
        tracing::debug!("sim: image runs do not line up with the request's images; no KV events for it");
        return None;
    }
    let named = trace.spans.iter().zip(&plan.images).zip(&request.images).map(|((span, planned), part)| {
        let name = part.uuid.clone().unwrap_or_else(|| engine_image_id(&planned.hash));
        // vLLM hashes a uuid together with per-request processor/media kwargs.
        let identifier = if plan.images_rehashed { rehashed_image_id(&name, request) } else { name };
        SimImage {
            offset: span.offset,
            len: span.len,
            identifier,
            feature_tokens: planned.feature_tokens,
            width: planned.width,
            height: planned.height,
        }
    });
    Some(named.collect())
}

/// The sim's name for an image without a uuid: hex of BLAKE3(`"sim-mm:"` ‖ the image's 32-byte BLAKE3
/// digest), given the digest's hex. 64 hex digits like a real `mm_hash`, but never the router's own
/// identity, so a router cannot match such images by name (as against vLLM).
pub fn engine_image_id(digest_hex: &str) -> String {
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"sim-mm:");
    match unhex(digest_hex) {
        Some(digest) => hasher.update(&digest),
        None => hasher.update(digest_hex.as_bytes()),
    };
    hasher.finalize().to_hex().to_string()
}

/// An image's name when the request's `mm_processor_kwargs` / `media_io_kwargs` are hashed with it.
fn rehashed_image_id(name: &str, request: &Request<'_>) -> String {
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"sim-mm-kwargs:");
    hasher.update(name.as_bytes());
    for key in ["mm_processor_kwargs", "media_io_kwargs"] {
        hasher.update(request.field(key).map(|v| v.to_string()).unwrap_or_default().as_bytes());
    }
    hasher.finalize().to_hex().to_string()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

fn exact(opts: &SimOptions) -> anyhow::Result<Arc<ExactPrompter>> {
    let model = opts.model_dir.as_deref().unwrap_or("qwen3-vl");
    let prompter = ExactPrompter::new(model, opts.block_size as u32, &opts.fetch_allow_cidrs, &opts.fetch_allow_hosts)?;
    // An adapter's requests hash with its name in the chain's seed, as vLLM's blocks do.
    prompter.pipeline.learn_adapters(&opts.lora_modules);
    Ok(Arc::new(prompter))
}

/// `mmrouter sim`: one simulated worker with the exact prompter until `shutdown`.
pub async fn run_exact(opts: SimOptions, shutdown: impl std::future::Future<Output = ()>) -> anyhow::Result<()> {
    let prompter = exact(&opts)?;
    crate::handle::run(opts, prompter, shutdown).await
}

/// Starts a sim whose prompter is the exact pipeline for `opts.model_dir` (bundled qwen3-vl by default).
pub async fn spawn_exact(opts: SimOptions) -> anyhow::Result<SimHandle> {
    let prompter = exact(&opts)?;
    crate::handle::spawn(opts, prompter).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_image_ids_are_64_hex_and_not_the_digest() {
        let digest = "ab".repeat(32);
        let id = engine_image_id(&digest);
        assert_eq!(id.len(), 64);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(id, digest);
        let mut expected = blake3::Hasher::new();
        expected.update(b"sim-mm:").update(&[0xab; 32]);
        assert_eq!(id, expected.finalize().to_hex().as_str());
        assert_eq!(unhex("0aff"), Some(vec![0x0a, 0xff]));
        assert_eq!(unhex("0g"), None);
        assert_eq!(unhex("abc"), None);
    }
}
