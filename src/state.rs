//! The state every request shares: the pool (workers, index, policy), the pipeline, the upstream
//! client and the observer. Built once from [`Settings`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use mmrouter_core::pipeline::Pipeline;
use mmrouter_core::routing::Router;

use crate::config::{KvEventsSection, PoolSettings, Settings, WorkerSettings};
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
    /// The config in force (a reload diffs the new file against it). Also the lock every change of
    /// pools and workers takes (reload, admin add/drain/remove), so each is validated against what is
    /// in force and applied whole, one at a time.
    pub running: std::sync::Mutex<Settings>,
    /// `[kv_events]`, fixed for the process (a reload refuses changes): readable while a change holds
    /// `running`, as starting a worker's feeds does.
    pub kv_events: KvEventsSection,
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
    /// Each event-publishing worker's feeds, by worker id: started when the worker is (the pool's
    /// first workers when the server starts, later ones when added), stopped when it is removed.
    feeds: Mutex<BTreeMap<usize, Arc<WorkerFeeds>>>,
    /// The first workers' feeds were started ([`AppState::start_feeds`] runs once).
    feeds_started: AtomicBool,
}

impl Pool {
    pub(crate) fn new(cfg: &PoolSettings, pipeline: Pipeline) -> anyhow::Result<Pool> {
        let router = Router::new(cfg.routing.clone(), cfg.worker_specs())
            .map_err(|e| anyhow::anyhow!("pool '{}': routing: {e}", cfg.name))?;
        let (feeds, feeds_started) = (Mutex::new(BTreeMap::new()), AtomicBool::new(false));
        Ok(Pool { name: cfg.name.clone(), models: cfg.models.clone(), router, pipeline, feeds, feeds_started })
    }

    /// The running feeds, by worker id.
    pub fn feeds(&self) -> Vec<Arc<WorkerFeeds>> {
        self.feeds.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
    }

    /// Starts worker `id`'s feeds if its settings publish events.
    pub(crate) fn start_feed(self: &Arc<Self>, st: &Arc<AppState>, id: usize, settings: &WorkerSettings) {
        if let Some(f) = crate::events::start(st, self, id, settings) {
            let old = self.feeds.lock().unwrap_or_else(|e| e.into_inner()).insert(id, f);
            if let Some(old) = old {
                old.stop();
            }
        }
    }

    /// Stops worker `id`'s feeds (it was removed).
    pub(crate) fn stop_feed(&self, id: usize) {
        let feeds = self.feeds.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        if let Some(f) = feeds {
            f.stop();
        }
    }
}

impl Drop for Pool {
    /// A pool a reload dropped stops its feeds (their tasks hold them, not the pool).
    fn drop(&mut self) {
        for f in self.feeds.get_mut().unwrap_or_else(|e| e.into_inner()).values() {
            f.stop();
        }
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
            kv_events: cfg.kv_events.clone(),
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

    /// [`start_feeds`](Self::start_feeds) for one pool (its workers' ids are their positions).
    pub(crate) fn start_pool_feeds(self: &Arc<Self>, pool: &Arc<Pool>, settings: &PoolSettings) {
        if pool.feeds_started.swap(true, Ordering::Relaxed) {
            return;
        }
        for (id, w) in settings.workers.iter().enumerate() {
            pool.start_feed(self, id, w);
        }
    }
}
