//! vLLM's two image caches, as the simulated worker keeps them, and the image work a request has left
//! once they have answered ([`ImageWork`]).
//!
//! * The **processor cache** (`--mm-processor-cache-gb`, vLLM's default 4 GiB; 0 disables it): an LRU
//!   of processed images by identity (the part's `uuid`, else the engine's content hash: the
//!   [`SimImage`] identifier), each sized by [`processor_item_bytes`]. vLLM's front end queries it for
//!   every image of every request, before the engine knows anything of the prefix cache; a hit skips
//!   the preprocessing. Counted as `vllm:mm_cache_queries` / `vllm:mm_cache_hits` (items).
//! * The **encoder cache** (`--encoder-cache-tokens`): an LRU of encoder outputs by identity, sized in
//!   encoder tokens; a hit skips the vision encoder. As vLLM's scheduler does, an image whose whole
//!   placeholder run lies inside the cached prefix is neither encoded nor looked up: its tokens are
//!   already in the KV cache.
//!
//! Only the images a prompter names count (the exact prompter's accounted images): a request served
//! on its text prefix, or planned by the `WordPrompter`, has no image work.
//!
//! Simplifications: both caches are asked at admission (after the `--max-running` wait), where
//! vLLM's front end processes on arrival; an item larger than a whole cache is used and not kept
//! (vLLM sizes its encoder cache to hold the largest item); encoder outputs are not pinned while their
//! request runs (vLLM frees them once the prefill has read them, so only concurrent requests could
//! tell); a repeated image within one request hits on its second occurrence.

use std::collections::{BTreeMap, HashMap};

use crate::prompt::SimImage;
use crate::timing::ImageWork;

/// Values of one processed patch in the Qwen-VL family: 3 channels × 2 frames (temporal patch) × a
/// 14 × 14 patch.
const PATCH_VALUES: u64 = 3 * 2 * 14 * 14;
/// Patches merged into one encoder (feature) token: the 2 × 2 spatial merge.
const PATCHES_PER_TOKEN: u64 = 4;
/// The processor emits float32 pixel values.
const VALUE_BYTES: u64 = 4;

/// Bytes of one processed image of `tokens` encoder tokens in vLLM's processor cache: its pixel
/// tensor, `tokens` × 4 patches × 1176 float32 values = 18 816 bytes per token (the Qwen-VL rule,
/// 14-pixel patches). The one sizing rule, so that a router modelling a worker's processor cache
/// sizes its entries exactly as the simulator does. Qwen3-VL's 16-pixel patches hold 1536 values
/// (24 576 bytes per token): this rule undercounts them by about a quarter.
pub fn processor_item_bytes(tokens: u32) -> u64 {
    u64::from(tokens) * PATCHES_PER_TOKEN * PATCH_VALUES * VALUE_BYTES
}

/// What the image caches have counted since the worker started (restarts do not reset them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ImageCounts {
    /// Images looked up in the processor cache (none while it is disabled, as in vLLM).
    pub processor_queries: u64,
    pub processor_hits: u64,
    /// Images looked up in the encoder cache (those outside the cached prefix).
    pub encoder_queries: u64,
    pub encoder_hits: u64,
    /// Image tokens preprocessed (processor-cache misses).
    pub preprocessed_tokens: u64,
    /// Encoder tokens computed by the vision encoder.
    pub encoded_tokens: u64,
}

/// Both caches of one worker and their counts.
#[derive(Debug)]
pub(crate) struct ImageCaches {
    processor: Lru,
    encoder: Lru,
    counts: ImageCounts,
}

impl ImageCaches {
    pub fn new(processor_bytes: u64, encoder_tokens: u32) -> Self {
        Self {
            processor: Lru::new(processor_bytes),
            encoder: Lru::new(u64::from(encoder_tokens)),
            counts: ImageCounts::default(),
        }
    }

    /// Queries (and fills) both caches for a prompt's images, in prompt order, whose first
    /// `cached_tokens` tokens come from the prefix cache; returns the work left.
    pub fn admit(&mut self, images: &[SimImage], cached_tokens: u32) -> ImageWork {
        let mut work = ImageWork::default();
        for image in images {
            let tokens = u64::from(image.feature_tokens);
            if !self.processed(image) {
                work.preprocess_tokens += tokens;
            }
            if !inside_prefix(image, cached_tokens) && !self.encoded(image) {
                work.encode_tokens += tokens;
            }
        }
        self.counts.preprocessed_tokens += work.preprocess_tokens;
        self.counts.encoded_tokens += work.encode_tokens;
        work
    }

    /// An engine restart: both caches empty, counts kept.
    pub fn clear(&mut self) {
        self.processor.clear();
        self.encoder.clear();
    }

    pub fn counts(&self) -> ImageCounts {
        self.counts
    }

    /// Bytes held by the processor cache.
    pub fn processor_bytes(&self) -> u64 {
        self.processor.used()
    }

    /// Encoder tokens held by the encoder cache.
    pub fn encoder_tokens(&self) -> u64 {
        self.encoder.used()
    }

    /// True on a processor-cache hit. A disabled cache is not queried (vLLM then counts nothing).
    fn processed(&mut self, image: &SimImage) -> bool {
        if self.processor.capacity == 0 {
            return false;
        }
        self.counts.processor_queries += 1;
        let hit = self.processor.query(&image.identifier, processor_item_bytes(image.feature_tokens));
        self.counts.processor_hits += u64::from(hit);
        hit
    }

    /// True on an encoder-cache hit.
    fn encoded(&mut self, image: &SimImage) -> bool {
        self.counts.encoder_queries += 1;
        let hit = self.encoder.query(&image.identifier, u64::from(image.feature_tokens));
        self.counts.encoder_hits += u64::from(hit);
        hit
    }
}

/// vLLM's scheduler skips the encoder for an image whose run ends within the computed (cached) tokens.
fn inside_prefix(image: &SimImage, cached_tokens: u32) -> bool {
    u64::from(image.offset) + u64::from(image.len) <= u64::from(cached_tokens)
}

/// Identities with weights, least recently used evicted first, within a total weight.
#[derive(Debug)]
struct Lru {
    capacity: u64,
    used: u64,
    entries: HashMap<String, Entry>,
    /// Keys by last use, oldest first.
    order: BTreeMap<u64, String>,
    next_stamp: u64,
}

#[derive(Debug)]
struct Entry {
    weight: u64,
    stamp: u64,
}

impl Lru {
    fn new(capacity: u64) -> Self {
        Self { capacity, used: 0, entries: HashMap::new(), order: BTreeMap::new(), next_stamp: 0 }
    }

    /// True if `key` is held (it becomes the most recent); else stores it, evicting the least recent
    /// until it fits. An item heavier than the whole capacity is not stored.
    fn query(&mut self, key: &str, weight: u64) -> bool {
        let stamp = self.stamp();
        if let Some(entry) = self.entries.get_mut(key) {
            self.order.remove(&entry.stamp);
            entry.stamp = stamp;
            self.order.insert(stamp, key.to_owned());
            return true;
        }
        if weight > self.capacity {
            return false;
        }
        while self.used + weight > self.capacity && self.evict_oldest() {}
        self.used += weight;
        self.entries.insert(key.to_owned(), Entry { weight, stamp });
        self.order.insert(stamp, key.to_owned());
        false
    }

    fn stamp(&mut self) -> u64 {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        stamp
    }

    /// False when nothing is left to evict.
    fn evict_oldest(&mut self) -> bool {
        let Some((_, key)) = self.order.pop_first() else { return false };
        if let Some(entry) = self.entries.remove(&key) {
            self.used -= entry.weight;
        }
        true
    }

    fn used(&self) -> u64 {
        self.used
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.order.clear();
        self.used = 0;
    }

    #[cfg(test)]
    fn contains(&self, key: &str) -> bool {
        self.entries.contains_key(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(id: &str, offset: u32, tokens: u32) -> SimImage {
        SimImage { offset, len: tokens, identifier: id.to_owned(), feature_tokens: tokens }
    }

    #[test]
    fn processor_items_are_sized_as_qwen_pixel_tensors() {
        assert_eq!(processor_item_bytes(1), 18_816);
        assert_eq!(processor_item_bytes(300), 300 * 4 * 1176 * 4);
        assert_eq!(processor_item_bytes(u32::MAX), u64::from(u32::MAX) * 18_816, "no overflow");
    }

    #[test]
    fn lru_evicts_the_least_recently_used_by_weight() {
        let mut lru = Lru::new(10);
        assert!(!lru.query("a", 4));
        assert!(!lru.query("b", 4));
        assert!(lru.query("a", 4), "a hit refreshes a");
        assert!(!lru.query("c", 4), "c needs room: b, the least recent, goes");
        assert!(lru.contains("a") && !lru.contains("b") && lru.contains("c"));
        assert_eq!(lru.used(), 8);
        assert!(!lru.query("big", 9), "9 needs both gone");
        assert!(!lru.contains("a") && !lru.contains("c"));
        assert_eq!(lru.used(), 9);
        assert!(!lru.query("huge", 11) && !lru.contains("huge"), "heavier than the cache: not kept");
        assert!(lru.contains("big"), "and nothing evicted for it");
        lru.clear();
        assert_eq!((lru.used(), lru.contains("big")), (0, false));
    }

    #[test]
    fn repeated_image_hits_both_caches() {
        let mut caches = ImageCaches::new(1 << 30, 16_384);
        let first = caches.admit(&[image("x", 10, 300)], 0);
        assert_eq!(first, ImageWork { preprocess_tokens: 300, encode_tokens: 300 });
        let second = caches.admit(&[image("x", 50, 300)], 0);
        assert_eq!(second, ImageWork::default());
        let c = caches.counts();
        assert_eq!((c.processor_queries, c.processor_hits, c.encoder_queries, c.encoder_hits), (2, 1, 2, 1));
        assert_eq!((c.preprocessed_tokens, c.encoded_tokens), (300, 300));
        assert_eq!((caches.processor_bytes(), caches.encoder_tokens()), (processor_item_bytes(300), 300));
    }

    #[test]
    fn processor_cache_evicts_by_bytes() {
        // Room for one 300-token image and a half: the second evicts the first.
        let mut caches = ImageCaches::new(processor_item_bytes(450), 16_384);
        caches.admit(&[image("a", 0, 300)], 0);
        caches.admit(&[image("b", 0, 300)], 0);
        let again = caches.admit(&[image("a", 0, 300)], 0);
        assert_eq!(again.preprocess_tokens, 300, "a was evicted from the processor cache");
        assert_eq!(again.encode_tokens, 0, "the encoder cache still holds it");
        assert_eq!(caches.processor_bytes(), processor_item_bytes(300));
    }

    #[test]
    fn encoder_cache_evicts_by_tokens() {
        let mut caches = ImageCaches::new(1 << 30, 500);
        caches.admit(&[image("a", 0, 300)], 0);
        caches.admit(&[image("b", 0, 300)], 0);
        let again = caches.admit(&[image("a", 0, 300)], 0);
        assert_eq!(again, ImageWork { preprocess_tokens: 0, encode_tokens: 300 });
        assert_eq!(caches.encoder_tokens(), 300);
    }

    #[test]
    fn an_image_inside_the_cached_prefix_is_not_encoded_nor_looked_up() {
        let mut caches = ImageCaches::new(0, 0);
        // Run [16, 316): inside a 320-token cached prefix, not inside a 315-token one.
        let inside = caches.admit(&[image("a", 16, 300)], 320);
        assert_eq!(inside, ImageWork { preprocess_tokens: 300, encode_tokens: 0 }, "the front end still processes it");
        let partly = caches.admit(&[image("a", 16, 300)], 315);
        assert_eq!(partly.encode_tokens, 300, "a partly cached image is encoded whole");
        let c = caches.counts();
        assert_eq!((c.processor_queries, c.encoder_queries), (0, 1), "disabled processor cache: no queries");
    }

    #[test]
    fn encoder_work_counts_feature_tokens_not_the_run() {
        let mut caches = ImageCaches::new(0, 16_384);
        let wrapped = SimImage { offset: 0, len: 260, identifier: "g".into(), feature_tokens: 256 };
        assert_eq!(caches.admit(&[wrapped], 0), ImageWork { preprocess_tokens: 256, encode_tokens: 256 });
    }
}
