//! `mmrouter demo`: simulated workers and the proxy in one process. By default two pools — the bundled
//! Qwen3-VL and Qwen2.5-VL profiles, each over its own simulated workers — so a request's `model`
//! picks the pool; with one `--model`, one pool that serves any model name.
//!
//! The demo is not `serve`: it fetches loopback image URLs (`serve` refuses them by default) and its
//! workers are simulated. It says so on start ([`relaxations`]), so that nobody takes its answers for
//! what `serve` in front of real vLLM workers would answer.

use mmrouter_core::model::{ModelSource, ModelSpec};
use mmrouter_core::pipeline::PipelineConfig;
use mmrouter_core::routing::{RoutingConfig, WorkerSpec};
use mmrouter_sim::{SimHandle, SimOptions};

use crate::config::{PoolSettings, Settings, WorkerSettings};

/// Where the demo's own clients may serve images from (a local web server): loopback.
const LOOPBACK: &str = "127.0.0.0/8";

/// The served names of a bundled profile: the HF model id clients send, and the profile name.
fn served_names(model: &str) -> Vec<String> {
    let hf = match model {
        "qwen3-vl" => Some("Qwen/Qwen3-VL-8B-Instruct"),
        "qwen2.5-vl" => Some("Qwen/Qwen2.5-VL-7B-Instruct"),
        _ => None,
    };
    hf.into_iter().map(str::to_owned).chain([model.to_owned()]).collect()
}

pub async fn run(
    port: u16,
    workers: usize,
    models: &[String],
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    if workers == 0 || models.is_empty() {
        anyhow::bail!("--workers and --model must each be at least 1");
    }
    let mut sims = Vec::new();
    let mut pools = Vec::new();
    for model in models {
        let source = ModelSource::parse(model).map_err(|e| anyhow::anyhow!("--model: {e}"))?;
        let first = sims.len();
        for i in 0..workers {
            let name = if models.len() == 1 { format!("sim-{i}") } else { format!("{model}-{i}") };
            let opts =
                SimOptions { name, model_dir: Some(model.clone()), seed: (first + i) as u64, ..SimOptions::default() };
            sims.push(mmrouter_sim::spawn_exact(opts).await?);
        }
        pools.push(pool(model, source, &sims[first..], models.len() == 1));
    }
    let mut cfg = Settings::new(pools[0].pipeline.model.clone(), Vec::new());
    cfg.pools = pools;
    cfg.server.listen.set_port(port);
    let listener = tokio::net::TcpListener::bind(cfg.server.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on 127.0.0.1:{port}: {e} (pick another with --port)"))?;
    let addr = listener.local_addr()?;
    // Built whole and printed quietly: `mmrouter demo | head` must not panic the server on a closed pipe.
    let mut banner = format!("mmrouter demo: proxy on http://{addr}\n");
    for p in &cfg.pools {
        let served = if p.models.is_empty() { "any model".to_owned() } else { p.models.join(", ") };
        let names: Vec<&str> = p.workers.iter().map(|w| w.spec.name.as_str()).collect();
        banner.push_str(&format!("  pool {} ({served}): workers {}\n", p.name, names.join(", ")));
    }
    banner.push_str("unlike `mmrouter serve`, this demo:\n");
    for line in relaxations(&cfg.pools, &SimOptions::default()) {
        banner.push_str(&format!("  - {line}\n"));
    }
    banner.push_str(&format!("try:\n  curl -s http://{addr}/v1/models\n"));
    banner.push_str(&format!("  curl -s http://{addr}/v1/chat/completions -H 'content-type: application/json' \\\n    -d '{{\"model\":\"Qwen/Qwen3-VL-8B-Instruct\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}]}}'\n"));
    banner.push_str(&format!("metrics: curl -s http://{addr}/metrics   (Ctrl-C to stop)\n"));
    super::print_quietly(&banner)?;
    crate::server::serve(cfg, listener, shutdown).await?;
    for s in sims {
        s.shutdown().await;
    }
    Ok(())
}

/// What the demo does that `serve`, with its defaults and real vLLM workers, would not, for its `pools`
/// over workers started with `sim`'s fetch allowlists: said on start.
pub fn relaxations(pools: &[PoolSettings], sim: &SimOptions) -> Vec<String> {
    let mut cidrs: Vec<&str> =
        pools.iter().flat_map(|p| p.pipeline.media.allow_cidrs.iter().map(String::as_str)).collect();
    cidrs.sort_unstable();
    cidrs.dedup();
    let mut lines = Vec::new();
    if !cidrs.is_empty() {
        lines.push(format!(
            "fetches image URLs on {} (serve answers them 400 image_url_blocked unless [media] allow_cidrs lists them)",
            cidrs.join(", ")
        ));
    }
    lines.push(
        "answers from simulated workers (mmrouter-sim): deterministic text, not a model's; n, logprobs, tools and \
         response_format come back in vLLM's shapes, and what vLLM refuses is refused with its 400"
            .to_owned(),
    );
    let fetched: Vec<&str> = sim.fetch_allow_cidrs.iter().chain(&sim.fetch_allow_hosts).map(String::as_str).collect();
    lines.push(format!(
        "has workers that fetch image URLs only from {} (a worker answers 400 for any other URL): send other \
         images as data: URLs",
        fetched.join(", ")
    ));
    lines
}

/// One pool over `sims`; `any`: serve every model name (the demo's single-model form).
fn pool(model: &str, source: ModelSource, sims: &[SimHandle], any: bool) -> PoolSettings {
    let mut pipeline = PipelineConfig { model: ModelSpec::new(source), media: Default::default() };
    // The demo's own clients may send images from a local web server (announced by `relaxations`).
    pipeline.media.allow_cidrs = vec![LOOPBACK.to_owned()];
    let workers = sims
        .iter()
        .map(|s| WorkerSettings { spec: WorkerSpec::new(s.name().to_owned(), s.url()), events: None })
        .collect();
    PoolSettings {
        name: model.to_owned(),
        models: if any { Vec::new() } else { served_names(model) },
        pipeline,
        workers,
        routing: RoutingConfig::default(),
        load_lora_adapters: Vec::new(),
    }
}
