//! Stage **observe**: every metric name mmrouter exports (a dashboard contract: see the design's
//! table), and the [`Observer`] that turns what the pipeline reports — plans, stage timings, probe
//! timings, upstream outcomes, worker load — into Prometheus samples.
//!
//! Each proxy owns its own recorder (no process-global one): embedded proxies in tests and the demo
//! never see each other's samples, and the core crates record nothing themselves. Labelled handles
//! are registered once and cached, so the hot path does not build metric keys per request. Worker
//! gauges and the index size are read from the router's state when `/metrics` is scraped.
//!
//! **A worker's series live and die with it.** Every series labelled `worker` is kept in that
//! worker's own recorder ([`WorkerSeries`]), not the proxy's: the exporter cannot forget one series,
//! but dropping a recorder forgets all of its. A scrape renders the proxy's recorder and each live
//! worker's, merged into one exposition (one block per metric family), and drops the recorders of
//! workers no pool has any more (also done at each removal: [`Observer::retain_workers`]), so
//! add/remove cycles leave `/metrics` as large as the live workers make it.

/// Counter `{route, status}`: every proxied request, counted when its response ends; `status` is the
/// HTTP status sent, or `stream_error` for a body cut after the status was sent.
pub const REQUESTS_TOTAL: &str = "mmrouter_requests_total";
/// Counter `{reason}`: a request refused before routing, by its error code (`prompt_too_long`,
/// `image_url_blocked`, `invalid_json`, …); also counted in [`REQUESTS_TOTAL`] as `route="rejected"`.
pub const REJECTED_TOTAL: &str = "mmrouter_rejected_total";
/// Counter `{pool}`: requests routed to each pool (by their `model`). Pools are few and named in the
/// config, so the label stays bounded; join per-worker series to pools with [`WORKER_INFO`].
pub const POOL_REQUESTS_TOTAL: &str = "mmrouter_pool_requests_total";
/// Gauge `{worker, pool, engine}` = 1: which pool each worker serves (for joins in dashboards).
pub const WORKER_INFO: &str = "mmrouter_worker_info";
/// Counter `{reason}`: a request with media fell back to text-prefix routing.
pub const MM_FALLBACK_TOTAL: &str = "mmrouter_mm_fallback_total";
/// Histogram: image tokens of an exact-routed request.
pub const IMAGE_TOKENS_PER_REQUEST: &str = "mmrouter_image_tokens_per_request";
/// Histogram: images of an exact-routed request.
pub const IMAGES_PER_REQUEST: &str = "mmrouter_images_per_request";
/// Gauge `{worker}`: image tokens in flight (exact route only).
pub const WORKER_INFLIGHT_IMAGE_TOKENS: &str = "mmrouter_worker_inflight_image_tokens";
/// Gauge `{worker}`: requests in flight.
pub const WORKER_INFLIGHT_REQUESTS: &str = "mmrouter_worker_inflight_requests";
/// Gauge `{worker}`: prompt tokens dispatched and not yet answered with a first byte.
pub const WORKER_INFLIGHT_PREFILL_TOKENS: &str = "mmrouter_worker_inflight_prefill_tokens";
/// Histogram `{route}`: prompt tokens the chosen worker already held (predicted).
pub const KV_OVERLAP_TOKENS: &str = "mmrouter_kv_overlap_tokens";
/// Histogram `{stage}`: seconds spent per pipeline stage.
pub const STAGE_DURATION_SECONDS: &str = "mmrouter_stage_duration_seconds";
/// Histogram `{source}`: seconds to fetch/decode and probe one image.
pub const IMAGE_PROBE_DURATION_SECONDS: &str = "mmrouter_image_probe_duration_seconds";
/// Histogram: actual (worker usage) minus predicted prompt tokens.
pub const PROMPT_TOKENS_DRIFT: &str = "mmrouter_prompt_tokens_drift";
/// Gauge: block keys held by the routing index.
pub const INDEX_BLOCKS: &str = "mmrouter_index_blocks";
/// Counter `{worker, status}`: every upstream attempt.
pub const UPSTREAM_REQUESTS_TOTAL: &str = "mmrouter_upstream_requests_total";

/// Counter `{reason}`: an upstream attempt tried again on the next candidate (`connect_error`,
/// `timeout`, `transport_error`, `server_error`, `rate_limited`).
pub const UPSTREAM_RETRIES_TOTAL: &str = "mmrouter_upstream_retries_total";
/// Counter: a retry refused because the retry budget was used up (the failure went to the client).
pub const RETRY_BUDGET_EXHAUSTED_TOTAL: &str = "mmrouter_retry_budget_exhausted_total";
/// Counter `{worker}`: passive ejections (failures in a row, failure rate, refused connections).
pub const WORKER_EJECTIONS_TOTAL: &str = "mmrouter_worker_ejections_total";
/// Gauge `{worker, state}`: 1 for the worker's current state (`healthy`, `ejected`, `half_open`,
/// `down`), 0 for the others.
pub const WORKER_STATE: &str = "mmrouter_worker_state";
/// Counter `{route, reason}`: a response body cut after its status was sent (`upstream_error`,
/// `idle_timeout`, `total_timeout`); the request is counted as `status="stream_error"`.
pub const STREAM_ERRORS_TOTAL: &str = "mmrouter_stream_errors_total";

/// Gauge `{source}`: (block, worker) index entries by where they came from (`events`, `pending`,
/// `approximate`).
pub const INDEX_BLOCKS_BY_SOURCE: &str = "mmrouter_index_blocks_by_source";
/// Counter `{worker, kind}`: blocks of a worker's KV events, by what became of them (`stored`, `removed`,
/// `cleared`, `ignored`, `orphan`, `unmatchable`, `block_size_mismatch`, `unknown`).
pub const KV_EVENTS_TOTAL: &str = "mmrouter_kv_events_total";
/// Counter `{worker}`: event batches received.
pub const KV_EVENT_BATCHES_TOTAL: &str = "mmrouter_kv_event_batches_total";
/// Counter `{worker}`: frames that could not be decoded (skipped).
pub const KV_EVENT_MALFORMED_TOTAL: &str = "mmrouter_kv_event_malformed_total";
/// Counter `{worker, kind}`: sequence problems (`gap`, `replay`, `replay_failure`, `resync`, `restart`).
pub const KV_EVENT_SEQUENCE_TOTAL: &str = "mmrouter_kv_event_sequence_total";
/// Counter `{worker, reason}`: input refused from a worker's event publisher or discovery document:
/// protocol violations (`frame_too_large`, `message_too_large`, `too_many_frames`, `bad_greeting`, …),
/// malformed messages (their decode label), `inconsistent_event`, `state_overflow`, `index_share` (event blocks beyond the worker's
/// `routing.index_worker_share` of the index), and
/// `discovery_<reason>` (`too_large`, `too_many_ranks`, `foreign_host`, `not_json`, `bad_shape`, …).
pub const KV_EVENT_REFUSED_TOTAL: &str = "mmrouter_kv_event_refused_total";
/// Gauge `{worker}`: 1 while every rank's subscription is connected.
pub const KV_EVENT_CONNECTED: &str = "mmrouter_kv_event_connected";
/// Histogram `{worker}`: now minus the batch's engine timestamp, seconds.
pub const KV_EVENT_LAG_SECONDS: &str = "mmrouter_kv_event_lag_seconds";

/// Gauge: client connections open.
pub const CONNECTIONS_OPEN: &str = "mmrouter_connections_open";
/// Gauge: client requests in flight (what `server.max_inflight_requests` caps).
pub const INFLIGHT_REQUESTS: &str = "mmrouter_inflight_requests";
/// Counter `{reason}`: connections or requests refused with a 503 (`connections`, `inflight`).
pub const SHED_TOTAL: &str = "mmrouter_shed_total";
/// Counter `{kind}`: client connections cut by a timeout (`header`, `body`, `idle`, `drain`).
pub const CLIENT_TIMEOUTS_TOTAL: &str = "mmrouter_client_timeouts_total";
/// Counter `{scope}`: requests refused for a missing or wrong key (`client`, `admin`).
pub const AUTH_FAILURES_TOTAL: &str = "mmrouter_auth_failures_total";

/// `stage` label values of [`STAGE_DURATION_SECONDS`], in pipeline order.
pub mod stage {
    pub const INTAKE: &str = "intake";
    pub const ACCOUNT: &str = "account";
    pub const PLAN: &str = "plan";
    pub const SELECT: &str = "select";
    pub const FORWARD_TTFB: &str = "forward_ttfb";
}

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Label, Level, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use mmrouter_core::pipeline::{Planned, Route, RoutePlan};
use std::sync::Arc;

use mmrouter_core::routing::{Availability, Router};

use crate::events::WorkerFeeds;

static METADATA: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// Handles registered on first use, by label values.
struct Cache<K, H>(Mutex<HashMap<K, H>>);

impl<K: Eq + Hash, H: Clone> Cache<K, H> {
    fn new() -> Self {
        Cache(Mutex::new(HashMap::new()))
    }

    fn get(&self, key: K, make: impl FnOnce(&K) -> H) -> H {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(key).or_insert_with_key(make).clone()
    }
}

impl<H: Clone> Cache<String, H> {
    /// Like [`Cache::get`], found by `&str`: no owned key is built unless the handle is new (the request
    /// path records per pool on every request).
    fn get_str(&self, key: &str, make: impl FnOnce(&str) -> H) -> H {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = map.get(key) {
            return h.clone();
        }
        let h = make(key);
        map.insert(key.to_owned(), h.clone());
        h
    }
}

/// One proxy's metrics: its recorder, and the handles the request path records into.
pub struct Observer {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    requests: Cache<(&'static str, u16), Counter>,
    rejected: Cache<u16, Counter>,
    rejected_reasons: Cache<&'static str, Counter>,
    pool_requests: Cache<String, Counter>,
    fallback: Cache<&'static str, Counter>,
    retries: Cache<&'static str, Counter>,
    stream_errors: Cache<(&'static str, &'static str), Counter>,
    cut_requests: Cache<&'static str, Counter>,
    budget_exhausted: Counter,
    overlap: Cache<&'static str, Histogram>,
    stages: Cache<&'static str, Histogram>,
    probes: Cache<&'static str, Histogram>,
    index_by_source: Cache<&'static str, Gauge>,
    /// Every worker's own series, by worker name (see the module docs).
    workers: Mutex<HashMap<String, Arc<WorkerSeries>>>,
    front_counters: Cache<(&'static str, &'static str), Counter>,
    connections_open: Gauge,
    inflight_requests: Gauge,
    image_tokens: Histogram,
    images: Histogram,
    drift: Histogram,
    index_blocks: Gauge,
}

impl Default for Observer {
    fn default() -> Self {
        Self::new()
    }
}

impl Observer {
    pub fn new() -> Observer {
        let recorder = builder().build_recorder();
        describe(&recorder);
        let plain = |name: &'static str| Key::from_static_name(name);
        Observer {
            handle: recorder.handle(),
            image_tokens: recorder.register_histogram(&plain(IMAGE_TOKENS_PER_REQUEST), &METADATA),
            images: recorder.register_histogram(&plain(IMAGES_PER_REQUEST), &METADATA),
            drift: recorder.register_histogram(&plain(PROMPT_TOKENS_DRIFT), &METADATA),
            index_blocks: recorder.register_gauge(&plain(INDEX_BLOCKS), &METADATA),
            connections_open: recorder.register_gauge(&plain(CONNECTIONS_OPEN), &METADATA),
            inflight_requests: recorder.register_gauge(&plain(INFLIGHT_REQUESTS), &METADATA),
            front_counters: Cache::new(),
            budget_exhausted: recorder.register_counter(&plain(RETRY_BUDGET_EXHAUSTED_TOTAL), &METADATA),
            recorder,
            requests: Cache::new(),
            rejected: Cache::new(),
            rejected_reasons: Cache::new(),
            pool_requests: Cache::new(),
            fallback: Cache::new(),
            retries: Cache::new(),
            stream_errors: Cache::new(),
            cut_requests: Cache::new(),
            overlap: Cache::new(),
            stages: Cache::new(),
            probes: Cache::new(),
            index_by_source: Cache::new(),
            workers: Mutex::new(HashMap::new()),
        }
    }

    fn key(name: &'static str, labels: &[(&'static str, &str)]) -> Key {
        let labels: Vec<Label> = labels.iter().map(|(k, v)| Label::new(*k, v.to_string())).collect();
        Key::from_parts(name, labels)
    }

    fn counter(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Counter {
        self.recorder.register_counter(&Self::key(name, labels), &METADATA)
    }

    fn histogram(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Histogram {
        self.recorder.register_histogram(&Self::key(name, labels), &METADATA)
    }

    /// One stage's duration.
    pub fn stage(&self, name: &'static str, d: Duration) {
        let h = self.stages.get(name, |s| self.histogram(STAGE_DURATION_SECONDS, &[("stage", s)]));
        h.record(d.as_secs_f64());
    }

    /// What planning took: stage timings, and one probe sample per image read.
    pub fn planned(&self, p: &Planned) {
        if let Some(d) = p.timings.intake {
            self.stage(stage::INTAKE, d);
        }
        if let Some(d) = p.timings.account {
            self.stage(stage::ACCOUNT, d);
        }
        self.stage(stage::PLAN, p.timings.plan);
        for probe in &p.probes {
            let source = probe.source.label();
            let h = self.probes.get(source, |s| self.histogram(IMAGE_PROBE_DURATION_SECONDS, &[("source", s)]));
            h.record(probe.elapsed.as_secs_f64());
        }
    }

    /// A request left for its worker: counted once, whatever the worker answers. Image samples only
    /// for an exact plan; a fallback counts its reason and nothing of its images.
    pub fn dispatched(&self, plan: &RoutePlan, overlap_tokens: u32) {
        match plan.route {
            Route::Exact => {
                self.image_tokens.record(f64::from(plan.exact_image_tokens()));
                self.images.record(plan.images.len() as f64);
            }
            Route::TextPrefix { reason } => {
                self.fallback.get(reason, |r| self.counter(MM_FALLBACK_TOTAL, &[("reason", r)])).increment(1);
            }
            Route::NoMedia | Route::Passthrough => {}
        }
        if plan.route != Route::Passthrough {
            let route = plan.route.label();
            let h = self.overlap.get(route, |r| self.histogram(KV_OVERLAP_TOKENS, &[("route", r)]));
            h.record(f64::from(overlap_tokens));
        }
    }

    /// `worker`'s series (made on first use).
    fn series(&self, worker: &str) -> Arc<WorkerSeries> {
        let mut map = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = map.get(worker) {
            return s.clone();
        }
        let s = Arc::new(WorkerSeries::new(worker));
        map.insert(worker.to_owned(), s.clone());
        s
    }

    /// Forgets the series of every worker not in `live` (removed workers; names are unique among
    /// the workers in rotation).
    pub fn retain_workers(&self, live: &HashSet<String>) {
        self.workers.lock().unwrap_or_else(|e| e.into_inner()).retain(|name, _| live.contains(name));
    }

    /// One upstream attempt: an HTTP status code, or a failure label (`connect_error`, `timeout`, …).
    pub fn upstream(&self, worker: &str, status: &str) {
        let series = self.series(worker);
        let c = series.upstream.get_str(status, |s| series.counter(UPSTREAM_REQUESTS_TOTAL, &[("status", s)]));
        c.increment(1);
    }

    /// A proxied request ended with `status` under `route`.
    /// A request's `model` picked `pool`.
    pub fn pool_request(&self, pool: &str) {
        self.pool_requests.get_str(pool, |p| self.counter(POOL_REQUESTS_TOTAL, &[("pool", p)])).increment(1);
    }

    pub fn finished(&self, route: Route, status: u16) {
        let label = route.label();
        let c = self
            .requests
            .get((label, status), |(r, s)| self.counter(REQUESTS_TOTAL, &[("route", r), ("status", &s.to_string())]));
        c.increment(1);
    }

    /// A response body was cut after its status went out: counted as `status="stream_error"` and by
    /// reason.
    pub fn stream_cut(&self, route: Route, reason: &'static str) {
        let label = route.label();
        let c = self
            .stream_errors
            .get((label, reason), |(r, why)| self.counter(STREAM_ERRORS_TOTAL, &[("route", r), ("reason", why)]));
        c.increment(1);
        let c =
            self.cut_requests.get(label, |r| self.counter(REQUESTS_TOTAL, &[("route", r), ("status", "stream_error")]));
        c.increment(1);
    }

    /// An upstream attempt is tried again on the next candidate.
    pub fn retry(&self, reason: &'static str) {
        self.retries.get(reason, |r| self.counter(UPSTREAM_RETRIES_TOTAL, &[("reason", r)])).increment(1);
    }

    /// A retry was refused by the budget.
    pub fn retry_budget_exhausted(&self) {
        self.budget_exhausted.increment(1);
    }

    /// `worker` was ejected.
    pub fn ejected(&self, worker: &str) {
        self.series(worker).counter_for(WORKER_EJECTIONS_TOTAL, &[]).increment(1);
    }

    /// A request refused before it had a route (bad body, blocked image URL with
    /// `reject_blocked_urls`, …).
    pub fn rejected(&self, status: u16, reason: &'static str) {
        let c = self
            .rejected
            .get(status, |s| self.counter(REQUESTS_TOTAL, &[("route", "rejected"), ("status", &s.to_string())]));
        c.increment(1);
        self.rejected_reasons.get(reason, |r| self.counter(REJECTED_TOTAL, &[("reason", r)])).increment(1);
    }

    /// The gauge of open client connections (the accept loop moves it).
    pub fn connections_open(&self) -> Gauge {
        self.connections_open.clone()
    }

    /// The gauge of client requests in flight (the shedding layer moves it).
    pub fn inflight_requests(&self) -> Gauge {
        self.inflight_requests.clone()
    }

    /// A connection or request refused for load (`connections`, `inflight`).
    pub fn shed(&self, reason: &'static str) {
        self.front_count(SHED_TOTAL, "reason", reason);
    }

    /// A client connection cut by a timeout (`header`, `body`, `idle`, `drain`).
    pub fn client_timeout(&self, kind: &'static str) {
        self.front_count(CLIENT_TIMEOUTS_TOTAL, "kind", kind);
    }

    /// A request refused for its key (`client`, `admin`).
    pub fn auth_failed(&self, scope: &'static str) {
        self.front_count(AUTH_FAILURES_TOTAL, "scope", scope);
    }

    fn front_count(&self, name: &'static str, label: &'static str, value: &'static str) {
        let c = self.front_counters.get((name, value), |(n, v)| self.counter(n, &[(label, v)]));
        c.increment(1);
    }

    /// The handle the relay records drift into when a response's `usage` arrives.
    pub fn drift(&self) -> Histogram {
        self.drift.clone()
    }

    /// A KV-event batch from `worker` arrived `secs` after the engine stamped it.
    pub fn event_lag(&self, worker: &str, secs: f64) {
        let series = self.series(worker);
        series
            .lag
            .get_or_init(|| series.recorder.register_histogram(&series.key(KV_EVENT_LAG_SECONDS, &[]), &METADATA))
            .record(secs);
    }

    /// The KV-event feeds' counters and connection state, read when `/metrics` is scraped.
    fn render_feeds(&self, feeds: &[Arc<WorkerFeeds>]) {
        for f in feeds {
            let worker = f.worker_ref();
            if worker.is_removed() {
                continue; // its feeds are stopping
            }
            let series = self.series(worker.name());
            let c = f.counts();
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
            let stats = f.stats();
            let sum = |get: fn(&mmrouter_kv_events::FeedStats) -> u64| stats.iter().map(get).sum::<u64>();
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
            for (reason, v) in f.refused() {
                series.counter_for(KV_EVENT_REFUSED_TOTAL, &[("reason", &reason)]).absolute(v);
            }
            let connected = !stats.is_empty() && stats.iter().all(|s| s.connected);
            series.gauge_for(KV_EVENT_CONNECTED, &[]).set(if connected { 1.0 } else { 0.0 });
            let index_share = worker.index_refused();
            if index_share > 0 {
                series.counter_for(KV_EVENT_REFUSED_TOTAL, &[("reason", "index_share")]).absolute(index_share);
            }
        }
    }

    /// The Prometheus text exposition, with the worker gauges, the index size and the event feeds'
    /// counters read from their owners; the series of workers no pool has any more are dropped first.
    pub fn render<'a>(&self, pools: impl IntoIterator<Item = (&'a str, &'a Router, &'a [Arc<WorkerFeeds>])>) -> String {
        let pools: Vec<_> = pools.into_iter().collect();
        let live: HashSet<String> =
            pools.iter().flat_map(|(_, r, _)| r.live_workers()).map(|(_, w)| w.name().to_owned()).collect();
        self.retain_workers(&live);
        self.index_blocks.set(pools.iter().map(|(_, r, _)| r.index_blocks()).sum::<usize>() as f64);
        let (mut events, mut pending, mut approximate) = (0, 0, 0);
        for (pool, router, feeds) in &pools {
            let by_source = router.index_entries();
            (events, pending, approximate) =
                (events + by_source.events, pending + by_source.pending, approximate + by_source.approximate);
            self.render_feeds(feeds);
            self.render_workers(pool, router);
        }
        for (source, n) in [("events", events), ("pending", pending), ("approximate", approximate)] {
            let g = self.index_by_source.get(source, |s| {
                self.recorder.register_gauge(&Self::key(INDEX_BLOCKS_BY_SOURCE, &[("source", s)]), &METADATA)
            });
            g.set(n as f64);
        }
        let workers: Vec<Arc<WorkerSeries>> =
            self.workers.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
        let mut parts = vec![self.handle.render()];
        parts.extend(workers.iter().map(|w| w.handle.render()));
        merge_expositions(&parts)
    }

    fn render_workers(&self, pool: &str, router: &Router) {
        for (_, w) in router.live_workers() {
            let series = self.series(w.name());
            let engine = match w.engine() {
                mmrouter_core::routing::Engine::Vllm => "vllm",
                mmrouter_core::routing::Engine::Sglang => "sglang",
            };
            series.gauge_for(WORKER_INFO, &[("pool", pool), ("engine", engine)]).set(1.0);
            let load = w.inflight();
            series.gauge_for(WORKER_INFLIGHT_REQUESTS, &[]).set(load.requests as f64);
            let now = w.availability();
            for state in Availability::ALL {
                let g = series.gauge_for(WORKER_STATE, &[("state", state.label())]);
                g.set(if state == now { 1.0 } else { 0.0 });
            }
            series.gauge_for(WORKER_INFLIGHT_PREFILL_TOKENS, &[]).set(load.prefill_tokens as f64);
            // Only workers that carried exact-routed images show the image gauge.
            if w.has_carried_images() {
                series.gauge_for(WORKER_INFLIGHT_IMAGE_TOKENS, &[]).set(load.image_tokens as f64);
            }
        }
    }
}

/// One worker's series, in a recorder of their own: dropping it forgets them all.
struct WorkerSeries {
    name: String,
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    /// Upstream attempts by status (the request path: found by `&str`).
    upstream: Cache<String, Counter>,
    /// Other counters and gauges by (name, extra label values joined): scrape time and rare events.
    counters: Cache<(&'static str, String), Counter>,
    gauges: Cache<(&'static str, String), Gauge>,
    lag: std::sync::OnceLock<Histogram>,
}

impl WorkerSeries {
    fn new(name: &str) -> WorkerSeries {
        let recorder = builder().build_recorder();
        describe(&recorder);
        WorkerSeries {
            name: name.to_owned(),
            handle: recorder.handle(),
            recorder,
            upstream: Cache::new(),
            counters: Cache::new(),
            gauges: Cache::new(),
            lag: std::sync::OnceLock::new(),
        }
    }

    /// `name{worker, extra…}`.
    fn key(&self, name: &'static str, extra: &[(&'static str, &str)]) -> Key {
        let mut labels = vec![Label::new("worker", self.name.clone())];
        labels.extend(extra.iter().map(|(k, v)| Label::new(*k, v.to_string())));
        Key::from_parts(name, labels)
    }

    fn counter(&self, name: &'static str, extra: &[(&'static str, &str)]) -> Counter {
        self.recorder.register_counter(&self.key(name, extra), &METADATA)
    }

    fn counter_for(&self, name: &'static str, extra: &[(&'static str, &str)]) -> Counter {
        let id = extra.iter().map(|(_, v)| *v).collect::<Vec<_>>().join("\u{0}");
        self.counters.get((name, id), |_| self.counter(name, extra))
    }

    fn gauge_for(&self, name: &'static str, extra: &[(&'static str, &str)]) -> Gauge {
        let id = extra.iter().map(|(_, v)| *v).collect::<Vec<_>>().join("\u{0}");
        self.gauges.get((name, id), |_| self.recorder.register_gauge(&self.key(name, extra), &METADATA))
    }

    /// A counter that mirrors a monotonic count kept elsewhere (feed and event-state counters).
    fn mirror(&self, name: &'static str, kind: &'static str, value: u64) {
        let extra: &[(&'static str, &str)] = if kind.is_empty() { &[] } else { &[("kind", kind)] };
        self.counter_for(name, extra).absolute(value);
    }
}

/// The names of the workers the pools have (not removed): whose series `/metrics` keeps.
pub fn live_worker_names(pools: &[Arc<crate::state::Pool>]) -> HashSet<String> {
    pools.iter().flat_map(|p| p.router.live_workers()).map(|(_, w)| w.name().to_owned()).collect()
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

fn builder() -> PrometheusBuilder {
    const SECONDS: [f64; 19] = [
        0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
        10.0, 30.0, 60.0,
    ];
    const TOKENS: [f64; 13] =
        [16.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0, 65536.0, 131072.0];
    const COUNTS: [f64; 10] = [0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0];
    const DRIFT: [f64; 14] =
        [-1024.0, -256.0, -64.0, -16.0, -4.0, -1.0, -0.5, 0.5, 1.0, 4.0, 16.0, 64.0, 256.0, 1024.0];
    let layouts: [(&'static str, &'static [f64]); 6] = [
        (STAGE_DURATION_SECONDS, &SECONDS),
        (IMAGE_PROBE_DURATION_SECONDS, &SECONDS),
        (IMAGE_TOKENS_PER_REQUEST, &TOKENS),
        (KV_OVERLAP_TOKENS, &TOKENS),
        (IMAGES_PER_REQUEST, &COUNTS),
        (PROMPT_TOKENS_DRIFT, &DRIFT),
    ];
    layouts
        .into_iter()
        .try_fold(PrometheusBuilder::new(), |b, (name, buckets)| {
            b.set_buckets_for_metric(Matcher::Full(name.into()), buckets)
        })
        .expect("static bucket lists are non-empty")
}

fn describe(r: &PrometheusRecorder) {
    let counter = |n: &'static str, d: &'static str| r.describe_counter(KeyName::from(n), None, SharedString::from(d));
    let gauge = |n: &'static str, d: &'static str| r.describe_gauge(KeyName::from(n), None, SharedString::from(d));
    let histogram = |n: &'static str, u: Option<Unit>, d: &'static str| {
        r.describe_histogram(KeyName::from(n), u, SharedString::from(d))
    };
    counter(REQUESTS_TOTAL, "Proxied requests by route and HTTP status (stream_error: body cut after the status).");
    counter(REJECTED_TOTAL, "Requests refused before routing, by error code.");
    counter(POOL_REQUESTS_TOTAL, "Requests routed to each pool by their model.");
    gauge(WORKER_INFO, "1 per worker: the pool it serves and its engine.");
    counter(MM_FALLBACK_TOTAL, "Requests with media that fell back to text-prefix routing, by reason.");
    histogram(IMAGE_TOKENS_PER_REQUEST, None, "Image tokens of exact-routed requests.");
    histogram(IMAGES_PER_REQUEST, None, "Images of exact-routed requests.");
    gauge(WORKER_INFLIGHT_IMAGE_TOKENS, "Image tokens in flight per worker (exact route only).");
    gauge(WORKER_INFLIGHT_REQUESTS, "Requests in flight per worker.");
    gauge(WORKER_INFLIGHT_PREFILL_TOKENS, "Uncached prompt tokens dispatched and not yet answered, per worker.");
    histogram(KV_OVERLAP_TOKENS, None, "Prompt tokens the chosen worker was predicted to hold.");
    histogram(STAGE_DURATION_SECONDS, Some(Unit::Seconds), "Time spent per pipeline stage.");
    histogram(IMAGE_PROBE_DURATION_SECONDS, Some(Unit::Seconds), "Time to read and probe one image.");
    histogram(PROMPT_TOKENS_DRIFT, None, "Worker-reported minus predicted prompt tokens.");
    gauge(INDEX_BLOCKS, "Block keys held by the routing index.");
    counter(UPSTREAM_REQUESTS_TOTAL, "Upstream attempts by worker and status.");
    counter(UPSTREAM_RETRIES_TOTAL, "Upstream attempts tried again on the next candidate, by reason.");
    counter(RETRY_BUDGET_EXHAUSTED_TOTAL, "Retries refused because the retry budget was used up.");
    counter(WORKER_EJECTIONS_TOTAL, "Passive ejections of a worker after failures.");
    gauge(WORKER_STATE, "1 for the worker's current state: healthy, ejected, half_open or down.");
    counter(STREAM_ERRORS_TOTAL, "Response bodies cut after the status was sent, by route and reason.");
    gauge(INDEX_BLOCKS_BY_SOURCE, "(block, worker) index entries by source: events, pending, approximate.");
    counter(KV_EVENTS_TOTAL, "Blocks in a worker's KV events, by what the router made of them.");
    counter(KV_EVENT_BATCHES_TOTAL, "KV-event batches received per worker.");
    counter(KV_EVENT_MALFORMED_TOTAL, "KV-event frames that could not be decoded and were skipped.");
    counter(
        KV_EVENT_REFUSED_TOTAL,
        "Input refused from a worker's KV-event publisher, events or discovery document, by reason.",
    );
    counter(
        KV_EVENT_SEQUENCE_TOTAL,
        "KV-event sequence problems per worker: gap, replay, replay_failure, resync, restart.",
    );
    gauge(KV_EVENT_CONNECTED, "1 while every rank of a worker's KV-event subscription is connected.");
    histogram(KV_EVENT_LAG_SECONDS, Some(Unit::Seconds), "Receive time minus the engine's batch timestamp.");
    gauge(CONNECTIONS_OPEN, "Client connections open.");
    gauge(INFLIGHT_REQUESTS, "Client requests in flight (server.max_inflight_requests caps them).");
    counter(SHED_TOTAL, "Connections or requests refused with a 503 for load, by reason: connections, inflight.");
    counter(CLIENT_TIMEOUTS_TOTAL, "Client connections cut by a timeout, by kind: header, body, idle, drain.");
    counter(AUTH_FAILURES_TOTAL, "Requests refused for a missing or wrong key, by scope: client, admin.");
}

#[cfg(test)]
mod tests {
    use super::*;
    use mmrouter_core::routing::{Load, RoutingConfig, WorkerSpec};

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
        a.finished(Route::Exact, 200);
        a.finished(Route::Exact, 200);
        let r = router();
        assert_eq!(
            sample(&a.render([("p", &r, &[][..])]), "mmrouter_requests_total{route=\"exact\",status=\"200\"}"),
            Some(2.0)
        );
        assert_eq!(
            sample(&b.render([("p", &r, &[][..])]), "mmrouter_requests_total{route=\"exact\",status=\"200\"}"),
            None
        );
    }

    #[test]
    fn worker_gauges_follow_the_load_at_scrape_time() {
        let (o, r) = (Observer::new(), router());
        let mut text = r.begin(0, Load { prefill_tokens: 30, decode_tokens: 5, image_tokens: 0 });
        let page = o.render([("p", &r, &[][..])]);
        assert_eq!(sample(&page, "mmrouter_worker_inflight_requests{worker=\"w0\"}"), Some(1.0));
        assert_eq!(sample(&page, "mmrouter_worker_inflight_prefill_tokens{worker=\"w0\"}"), Some(30.0));
        // A text-only (or fallback) request never touches the image gauge.
        assert!(!page.contains("mmrouter_worker_inflight_image_tokens{worker=\"w0\"}"));
        let img = r.begin(0, Load { prefill_tokens: 100, decode_tokens: 20, image_tokens: 64 });
        let page = o.render([("p", &r, &[][..])]);
        assert_eq!(sample(&page, "mmrouter_worker_inflight_image_tokens{worker=\"w0\"}"), Some(64.0));
        text.first_byte();
        drop(img);
        drop(text);
        let page = o.render([("p", &r, &[][..])]);
        assert_eq!(sample(&page, "mmrouter_worker_inflight_requests{worker=\"w0\"}"), Some(0.0));
        assert_eq!(sample(&page, "mmrouter_worker_inflight_image_tokens{worker=\"w0\"}"), Some(0.0));
        assert!(!page.contains("mmrouter_worker_inflight_image_tokens{worker=\"w1\"}"));
    }

    #[test]
    fn a_removed_workers_series_go_and_families_stay_single() {
        let (o, r) = (Observer::new(), router());
        o.upstream("w0", "200");
        o.upstream("w1", "200");
        o.ejected("w1");
        let page = o.render([("p", &r, &[][..])]);
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
        let page = o.render([("p", &r, &[][..])]);
        assert!(!page.contains("worker=\"w1\""), "{page}");
        assert_eq!(sample(&page, "mmrouter_upstream_requests_total{worker=\"w0\",status=\"200\"}"), Some(1.0));
    }
}
