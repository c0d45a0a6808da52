//! The policy trait every selection strategy implements, what a policy sees (the request and the
//! per-worker candidates), and the shared pickers (argmin with a random tie-break, softmax sampling).

use std::sync::Arc;

use rand::{Rng, RngCore};

use super::residency::ImageUse;
use super::unseen::Unseen;
use super::worker::Worker;

/// What `select` needs to know about a request.
pub struct SelectRequest<'a> {
    /// The prompt's chained block keys, in order.
    pub blocks: &'a [u64],
    pub block_size: u32,
    /// Prompt tokens, images expanded (for a text-prefix plan: what the router can count).
    pub prompt_tokens: u32,
    /// Expected decode tokens (e.g. `max_tokens`).
    pub decode_tokens: u32,
    /// The images of an exact plan (empty otherwise): what the image-residency credit weighs.
    pub images: Vec<ImageUse>,
    /// A text-prefix plan with images the router could not expand: its prefixes are looked up for the
    /// tokens engines counted in them (`unseen`).
    pub unseen: bool,
}

/// What a policy sees for one request; every slice is indexed by worker.
pub(crate) struct Candidates<'a> {
    pub req: &'a SelectRequest<'a>,
    /// The pool: a policy reads each worker's load (and cache room) where it scores it, once, rather
    /// than from snapshots taken in passes of their own (a select over 1024 workers paid for those).
    pub workers: &'a [Arc<Worker>],
    pub eligible: &'a [bool],
    pub overlap_blocks: &'a [u32],
    /// Prefill-token equivalents each worker saves through the images it likely still holds in its
    /// processor and encoder caches (see `residency`); all 0 without images.
    pub image_credit: &'a [f64],
    /// Tokens engines counted in the prompt beyond `req.prompt_tokens` (all 0 unless `req.unseen`).
    pub unseen: &'a Unseen,
    /// For a LoRA adapter's request: the workers that would have to swap it into a slot (see
    /// `adapters.rs`); empty for the base model.
    pub adapter_cold: &'a [bool],
}

/// A policy's choice and the per-worker score behind it (lower is better; NaN = not eligible).
pub(crate) struct Pick {
    pub worker: usize,
    pub costs: Vec<f64>,
}

/// One worker-selection strategy. Only eligible workers may be picked; `None` iff none is eligible.
pub(crate) trait Policy: Send + Sync {
    /// The `policy` value reported in a `Decision`.
    fn name(&self) -> &'static str;
    fn pick(&self, c: &Candidates<'_>, rng: &mut dyn RngCore) -> Option<Pick>;
}

/// Uniformly random among the workers with the lowest non-NaN cost (peers sent every tie to the first
/// worker and collapsed onto it). One pass counts the ties, one draw picks among them: with 1024
/// workers and no cache hit every worker ties, and a draw per tie would cost more than the rest.
pub(crate) fn argmin_random_tie(costs: &[f64], rng: &mut dyn RngCore) -> Option<usize> {
    let mut best = f64::INFINITY;
    let mut ties = 0usize;
    for &c in costs.iter().filter(|c| !c.is_nan()) {
        if ties == 0 || c < best {
            (best, ties) = (c, 1);
        } else if c == best {
            ties += 1;
        }
    }
    let nth = match ties {
        0 => return None,
        1 => 0,
        n => rng.random_range(0..n),
    };
    costs.iter().enumerate().filter(|&(_, &c)| c == best).nth(nth).map(|(i, _)| i)
}

/// Samples a worker with probability ∝ exp(−(c − c_min) / ((c_max − c_min) · temperature)) over the
/// non-NaN costs: normalising to [0, 1] makes `temperature` independent of the cost scale. Equal
/// costs (or a temperature ≤ 0) fall back to [`argmin_random_tie`].
pub(crate) fn softmax_sample(costs: &[f64], temperature: f64, rng: &mut dyn RngCore) -> Option<usize> {
    let valid = || costs.iter().copied().filter(|c| !c.is_nan());
    let min = valid().fold(f64::INFINITY, f64::min);
    let max = valid().fold(f64::NEG_INFINITY, f64::max);
    let span = max - min;
    // Written positively so NaN (which compares false) also takes the fallback.
    let spread = temperature > 0.0 && span > 0.0 && span.is_finite();
    if !spread {
        return argmin_random_tie(costs, rng);
    }
    let weight = |c: f64| if c.is_nan() { 0.0 } else { (-(c - min) / (span * temperature)).exp() };
    let total: f64 = costs.iter().map(|&c| weight(c)).sum();
    if !(total.is_finite() && total > 0.0) {
        return argmin_random_tie(costs, rng);
    }
    let mut r = rng.random::<f64>() * total;
    let mut last = None;
    for (i, &c) in costs.iter().enumerate() {
        if c.is_nan() {
            continue;
        }
        last = Some(i);
        r -= weight(c);
        if r < 0.0 {
            return Some(i);
        }
    }
    last // rounding left a sliver: the last valid worker
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmin_skips_nan_and_breaks_ties_at_random() {
        let mut rng = rand::rng();
        assert_eq!(argmin_random_tie(&[], &mut rng), None);
        assert_eq!(argmin_random_tie(&[f64::NAN, f64::NAN], &mut rng), None);
        assert_eq!(argmin_random_tie(&[f64::NAN, 3.0, 2.0, 5.0], &mut rng), Some(2));
        let mut seen = [0u32; 4];
        for _ in 0..2000 {
            let w = argmin_random_tie(&[1.0, 4.0, 1.0, 1.0], &mut rng).expect("a valid cost");
            seen[w] += 1;
        }
        assert_eq!(seen[1], 0);
        // Each tied worker expects ~667 picks; < 400 has probability far below 1e-20.
        for w in [0, 2, 3] {
            assert!(seen[w] > 400, "worker {w} chosen {} times: {seen:?}", seen[w]);
        }
    }

    #[test]
    fn softmax_spreads_but_favours_cheaper_workers() {
        let mut rng = rand::rng();
        let costs = [10.0, 20.0, f64::NAN, 30.0];
        let mut seen = [0u32; 4];
        for _ in 0..4000 {
            seen[softmax_sample(&costs, 1.0, &mut rng).expect("valid")] += 1;
        }
        // p ∝ exp(0), exp(−0.5), exp(−1): about 0.51, 0.31, 0.19 of 4000.
        assert_eq!(seen[2], 0);
        assert!(seen[0] > seen[1] && seen[1] > seen[3], "{seen:?}");
        assert!(seen[3] > 400, "{seen:?}");
        // Temperature 0 is the argmin.
        for _ in 0..100 {
            assert_eq!(softmax_sample(&costs, 0.0, &mut rng), Some(0));
        }
    }
}
