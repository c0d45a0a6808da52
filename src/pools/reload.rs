//! Reloading the config file while serving: on SIGHUP, `POST /admin/reload`, or a change seen by
//! the file watch (`server.watch_config_ms`). The new file is validated whole first; an invalid one is
//! refused with its message and the running config stays.
//!
//! What a reload applies: pools added or removed; a pool whose model, served names or routing changed
//! is rebuilt (a new model version: fresh pipeline and index); in a kept pool, workers added, removed
//! (drained first, removed once idle) or replaced when their URL, engine, role, `bootstrap_port` or event
//! settings changed (a worker's role is fixed for its life: a new role is a new worker, its legs and
//! index entries start afresh).
//! Requests in flight finish on the pool they picked; routing state of unchanged pools and workers is
//! untouched. `[server]`, `[auth]`, `[retries]`, `[kv_events]`, `[cluster]`, `[responses]` and `[tracing]` are built once at start: a reload that changes them
//! is refused, naming what needs a restart.
//!
//! **A reload is a transaction.** Everything is built and checked before anything changes: new pools
//! (pipelines, routers), every worker change of every kept pool (names against the workers staying in
//! rotation in every pool — admin-added ones included —, the worker cap, a free slot per addition, the
//! role rules over the workers a kept pool ends with, admin-added ones included),
//! with each kept pool's worker list locked from its check to its commit ([`Router::change`]). Any
//! failure answers with its message and leaves the running configuration exactly as it was, so
//! writing the previous file back is a no-op. Added workers' KV-event feeds start with them; removed
//! workers' feeds stop at their removal.
//!
//! [`Router::change`]: mmrouter_core::routing::Router::change

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use mmrouter_core::pipeline::Pipeline;

use super::list::Pools;
use super::pool::Pool;
use super::workers::check_pool_roles;
use crate::config::{PoolSettings, Settings, WorkerSettings};

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
pub fn reload_file(pools: &Arc<Pools>, path: &Path) -> Result<Applied, String> {
    let new = Settings::load(path).map_err(|e| format!("{e:#}"))?;
    apply(pools, new)
}

/// Applies `new` over the running config (see the module docs for what may change), all or nothing.
pub fn apply(pools: &Arc<Pools>, mut new: Settings) -> Result<Applied, String> {
    let mut running = pools.changes();
    // The listener was bound once, possibly from `--listen` rather than the file.
    new.server.listen = running.server.listen;
    needs_restart(&running, &new)?;
    let live = pools.list();
    let mut applied = Applied::default();
    let (next, fresh) = build_pools(&running, &new, &live, &mut applied)?;
    let mut plans = Vec::new();
    for (settings, pool) in running.pools.iter().zip(live.iter()) {
        match new.pools.iter().find(|n| n.name == settings.name) {
            Some(n) if same_pool(settings, n) => plans.push(plan_workers(pool, settings, n, &mut applied)),
            Some(_) => {}
            None => applied.pools_removed.push(settings.name.clone()),
        }
    }
    check_names(&plans, &fresh, &next)?;
    for plan in &plans {
        let specs: Vec<_> = plan.add.iter().map(|w| w.spec.clone()).collect();
        // The file's pool passed these rules; workers added through the admin API stay beside it.
        check_pool_roles(plan.pool, &plan.retire, &specs).map_err(|e| e.to_string())?;
    }
    // Every kept pool's change is checked with its worker list locked; the first refusal drops them
    // all, unapplied.
    let mut changes = Vec::with_capacity(plans.len());
    for plan in &plans {
        let specs = plan.add.iter().map(|w| w.spec.clone()).collect();
        let change = plan.pool.router.change(&plan.retire, specs).map_err(|e| format!("pool '{}': {e}", plan.name))?;
        changes.push(change);
    }
    // Nothing below can fail.
    let added: Vec<Vec<usize>> = changes.into_iter().map(|c| c.commit()).collect();
    for (plan, ids) in plans.iter().zip(added) {
        for (&id, w) in ids.iter().zip(&plan.add) {
            plan.pool.start_feed(&pools.env, id, w);
        }
        for &id in &plan.retire {
            pools.retire(plan.pool, id);
        }
    }
    // Requests in flight keep the pool they picked; new ones see the new list.
    pools.set(next);
    for (pool, settings) in fresh {
        pool.start_feeds(&pools.env, settings, false);
    }
    *running = new;
    tracing::info!(?applied, "config reloaded");
    Ok(applied)
}

/// The pool list `new` asks for: kept pools as they are, new or changed ones built (everything that
/// can fail, like loading a model's files, happens here, before anything changes).
#[allow(clippy::type_complexity)]
fn build_pools<'a>(
    running: &Settings,
    new: &'a Settings,
    live: &[Arc<Pool>],
    applied: &mut Applied,
) -> Result<(Vec<Arc<Pool>>, Vec<(Arc<Pool>, &'a PoolSettings)>), String> {
    let old = |name: &str| running.pools.iter().zip(live.iter()).find(|(s, _)| s.name == name);
    let (mut next, mut fresh) = (Vec::new(), Vec::new());
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
    Ok((next, fresh))
}

/// One kept pool's worker changes, found but not applied.
struct WorkerPlan<'a> {
    pool: &'a Arc<Pool>,
    name: String,
    /// Ids of the workers to drain and remove (their list is locked from the check to the commit).
    retire: Vec<usize>,
    add: Vec<WorkerSettings>,
}

/// A kept pool's worker changes: added, removed (drained first), replaced (both).
fn plan_workers<'a>(
    pool: &'a Arc<Pool>,
    old: &PoolSettings,
    new: &PoolSettings,
    applied: &mut Applied,
) -> WorkerPlan<'a> {
    let mut plan = WorkerPlan { pool, name: new.name.clone(), retire: Vec::new(), add: Vec::new() };
    for w in &old.workers {
        let kept = new.workers.iter().find(|n| n.spec.name == w.spec.name);
        if kept.is_some_and(|n| n == w) {
            continue;
        }
        if let Some(id) = pool.router.find(&w.spec.name) {
            plan.retire.push(id);
        }
        match kept {
            Some(_) => applied.replaced.push(w.spec.name.clone()),
            None => applied.removed.push(w.spec.name.clone()),
        }
    }
    for w in &new.workers {
        let old_w = old.workers.iter().find(|o| o.spec.name == w.spec.name);
        if old_w.is_some_and(|o| o == w) {
            continue;
        }
        plan.add.push(w.clone());
        if old_w.is_none() {
            applied.added.push(w.spec.name.clone());
        }
    }
    plan
}

/// Names must stay unique across pools: a worker added to a kept pool, or listed by a new or
/// rebuilt pool, must not be in rotation in another pool that stays (a worker added through the admin
/// API is in no file), unless this reload retires it. Within one kept pool [`Router::change`] checks.
///
/// [`Router::change`]: mmrouter_core::routing::Router::change
fn check_names(
    plans: &[WorkerPlan<'_>],
    fresh: &[(Arc<Pool>, &PoolSettings)],
    next: &[Arc<Pool>],
) -> Result<(), String> {
    let kept: Vec<&Arc<Pool>> = next.iter().filter(|p| !fresh.iter().any(|(f, _)| Arc::ptr_eq(f, p))).collect();
    let retired =
        |pool: &Arc<Pool>, id: usize| plans.iter().any(|p| Arc::ptr_eq(p.pool, pool) && p.retire.contains(&id));
    let added = plans.iter().map(|p| (Some(p.pool), &p.add));
    let listed = fresh.iter().map(|(_, s)| (None, &s.workers));
    for (home, workers) in added.chain(listed) {
        for w in workers {
            let name = &w.spec.name;
            let elsewhere = kept
                .iter()
                .filter(|p| home.is_none_or(|h| !Arc::ptr_eq(h, p)))
                .find(|p| p.router.lookup(name).is_some_and(|(id, wk)| wk.in_rotation() && !retired(p, id)));
            if let Some(p) = elsewhere {
                return Err(format!("worker name '{name}' is in use in pool '{}'", p.name));
            }
        }
    }
    Ok(())
}

/// Same model, served names and routing: the pool (and its index) is kept, only its workers change.
fn same_pool(a: &PoolSettings, b: &PoolSettings) -> bool {
    (&a.models, &a.pipeline, &a.routing) == (&b.models, &b.pipeline, &b.routing)
}

/// The differences a reload cannot apply, if any: the listener, the client side, keys and retries are
/// built once at start.
fn needs_restart(old: &Settings, new: &Settings) -> Result<(), String> {
    for (what, changed) in [
        ("[server]", old.server != new.server),
        ("[auth]", old.auth != new.auth),
        ("[retries]", old.retries != new.retries),
        ("[kv_events]", old.kv_events != new.kv_events),
        ("[cluster]", old.cluster != new.cluster),
        ("[responses]", old.responses != new.responses),
        ("[tracing]", old.tracing != new.tracing),
        ("[discovery]", !old.discovery.same_resolver(&new.discovery)),
    ] {
        if changed {
            return Err(format!("{what} changed: restart to apply (a reload applies pools and workers)"));
        }
    }
    Ok(())
}

/// Checks `path` every `every` and reloads it when its modification time changes.
pub fn spawn_watch(pools: &Arc<Pools>, path: PathBuf, every: Duration) {
    let weak = Arc::downgrade(pools);
    tokio::spawn(async move {
        let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        let mut seen: Option<SystemTime> = modified(&path);
        loop {
            tokio::time::sleep(every).await;
            let Some(pools) = weak.upgrade() else { return };
            let now = modified(&path);
            if now == seen {
                continue;
            }
            seen = now;
            if let Err(e) = reload_file(&pools, &path) {
                tracing::error!("config watch: {} not applied: {e}", path.display());
            }
        }
    });
}
