//! `mmrouter render`: the prompt the router computes for a request file — rendered text, token ids
//! and image spans — so an operator can diff it against their own workers (vLLM's
//! `POST /tokenize` or `POST /v1/chat/completions/render`).

use std::path::Path;

use anyhow::Context as _;
use mmrouter_core::media::MediaConfig;
use mmrouter_core::model::{ModelSource, ModelSpec};
use mmrouter_core::pipeline::{Pipeline, PipelineConfig};
use mmrouter_core::request::{Endpoint, Request};

use crate::proxy::trace_json;

/// Renders `request_file` (a chat-completions body; `-` reads standard input) for `model_dir` (a
/// bundled profile name or an HF model directory) and prints one JSON object.
pub async fn run(model_dir: &str, request_file: &Path, completion: bool) -> anyhow::Result<()> {
    let source = ModelSource::parse(model_dir).map_err(|e| anyhow::anyhow!("--model-dir: {e}"))?;
    let body = if request_file == Path::new("-") {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf)?;
        buf
    } else {
        std::fs::read(request_file).with_context(|| format!("reading {}", request_file.display()))?
    };
    let pipeline = Pipeline::new(&PipelineConfig { model: ModelSpec::new(source), media: MediaConfig::default() })?;
    let endpoint = if completion { Endpoint::Completion } else { Endpoint::Chat };
    let request = Request::parse(endpoint, &body)?;
    let planned = pipeline.plan_with(&request, true).await?;
    super::print_quietly(&format!("{}\n", serde_json::to_string_pretty(&trace_json(&planned))?))?;
    Ok(())
}
