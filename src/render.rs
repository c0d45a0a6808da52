//! `mmrouter render`: the prompt the router computes for a request file — rendered text, token ids
//! and image spans — so an operator can diff it against their own workers (vLLM's
//! `POST /tokenize` or `POST /v1/chat/completions/render`).

use std::path::Path;

use anyhow::Context as _;
use mmrouter_core::media::MediaConfig;
use mmrouter_core::model::{ModelSource, ModelSpec};
use mmrouter_core::pipeline::{Pipeline, PipelineConfig, Planned};
use mmrouter_core::request::{Endpoint, Request};

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
    println!("{}", serde_json::to_string_pretty(&report(&planned))?);
    Ok(())
}

/// The plan and its trace as JSON (also what `/debug/route?tokens=true` adds).
pub fn report(planned: &Planned) -> serde_json::Value {
    let plan = &planned.plan;
    let trace = planned.trace.as_ref();
    serde_json::json!({
        "route": plan.route.label(),
        "reason": plan.fallback_reason(),
        "prompt_tokens": plan.prompt_tokens,
        "prompt_tokens_exact": plan.prompt_exact,
        "text": trace.and_then(|t| t.text.as_deref()),
        "token_ids": trace.map(|t| &t.ids),
        "image_spans": trace.map(|t| t.spans.iter().map(|s| serde_json::json!({
            "offset": s.offset, "length": s.len, "hash": format!("{:032x}", s.hash)
        })).collect::<Vec<_>>()),
    })
}
