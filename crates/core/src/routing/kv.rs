//! `kv` (the default): cache- and load-aware cost per worker,
//!
//! ```text
//! cost = prefill_weight × (uncached prompt tokens + queue_weight × in-flight prefill tokens
//!                          + eviction_weight × evicted tokens − image credit)
//!      + decode_weight  × in-flight decode tokens
//!      + prefill_weight × adapter_swap_tokens        (a LoRA adapter's request, on a worker where the
//!                                                     adapter is not active: `adapters.rs`)
//! uncached = prompt_tokens − overlap_blocks × block_size   (saturating)
//!            + unseen tokens outside the worker's overlap   (a fallback's images, as engines counted
//!                                                            them on earlier turns: `unseen.rs`)
//! evicted  = (new blocks − free blocks) × block_size        (saturating; 0 while the room is unknown)
//! image credit = Σ over the request's images of
//!                tokens × (image_encoder_weight × encoder-cache confidence   (images outside the
//!                                                                             cached prefix only)
//!                          + image_preprocess_weight × processor-cache confidence)
//! ```
//!
//! The image credit is the work a worker skips because its engine likely still holds an image the
//! request carries (its vision-encoder output, or its processed pixels) although the image's KV blocks
//! are gone or were never there (a new prefix around a known image): see `residency.rs`.
//!
//! The adapter term prefers, among the workers serving a request's LoRA adapter, those that have it
//! in one of their engine's LoRA slots (vLLM's `max_loras`) over those that would have to swap it in
//! (and evict another adapter). It is a fixed price in prefill tokens (default 256, 16 blocks of 16):
//! it decides between workers of equal overlap and load, and a worker caching more than that many
//! more tokens of the prompt still wins.
//!
//! The queue weighs less than the request's own uncached tokens (`queue_weight`, default 0.25): a queue
//! delays this request once, while the tokens a miss recomputes delay every request queued behind them
//! on that worker and store a second copy of a prefix; at weight 1 the greedy per-request cost spread
//! conversations away from their caches under load (docs/benchmarks.md, "Routing cost").
//!
//! The eviction term needs the worker's KV events (its fill and, once it has evicted, its capacity).
//! Without it, a prompt sharing a long prefix with one worker always goes there: with no load to
//! weigh against (one request at a time) every conversation piles onto that worker, which evicts the
//! others' history while the rest of the pool sits empty. Counting what a full worker would have to
//! evict sends new work to workers with room instead, and leaves a worker its hits when it has room.
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
    pub queue_weight: f64,
    pub eviction_weight: f64,
    pub temperature: f64,
    pub adapter_swap_tokens: f64,
}

impl Kv {
    fn cost(&self, c: &Candidates<'_>, worker: usize) -> f64 {
        let bs = u64::from(c.req.block_size);
        let overlap = u64::from(c.overlap_blocks.get(worker).copied().unwrap_or(0));
        // What engines counted beyond the plan's tokens (a fallback's images), and of it what is held.
        let unseen = u64::from(c.unseen.outside(worker));
        let uncached = u64::from(c.req.prompt_tokens).saturating_sub(overlap.saturating_mul(bs)) + unseen;
        let w = &c.workers[worker];
        let (prefill, decode) = w.queued_tokens();
        let evicted = match w.cache_room() {
            Some(room) => {
                let new_blocks = (c.req.blocks.len() as u64).saturating_sub(overlap) + unseen / bs.max(1);
                new_blocks.saturating_sub(room).saturating_mul(bs)
            }
            None => 0,
        };
        let swap = if c.adapter_cold.get(worker).copied().unwrap_or(false) { self.adapter_swap_tokens } else { 0.0 };
        self.prefill_weight
            * (uncached as f64 + self.queue_weight * prefill as f64 + self.eviction_weight * evicted as f64 + swap)
            + self.decode_weight * decode as f64
            - self.prefill_weight * c.image_credit.get(worker).copied().unwrap_or(0.0)
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
