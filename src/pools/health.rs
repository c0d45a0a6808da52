//! Active health checks: every worker's `/health` polled on an interval. A worker that fails is
//! marked down through the router (which forgets its cached blocks); one that answers again is put
//! back, and a passing check also ends a half-open period. The checks feed the same state machine as
//! request outcomes (`mmrouter_core::routing::outlier`); an ejected worker serves its back-off first.
//! A passing vLLM worker's multimodal-cache counters are read next (`engine_metrics`), and its
//! `/v1/models` (`served`: the LoRA adapters it serves).
//!
//! Each worker's check is a task of its own, bounded by its own timeout, and marks its worker the
//! moment its answer (or its timeout) is in: a worker that hangs costs its own check and delays no
//! other worker's. A worker whose previous check is still out is not checked again until it ends.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mmrouter_core::routing::{Engine, Worker};

use super::list::Pools;
use super::pool::Pool;
use crate::observe::Observer;

/// Polls every worker's `/health` each `interval` (`None`: no active checks).
pub fn spawn_checks(pools: &Arc<Pools>, interval: Option<Duration>) {
    let Some(every) = interval else { return };
    let client = match mmrouter_core::http_client_builder().timeout(every.max(Duration::from_millis(500))).build() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("health checks disabled: {e}");
            return;
        }
    };
    let observe = pools.env.observe.clone();
    // Holding only a weak reference lets an embedded proxy (tests, demo) be dropped cleanly.
    let weak = Arc::downgrade(pools);
    tokio::spawn(async move {
        let out = InFlight::default();
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(pools) = weak.upgrade() else { return };
            for pool in pools.list().iter() {
                // Removed workers are no longer checked (their slots may be reused).
                for (id, w) in pool.router.live_workers() {
                    let Some(claim) = out.claim(&w) else { continue };
                    let check = Check { client: client.clone(), pool: pool.clone(), id, worker: w };
                    tokio::spawn(check.run(observe.clone(), claim));
                }
            }
        }
    });
}

/// One worker's check in one round.
struct Check {
    client: reqwest::Client,
    pool: Arc<Pool>,
    id: usize,
    /// Held for the check: the id names this worker until it ends.
    worker: Arc<Worker>,
}

impl Check {
    async fn run(self, observe: Arc<Observer>, _claim: Claim) {
        let url = format!("{}/health", self.worker.url().trim_end_matches('/'));
        let ok = matches!(self.client.get(url).send().await, Ok(r) if r.status().is_success());
        if self.worker.is_removed() {
            return;
        }
        let router = &self.pool.router;
        let changed = if ok { router.mark_up(self.id) } else { router.mark_down(self.id) };
        if changed {
            tracing::warn!(worker = %self.worker.name(), healthy = ok, "worker health changed");
        }
        if ok && self.worker.engine() == Engine::Vllm && self.worker.is_healthy() {
            super::engine_metrics::scrape(&self.client, &self.worker, &observe).await;
            super::served::refresh(&self.client, &self.worker, &self.pool.pipeline).await;
        }
    }
}

/// The workers whose check is out, by the address of their `Worker` (held by the check, so not reused
/// while it is out).
#[derive(Clone, Default)]
struct InFlight(Arc<Mutex<HashSet<usize>>>);

/// A worker's check is out until this is dropped.
struct Claim {
    set: InFlight,
    key: usize,
}

impl InFlight {
    /// The right to check `w` now, unless its last check is still out.
    fn claim(&self, w: &Arc<Worker>) -> Option<Claim> {
        let key = Arc::as_ptr(w) as usize;
        let fresh = self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(key);
        fresh.then(|| Claim { set: self.clone(), key })
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.set.0.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_is_claimed_once_until_its_check_ends() {
        let out = InFlight::default();
        let spec = mmrouter_core::routing::WorkerSpec::new("w", "http://127.0.0.1:1");
        let (a, b) = (Arc::new(Worker::new(spec.clone())), Arc::new(Worker::new(spec)));
        let first = out.claim(&a).expect("nothing out yet");
        assert!(out.claim(&a).is_none(), "its check is out");
        assert!(out.claim(&b).is_some(), "another worker's is its own");
        drop(first);
        assert!(out.claim(&a).is_some(), "the check ended");
    }
}
