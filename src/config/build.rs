//! The file's sections validated into [`Settings`]: every invalid value is reported with the key
//! that holds it; one set of rules for `[[workers]]` entries and workers added at run time.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use mmrouter_core::accounting::Family;
use mmrouter_core::media::MediaConfig;
use mmrouter_core::model::{ModelSource, ModelSpec, TokenizerMode};
use mmrouter_core::pipeline::PipelineConfig;
use mmrouter_core::prompt::ContentFormat;
use mmrouter_core::routing::{Engine, Role, RoutingConfig, WorkerSpec};
use mmrouter_kv_events::discovery::MAX_DATA_PARALLEL;

use super::dns::dns_entry;
use super::file::{AuthSection, ConfigFile, ModelSection, PoolSection, ServerSection, WorkerSection};
use super::kv_events::KvEventsSection;
use super::responses::ResponsesConfig;
use super::retries::RetryConfig;
use super::roles::{check_roles, Member};
use super::settings::{
    AuthSettings, ConnSettings, DiscoverySettings, DnsEntry, EventSource, PoolSettings, ServerSettings, Settings,
    UpstreamAuth, WorkerSettings,
};
use super::tracing::TracingConfig;

impl Default for ConnSettings {
    fn default() -> Self {
        conn_settings(&ServerSection::default()).expect("defaults are valid")
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
            load_lora_adapters: Vec::new(),
        };
        Settings {
            server: ServerSettings::default(),
            pools: vec![pool],
            auth: AuthSettings::default(),
            retries: RetryConfig::default(),
            kv_events: KvEventsSection::default(),
            cluster: None,
            responses: ResponsesConfig::default(),
            discovery: DiscoverySettings::default(),
            tracing: TracingConfig::default(),
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
        file.responses.validate()?;
        let mut discovery = file.discovery.settings()?;
        file.tracing.validate()?;
        let pools = if file.pools.is_empty() {
            let model = model_spec(&file.model)?;
            let workers = worker_specs(&file.workers)?;
            let name = model.name.clone();
            discovery.entries = dns_entries(&name, "workers", &file.workers)?;
            pool_roles(&name, &workers, &discovery.entries).map_err(|e| anyhow::anyhow!("workers: {e}"))?;
            let pipeline = PipelineConfig { model, media: file.media };
            let load_lora_adapters = file.model.load_lora_adapters.clone();
            vec![PoolSettings {
                name,
                models: Vec::new(),
                pipeline,
                workers,
                routing: file.routing,
                load_lora_adapters,
            }]
        } else {
            if !file.workers.is_empty() {
                anyhow::bail!(
                    "pools: with [[pools]], workers belong to their pool ([[pools.workers]]), not [[workers]]"
                );
            }
            let pools = pool_settings(&file.pools, &file.media, &file.routing)?;
            for (i, p) in file.pools.iter().enumerate() {
                discovery.entries.extend(dns_entries(&p.name, &format!("pools[{i}].workers"), &p.workers)?);
            }
            pools
        };
        let cluster = file.cluster.as_ref().map(|c| c.settings()).transpose()?;
        let (retries, kv_events, responses, tracing) = (file.retries, file.kv_events, file.responses, file.tracing);
        Ok(Settings { server, pools, auth, retries, kv_events, cluster, responses, discovery, tracing })
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
    let ext_proc_listen = s.ext_proc_listen.as_deref().map(parse_ext_proc_listen).transpose()?;
    if s.ext_proc_fallbacks > MAX_EXT_PROC_FALLBACKS {
        anyhow::bail!("server.ext_proc_fallbacks must be at most {MAX_EXT_PROC_FALLBACKS}");
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
        ext_proc_listen,
        ext_proc_fallbacks: s.ext_proc_fallbacks,
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

/// Endpoints a picker lists at most (the pick and its fallbacks stay one short header).
const MAX_EXT_PROC_FALLBACKS: usize = 8;

fn parse_ext_proc_listen(a: &str) -> anyhow::Result<SocketAddr> {
    a.parse().map_err(|_| anyhow::anyhow!("server.ext_proc_listen: '{a}' is not an address like 127.0.0.1:9002"))
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
    let tokenizer_mode =
        TokenizerMode::parse(&m.tokenizer_mode).map_err(|e| anyhow::anyhow!("model.tokenizer_mode: {e}"))?;
    let chat_template = match &m.chat_template {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("model.chat_template: cannot read '{path}': {e}"))?,
        ),
        None => None,
    };
    let media_io_kwargs = match &m.media_io_kwargs {
        None => serde_json::Map::new(),
        Some(serde_json::Value::String(text)) => match serde_json::from_str(text) {
            Ok(serde_json::Value::Object(map)) => map,
            Ok(_) => {
                anyhow::bail!("model.media_io_kwargs: expected a JSON object, e.g. '{{\"video\": {{\"fps\": 4}}}}'")
            }
            Err(e) => anyhow::bail!("model.media_io_kwargs: invalid JSON: {e}"),
        },
        Some(serde_json::Value::Object(map)) => map.clone(),
        Some(_) => anyhow::bail!("model.media_io_kwargs: expected a JSON string or a table"),
    };
    Ok(ModelSpec {
        media_io_kwargs,
        trust_request_mm_kwargs: m.trust_request_mm_kwargs,
        chat_template,
        content_format,
        tokenizer_mode,
        name: m.name.clone().unwrap_or_else(|| m.dir.clone()),
        source,
        family,
        block_size: m.block_size,
        processor_kwargs: m.processor_kwargs.clone(),
        lora_adapters: lora_adapters(m)?,
        exact_accounting: m.exact_accounting,
        default_decode_tokens: m.default_decode_tokens,
        max_model_len: m.max_model_len,
        max_prompt_bytes: m.max_prompt_bytes,
        max_prompt_tokens: m.max_prompt_tokens,
    })
}

/// Most `[model] load_lora_adapters` entries.
const MAX_LOADABLE_ADAPTERS: usize = 1024;

/// The adapters `model` names: `lora_adapters`, then the `load_lora_adapters` (each name once, at most
/// 256 bytes and no base model's name; each path non-empty).
fn lora_adapters(m: &ModelSection) -> anyhow::Result<Vec<String>> {
    let load = &m.load_lora_adapters;
    if load.len() > MAX_LOADABLE_ADAPTERS {
        anyhow::bail!("model.load_lora_adapters: at most {MAX_LOADABLE_ADAPTERS} entries (got {})", load.len());
    }
    let mut names = m.lora_adapters.clone();
    for (i, a) in load.iter().enumerate() {
        if a.name.trim().is_empty() || a.name.len() > 256 || a.path.trim().is_empty() {
            anyhow::bail!("model.load_lora_adapters[{i}]: name (at most 256 bytes) and path must be non-empty");
        }
        if load[..i].iter().any(|o| o.name == a.name) || Some(&a.name) == m.name.as_ref() || a.name == m.dir {
            anyhow::bail!("model.load_lora_adapters[{i}]: '{}' is named twice or is the base model's name", a.name);
        }
        if !names.contains(&a.name) {
            names.push(a.name.clone());
        }
    }
    Ok(names)
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
        let entries = dns_entries(&p.name, &format!("pools[{i}].workers"), &p.workers)?;
        pool_roles(&p.name, &pool_workers, &entries).map_err(|e| anyhow::anyhow!("pools[{i}].workers: {e}"))?;
        if let Some(dup) = pool_workers.iter().find(|w| !workers.insert(w.spec.name.clone())) {
            anyhow::bail!("pools[{i}].workers: worker name '{}' is used in another pool too", dup.spec.name);
        }
        let routing = p.routing.clone().unwrap_or_else(|| routing.clone());
        routing.validate().map_err(|e| at(anyhow::anyhow!("routing: {e}")))?;
        let pipeline = PipelineConfig { model, media: media.clone() };
        let load_lora_adapters = p.model.load_lora_adapters.clone();
        let name = p.name.clone();
        out.push(PoolSettings { name, models: served, pipeline, workers: pool_workers, routing, load_lora_adapters });
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
        // DNS entries become workers at run time (`dns_entries`).
        if !w.is_dns() {
            out.push(worker_settings(&format!("workers[{i}]"), w)?);
        }
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
    if w.is_dns() || w.port.is_some() || w.scheme.is_some() {
        anyhow::bail!("{at}: dns, dns_srv, port and scheme belong to a config file's DNS entries (docs/dns.md)");
    }
    check_worker_name(&w.name).map_err(|e| anyhow::anyhow!("{at}.name {e}"))?;
    check_worker_url(&w.url).map_err(|e| anyhow::anyhow!("{at}.url: {e}"))?;
    check_bootstrap_port(at, w)?;
    if w.role == Role::Encode && w.engine != Engine::Vllm {
        anyhow::bail!("{at}.role = \"encode\" needs engine = \"vllm\": SGLang E/PD is not supported");
    }
    let spec = WorkerSpec {
        engine: w.engine,
        role: w.role,
        bootstrap_port: w.bootstrap_port,
        ..WorkerSpec::new(w.name.clone(), w.url.clone())
    };
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

/// `bootstrap_port`: what an SGLang prefill worker's legs name (both legs meet at its bootstrap
/// server), so it is required there and meaningless anywhere else.
fn check_bootstrap_port(at: &str, w: &WorkerSection) -> anyhow::Result<()> {
    let sglang_prefill = w.engine == Engine::Sglang && w.role == Role::Prefill;
    match (sglang_prefill, w.bootstrap_port) {
        (true, None) => anyhow::bail!(
            "{at}.bootstrap_port is required for an engine = \"sglang\" role = \"prefill\" worker (its \
             --disaggregation-bootstrap-port)"
        ),
        (true, Some(0)) => anyhow::bail!("{at}.bootstrap_port must be a port in 1..=65535 (got 0)"),
        (false, Some(_)) => anyhow::bail!(
            "{at}.bootstrap_port is only for engine = \"sglang\" role = \"prefill\" workers (this one is \
             engine = \"{}\" role = \"{}\")",
            super::roles::engine_label(w.engine),
            w.role.label()
        ),
        _ => Ok(()),
    }
}

/// The pool-level role rules over a pool's configured workers and its DNS entries' templates.
fn pool_roles(pool: &str, workers: &[WorkerSettings], entries: &[DnsEntry]) -> anyhow::Result<()> {
    let templates = entries.iter().filter(|e| e.pool == pool).map(|e| &e.template.spec);
    check_roles(pool, workers.iter().map(|w| &w.spec).chain(templates).map(Member::from)).map_err(anyhow::Error::from)
}

/// The DNS entries among a pool's `[[workers]]` (`at`: the list's key in errors).
fn dns_entries(pool: &str, at: &str, workers: &[WorkerSection]) -> anyhow::Result<Vec<DnsEntry>> {
    let dns = workers.iter().enumerate().filter(|(_, w)| w.is_dns());
    dns.map(|(i, w)| dns_entry(pool, &format!("{at}[{i}]"), w, worker_without_dns)).collect()
}

/// [`worker_settings`] for a DNS entry's template (its DNS keys already read).
fn worker_without_dns(at: &str, w: &WorkerSection) -> anyhow::Result<WorkerSettings> {
    worker_settings(at, &WorkerSection { port: None, scheme: None, ..w.clone() })
}
