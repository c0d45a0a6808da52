//! Data URLs sent again: a conversation resends its images with every turn, and many users send the
//! same picture. An image seen twice is kept, with its URL text, so later sightings skip the base64
//! decode and the BLAKE3 pass (together ~20 % of the router's CPU on a 150 KB image request).
//!
//! **A hit is the same text, byte for byte.** The key only narrows the search (the length and an
//! xxh3 of a few samples of the text: hashing the whole text would cost a third of what a hit saves);
//! the kept text is then compared whole. So no collision, accidental or crafted, can ever give an
//! image another's identity — the identity is the `uuid` vLLM trusts across every tenant of a worker.
//! A key that matches different text is a miss.
//!
//! Kept at the second sighting (the first records the key only): most images never come back, and
//! copying each would churn memory. Bounded: two generations (`crate::generations`) of at most
//! [`GENERATION_ENTRIES`] images and half of `media.data_url_memo_mb` of text each.

use std::sync::{Arc, Mutex, PoisonError};

use crate::generations::Generations;
use crate::media::image::ImageInfo;

const GENERATION_ENTRIES: usize = 4096;
/// Bytes of the text sampled from each end and the middle for the key.
const SAMPLE: usize = 1024;

pub(crate) struct ResentImages {
    gens: Option<Mutex<Generations<Entry>>>,
}

/// A kept image, or only the note that its key was seen once.
type Entry = Option<Arc<Kept>>;

pub(crate) struct Kept {
    text: Box<str>,
    info: ImageInfo,
}

fn weight(e: &Entry) -> usize {
    64 + e.as_ref().map_or(0, |k| k.text.len())
}

/// What [`ResentImages::lookup`] found for a URL.
pub(crate) enum Lookup {
    /// The same text was kept: its image.
    Hit(ImageInfo),
    /// Worth keeping once read ([`ResentImages::keep`]): seen once before.
    Again(u128),
    /// Not seen lately ([`ResentImages::note`] it), or no memo.
    New(Option<u128>),
}

impl ResentImages {
    /// `memo_bytes` of text in all (0: no memo).
    pub(crate) fn new(memo_bytes: usize) -> ResentImages {
        let gens = (memo_bytes > 0).then(|| Mutex::new(Generations::new(GENERATION_ENTRIES, memo_bytes / 2, weight)));
        ResentImages { gens }
    }

    pub(crate) fn lookup(&self, url: &str) -> Lookup {
        let Some(gens) = &self.gens else { return Lookup::New(None) };
        let key = key(url);
        let entry = gens.lock().unwrap_or_else(PoisonError::into_inner).get(key);
        match entry {
            // Compared outside the lock: a few microseconds for a large image.
            Some(Some(kept)) if *kept.text == *url => Lookup::Hit(kept.info.clone()),
            Some(_) => Lookup::Again(key),
            None => Lookup::New(Some(key)),
        }
    }

    /// The first sighting of `key`: noted only.
    pub(crate) fn note(&self, key: u128) {
        self.put(key, None);
    }

    /// The second sighting: the text and what it decoded to.
    pub(crate) fn keep(&self, key: u128, url: &str, info: &ImageInfo) {
        self.put(key, Some(Arc::new(Kept { text: url.into(), info: info.clone() })));
    }

    fn put(&self, key: u128, entry: Entry) {
        if let Some(gens) = &self.gens {
            // The dropped generation is freed after the lock is released.
            let _dropped = gens.lock().unwrap_or_else(PoisonError::into_inner).insert(key, entry);
        }
    }
}

/// The length and an xxh3 of the text's head, middle and tail (the whole text when it is short).
fn key(url: &str) -> u128 {
    let b = url.as_bytes();
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    if b.len() <= 3 * SAMPLE {
        h.update(b);
    } else {
        let mid = b.len() / 2 - SAMPLE / 2;
        [&b[..SAMPLE], &b[mid..mid + SAMPLE], &b[b.len() - SAMPLE..]].iter().for_each(|s| h.update(s));
    }
    (u128::from(h.digest()) << 64) | b.len() as u128
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::ImageDigest;
    use crate::media::image::Source;

    fn info(n: u8) -> ImageInfo {
        let digest = ImageDigest([n; 32]);
        ImageInfo { digest, width: 1, height: 1, format: "png", bytes: 1, source: Source::DataUrl, transposed: false }
    }

    fn seen_twice(memo: &ResentImages, url: &str, n: u8) {
        let Lookup::New(Some(key)) = memo.lookup(url) else { panic!("new") };
        memo.note(key);
        let Lookup::Again(key) = memo.lookup(url) else { panic!("again") };
        memo.keep(key, url, &info(n));
    }

    #[test]
    fn an_image_is_kept_at_its_second_sighting() {
        let memo = ResentImages::new(1 << 20);
        let url = format!("data:image/png;base64,{}", "A".repeat(10_000));
        seen_twice(&memo, &url, 7);
        assert!(matches!(memo.lookup(&url), Lookup::Hit(i) if i.digest == info(7).digest));
        assert!(matches!(ResentImages::new(0).lookup(&url), Lookup::New(None)), "0 bytes: no memo");
    }

    #[test]
    fn text_that_only_shares_the_key_is_a_miss() {
        let memo = ResentImages::new(1 << 20);
        let a = format!("data:image/png;base64,{}", "A".repeat(10_000));
        // Same length, same sampled head, middle and tail: the same key, other text.
        let mut b = a.clone().into_bytes();
        b[2000] = b'B';
        let b = String::from_utf8(b).unwrap();
        assert_eq!(key(&a), key(&b));
        seen_twice(&memo, &a, 7);
        assert!(matches!(memo.lookup(&b), Lookup::Again(_)), "compared whole, it is not the kept image");
        assert!(matches!(memo.lookup(&a), Lookup::Hit(_)));
    }

    #[test]
    fn bounded_by_the_memo_size() {
        let memo = ResentImages::new(64 * 1024);
        let url = |i: usize| format!("data:image/png;base64,{i:08}{}", "A".repeat(20_000));
        for i in 0..20 {
            seen_twice(&memo, &url(i), 1);
        }
        let gens = memo.gens.as_ref().unwrap().lock().unwrap();
        assert!(gens.weight() <= 64 * 1024, "{}", gens.weight());
    }
}
