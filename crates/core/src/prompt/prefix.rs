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
//! assistant turns once a new user turn comes, so the prefix can end turns before. So a prompt keeps
//! every boundary, those of the prefix it reused too, but registers (adds entries for) only the ones
//! after that prefix when the prefix was found in the current generation: every boundary a prompt of
//! the current generation keeps has its entry there (by induction on this rule). A prefix found in the
//! old generation is registered whole again, so a conversation's boundaries age with the conversation,
//! not with the turn that first encoded them. Each entry touched is a likely cache miss in a large
//! map, so registering only new boundaries is what keeps a hit cheaper than the segment cache's
//! piece-by-piece lookups.
//!
//! Memory is bounded as in the segment cache: two generations; a generation takes prompts until it
//! holds [`GENERATION_IDS`] ids (each prompt's ids counted once, however many boundaries share them)
//! or [`GENERATION_BOUNDARIES`] kept boundaries (each 16 bytes in its prompt, and at most one entry),
//! then becomes the old one, dropping the previous old. So at most 2 × 4 Mi ids (32 MiB) and 2 × 32 Ki entries
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
    /// How many ids the text before it encodes to, once the encoder has passed it.
    pub ids: usize,
}

/// A kept boundary: the bytes of text before it, how many ids they encode to, and its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Kept {
    bytes: usize,
    ids: usize,
    key: u128,
}

/// One encoded prompt, shared by all its entries.
struct Prompt {
    ids: Box<[u32]>,
    /// Its boundaries (those of the prefix it reused included), ascending.
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
    /// The generation it was found in.
    epoch: u64,
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
    let mut out: Vec<Boundary> = (0..spans.len())
        .filter(|&i| spans[i].end >= MIN_PREFIX_BYTES && run_end(i))
        .map(|span| Boundary { bytes: spans[span].end, span, key: 0, ids: 0 })
        .collect();
    out.drain(..out.len().saturating_sub(MAX_BOUNDARIES));
    let mut hasher = Xxh3Default::new();
    let mut hashed = 0;
    for b in &mut out {
        hasher.update(&text.as_bytes()[hashed..b.bytes]);
        hashed = b.bytes;
        b.key = hasher.digest128();
    }
    out
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
    /// Boundaries kept by the prompts in `new` (its entries are at most as many).
    new_boundaries: usize,
    /// `new`'s number: one more at each rotation.
    epoch: u64,
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

    /// Keeps `ids`, the encoding of the text whose boundaries are `boundaries` (their `ids` set after
    /// `hit`'s prefix; within it they are the hit prompt's). One lock.
    pub(crate) fn insert(&self, ids: &[u32], boundaries: &[Boundary], hit: Option<&Hit>) {
        let nothing_new = hit.is_some_and(|h| h.fresh && h.boundary + 1 == boundaries.len());
        if nothing_new || boundaries.is_empty() || ids.len() > MAX_PROMPT_IDS {
            return;
        }
        let prefix = hit.map_or(0, Hit::bytes);
        let mut kept = Vec::with_capacity(boundaries.len());
        for b in boundaries {
            // A boundary inside the prefix the hit prompt did not keep has no known count: skipped.
            let count = if b.bytes <= prefix { hit.and_then(|h| h.ids_before(b.bytes)) } else { Some(b.ids) };
            if let Some(ids) = count {
                kept.push(Kept { bytes: b.bytes, ids, key: b.key });
            }
        }
        let inherited = kept.iter().take_while(|k| k.bytes <= prefix).count();
        let prompt = Arc::new(Prompt { ids: ids.into(), kept: kept.into() });
        let mut gens = self.gens.lock().unwrap_or_else(|e| e.into_inner());
        let dropped = gens.insert(prompt, inherited, hit.map(|h| h.epoch));
        drop(gens);
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
        let found = |e: &Entry, fresh: bool| {
            let epoch = if fresh { self.epoch } else { self.epoch.wrapping_sub(1) };
            let hit = Hit { prompt: e.prompt.clone(), at: e.at, boundary: index, epoch, fresh };
            (hit.bytes() == b.bytes).then_some(hit)
        };
        self.new.get(&b.key).and_then(|e| found(e, true)).or_else(|| self.old.get(&b.key).and_then(|e| found(e, false)))
    }

    /// Keeps `prompt` (the first `inherited` of its boundaries from the prefix found in generation
    /// `hit_epoch`) in `new`: registers its boundaries after that prefix, and the inherited ones too
    /// unless that prefix's generation is still `new`. Returns the generation this dropped (empty if
    /// none).
    fn insert(&mut self, prompt: Arc<Prompt>, inherited: usize, hit_epoch: Option<u64>) -> HashMap<u128, Entry> {
        let dropped = self.make_room(prompt.ids.len(), prompt.kept.len());
        let from = if hit_epoch == Some(self.epoch) { inherited } else { 0 };
        self.new_ids += prompt.ids.len();
        self.new_boundaries += prompt.kept.len();
        for (at, k) in prompt.kept.iter().enumerate().skip(from) {
            self.new.insert(k.key, Entry { prompt: prompt.clone(), at });
        }
        dropped
    }

    /// Rotates the generations if `new` cannot take a prompt of `ids` ids and `kept` boundaries;
    /// returns the generation dropped (empty if none).
    fn make_room(&mut self, ids: usize, kept: usize) -> HashMap<u128, Entry> {
        if self.new_ids + ids <= GENERATION_IDS && self.new_boundaries + kept <= GENERATION_BOUNDARIES {
            return HashMap::new();
        }
        self.new_ids = 0;
        self.new_boundaries = 0;
        self.epoch = self.epoch.wrapping_add(1);
        std::mem::replace(&mut self.old, std::mem::take(&mut self.new))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A prompt of `ids` ids whose boundaries have the keys `keys`.
    fn prompt(ids: usize, keys: &[u128]) -> Arc<Prompt> {
        let kept = keys.iter().enumerate().map(|(i, &key)| Kept { bytes: MIN_PREFIX_BYTES + i, ids: i.min(ids), key });
        Arc::new(Prompt { ids: vec![7u32; ids].into(), kept: kept.collect() })
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
            g.insert(prompt(MAX_PROMPT_IDS, &keys), 0, None);
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
            g.insert(prompt(1000, &keys), 0, None);
        }
        let (_, entries) = held(&g);
        assert!(entries <= 2 * GENERATION_BOUNDARIES, "{entries} entries");
        assert!(g.new_boundaries <= GENERATION_BOUNDARIES);
        assert!(g.new.contains_key(&key));
    }

    #[test]
    fn a_prefix_from_the_current_generation_adds_only_new_entries_one_from_the_old_all() {
        let mut g = Generations::default();
        let (a, b) = (prompt(10, &[1, 2]), prompt(20, &[1, 2, 3]));
        g.insert(a.clone(), 0, None);
        // `b` reused `a`'s prefix (its first two boundaries) found in this generation: only key 3 is new.
        g.insert(b.clone(), 2, Some(g.epoch));
        assert!(Arc::ptr_eq(&g.new[&2].prompt, &a) && Arc::ptr_eq(&g.new[&3].prompt, &b));
        // A generation later, a prompt reusing `b`'s prefix (found in the old one) registers it all.
        drop(g.make_room(GENERATION_IDS, 0));
        let old_epoch = g.epoch - 1;
        assert!(g.new.is_empty() && g.old.contains_key(&3));
        let c = prompt(30, &[1, 2, 3, 4]);
        g.insert(c.clone(), 3, Some(old_epoch));
        assert!([1, 2, 3, 4].iter().all(|k| Arc::ptr_eq(&g.new[k].prompt, &c)));
    }

    #[test]
    fn a_huge_prompt_is_not_kept() {
        let cache = PrefixCache::default();
        let text = "x".repeat(MIN_PREFIX_BYTES);
        let spans = [Span { start: text.len(), end: text.len() + 1, id: 1 }];
        let text = format!("{text}!");
        let mut bounds = boundaries(&text, &spans);
        assert_eq!(bounds.len(), 1);
        bounds[0].ids = 1;
        cache.insert(&vec![1; MAX_PROMPT_IDS + 1], &bounds, None);
        assert!(cache.lookup(&bounds).is_none());
        bounds[0].ids = 2;
        cache.insert(&[5, 1], &bounds, None);
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
