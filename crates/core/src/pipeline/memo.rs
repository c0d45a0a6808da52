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
//! Bounded: two generations of at most [`GENERATION_ENTRIES`] prompts and [`GENERATION_BYTES`] of
//! text and ids each; when the current one fills it becomes the old one and the older is dropped. A
//! hit in the old generation moves to the current one.
//!
//! [`Request::body_digest`]: crate::request::Request::body_digest

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::plan::ChatTokens;

const GENERATION_ENTRIES: usize = 1024;
/// Text bytes plus 4 bytes per id, per generation: at most 16 MiB in both.
const GENERATION_BYTES: usize = 8 << 20;

#[derive(Default)]
pub(crate) struct TokenMemo {
    gens: Mutex<Generations>,
}

#[derive(Default)]
struct Generations {
    new: HashMap<u128, Arc<ChatTokens>>,
    old: HashMap<u128, Arc<ChatTokens>>,
    new_bytes: usize,
}

fn weight(t: &ChatTokens) -> usize {
    t.text.len() + 4 * t.ids.len() + 8 * t.placeholders.len()
}

impl TokenMemo {
    pub(crate) fn get(&self, key: u128) -> Option<Arc<ChatTokens>> {
        let mut g = self.gens.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(t) = g.new.get(&key) {
            return Some(t.clone());
        }
        let t = g.old.remove(&key)?;
        g.insert(key, t.clone());
        Some(t)
    }

    pub(crate) fn insert(&self, key: u128, tokens: Arc<ChatTokens>) {
        if weight(&tokens) > GENERATION_BYTES {
            return;
        }
        // The dropped generation is freed after the lock is released.
        let _dropped = self.gens.lock().unwrap_or_else(PoisonError::into_inner).insert(key, tokens);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        let g = self.gens.lock().unwrap();
        g.new.len() + g.old.len()
    }
}

impl Generations {
    /// Inserts, turning over the generations when the current one is full; returns what was dropped.
    fn insert(&mut self, key: u128, tokens: Arc<ChatTokens>) -> HashMap<u128, Arc<ChatTokens>> {
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

    #[test]
    fn a_hit_returns_what_was_stored_and_old_hits_are_promoted() {
        let memo = TokenMemo::default();
        memo.insert(1, tokens(3));
        assert_eq!(memo.get(1).unwrap().ids, vec![7; 3]);
        assert!(memo.get(2).is_none());
        for k in 10..10 + GENERATION_ENTRIES as u128 {
            memo.insert(k, tokens(1)); // key 1 turns old, then is promoted by the next get
        }
        assert!(memo.get(1).is_some());
        for k in 5000..5000 + GENERATION_ENTRIES as u128 {
            memo.insert(k, tokens(1));
        }
        assert!(memo.get(1).is_some(), "promoted to the current generation, it survived one turnover");
    }

    #[test]
    fn stays_bounded_in_entries_and_bytes() {
        let memo = TokenMemo::default();
        for k in 0..(5 * GENERATION_ENTRIES) as u128 {
            memo.insert(k, tokens(1));
        }
        assert!(memo.len() <= 2 * GENERATION_ENTRIES);
        let big = GENERATION_BYTES / 5 / 3; // ~5 per generation
        for k in 0..40u128 {
            memo.insert(100_000 + k, tokens(big));
        }
        let g = memo.gens.lock().unwrap();
        let bytes: usize = g.new.values().chain(g.old.values()).map(|t| weight(t)).sum();
        assert!(bytes <= 2 * GENERATION_BYTES, "{bytes} bytes held");
        assert_eq!(g.new_bytes, g.new.values().map(|t| weight(t)).sum::<usize>());
        drop(g);
        memo.insert(1, tokens(GENERATION_BYTES)); // larger than a generation: not kept
        assert!(memo.get(1).is_none());
    }
}
