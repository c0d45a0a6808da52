//! The state every request shares, composed once from [`Settings`]: the pools, the upstream clients,
//! the retry policy and budget, the planning permits, the observer, the drain flag and the Responses store. Composition
//! only: each part's behaviour lives in its room.

use std::sync::Arc;

use mmrouter_core::pipeline::Pipeline;

use crate::config::{RetryConfig, Settings, TracingConfig};
use crate::front::Draining;
use crate::observe::{Observer, TraceExport};
use crate::pools::{Pool, Pools, ResponseStore};
use crate::upstream::{RetryBudget, Upstream};

/// Everything a request handler needs; shared by all requests.
pub struct AppState {
    pub pools: Arc<Pools>,
    pub upstream: Upstream,
    pub observe: Arc<Observer>,
    /// Attempts per request and the proxy-wide retry budget (see `upstream::retry`).
    pub retries: RetryConfig,
    pub retry_budget: RetryBudget,
    /// Permits to plan a large prompt on the blocking pool: one per core, so big prompts queue for
    /// CPU among themselves instead of starving the async workers (`/health`, small requests).
    pub planners: tokio::sync::Semaphore,
    /// Set once shutdown starts (the connection layer sets it).
    pub draining: Draining,
    /// Which worker stored each Responses API answer (`[responses]`).
    pub responses: Arc<ResponseStore>,
    /// This replica's name in its cluster (`[cluster] replica_id`); `None`: a lone router.
    pub replica_id: Option<String>,
}

impl AppState {
    pub fn new(cfg: &Settings) -> anyhow::Result<Arc<AppState>> {
        Self::with_pipeline(cfg, Pipeline::new(&cfg.pools[0].pipeline)?)
    }

    /// State around an already-built pipeline for the first pool (tests inject counters through it).
    pub fn with_pipeline(cfg: &Settings, first: Pipeline) -> anyhow::Result<Arc<AppState>> {
        let observe = Arc::new(Observer::new());
        if let Some(export) = trace_export(&cfg.tracing)? {
            observe.start_tracing(export)?;
        }
        Ok(Arc::new(AppState {
            pools: Pools::new(cfg, first, observe.clone())?,
            upstream: Upstream::new(&cfg.server)?,
            observe,
            retries: cfg.retries.clone(),
            retry_budget: RetryBudget::new(&cfg.retries),
            planners: tokio::sync::Semaphore::new(std::thread::available_parallelism().map_or(1, |n| n.get())),
            draining: Draining::default(),
            responses: Arc::new(ResponseStore::new(&cfg.responses)),
            replica_id: cfg.cluster.as_ref().map(|c| c.replica_id.clone()),
        }))
    }

    /// The pools in force (a snapshot: a reload may swap them).
    pub fn pools(&self) -> Arc<Vec<Arc<Pool>>> {
        self.pools.list()
    }
}

/// The exporter's settings, when `[tracing]` names a collector (header values kept sensitive).
fn trace_export(cfg: &TracingConfig) -> anyhow::Result<Option<TraceExport>> {
    let Some(url) = cfg.traces_url() else { return Ok(None) };
    let mut headers = axum::http::HeaderMap::new();
    for (name, value) in &cfg.headers {
        let mut v = axum::http::HeaderValue::from_str(value)?;
        v.set_sensitive(true);
        headers.insert(axum::http::HeaderName::from_bytes(name.as_bytes())?, v);
    }
    let (service_name, sample_ratio, max_queue) = (cfg.service_name.clone(), cfg.sample_ratio, cfg.max_queue);
    Ok(Some(TraceExport { url, headers, service_name, sample_ratio, max_queue, timeout: cfg.timeout() }))
}
