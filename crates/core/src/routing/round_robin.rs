//! `round_robin`: each request goes to the next eligible worker after the previous choice.

use std::sync::atomic::{AtomicUsize, Ordering};

use rand::RngCore;

use super::policy::{Candidates, Pick, Policy};
use super::worker::Role;

pub(crate) struct RoundRobin {
    /// The worker chosen last per role (`usize::MAX` before the first pick): a pool with roles
    /// selects among one role's workers at a time, and one rotation for all would send every prefill
    /// pick after a decode pick back to the first prefill worker.
    last: [AtomicUsize; 4],
}

impl RoundRobin {
    pub(crate) fn new() -> RoundRobin {
        RoundRobin { last: std::array::from_fn(|_| AtomicUsize::new(usize::MAX)) }
    }
}

/// The rotation a selection belongs to: the role of its eligible workers (one role per selection).
fn rotation(c: &Candidates<'_>) -> usize {
    let first = c.eligible.iter().position(|&e| e);
    match first.map(|i| c.workers[i].role()) {
        Some(Role::Prefill) => 1,
        Some(Role::Decode) => 2,
        Some(Role::Encode) => 3,
        _ => 0,
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
        let _ = self.last[rotation(c)].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
            chosen = next_after(last, c.eligible);
            chosen
        });
        let worker = chosen?;
        let costs = c.eligible.iter().map(|&e| if e { 0.0 } else { f64::NAN }).collect();
        Some(Pick { worker, costs })
    }
}
