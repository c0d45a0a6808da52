//! The TOML file as written: one type per section, each rejecting unknown keys (a typo never silently
//! becomes a default), with the documented defaults. Validated into [`super::settings`] by
//! [`super::build`].

use mmrouter_core::media::MediaConfig;
use mmrouter_core::model::{ModelSource, ModelSpec};
use mmrouter_core::routing::{Engine, Role, RoutingConfig};
use serde::Deserialize;

use super::cluster::ClusterSection;
use super::discovery::DiscoverySection;
use super::kv_events::KvEventsSection;
use super::responses::ResponsesConfig;
use super::retries::RetryConfig;
use super::tracing::TracingConfig;

/// The file as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    #[serde(default)]
    pub server: ServerSection,
    #[serde(default)]
    pub model: ModelSection,
    #[serde(default)]
    pub workers: Vec<WorkerSection>,
    #[serde(default)]
    pub routing: RoutingConfig,
    /// Several models behind one router: each pool its model, its served names and its workers. Absent:
    /// `[model]` and `[[workers]]` are the one pool, serving any `model`.
    #[serde(default)]
    pub pools: Vec<PoolSection>,
    #[serde(default)]
    pub media: MediaConfig,
    #[serde(default)]
    pub auth: AuthSection,
    #[serde(default)]
    pub retries: RetryConfig,
    #[serde(default)]
    pub kv_events: KvEventsSection,
    /// Which worker stored each Responses API answer, and how an unknown one is looked for.
    #[serde(default)]
    pub responses: ResponsesConfig,
    /// Several replicas routing as one; absent: this router is alone.
    pub cluster: Option<ClusterSection>,
    /// How `[[workers]]` entries with `dns` / `dns_srv` are resolved (docs/dns.md).
    #[serde(default)]
    pub discovery: DiscoverySection,
    /// OpenTelemetry traces over OTLP (off unless `otlp_endpoint` is set).
    #[serde(default)]
    pub tracing: TracingConfig,
}

/// One `[[pools]]` entry.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolSection {
    /// The pool's name (logs, metrics).
    pub name: String,
    /// The request `model` values this pool serves: its served model name(s) and aliases. The model's
    /// `lora_adapters` are served by the pool too.
    pub models: Vec<String>,
    #[serde(default)]
    pub model: ModelSection,
    pub workers: Vec<WorkerSection>,
    /// The pool's routing; default: the top-level `[routing]`.
    pub routing: Option<RoutingConfig>,
}

/// `[server]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSection {
    /// Address the proxy listens on.
    pub listen: String,
    /// Address of the endpoint picker's gRPC server (Envoy ext_proc, docs/gateway.md); unset: none.
    pub ext_proc_listen: Option<String>,
    /// Fallback endpoints the picker lists after its pick, for a gateway that goes down the list.
    pub ext_proc_fallbacks: usize,
    /// Largest request body accepted; larger bodies get an OpenAI-shaped 413 and nothing is forwarded.
    pub max_body_bytes: usize,
    /// Upstream TCP connect timeout.
    pub connect_timeout_ms: u64,
    /// From dispatch to the worker's response headers (covers queueing and prefill).
    pub first_byte_timeout_ms: u64,
    /// From dispatch to the end of the response body, streams included.
    pub total_timeout_ms: u64,
    /// Longest silence between two chunks of a worker's response body before it is cut (a model may
    /// pause between tokens: be generous).
    pub upstream_idle_timeout_ms: u64,
    /// How often each worker's `/health` is polled; 0 disables active checks.
    pub health_interval_ms: u64,
    /// How often the config file is checked for changes, applied like a reload (SIGHUP); 0: never.
    /// For deployment tools that write the worker list into the file (a ConfigMap, a sidecar).
    pub watch_config_ms: u64,
    /// A client must finish sending a request head within this (HTTP/1); it also bounds how long an
    /// idle keep-alive connection waits for its next request, as hyper runs one timer for both.
    pub header_read_timeout_ms: u64,
    /// A client must finish sending a request body within this, or gets a 408 and the connection closes.
    pub body_read_timeout_ms: u64,
    /// A connection with no request in flight for this long is closed (HTTP/1 keep-alive and HTTP/2).
    pub idle_timeout_ms: u64,
    /// Open client connections at most; beyond, a new connection gets a 503 and is closed. 0: no cap.
    pub max_connections: usize,
    /// Requests in flight at most (`/health` and `/metrics` excluded); beyond, a fast 503. 0: no cap.
    pub max_inflight_requests: usize,
    /// The `retry-after` (seconds) sent with a shed request.
    pub shed_retry_after_secs: u64,
    /// After SIGTERM/Ctrl-C, `/health` says draining and new connections are still accepted this long
    /// (for a load balancer to notice) before the listener closes.
    pub drain_delay_ms: u64,
    /// Then in-flight requests get at most this long to finish before their connections are closed.
    pub drain_timeout_ms: u64,
    /// `text` or `json`: the log line format (`serve` only).
    pub log_format: String,
    /// One log line per request (request id, method, path, status, worker, timings).
    pub access_log: bool,
}

impl Default for ServerSection {
    fn default() -> Self {
        ServerSection {
            listen: "127.0.0.1:8080".into(),
            ext_proc_listen: None,
            ext_proc_fallbacks: 0,
            max_body_bytes: 64 * 1024 * 1024,
            connect_timeout_ms: 2_000,
            first_byte_timeout_ms: 120_000,
            total_timeout_ms: 1_800_000,
            upstream_idle_timeout_ms: 120_000,
            health_interval_ms: 2_000,
            watch_config_ms: 0,
            header_read_timeout_ms: 30_000,
            body_read_timeout_ms: 60_000,
            idle_timeout_ms: 30_000,
            max_connections: 4096,
            max_inflight_requests: 1024,
            shed_retry_after_secs: 1,
            drain_delay_ms: 0,
            drain_timeout_ms: 30_000,
            log_format: "text".into(),
            access_log: true,
        }
    }
}

/// `[auth]`: off unless a key list is given. Keys come from the file itself, an environment variable
/// (comma-separated) or a key file (one per line, `#` comments); all sources add up, for rotation.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSection {
    /// Client keys for `/v1/*` (`Authorization: Bearer <key>`).
    pub api_keys: Vec<String>,
    pub api_keys_env: Option<String>,
    pub api_keys_file: Option<String>,
    /// Admin keys for `/metrics` and `/debug/*`.
    pub admin_keys: Vec<String>,
    pub admin_keys_env: Option<String>,
    pub admin_keys_file: Option<String>,
    /// What workers receive as `Authorization`: `forward` (as received), `strip`, or `replace` (with
    /// `upstream_key`).
    pub upstream_authorization: String,
    pub upstream_key: Option<String>,
    pub upstream_key_env: Option<String>,
}

impl Default for AuthSection {
    fn default() -> Self {
        AuthSection {
            api_keys: Vec::new(),
            api_keys_env: None,
            api_keys_file: None,
            admin_keys: Vec::new(),
            admin_keys_env: None,
            admin_keys_file: None,
            upstream_authorization: "forward".into(),
            upstream_key: None,
            upstream_key_env: None,
        }
    }
}

/// `[model]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    /// A bundled profile name (`qwen3-vl`, `qwen2.5-vl`) or the path of an HF model directory.
    pub dir: String,
    /// Model identity used to seed block hashes; defaults to `dir`. Workers sharing a cache must agree.
    pub name: Option<String>,
    /// Accounting family override (e.g. `qwen3_vl`); auto-detected from the HF files when absent.
    pub family: Option<String>,
    /// KV block size of the pool (vLLM `--block-size`).
    pub block_size: u32,
    /// Mirrors the workers' `--mm-processor-kwargs`; applied on top of `preprocessor_config.json`.
    pub processor_kwargs: serde_json::Map<String, serde_json::Value>,
    /// Request `model` values that name LoRA adapters: they seed block hashes differently.
    pub lora_adapters: Vec<String>,
    /// LoRA adapters the router may load on a worker at run time (vLLM's `/v1/load_lora_adapter`,
    /// engines started with `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`) when a request names one that no
    /// worker lists. Empty (the default): the router never loads adapters.
    pub load_lora_adapters: Vec<LoadLoraAdapter>,
    /// false: never account images; requests with images route on their text prefix only.
    pub exact_accounting: bool,
    /// Decode tokens assumed for load when the request sets no `max_tokens`.
    pub default_decode_tokens: u32,
    /// The workers' `--max-model-len`; only request-wide accounting families (Nemotron Omni) need it.
    pub max_model_len: Option<u32>,
    /// A Jinja chat template file that replaces the model's own (the workers' `--chat-template`).
    pub chat_template: Option<String>,
    /// The workers' `--chat-template-content-format`: `auto` (detected per template, vLLM's default),
    /// `string` or `openai`.
    pub chat_template_content_format: String,
    /// The workers' `--tokenizer-mode`: `auto` (vLLM's: `mistral` for a directory with `tekken.json`
    /// and consolidated weights, or `tekken.json` and no `tokenizer.json`), `hf` or `mistral`.
    pub tokenizer_mode: String,
    /// Largest rendered prompt in bytes, checked before tokenizing; above it: 400 `prompt_too_long`.
    pub max_prompt_bytes: usize,
    /// Largest prompt in tokens (text and image tokens); above it: 400 `prompt_too_long`.
    pub max_prompt_tokens: u32,
    /// Mirrors the workers' `--media-io-kwargs`: its JSON as a string (`'{"video": {"fps": 4}}'`) or
    /// a table. Its `video` object changes a video's count.
    pub media_io_kwargs: Option<serde_json::Value>,
    /// Mirrors the workers' `--trust-request-mm-kwargs`: a request's own `media_io_kwargs` /
    /// `mm_processor_kwargs` are counted for its videos; off, such a request falls back
    /// (`request_mm_kwargs`), as vLLM refuses it.
    pub trust_request_mm_kwargs: bool,
}

impl Default for ModelSection {
    fn default() -> Self {
        let spec = ModelSpec::new(ModelSource::Bundled("qwen3-vl"));
        ModelSection {
            dir: "qwen3-vl".into(),
            name: None,
            family: None,
            block_size: spec.block_size,
            processor_kwargs: Default::default(),
            lora_adapters: Vec::new(),
            load_lora_adapters: Vec::new(),
            exact_accounting: spec.exact_accounting,
            default_decode_tokens: spec.default_decode_tokens,
            max_model_len: None,
            chat_template: None,
            chat_template_content_format: "auto".into(),
            tokenizer_mode: "auto".into(),
            max_prompt_bytes: spec.max_prompt_bytes,
            max_prompt_tokens: spec.max_prompt_tokens,
            media_io_kwargs: None,
            trust_request_mm_kwargs: spec.trust_request_mm_kwargs,
        }
    }
}

/// One `[[workers]]` entry.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSection {
    pub name: String,
    /// Base URL, e.g. `http://10.0.0.7:8000` (no trailing `/v1`); or, instead, `dns` or `dns_srv`.
    #[serde(default)]
    pub url: String,
    /// A DNS name whose A (else AAAA) records are the workers, on `port`, re-resolved every
    /// `discovery.interval_ms` (a Kubernetes headless Service). The entry's other keys apply to each.
    pub dns: Option<String>,
    /// A DNS name whose SRV records (target and port) are the workers.
    pub dns_srv: Option<String>,
    /// With `dns`: the workers' port.
    pub port: Option<u16>,
    /// With `dns` / `dns_srv`: `http` (default) or `https`.
    pub scheme: Option<String>,
    /// `vllm` (default) or `sglang`.
    #[serde(default)]
    pub engine: Engine,
    /// What the worker does for a request: `both` (default: all of it), or one leg of disaggregated
    /// serving, `prefill`, `decode` or `encode` (docs/disaggregated.md).
    #[serde(default, deserialize_with = "role")]
    pub role: Role,
    /// SGLang prefill workers only, and required there: the engine's bootstrap server port
    /// (`--disaggregation-bootstrap-port`), which both legs of a request name.
    pub bootstrap_port: Option<u16>,
    /// The worker's KV-event publisher (`tcp://host:5557`), or `discover` to ask the worker (vLLM
    /// `GET /kv_event_sources`, SGLang `GET /server_info`). Absent: approximate mode for this worker.
    pub kv_events: Option<String>,
    /// The publisher's replay endpoint (`tcp://host:5558`), for gaps and late joins.
    pub kv_events_replay: Option<String>,
    /// The publisher's topic (default empty: every message).
    #[serde(default)]
    pub kv_events_topic: String,
    /// Data-parallel ranks behind this worker: rank r publishes on the endpoint's port + r (and the
    /// replay port + r), as vLLM does.
    #[serde(default = "one")]
    pub data_parallel_size: u32,
}

fn one() -> u32 {
    1
}

/// A role, refused with the key named (serde_json's own message names no key: the admin API's body).
fn role<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Role, D::Error> {
    let s = String::deserialize(d)?;
    Role::parse(&s)
        .ok_or_else(|| serde::de::Error::custom(format!("role: '{s}' is not both, prefill, decode or encode")))
}

/// One `[model] load_lora_adapters` entry: an adapter's request `model` name and where the workers'
/// engines find its files (a path on the worker's machine, or what vLLM's resolvers accept).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadLoraAdapter {
    pub name: String,
    pub path: String,
}
