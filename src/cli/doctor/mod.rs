//! `mmrouter doctor`: checks a live deployment the way the real-engine suite does. Per worker:
//! reachable, engine and version, served model names, block size and prefix caching, KV events
//! (found, bound, flowing, naming images by the router's uuid), and for built-in probe chats the
//! worker's own token ids (vLLM's render endpoint), prompt-token counts and cached tokens after a repeat
//! against what the router computes; in a pool with roles, each worker's role and whether its
//! prefill, decode and encode workers serve the same model, and a vLLM P/D pool's legs meet
//! (`roles.rs`). Prints a table with a fix hint per failed line (or `--json`) and
//! exits 1 when a check fails.
//!
//! Bounded throughout: every answer is read under a cap (`http.rs`), every request within its timeout,
//! the workers are checked a few at a time, and the whole run within one deadline: a worker still being
//! checked then keeps the lines found so far and gets a failed `deadline` line.

mod checks;
mod events;
mod http;
mod probe;
mod report;
mod roles;

use std::path::PathBuf;
use std::time::Duration;

use futures_util::StreamExt as _;
use mmrouter_core::model::{ModelSource, ModelSpec};
use mmrouter_core::routing::{Engine, WorkerSpec};

use crate::config::{EventSource, Settings, WorkerSettings};

pub use report::{Line, Status};

/// The whole run's deadline when none is given (`--deadline-secs`).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(60);

/// Workers checked at once: a large pool fits its deadline, and no worker sees more than its own probes.
const CONCURRENT_WORKERS: usize = 8;

/// How long the doctor may take: each request to a worker, and the whole run.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Each request to a worker, whole: connect, headers, and the last byte of its answer.
    pub timeout: Duration,
    /// Every check of every worker.
    pub deadline: Duration,
}

impl From<Duration> for Limits {
    /// A per-request timeout under the default deadline.
    fn from(timeout: Duration) -> Limits {
        Limits { timeout, deadline: DEFAULT_DEADLINE }
    }
}

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
    pub limits: Limits,
    pub json: bool,
}

/// Runs every check, prints the report, and returns the exit code (0: nothing failed).
pub async fn run(args: &DoctorArgs) -> anyhow::Result<u8> {
    let settings = settings(args)?;
    let lines = diagnose(&settings, args.limits).await?;
    let text = if args.json {
        format!("{}\n", serde_json::to_string_pretty(&report::json(&lines))?)
    } else {
        report::table(&lines)
    };
    super::print_quietly(&text)?;
    Ok(u8::from(report::failed(&lines) > 0))
}

/// Every check of every worker of every pool, reported in that order, within `limits`.
pub async fn diagnose(settings: &Settings, limits: impl Into<Limits>) -> anyhow::Result<Vec<Line>> {
    let limits = limits.into();
    let deadline = tokio::time::Instant::now() + limits.deadline;
    let pipelines: Vec<checks::LazyPipeline<'_>> = settings.pools.iter().map(checks::LazyPipeline::new).collect();
    let jobs = settings.pools.iter().zip(&pipelines).flat_map(|(pool, pipeline)| {
        let scope = checks::Scope { pool, pipeline, limits: &settings.kv_events, timeout: limits.timeout };
        pool.workers.iter().map(move |w| within(scope, w, (deadline, limits.deadline)))
    });
    let mut per_worker: Vec<report::Checks> =
        futures_util::stream::iter(jobs).buffered(CONCURRENT_WORKERS).collect().await;
    // The pools' workers, in order: each pool's legs compared once all of its workers have answered.
    let mut rest = per_worker.as_mut_slice();
    for pool in &settings.pools {
        let (checks, after) = rest.split_at_mut(pool.workers.len());
        roles::same_model(pool, checks);
        if roles::is_disaggregated(pool)
            && tokio::time::timeout_at(deadline, roles::pd_path(pool, checks, limits.timeout)).await.is_err()
        {
            let hint = "raise --deadline-secs, or see why the legs answer slowly (the engines' logs)";
            checks[0].fail(
                "deadline",
                format!("the doctor's deadline ({:?}) passed during pd_path", limits.deadline),
                hint,
            );
        }
        rest = after;
    }
    Ok(per_worker.into_iter().flat_map(|c| c.lines).collect())
}

/// One worker's checks, stopped at the run's deadline: the lines found by then, and a failed
/// `deadline` line for what did not run.
async fn within(
    scope: checks::Scope<'_>,
    w: &WorkerSettings,
    (deadline, whole): (tokio::time::Instant, Duration),
) -> report::Checks {
    let mut c = report::Checks::new(&scope.pool.name, &w.spec.name);
    if tokio::time::timeout_at(deadline, checks::worker(&scope, w, &mut c)).await.is_err() {
        let detail = if c.lines.is_empty() {
            format!("not checked: the doctor's deadline ({whole:?}) passed first")
        } else {
            format!("the doctor's deadline ({whole:?}) passed during these checks: the rest did not run")
        };
        c.fail("deadline", detail, "raise --deadline-secs, or see why this worker answers slowly (its log)");
    }
    c
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
        specs.push(WorkerSpec { engine: args.engine, ..WorkerSpec::new(format!("worker-{i}"), url.clone()) });
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
