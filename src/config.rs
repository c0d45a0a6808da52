//! The configuration, in two forms (ripgrep's low-level → high-level arguments are the model):
//!
//! * [`ConfigFile`]: the TOML file as written (`config/mmrouter.toml` is the documented example).
//!   Every section rejects unknown keys, so a typo never silently becomes a default.
//! * [`Settings`]: the same, validated once into typed values (addresses, durations, the model
//!   source, the family). Everything at run time is built from a `Settings`; `demo` and the tests
//!   build one directly instead of writing TOML.
//!
//! Every invalid value is reported with the key that holds it.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use mmrouter_core::accounting::Family;
use mmrouter_core::media::MediaConfig;
use mmrouter_core::model::{ModelSource, ModelSpec};
use mmrouter_core::pipeline::PipelineConfig;
use mmrouter_core::prompt::ContentFormat;
use mmrouter_core::routing::{Engine, RoutingConfig, WorkerSpec};
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
    #[serde(default)]
    pub media: MediaConfig,
    #[serde(default)]
    pub retries: RetryConfig,
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
    pub pipeline: PipelineConfig,
    pub workers: Vec<WorkerSettings>,
    pub routing: RoutingConfig,
    pub retries: RetryConfig,
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
        }
    }
}

impl Settings {
    /// Settings for `model` over `workers` (approximate mode) with every other value at its default.
    pub fn new(model: ModelSpec, workers: Vec<WorkerSpec>) -> Settings {
        Settings {
            server: ServerSettings::default(),
            pipeline: PipelineConfig { model, media: MediaConfig::default() },
            workers: workers.into_iter().map(|spec| WorkerSettings { spec, events: None }).collect(),
            routing: RoutingConfig::default(),
            retries: RetryConfig::default(),
        }
    }

    /// What routing knows of each worker.
    pub fn worker_specs(&self) -> Vec<WorkerSpec> {
        self.workers.iter().map(|w| w.spec.clone()).collect()
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
        let model = model_spec(&file.model)?;
        let workers = worker_specs(&file.workers)?;
        file.routing.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        file.media.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        file.retries.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(Settings {
            server,
            pipeline: PipelineConfig { model, media: file.media },
            workers,
            routing: file.routing,
            retries: file.retries,
        })
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
    })
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
    })
}

fn worker_specs(workers: &[WorkerSection]) -> anyhow::Result<Vec<WorkerSettings>> {
    if workers.is_empty() {
        anyhow::bail!("workers: at least one [[workers]] entry is required");
    }
    let mut seen = std::collections::HashSet::new();
    for (i, w) in workers.iter().enumerate() {
        if w.name.trim().is_empty() {
            anyhow::bail!("workers[{i}].name must not be empty");
        }
        if !seen.insert(w.name.as_str()) {
            anyhow::bail!("workers[{i}].name: duplicate worker name '{}'", w.name);
        }
        let u =
            url::Url::parse(&w.url).map_err(|e| anyhow::anyhow!("workers[{i}].url: '{}' is not a URL ({e})", w.url))?;
        if !matches!(u.scheme(), "http" | "https") || u.host_str().is_none() {
            anyhow::bail!("workers[{i}].url: '{}' must be an http(s) URL with a host", w.url);
        }
    }
    workers.iter().enumerate().map(|(i, w)| worker_settings(i, w)).collect()
}

fn worker_settings(i: usize, w: &WorkerSection) -> anyhow::Result<WorkerSettings> {
    let spec = WorkerSpec { name: w.name.clone(), url: w.url.clone(), engine: w.engine };
    if !(1..=64).contains(&w.data_parallel_size) {
        anyhow::bail!("workers[{i}].data_parallel_size must be in 1..=64 (got {})", w.data_parallel_size);
    }
    let check = |key: &str, ep: &str| {
        mmrouter_kv_events::endpoint::Endpoint::parse(ep)
            .map(|_| ())
            .map_err(|e| anyhow::anyhow!("workers[{i}].{key}: '{ep}' is not a ZMQ endpoint like tcp://host:5557 ({e})"))
    };
    let events = match w.kv_events.as_deref() {
        None => {
            if w.kv_events_replay.is_some() {
                anyhow::bail!("workers[{i}].kv_events_replay needs workers[{i}].kv_events");
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
        assert_eq!(c.pipeline.model.source, ModelSource::Bundled("qwen3-vl"));
        assert_eq!(c.pipeline.model.name, "qwen3-vl");
        assert_eq!(c.pipeline.model.block_size, 16);
        assert_eq!(c.workers.len(), 1);
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
            ("engine = \"tgi\"\n", "engine"),
        ] {
            let err = Settings::parse(&format!("{MIN}{extra}")).unwrap_err().to_string();
            assert!(err.contains(key), "error for {extra:?} should name {key}: {err}");
        }
    }

    #[test]
    fn workers_may_publish_kv_events() {
        let text = format!(
            "{MIN}engine = \"sglang\"\nkv_events = \"tcp://127.0.0.1:5557\"\nkv_events_replay = \"tcp://127.0.0.1:5600\"\ndata_parallel_size = 2\n[[workers]]\nname = \"b\"\nurl = \"http://127.0.0.1:2\"\nkv_events = \"discover\"\n"
        );
        let c = Settings::parse(&text).unwrap();
        assert_eq!(c.workers[0].spec.engine, Engine::Sglang);
        let want = EventSource::Endpoints {
            endpoint: "tcp://127.0.0.1:5557".into(),
            replay: Some("tcp://127.0.0.1:5600".into()),
            topic: String::new(),
            data_parallel_size: 2,
        };
        assert_eq!(c.workers[0].events, Some(want));
        assert_eq!(c.workers[1].events, Some(EventSource::Discover));
        assert_eq!(c.workers[1].spec.engine, Engine::Vllm);
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
}
