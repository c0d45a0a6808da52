//! One pool: a model, its served names, its own pipeline, and its router (workers, index, policy), with
//! each event-publishing worker's feeds.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use mmrouter_core::pipeline::Pipeline;
use mmrouter_core::routing::events::WorkerEvents;
use mmrouter_core::routing::Router;

use super::feeds::{self, tracked_blocks, FeedEnv, WorkerFeeds};
use super::lora_load::AdapterLoader;
use crate::config::{PoolSettings, WorkerSettings};

/// One model and its workers: its own pipeline, index and load state.
pub struct Pool {
    pub name: String,
    /// Request `model` values served here; empty: every model (a config without `[[pools]]`).
    pub models: Vec<String>,
    /// The pool's workers (health, load), the block index and the selection policy. Shared with the
    /// pool's feeds, which hold it weakly.
    pub router: Arc<Router>,
    pub pipeline: Pipeline,
    /// The LoRA adapters the router may load on the pool's workers (`lora_load`).
    pub loader: AdapterLoader,
    /// Each event-publishing worker's feeds, by worker id: started when the worker is (the pool's
    /// first workers when the server starts, later ones when added), stopped when it is removed.
    feeds: Mutex<BTreeMap<usize, Arc<WorkerFeeds>>>,
    /// The first workers' feeds were started ([`Pool::start_feeds`] runs once).
    feeds_started: AtomicBool,
}

impl Pool {
    pub fn new(cfg: &PoolSettings, pipeline: Pipeline) -> anyhow::Result<Pool> {
        let router = Router::new(cfg.routing.clone(), cfg.worker_specs())
            .map_err(|e| anyhow::anyhow!("pool '{}': routing: {e}", cfg.name))?;
        Ok(Pool {
            name: cfg.name.clone(),
            models: cfg.models.clone(),
            router: Arc::new(router),
            pipeline,
            loader: AdapterLoader::new(&cfg.load_lora_adapters),
            feeds: Mutex::new(BTreeMap::new()),
            feeds_started: AtomicBool::new(false),
        })
    }

    /// The running feeds, by worker id.
    pub fn feeds(&self) -> Vec<Arc<WorkerFeeds>> {
        self.feeds.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
    }

    /// Starts the feeds of the workers `settings` lists (their ids are their positions), once; with
    /// `hold`, holding their live batches until resumed (a bootstrapping replica).
    pub fn start_feeds(&self, env: &FeedEnv, settings: &PoolSettings, hold: bool) {
        if self.feeds_started.swap(true, Ordering::Relaxed) {
            return;
        }
        for (id, w) in settings.workers.iter().enumerate() {
            self.start_feed_with(env, id, w, hold);
        }
    }

    /// The running feeds of worker `id`.
    pub fn feeds_of(&self, id: usize) -> Option<Arc<WorkerFeeds>> {
        self.feeds.lock().unwrap_or_else(|e| e.into_inner()).get(&id).cloned()
    }

    /// The running feeds with their worker ids.
    pub fn feeds_by_worker(&self) -> Vec<(usize, Arc<WorkerFeeds>)> {
        self.feeds.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(&id, f)| (id, f.clone())).collect()
    }

    /// Starts worker `id`'s feeds if its settings publish events.
    pub fn start_feed(&self, env: &FeedEnv, id: usize, settings: &WorkerSettings) {
        self.start_feed_with(env, id, settings, false);
    }

    fn start_feed_with(&self, env: &FeedEnv, id: usize, settings: &WorkerSettings, hold: bool) {
        if settings.events.is_none() {
            return;
        }
        let p = &self.pipeline;
        let ingest =
            WorkerEvents::new(p.model_name(), p.block_size(), tracked_blocks(&self.router)).with_vocab(p.vocab_size());
        if let Some(f) = feeds::start(env, (&self.router, id), (ingest, hold), settings) {
            let old = self.feeds.lock().unwrap_or_else(|e| e.into_inner()).insert(id, f);
            if let Some(old) = old {
                old.stop();
            }
        }
    }

    /// Stops worker `id`'s feeds (it was removed).
    pub fn stop_feed(&self, id: usize) {
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
