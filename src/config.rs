//! The configuration, in two forms (ripgrep's low-level → high-level arguments are the model):
//!
//! * [`ConfigFile`]: the TOML file as written (`config/mmrouter.toml` is the documented example).
//!   Every section rejects unknown keys, so a typo never silently becomes a default.
//! * [`Settings`]: the same, validated once into typed values (addresses, durations, the model
//!   source, the family). Everything at run time is built from a `Settings`; `demo` and the tests
//!   build one directly instead of writing TOML.
//!
//! Every invalid value is reported with the key that holds it.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use mmrouter_core::accounting::Family;
use mmrouter_core::media::MediaConfig;
use mmrouter_core::model::{ModelSource, ModelSpec};
use mmrouter_core::pipeline::PipelineConfig;
use mmrouter_core::prompt::ContentFormat;
use mmrouter_core::routing::{Engine, RoutingConfig, WorkerSpec};
use mmrouter_kv_events::discovery::MAX_DATA_PARALLEL;
use serde::Deserialize;

use crate::retry::RetryConfig;

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
}

/// `[kv_events]`: what the router accepts from the workers' KV-event publishers and their discovery
/// documents. A worker (or anyone on its network path) is untrusted input: every bound is enforced before
/// allocating, and a publisher that breaks one is disconnected and counted.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KvEventsSection {
    /// Largest event message (all its frames together); a larger one disconnects the publisher.
    pub max_message_bytes: usize,
    /// Live batches held while a replay runs, in bytes; beyond it the replay is abandoned (resync).
    pub max_replay_buffer_bytes: usize,
    /// Largest discovery document (`/kv_event_sources`, `/server_info`) read from a worker.
    pub discovery_max_bytes: usize,
    /// Publisher hosts a discovery document may name besides the worker's own host.
    pub discovery_allow_hosts: Vec<String>,
}

impl Default for KvEventsSection {
    fn default() -> Self {
        KvEventsSection {
            max_message_bytes: 8 * 1024 * 1024,
            max_replay_buffer_bytes: 32 * 1024 * 1024,
            discovery_max_bytes: 1024 * 1024,
            discovery_allow_hosts: Vec::new(),
        }
    }
}

impl KvEventsSection {
    fn validate(&self) -> anyhow::Result<()> {
        // Below a few KiB no real batch fits; above 1 GiB one feed alone could exhaust a router's memory.
        const RANGE: std::ops::RangeInclusive<usize> = 4096..=1 << 30;
        for (key, v) in [
            ("max_message_bytes", self.max_message_bytes),
            ("max_replay_buffer_bytes", self.max_replay_buffer_bytes),
            ("discovery_max_bytes", self.discovery_max_bytes),
        ] {
            if !RANGE.contains(&v) {
                anyhow::bail!("kv_events.{key} must be in 4096..=1073741824 (got {v})");
            }
        }
        if let Some(h) = self.discovery_allow_hosts.iter().find(|h| h.trim().is_empty() || h.contains('/')) {
            anyhow::bail!("kv_events.discovery_allow_hosts: '{h}' is not a host name or address");
        }
        Ok(())
    }
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
    /// Largest rendered prompt in bytes, checked before tokenizing; above it: 400 `prompt_too_long`.
    pub max_prompt_bytes: usize,
    /// Largest prompt in tokens (text and image tokens); above it: 400 `prompt_too_long`.
    pub max_prompt_tokens: u32,
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
            exact_accounting: spec.exact_accounting,
            default_decode_tokens: spec.default_decode_tokens,
            max_model_len: None,
            chat_template: None,
            chat_template_content_format: "auto".into(),
            max_prompt_bytes: spec.max_prompt_bytes,
            max_prompt_tokens: spec.max_prompt_tokens,
        }
    }
}

/// One `[[workers]]` entry.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSection {
    pub name: String,
    /// Base URL, e.g. `http://10.0.0.7:8000` (no trailing `/v1`).
    pub url: String,
    /// `vllm` (default) or `sglang`.
    #[serde(default)]
    pub engine: Engine,
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

/// Where a worker's KV events come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventSource {
    /// Configured endpoints, one publisher per data-parallel rank.
    Endpoints { endpoint: String, replay: Option<String>, topic: String, data_parallel_size: u32 },
    /// Asked from the worker itself at start.
    Discover,
}

/// One worker, validated: what routing knows of it, and its event source if it publishes events.
#[derive(Clone, Debug)]
pub struct WorkerSettings {
    pub spec: WorkerSpec,
    pub events: Option<EventSource>,
}

/// The validated, typed configuration the server runs from.
#[derive(Clone, Debug)]
pub struct Settings {
    pub server: ServerSettings,
    /// At least one; names, served models and worker names unique across pools.
    pub pools: Vec<PoolSettings>,
    pub auth: AuthSettings,
    pub retries: RetryConfig,
    pub kv_events: KvEventsSection,
}

/// One pool, validated: a model (with the media settings), its served names, its workers, its routing.
#[derive(Clone, Debug)]
pub struct PoolSettings {
    pub name: String,
    /// Request `model` values routed here (LoRA adapters included); empty: every model (the one pool
    /// of a config without `[[pools]]`).
    pub models: Vec<String>,
    pub pipeline: PipelineConfig,
    pub workers: Vec<WorkerSettings>,
    pub routing: RoutingConfig,
}

impl PoolSettings {
    /// What routing knows of each worker.
    pub fn worker_specs(&self) -> Vec<WorkerSpec> {
        self.workers.iter().map(|w| w.spec.clone()).collect()
    }
}

/// `[server]`, typed.
#[derive(Clone, Debug)]
pub struct ServerSettings {
    pub listen: SocketAddr,
    pub max_body_bytes: usize,
    pub connect_timeout: Duration,
    pub first_byte_timeout: Duration,
    pub total_timeout: Duration,
    pub upstream_idle_timeout: Duration,
    /// `None`: no active health checks.
    pub health_interval: Option<Duration>,
    /// `None`: the config file is not watched.
    pub watch_config: Option<Duration>,
    /// The client side: timeouts, caps, drain, logs.
    pub conn: ConnSettings,
}

/// `[server]`'s client-side keys, typed (see [`ServerSection`] for each one's meaning).
#[derive(Clone, Debug)]
pub struct ConnSettings {
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
    pub idle_timeout: Duration,
    /// `None`: no cap.
    pub max_connections: Option<usize>,
    /// `None`: no cap.
    pub max_inflight_requests: Option<usize>,
    pub shed_retry_after_secs: u64,
    pub drain_delay: Duration,
    pub drain_timeout: Duration,
    pub log_json: bool,
    pub access_log: bool,
}

impl Default for ConnSettings {
    fn default() -> Self {
        conn_settings(&ServerSection::default()).expect("defaults are valid")
    }
}

/// `[auth]`, typed. Empty key lists: that check is off.
#[derive(Clone, Debug, Default)]
pub struct AuthSettings {
    pub api_keys: Vec<String>,
    pub admin_keys: Vec<String>,
    pub upstream: UpstreamAuth,
}

/// What happens to the client's `Authorization` header on its way to a worker.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum UpstreamAuth {
    /// Sent as received (the default, and today's behaviour).
    #[default]
    Forward,
    Strip,
    /// Replaced by `Bearer <key>`.
    Replace(String),
}

impl Default for ServerSettings {
    fn default() -> Self {
        let s = ServerSection::default();
        ServerSettings {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_body_bytes: s.max_body_bytes,
            connect_timeout: Duration::from_millis(s.connect_timeout_ms),
            first_byte_timeout: Duration::from_millis(s.first_byte_timeout_ms),
            total_timeout: Duration::from_millis(s.total_timeout_ms),
            upstream_idle_timeout: Duration::from_millis(s.upstream_idle_timeout_ms),
            health_interval: Some(Duration::from_millis(s.health_interval_ms)),
            watch_config: None,
            conn: ConnSettings::default(),
        }
    }
}

impl Settings {
    /// Settings for `model` over `workers` (approximate mode) with every other value at its default.
    pub fn new(model: ModelSpec, workers: Vec<WorkerSpec>) -> Settings {
        let pool = PoolSettings {
            name: model.name.clone(),
            models: Vec::new(),
            pipeline: PipelineConfig { model, media: MediaConfig::default() },
            workers: workers.into_iter().map(|spec| WorkerSettings { spec, events: None }).collect(),
            routing: RoutingConfig::default(),
        };
        Settings {
            server: ServerSettings::default(),
            pools: vec![pool],
            auth: AuthSettings::default(),
            retries: RetryConfig::default(),
            kv_events: KvEventsSection::default(),
        }
    }

    /// The first pool (the only one of a config without `[[pools]]`).
    pub fn pool(&mut self) -> &mut PoolSettings {
        &mut self.pools[0]
    }

    /// Reads and validates a config file; the error names the file and the offending key.
    pub fn load(path: &Path) -> anyhow::Result<Settings> {
        let text =
            std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("cannot read config {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| anyhow::anyhow!("config {}: {e}", path.display()))
    }

    /// Parses and validates TOML text.
    pub fn parse(text: &str) -> anyhow::Result<Settings> {
        // toml's error text already names the key and the line for type errors and unknown keys.
        let file: ConfigFile = toml::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
        Settings::from_file(file)
    }

    /// Validates every section into its typed form.
    pub fn from_file(file: ConfigFile) -> anyhow::Result<Settings> {
        let server = server_settings(&file.server)?;
        file.routing.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        file.media.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        let auth = auth_settings(&file.auth)?;
        file.retries.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        file.kv_events.validate()?;
        let pools = if file.pools.is_empty() {
            let model = model_spec(&file.model)?;
            let workers = worker_specs(&file.workers)?;
            let name = model.name.clone();
            let pipeline = PipelineConfig { model, media: file.media };
            vec![PoolSettings { name, models: Vec::new(), pipeline, workers, routing: file.routing }]
        } else {
            if !file.workers.is_empty() {
                anyhow::bail!(
                    "pools: with [[pools]], workers belong to their pool ([[pools.workers]]), not [[workers]]"
                );
            }
            pool_settings(&file.pools, &file.media, &file.routing)?
        };
        Ok(Settings { server, pools, auth, retries: file.retries, kv_events: file.kv_events })
    }
}

fn server_settings(s: &ServerSection) -> anyhow::Result<ServerSettings> {
    let listen = s
        .listen
        .parse::<SocketAddr>()
        .map_err(|_| anyhow::anyhow!("server.listen: '{}' is not an address like 127.0.0.1:8080", s.listen))?;
    if s.max_body_bytes == 0 {
        anyhow::bail!("server.max_body_bytes must be > 0");
    }
    for (key, v) in [
        ("server.connect_timeout_ms", s.connect_timeout_ms),
        ("server.first_byte_timeout_ms", s.first_byte_timeout_ms),
        ("server.total_timeout_ms", s.total_timeout_ms),
        ("server.upstream_idle_timeout_ms", s.upstream_idle_timeout_ms),
    ] {
        if v == 0 {
            anyhow::bail!("{key} must be > 0");
        }
    }
    if s.first_byte_timeout_ms > s.total_timeout_ms {
        anyhow::bail!("server.first_byte_timeout_ms must not exceed server.total_timeout_ms");
    }
    Ok(ServerSettings {
        listen,
        max_body_bytes: s.max_body_bytes,
        connect_timeout: Duration::from_millis(s.connect_timeout_ms),
        first_byte_timeout: Duration::from_millis(s.first_byte_timeout_ms),
        total_timeout: Duration::from_millis(s.total_timeout_ms),
        upstream_idle_timeout: Duration::from_millis(s.upstream_idle_timeout_ms),
        health_interval: (s.health_interval_ms > 0).then(|| Duration::from_millis(s.health_interval_ms)),
        watch_config: (s.watch_config_ms > 0).then(|| Duration::from_millis(s.watch_config_ms)),
        conn: conn_settings(s)?,
    })
}

fn conn_settings(s: &ServerSection) -> anyhow::Result<ConnSettings> {
    for (key, v) in [
        ("server.header_read_timeout_ms", s.header_read_timeout_ms),
        ("server.body_read_timeout_ms", s.body_read_timeout_ms),
        ("server.idle_timeout_ms", s.idle_timeout_ms),
        ("server.drain_timeout_ms", s.drain_timeout_ms),
    ] {
        if v == 0 {
            anyhow::bail!("{key} must be > 0");
        }
    }
    let log_json = match s.log_format.as_str() {
        "text" => false,
        "json" => true,
        other => anyhow::bail!("server.log_format: '{other}' is not text or json"),
    };
    let ms = Duration::from_millis;
    Ok(ConnSettings {
        header_read_timeout: ms(s.header_read_timeout_ms),
        body_read_timeout: ms(s.body_read_timeout_ms),
        idle_timeout: ms(s.idle_timeout_ms),
        max_connections: (s.max_connections > 0).then_some(s.max_connections),
        max_inflight_requests: (s.max_inflight_requests > 0).then_some(s.max_inflight_requests),
        shed_retry_after_secs: s.shed_retry_after_secs,
        drain_delay: ms(s.drain_delay_ms),
        drain_timeout: ms(s.drain_timeout_ms),
        log_json,
        access_log: s.access_log,
    })
}

fn auth_settings(a: &AuthSection) -> anyhow::Result<AuthSettings> {
    let api_keys = keys("auth.api_keys", &a.api_keys, a.api_keys_env.as_deref(), a.api_keys_file.as_deref())?;
    let admin_keys = keys("auth.admin_keys", &a.admin_keys, a.admin_keys_env.as_deref(), a.admin_keys_file.as_deref())?;
    let upstream_key = match (&a.upstream_key, &a.upstream_key_env) {
        (Some(_), Some(_)) => anyhow::bail!("auth.upstream_key and auth.upstream_key_env: set one, not both"),
        (Some(k), None) => Some(checked_key("auth.upstream_key", k)?),
        (None, Some(var)) => Some(checked_key("auth.upstream_key_env", &env_var("auth.upstream_key_env", var)?)?),
        (None, None) => None,
    };
    let upstream = match (a.upstream_authorization.as_str(), upstream_key) {
        ("forward", None) => UpstreamAuth::Forward,
        ("strip", None) => UpstreamAuth::Strip,
        ("replace", Some(k)) => UpstreamAuth::Replace(k),
        ("replace", None) => anyhow::bail!("auth.upstream_authorization = \"replace\" needs auth.upstream_key(_env)"),
        ("forward" | "strip", Some(_)) => {
            anyhow::bail!("auth.upstream_key is only used with auth.upstream_authorization = \"replace\"")
        }
        (other, _) => anyhow::bail!("auth.upstream_authorization: '{other}' is not forward, strip or replace"),
    };
    Ok(AuthSettings { api_keys, admin_keys, upstream })
}

/// One key list from its three sources; `key` names the list in errors.
fn keys(key: &str, listed: &[String], env: Option<&str>, file: Option<&str>) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    for k in listed {
        out.push(checked_key(key, k)?);
    }
    if let Some(var) = env {
        let value = env_var(&format!("{key}_env"), var)?;
        for k in value.split(',').map(str::trim).filter(|k| !k.is_empty()) {
            out.push(checked_key(&format!("{key}_env ({var})"), k)?);
        }
    }
    if let Some(path) = file {
        let text =
            std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{key}_file: cannot read '{path}': {e}"))?;
        let lines = text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#'));
        for k in lines {
            out.push(checked_key(&format!("{key}_file ({path})"), k)?);
        }
    }
    if (env.is_some() || file.is_some()) && out.is_empty() {
        // A configured source that yields nothing would silently turn authentication off.
        anyhow::bail!("{key}: the configured key sources hold no key");
    }
    Ok(out)
}

fn env_var(key: &str, var: &str) -> anyhow::Result<String> {
    std::env::var(var).map_err(|_| anyhow::anyhow!("{key}: environment variable {var} is not set"))
}

/// A key must be usable in an `Authorization: Bearer` header.
fn checked_key(key: &str, k: &str) -> anyhow::Result<String> {
    let printable = k.bytes().all(|b| b.is_ascii_graphic());
    if k.is_empty() || !printable || axum::http::HeaderValue::from_str(k).is_err() {
        anyhow::bail!("{key}: a key must be non-empty printable ASCII without spaces");
    }
    Ok(k.to_owned())
}

fn model_spec(m: &ModelSection) -> anyhow::Result<ModelSpec> {
    if m.dir.trim().is_empty() {
        anyhow::bail!("model.dir must name a bundled profile or an HF model directory");
    }
    let source = ModelSource::parse(&m.dir).map_err(|e| anyhow::anyhow!("model.dir: {e}"))?;
    if m.block_size == 0 || m.block_size > 4096 {
        anyhow::bail!("model.block_size must be in 1..=4096 (got {})", m.block_size);
    }
    let family = match &m.family {
        Some(f) => Some(f.parse::<Family>().map_err(|_| anyhow::anyhow!("model.family: unknown family '{f}'"))?),
        None => None,
    };
    if m.max_prompt_bytes == 0 || m.max_prompt_tokens == 0 {
        anyhow::bail!("model.max_prompt_bytes and model.max_prompt_tokens must be positive");
    }
    let content_format = match m.chat_template_content_format.as_str() {
        "auto" => None,
        "string" => Some(ContentFormat::String),
        "openai" => Some(ContentFormat::OpenAi),
        other => anyhow::bail!("model.chat_template_content_format: '{other}' is not auto, string or openai"),
    };
    let chat_template = match &m.chat_template {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("model.chat_template: cannot read '{path}': {e}"))?,
        ),
        None => None,
    };
    Ok(ModelSpec {
        chat_template,
        content_format,
        name: m.name.clone().unwrap_or_else(|| m.dir.clone()),
        source,
        family,
        block_size: m.block_size,
        processor_kwargs: m.processor_kwargs.clone(),
        lora_adapters: m.lora_adapters.clone(),
        exact_accounting: m.exact_accounting,
        default_decode_tokens: m.default_decode_tokens,
        max_model_len: m.max_model_len,
        max_prompt_bytes: m.max_prompt_bytes,
        max_prompt_tokens: m.max_prompt_tokens,
    })
}

/// `[[pools]]`, validated: names, served models and worker names unique across pools.
fn pool_settings(
    pools: &[PoolSection],
    media: &MediaConfig,
    routing: &RoutingConfig,
) -> anyhow::Result<Vec<PoolSettings>> {
    let (mut names, mut models, mut workers) = (HashSet::new(), HashSet::new(), HashSet::new());
    let mut out = Vec::new();
    for (i, p) in pools.iter().enumerate() {
        let at = |e: anyhow::Error| anyhow::anyhow!("pools[{i}] ('{}'): {e}", p.name);
        if p.name.trim().is_empty() || !names.insert(p.name.as_str()) {
            anyhow::bail!("pools[{i}].name: empty or used twice ('{}')", p.name);
        }
        let model = model_spec(&p.model).map_err(at)?;
        let served: Vec<String> = p.models.iter().chain(&model.lora_adapters).cloned().collect();
        if p.models.is_empty() {
            anyhow::bail!("pools[{i}].models: list the model names this pool serves");
        }
        if let Some(dup) = served.iter().find(|m| !models.insert(m.to_string())) {
            anyhow::bail!("pools[{i}].models: '{dup}' is served by another pool too");
        }
        let pool_workers = worker_specs(&p.workers).map_err(at)?;
        if let Some(dup) = pool_workers.iter().find(|w| !workers.insert(w.spec.name.clone())) {
            anyhow::bail!("pools[{i}].workers: worker name '{}' is used in another pool too", dup.spec.name);
        }
        let routing = p.routing.clone().unwrap_or_else(|| routing.clone());
        routing.validate().map_err(|e| at(anyhow::anyhow!("routing: {e}")))?;
        let pipeline = PipelineConfig { model, media: media.clone() };
        out.push(PoolSettings { name: p.name.clone(), models: served, pipeline, workers: pool_workers, routing });
    }
    Ok(out)
}

fn worker_specs(workers: &[WorkerSection]) -> anyhow::Result<Vec<WorkerSettings>> {
    if workers.is_empty() {
        anyhow::bail!("workers: at least one [[workers]] entry is required");
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(workers.len());
    for (i, w) in workers.iter().enumerate() {
        out.push(worker_settings(&format!("workers[{i}]"), w)?);
        if !seen.insert(w.name.as_str()) {
            anyhow::bail!("workers[{i}].name: duplicate worker name '{}'", w.name);
        }
    }
    Ok(out)
}

/// Longest worker name, in bytes: it is a metric label and an admin URL path segment.
pub const MAX_WORKER_NAME_BYTES: usize = 128;

/// A worker name: 1 to [`MAX_WORKER_NAME_BYTES`] bytes, no control characters, no leading or
/// trailing whitespace (it must be writable in `/admin/workers/{name}` and as a label).
pub fn check_worker_name(name: &str) -> anyhow::Result<()> {
    if name.trim().is_empty() {
        anyhow::bail!("must not be empty");
    }
    if name.len() > MAX_WORKER_NAME_BYTES {
        anyhow::bail!("must be at most {MAX_WORKER_NAME_BYTES} bytes (got {})", name.len());
    }
    if name.chars().any(char::is_control) || name.trim() != name {
        anyhow::bail!("{name:?} must not contain control characters or start or end with whitespace");
    }
    Ok(())
}

/// A worker URL must be http(s) with a host (the config file, and workers added at run time).
pub fn check_worker_url(url: &str) -> anyhow::Result<()> {
    let u = url::Url::parse(url).map_err(|e| anyhow::anyhow!("'{url}' is not a URL ({e})"))?;
    if !matches!(u.scheme(), "http" | "https") || u.host_str().is_none() {
        anyhow::bail!("'{url}' must be an http(s) URL with a host");
    }
    Ok(())
}

/// One worker entry validated: the one set of rules for `[[workers]]` entries and for workers added
/// through the admin API. `at` names the entry in errors (`workers[2]`, `worker`).
pub fn worker_settings(at: &str, w: &WorkerSection) -> anyhow::Result<WorkerSettings> {
    check_worker_name(&w.name).map_err(|e| anyhow::anyhow!("{at}.name {e}"))?;
    check_worker_url(&w.url).map_err(|e| anyhow::anyhow!("{at}.url: {e}"))?;
    let spec = WorkerSpec { name: w.name.clone(), url: w.url.clone(), engine: w.engine };
    // The same cap as a discovered document's (a worker is not trusted with more feeds either way).
    if !(1..=MAX_DATA_PARALLEL).contains(&w.data_parallel_size) {
        anyhow::bail!("{at}.data_parallel_size must be in 1..={MAX_DATA_PARALLEL} (got {})", w.data_parallel_size);
    }
    let check = |key: &str, ep: &str| {
        mmrouter_kv_events::endpoint::Endpoint::parse(ep)
            .map(|_| ())
            .map_err(|e| anyhow::anyhow!("{at}.{key}: '{ep}' is not a ZMQ endpoint like tcp://host:5557 ({e})"))
    };
    let events = match w.kv_events.as_deref() {
        None => {
            if w.kv_events_replay.is_some() {
                anyhow::bail!("{at}.kv_events_replay needs {at}.kv_events");
            }
            None
        }
        Some("discover") => Some(EventSource::Discover),
        Some(endpoint) => {
            check("kv_events", endpoint)?;
            if let Some(replay) = &w.kv_events_replay {
                check("kv_events_replay", replay)?;
            }
            Some(EventSource::Endpoints {
                endpoint: endpoint.to_owned(),
                replay: w.kv_events_replay.clone(),
                topic: w.kv_events_topic.clone(),
                data_parallel_size: w.data_parallel_size,
            })
        }
    };
    Ok(WorkerSettings { spec, events })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: &str = "[[workers]]\nname = \"a\"\nurl = \"http://127.0.0.1:1\"\n";

    #[test]
    fn minimal_config_gets_defaults() {
        let c = Settings::parse(MIN).unwrap();
        assert_eq!(c.pools[0].pipeline.model.source, ModelSource::Bundled("qwen3-vl"));
        assert_eq!(c.pools[0].pipeline.model.name, "qwen3-vl");
        assert_eq!(c.pools[0].pipeline.model.block_size, 16);
        assert_eq!(c.pools[0].workers.len(), 1);
        assert_eq!(c.server.health_interval, Some(Duration::from_secs(2)));
    }

    #[test]
    fn every_invalid_value_names_its_key() {
        let cases = [
            ("[server]\nlisten = \"nope\"\n", "server.listen"),
            ("[server]\nmax_body_bytes = 0\n", "server.max_body_bytes"),
            ("[server]\nconnect_timeout_ms = 0\n", "server.connect_timeout_ms"),
            ("[server]\nupstream_idle_timeout_ms = 0\n", "server.upstream_idle_timeout_ms"),
            ("[retries]\nmax_attempts = 0\n", "retries.max_attempts"),
            ("[retries]\nbudget_ratio = -0.5\n", "retries.budget_ratio"),
            ("[retries]\nbogus = 1\n", "bogus"),
            ("[routing.ejection]\nfailure_rate = 2.0\n", "routing.ejection.failure_rate"),
            ("[routing.ejection]\nfailure_window = 0\n", "routing.ejection.failure_window"),
            ("[routing.ejection]\nbase_ejection_ms = 10\nmax_ejection_ms = 5\n", "routing.ejection.max_ejection_ms"),
            ("[model]\nblock_size = 0\n", "model.block_size"),
            ("[model]\nfamily = \"nonsense\"\n", "model.family"),
            ("[model]\ndir = \"/nonexistent/model\"\n", "model.dir"),
            ("[model]\nchat_template_content_format = \"xml\"\n", "model.chat_template_content_format"),
            ("[model]\nchat_template = \"/nonexistent/t.jinja\"\n", "model.chat_template"),
            ("[model]\nbogus = 1\n", "bogus"),
            ("[server]\nlisten = 5\n", "listen"),
            ("[kv_events]\nmax_message_bytes = 100\n", "kv_events.max_message_bytes"),
            ("[kv_events]\nmax_replay_buffer_bytes = 4294967296\n", "kv_events.max_replay_buffer_bytes"),
            ("[kv_events]\ndiscovery_max_bytes = 0\n", "kv_events.discovery_max_bytes"),
            ("[kv_events]\ndiscovery_allow_hosts = [\"\"]\n", "kv_events.discovery_allow_hosts"),
            ("[kv_events]\nmax_frames = 8\n", "max_frames"),
        ];
        for (extra, key) in cases {
            let err = Settings::parse(&format!("{extra}{MIN}")).unwrap_err().to_string();
            assert!(err.contains(key), "error for {extra:?} should name {key}: {err}");
        }
        let err = Settings::parse("").unwrap_err().to_string();
        assert!(err.contains("workers"), "{err}");
        let dup = format!("{MIN}{MIN}");
        assert!(Settings::parse(&dup).unwrap_err().to_string().contains("duplicate"));
        let bad_url = "[[workers]]\nname = \"a\"\nurl = \"ftp://x\"\n";
        assert!(Settings::parse(bad_url).unwrap_err().to_string().contains("workers[0].url"));
        for (extra, key) in [
            ("kv_events = \"http://x\"\n", "workers[0].kv_events"),
            ("kv_events_replay = \"tcp://127.0.0.1:5558\"\n", "workers[0].kv_events_replay"),
            ("data_parallel_size = 0\n", "workers[0].data_parallel_size"),
            ("data_parallel_size = 65\n", "workers[0].data_parallel_size"),
            ("engine = \"tgi\"\n", "engine"),
        ] {
            let err = Settings::parse(&format!("{MIN}{extra}")).unwrap_err().to_string();
            assert!(err.contains(key), "error for {extra:?} should name {key}: {err}");
        }
    }

    #[test]
    fn worker_names_are_bounded_and_printable() {
        let with_name = |name: &str| {
            let quoted = toml::Value::String(name.to_owned()).to_string();
            format!("[[workers]]\nname = {quoted}\nurl = \"http://127.0.0.1:1\"\n")
        };
        for bad in ["", "   ", "a\u{7}b", " padded", "x\ny"] {
            let err = Settings::parse(&with_name(bad)).unwrap_err().to_string();
            assert!(err.contains("workers[0].name"), "{bad:?}: {err}");
        }
        let long = "w".repeat(MAX_WORKER_NAME_BYTES + 1);
        assert!(Settings::parse(&with_name(&long)).unwrap_err().to_string().contains("at most 128 bytes"));
        for good in ["w", "gpu-07.rack_3:8000", "wörker 1", &"w".repeat(MAX_WORKER_NAME_BYTES)] {
            Settings::parse(&with_name(good)).unwrap_or_else(|e| panic!("{good:?}: {e}"));
        }
    }

    #[test]
    fn workers_may_publish_kv_events() {
        let text = format!(
            "{MIN}engine = \"sglang\"\nkv_events = \"tcp://127.0.0.1:5557\"\nkv_events_replay = \"tcp://127.0.0.1:5600\"\ndata_parallel_size = 2\n[[workers]]\nname = \"b\"\nurl = \"http://127.0.0.1:2\"\nkv_events = \"discover\"\n"
        );
        let c = Settings::parse(&text).unwrap();
        assert_eq!(c.pools[0].workers[0].spec.engine, Engine::Sglang);
        let want = EventSource::Endpoints {
            endpoint: "tcp://127.0.0.1:5557".into(),
            replay: Some("tcp://127.0.0.1:5600".into()),
            topic: String::new(),
            data_parallel_size: 2,
        };
        assert_eq!(c.pools[0].workers[0].events, Some(want));
        assert_eq!(c.pools[0].workers[1].events, Some(EventSource::Discover));
        assert_eq!(c.pools[0].workers[1].spec.engine, Engine::Vllm);
    }

    #[test]
    fn health_interval_zero_disables_checks() {
        let c = Settings::parse(&format!("[server]\nhealth_interval_ms = 0\n{MIN}")).unwrap();
        assert_eq!(c.server.health_interval, None);
    }

    #[test]
    fn bundled_example_config_is_valid() {
        let text = include_str!("../config/mmrouter.toml");
        Settings::parse(text).unwrap();
    }

    #[test]
    fn the_documented_example_config_is_valid() {
        let c = Settings::parse(include_str!("../config/mmrouter.toml")).expect("config/mmrouter.toml parses");
        assert_eq!(c.pools.len(), 1);
        assert!(c.pools[0].models.is_empty(), "without [[pools]] the one pool serves any model");
    }
}
