//! Reloading the config file while serving: on SIGHUP, `POST /admin/reload`, or a change seen by
//! the file watch (`server.watch_config_ms`). The new file is validated whole first; an invalid one is
//! refused with its message and the running config stays.
//!
//! What a reload applies: the workers of each pool — added, removed (drained first, removed once
//! idle), or replaced when their URL, engine or event settings changed. Routing state of unchanged
//! workers is untouched. Anything else (pools, models, routing, server, auth, retries) is built once
//! at start: a reload that changes it is refused, naming what needs a restart.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::config::{PoolSettings, Settings, WorkerSettings};
use crate::state::AppState;

/// What a reload did (also the `POST /admin/reload` answer).
#[derive(Debug, Default, serde::Serialize, PartialEq, Eq)]
pub struct Applied {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub replaced: Vec<String>,
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
    let mut applied = Applied::default();
    for (p, (old, fresh)) in running.pools.iter().zip(&new.pools).enumerate() {
        apply_pool(st, p, old, fresh, &mut applied)?;
    }
    *running = new;
    tracing::info!(?applied, "config reloaded");
    Ok(applied)
}

/// The differences a reload cannot apply, if any.
fn needs_restart(old: &Settings, new: &Settings) -> Result<(), String> {
    let names = |s: &Settings| s.pools.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
    if names(old) != names(new) {
        return Err(format!("pools changed ({:?} → {:?}): restart to apply", names(old), names(new)));
    }
    // Every field is plain data, so equal Debug text is equal settings.
    let same = |a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| format!("{a:?}") == format!("{b:?}");
    for (a, b) in old.pools.iter().zip(&new.pools) {
        for (what, changed) in [
            ("models", !same(&a.models, &b.models)),
            ("model", !same(&a.pipeline, &b.pipeline)),
            ("routing", !same(&a.routing, &b.routing)),
        ] {
            if changed {
                return Err(format!("pool '{}': {what} changed: restart to apply (only workers reload)", a.name));
            }
        }
    }
    for (what, changed) in [
        ("[server]", !same(&old.server, &new.server)),
        ("[auth]", !same(&old.auth, &new.auth)),
        ("[retries]", !same(&old.retries, &new.retries)),
    ] {
        if changed {
            return Err(format!("{what} changed: restart to apply (only workers reload)"));
        }
    }
    Ok(())
}

fn apply_pool(
    st: &Arc<AppState>,
    p: usize,
    old: &PoolSettings,
    new: &PoolSettings,
    applied: &mut Applied,
) -> Result<(), String> {
    let router = &st.pools[p].router;
    let same = |a: &WorkerSettings, b: &WorkerSettings| format!("{a:?}") == format!("{b:?}");
    for w in &old.workers {
        let kept = new.workers.iter().find(|n| n.spec.name == w.spec.name);
        if kept.is_some_and(|n| same(n, w)) {
            continue;
        }
        if let Some(id) = router.find(&w.spec.name) {
            crate::admin::retire(st, p, id);
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
        router.add_worker(w.spec.clone()).map_err(|e| format!("pool '{}': {e}", new.name))?;
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
