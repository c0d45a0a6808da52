//! Prefix reuse: a bounded cache of whole tokenized prompts, so that a growing conversation costs only
//! its new turn.
//!
//! A chat client resends the whole history each turn, so the rendered prompt of turn n+1 starts with
//! most of turn n's. Where the segment encoder splits a text at an added token, its ids are the ids of
//! the text before that point followed by the ids of the text after it (see `segments.rs`). So a kept
//! prompt's ids up to one of its *boundaries* (an added token's end) are the ids of any text that
//! starts with the same bytes and splits there too.
//!
//! Finding the boundaries of the new text would take a scan of all of it for added tokens, which costs
//! more than the segment cache's piece-by-piece lookups of the history it replaces. So texts are
//! matched at *checkpoints* instead: every [`CHECKPOINT_BYTES`] bytes, the xxh3-128 of the text so far
//! (one streaming pass; the last [`MAX_CHECKPOINTS`] of a text), each the key of an entry. The longest
//! checkpoint c of the new text that a kept prompt P shares gives text[..c] = P's text[..c] (a 128-bit
//! collision is taken as impossible, as in the segment cache). The prefix reused is P's text up to its
//! last boundary b with b + L ≤ c, L the longest added token: the split up to b depends only on the
//! bytes before b + L (leftmost-longest matching reads no further to decide a match ending at b), so the
//! new text splits there as P did. From b on, the text is scanned and encoded piecewise as usual (what
//! lies between b and the end of the history comes from the segment cache). The longest common
//! checkpoint need not be near the previous prompt's end: Qwen3's template drops the reasoning of
//! earlier assistant turns once a new user turn comes, so the prefix can end turns before.
//!
//! A prompt keeps its last [`MAX_BOUNDARIES`] boundaries (those of the prefix it reused included)
//! and its checkpoints, but adds entries only for the checkpoints after the one it was found by, when
//! that was found in the current generation: every checkpoint a prompt of the current generation holds
//! then has its entry there (by induction). A prefix found in the old generation is registered whole
//! again, so a conversation's entries age with the conversation, not with the turn that made them.
//! Each entry written is a likely cache miss in a large map, so a turn writes only a few.
//!
//! Memory is bounded as in the segment cache: two generations; a generation takes prompts until it
//! holds [`GENERATION_IDS`] ids (each prompt's ids counted once, however many entries share them) or
//! [`GENERATION_MARKS`] checkpoints and boundaries (each 16 or 32 bytes in its prompt, a checkpoint at
//! most one entry), then becomes the old one, dropping the previous old. So at most 2 × 4 Mi ids
//! (32 MiB) and 2 × 32 Ki marks (a few MiB with the maps) are held; a prompt over [`MAX_PROMPT_IDS`]
//! ids is not kept at all.

use std::collections::HashMap;
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex};

use xxhash_rust::xxh3::Xxh3Default;

/// A checkpoint every this many bytes of text; shorter texts are not looked up or kept.
pub(crate) const CHECKPOINT_BYTES: usize = 1024;
/// Checkpoints per text (its last ones): bounds the digests, lookups and entries of one request.
const MAX_CHECKPOINTS: usize = 256;
/// Boundaries a prompt keeps (its last ones).
const MAX_BOUNDARIES: usize = 256;
/// Ids held per generation (4 B each); two generations are kept.
const GENERATION_IDS: usize = 4 << 20;
/// Checkpoints and boundaries kept per generation.
const GENERATION_MARKS: usize = 32 << 10;
/// Longer prompts are not kept: one would take an eighth of a generation.
const MAX_PROMPT_IDS: usize = GENERATION_IDS / 8;

/// The xxh3-128 of a text's first `bytes` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    bytes: usize,
    key: u128,
}

/// The checkpoints of `text`, ascending: one streaming pass.
pub(crate) fn checkpoints(text: &str) -> Vec<Checkpoint> {
    let text = text.as_bytes();
    let last = text.len() / CHECKPOINT_BYTES;
    let first = last.saturating_sub(MAX_CHECKPOINTS) + 1;
    let mut hasher = Xxh3Default::new();
    hasher.update(&text[..(first - 1) * CHECKPOINT_BYTES]);
    (first..=last)
        .map(|i| {
            let bytes = i * CHECKPOINT_BYTES;
            hasher.update(&text[bytes - CHECKPOINT_BYTES..bytes]);
            Checkpoint { bytes, key: hasher.digest128() }
        })
        .collect()
}

/// Where a prompt splits: an added token's end, and how many ids the text before it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Boundary {
    pub bytes: usize,
    pub ids: usize,
}

/// One encoded prompt, shared by all its entries.
struct Prompt {
    ids: Box<[u32]>,
    /// Its last boundaries, ascending.
    boundaries: Box<[Boundary]>,
    /// Its checkpoints, ascending.
    checkpoints: Box<[Checkpoint]>,
}

/// A prefix found for a text.
pub(crate) struct Hit {
    prompt: Arc<Prompt>,
    /// Index into `prompt.boundaries` of the prefix's end.
    at: usize,
    /// The checkpoint it was found by (its `bytes`).
    checkpoint: usize,
    /// The generation it was found in, and whether that was the newer one.
    epoch: u64,
    fresh: bool,
}

impl Hit {
    /// The prefix's ids.
    pub(crate) fn ids(&self) -> &[u32] {
        &self.prompt.ids[..self.prompt.boundaries[self.at].ids]
    }

    /// The prefix's length in bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.prompt.boundaries[self.at].bytes
    }

    /// The kept prompt's boundaries within the prefix: the text's too.
    pub(crate) fn boundaries(&self) -> &[Boundary] {
        &self.prompt.boundaries[..=self.at]
    }

    /// The checkpoints the text shares with the kept prompt, which have entries already.
    fn shared(&self) -> RangeInclusive<usize> {
        self.prompt.checkpoints.first().map_or(0, |c| c.bytes)..=self.checkpoint
    }
}

/// Encoded prompts by their checkpoints; see the module docs.
#[derive(Default)]
pub(crate) struct PrefixCache {
    gens: Mutex<Generations>,
    /// Lookups that found a prefix, for tests and benchmarks to check the cache is used.
    hits: std::sync::atomic::AtomicUsize,
}

/// Two generations, as the segment cache's; an entry is a checkpoint's key → its prompt.
#[derive(Default)]
struct Generations {
    new: HashMap<u128, Arc<Prompt>>,
    old: HashMap<u128, Arc<Prompt>>,
    /// Ids of the prompts kept in `new` (each once).
    new_ids: usize,
    /// Checkpoints and boundaries of the prompts kept in `new`.
    new_marks: usize,
    /// `new`'s number: one more at each rotation.
    epoch: u64,
}

impl PrefixCache {
    /// The longest prefix of the text whose checkpoints are `checkpoints` that a kept prompt encoded,
    /// ending at one of its boundaries at least `reach` bytes before a checkpoint they share. One lock.
    pub(crate) fn lookup(&self, checkpoints: &[Checkpoint], reach: usize) -> Option<Hit> {
        let gens = self.gens.lock().unwrap_or_else(|e| e.into_inner());
        let hit = checkpoints.iter().rev().find_map(|c| gens.find(c, reach));
        if hit.is_some() {
            self.hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        hit
    }

    /// Keeps `ids`, the encoding of a text with `checkpoints` and `boundaries` (ascending; those within
    /// `hit`'s prefix are the hit prompt's). One lock.
    pub(crate) fn insert(
        &self,
        ids: &[u32],
        mut boundaries: Vec<Boundary>,
        checkpoints: &[Checkpoint],
        hit: Option<&Hit>,
    ) {
        let nothing_new = hit.is_some_and(|h| h.fresh && checkpoints.last().is_some_and(|c| c.bytes <= h.checkpoint));
        if nothing_new || checkpoints.is_empty() || ids.len() > MAX_PROMPT_IDS {
            return;
        }
        boundaries.drain(..boundaries.len().saturating_sub(MAX_BOUNDARIES));
        let prompt =
            Arc::new(Prompt { ids: ids.into(), boundaries: boundaries.into(), checkpoints: checkpoints.into() });
        let shared = hit.map(|h| (h.epoch, h.shared()));
        let mut gens = self.gens.lock().unwrap_or_else(|e| e.into_inner());
        let dropped = gens.insert(prompt, shared);
        drop(gens);
        // Freed after the lock: a dropped generation can hold thousands of prompts.
        drop(dropped);
    }

    pub(crate) fn hits(&self) -> usize {
        self.hits.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Generations {
    /// The prompt kept under checkpoint `c`, with its last boundary `reach` bytes before `c`.
    fn find(&self, c: &Checkpoint, reach: usize) -> Option<Hit> {
        let found = |prompt: &Arc<Prompt>, fresh: bool| {
            let at = prompt.boundaries.partition_point(|b| b.bytes + reach <= c.bytes).checked_sub(1)?;
            let epoch = if fresh { self.epoch } else { self.epoch.wrapping_sub(1) };
            Some(Hit { prompt: prompt.clone(), at, checkpoint: c.bytes, epoch, fresh })
        };
        let held = |p: &Arc<Prompt>| {
            let i = p.checkpoints.binary_search_by_key(&c.bytes, |k| k.bytes);
            i.is_ok_and(|i| p.checkpoints[i].key == c.key)
        };
        let new = self.new.get(&c.key).filter(|p| held(p)).and_then(|p| found(p, true));
        new.or_else(|| self.old.get(&c.key).filter(|p| held(p)).and_then(|p| found(p, false)))
    }

    /// Keeps `prompt` in `new` under its checkpoints, except those it shares with the prefix it was
    /// found by (`shared`: that prefix's generation and checkpoints) while that generation is `new`:
    /// they have their entries there already. Returns the generation this dropped (empty if none).
    fn insert(
        &mut self,
        prompt: Arc<Prompt>,
        shared: Option<(u64, RangeInclusive<usize>)>,
    ) -> HashMap<u128, Arc<Prompt>> {
        let marks = prompt.checkpoints.len() + prompt.boundaries.len();
        let dropped = self.make_room(prompt.ids.len(), marks);
        let skip = shared.filter(|(epoch, _)| *epoch == self.epoch).map(|(_, range)| range);
        self.new_ids += prompt.ids.len();
        self.new_marks += marks;
        for c in prompt.checkpoints.iter().filter(|c| !skip.as_ref().is_some_and(|r| r.contains(&c.bytes))) {
            self.new.insert(c.key, prompt.clone());
        }
        dropped
    }

    /// Rotates the generations if `new` cannot take a prompt of `ids` ids and `marks` checkpoints and
    /// boundaries; returns the generation dropped (empty if none).
    fn make_room(&mut self, ids: usize, marks: usize) -> HashMap<u128, Arc<Prompt>> {
        if self.new_ids + ids <= GENERATION_IDS && self.new_marks + marks <= GENERATION_MARKS {
            return HashMap::new();
        }
        self.new_ids = 0;
        self.new_marks = 0;
        self.epoch = self.epoch.wrapping_add(1);
        std::mem::replace(&mut self.old, std::mem::take(&mut self.new))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A prompt of `ids` ids with checkpoints keyed `keys` and a boundary before each.
    fn prompt(ids: usize, keys: &[u128]) -> Arc<Prompt> {
        let bytes = |i: usize| (i + 1) * CHECKPOINT_BYTES;
        let checkpoints = keys.iter().enumerate().map(|(i, &key)| Checkpoint { bytes: bytes(i), key }).collect();
        let boundaries = (0..keys.len()).map(|i| Boundary { bytes: bytes(i) - 100, ids: i.min(ids) }).collect();
        Arc::new(Prompt { ids: vec![7u32; ids].into(), boundaries, checkpoints })
    }

    /// The ids the generations hold, each prompt once, and their entries.
    fn held(g: &Generations) -> (usize, usize) {
        let mut seen = std::collections::HashSet::new();
        let all = g.new.values().chain(g.old.values());
        let ids = all.filter(|p| seen.insert(Arc::as_ptr(p))).map(|p| p.ids.len()).sum();
        (ids, g.new.len() + g.old.len())
    }

    fn keys(next: &mut u128, n: usize) -> Vec<u128> {
        (0..n)
            .map(|_| {
                *next += 1;
                *next
            })
            .collect()
    }

    #[test]
    fn generations_stay_bounded_in_ids() {
        let mut g = Generations::default();
        let mut next = 0;
        for _ in 0..64 {
            g.insert(prompt(MAX_PROMPT_IDS, &keys(&mut next, 4)), None);
        }
        let (ids, _) = held(&g);
        assert!(ids <= 2 * GENERATION_IDS, "{ids} ids held");
        assert!(g.new_ids <= GENERATION_IDS);
        // The newest prompt is still found; the oldest are gone.
        assert!(g.new.contains_key(&next));
        assert!(!g.new.contains_key(&1) && !g.old.contains_key(&1));
    }

    #[test]
    fn generations_stay_bounded_in_entries() {
        let mut g = Generations::default();
        let mut next = 0;
        for _ in 0..(4 * GENERATION_MARKS / MAX_CHECKPOINTS) {
            g.insert(prompt(1000, &keys(&mut next, MAX_CHECKPOINTS)), None);
        }
        let (_, entries) = held(&g);
        assert!(entries <= 2 * GENERATION_MARKS, "{entries} entries");
        assert!(g.new_marks <= GENERATION_MARKS);
        assert!(g.new.contains_key(&next));
    }

    #[test]
    fn a_prefix_from_the_current_generation_adds_only_new_entries_one_from_the_old_all() {
        let mut g = Generations::default();
        let (a, b) = (prompt(10, &[1, 2]), prompt(20, &[1, 2, 3]));
        g.insert(a.clone(), None);
        // `b` was found by `a`'s second checkpoint in this generation: only key 3 is new.
        let shared = |p: &Prompt, upto: usize| p.checkpoints[0].bytes..=p.checkpoints[upto].bytes;
        g.insert(b.clone(), Some((g.epoch, shared(&a, 1))));
        assert!(Arc::ptr_eq(&g.new[&2], &a) && Arc::ptr_eq(&g.new[&3], &b));
        // A generation later, a prompt found by `b`'s checkpoints (in the old one) registers them all.
        drop(g.make_room(GENERATION_IDS, 0));
        assert!(g.new.is_empty() && g.old.contains_key(&3));
        let c = prompt(30, &[1, 2, 3, 4]);
        g.insert(c.clone(), Some((g.epoch - 1, shared(&b, 2))));
        assert!([1, 2, 3, 4].iter().all(|k| Arc::ptr_eq(&g.new[k], &c)));
    }

    #[test]
    fn a_prefix_ends_at_a_boundary_out_of_reach_of_the_checkpoint() {
        let cache = PrefixCache::default();
        let text = "x".repeat(3 * CHECKPOINT_BYTES);
        let points = checkpoints(&text);
        let boundaries = vec![Boundary { bytes: 500, ids: 1 }, Boundary { bytes: 2 * CHECKPOINT_BYTES - 10, ids: 2 }];
        cache.insert(&[4, 5, 6], boundaries, &points, None);
        // Found by the last checkpoint: the boundary 10 bytes before the second is in reach of it.
        assert_eq!(cache.lookup(&points, 11).unwrap().ids(), [4, 5]);
        // Only by the first: the second boundary is past it.
        assert_eq!(cache.lookup(&points[..1], 11).unwrap().ids(), [4]);
        assert!(cache.lookup(&points[..1], CHECKPOINT_BYTES).is_none());
    }

    #[test]
    fn a_huge_prompt_is_not_kept() {
        let cache = PrefixCache::default();
        let text = "x".repeat(CHECKPOINT_BYTES);
        let points = checkpoints(&text);
        let boundaries = vec![Boundary { bytes: 10, ids: 1 }];
        cache.insert(&vec![1; MAX_PROMPT_IDS + 1], boundaries.clone(), &points, None);
        assert!(cache.lookup(&points, 1).is_none());
        cache.insert(&[5, 1], boundaries, &points, None);
        assert_eq!(cache.lookup(&points, 1).unwrap().ids(), [5]);
    }

    #[test]
    fn checkpoints_are_the_last_ones_and_hash_the_text_before_them() {
        let text: String =
            (0..(MAX_CHECKPOINTS + 10) * CHECKPOINT_BYTES + 5).map(|i| (b'a' + (i % 26) as u8) as char).collect();
        let got = checkpoints(&text);
        assert_eq!(got.len(), MAX_CHECKPOINTS);
        assert_eq!(got[0].bytes, 11 * CHECKPOINT_BYTES);
        assert_eq!(got.last().unwrap().bytes, (MAX_CHECKPOINTS + 10) * CHECKPOINT_BYTES);
        for c in [got[0], got[17], *got.last().unwrap()] {
            assert_eq!(c.key, xxhash_rust::xxh3::xxh3_128(&text.as_bytes()[..c.bytes]));
        }
        assert!(checkpoints(&text[..CHECKPOINT_BYTES - 1]).is_empty());
    }
}
