//! The pools in force: the list a request picks its pool from (swapped whole by a reload), the config
//! it came from, and the one lock every change of pools and workers takes.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};

use mmrouter_core::pipeline::Pipeline;
use mmrouter_core::routing::Worker;

use super::bootstrap::{Bootstrap, BootstrapState};
use super::feeds::FeedEnv;
use super::pool::Pool;
use crate::config::Settings;
use crate::observe::Observer;

/// The pools, and what changing them needs.
pub struct Pools {
    /// One per model served; a request's `model` picks one ([`Pools::pool_for`]). Swapped whole by
    /// a reload that changes pools; a request keeps the `Arc<Pool>` it picked until it ends.
    list: RwLock<Arc<Vec<Arc<Pool>>>>,
    /// The config in force (a reload diffs the new file against it). Also the lock every change of
    /// pools and workers takes (reload, admin add/drain/remove), so each is validated against what is
    /// in force and applied whole, one at a time.
    running: Mutex<Settings>,
    /// What the feeds are given (`[kv_events]` is fixed for the process: a reload refuses changes).
    pub(super) env: FeedEnv,
    pub(super) observe: Arc<Observer>,
    /// The file the config was read from, when there is one (`POST /admin/reload`).
    pub config_path: OnceLock<std::path::PathBuf>,
    /// Whether the index state is complete yet (a replica of a cluster bootstraps it).
    pub bootstrap: Bootstrap,
}

impl Pools {
    /// The pools of `cfg`, the first around an already-built pipeline (tests inject counters through it).
    pub fn new(cfg: &Settings, first: Pipeline, observe: Arc<Observer>) -> anyhow::Result<Arc<Pools>> {
        let mut pools = vec![Arc::new(Pool::new(&cfg.pools[0], first)?)];
        for p in &cfg.pools[1..] {
            pools.push(Arc::new(Pool::new(p, Pipeline::new(&p.pipeline)?)?));
        }
        Ok(Arc::new(Pools {
            list: RwLock::new(Arc::new(pools)),
            running: Mutex::new(cfg.clone()),
            env: FeedEnv { observe: observe.clone(), limits: cfg.kv_events.clone() },
            observe,
            config_path: OnceLock::new(),
            bootstrap: Bootstrap::default(),
        }))
    }

    /// The pools in force (a snapshot: a reload may swap them).
    pub fn list(&self) -> Arc<Vec<Arc<Pool>>> {
        self.list.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts `pools` in force (a reload).
    pub(super) fn set(&self, pools: Vec<Arc<Pool>>) {
        *self.list.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(pools);
    }

    /// The change lock, with the config in force.
    pub(super) fn changes(&self) -> MutexGuard<'_, Settings> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pool serving `model`: the one listing it, or the catch-all pool of a config without
    /// `[[pools]]`, or the one whose workers list it as a LoRA adapter or that may load it
    /// (`load_lora_adapters`); `None`: no pool serves it.
    pub fn pool_for(&self, model: Option<&str>) -> Option<Arc<Pool>> {
        let pools = self.list();
        if let [only] = pools.as_slice() {
            if only.models.is_empty() {
                return Some(only.clone());
            }
        }
        let model = model?;
        let listed = pools.iter().find(|p| p.models.iter().any(|m| m == model));
        let adapter = || pools.iter().find(|p| p.router.serves_adapter(model) || p.loader.loadable(model));
        listed.or_else(adapter).cloned()
    }

    /// Subscribes to the KV events of the workers that publish them (once per pool).
    pub fn start_feeds(&self) {
        let running = self.changes();
        let hold = self.bootstrap.state() == BootstrapState::Pending;
        for (pool, settings) in self.list().iter().zip(&running.pools) {
            pool.start_feeds(&self.env, settings, hold);
        }
    }

    /// Drops the metric series of workers no pool has any more, and those of removed worker `gone`'s
    /// name when the worker now under it (a reload's replacement) has another role or engine: its
    /// `mmrouter_worker_info` labels would otherwise stay beside the new ones, and a join on it fail.
    pub(super) fn forget_removed_series(&self, gone: &Worker) {
        let pools = self.list();
        let live = pools.iter().flat_map(|p| p.router.live_workers()).map(|(_, w)| w);
        let same = |w: &Worker| (w.role(), w.engine()) == (gone.role(), gone.engine());
        let kept: HashSet<String> =
            live.filter(|w| w.name() != gone.name() || same(w)).map(|w| w.name().to_owned()).collect();
        self.observe.retain_workers(&kept);
    }
}
