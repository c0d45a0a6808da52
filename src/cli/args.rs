//! The `mmrouter` command line: every subcommand and its flags. In the library, not the binary, so
//! tests can parse the commands the container files run with the binary's own parser.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// `mmrouter --version`: the crate version, and the git commit when built from a checkout (build.rs).
pub const VERSION: &str = env!("MMROUTER_VERSION");

#[derive(Parser, Debug)]
#[command(name = "mmrouter", version = VERSION, about = "KV-cache-aware OpenAI-compatible router for multimodal LLM workers")]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Run the proxy: from a TOML config file, or one pool from flags alone (--model-dir, --worker).
    Serve(ServeArgs),
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
    Sim(Box<mmrouter_sim::SimOptions>),
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
        /// Seconds each request to a worker may take, whole (connect to the answer's last byte).
        #[arg(long, default_value_t = 60)]
        timeout_secs: u64,
        /// Seconds the whole run may take: then the workers still being checked keep what was found
        /// and fail a `deadline` line (exit 1).
        #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
        deadline_secs: u64,
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

fn parse_engine(s: &str) -> Result<mmrouter_core::routing::Engine, String> {
    match s {
        "vllm" => Ok(mmrouter_core::routing::Engine::Vllm),
        "sglang" => Ok(mmrouter_core::routing::Engine::Sglang),
        _ => Err(format!("'{s}': expected vllm or sglang")),
    }
}

/// `mmrouter serve`: a config file, or one pool from flags; the flags override the file's keys.
#[derive(clap::Args, Clone, Debug)]
#[command(group = clap::ArgGroup::new("any_worker").multiple(true).args(["workers", "prefill", "decode", "encode", "worker_dns", "worker_srv"]))]
pub struct ServeArgs {
    /// Config file (see config/mmrouter.toml). Default: config/mmrouter.toml, unless --model-dir or
    /// --worker describe the pool, which then need no file.
    #[arg(long, env = "MMROUTER_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The model the workers serve: a bundled profile (qwen3-vl, qwen2.5-vl) or an HF model directory
    /// (`[model] dir`).
    #[arg(long, value_name = "DIR|PROFILE")]
    pub model_dir: Option<String>,
    /// A worker's base URL, e.g. http://10.0.0.7:8000 (repeatable): the pool's workers, named
    /// worker-0, worker-1, … (replaces the file's `[[workers]]`).
    #[arg(long = "worker", value_name = "URL")]
    pub workers: Vec<String>,
    /// A prefill worker's base URL (repeatable), named prefill-0, prefill-1, …: with --decode, the pool
    /// serves disaggregated (docs/disaggregated.md).
    #[arg(long = "prefill", value_name = "URL")]
    pub prefill: Vec<String>,
    /// A decode worker's base URL (repeatable), named decode-0, decode-1, ….
    #[arg(long = "decode", value_name = "URL")]
    pub decode: Vec<String>,
    /// An encode worker's base URL (repeatable, vLLM), named encode-0, encode-1, …: images are encoded
    /// there for the prefill (or --worker) workers.
    #[arg(long = "encode", value_name = "URL")]
    pub encode: Vec<String>,
    /// A DNS name whose A (else AAAA) records are workers, and their port, e.g.
    /// vllm-headless.default.svc.cluster.local:8000 (repeatable): re-resolved every 10 s, named
    /// dns-0@ADDR:PORT, … (docs/dns.md).
    #[arg(long = "worker-dns", value_name = "NAME:PORT")]
    pub worker_dns: Vec<String>,
    /// A DNS name whose SRV records are workers, e.g. _http._tcp.vllm.default.svc.cluster.local
    /// (repeatable): named srv-0@ADDR:PORT, … (docs/dns.md).
    #[arg(long = "worker-srv", value_name = "NAME")]
    pub worker_srv: Vec<String>,
    /// The --prefill workers' bootstrap server port (SGLang's --disaggregation-bootstrap-port).
    #[arg(long, value_name = "PORT", requires = "prefill")]
    pub bootstrap_port: Option<u16>,
    /// The workers' KV events: `discover` (asked from each worker), or a publisher endpoint
    /// tcp://HOST:PORT (one worker).
    #[arg(long, value_name = "discover|ENDPOINT", requires = "any_worker")]
    pub kv_events: Option<String>,
    /// What the workers run: vllm | sglang.
    #[arg(long, value_parser = parse_engine, requires = "any_worker")]
    pub engine: Option<mmrouter_core::routing::Engine>,
    /// The workers' KV block size, their --block-size (`[model] block_size`; default 16).
    #[arg(long, value_name = "N")]
    pub block_size: Option<u32>,
    /// The address to listen on (`[server] listen`; default 127.0.0.1:8080).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Also serve the endpoint picker (Envoy ext_proc, gRPC) on this address (`[server]
    /// ext_proc_listen`; docs/gateway.md).
    #[arg(long, value_name = "ADDR")]
    pub ext_proc_listen: Option<String>,
    /// Print the config file these flags (over --config's file) amount to, and exit: served with
    /// --config, it is the same router.
    #[arg(long)]
    pub print_config: bool,
}
