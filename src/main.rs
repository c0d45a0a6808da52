//! The `mmrouter` command: `serve`, `demo`, `count`, and the dev tools `sim`, `loadgen`, `workload`
//! (each a library crate of the workspace; this binary only parses arguments and dispatches).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Small, short-lived allocations dominate the request path (headers, bodies, JSON); mimalloc's
/// thread-local free lists serve them for less CPU than glibc's arenas.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "mmrouter", version, about = "KV-cache-aware OpenAI-compatible router for multimodal LLM workers")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the proxy from a TOML config file.
    Serve {
        /// Config file (see config/mmrouter.toml).
        #[arg(long, env = "MMROUTER_CONFIG", default_value = "config/mmrouter.toml")]
        config: PathBuf,
        /// Overrides `[server] listen`.
        #[arg(long)]
        listen: Option<String>,
    },
    /// Proxy + simulated workers in one process on the bundled model profile; no files needed.
    Demo {
        #[arg(long, default_value_t = 8080)]
        port: u16,
        #[arg(long, default_value_t = 2)]
        workers: usize,
        /// Bundled profile or HF model directory, one pool each (repeatable; default: two pools,
        /// qwen3-vl and qwen2.5-vl). With one, that pool serves any model name.
        #[arg(long = "model", default_values_t = ["qwen3-vl".to_owned(), "qwen2.5-vl".to_owned()])]
        models: Vec<String>,
    },
    /// Run one simulated vLLM-like worker.
    Sim(mmrouter_sim::SimOptions),
    /// Replay a JSONL workload against one or more base URLs and report latency, TTFB and cache reuse.
    Loadgen(mmrouter_loadgen::LoadgenOptions),
    /// Generate a seeded multimodal multi-turn workload (JSONL) for `loadgen`.
    Workload(mmrouter_loadgen::WorkloadOptions),
    /// Print the prompt the router computes for a request file: text, token ids, image spans (to diff
    /// against a worker's `/tokenize` or `/v1/chat/completions/render`).
    Render {
        /// Bundled profile name or HF model directory.
        #[arg(long)]
        model_dir: String,
        /// The request body (`-` for standard input).
        request: PathBuf,
        /// The body is a `/v1/completions` request.
        #[arg(long)]
        completion: bool,
    },
    /// Check a live deployment: per worker, its engine, served names, block size, KV events (bound,
    /// flowing, naming images by the router's uuid), and for built-in probe chats its token ids,
    /// prompt-token counts and cached tokens against the router's. Exit 1 when a check fails.
    Doctor {
        /// Config file whose pools and workers are checked.
        #[arg(long, conflicts_with = "model_dir")]
        config: Option<PathBuf>,
        /// Instead of a config: one pool of this bundled profile or HF model directory...
        #[arg(long, requires = "workers")]
        model_dir: Option<String>,
        /// ...over these worker base URLs (repeatable).
        #[arg(long = "worker", value_name = "URL", requires = "model_dir")]
        workers: Vec<String>,
        /// The pool's KV block size (with --model-dir).
        #[arg(long, default_value_t = 16)]
        block_size: u32,
        /// What the workers run (with --model-dir): vllm | sglang.
        #[arg(long, default_value = "vllm", value_parser = parse_engine)]
        engine: mmrouter_core::routing::Engine,
        /// The workers' KV events (with --model-dir): `discover`, or an endpoint (one worker).
        #[arg(long)]
        kv_events: Option<String>,
        /// Seconds each request to a worker may take.
        #[arg(long, default_value_t = 60)]
        timeout_secs: u64,
        #[arg(long)]
        json: bool,
    },
    /// Print image-token counts for sizes and image files.
    Count {
        /// Bundled profile name or HF model directory.
        #[arg(long)]
        model_dir: String,
        /// Accounting family override (auto-detected by default).
        #[arg(long)]
        family: Option<String>,
        /// A JSON object mirroring the workers' `--mm-processor-kwargs` (the pool's
        /// `processor_kwargs`), e.g. '{"max_pixels": 1003520}' or '{"tokenizer_mode": "mistral"}'.
        #[arg(long, value_name = "JSON")]
        processor_kwargs: Option<String>,
        /// An image size WIDTHxHEIGHT (repeatable).
        #[arg(long = "size")]
        sizes: Vec<String>,
        /// Image files (header-probed; stored size).
        files: Vec<PathBuf>,
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // `serve` picks its log format from its config file, once read.
    if !matches!(cli.cmd, Cmd::Serve { .. }) {
        mmrouter::observe::logging::init(false);
    }
    let result = match cli.cmd {
        Cmd::Count { model_dir, family, processor_kwargs, sizes, files, json } => {
            mmrouter::cli::count::run_count(&mmrouter::cli::count::CountArgs {
                model_dir: &model_dir,
                family: family.as_deref(),
                processor_kwargs: processor_kwargs.as_deref(),
                sizes: &sizes,
                files: &files,
                json,
            })
        }
        Cmd::Doctor { config, model_dir, workers, block_size, engine, kv_events, timeout_secs, json } => {
            let args = mmrouter::cli::doctor::DoctorArgs {
                config,
                model_dir,
                workers,
                block_size,
                engine,
                kv_events,
                timeout: std::time::Duration::from_secs(timeout_secs),
                json,
            };
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .map_err(anyhow::Error::from)
                .and_then(|rt| rt.block_on(mmrouter::cli::doctor::run(&args)).map(i32::from))
        }
        Cmd::Workload(opts) => mmrouter_loadgen::generate_workload(&opts).map(|n| {
            eprintln!("wrote {n} requests");
            0
        }),
        cmd => run_on_runtime(cmd).map(|()| 0),
    };
    match result {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Runs an async subcommand on a multi-threaded runtime.
fn run_on_runtime(cmd: Cmd) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let result = rt.block_on(run(cmd));
    // Serving has drained by now: work left on the blocking pool (a big prompt's planning) must not
    // hold the exit past the drain deadline.
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    result
}

async fn run(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Serve { config, listen } => {
            let mut cfg = mmrouter::config::Settings::load(&config)?;
            mmrouter::observe::logging::init(cfg.server.conn.log_json);
            if let Some(l) = listen {
                cfg.server.listen =
                    l.parse().map_err(|_| anyhow::anyhow!("--listen: '{l}' is not an address like 127.0.0.1:8080"))?;
            }
            let listener = tokio::net::TcpListener::bind(cfg.server.listen)
                .await
                .map_err(|e| anyhow::anyhow!("server.listen {}: {e}", cfg.server.listen))?;
            tracing::info!("mmrouter listening on http://{}", listener.local_addr()?);
            mmrouter::server::serve_file(cfg, config, listener, shutdown_signal()).await
        }
        Cmd::Demo { port, workers, models } => {
            mmrouter::cli::demo::run(port, workers, &models, shutdown_signal()).await
        }
        Cmd::Sim(opts) => mmrouter_sim::run_exact(opts, shutdown_signal()).await,
        Cmd::Render { model_dir, request, completion } => {
            mmrouter::cli::render::run(&model_dir, &request, completion).await
        }
        Cmd::Loadgen(opts) => {
            let report = mmrouter_loadgen::run(opts).await?;
            println!("{}", report.table());
            Ok(())
        }
        Cmd::Count { .. } | Cmd::Doctor { .. } | Cmd::Workload(_) => unreachable!("handled without this runtime"),
    }
}

fn parse_engine(s: &str) -> Result<mmrouter_core::routing::Engine, String> {
    match s {
        "vllm" => Ok(mmrouter_core::routing::Engine::Vllm),
        "sglang" => Ok(mmrouter_core::routing::Engine::Sglang),
        _ => Err(format!("'{s}': expected vllm or sglang")),
    }
}

/// Resolves on SIGTERM or Ctrl-C. The handlers are installed here, at the call, not when the future is
/// first polled: a SIGTERM that arrives while the server is still starting must not kill the process.
fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        async move {
            match (term, int) {
                (Ok(mut term), Ok(mut int)) => tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} },
                _ => tokio::signal::ctrl_c().await.unwrap_or(()),
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}
