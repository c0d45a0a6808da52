//! Prefix reuse: a bounded cache of whole tokenized prompts, so that a growing conversation costs only
//! its new turn.
//!
//! A chat client resends the whole history each turn, so the rendered prompt of turn n+1 starts with
//! most of turn n's. Where the segment encoder splits the text at an added token, its ids are the ids
//! of the text before that point followed by the ids of the text after it (see `segments.rs`). So once
//! a prompt is encoded, each such *boundary* b gives a reusable prefix: the key xxh3-128(text[..b])
//! maps to the prompt's ids and how many of them text[..b] has. A later text whose own boundary has
//! the same key (and the same byte length) starts with those ids; only the rest is split and encoded.
//!
//! Boundaries are the ends of runs of adjacent added tokens (an image's thousands of `<|image_pad|>`
//! count once), from [`MIN_PREFIX_BYTES`] on, the last [`MAX_BOUNDARIES`] of a text. The longest
//! common one need not be the previous prompt's last: Qwen3's template drops the reasoning of earlier
//! assistant turns once a new user turn comes, so the prefix can end turns before. A prompt that reuses
//! a prefix registers the reused boundaries again, pointing at itself, so they age with the
//! conversation rather than with the turn that first encoded them.
//!
//! Memory is bounded as in the segment cache: two generations; a generation takes prompts until it
//! holds [`GENERATION_IDS`] ids (each prompt's ids counted once, however many boundaries share them)
//! or [`GENERATION_BOUNDARIES`] boundaries (each an entry and 16 bytes in its prompt), then becomes
//! the old one, dropping the previous old. So at most 2 × 4 Mi ids (32 MiB) and 2 × 32 Ki entries
//! (a few MiB with their maps) are held; a prompt over [`MAX_PROMPT_IDS`] is not kept at all.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use xxhash_rust::xxh3::Xxh3Default;

/// Prompts shorter than this are not looked up or kept, nor boundaries before it: the piecewise path
/// costs about as much.
pub(crate) const MIN_PREFIX_BYTES: usize = 256;
/// Boundaries per text (its last ones): bounds the hashing, lookups and entries one request costs.
const MAX_BOUNDARIES: usize = 256;
/// Ids held per generation (4 B each); two generations are kept.
const GENERATION_IDS: usize = 4 << 20;
/// Boundaries (cache entries) registered per generation.
const GENERATION_BOUNDARIES: usize = 32 << 10;
/// Longer prompts are not kept: one would take an eighth of a generation.
const MAX_PROMPT_IDS: usize = GENERATION_IDS / 8;

/// An added-token match of the text being encoded: its byte range and token id.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Span {
    pub start: usize,
    pub end: usize,
    pub id: u32,
}

/// A boundary of the text being encoded: the end of `spans[span]`, the xxh3-128 of the text before it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Boundary {
    pub bytes: usize,
    pub span: usize,
    key: u128,
}

/// A kept boundary: the bytes of text before it and how many ids they encode to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Kept {
    bytes: usize,
    ids: usize,
}

/// One encoded prompt, shared by all its entries.
struct Prompt {
    ids: Box<[u32]>,
    /// Its registered boundaries, ascending.
    kept: Box<[Kept]>,
}

struct Entry {
    prompt: Arc<Prompt>,
    /// Index into `prompt.kept`.
    at: usize,
}

/// A prefix found for a text.
pub(crate) struct Hit {
    prompt: Arc<Prompt>,
    at: usize,
    /// Index of the boundary in the text's [`boundaries`].
    pub boundary: usize,
    /// Found in the newer generation (so re-registering its boundaries would change nothing).
    fresh: bool,
}

impl Hit {
    /// The prefix's ids.
    pub(crate) fn ids(&self) -> &[u32] {
        &self.prompt.ids[..self.prompt.kept[self.at].ids]
    }

    /// The prefix's length in bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.prompt.kept[self.at].bytes
    }

    /// The ids of the text before `bytes` (a boundary within the prefix), if the prompt kept it.
    fn ids_before(&self, bytes: usize) -> Option<usize> {
        let kept = &self.prompt.kept[..=self.at];
        kept.binary_search_by_key(&bytes, |k| k.bytes).ok().map(|i| kept[i].ids)
    }
}

/// The boundaries of `text` (whose added-token matches are `spans`) worth a lookup, ascending, each
/// with its key: one streaming xxh3 pass up to the last one.
pub(crate) fn boundaries(text: &str, spans: &[Span]) -> Vec<Boundary> {
    let run_end = |i: usize| spans.get(i + 1).is_none_or(|next| next.start != spans[i].end);
    let ends: Vec<usize> = (0..spans.len()).filter(|&i| spans[i].end >= MIN_PREFIX_BYTES && run_end(i)).collect();
    let mut hasher = Xxh3Default::new();
    let mut hashed = 0;
    let last = &ends[ends.len().saturating_sub(MAX_BOUNDARIES)..];
    last.iter()
        .map(|&span| {
            let bytes = spans[span].end;
            hasher.update(&text.as_bytes()[hashed..bytes]);
            hashed = bytes;
            Boundary { bytes, span, key: hasher.digest128() }
        })
        .collect()
}

/// Encoded prompts by their boundaries' keys; see the module docs.
#[derive(Default)]
pub(crate) struct PrefixCache {
    gens: Mutex<Generations>,
    /// Lookups that found a prefix, for tests to check the cache is used.
    #[cfg(test)]
    hits: std::sync::atomic::AtomicUsize,
}

/// Two generations, as the segment cache's.
#[derive(Default)]
struct Generations {
    new: HashMap<u128, Entry>,
    old: HashMap<u128, Entry>,
    /// Ids of the prompts registered in `new` (each once).
    new_ids: usize,
    /// Boundaries registered in `new` (an entry each, replaced ones included).
    new_boundaries: usize,
}

impl PrefixCache {
    /// The longest of `boundaries` (the text's) that starts a kept prompt. One lock.
    pub(crate) fn lookup(&self, boundaries: &[Boundary]) -> Option<Hit> {
        let gens = self.gens.lock().unwrap_or_else(|e| e.into_inner());
        let hit = boundaries.iter().enumerate().rev().find_map(|(i, b)| gens.find(b, i));
        #[cfg(test)]
        if hit.is_some() {
            self.hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        hit
    }

    /// Keeps `ids`, the encoding of the text whose boundaries are `boundaries`, found with `hit`;
    /// `ids_after(span)` is how many ids precede the end of `spans[span]`, for each span after the hit's
    /// prefix (those within it are the hit prompt's). One lock.
    pub(crate) fn insert(
        &self,
        ids: &[u32],
        boundaries: &[Boundary],
        hit: Option<&Hit>,
        ids_after: impl Fn(usize) -> usize,
    ) {
        let nothing_new = hit.is_some_and(|h| h.fresh && h.boundary + 1 == boundaries.len());
        if nothing_new || boundaries.is_empty() || ids.len() > MAX_PROMPT_IDS {
            return;
        }
        let prefix = hit.map_or(0, Hit::bytes);
        let mut keys = Vec::with_capacity(boundaries.len());
        let mut kept = Vec::with_capacity(boundaries.len());
        for b in boundaries {
            // A boundary inside the prefix the hit prompt did not keep has no known count: skipped.
            let count =
                if b.bytes <= prefix { hit.and_then(|h| h.ids_before(b.bytes)) } else { Some(ids_after(b.span)) };
            if let Some(count) = count {
                keys.push(b.key);
                kept.push(Kept { bytes: b.bytes, ids: count });
            }
        }
        let prompt = Arc::new(Prompt { ids: ids.into(), kept: kept.into() });
        let dropped = self.gens.lock().unwrap_or_else(|e| e.into_inner()).insert(prompt, &keys);
        // Freed after the lock: a dropped generation can hold thousands of prompts.
        drop(dropped);
    }

    #[cfg(test)]
    pub(crate) fn hits(&self) -> usize {
        self.hits.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Generations {
    /// The entry for boundary `b` (the text's `index`-th), if one of the same length is kept.
    fn find(&self, b: &Boundary, index: usize) -> Option<Hit> {
        let found = |e: &Entry, fresh| {
            let hit = Hit { prompt: e.prompt.clone(), at: e.at, boundary: index, fresh };
            (hit.bytes() == b.bytes).then_some(hit)
        };
        self.new.get(&b.key).and_then(|e| found(e, true)).or_else(|| self.old.get(&b.key).and_then(|e| found(e, false)))
    }

    /// Registers `prompt` under `keys` (one per kept boundary), all in one generation; returns the
    /// generation this dropped (empty if none).
    fn insert(&mut self, prompt: Arc<Prompt>, keys: &[u128]) -> HashMap<u128, Entry> {
        let full = self.new_ids + prompt.ids.len() > GENERATION_IDS
            || self.new_boundaries + keys.len() > GENERATION_BOUNDARIES;
        let mut dropped = HashMap::new();
        if full {
            dropped = std::mem::replace(&mut self.old, std::mem::take(&mut self.new));
            self.new_ids = 0;
            self.new_boundaries = 0;
        }
        self.new_ids += prompt.ids.len();
        self.new_boundaries += keys.len();
        for (at, &key) in keys.iter().enumerate() {
            self.new.insert(key, Entry { prompt: prompt.clone(), at });
        }
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(ids: usize, kept: usize) -> Arc<Prompt> {
        let kept = (0..kept).map(|i| Kept { bytes: MIN_PREFIX_BYTES + i, ids: i.min(ids) }).collect();
        Arc::new(Prompt { ids: vec![7u32; ids].into(), kept })
    }

    /// The ids the generations hold, each prompt once, and their entries.
    fn held(g: &Generations) -> (usize, usize) {
        let mut seen = std::collections::HashSet::new();
        let ids = g
            .new
            .values()
            .chain(g.old.values())
            .filter(|e| seen.insert(Arc::as_ptr(&e.prompt)))
            .map(|e| e.prompt.ids.len())
            .sum();
        (ids, g.new.len() + g.old.len())
    }

    #[test]
    fn generations_stay_bounded_in_ids() {
        let mut g = Generations::default();
        let mut key = 0u128;
        for _ in 0..64 {
            let keys: Vec<u128> = (0..4)
                .map(|_| {
                    key += 1;
                    key
                })
                .collect();
            g.insert(prompt(MAX_PROMPT_IDS, 4), &keys);
        }
        let (ids, _) = held(&g);
        assert!(ids <= 2 * GENERATION_IDS, "{ids} ids held");
        assert!(g.new_ids <= GENERATION_IDS);
        // The newest prompt is still found; the oldest are gone.
        assert!(g.new.contains_key(&key));
        assert!(!g.new.contains_key(&1) && !g.old.contains_key(&1));
    }

    #[test]
    fn generations_stay_bounded_in_entries() {
        let mut g = Generations::default();
        let mut key = 0u128;
        for _ in 0..(4 * GENERATION_BOUNDARIES / MAX_BOUNDARIES) {
            let keys: Vec<u128> = (0..MAX_BOUNDARIES)
                .map(|_| {
                    key += 1;
                    key
                })
                .collect();
            g.insert(prompt(1000, MAX_BOUNDARIES), &keys);
        }
        let (_, entries) = held(&g);
        assert!(entries <= 2 * GENERATION_BOUNDARIES, "{entries} entries");
        assert!(g.new_boundaries <= GENERATION_BOUNDARIES);
        assert!(g.new.contains_key(&key));
    }

    #[test]
    fn a_huge_prompt_is_not_kept() {
        let cache = PrefixCache::default();
        let text = "x".repeat(MIN_PREFIX_BYTES);
        let spans = [Span { start: text.len(), end: text.len() + 1, id: 1 }];
        let text = format!("{text}!");
        let bounds = boundaries(&text, &spans);
        assert_eq!(bounds.len(), 1);
        cache.insert(&vec![1; MAX_PROMPT_IDS + 1], &bounds, None, |_| 1);
        assert!(cache.lookup(&bounds).is_none());
        cache.insert(&[5, 1], &bounds, None, |_| 2);
        assert_eq!(cache.lookup(&bounds).unwrap().ids(), [5, 1]);
    }

    #[test]
    fn boundaries_are_run_ends_past_the_minimum_and_the_last_ones() {
        let pad = |start: usize| Span { start, end: start + 1, id: 9 };
        // A run of three adjacent tokens ends once; a token before MIN_PREFIX_BYTES is no boundary.
        let text = "a".repeat(MIN_PREFIX_BYTES + 100);
        let spans = [pad(3), pad(MIN_PREFIX_BYTES), pad(MIN_PREFIX_BYTES + 1), pad(MIN_PREFIX_BYTES + 2), pad(300)];
        let ends: Vec<usize> = boundaries(&text, &spans).iter().map(|b| b.bytes).collect();
        assert_eq!(ends, [MIN_PREFIX_BYTES + 3, 301]);
        let text = "a".repeat(MIN_PREFIX_BYTES + 4 * MAX_BOUNDARIES);
        let spans: Vec<Span> = (0..2 * MAX_BOUNDARIES).map(|i| pad(MIN_PREFIX_BYTES + 2 * i)).collect();
        let got = boundaries(&text, &spans);
        assert_eq!(got.len(), MAX_BOUNDARIES);
        assert_eq!(got.last().unwrap().bytes, spans.last().unwrap().end);
        // Keys are the hashes of the text before each boundary.
        for b in &got {
            assert_eq!(b.key, xxhash_rust::xxh3::xxh3_128(&text.as_bytes()[..b.bytes]));
        }
    }
}
