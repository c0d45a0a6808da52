//! In-flight load per worker, in requests and tokens: what one request adds ([`Load`]), the counters
//! a worker keeps, and snapshots of them ([`InFlight`]). The RAII guard that adds and releases a
//! request's load is [`super::LoadGuard`], beside the worker it holds.
//!
//! The counters are plain atomics; the server exports them as gauges when `/metrics` is scraped.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde::Serialize;

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

/// The counters a [`Worker`] owns.
#[derive(Debug, Default)]
pub(crate) struct LoadCounters {
    pub(crate) requests: AtomicU64,
    pub(crate) prefill: AtomicU64,
    pub(crate) decode: AtomicU64,
    pub(crate) image: AtomicU64,
    pub(crate) carried_images: AtomicBool,
}

impl LoadCounters {
    pub(crate) fn snapshot(&self) -> InFlight {
        InFlight {
            requests: self.requests.load(Ordering::Relaxed),
            prefill_tokens: self.prefill.load(Ordering::Relaxed),
            decode_tokens: self.decode.load(Ordering::Relaxed),
            image_tokens: self.image.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn has_carried_images(&self) -> bool {
        self.carried_images.load(Ordering::Relaxed)
    }
}
