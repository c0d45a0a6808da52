//! A minimal in-memory `metrics` recorder for unit tests: gauges keep their value so tests can assert
//! what the routing code reported (counters and histograms are ignored).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use metrics::{Counter, Gauge, GaugeFn, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

#[derive(Default)]
pub(crate) struct TestRecorder {
    gauges: Mutex<HashMap<String, Arc<TestGauge>>>,
}

#[derive(Default)]
struct TestGauge(AtomicU64);

impl TestGauge {
    fn update(&self, f: impl Fn(f64) -> f64) {
        let _ = self.0.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| Some(f(f64::from_bits(b)).to_bits()));
    }
}

impl GaugeFn for TestGauge {
    fn increment(&self, value: f64) {
        self.update(|v| v + value);
    }
    fn decrement(&self, value: f64) {
        self.update(|v| v - value);
    }
    fn set(&self, value: f64) {
        self.update(|_| value);
    }
}

fn id(name: &str, labels: &[(&str, &str)]) -> String {
    let mut s = name.to_string();
    for (k, v) in labels {
        s.push_str(&format!("|{k}={v}"));
    }
    s
}

impl TestRecorder {
    /// Current value of a gauge series, `None` if it was never touched.
    pub(crate) fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let map = self.gauges.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&id(name, labels)).map(|g| f64::from_bits(g.0.load(Ordering::SeqCst)))
    }
}

impl Recorder for TestRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        let labels: Vec<(&str, &str)> = key.labels().map(|l| (l.key(), l.value())).collect();
        let mut map = self.gauges.lock().unwrap_or_else(|e| e.into_inner());
        let g = map.entry(id(key.name(), &labels)).or_default().clone();
        Gauge::from_arc(g)
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}
