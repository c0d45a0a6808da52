//! `mmrouter doctor`: checks a live deployment the way the real-engine suite does. Per worker:
//! reachable, engine and version, served model names, block size and prefix caching, KV events
//! (found, bound, flowing, naming images by the router's uuid), and for built-in probe chats the
//! worker's own token ids (vLLM's render endpoint), prompt-token counts and cached tokens after a repeat
//! against what the router computes. Prints a table with a fix hint per failed line (or `--json`) and
//! exits 1 when a check fails.

mod checks;
mod events;
mod http;
mod probe;
mod report;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use mmrouter_core::model::{ModelSource, ModelSpec};
use mmrouter_core::pipeline::Pipeline;
use mmrouter_core::routing::{Engine, WorkerSpec};

use crate::config::{EventSource, Settings};

pub use report::{Line, Status};

/// What to check: a config file, or a model and worker URLs given as flags.
#[derive(Debug, Clone)]
pub struct DoctorArgs {
    pub config: Option<PathBuf>,
    pub model_dir: Option<String>,
    pub workers: Vec<String>,
    pub block_size: u32,
    pub engine: Engine,
    /// `discover` or an endpoint (one worker only), for every `--worker`.
    pub kv_events: Option<String>,
    /// Each request to a worker, whole.
    pub timeout: Duration,
    pub json: bool,
}

/// Runs every check, prints the report, and returns the exit code (0: nothing failed).
pub async fn run(args: &DoctorArgs) -> anyhow::Result<u8> {
    let settings = settings(args)?;
    let lines = diagnose(&settings, args.timeout).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report::json(&lines))?);
    } else {
        print!("{}", report::table(&lines));
    }
    Ok(u8::from(report::failed(&lines) > 0))
}

/// Every check of every worker of every pool, in order.
pub async fn diagnose(settings: &Settings, timeout: Duration) -> anyhow::Result<Vec<Line>> {
    let mut lines = Vec::new();
    for pool in &settings.pools {
        let pipeline = Pipeline::new(&pool.pipeline).with_context(|| format!("pool {}", pool.name))?;
        let scope = checks::Scope { pool, pipeline: &pipeline, limits: &settings.kv_events, timeout };
        for worker in &pool.workers {
            lines.extend(checks::worker(&scope, worker).await);
        }
    }
    Ok(lines)
}

fn settings(args: &DoctorArgs) -> anyhow::Result<Settings> {
    match (&args.config, &args.model_dir) {
        (Some(path), None) => Settings::load(path),
        (None, Some(dir)) => flag_settings(args, dir),
        _ => anyhow::bail!("doctor needs --config FILE, or --model-dir DIR with one --worker URL or more"),
    }
}

/// One pool from flags: the model, its block size, and the workers (named `worker-0`, `worker-1`, …).
fn flag_settings(args: &DoctorArgs, dir: &str) -> anyhow::Result<Settings> {
    if args.workers.is_empty() {
        anyhow::bail!("--model-dir needs at least one --worker URL");
    }
    let source = ModelSource::parse(dir).map_err(|e| anyhow::anyhow!("--model-dir: {e}"))?;
    let mut model = ModelSpec::new(source);
    model.block_size = args.block_size;
    let mut specs = Vec::new();
    for (i, url) in args.workers.iter().enumerate() {
        crate::config::check_worker_url(url).map_err(|e| anyhow::anyhow!("--worker {url}: {e}"))?;
        specs.push(WorkerSpec { name: format!("worker-{i}"), url: url.clone(), engine: args.engine });
    }
    let mut settings = Settings::new(model, specs);
    let events = match args.kv_events.as_deref() {
        None => None,
        Some("discover") => Some(EventSource::Discover),
        Some(_) if args.workers.len() > 1 => {
            anyhow::bail!("--kv-events ENDPOINT names one publisher: give one --worker")
        }
        Some(ep) => Some(EventSource::Endpoints {
            endpoint: ep.to_owned(),
            replay: None,
            topic: String::new(),
            data_parallel_size: 1,
        }),
    };
    for w in &mut settings.pool().workers {
        w.events = events.clone();
    }
    Ok(settings)
}
