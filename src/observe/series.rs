//! One worker's series, in a recorder of their own: dropping it forgets them all (the exporter cannot
//! forget a single series), so a removed worker leaves nothing behind in `/metrics`.

use metrics::{Counter, Gauge, Histogram, Key, Label, Recorder};
use metrics_exporter_prometheus::{PrometheusHandle, PrometheusRecorder};

use super::cache::Cache;
use super::names::{recorder, METADATA};

/// One worker's series, in a recorder of their own: dropping it forgets them all.
pub(super) struct WorkerSeries {
    pub(super) name: String,
    pub(super) recorder: PrometheusRecorder,
    pub(super) handle: PrometheusHandle,
    /// Upstream attempts by status (the request path: found by `&str`).
    pub(super) upstream: Cache<String, Counter>,
    /// Other counters and gauges by (name, extra label values joined): scrape time and rare events.
    pub(super) counters: Cache<(&'static str, String), Counter>,
    pub(super) gauges: Cache<(&'static str, String), Gauge>,
    pub(super) lag: std::sync::OnceLock<Histogram>,
}

impl WorkerSeries {
    pub(super) fn new(name: &str) -> WorkerSeries {
        let recorder = recorder();
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
    pub(super) fn key(&self, name: &'static str, extra: &[(&'static str, &str)]) -> Key {
        let mut labels = vec![Label::new("worker", self.name.clone())];
        labels.extend(extra.iter().map(|(k, v)| Label::new(*k, v.to_string())));
        Key::from_parts(name, labels)
    }

    pub(super) fn counter(&self, name: &'static str, extra: &[(&'static str, &str)]) -> Counter {
        self.recorder.register_counter(&self.key(name, extra), &METADATA)
    }

    pub(super) fn counter_for(&self, name: &'static str, extra: &[(&'static str, &str)]) -> Counter {
        let id = extra.iter().map(|(_, v)| *v).collect::<Vec<_>>().join("\u{0}");
        self.counters.get((name, id), |_| self.counter(name, extra))
    }

    pub(super) fn gauge_for(&self, name: &'static str, extra: &[(&'static str, &str)]) -> Gauge {
        let id = extra.iter().map(|(_, v)| *v).collect::<Vec<_>>().join("\u{0}");
        self.gauges.get((name, id), |_| self.recorder.register_gauge(&self.key(name, extra), &METADATA))
    }

    /// A counter that mirrors a monotonic count kept elsewhere (feed and event-state counters).
    pub(super) fn mirror(&self, name: &'static str, kind: &'static str, value: u64) {
        let extra: &[(&'static str, &str)] = if kind.is_empty() { &[] } else { &[("kind", kind)] };
        self.counter_for(name, extra).absolute(value);
    }
}
