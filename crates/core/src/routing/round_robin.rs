//! `round_robin`: each request goes to the next eligible worker after the previous choice.

use std::sync::atomic::{AtomicUsize, Ordering};

use rand::RngCore;

use super::policy::{Candidates, Pick, Policy};

pub(crate) struct RoundRobin {
    /// The worker chosen last (`usize::MAX` before the first pick).
    last: AtomicUsize,
}

impl RoundRobin {
    pub(crate) fn new() -> RoundRobin {
        RoundRobin { last: AtomicUsize::new(usize::MAX) }
    }
}

/// The first eligible worker after `last`, wrapping around.
fn next_after(last: usize, eligible: &[bool]) -> Option<usize> {
    let n = eligible.len();
    let start = if last >= n { 0 } else { last + 1 };
    (0..n).map(|k| (start + k) % n).find(|&i| eligible[i])
}

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        "round_robin"
    }

    fn pick(&self, c: &Candidates<'_>, _rng: &mut dyn RngCore) -> Option<Pick> {
        // Advancing from the previous *choice* (not a bare counter) keeps the rotation even when some
        // workers are unhealthy: a counter would hand an unhealthy worker's turn to its neighbour.
        let mut chosen = None;
        let _ = self.last.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
            chosen = next_after(last, c.eligible);
            chosen
        });
        let worker = chosen?;
        let costs = c.eligible.iter().map(|&e| if e { 0.0 } else { f64::NAN }).collect();
        Some(Pick { worker, costs })
    }
}
