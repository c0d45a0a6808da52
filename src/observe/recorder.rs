//! One proxy's [`Observer`]: its own recorder (no process-global one: embedded proxies in tests and the
//! demo never see each other's samples, and the core crates record nothing themselves), the handles
//! registered once, and what the front door and the event feeds record as it happens. A proxied
//! request is recorded once, when it has ended ([`super::record`]); a scrape renders everything
//! ([`super::scrape`]).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use metrics::{Counter, Gauge, Histogram, Key, Label, Recorder};
use metrics_exporter_prometheus::{PrometheusHandle, PrometheusRecorder};

use super::cache::Cache;
use super::names::*;
use super::series::WorkerSeries;
use super::trace::{TraceCounters, TraceExport, Tracer};

/// One proxy's metrics: its recorder, and the handles the request path records into.
pub struct Observer {
    pub(super) recorder: PrometheusRecorder,
    pub(super) handle: PrometheusHandle,
    pub(super) requests: Cache<(&'static str, u16), Counter>,
    pub(super) rejected: Cache<u16, Counter>,
    pub(super) rejected_reasons: Cache<&'static str, Counter>,
    pub(super) pool_requests: Cache<String, Counter>,
    /// Requests by LoRA adapter, the first [`MAX_ADAPTER_LABELS`] adapters by name, later ones `other`.
    adapter_requests: Cache<String, Counter>,
    pub(super) fallback: Cache<&'static str, Counter>,
    pub(super) unrendered: Cache<&'static str, Counter>,
    pub(super) retries: Cache<&'static str, Counter>,
    pub(super) stream_errors: Cache<(&'static str, &'static str), Counter>,
    pub(super) cut_requests: Cache<&'static str, Counter>,
    pub(super) budget_exhausted: Counter,
    pub(super) overlap: Cache<&'static str, Histogram>,
    pub(super) stages: Cache<&'static str, Histogram>,
    /// Disaggregated legs' counters by (name, leg, outcome or reason), and durations by leg.
    pub(super) leg_counters: Cache<(&'static str, &'static str, &'static str), Counter>,
    pub(super) leg_durations: Cache<&'static str, Histogram>,
    pub(super) probes: Cache<&'static str, Histogram>,
    pub(super) index_by_source: Cache<&'static str, Gauge>,
    /// Every worker's own series, by worker name.
    workers: Mutex<HashMap<String, Arc<WorkerSeries>>>,
    front_counters: Cache<(&'static str, &'static str), Counter>,
    /// The cluster's counters and gauges, by (name, label value); `""`: no label.
    cluster_counters: Cache<(&'static str, &'static str), Counter>,
    cluster_gauges: Cache<(&'static str, &'static str), Gauge>,
    booking_delay: OnceLock<Histogram>,
    /// The OTLP exporter, when `[tracing]` names a collector.
    tracer: OnceLock<Arc<Tracer>>,
    connections_open: Gauge,
    inflight_requests: Gauge,
    pub(super) image_tokens: Histogram,
    pub(super) images: Histogram,
    pub(super) drift: Histogram,
    pub(super) index_blocks: Gauge,
}

impl Default for Observer {
    fn default() -> Self {
        Self::new()
    }
}

impl Observer {
    pub fn new() -> Observer {
        let recorder = recorder();
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
            cluster_counters: Cache::new(),
            cluster_gauges: Cache::new(),
            booking_delay: OnceLock::new(),
            tracer: OnceLock::new(),
            budget_exhausted: recorder.register_counter(&plain(RETRY_BUDGET_EXHAUSTED_TOTAL), &METADATA),
            recorder,
            requests: Cache::new(),
            rejected: Cache::new(),
            rejected_reasons: Cache::new(),
            pool_requests: Cache::new(),
            adapter_requests: Cache::new(),
            fallback: Cache::new(),
            unrendered: Cache::new(),
            retries: Cache::new(),
            stream_errors: Cache::new(),
            cut_requests: Cache::new(),
            overlap: Cache::new(),
            stages: Cache::new(),
            leg_counters: Cache::new(),
            leg_durations: Cache::new(),
            probes: Cache::new(),
            index_by_source: Cache::new(),
            workers: Mutex::new(HashMap::new()),
        }
    }

    /// Starts exporting traces (once; on the current runtime).
    pub fn start_tracing(&self, cfg: TraceExport) -> anyhow::Result<()> {
        let dropped = |reason| self.counter(TRACE_SPANS_DROPPED_TOTAL, &[("reason", reason)]);
        let counters = TraceCounters {
            exported: self.counter(TRACE_SPANS_EXPORTED_TOTAL, &[]),
            queue_full: dropped("queue_full"),
            export_failed: dropped("export_failed"),
        };
        let tracer = Tracer::start(cfg, counters)?;
        let _ = self.tracer.set(tracer);
        Ok(())
    }

    /// The exporter, when traces are exported.
    pub fn tracer(&self) -> Option<&Tracer> {
        self.tracer.get().map(|t| &**t)
    }

    pub(super) fn key(name: &'static str, labels: &[(&'static str, &str)]) -> Key {
        let labels: Vec<Label> = labels.iter().map(|(k, v)| Label::new(*k, v.to_string())).collect();
        Key::from_parts(name, labels)
    }

    pub(super) fn counter(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Counter {
        self.recorder.register_counter(&Self::key(name, labels), &METADATA)
    }

    pub(super) fn histogram(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Histogram {
        self.recorder.register_histogram(&Self::key(name, labels), &METADATA)
    }

    /// `worker`'s series (made on first use).
    pub(super) fn series(&self, worker: &str) -> Arc<WorkerSeries> {
        let mut map = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = map.get(worker) {
            return s.clone();
        }
        let s = Arc::new(WorkerSeries::new(worker));
        map.insert(worker.to_owned(), s.clone());
        s
    }

    /// Every worker's series, for a scrape.
    pub(super) fn all_series(&self) -> Vec<Arc<WorkerSeries>> {
        self.workers.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
    }

    /// Forgets the series of every worker not in `live` (removed workers; names are unique among
    /// the workers in rotation).
    pub fn retain_workers(&self, live: &HashSet<String>) {
        self.workers.lock().unwrap_or_else(|e| e.into_inner()).retain(|name, _| live.contains(name));
    }

    /// A request refused before it had a route (bad body, shed, refused key, …): the front door's
    /// refusals, and the proxy's before a pool was picked.
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

    /// An endpoint-picker decision (`picked`, `unavailable`, `shed`, `rejected`).
    pub fn picker_decision(&self, outcome: &'static str) {
        self.front_count(PICKER_DECISIONS_TOTAL, "outcome", outcome);
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

    /// Adds `n` to cluster counter `name` with its one label (`CLUSTER_*` in `names`).
    pub fn cluster_count(&self, name: &'static str, (label, value): (&'static str, &'static str), n: u64) {
        let c = self.cluster_counters.get((name, value), |(n, v)| self.counter(n, &[(label, v)]));
        c.increment(n);
    }

    /// Sets cluster gauge `name`, with its label when `label` is given.
    pub fn cluster_gauge(&self, name: &'static str, label: Option<(&'static str, &'static str)>, v: f64) {
        let value = label.map_or("", |(_, v)| v);
        let g = self.cluster_gauges.get((name, value), |(n, _)| {
            let labels: Vec<(&'static str, &str)> = label.into_iter().collect();
            self.recorder.register_gauge(&Self::key(n, &labels), &METADATA)
        });
        g.set(v);
    }

    /// Another replica's booking was applied `secs` after it was sent.
    pub fn booking_delay(&self, secs: f64) {
        self.booking_delay
            .get_or_init(|| self.recorder.register_histogram(&Self::key(CLUSTER_BOOKING_DELAY_SECONDS, &[]), &METADATA))
            .record(secs);
    }

    /// A request named LoRA `adapter` (one its pool knows: listed by a worker or configured).
    pub fn adapter_request(&self, adapter: &str) {
        let make = |a: &str| self.counter(ADAPTER_REQUESTS_TOTAL, &[("adapter", a)]);
        self.adapter_requests.get_capped(adapter, MAX_ADAPTER_LABELS, "other", make).increment(1);
    }

    /// A runtime LoRA load on `worker` ended with `outcome` (`pools::lora_load`).
    pub fn adapter_load(&self, worker: &str, outcome: &'static str) {
        self.series(worker).counter_for(ADAPTER_LOADS_TOTAL, &[("outcome", outcome)]).increment(1);
    }

    /// A reading of `worker`'s engine counters refused as absurd (the health checks count it).
    pub fn engine_counters_refused(&self, worker: &str, reason: &'static str) {
        self.series(worker).counter_for(WORKER_ENGINE_COUNTERS_REFUSED, &[("reason", reason)]).increment(1);
    }

    /// A resolution of DNS worker entry `entry` (`pool/name`) and its `outcome` (the DNS watch).
    pub fn dns_resolution(&self, entry: &str, outcome: &'static str) {
        self.counter(DNS_RESOLUTIONS_TOTAL, &[("entry", entry), ("outcome", outcome)]).increment(1);
    }

    /// The workers DNS worker entry `entry` has in its pool.
    pub fn dns_workers(&self, entry: &str, n: usize) {
        self.recorder.register_gauge(&Self::key(DNS_WORKERS, &[("entry", entry)]), &METADATA).set(n as f64);
    }

    /// A KV-event batch from `worker` arrived `secs` after the engine stamped it (the feeds record it).
    pub fn event_lag(&self, worker: &str, secs: f64) {
        let series = self.series(worker);
        series
            .lag
            .get_or_init(|| series.recorder.register_histogram(&series.key(KV_EVENT_LAG_SECONDS, &[]), &METADATA))
            .record(secs);
    }
}
