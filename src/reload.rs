//! Reloading the config file while serving: on SIGHUP, `POST /admin/reload`, or a change seen by
//! the file watch (`server.watch_config_ms`). The new file is validated whole first; an invalid one is
//! refused with its message and the running config stays.
//!
//! What a reload applies: pools added or removed; a pool whose model, served names or routing changed
//! is rebuilt (a new model version: fresh pipeline and index); in a kept pool, workers added, removed
//! (drained first, removed once idle) or replaced when their URL, engine or event settings changed.
//! Requests in flight finish on the pool they picked; routing state of unchanged pools and workers is
//! untouched. `[server]`, `[auth]`, `[retries]` and `[kv_events]` are built once at start: a reload that changes them
//! is refused, naming what needs a restart.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use mmrouter_core::pipeline::Pipeline;

use crate::config::{PoolSettings, Settings, WorkerSettings};
use crate::state::{AppState, Pool};

/// What a reload did (also the `POST /admin/reload` answer).
#[derive(Debug, Default, serde::Serialize, PartialEq, Eq)]
pub struct Applied {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub replaced: Vec<String>,
    pub pools_added: Vec<String>,
    pub pools_removed: Vec<String>,
    /// Pools whose model, served names or routing changed: rebuilt (a fresh index).
    pub pools_rebuilt: Vec<String>,
}

/// Reads `path` and applies it; `Err`: the message why nothing was applied.
pub fn reload_file(st: &Arc<AppState>, path: &Path) -> Result<Applied, String> {
    let new = Settings::load(path).map_err(|e| format!("{e:#}"))?;
    apply(st, new)
}

/// Applies `new` over the running config (see the module docs for what may change).
pub fn apply(st: &Arc<AppState>, mut new: Settings) -> Result<Applied, String> {
    let mut running = st.running.lock().unwrap_or_else(|e| e.into_inner());
    // The listener was bound once, possibly from `--listen` rather than the file.
    new.server.listen = running.server.listen;
    needs_restart(&running, &new)?;
    let live = st.pools();
    let old = |name: &str| running.pools.iter().zip(live.iter()).find(|(s, _)| s.name == name);
    // Everything that can fail (loading a model's files) happens before anything changes.
    let mut applied = Applied::default();
    let mut next = Vec::new();
    let mut fresh = Vec::new();
    for settings in &new.pools {
        match old(&settings.name) {
            Some((was, pool)) if same_pool(was, settings) => next.push(pool.clone()),
            previous => {
                let pipeline =
                    Pipeline::new(&settings.pipeline).map_err(|e| format!("pool '{}': {e}", settings.name))?;
                let pool = Arc::new(Pool::new(settings, pipeline).map_err(|e| format!("{e:#}"))?);
                let list = if previous.is_some() { &mut applied.pools_rebuilt } else { &mut applied.pools_added };
                list.push(settings.name.clone());
                fresh.push((pool.clone(), settings));
                next.push(pool);
            }
        }
    }
    for (settings, pool) in running.pools.iter().zip(live.iter()) {
        match new.pools.iter().find(|n| n.name == settings.name) {
            Some(n) if same_pool(settings, n) => apply_workers(pool, settings, n, &mut applied)?,
            Some(_) => {}
            None => applied.pools_removed.push(settings.name.clone()),
        }
    }
    // Requests in flight keep the pool they picked; new ones see the new list.
    st.set_pools(next);
    for (pool, settings) in fresh {
        st.start_pool_feeds(&pool, settings);
    }
    *running = new;
    tracing::info!(?applied, "config reloaded");
    Ok(applied)
}

/// Same model, served names and routing: the pool (and its index) is kept, only its workers change.
fn same_pool(a: &PoolSettings, b: &PoolSettings) -> bool {
    // Every field is plain data, so equal Debug text is equal settings.
    format!("{:?}", (&a.models, &a.pipeline, &a.routing)) == format!("{:?}", (&b.models, &b.pipeline, &b.routing))
}

/// The differences a reload cannot apply, if any: the listener, the client side, keys and retries are
/// built once at start.
fn needs_restart(old: &Settings, new: &Settings) -> Result<(), String> {
    let same = |a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| format!("{a:?}") == format!("{b:?}");
    for (what, changed) in [
        ("[server]", !same(&old.server, &new.server)),
        ("[auth]", !same(&old.auth, &new.auth)),
        ("[retries]", !same(&old.retries, &new.retries)),
        ("[kv_events]", !same(&old.kv_events, &new.kv_events)),
    ] {
        if changed {
            return Err(format!("{what} changed: restart to apply (a reload applies pools and workers)"));
        }
    }
    Ok(())
}

/// A kept pool's worker changes: added, removed (drained first), replaced.
fn apply_workers(
    pool: &Arc<Pool>,
    old: &PoolSettings,
    new: &PoolSettings,
    applied: &mut Applied,
) -> Result<(), String> {
    let same = |a: &WorkerSettings, b: &WorkerSettings| format!("{a:?}") == format!("{b:?}");
    for w in &old.workers {
        let kept = new.workers.iter().find(|n| n.spec.name == w.spec.name);
        if kept.is_some_and(|n| same(n, w)) {
            continue;
        }
        if let Some(id) = pool.router.find(&w.spec.name) {
            crate::admin::retire(pool, id);
        }
        match kept {
            Some(_) => applied.replaced.push(w.spec.name.clone()),
            None => applied.removed.push(w.spec.name.clone()),
        }
    }
    for w in &new.workers {
        let old_w = old.workers.iter().find(|o| o.spec.name == w.spec.name);
        if old_w.is_some_and(|o| same(o, w)) {
            continue;
        }
        pool.router.add_worker(w.spec.clone()).map_err(|e| format!("pool '{}': {e}", new.name))?;
        if w.events.is_some() {
            tracing::warn!(worker = %w.spec.name, "a worker added by a reload routes approximately (its KV events need a restart)");
        }
        if old_w.is_none() {
            applied.added.push(w.spec.name.clone());
        }
    }
    Ok(())
}

/// Checks `path` every `every` and reloads it when its modification time changes.
pub fn spawn_watch(st: &Arc<AppState>, path: PathBuf, every: Duration) {
    let weak = Arc::downgrade(st);
    tokio::spawn(async move {
        let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        let mut seen: Option<SystemTime> = modified(&path);
        loop {
            tokio::time::sleep(every).await;
            let Some(st) = weak.upgrade() else { return };
            let now = modified(&path);
            if now == seen {
                continue;
            }
            seen = now;
            if let Err(e) = reload_file(&st, &path) {
                tracing::error!("config watch: {} not applied: {e}", path.display());
            }
        }
    });
}
