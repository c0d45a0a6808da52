//! A scrape: the Prometheus text exposition of the proxy's recorder and every live worker's, merged into
//! one (one block per metric family), with the gauges read from what it is handed — each pool's router
//! (worker load and state, the index) and its feeds' counters as plain [`FeedSample`]s. The series of
//! workers no pool has any more are dropped first, so add/remove cycles leave `/metrics` as large as the
//! live workers make it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use metrics::Recorder;
use mmrouter_core::routing::events::EventCounts;
use mmrouter_core::routing::{Availability, Engine, Router, Worker};
use mmrouter_kv_events::FeedStats;

use super::names::*;
use super::recorder::Observer;

/// One pool as a scrape sees it.
pub struct PoolSample<'a> {
    pub name: &'a str,
    pub router: &'a Router,
    pub feeds: Vec<FeedSample>,
}

/// One worker's KV-event feeds at scrape time: its event state's counts, each rank's counters, and what
/// was refused from it by reason.
pub struct FeedSample {
    pub worker: Arc<Worker>,
    pub counts: EventCounts,
    pub stats: Vec<FeedStats>,
    pub refused: Vec<(String, u64)>,
}

impl Observer {
    /// The Prometheus text exposition.
    pub fn render(&self, pools: &[PoolSample<'_>]) -> String {
        let live: HashSet<String> =
            pools.iter().flat_map(|p| p.router.live_workers()).map(|(_, w)| w.name().to_owned()).collect();
        self.retain_workers(&live);
        self.index_blocks.set(pools.iter().map(|p| p.router.index_blocks()).sum::<usize>() as f64);
        let (mut events, mut pending, mut approximate) = (0, 0, 0);
        for p in pools {
            let by_source = p.router.index_entries();
            (events, pending, approximate) =
                (events + by_source.events, pending + by_source.pending, approximate + by_source.approximate);
            self.render_feeds(&p.feeds);
            self.render_workers(p.name, p.router);
        }
        for (source, n) in [("events", events), ("pending", pending), ("approximate", approximate)] {
            let g = self.index_by_source.get(source, |s| {
                self.recorder.register_gauge(&Self::key(INDEX_BLOCKS_BY_SOURCE, &[("source", s)]), &METADATA)
            });
            g.set(n as f64);
        }
        let mut parts = vec![self.handle.render()];
        parts.extend(self.all_series().iter().map(|w| w.handle.render()));
        merge_expositions(&parts)
    }

    /// The KV-event feeds' counters and connection state.
    fn render_feeds(&self, feeds: &[FeedSample]) {
        for f in feeds {
            if f.worker.is_removed() {
                continue; // its feeds are stopping
            }
            let series = self.series(f.worker.name());
            let c = &f.counts;
            for (kind, v) in [
                ("stored", c.stored_blocks),
                ("removed", c.removed_blocks),
                ("cleared", c.cleared),
                ("ignored", c.ignored_blocks),
                ("orphan", c.orphan_blocks),
                ("unmatchable", c.unmatchable_blocks),
                ("block_size_mismatch", c.block_size_mismatch),
                ("unknown", c.unknown),
            ] {
                series.mirror(KV_EVENTS_TOTAL, kind, v);
            }
            let sum = |get: fn(&FeedStats) -> u64| f.stats.iter().map(get).sum::<u64>();
            series.mirror(KV_EVENT_BATCHES_TOTAL, "", sum(|s| s.batches));
            series.mirror(KV_EVENT_MALFORMED_TOTAL, "", sum(|s| s.malformed));
            for (kind, v) in [
                ("gap", sum(|s| s.gaps)),
                ("replay", sum(|s| s.replays)),
                ("replay_failure", sum(|s| s.replay_failures)),
                ("resync", sum(|s| s.resyncs)),
                ("restart", sum(|s| s.restarts + s.reconnect_resets)),
            ] {
                series.mirror(KV_EVENT_SEQUENCE_TOTAL, kind, v);
            }
            for (reason, v) in &f.refused {
                series.counter_for(KV_EVENT_REFUSED_TOTAL, &[("reason", reason)]).absolute(*v);
            }
            let connected = !f.stats.is_empty() && f.stats.iter().all(|s| s.connected);
            series.gauge_for(KV_EVENT_CONNECTED, &[]).set(if connected { 1.0 } else { 0.0 });
            let index_share = f.worker.index_refused();
            if index_share > 0 {
                series.counter_for(KV_EVENT_REFUSED_TOTAL, &[("reason", "index_share")]).absolute(index_share);
            }
        }
    }

    fn render_workers(&self, pool: &str, router: &Router) {
        for (_, w) in router.live_workers() {
            let series = self.series(w.name());
            let engine = match w.engine() {
                Engine::Vllm => "vllm",
                Engine::Sglang => "sglang",
            };
            series.gauge_for(WORKER_INFO, &[("pool", pool), ("engine", engine), ("role", w.role().label())]).set(1.0);
            let load = w.inflight();
            series.gauge_for(WORKER_INFLIGHT_REQUESTS, &[]).set(load.requests as f64);
            let now = w.availability();
            for state in Availability::ALL {
                let g = series.gauge_for(WORKER_STATE, &[("state", state.label())]);
                g.set(if state == now { 1.0 } else { 0.0 });
            }
            series.gauge_for(WORKER_INFLIGHT_PREFILL_TOKENS, &[]).set(load.prefill_tokens as f64);
            // Only workers that carried exact-routed images show the image gauges.
            if w.has_carried_images() {
                series.gauge_for(WORKER_INFLIGHT_IMAGE_TOKENS, &[]).set(load.image_tokens as f64);
                series.gauge_for(WORKER_IMAGES_RESIDENT, &[]).set(w.images_resident() as f64);
            }
            // The engine's own processor-cache counters, where its /metrics carries them.
            if let Some(t) = w.engine_kv_transfer() {
                series.counter_for(WORKER_ENGINE_KV_TRANSFER_TOKENS, &[]).absolute(t.tokens);
                series.counter_for(WORKER_ENGINE_KV_TRANSFERS, &[]).absolute(t.transfers);
                series.gauge_for(WORKER_ENGINE_KV_TRANSFER_SECONDS, &[]).set(t.micros as f64 / 1e6);
            }
            if let Some(s) = w.served_models() {
                series.gauge_for(WORKER_ADAPTERS, &[("state", "served")]).set(s.adapters.len() as f64);
                series.gauge_for(WORKER_ADAPTERS, &[("state", "active")]).set(w.active_adapters().len() as f64);
            }
            if let Some(c) = w.engine_mm_cache() {
                series.counter_for(WORKER_ENGINE_MM_CACHE_QUERIES, &[]).absolute(c.queries);
                series.counter_for(WORKER_ENGINE_MM_CACHE_HITS, &[]).absolute(c.hits);
            }
        }
    }
}

/// Joins Prometheus text expositions into one: each metric family once (its `# HELP`/`# TYPE` lines
/// from the first part that has it), then every part's samples of it. The exporter writes a family as
/// one block (header lines, samples) ended by a blank line.
fn merge_expositions(parts: &[String]) -> String {
    if parts.len() == 1 {
        return parts[0].clone();
    }
    let mut order: Vec<String> = Vec::new();
    let mut families: HashMap<String, (String, String)> = HashMap::new();
    for block in parts.iter().flat_map(|p| p.split("\n\n")) {
        let (mut header, mut samples, mut family) = (String::new(), String::new(), None);
        for line in block.lines().filter(|l| !l.is_empty()) {
            let target = if line.starts_with('#') { &mut header } else { &mut samples };
            target.push_str(line);
            target.push('\n');
            if family.is_none() {
                family = line.strip_prefix("# ").and_then(|r| r.split_whitespace().nth(1)).map(str::to_owned);
            }
        }
        let Some(family) = family.or_else(|| samples.split(['{', ' ']).next().map(str::to_owned)) else { continue };
        if header.is_empty() && samples.is_empty() {
            continue;
        }
        match families.get_mut(&family) {
            Some((_, s)) => s.push_str(&samples),
            None => {
                order.push(family.clone());
                families.insert(family, (header, samples));
            }
        }
    }
    let mut out = String::with_capacity(parts.iter().map(String::len).sum());
    for family in order {
        let (header, samples) = &families[&family];
        out.push_str(header);
        out.push_str(samples);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::record::{Attempt, AttemptStatus, Ending, RequestRecord};
    use axum::http::StatusCode;
    use mmrouter_core::pipeline::RoutePlan;
    use mmrouter_core::routing::{Load, RoutingConfig, WorkerSpec};

    fn scrape(o: &Observer, r: &Router) -> String {
        o.render(&[PoolSample { name: "p", router: r, feeds: Vec::new() }])
    }

    /// One passthrough request answered 200 by `w`, which it ejected or not.
    fn attempted(o: &Observer, w: Arc<Worker>, ejected: bool) {
        let plan = RoutePlan::passthrough(16);
        let attempts = [Attempt {
            worker: w.clone(),
            status: AttemptStatus::Http(StatusCode::OK),
            head_after: None,
            retried: None,
        }];
        let ejected = if ejected { vec![w] } else { Vec::new() };
        o.record(&RequestRecord {
            pool: None,
            plan: Some(&plan),
            timings: None,
            probes: &[],
            select: None,
            dispatched_overlap: None,
            attempts: &attempts,
            retry_budget_exhausted: false,
            ejected: &ejected,
            legs: &[],
            pinned: None,
            response_learnt: false,
            drift: None,
            ending: Ending::Answered { status: 200 },
        });
    }

    fn router() -> Router {
        let spec = |n: &str| WorkerSpec::new(n, "http://127.0.0.1:1");
        Router::new(RoutingConfig::default(), vec![spec("w0"), spec("w1")]).unwrap()
    }

    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
    }

    #[test]
    fn two_observers_do_not_share_samples() {
        let (a, b) = (Observer::new(), Observer::new());
        let r = router();
        attempted(&a, r.worker(0), false);
        attempted(&a, r.worker(0), false);
        let series = "mmrouter_requests_total{route=\"passthrough\",status=\"200\"}";
        assert_eq!(sample(&scrape(&a, &r), series), Some(2.0));
        assert_eq!(sample(&scrape(&b, &r), series), None);
    }

    #[test]
    fn worker_gauges_follow_the_load_at_scrape_time() {
        let (o, r) = (Observer::new(), router());
        let mut text = r.begin(0, Load { prefill_tokens: 30, decode_tokens: 5, image_tokens: 0 });
        let page = scrape(&o, &r);
        assert_eq!(sample(&page, "mmrouter_worker_inflight_requests{worker=\"w0\"}"), Some(1.0));
        assert_eq!(sample(&page, "mmrouter_worker_inflight_prefill_tokens{worker=\"w0\"}"), Some(30.0));
        // A text-only (or fallback) request never touches the image gauge.
        assert!(!page.contains("mmrouter_worker_inflight_image_tokens{worker=\"w0\"}"));
        let img = r.begin(0, Load { prefill_tokens: 100, decode_tokens: 20, image_tokens: 64 });
        let page = scrape(&o, &r);
        assert_eq!(sample(&page, "mmrouter_worker_inflight_image_tokens{worker=\"w0\"}"), Some(64.0));
        text.first_byte();
        drop(img);
        drop(text);
        let page = scrape(&o, &r);
        assert_eq!(sample(&page, "mmrouter_worker_inflight_requests{worker=\"w0\"}"), Some(0.0));
        assert_eq!(sample(&page, "mmrouter_worker_inflight_image_tokens{worker=\"w0\"}"), Some(0.0));
        assert!(!page.contains("mmrouter_worker_inflight_image_tokens{worker=\"w1\"}"));
    }

    #[test]
    fn worker_info_names_each_workers_role() {
        use mmrouter_core::routing::Role;
        let spec = |n: &str, role| WorkerSpec::new(n, "http://127.0.0.1:1").with_role(role);
        let r = Router::new(RoutingConfig::default(), vec![spec("a", Role::Both), spec("e", Role::Encode)]).unwrap();
        let page = scrape(&Observer::new(), &r);
        for (worker, role) in [("a", "both"), ("e", "encode")] {
            let series =
                format!("mmrouter_worker_info{{worker=\"{worker}\",pool=\"p\",engine=\"vllm\",role=\"{role}\"}}");
            assert_eq!(sample(&page, &series), Some(1.0), "{page}");
        }
    }

    #[test]
    fn a_removed_workers_series_go_and_families_stay_single() {
        let (o, r) = (Observer::new(), router());
        attempted(&o, r.worker(0), false);
        attempted(&o, r.worker(1), true);
        let page = scrape(&o, &r);
        assert_eq!(sample(&page, "mmrouter_upstream_requests_total{worker=\"w1\",status=\"200\"}"), Some(1.0));
        for family in [UPSTREAM_REQUESTS_TOTAL, WORKER_STATE, WORKER_INFO] {
            let headers = page
                .lines()
                .filter(|l| {
                    *l == format!(
                        "# TYPE {family} {}",
                        if family == UPSTREAM_REQUESTS_TOTAL { "counter" } else { "gauge" }
                    )
                })
                .count();
            assert_eq!(headers, 1, "{family} once: {page}");
        }
        r.remove(1);
        let page = scrape(&o, &r);
        assert!(!page.contains("worker=\"w1\""), "{page}");
        assert_eq!(sample(&page, "mmrouter_upstream_requests_total{worker=\"w0\",status=\"200\"}"), Some(1.0));
    }
}
