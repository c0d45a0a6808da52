//! vLLM's two image caches, as the simulated worker keeps them, and the image work a request has left
//! once they have answered ([`ImageWork`]). Both are mmrouter-core's `WeightedLru`, the LRU the router's
//! residency model of a worker uses.
//!
//! * The **processor cache** (`--mm-processor-cache-gb`, vLLM's default 4 GiB; 0 disables it): an LRU
//!   of processed images by identity (the part's `uuid`, else the engine's content hash: the
//!   [`SimImage`] identifier), each sized by the router's own rule (`processor_item_bytes`). vLLM's
//!   front end queries it for every image of every request, before the engine knows anything of the
//!   prefix cache; a hit skips the preprocessing. Counted as `vllm:mm_cache_queries` / `vllm:mm_cache_hits` (items).
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

use mmrouter_core::routing::residency::{processor_item_bytes, WeightedLru};

use crate::prompt::SimImage;
use crate::timing::ImageWork;

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
    /// Encoder-cache misses served from `--ec-shared-storage` instead of the encoder.
    pub ec_loads: u64,
}

/// Both caches of one worker and their counts.
#[derive(Debug)]
pub(crate) struct ImageCaches {
    processor: WeightedLru<String>,
    encoder: WeightedLru<String>,
    counts: ImageCounts,
}

impl ImageCaches {
    pub fn new(processor_bytes: u64, encoder_tokens: u32) -> Self {
        Self {
            processor: WeightedLru::new(processor_bytes),
            encoder: WeightedLru::new(u64::from(encoder_tokens)),
            counts: ImageCounts::default(),
        }
    }

    /// Queries (and fills) both caches for a prompt's images, in prompt order, whose first
    /// `cached_tokens` tokens come from the prefix cache; returns the work left. `shared[i]`: image
    /// `i`'s encoder output is in `--ec-shared-storage`, loaded on an encoder-cache miss instead of
    /// encoded (missing entries: not there).
    pub fn admit(&mut self, images: &[SimImage], cached_tokens: u32, shared: &[bool]) -> ImageWork {
        let mut work = ImageWork::default();
        for (i, image) in images.iter().enumerate() {
            let tokens = u64::from(image.feature_tokens);
            if !self.processed(image) {
                work.preprocess_tokens += tokens;
            }
            if inside_prefix(image, cached_tokens) || self.encoded(image) {
                continue;
            }
            if shared.get(i).copied().unwrap_or(false) {
                // vLLM's ECExampleConnector logs the same line when a consumer loads an image.
                tracing::debug!("Success load encoder cache for hash {}", image.identifier);
                self.counts.ec_loads += 1;
            } else {
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
        if self.processor.budget() == 0 {
            return false;
        }
        self.counts.processor_queries += 1;
        let hit = self.processor.touch(image.identifier.clone(), processor_item_bytes(image.feature_tokens));
        self.counts.processor_hits += u64::from(hit);
        hit
    }

    /// True on an encoder-cache hit.
    fn encoded(&mut self, image: &SimImage) -> bool {
        self.counts.encoder_queries += 1;
        let hit = self.encoder.touch(image.identifier.clone(), u64::from(image.feature_tokens));
        self.counts.encoder_hits += u64::from(hit);
        hit
    }
}

/// vLLM's scheduler skips the encoder for an image whose run ends within the computed (cached) tokens.
fn inside_prefix(image: &SimImage, cached_tokens: u32) -> bool {
    u64::from(image.offset) + u64::from(image.len) <= u64::from(cached_tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(id: &str, offset: u32, tokens: u32) -> SimImage {
        SimImage { offset, len: tokens, identifier: id.to_owned(), feature_tokens: tokens, ..SimImage::default() }
    }

    #[test]
    fn repeated_image_hits_both_caches() {
        let mut caches = ImageCaches::new(1 << 30, 16_384);
        let first = caches.admit(&[image("x", 10, 300)], 0, &[]);
        assert_eq!(first, ImageWork { preprocess_tokens: 300, encode_tokens: 300 });
        let second = caches.admit(&[image("x", 50, 300)], 0, &[]);
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
        caches.admit(&[image("a", 0, 300)], 0, &[]);
        caches.admit(&[image("b", 0, 300)], 0, &[]);
        let again = caches.admit(&[image("a", 0, 300)], 0, &[]);
        assert_eq!(again.preprocess_tokens, 300, "a was evicted from the processor cache");
        assert_eq!(again.encode_tokens, 0, "the encoder cache still holds it");
        assert_eq!(caches.processor_bytes(), processor_item_bytes(300));
    }

    #[test]
    fn encoder_cache_evicts_by_tokens() {
        let mut caches = ImageCaches::new(1 << 30, 500);
        caches.admit(&[image("a", 0, 300)], 0, &[]);
        caches.admit(&[image("b", 0, 300)], 0, &[]);
        let again = caches.admit(&[image("a", 0, 300)], 0, &[]);
        assert_eq!(again, ImageWork { preprocess_tokens: 0, encode_tokens: 300 });
        assert_eq!(caches.encoder_tokens(), 300);
    }

    #[test]
    fn an_image_inside_the_cached_prefix_is_not_encoded_nor_looked_up() {
        let mut caches = ImageCaches::new(0, 0);
        // Run [16, 316): inside a 320-token cached prefix, not inside a 315-token one.
        let inside = caches.admit(&[image("a", 16, 300)], 320, &[]);
        assert_eq!(inside, ImageWork { preprocess_tokens: 300, encode_tokens: 0 }, "the front end still processes it");
        let partly = caches.admit(&[image("a", 16, 300)], 315, &[]);
        assert_eq!(partly.encode_tokens, 300, "a partly cached image is encoded whole");
        let c = caches.counts();
        assert_eq!((c.processor_queries, c.encoder_queries), (0, 1), "disabled processor cache: no queries");
    }

    #[test]
    fn an_image_in_the_shared_storage_is_loaded_not_encoded() {
        let mut caches = ImageCaches::new(1 << 30, 16_384);
        let work = caches.admit(&[image("a", 0, 300), image("b", 400, 200)], 0, &[true, false]);
        assert_eq!(work, ImageWork { preprocess_tokens: 500, encode_tokens: 200 });
        let again = caches.admit(&[image("a", 0, 300)], 0, &[true]);
        assert_eq!(again, ImageWork::default(), "loaded once, then an encoder-cache hit");
        let c = caches.counts();
        assert_eq!((c.ec_loads, c.encoder_queries, c.encoder_hits, c.encoded_tokens), (1, 3, 1, 200));
        let inside = caches.admit(&[image("c", 0, 100)], 200, &[true]);
        assert_eq!((inside.encode_tokens, caches.counts().ec_loads), (0, 1), "inside the prefix: no load");
    }

    #[test]
    fn encoder_work_counts_feature_tokens_not_the_run() {
        let mut caches = ImageCaches::new(0, 16_384);
        let wrapped =
            SimImage { offset: 0, len: 260, identifier: "g".into(), feature_tokens: 256, ..SimImage::default() };
        assert_eq!(caches.admit(&[wrapped], 0, &[]), ImageWork { preprocess_tokens: 256, encode_tokens: 256 });
    }
}
