//! Active health checks: every worker's `/health` polled on an interval. A worker that fails is
//! marked down through the router (which forgets its cached blocks); one that answers again is put
//! back, and a passing check also ends a half-open period. The checks feed the same state machine as
//! request outcomes (`mmrouter_core::routing::outlier`); an ejected worker serves its back-off first.
//! Each round also reads the engines' multimodal-cache counters (`engine_metrics`).

use std::sync::Arc;
use std::time::Duration;

use super::list::Pools;

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
    // Holding only a weak reference lets an embedded proxy (tests, demo) be dropped cleanly.
    let weak = Arc::downgrade(pools);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(pools) = weak.upgrade() else { return };
            for pool in pools.list().iter() {
                check_pool(&client, &pool.router).await;
                super::engine_metrics::scrape_pool(&client, &pool.router).await;
            }
        }
    });
}

/// One round of checks over a pool's workers, concurrently.
async fn check_pool(client: &reqwest::Client, router: &mmrouter_core::routing::Router) {
    // Removed workers are no longer checked (and not held: their slots may be reused).
    let live = router.live_workers();
    let checks = live.iter().map(|(_, w)| {
        let url = format!("{}/health", w.url().trim_end_matches('/'));
        let client = client.clone();
        async move { matches!(client.get(url).send().await, Ok(r) if r.status().is_success()) }
    });
    let results = futures_util::future::join_all(checks).await;
    for (&(i, _), ok) in live.iter().zip(results) {
        let changed = if ok { router.mark_up(i) } else { router.mark_down(i) };
        if changed {
            tracing::warn!(worker = %router.worker(i).name(), healthy = ok, "worker health changed");
        }
    }
}
