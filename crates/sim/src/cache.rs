//! The simulated worker's paged prefix KV cache, shaped like vLLM v1's prefix caching.
//!
//! * Only full blocks are cached, each under the chained key the prompter gives (a key encodes its
//!   whole prefix), so a prefix hit is the count of leading keys present, stopping at the first miss.
//! * Like vLLM, the whole prompt is never reported cached: the last token must be computed to get
//!   logits, so hits are capped at `(prompt_tokens − 1) / block_size` blocks. A prompt whose every block
//!   is cached therefore recomputes its last full block (vLLM needs block-aligned computed tokens).
//! * A running request pins its blocks (reference counts); blocks nobody pins stay cached in an LRU
//!   and are evicted least-recently-used when a new block needs room. A request frees its blocks in
//!   reverse order (as vLLM does), so a prompt's tail is evicted before its shared head.
//! * When every block is pinned the new block cannot be stored: the request still runs, but its
//!   remaining blocks are not cached (their chain is broken anyway).
//! * Usage (`vllm:kv_cache_usage_perc`) is pinned blocks / capacity. Simplification: only the full
//!   prompt blocks count; vLLM also holds the partial last block and the decode blocks.
//! * Each admission reports the keys it newly stored and the keys it evicted to make room, in the
//!   order it did so, so the KV-event publisher can announce exactly what changed (as vLLM announces
//!   newly cached blocks only, never those served from the cache).
//! * [`PrefixCache::clear`] empties the cache and starts a new epoch: leases taken before it must not
//!   be released into the new cache (their keys may have been stored again since).

use std::collections::{BTreeMap, HashMap};

/// What one request got from the cache.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Admission {
    /// Prompt tokens served from the cache (a multiple of the block size).
    pub cached_tokens: u32,
    /// Keys this request pinned, to hand back to [`PrefixCache::release`].
    pub pinned: Vec<u64>,
    /// Keys that were not cached and now are (a subset of `pinned`, in prompt order).
    pub stored: Vec<u64>,
    /// Keys evicted to make room, in eviction order (never one of `stored`: those are pinned).
    pub evicted: Vec<u64>,
}

/// What pinning one key did.
enum Pin {
    /// It was cached already.
    Hit,
    /// It was stored now.
    Stored,
    /// Every block is pinned: nothing could be stored.
    Full,
}

#[derive(Debug)]
struct Block {
    refs: u32,
    /// Position in the free LRU; `Some` exactly when `refs == 0`.
    free_stamp: Option<u64>,
}

#[derive(Debug)]
pub(crate) struct PrefixCache {
    block_size: usize,
    capacity: usize,
    blocks: HashMap<u64, Block>,
    /// Unpinned blocks by release order, oldest (first evicted) first.
    free: BTreeMap<u64, u64>,
    next_stamp: u64,
    pinned: usize,
    epoch: u64,
}

impl PrefixCache {
    pub fn new(block_size: usize, capacity: usize) -> Self {
        Self {
            block_size: block_size.max(1),
            capacity,
            blocks: HashMap::new(),
            free: BTreeMap::new(),
            next_stamp: 0,
            pinned: 0,
            epoch: 0,
        }
    }

    /// Looks up the prompt's prefix hit, then pins its blocks (storing the missing ones).
    pub fn admit(&mut self, prompt_tokens: u32, keys: &[u64]) -> Admission {
        let prompt = usize::try_from(prompt_tokens).unwrap_or(usize::MAX);
        // Keys beyond the prompt's full blocks cannot be real; ignore them rather than trust them.
        let keys = &keys[..keys.len().min(prompt / self.block_size)];
        let max_hit_blocks = prompt.saturating_sub(1) / self.block_size;
        let hits = keys.iter().take(max_hit_blocks).take_while(|k| self.blocks.contains_key(k)).count();
        // hits × block_size ≤ prompt_tokens − 1, so it fits in u32.
        let cached_tokens = u32::try_from(hits * self.block_size).unwrap_or(u32::MAX);
        let mut admission = Admission { cached_tokens, pinned: Vec::with_capacity(keys.len()), ..Admission::default() };
        for &key in keys {
            match self.pin(key, &mut admission.evicted) {
                Pin::Full => break,
                Pin::Hit => {}
                Pin::Stored => admission.stored.push(key),
            }
            admission.pinned.push(key);
        }
        admission
    }

    /// Forgets every block, pinned or not (a restarted engine), and starts a new epoch.
    pub fn clear(&mut self) {
        self.blocks.clear();
        self.free.clear();
        self.pinned = 0;
        self.epoch = self.epoch.wrapping_add(1);
    }

    /// Changes on every [`PrefixCache::clear`]: a lease is released only into the epoch it came from.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Unpins a finished request's blocks; they stay cached until evicted.
    pub fn release(&mut self, pinned: &[u64]) {
        for key in pinned.iter().rev() {
            let Some(block) = self.blocks.get_mut(key) else {
                continue;
            };
            block.refs = block.refs.saturating_sub(1);
            if block.refs == 0 && block.free_stamp.is_none() {
                let stamp = self.next_stamp;
                self.next_stamp = self.next_stamp.wrapping_add(1);
                block.free_stamp = Some(stamp);
                self.free.insert(stamp, *key);
                self.pinned = self.pinned.saturating_sub(1);
            }
        }
    }

    /// Fraction of the capacity pinned by running requests (0 when the cache has no capacity).
    pub fn usage(&self) -> f64 {
        if self.capacity == 0 {
            return 0.0;
        }
        self.pinned as f64 / self.capacity as f64
    }

    /// Blocks stored (pinned or free).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    #[cfg(test)]
    pub fn contains(&self, key: u64) -> bool {
        self.blocks.contains_key(&key)
    }

    fn pin(&mut self, key: u64, evicted: &mut Vec<u64>) -> Pin {
        if let Some(block) = self.blocks.get_mut(&key) {
            let Some(refs) = block.refs.checked_add(1) else {
                return Pin::Full;
            };
            if let Some(stamp) = block.free_stamp.take() {
                self.free.remove(&stamp);
                self.pinned += 1;
            }
            block.refs = refs;
            return Pin::Hit;
        }
        if self.blocks.len() >= self.capacity {
            let Some((_, victim)) = self.free.pop_first() else {
                return Pin::Full;
            };
            self.blocks.remove(&victim);
            evicted.push(victim);
        }
        self.blocks.insert(key, Block { refs: 1, free_stamp: None });
        self.pinned += 1;
        Pin::Stored
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BS: usize = 4;

    fn keys(range: std::ops::Range<u64>) -> Vec<u64> {
        range.collect()
    }

    #[test]
    fn repeat_prompt_hits_all_but_the_last_token_rule() {
        let mut c = PrefixCache::new(BS, 16);
        // 9 tokens = 2 full blocks + 1; the second time both blocks hit (8 ≤ 9 − 1).
        let a = c.admit(9, &keys(0..2));
        assert_eq!(a.cached_tokens, 0);
        c.release(&a.pinned);
        let b = c.admit(9, &keys(0..2));
        assert_eq!(b.cached_tokens, 8);
        c.release(&b.pinned);
        // 8 tokens = exactly 2 full blocks: the last block is recomputed, so only 4 are cached.
        let d = c.admit(8, &keys(0..2));
        assert_eq!(d.cached_tokens, 4);
    }

    #[test]
    fn hit_stops_at_first_miss() {
        let mut c = PrefixCache::new(BS, 16);
        let a = c.admit(17, &[1, 2, 3, 4]);
        c.release(&a.pinned);
        let b = c.admit(17, &[1, 2, 9, 4]);
        assert_eq!(b.cached_tokens, 8, "block 4 is present but after a miss");
        assert_eq!(b.pinned, vec![1, 2, 9, 4]);
    }

    #[test]
    fn lru_evicts_least_recently_released_tail_first() {
        let mut c = PrefixCache::new(BS, 4);
        let a = c.admit(13, &[1, 2, 3]);
        c.release(&a.pinned); // free order: 3, 2, 1 (tail first)
        let b = c.admit(9, &[7, 8]);
        assert!(c.contains(1) && c.contains(2) && !c.contains(3), "the tail block is evicted first");
        assert_eq!(c.len(), 4);
        c.release(&b.pinned);
        // Free order now: 2, 1, 8, 7. Touching 1 makes it the most recent; the next two insertions
        // evict 2 then 8.
        let d = c.admit(5, &[1]);
        c.release(&d.pinned);
        let e = c.admit(9, &[20, 21]);
        assert!(c.contains(1) && c.contains(7) && !c.contains(2) && !c.contains(8));
        assert_eq!(e.pinned.len(), 2);
    }

    #[test]
    fn pinned_blocks_are_never_evicted_and_full_cache_stops_caching() {
        let mut c = PrefixCache::new(BS, 2);
        let a = c.admit(9, &[1, 2]);
        assert_eq!(c.usage(), 1.0);
        let b = c.admit(13, &[5, 6, 7]);
        assert_eq!(b.cached_tokens, 0);
        assert!(b.pinned.is_empty(), "no room: the request runs uncached");
        assert!(c.contains(1) && c.contains(2));
        c.release(&b.pinned);
        c.release(&a.pinned);
        assert_eq!(c.usage(), 0.0);
    }

    #[test]
    fn shared_blocks_are_ref_counted() {
        let mut c = PrefixCache::new(BS, 4);
        let a = c.admit(9, &[1, 2]);
        let b = c.admit(9, &[1, 2]);
        assert_eq!(b.cached_tokens, 8, "blocks of a running request are shared");
        assert_eq!(c.usage(), 0.5);
        c.release(&a.pinned);
        assert_eq!(c.usage(), 0.5, "still pinned by the second request");
        c.release(&b.pinned);
        assert_eq!(c.usage(), 0.0);
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn zero_capacity_and_degenerate_prompts() {
        let mut c = PrefixCache::new(BS, 0);
        let a = c.admit(9, &[1, 2]);
        assert_eq!(a, Admission::default());
        assert_eq!(c.usage(), 0.0);
        let mut c = PrefixCache::new(BS, 8);
        assert_eq!(c.admit(0, &[1]).pinned, Vec::<u64>::new(), "keys beyond the prompt are ignored");
        assert_eq!(c.admit(5, &[1, 2, 3]).pinned, vec![1]);
    }

    #[test]
    fn admissions_report_new_and_evicted_keys() {
        let mut c = PrefixCache::new(BS, 3);
        let a = c.admit(13, &[1, 2, 3]);
        assert_eq!((a.stored.as_slice(), a.evicted.as_slice()), (&[1, 2, 3][..], &[][..]));
        c.release(&a.pinned); // free order: 3, 2, 1
        let b = c.admit(13, &[1, 2, 3]);
        assert!(b.stored.is_empty() && b.evicted.is_empty(), "hits are not announced again");
        c.release(&b.pinned);
        // Same head, new tail: the two new blocks evict the oldest free ones (3, then 2).
        let d = c.admit(13, &[1, 8, 9]);
        assert_eq!(d.stored, vec![8, 9]);
        assert_eq!(d.evicted, vec![3, 2]);
        assert_eq!(d.pinned, vec![1, 8, 9]);
    }

    #[test]
    fn a_present_key_after_a_miss_may_be_evicted_then_stored_again() {
        let mut c = PrefixCache::new(BS, 3);
        let a = c.admit(13, &[1, 2, 3]);
        c.release(&a.pinned); // free order: 3, 2, 1
        let b = c.admit(5, &[2]);
        c.release(&b.pinned); // free order: 3, 1, 2
                              // 7 misses and evicts 3 (the oldest free), which the same prompt then stores again.
        let d = c.admit(13, &[7, 3]);
        assert_eq!(d.evicted, vec![3, 1]);
        assert_eq!(d.stored, vec![7, 3]);
    }

    #[test]
    fn clear_forgets_everything_and_changes_the_epoch() {
        let mut c = PrefixCache::new(BS, 4);
        let a = c.admit(9, &[1, 2]);
        let epoch = c.epoch();
        c.clear();
        assert_ne!(c.epoch(), epoch);
        assert_eq!((c.len(), c.usage()), (0, 0.0));
        let b = c.admit(9, &[1, 2]);
        assert_eq!((b.cached_tokens, b.stored.len()), (0, 2), "a cleared cache stores the prompt afresh");
        drop(a);
    }
}
