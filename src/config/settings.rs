//! The validated, typed configuration the server runs from: addresses, durations, the model source,
//! each pool's workers. Built from the file by [`super::build`]; `demo` and the tests build one directly.

use std::net::SocketAddr;
use std::time::Duration;

use mmrouter_core::pipeline::PipelineConfig;
use mmrouter_core::routing::{RoutingConfig, WorkerSpec};

use super::cluster::ClusterSettings;
use super::file::{LoadLoraAdapter, ServerSection};
use super::kv_events::KvEventsSection;
use super::responses::ResponsesConfig;
use super::retries::RetryConfig;
use super::tracing::TracingConfig;

/// Where a worker's KV events come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventSource {
    /// Configured endpoints, one publisher per data-parallel rank.
    Endpoints { endpoint: String, replay: Option<String>, topic: String, data_parallel_size: u32 },
    /// Asked from the worker itself at start.
    Discover,
}

/// One worker, validated: what routing knows of it, and its event source if it publishes events.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerSettings {
    pub spec: WorkerSpec,
    pub events: Option<EventSource>,
}

/// The validated, typed configuration the server runs from.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub server: ServerSettings,
    /// At least one; names, served models and worker names unique across pools.
    pub pools: Vec<PoolSettings>,
    pub auth: AuthSettings,
    pub retries: RetryConfig,
    pub kv_events: KvEventsSection,
    pub cluster: Option<ClusterSettings>,
    pub responses: ResponsesConfig,
    /// `[discovery]` and the pools' DNS worker entries.
    pub discovery: DiscoverySettings,
    pub tracing: TracingConfig,
}

/// One pool, validated: a model (with the media settings), its served names, its workers, its routing.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolSettings {
    pub name: String,
    /// Request `model` values routed here (LoRA adapters included); empty: every model (the one pool
    /// of a config without `[[pools]]`).
    pub models: Vec<String>,
    pub pipeline: PipelineConfig,
    pub workers: Vec<WorkerSettings>,
    pub routing: RoutingConfig,
    /// LoRA adapters the router may load on its workers at run time (`[model] load_lora_adapters`).
    pub load_lora_adapters: Vec<LoadLoraAdapter>,
}

impl PoolSettings {
    /// What routing knows of each worker.
    pub fn worker_specs(&self) -> Vec<WorkerSpec> {
        self.workers.iter().map(|w| w.spec.clone()).collect()
    }
}

/// `[server]`, typed.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerSettings {
    pub listen: SocketAddr,
    /// The endpoint picker's gRPC address (`None`: no picker).
    pub ext_proc_listen: Option<SocketAddr>,
    /// Fallback endpoints listed after the picker's pick.
    pub ext_proc_fallbacks: usize,
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
#[derive(Clone, Debug, PartialEq)]
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

/// `[auth]`, typed. Empty key lists: that check is off.
#[derive(Clone, Debug, Default, PartialEq)]
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
            ext_proc_listen: None,
            ext_proc_fallbacks: 0,
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

/// `[discovery]`, validated, with every pool's DNS entries.
#[derive(Clone, Debug, PartialEq)]
pub struct DiscoverySettings {
    pub interval: Duration,
    pub nameserver: Option<SocketAddr>,
    pub timeout: Duration,
    pub max_addresses: usize,
    /// The DNS worker entries of every pool, in file order.
    pub entries: Vec<DnsEntry>,
}

impl DiscoverySettings {
    /// What a reload cannot change (the resolver and its loop are built once): everything but the
    /// entries.
    pub fn same_resolver(&self, other: &DiscoverySettings) -> bool {
        (self.interval, self.nameserver, self.timeout, self.max_addresses)
            == (other.interval, other.nameserver, other.timeout, other.max_addresses)
    }
}

/// What a DNS entry looks up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DnsLookup {
    /// A records (AAAA when there are none) of `host`, each a worker on `port`.
    Addresses { host: String, port: u16 },
    /// SRV records of `name`: each target's addresses, on the record's port.
    Srv { name: String },
}

/// One DNS worker entry: where its workers come from and what each of them is.
#[derive(Clone, Debug, PartialEq)]
pub struct DnsEntry {
    /// The pool its workers join.
    pub pool: String,
    /// The entry's `name`: its workers are `{name}@{address}:{port}`.
    pub name: String,
    pub lookup: DnsLookup,
    /// `http` or `https`.
    pub scheme: String,
    /// Every key of the entry but the address (name and URL are replaced per worker).
    pub template: WorkerSettings,
}

impl DnsEntry {
    /// The worker at `addr`.
    pub fn worker(&self, addr: SocketAddr) -> WorkerSettings {
        let mut w = self.template.clone();
        w.spec.name = discovered_name(&self.name, addr);
        w.spec.url = format!("{}://{addr}", self.scheme);
        w
    }

    /// The entry's label: `{pool}/{name}` (metrics, logs).
    pub fn label(&self) -> String {
        format!("{}/{}", self.pool, self.name)
    }
}

/// A discovered worker's name: the entry's name, `@`, and its socket address (`[v6]:port`).
pub fn discovered_name(entry: &str, addr: SocketAddr) -> String {
    format!("{entry}@{addr}")
}
