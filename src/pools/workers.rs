//! Changing one worker while the router runs (the admin API's operations): add, drain, remove. Each
//! takes the change lock, so it is checked against what is in force and applied whole.

use std::sync::Arc;
use std::time::Duration;

use mmrouter_core::routing::WorkerSpec;

use super::list::Pools;
use super::pool::Pool;
use crate::config::{check_roles, Member, RolesError, WorkerSettings};

/// How often a removal checks whether the drained worker's requests have ended.
const REMOVAL_POLL: Duration = Duration::from_millis(50);

/// Why a worker change was refused.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
}

impl From<RolesError> for ChangeError {
    fn from(e: RolesError) -> ChangeError {
        ChangeError::Conflict(e.to_string())
    }
}

/// Whether `pool` still serves every leg once the workers `retire` leave rotation and `add` join it:
/// the file's role rules over the workers in rotation (so removing, or draining, the last decode
/// worker of a disaggregated pool is refused, as is a lone prefill worker added to an aggregated one).
pub(super) fn check_pool_roles(pool: &Pool, retire: &[usize], add: &[WorkerSpec]) -> Result<(), RolesError> {
    let live = pool.router.live_workers();
    let staying = live.iter().filter(|(id, w)| w.in_rotation() && !retire.contains(id));
    let members = staying.map(|(_, w)| Member { name: w.name(), engine: w.engine(), role: w.role() });
    check_roles(&pool.name, members.chain(add.iter().map(Member::from)))
}

impl Pools {
    /// Adds a worker to pool `pool`, in rotation at once, its feeds started; the pool it joined. With
    /// `force`, even if the pool's roles then break the rules (see [`check_pool_roles`]).
    pub fn add_worker(&self, pool: &str, settings: &WorkerSettings, force: bool) -> Result<Arc<Pool>, ChangeError> {
        let _changes = self.changes();
        let pools = self.list();
        let Some(p) = pools.iter().find(|p| p.name == pool) else {
            return Err(ChangeError::NotFound(format!("no pool named '{pool}'")));
        };
        let name = &settings.spec.name;
        if pools.iter().any(|p| p.router.lookup(name).is_some_and(|(_, w)| w.in_rotation())) {
            return Err(ChangeError::Conflict(format!("a worker named '{name}' exists")));
        }
        if !force {
            check_pool_roles(p, &[], std::slice::from_ref(&settings.spec))?;
        }
        let id = match p.router.change(&[], vec![settings.spec.clone()]) {
            Ok(change) => change.commit()[0],
            Err(e) => return Err(ChangeError::Conflict(e.to_string())),
        };
        p.start_feed(&self.env, id, settings);
        tracing::info!(pool = %pool, worker = %name, url = %settings.spec.url, "admin: worker added");
        Ok(p.clone())
    }

    /// Takes worker `name` out of rotation; its requests in flight finish. Refused when the pool's
    /// roles would no longer serve, unless `force`.
    pub fn drain_worker(&self, name: &str, force: bool) -> Result<(), ChangeError> {
        let _changes = self.changes();
        let (pool, w) = self.locate(name)?;
        if !force {
            check_pool_roles(&pool, &[w], &[])?;
        }
        pool.router.drain(w);
        tracing::info!(worker = %name, "admin: worker draining");
        Ok(())
    }

    /// Drains worker `name` now and removes it once its in-flight requests have ended (see
    /// [`Pools::retire`]), so no request is cut. Refused when the pool's roles would no longer serve,
    /// unless `force`.
    pub fn remove_worker(self: &Arc<Self>, name: &str, force: bool) -> Result<(), ChangeError> {
        let _changes = self.changes();
        // The lock keeps `w` naming this worker; holding the worker too would only make its removal
        // wait a poll for the holder to let go.
        let (pool, w) = self.locate(name)?;
        if !force {
            check_pool_roles(&pool, &[w], &[])?;
        }
        self.retire(&pool, w);
        Ok(())
    }

    /// The pool and id of the worker named `name` (under the change lock, the id cannot name another
    /// worker meanwhile).
    fn locate(&self, name: &str) -> Result<(Arc<Pool>, usize), ChangeError> {
        let found = self.list().iter().find_map(|p| p.router.lookup(name).map(|(id, _)| (p.clone(), id)));
        found.ok_or_else(|| ChangeError::NotFound(format!("no worker named '{name}'")))
    }

    /// Drains worker `w` of `pool` now; once its in-flight requests have ended it is removed (out of the
    /// pool, its feeds stopped, its index entries and metric series dropped), and once nothing refers to
    /// it any more (its feed tasks have drained, no decision names it) what was still written for it is
    /// dropped, which frees its slot for a new worker.
    pub(super) fn retire(self: &Arc<Self>, pool: &Arc<Pool>, w: usize) {
        pool.router.drain(w);
        let (pools, weak, worker) = (Arc::downgrade(self), Arc::downgrade(pool), pool.router.worker(w));
        tokio::spawn(async move {
            while worker.inflight().requests > 0 {
                tokio::time::sleep(REMOVAL_POLL).await;
            }
            let Some(pool) = weak.upgrade() else { return };
            pool.router.remove(w);
            pool.stop_feed(w);
            drop(pool);
            if let Some(pools) = pools.upgrade() {
                pools.forget_removed_series(&worker);
            }
            tracing::info!(worker = %worker.name(), "worker removed");
            // Holders are mostly transient (a listing, a concurrent change's copy of the worker list):
            // look again soon, then at the poll interval.
            let mut wait = Duration::from_millis(1);
            loop {
                let Some(pool) = weak.upgrade() else { return };
                if pool.router.forget_removed(w, &worker) {
                    return;
                }
                drop(pool);
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(REMOVAL_POLL);
            }
        });
    }
}
