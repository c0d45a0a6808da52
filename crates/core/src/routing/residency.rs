//! What a worker's engine keeps of the images it was sent outside its KV cache, modelled from the
//! router's own dispatches: vLLM's **processor cache** (decoded, resized, patchified pixels;
//! `--mm-processor-cache-gb`, LRU by bytes) and its **encoder cache** (vision-encoder outputs, sized in
//! encoder tokens). A worker holding an image in them skips decode and preprocessing, or the vision
//! encoder, for it. Stock engines publish nothing about either cache (no event, only the aggregate
//! `vllm:mm_cache_*` counters), so this is a model, not an observation: it cannot see the engine evict
//! for its own reasons, other clients of the same worker, or a restart.
//!
//! Each cache is an LRU over image identities (the key the router names the image by, which the
//! engine uses too on the exact route) with the engine's budget. A lookup returns a *confidence* in
//! [0, 1]: 1 for an image just sent, falling linearly to ½ as the distinct images sent after it fill the
//! rest of the budget (it is then next to be evicted), and 0 once the LRU has evicted it. Only exact plans feed it (a fallback names no image).

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

/// The confidence in an image the LRU still holds but will evict next: the router cannot see the
/// engine evict for other reasons, so it trusts the model's tail less than its head.
const MIN_HELD: f64 = 0.5;
/// Most newer entries one confidence lookup walks (a cache of many small images).
const NEWER_SCAN: usize = 256;

/// Processed-pixel bytes per encoder token as vLLM's processor cache sizes a Qwen-VL item: each
/// encoder token comes from merge² = 4 patches of 3 × 2 × 14 × 14 = 1176 float32 values (the HF image
/// processor's `pixel_values`), so 4 × 1176 × 4 bytes.
pub const PROCESSOR_BYTES_PER_TOKEN: u64 = 4 * 1176 * 4;

/// The size of one image's entry in the processor cache, from its encoder tokens: the one sizing rule
/// the router's model and the simulator share. Qwen3-VL's 16-pixel patches hold 1536 values (24 576
/// bytes per token): this rule undercounts them by about a quarter.
pub fn processor_item_bytes(encoder_tokens: u32) -> u64 {
    u64::from(encoder_tokens) * PROCESSOR_BYTES_PER_TOKEN
}

/// The budgets of a worker's two image caches (0 disables that cache's model).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageBudgets {
    pub encoder_tokens: u64,
    pub processor_bytes: u64,
}

impl ImageBudgets {
    /// vLLM's defaults for the Qwen-VL profiles: an encoder cache of max(max_num_batched_tokens, the
    /// largest image) = 16384 tokens, and `--mm-processor-cache-gb 4`.
    pub const VLLM_DEFAULT: ImageBudgets = ImageBudgets { encoder_tokens: 16_384, processor_bytes: 4 << 30 };
}

/// One image of a request as the residency model sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageUse {
    /// The image's identity (the key its KV blocks carry).
    pub key: u128,
    /// Encoder tokens (the image's feature tokens).
    pub tokens: u32,
    /// Prompt token offset where the image's run ends: a worker whose cached prefix reaches it
    /// already skips the image through its KV cache.
    pub end: u64,
}

/// How sure the model is that a worker still holds an image, per cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Held {
    pub encoder: f64,
    pub processor: f64,
}

/// A worker's two image caches.
#[derive(Debug)]
pub struct Residency {
    encoder: WeightedLru<u128>,
    processor: WeightedLru<u128>,
}

impl Residency {
    pub fn new(budgets: ImageBudgets) -> Residency {
        Residency {
            encoder: WeightedLru::new(budgets.encoder_tokens),
            processor: WeightedLru::new(budgets.processor_bytes),
        }
    }

    /// The worker was sent these images (in prompt order, as the engine processes them).
    pub fn sent(&mut self, images: &[ImageUse]) {
        for i in images {
            self.encoder.touch(i.key, u64::from(i.tokens));
            self.processor.touch(i.key, processor_item_bytes(i.tokens));
        }
    }

    pub fn held(&self, key: u128) -> Held {
        Held { encoder: self.encoder.confidence(&key), processor: self.processor.confidence(&key) }
    }

    /// Images the model holds in either cache.
    pub fn len(&self) -> usize {
        self.processor.len().max(self.encoder.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Keys with sizes within a budget, the least recently used evicted first: vLLM's processor and
/// encoder caches as the router models them (`Residency`) and as the simulator keeps them.
#[derive(Debug)]
pub struct WeightedLru<K> {
    budget: u64,
    used: u64,
    next: u64,
    entries: HashMap<K, Entry>,
    /// Keys by last use, oldest first (the eviction order).
    order: BTreeMap<u64, K>,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    size: u64,
    stamp: u64,
}

impl<K: Eq + Hash + Clone> WeightedLru<K> {
    pub fn new(budget: u64) -> WeightedLru<K> {
        WeightedLru { budget, used: 0, next: 0, entries: HashMap::new(), order: BTreeMap::new() }
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// The sizes held.
    pub fn used(&self) -> u64 {
        self.used
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn contains(&self, key: &K) -> bool {
        self.entries.contains_key(key)
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.order.clear();
        self.used = 0;
    }

    /// Uses `key` of `size`: true if it was held (it becomes the most recent); else stores it, evicting
    /// the least recent until it fits. An item of no size or larger than the whole budget is not kept
    /// (vLLM skips caching it).
    pub fn touch(&mut self, key: K, size: u64) -> bool {
        let stamp = self.next;
        self.next += 1;
        if let Some(e) = self.entries.get_mut(&key) {
            self.order.remove(&e.stamp);
            e.stamp = stamp;
            self.order.insert(stamp, key);
            return true;
        }
        if size == 0 || size > self.budget {
            return false;
        }
        while self.used + size > self.budget {
            let Some((_, victim)) = self.order.pop_first() else { break };
            if let Some(e) = self.entries.remove(&victim) {
                self.used -= e.size;
            }
        }
        self.used += size;
        self.entries.insert(key.clone(), Entry { size, stamp });
        self.order.insert(stamp, key);
        false
    }

    /// How sure a router can be that the cache still holds `key` (see the module docs).
    pub fn confidence(&self, key: &K) -> f64 {
        let Some(e) = self.entries.get(key) else { return 0.0 };
        // The distinct images sent after it: a pure LRU evicts it once they fill the room the rest of
        // the budget leaves. The walk is bounded: past NEWER_SCAN of them it counts as next in line.
        let mut newer = 0u64;
        for (n, (_, k)) in self.order.range(e.stamp + 1..).enumerate() {
            if n == NEWER_SCAN {
                return MIN_HELD;
            }
            newer += self.entries.get(k).map_or(0, |x| x.size);
        }
        match self.budget - e.size {
            0 => 1.0, // it fills the cache: anything sent after it would have evicted it
            room => 1.0 - (1.0 - MIN_HELD) * (newer as f64 / room as f64).min(1.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn img(key: u128, tokens: u32) -> ImageUse {
        ImageUse { key, tokens, end: 0 }
    }

    #[test]
    fn processor_items_are_sized_as_qwen_pixel_tensors() {
        assert_eq!(processor_item_bytes(1), 18_816);
        assert_eq!(processor_item_bytes(u32::MAX), u64::from(u32::MAX) * 18_816, "no overflow");
    }

    #[test]
    fn a_just_sent_image_is_held_with_full_confidence_and_decays_as_others_follow() {
        let mut r = Residency::new(ImageBudgets { encoder_tokens: 1000, processor_bytes: processor_item_bytes(1000) });
        r.sent(&[img(1, 100)]);
        assert_eq!(r.held(1), Held { encoder: 1.0, processor: 1.0 });
        r.sent(&[img(2, 450)]);
        let h = r.held(1);
        assert!((h.encoder - 0.75).abs() < 1e-9 && (h.processor - 0.75).abs() < 1e-9, "450 of the 900 left: {h:?}");
        r.sent(&[img(2, 450), img(2, 450)]);
        assert_eq!(r.held(1), h, "re-sending the same image moves nothing else closer to eviction");
        assert_eq!(r.held(3), Held::default(), "never sent");
    }

    #[test]
    fn eviction_follows_the_lru_by_each_caches_own_size() {
        // The encoder cache holds 300 tokens, the processor cache 1000 tokens' worth of bytes.
        let mut r = Residency::new(ImageBudgets { encoder_tokens: 300, processor_bytes: processor_item_bytes(1000) });
        r.sent(&[img(1, 200), img(2, 200)]);
        assert_eq!(r.held(1).encoder, 0.0, "evicted from the 300-token encoder cache");
        assert!(r.held(1).processor > 0.0, "still in the processor cache");
        r.sent(&[img(1, 200)]); // re-sent: most recent again, 2 becomes the oldest
        r.sent(&[img(3, 350), img(4, 350)]);
        assert_eq!(r.held(2).processor, 0.0, "the least recently sent goes first");
        assert!(r.held(1).processor > 0.0 && r.held(4).processor == 1.0);
    }

    #[test]
    fn the_lru_evicts_the_least_recently_used_by_size() {
        let mut lru = WeightedLru::new(10);
        assert!(!lru.touch("a", 4));
        assert!(!lru.touch("b", 4));
        assert!(lru.touch("a", 4), "a hit refreshes a");
        assert!(!lru.touch("c", 4), "c needs room: b, the least recent, goes");
        assert!(lru.contains(&"a") && !lru.contains(&"b") && lru.contains(&"c"));
        assert_eq!(lru.used(), 8);
        assert!(!lru.touch("big", 9), "9 needs both gone");
        assert!(!lru.contains(&"a") && !lru.contains(&"c"));
        assert!(!lru.touch("huge", 11) && !lru.contains(&"huge"), "larger than the cache: not kept");
        assert!(lru.contains(&"big"), "and nothing evicted for it");
        lru.clear();
        assert_eq!((lru.used(), lru.contains(&"big")), (0, false));
    }

    #[test]
    fn an_image_larger_than_a_cache_is_not_kept_and_a_zero_budget_keeps_nothing() {
        let mut r = Residency::new(ImageBudgets { encoder_tokens: 100, processor_bytes: 0 });
        r.sent(&[img(1, 150), img(2, 50)]);
        assert_eq!(r.held(1), Held::default());
        assert_eq!(r.held(2), Held { encoder: 1.0, processor: 0.0 });
    }
}
