//! `least_loaded`: fewest in-flight requests; ties go to the fewest in-flight tokens (prefill +
//! decode), then to a random one of the remaining.

use rand::{Rng, RngCore};

use super::load::InFlight;
use super::policy::{Candidates, Pick, Policy};

pub(crate) struct LeastLoaded;

impl Policy for LeastLoaded {
    fn name(&self) -> &'static str {
        "least_loaded"
    }

    fn pick(&self, c: &Candidates<'_>, rng: &mut dyn RngCore) -> Option<Pick> {
        let mut best: Option<(u64, u64)> = None;
        let mut chosen = None;
        let mut ties = 0u32;
        let loads: Vec<InFlight> = c.workers.iter().map(|w| w.total_inflight()).collect();
        for (i, load) in loads.iter().enumerate() {
            if !c.eligible.get(i).copied().unwrap_or(false) {
                continue;
            }
            let key = (load.requests, load.prefill_tokens.saturating_add(load.decode_tokens));
            match best {
                Some(b) if key > b => {}
                Some(b) if key == b => {
                    ties += 1;
                    if rng.random_range(0..ties) == 0 {
                        chosen = Some(i);
                    }
                }
                _ => {
                    best = Some(key);
                    chosen = Some(i);
                    ties = 1;
                }
            }
        }
        let worker = chosen?;
        // Reported score: in-flight requests (the primary key).
        let costs = loads.iter().zip(c.eligible).map(|(l, &e)| if e { l.requests as f64 } else { f64::NAN }).collect();
        Some(Pick { worker, costs })
    }
}
