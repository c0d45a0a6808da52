//! `kv` (the default): cache- and load-aware cost per worker,
//!
//! ```text
//! cost = prefill_weight × (uncached prompt tokens + in-flight prefill tokens)
//!      + decode_weight  × in-flight decode tokens
//! uncached = prompt_tokens − overlap_blocks × block_size   (saturating)
//! ```
//!
//! lowest cost wins, ties at random; with `temperature > 0` a softmax sample over the normalised costs
//! (Dynamo's picker). Load is always part of the score, so a cache hit on a busy worker does not win
//! automatically, and a miss does not pile onto one worker. The request's own decode tokens would add
//! the same amount to every worker, so they are left out.

use rand::RngCore;

use super::policy::{argmin_random_tie, softmax_sample, Candidates, Pick, Policy};

pub(crate) struct Kv {
    pub prefill_weight: f64,
    pub decode_weight: f64,
    pub temperature: f64,
}

impl Kv {
    fn cost(&self, c: &Candidates<'_>, worker: usize) -> f64 {
        let overlap_tokens =
            u64::from(c.overlap_blocks.get(worker).copied().unwrap_or(0)).saturating_mul(u64::from(c.req.block_size));
        let uncached = u64::from(c.req.prompt_tokens).saturating_sub(overlap_tokens);
        let load = c.inflight.get(worker).copied().unwrap_or_default();
        self.prefill_weight * uncached.saturating_add(load.prefill_tokens) as f64
            + self.decode_weight * load.decode_tokens as f64
    }
}

impl Policy for Kv {
    fn name(&self) -> &'static str {
        "kv"
    }

    fn pick(&self, c: &Candidates<'_>, rng: &mut dyn RngCore) -> Option<Pick> {
        let costs: Vec<f64> =
            c.eligible.iter().enumerate().map(|(i, &e)| if e { self.cost(c, i) } else { f64::NAN }).collect();
        let worker = if self.temperature > 0.0 {
            softmax_sample(&costs, self.temperature, rng)
        } else {
            argmin_random_tie(&costs, rng)
        }?;
        Some(Pick { worker, costs })
    }
}
