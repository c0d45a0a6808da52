//! The state every request shares: the pool (workers, index, policy), the pipeline, the upstream
//! client and the observer. Built once from [`Settings`].

use std::sync::{Arc, OnceLock};

use mmrouter_core::pipeline::Pipeline;
use mmrouter_core::routing::Router;

use crate::config::Settings;
use crate::events::WorkerFeeds;
use crate::observe::Observer;
use crate::retry::{RetryBudget, RetryConfig};
use crate::upstream::Upstream;

/// Everything a request handler needs; shared by all requests.
pub struct AppState {
    /// The pool's workers (health, load), the block index and the selection policy.
    pub router: Router,
    pub pipeline: Pipeline,
    pub upstream: Upstream,
    pub observe: Observer,
    /// Attempts per request and the proxy-wide retry budget (see [`crate::retry`]).
    pub retries: RetryConfig,
    pub retry_budget: RetryBudget,
    pub max_body_bytes: usize,
    /// Permits to plan a large prompt on the blocking pool: one per core, so big prompts queue for
    /// CPU among themselves instead of starving the async workers (`/health`, small requests).
    pub planners: tokio::sync::Semaphore,
    /// The workers' KV-event feeds, once started.
    feeds: OnceLock<Vec<Arc<WorkerFeeds>>>,
}

impl AppState {
    pub fn new(cfg: &Settings) -> anyhow::Result<Arc<AppState>> {
        Self::with_pipeline(cfg, Pipeline::new(&cfg.pipeline)?)
    }

    /// State around an already-built pipeline (tests inject counters through it).
    pub fn with_pipeline(cfg: &Settings, pipeline: Pipeline) -> anyhow::Result<Arc<AppState>> {
        let router =
            Router::new(cfg.routing.clone(), cfg.worker_specs()).map_err(|e| anyhow::anyhow!("routing: {e}"))?;
        Ok(Arc::new(AppState {
            router,
            upstream: Upstream::new(&cfg.server)?,
            pipeline,
            observe: Observer::new(),
            retries: cfg.retries.clone(),
            retry_budget: RetryBudget::new(&cfg.retries),
            max_body_bytes: cfg.server.max_body_bytes,
            planners: tokio::sync::Semaphore::new(std::thread::available_parallelism().map_or(1, |n| n.get())),
            feeds: OnceLock::new(),
        }))
    }

    /// Subscribes to the KV events of the workers that publish them (once; later calls do nothing).
    pub fn start_feeds(self: &Arc<Self>, cfg: &Settings) {
        let _ = self.feeds.get_or_init(|| crate::events::start(self, &cfg.workers));
    }

    pub fn feeds(&self) -> &[Arc<WorkerFeeds>] {
        self.feeds.get().map_or(&[], Vec::as_slice)
    }
}
