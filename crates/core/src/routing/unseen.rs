//! **Unseen tokens**: what the engines counted inside a text-prefix plan's prefix that the router
//! could not. A request whose image fails (too large, unsupported) routes on keys over its prompt with
//! each image left as one placeholder token, so the router counts a 16 000-token photo as 1 token: on
//! the conversation's next turn the worker holding it looks barely better than an idle one, and a
//! little load sends the turn away to recompute the photo. The engine's answer says what the prompt
//! really cost (`usage.prompt_tokens`); the difference is remembered against the plan's last block
//! key, so a later prompt that extends that prefix weighs it at the engine's count.
//!
//! Nothing of any image is kept: no identity, no per-image count, only "the prefix ending at this
//! key held this many more tokens than its unexpanded text" (the mission's fallback rule). A worker
//! (or a peer replica) that misreports skews only the weight of the prefixes it reports on, and by at
//! most [`MAX_UNSEEN`] tokens.
//!
//! Bounded: two generations of at most `capacity / 2` keys each; when the current one fills, the older
//! is dropped (an approximate LRU at a map lookup per access).

use std::collections::HashMap;

use parking_lot::Mutex;

/// Learnt prefixes kept by default (about 1.5 MiB at most).
pub const DEFAULT_CAPACITY: usize = 65_536;

/// Most unseen tokens one prefix is credited with: more than any model's context, so only a
/// misreported usage is cut.
pub const MAX_UNSEEN: u32 = 1 << 20;

pub struct UnseenTokens {
    half: usize,
    gens: Mutex<Generations>,
}

#[derive(Default)]
struct Generations {
    current: HashMap<u64, u32>,
    previous: HashMap<u64, u32>,
}

impl UnseenTokens {
    pub fn new(capacity: usize) -> UnseenTokens {
        UnseenTokens { half: (capacity / 2).max(1), gens: Mutex::new(Generations::default()) }
    }

    /// The prefix ending at block `key` held `tokens` more tokens than the router counted.
    pub fn learn(&self, key: u64, tokens: u32) {
        let mut g = self.gens.lock();
        g.previous.remove(&key);
        self.insert(&mut g, key, tokens.min(MAX_UNSEEN));
    }

    fn insert(&self, g: &mut Generations, key: u64, tokens: u32) {
        if g.current.len() >= self.half && !g.current.contains_key(&key) {
            g.previous = std::mem::take(&mut g.current);
        }
        g.current.insert(key, tokens);
    }

    /// Every learnt prefix along `blocks`: (block index, unseen tokens up to and including it), in
    /// order. A hit in the older generation moves to the current one.
    pub fn along(&self, blocks: &[u64]) -> Vec<(usize, u32)> {
        let mut g = self.gens.lock();
        let mut found = Vec::new();
        for (i, key) in blocks.iter().enumerate() {
            if let Some(&t) = g.current.get(key) {
                found.push((i, t));
            } else if let Some(t) = g.previous.remove(key) {
                self.insert(&mut g, *key, t);
                found.push((i, t));
            }
        }
        found
    }

    pub fn len(&self) -> usize {
        let g = self.gens.lock();
        g.current.len() + g.previous.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a request's learnt prefixes add: per worker, the unseen tokens inside the blocks it holds
/// (the deepest learnt prefix within its overlap), and in all, those of the deepest learnt prefix
/// (the prompt extends it, so it carries at least those).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Unseen {
    pub per_worker: Vec<u32>,
    pub total: u32,
}

impl Unseen {
    /// `found` as [`UnseenTokens::along`] returns it; `overlap_blocks` per worker.
    pub fn weigh(found: &[(usize, u32)], overlap_blocks: &[u32]) -> Unseen {
        let within = |k: u32| found.iter().rev().find(|&&(i, _)| i < k as usize).map_or(0, |&(_, t)| t);
        Unseen {
            per_worker: overlap_blocks.iter().map(|&k| within(k)).collect(),
            total: found.iter().map(|&(_, t)| t).max().unwrap_or(0),
        }
    }

    pub fn worker(&self, w: usize) -> u32 {
        self.per_worker.get(w).copied().unwrap_or(0)
    }

    /// Of the prompt's unseen tokens, those `w` does not hold: its prefill if sent there.
    pub fn outside(&self, w: usize) -> u32 {
        self.total.saturating_sub(self.worker(w))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_learnt_prefixes_along_a_longer_prompt() {
        let u = UnseenTokens::new(16);
        u.learn(3, 1000);
        u.learn(7, 2500);
        assert_eq!(u.along(&[1, 2, 3, 4, 5, 6, 7, 8]), vec![(2, 1000), (6, 2500)]);
        assert!(u.along(&[9, 10]).is_empty());
        u.learn(9, u32::MAX); // a misreported usage
        assert_eq!(u.along(&[9]), vec![(0, MAX_UNSEEN)]);
    }

    #[test]
    fn a_worker_is_credited_only_with_prefixes_inside_its_overlap() {
        let found = [(2, 1000), (6, 2500)];
        let w = Unseen::weigh(&found, &[0, 2, 3, 7, 8]);
        assert_eq!(w.per_worker, vec![0, 0, 1000, 2500, 2500]);
        assert_eq!(w.total, 2500);
        assert_eq!(Unseen::weigh(&[], &[4]), Unseen { per_worker: vec![0], total: 0 });
    }

    #[test]
    fn stays_within_its_capacity_and_keeps_what_is_used() {
        let u = UnseenTokens::new(4);
        u.learn(1, 10);
        u.learn(2, 20);
        u.learn(3, 30); // the first generation (1, 2) becomes the older one
        assert_eq!(u.along(&[1]), vec![(0, 10)]); // used: back in the current generation
        u.learn(4, 40); // current (3, 1) is full: it becomes the older one, (2) is dropped
        u.learn(5, 50);
        assert!(u.len() <= 4);
        assert!(u.along(&[2]).is_empty());
        assert_eq!(u.along(&[1]), vec![(0, 10)]);
    }
}
