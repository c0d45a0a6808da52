//! In-flight load per worker, in requests and tokens, held by an RAII guard.
//!
//! [`LoadTracker::begin`] adds a request's load to its worker and returns a [`LoadGuard`]. The guard is
//! the only way to release it: [`LoadGuard::first_byte`] releases the prefill part (the worker has
//! finished the prompt), and `Drop` releases whatever is still held. The proxy moves the guard into the
//! response body, so the load is released on every path — stream end, upstream error, timeout, client
//! disconnect (the body is dropped) — and never twice (peers leaked load on some of these paths).
//!
//! Gauges (`worker` label) follow every change by `increment`/`decrement`, not `set`, so concurrent
//! requests cannot leave a stale value behind and several routers in one process add up.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::Serialize;

use crate::metrics::{WORKER_INFLIGHT_IMAGE_TOKENS, WORKER_INFLIGHT_PREFILL_TOKENS, WORKER_INFLIGHT_REQUESTS};

/// The load one request puts on its worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Load {
    /// Prompt tokens the worker must compute (not cached there); released at the first response byte.
    pub prefill_tokens: u32,
    /// Expected decode tokens (e.g. `max_tokens`); released when the response ends.
    pub decode_tokens: u32,
    /// Image tokens of the prompt (exact route only, else 0); released when the response ends.
    pub image_tokens: u32,
}

/// A snapshot of one worker's in-flight load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct InFlight {
    pub requests: u64,
    pub prefill_tokens: u64,
    pub decode_tokens: u64,
    pub image_tokens: u64,
}

/// A named snapshot of one worker's in-flight load (for `/debug` and tests).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WorkerLoad {
    pub worker: String,
    #[serde(flatten)]
    pub inflight: InFlight,
}

struct Slot {
    name: String,
    requests: AtomicU64,
    prefill: AtomicU64,
    decode: AtomicU64,
    image: AtomicU64,
}

impl Slot {
    fn inflight(&self) -> InFlight {
        InFlight {
            requests: self.requests.load(Ordering::Relaxed),
            prefill_tokens: self.prefill.load(Ordering::Relaxed),
            decode_tokens: self.decode.load(Ordering::Relaxed),
            image_tokens: self.image.load(Ordering::Relaxed),
        }
    }
}

/// Per-worker in-flight counters.
pub struct LoadTracker {
    slots: Vec<Arc<Slot>>,
}

impl LoadTracker {
    pub fn new(worker_names: &[String]) -> LoadTracker {
        let slots = worker_names
            .iter()
            .map(|name| {
                Arc::new(Slot {
                    name: name.clone(),
                    requests: AtomicU64::new(0),
                    prefill: AtomicU64::new(0),
                    decode: AtomicU64::new(0),
                    image: AtomicU64::new(0),
                })
            })
            .collect();
        LoadTracker { slots }
    }

    /// Adds `load` (and one request) to `worker` until the returned guard drops. An out-of-range worker
    /// gets an inert guard (nothing counted) rather than a panic.
    pub fn begin(&self, worker: usize, load: Load) -> LoadGuard {
        let Some(slot) = self.slots.get(worker) else {
            return LoadGuard { slot: None, prefill: 0, decode: 0, image: 0 };
        };
        let (prefill, decode, image) =
            (u64::from(load.prefill_tokens), u64::from(load.decode_tokens), u64::from(load.image_tokens));
        slot.requests.fetch_add(1, Ordering::Relaxed);
        slot.prefill.fetch_add(prefill, Ordering::Relaxed);
        slot.decode.fetch_add(decode, Ordering::Relaxed);
        slot.image.fetch_add(image, Ordering::Relaxed);
        let worker = slot.name.clone();
        metrics::gauge!(WORKER_INFLIGHT_REQUESTS, "worker" => worker.clone()).increment(1.0);
        metrics::gauge!(WORKER_INFLIGHT_PREFILL_TOKENS, "worker" => worker.clone()).increment(prefill as f64);
        if image > 0 {
            metrics::gauge!(WORKER_INFLIGHT_IMAGE_TOKENS, "worker" => worker).increment(image as f64);
        }
        LoadGuard { slot: Some(slot.clone()), prefill, decode, image }
    }

    /// Current load of every worker, by worker index.
    pub fn inflight(&self) -> Vec<InFlight> {
        self.slots.iter().map(|s| s.inflight()).collect()
    }

    /// Current load of every worker with its name.
    pub fn snapshot(&self) -> Vec<WorkerLoad> {
        self.slots.iter().map(|s| WorkerLoad { worker: s.name.clone(), inflight: s.inflight() }).collect()
    }
}

/// Holds one request's load on its worker; see the module docs.
#[must_use = "dropping the guard releases the load immediately"]
pub struct LoadGuard {
    slot: Option<Arc<Slot>>,
    /// What this guard still holds (0 once released).
    prefill: u64,
    decode: u64,
    image: u64,
}

impl std::fmt::Debug for LoadGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadGuard")
            .field("worker", &self.slot.as_ref().map(|s| s.name.as_str()))
            .field("prefill", &self.prefill)
            .field("decode", &self.decode)
            .field("image", &self.image)
            .finish()
    }
}

/// Subtracts what a guard added. The guard never subtracts more than it added, so this cannot
/// underflow; saturating anyway keeps a counter at 0 rather than wrapping if that were ever broken.
fn release(counter: &AtomicU64, amount: u64) {
    if amount == 0 {
        return;
    }
    let prev = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some(v.saturating_sub(amount)));
    debug_assert!(prev.is_ok_and(|v| v >= amount), "load released more than it held");
}

impl LoadGuard {
    /// The first response byte arrived: the prompt is computed, release the prefill tokens. Idempotent.
    pub fn first_byte(&mut self) {
        let Some(slot) = &self.slot else { return };
        if self.prefill == 0 {
            return;
        }
        release(&slot.prefill, self.prefill);
        metrics::gauge!(WORKER_INFLIGHT_PREFILL_TOKENS, "worker" => slot.name.clone()).decrement(self.prefill as f64);
        self.prefill = 0;
    }
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        self.first_byte();
        let Some(slot) = self.slot.take() else { return };
        release(&slot.requests, 1);
        release(&slot.decode, self.decode);
        release(&slot.image, self.image);
        metrics::gauge!(WORKER_INFLIGHT_REQUESTS, "worker" => slot.name.clone()).decrement(1.0);
        if self.image > 0 {
            metrics::gauge!(WORKER_INFLIGHT_IMAGE_TOKENS, "worker" => slot.name.clone()).decrement(self.image as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::test_recorder::TestRecorder;

    fn tracker(n: usize) -> LoadTracker {
        let names: Vec<String> = (0..n).map(|i| format!("w{i}")).collect();
        LoadTracker::new(&names)
    }

    const LOAD: Load = Load { prefill_tokens: 100, decode_tokens: 20, image_tokens: 64 };

    #[test]
    fn first_byte_releases_only_prefill_and_drop_the_rest() {
        let t = tracker(2);
        let mut g = t.begin(1, LOAD);
        let held = InFlight { requests: 1, prefill_tokens: 100, decode_tokens: 20, image_tokens: 64 };
        assert_eq!(t.inflight(), vec![InFlight::default(), held]);
        g.first_byte();
        assert_eq!(t.inflight()[1], InFlight { prefill_tokens: 0, ..held });
        g.first_byte(); // idempotent: no underflow, no double release
        assert_eq!(t.inflight()[1], InFlight { prefill_tokens: 0, ..held });
        drop(g);
        assert_eq!(t.inflight(), vec![InFlight::default(); 2]);
    }

    #[test]
    fn drop_without_first_byte_releases_everything() {
        let t = tracker(1);
        let a = t.begin(0, LOAD);
        let b = t.begin(0, Load { prefill_tokens: 7, decode_tokens: 0, image_tokens: 0 });
        assert_eq!(t.inflight()[0], InFlight { requests: 2, prefill_tokens: 107, decode_tokens: 20, image_tokens: 64 });
        drop(a); // e.g. upstream error before any byte
        assert_eq!(t.inflight()[0], InFlight { requests: 1, prefill_tokens: 7, decode_tokens: 0, image_tokens: 0 });
        drop(b);
        assert_eq!(t.inflight()[0], InFlight::default());
    }

    #[test]
    fn out_of_range_worker_gets_an_inert_guard() {
        let t = tracker(1);
        let mut g = t.begin(5, LOAD);
        g.first_byte();
        drop(g);
        assert_eq!(t.inflight(), vec![InFlight::default()]);
    }

    #[test]
    fn gauges_follow_the_counters() {
        let rec = TestRecorder::default();
        metrics::with_local_recorder(&rec, || {
            let t = tracker(2);
            let w = [("worker", "w0")];
            let mut text = t.begin(0, Load { prefill_tokens: 30, decode_tokens: 5, image_tokens: 0 });
            // A text-only (or fallback) request never touches the image gauge.
            assert_eq!(rec.gauge(WORKER_INFLIGHT_IMAGE_TOKENS, &w), None);
            let mut img = t.begin(0, LOAD);
            assert_eq!(rec.gauge(WORKER_INFLIGHT_REQUESTS, &w), Some(2.0));
            assert_eq!(rec.gauge(WORKER_INFLIGHT_PREFILL_TOKENS, &w), Some(130.0));
            assert_eq!(rec.gauge(WORKER_INFLIGHT_IMAGE_TOKENS, &w), Some(64.0));
            img.first_byte();
            assert_eq!(rec.gauge(WORKER_INFLIGHT_PREFILL_TOKENS, &w), Some(30.0));
            assert_eq!(rec.gauge(WORKER_INFLIGHT_IMAGE_TOKENS, &w), Some(64.0));
            drop(img);
            assert_eq!(rec.gauge(WORKER_INFLIGHT_IMAGE_TOKENS, &w), Some(0.0));
            text.first_byte();
            drop(text);
            assert_eq!(rec.gauge(WORKER_INFLIGHT_REQUESTS, &w), Some(0.0));
            assert_eq!(rec.gauge(WORKER_INFLIGHT_PREFILL_TOKENS, &w), Some(0.0));
            assert_eq!(rec.gauge(WORKER_INFLIGHT_REQUESTS, &[("worker", "w1")]), None);
        });
    }

    #[test]
    fn concurrent_begin_and_drop_end_at_zero() {
        let t = Arc::new(tracker(3));
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let t = t.clone();
                std::thread::spawn(move || {
                    let mut held = Vec::new();
                    for j in 0..2000u32 {
                        let load = Load { prefill_tokens: j % 97, decode_tokens: j % 13, image_tokens: j % 3 };
                        let mut g = t.begin((i + j as usize) % 3, load);
                        if j % 2 == 0 {
                            g.first_byte();
                        }
                        held.push(g);
                        if held.len() > 16 {
                            held.drain(..8);
                        }
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().expect("worker thread panicked");
        }
        assert_eq!(t.inflight(), vec![InFlight::default(); 3]);
    }
}
