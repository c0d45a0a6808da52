//! Two byte budgets. [`Budget`]: the request-wide one (`media.max_total_bytes`), shared by the images
//! one request fetches and decodes concurrently. [`DecodeBudget`]: the process-wide one
//! (`media.decode_budget_mb`), shared by every request: a probe that must hold a whole image (and a
//! decoder's copy of it) reserves its worst case first, and waits a bounded time for room or fails
//! with `decode_budget`; so concurrent requests queue instead of multiplying memory.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;

use crate::media::error::MediaError;

pub(crate) struct Budget {
    used: AtomicUsize,
    limit: usize,
}

impl Budget {
    pub(crate) fn new(limit: usize) -> Budget {
        Budget { used: AtomicUsize::new(0), limit }
    }

    /// Charges `n` bytes; fails once the request as a whole is over the limit.
    pub(crate) fn take(&self, n: usize) -> Result<(), MediaError> {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(n).filter(|&total| total <= self.limit)
            })
            .map(|_| ())
            .map_err(|_| MediaError::TotalTooLarge { limit: self.limit })
    }
}

/// Working memory a decoder may take while reading an image's headers (its `Limits::max_alloc`):
/// metadata such as an ICC profile, never pixels — no probe decodes pixels.
pub(crate) const HEADER_ALLOC: usize = 16 << 20;

/// How long a probe waits for room in the decode budget before its request falls back.
pub(crate) const DECODE_WAIT: Duration = Duration::from_secs(2);

/// The most a probe of a whole image of `len` bytes holds at once: the image, a decoder's copy of it
/// (the JPEG decoder reads its input whole) and the decoder's header memory.
pub(crate) fn worst_case(len: usize) -> usize {
    len.saturating_mul(2).saturating_add(HEADER_ALLOC)
}

/// Bytes reserved by probes in flight, across every pipeline of the process. The limit is each
/// caller's (its `[media]` section), so a reloaded configuration applies at once.
#[derive(Default)]
pub(crate) struct DecodeBudget {
    used: AtomicUsize,
    freed: Notify,
}

/// Room held in a [`DecodeBudget`], given back when dropped (wherever the work that needed it ends).
pub(crate) struct Reservation {
    budget: Arc<DecodeBudget>,
    bytes: usize,
}

impl DecodeBudget {
    /// The one budget of this process.
    pub(crate) fn global() -> Arc<DecodeBudget> {
        static GLOBAL: OnceLock<Arc<DecodeBudget>> = OnceLock::new();
        Arc::clone(GLOBAL.get_or_init(Arc::default))
    }

    /// Bytes reserved now.
    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    fn try_take(&self, bytes: usize, limit: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&total| total <= limit)
            })
            .is_ok()
    }

    /// Reserves `bytes` under `limit`, waiting up to `wait` for others to give room back.
    pub(crate) async fn reserve(
        self: &Arc<Self>,
        bytes: usize,
        limit: usize,
        wait: Duration,
    ) -> Result<Reservation, MediaError> {
        let refused = || MediaError::DecodeBudget { needed: bytes, limit, waited_ms: wait.as_millis() as u64 };
        if bytes > limit {
            return Err(refused());
        }
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Registered before trying, so a release between the try and the wait is not missed.
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if self.try_take(bytes, limit) {
                return Ok(Reservation { budget: Arc::clone(self), bytes });
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return Err(refused());
            }
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
        self.budget.freed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_is_shared_and_overflow_safe() {
        let b = Budget::new(10);
        b.take(6).unwrap();
        assert_eq!(b.take(5).unwrap_err().label(), "too_large");
        let b = Budget::new(10);
        b.take(1).unwrap();
        assert!(b.take(usize::MAX).is_err());
        b.take(9).unwrap(); // a refused charge is not kept
    }

    const WAIT: Duration = Duration::from_secs(30);

    #[tokio::test]
    async fn decode_budget_is_shared_and_given_back() {
        let budget = Arc::new(DecodeBudget::default());
        let a = budget.reserve(60, 100, WAIT).await.unwrap();
        let b = budget.reserve(40, 100, WAIT).await.unwrap();
        assert_eq!(budget.used(), 100);
        // Full: a third reservation that may not wait is refused, with its label.
        let err = budget.reserve(1, 100, Duration::ZERO).await.err().unwrap();
        assert_eq!(err.label(), "decode_budget");
        // More than the whole budget can never fit.
        assert!(budget.reserve(101, 100, WAIT).await.is_err());
        drop((a, b));
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_reservations_never_hold_more_than_the_limit() {
        let budget = Arc::new(DecodeBudget::default());
        let peak = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..32)
            .map(|_| {
                let (budget, peak) = (Arc::clone(&budget), Arc::clone(&peak));
                tokio::spawn(async move {
                    // Each "decode" needs 40 of 100: at most two fit at once, the others wait.
                    let held = budget.reserve(40, 100, WAIT).await.unwrap();
                    peak.fetch_max(budget.used(), Ordering::AcqRel);
                    tokio::task::yield_now().await;
                    drop(held);
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert!(peak.load(Ordering::Acquire) <= 100, "held {} at once", peak.load(Ordering::Acquire));
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test]
    async fn a_waiting_reservation_gets_the_room_given_back() {
        let budget = Arc::new(DecodeBudget::default());
        let first = budget.reserve(80, 100, WAIT).await.unwrap();
        let waiting = tokio::spawn({
            let budget = Arc::clone(&budget);
            async move { budget.reserve(80, 100, WAIT).await.map(|r| r.bytes) }
        });
        tokio::task::yield_now().await;
        drop(first);
        assert_eq!(waiting.await.unwrap().unwrap(), 80);
        assert_eq!(budget.used(), 0);
    }
}
