//! Ground truth for the simulator: the sim's prompt is computed with the router's own core pipeline
//! (chat template, tokenizer, exact image expansion, block hashing), so its prefix cache — and the
//! `cached_tokens` it reports — reflect what a real worker would reuse. That makes cache figures
//! measured against sims self-consistent with the router's planning, not an independent check.

use std::sync::Arc;

use mmrouter_core::media::MediaConfig;
use mmrouter_core::model::{ModelSource, ModelSpec};
use mmrouter_core::pipeline::{Pipeline, PipelineConfig, Route};
use mmrouter_core::request::{Endpoint, Request};

use crate::{Prompter, SimHandle, SimOptions, SimPrompt};

/// The prompter that plans with `mmrouter-core`.
pub struct ExactPrompter {
    pipeline: Pipeline,
    rt: tokio::runtime::Handle,
}

impl ExactPrompter {
    /// `model` is a bundled profile name or an HF model directory; image URLs are fetched only from
    /// `fetch_cidrs` (and `localhost`), never from anywhere else. Needs a tokio runtime.
    pub fn new(model: &str, block_size: u32, fetch_cidrs: &[String]) -> anyhow::Result<ExactPrompter> {
        let source = ModelSource::parse(model).map_err(|e| anyhow::anyhow!("--model-dir: {e}"))?;
        let model = ModelSpec { block_size, ..ModelSpec::new(source) };
        // A real worker fetches whatever URL it is given; the sim is confined to an allowlist (loopback
        // by default) so a forwarded test URL can never reach another machine.
        let media = MediaConfig {
            allow_public: false,
            allow_cidrs: fetch_cidrs.to_vec(),
            allow_hosts: vec!["localhost".to_owned()],
            // A worker names an image by the uuid it is given (vLLM does), whatever the route.
            trust_client_uuids: true,
            ..MediaConfig::default()
        };
        let pipeline = Pipeline::new(&PipelineConfig { model, media })?;
        Ok(ExactPrompter { pipeline, rt: tokio::runtime::Handle::current() })
    }
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
        let planned = tokio::task::block_in_place(|| self.rt.block_on(self.pipeline.plan(&request)))
            .map_err(|e| e.to_string())?;
        let plan = planned.plan;
        if let Route::TextPrefix { reason } = plan.route {
            // A real engine would reject what we cannot account (or we lack its profile); the sim
            // serves it on the known prefix so workloads with such images still run.
            tracing::debug!("sim: image not accountable ({reason}); caching the text prefix only");
        }
        Ok(SimPrompt { prompt_tokens: plan.prompt_tokens.max(1), block_keys: plan.blocks })
    }
}

fn exact(opts: &SimOptions) -> anyhow::Result<Arc<ExactPrompter>> {
    let model = opts.model_dir.as_deref().unwrap_or("qwen3-vl");
    Ok(Arc::new(ExactPrompter::new(model, opts.block_size as u32, &opts.fetch_allow_cidrs)?))
}

/// `mmrouter sim`: one simulated worker with the exact prompter until `shutdown`.
pub async fn run_exact(opts: SimOptions, shutdown: impl std::future::Future<Output = ()>) -> anyhow::Result<()> {
    let prompter = exact(&opts)?;
    crate::run(opts, prompter, shutdown).await
}

/// Starts a sim whose prompter is the exact pipeline for `opts.model_dir` (bundled qwen3-vl by default).
pub async fn spawn_exact(opts: SimOptions) -> anyhow::Result<SimHandle> {
    let prompter = exact(&opts)?;
    crate::spawn(opts, prompter).await
}
