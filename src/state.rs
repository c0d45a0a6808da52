//! The state every request shares: the pool (workers, index, policy), the pipeline, the upstream
//! client and the observer. Built once from [`Settings`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use mmrouter_core::pipeline::Pipeline;
use mmrouter_core::routing::Router;

use crate::config::{PoolSettings, Settings};
use crate::events::WorkerFeeds;
use crate::observe::Observer;
use crate::retry::{RetryBudget, RetryConfig};
use crate::upstream::Upstream;

/// Everything a request handler needs; shared by all requests.
pub struct AppState {
    /// One per model served; a request's `model` picks one ([`AppState::pool_for`]). Swapped whole by
    /// a reload that changes pools; a request keeps the `Arc<Pool>` it picked until it ends.
    pools: std::sync::RwLock<Arc<Vec<Arc<Pool>>>>,
    pub upstream: Upstream,
    pub observe: Observer,
    /// Attempts per request and the proxy-wide retry budget (see [`crate::retry`]).
    pub retries: RetryConfig,
    pub retry_budget: RetryBudget,
    pub max_body_bytes: usize,
    /// Permits to plan a large prompt on the blocking pool: one per core, so big prompts queue for
    /// CPU among themselves instead of starving the async workers (`/health`, small requests).
    pub planners: tokio::sync::Semaphore,
    /// The config in force (a reload diffs the new file against it).
    pub running: std::sync::Mutex<Settings>,
    /// The file it was read from, when there is one (`POST /admin/reload`).
    pub config_path: OnceLock<std::path::PathBuf>,
    /// Set once shutdown starts (see [`AppState::start_draining`]).
    draining: AtomicBool,
}

/// One model and its workers: its own pipeline, index and load state.
pub struct Pool {
    pub name: String,
    /// Request `model` values served here; empty: every model (a config without `[[pools]]`).
    pub models: Vec<String>,
    /// The pool's workers (health, load), the block index and the selection policy.
    pub router: Router,
    pub pipeline: Pipeline,
    /// The workers' KV-event feeds, once started.
    feeds: OnceLock<Vec<Arc<WorkerFeeds>>>,
}

impl Pool {
    pub(crate) fn new(cfg: &PoolSettings, pipeline: Pipeline) -> anyhow::Result<Pool> {
        let router = Router::new(cfg.routing.clone(), cfg.worker_specs())
            .map_err(|e| anyhow::anyhow!("pool '{}': routing: {e}", cfg.name))?;
        Ok(Pool { name: cfg.name.clone(), models: cfg.models.clone(), router, pipeline, feeds: OnceLock::new() })
    }

    pub fn feeds(&self) -> &[Arc<WorkerFeeds>] {
        self.feeds.get().map_or(&[], Vec::as_slice)
    }
}

impl AppState {
    /// Set once shutdown starts: `/health` answers 503 `draining`, responses ask to close the connection.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    pub fn new(cfg: &Settings) -> anyhow::Result<Arc<AppState>> {
        Self::with_pipeline(cfg, Pipeline::new(&cfg.pools[0].pipeline)?)
    }

    /// State around an already-built pipeline for the first pool (tests inject counters through it).
    pub fn with_pipeline(cfg: &Settings, first: Pipeline) -> anyhow::Result<Arc<AppState>> {
        let mut pools = vec![Arc::new(Pool::new(&cfg.pools[0], first)?)];
        for p in &cfg.pools[1..] {
            pools.push(Arc::new(Pool::new(p, Pipeline::new(&p.pipeline)?)?));
        }
        Ok(Arc::new(AppState {
            pools: std::sync::RwLock::new(Arc::new(pools)),
            upstream: Upstream::new(&cfg.server)?,
            observe: Observer::new(),
            retries: cfg.retries.clone(),
            retry_budget: RetryBudget::new(&cfg.retries),
            max_body_bytes: cfg.server.max_body_bytes,
            planners: tokio::sync::Semaphore::new(std::thread::available_parallelism().map_or(1, |n| n.get())),
            running: std::sync::Mutex::new(cfg.clone()),
            config_path: OnceLock::new(),
            draining: AtomicBool::new(false),
        }))
    }

    /// The pool serving `model`: the one listing it, or the catch-all pool of a config without
    /// `[[pools]]`; `None`: no pool serves it.
    pub fn pool_for(&self, model: Option<&str>) -> Option<Arc<Pool>> {
        let pools = self.pools();
        if let [only] = pools.as_slice() {
            if only.models.is_empty() {
                return Some(only.clone());
            }
        }
        let model = model?;
        pools.iter().find(|p| p.models.iter().any(|m| m == model)).cloned()
    }

    /// The pools in force (a snapshot: a reload may swap them).
    pub fn pools(&self) -> Arc<Vec<Arc<Pool>>> {
        self.pools.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts `pools` in force (a reload).
    pub(crate) fn set_pools(&self, pools: Vec<Arc<Pool>>) {
        *self.pools.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(pools);
    }

    /// Subscribes to the KV events of the workers that publish them (once; later calls do nothing).
    pub fn start_feeds(self: &Arc<Self>, cfg: &Settings) {
        for (pool, settings) in self.pools().iter().zip(&cfg.pools) {
            self.start_pool_feeds(pool, settings);
        }
    }

    /// [`start_feeds`](Self::start_feeds) for one pool.
    pub(crate) fn start_pool_feeds(self: &Arc<Self>, pool: &Arc<Pool>, settings: &PoolSettings) {
        let _ = pool.feeds.get_or_init(|| crate::events::start(self, pool, &settings.workers));
    }
}
