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
//! Bounded: two generations (`crate::generations`) of at most [`GENERATION_ENTRIES`] digests and
//! [`GENERATION_BYTES`] of text and ids each.
//!
//! [`Request::body_digest`]: crate::request::Request::body_digest

use std::sync::{Arc, Mutex, PoisonError};

use crate::generations::Generations;
use crate::plan::ChatTokens;

const GENERATION_ENTRIES: usize = 4096;
/// Text bytes plus 4 bytes per id, per generation: at most 16 MiB in both.
const GENERATION_BYTES: usize = 8 << 20;

pub(crate) struct TokenMemo {
    gens: Mutex<Generations<Entry>>,
}

/// What the memo knows of a body: its prompt, or only that it was seen once.
type Entry = Option<Arc<ChatTokens>>;

fn weight(e: &Entry) -> usize {
    16 + e.as_ref().map_or(0, |t| t.text.len() + 4 * t.ids.len() + 8 * (t.placeholders.len() + t.videos.len()))
}

/// A body's standing in the memo.
pub(crate) enum Lookup {
    Hit(Arc<ChatTokens>),
    /// Seen once before: keep its prompt now ([`TokenMemo::keep`]).
    Seen,
    /// Not seen lately: note it ([`TokenMemo::note`]).
    New,
}

impl Default for TokenMemo {
    fn default() -> TokenMemo {
        TokenMemo { gens: Mutex::new(Generations::new(GENERATION_ENTRIES, GENERATION_BYTES, weight)) }
    }
}

impl TokenMemo {
    pub(crate) fn lookup(&self, key: u128) -> Lookup {
        match self.gens.lock().unwrap_or_else(PoisonError::into_inner).get(key) {
            Some(entry) => entry.map_or(Lookup::Seen, Lookup::Hit),
            None => Lookup::New,
        }
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
        // The dropped generation is freed after the lock is released.
        let _dropped = self.gens.lock().unwrap_or_else(PoisonError::into_inner).insert(key, entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(n: usize) -> Arc<ChatTokens> {
        Arc::new(ChatTokens { ids: vec![7; n], placeholders: Vec::new(), videos: Vec::new(), text: "x".repeat(n) })
    }

    fn hit(memo: &TokenMemo, key: u128) -> Option<Arc<ChatTokens>> {
        match memo.lookup(key) {
            Lookup::Hit(t) => Some(t),
            _ => None,
        }
    }

    #[test]
    fn a_prompt_is_kept_at_its_second_sighting() {
        let memo = TokenMemo::default();
        assert!(matches!(memo.lookup(1), Lookup::New));
        memo.note(1);
        assert!(matches!(memo.lookup(1), Lookup::Seen));
        memo.keep(1, tokens(3));
        assert_eq!(hit(&memo, 1).unwrap().ids, vec![7; 3]);
        assert!(matches!(memo.lookup(2), Lookup::New));
    }

    #[test]
    fn a_prompt_heavier_than_a_generation_is_not_kept() {
        let memo = TokenMemo::default();
        memo.note(1);
        memo.keep(1, tokens(GENERATION_BYTES));
        assert!(hit(&memo, 1).is_none());
    }
}
