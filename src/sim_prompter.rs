//! Ground truth for the simulator: the sim's prompt is computed with the router's own pipeline
//! (chat template, tokenizer, exact image expansion, block hashing), so its prefix cache — and the
//! `cached_tokens` it reports — reflect what a real worker would reuse.

use std::sync::Arc;

use crate::config::Config;
use crate::pipeline::{Endpoint, Pipeline, Route};
use crate::sim::{Prompter, SimOptions, SimPrompt};

pub struct ExactPrompter {
    pipeline: Pipeline,
    rt: tokio::runtime::Handle,
}

impl ExactPrompter {
    /// `model` is a bundled profile name or an HF model directory; image URLs are fetched only from
    /// `fetch_cidrs` (and `localhost`), never from anywhere else.
    pub fn new(model: &str, block_size: u32, fetch_cidrs: &[String]) -> anyhow::Result<ExactPrompter> {
        let mut cfg = Config::parse(&format!(
            "[model]\ndir = {model:?}\nblock_size = {block_size}\n[[workers]]\nname = \"self\"\nurl = \"http://127.0.0.1:1\"\n"
        ))?;
        // A real worker fetches whatever URL it is given; the sim is confined to an allowlist (loopback
        // by default) so a forwarded test URL can never reach another machine.
        cfg.media.allow_public = false;
        cfg.media.allow_cidrs = fetch_cidrs.to_vec();
        cfg.media.allow_hosts = vec!["localhost".to_owned()];
        cfg.validate()?;
        Ok(ExactPrompter { pipeline: Pipeline::new(&cfg)?, rt: tokio::runtime::Handle::current() })
    }
}

impl Prompter for ExactPrompter {
    fn prompt(
        &self,
        path: &str,
        body: &serde_json::Value,
        raw: &[u8],
        _block_size: usize,
    ) -> Result<SimPrompt, String> {
        let endpoint = if path.ends_with("/completions") && !path.ends_with("/chat/completions") {
            Endpoint::Completion
        } else {
            Endpoint::Chat
        };
        // The sim shares the process with the proxy in `demo`: its planning must not show up in the
        // proxy's metrics, so it runs under a no-op local recorder on this thread.
        let plan = tokio::task::block_in_place(|| {
            metrics::with_local_recorder(&metrics::NoopRecorder, || {
                self.rt.block_on(self.pipeline.plan(endpoint, raw, body))
            })
        })
        .map_err(|e| e.message)?;
        if let Route::TextPrefix { reason } = plan.route {
            // A real engine would reject what we cannot account (or we lack its profile); the sim
            // serves it on the known prefix so workloads with such images still run.
            tracing::debug!("sim: image not accountable ({reason}); caching the text prefix only");
        }
        Ok(SimPrompt { prompt_tokens: plan.prompt_tokens.max(1), block_keys: plan.blocks })
    }
}

/// `mmrouter sim`: one simulated worker until `shutdown`.
pub async fn run_sim(opts: SimOptions, shutdown: impl std::future::Future<Output = ()>) -> anyhow::Result<()> {
    let model = opts.model_dir.clone().unwrap_or_else(|| "qwen3-vl".to_owned());
    let prompter = ExactPrompter::new(&model, opts.block_size as u32, &opts.fetch_allow_cidrs)?;
    crate::sim::run(opts, Arc::new(prompter), shutdown).await
}

/// Starts a sim whose prompter is the exact pipeline for `opts.model_dir` (bundled qwen3-vl by default).
pub async fn spawn_sim(opts: SimOptions) -> anyhow::Result<crate::sim::SimHandle> {
    let model = opts.model_dir.clone().unwrap_or_else(|| "qwen3-vl".to_owned());
    let prompter = ExactPrompter::new(&model, opts.block_size as u32, &opts.fetch_allow_cidrs)?;
    crate::sim::spawn(opts, Arc::new(prompter)).await
}
