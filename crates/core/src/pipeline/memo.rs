//! The rendered and tokenized prompts of recent request bodies, so a body sent again — a client's
//! retry, one prompt sent by many users, a monitoring probe — skips the chat template and the
//! tokenizer.
//!
//! Keyed by [`Request::body_digest`], an xxh3-128 digest of the body outside its images' URLs (an
//! image part renders as a placeholder whatever its URL): rendering and tokenizing read nothing else
//! that varies per request (the model, its template and its placeholder are the pipeline's own, and a
//! reload builds a new pipeline), so equal digests render equally — unless a template reads the clock
//! (`strftime_now`), and then the pipeline keeps no memo. A body with over 64 KiB outside its image
//! URLs has no digest: hashing it would cost more than a miss saves on traffic that never repeats.
//!
//! A body's prompt is kept the second time the body is seen; the first time only its digest is. Most
//! traffic never repeats, and keeping every one-off prompt's text and ids would only churn memory
//! (measured: a fifth of the router's CPU in page faults on unique ~2 000-token prompts).
//!
//! Bounded: two generations of at most [`GENERATION_ENTRIES`] digests and [`GENERATION_BYTES`] of
//! text and ids each; when the current one fills it becomes the old one and the older is dropped. A
//! hit in the old generation moves to the current one.
//!
//! [`Request::body_digest`]: crate::request::Request::body_digest

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::plan::ChatTokens;

const GENERATION_ENTRIES: usize = 4096;
/// Text bytes plus 4 bytes per id, per generation: at most 16 MiB in both.
const GENERATION_BYTES: usize = 8 << 20;

#[derive(Default)]
pub(crate) struct TokenMemo {
    gens: Mutex<Generations>,
}

/// What the memo knows of a body: its prompt, or only that it was seen once.
type Entry = Option<Arc<ChatTokens>>;

#[derive(Default)]
struct Generations {
    new: HashMap<u128, Entry>,
    old: HashMap<u128, Entry>,
    new_bytes: usize,
}

fn weight(e: &Entry) -> usize {
    16 + e.as_ref().map_or(0, |t| t.text.len() + 4 * t.ids.len() + 8 * t.placeholders.len())
}

/// A body's standing in the memo.
pub(crate) enum Lookup {
    Hit(Arc<ChatTokens>),
    /// Seen once before: keep its prompt now ([`TokenMemo::keep`]).
    Seen,
    /// Not seen lately: note it ([`TokenMemo::note`]).
    New,
}

impl TokenMemo {
    pub(crate) fn lookup(&self, key: u128) -> Lookup {
        let mut g = self.gens.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = match g.new.get(&key) {
            Some(e) => e.clone(),
            None => match g.old.remove(&key) {
                Some(e) => {
                    let _dropped = g.insert(key, e.clone());
                    e
                }
                None => return Lookup::New,
            },
        };
        entry.map_or(Lookup::Seen, Lookup::Hit)
    }

    /// The first sighting of a body: its digest only.
    pub(crate) fn note(&self, key: u128) {
        self.put(key, None);
    }

    /// A body seen again: its prompt.
    pub(crate) fn keep(&self, key: u128, tokens: Arc<ChatTokens>) {
        self.put(key, Some(tokens));
    }

    fn put(&self, key: u128, entry: Entry) {
        if weight(&entry) > GENERATION_BYTES {
            return;
        }
        // The dropped generation is freed after the lock is released.
        let _dropped = self.gens.lock().unwrap_or_else(PoisonError::into_inner).insert(key, entry);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        let g = self.gens.lock().unwrap();
        g.new.len() + g.old.len()
    }
}

impl Generations {
    /// Inserts, turning over the generations when the current one is full; returns what was dropped.
    fn insert(&mut self, key: u128, tokens: Entry) -> HashMap<u128, Entry> {
        let w = weight(&tokens);
        let mut dropped = HashMap::new();
        if self.new.len() >= GENERATION_ENTRIES || self.new_bytes + w > GENERATION_BYTES {
            dropped = std::mem::replace(&mut self.old, std::mem::take(&mut self.new));
            self.new_bytes = 0;
        }
        self.new_bytes += w;
        if let Some(replaced) = self.new.insert(key, tokens) {
            self.new_bytes -= weight(&replaced);
        }
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(n: usize) -> Arc<ChatTokens> {
        Arc::new(ChatTokens { ids: vec![7; n], placeholders: Vec::new(), text: "x".repeat(n) })
    }

    fn hit(memo: &TokenMemo, key: u128) -> Option<Arc<ChatTokens>> {
        match memo.lookup(key) {
            Lookup::Hit(t) => Some(t),
            _ => None,
        }
    }

    #[test]
    fn a_prompt_is_kept_at_its_second_sighting_and_old_hits_are_promoted() {
        let memo = TokenMemo::default();
        assert!(matches!(memo.lookup(1), Lookup::New));
        memo.note(1);
        assert!(matches!(memo.lookup(1), Lookup::Seen));
        memo.keep(1, tokens(3));
        assert_eq!(hit(&memo, 1).unwrap().ids, vec![7; 3]);
        assert!(matches!(memo.lookup(2), Lookup::New));
        for k in 10..10 + GENERATION_ENTRIES as u128 {
            memo.note(k); // key 1 turns old, then is promoted by the next lookup
        }
        assert!(hit(&memo, 1).is_some());
        for k in 50_000..50_000 + GENERATION_ENTRIES as u128 {
            memo.note(k);
        }
        assert!(hit(&memo, 1).is_some(), "promoted to the current generation, it survived one turnover");
    }

    #[test]
    fn stays_bounded_in_entries_and_bytes() {
        let memo = TokenMemo::default();
        for k in 0..(5 * GENERATION_ENTRIES) as u128 {
            memo.keep(k, tokens(1));
        }
        assert!(memo.len() <= 2 * GENERATION_ENTRIES);
        let big = GENERATION_BYTES / 5 / 3; // ~5 per generation
        for k in 0..40u128 {
            memo.keep(100_000 + k, tokens(big));
        }
        let g = memo.gens.lock().unwrap();
        let bytes: usize = g.new.values().chain(g.old.values()).map(weight).sum();
        assert!(bytes <= 2 * GENERATION_BYTES, "{bytes} bytes held");
        assert_eq!(g.new_bytes, g.new.values().map(weight).sum::<usize>());
        drop(g);
        memo.keep(1, tokens(GENERATION_BYTES)); // larger than a generation: not kept
        assert!(hit(&memo, 1).is_none());
    }
}
