//! Fast, exact encoding for byte-level BPE tokenizers of the Qwen2 / Qwen2.5 / Qwen3 and Llama-3 kind.
//!
//! [`FastTokenizer::encode`] returns the same ids as Hugging Face `tokenizers` 0.23.2
//! `Tokenizer::encode_fast(text, false).get_ids()` for the `tokenizer.json` configurations it accepts, and
//! refuses (at load time, with [`Unsupported`]) every configuration it does not reproduce exactly, so the
//! caller can fall back to `tokenizers`.
//!
//! # Accepted configurations
//!
//! * `normalizer`: `null`, `NFC`, or a `Sequence` of `NFC`s.
//! * `pre_tokenizer`: `Sequence[Split, ByteLevel]` where `Split` has the Qwen2/2.5/3 regex or the Llama-3
//!   regex (compared as exact strings), `behavior: "Isolated"`, `invert: false`, and `ByteLevel` has
//!   `add_prefix_space: false`, `use_regex: false` (any `trim_offsets`).
//! * `model`: `BPE` with `dropout` null/0, `continuing_subword_prefix` / `end_of_word_suffix` null or
//!   empty, `byte_fallback` false, any `ignore_merges`, any `unk_token` / `fuse_unk` (they are inert
//!   because all 256 byte-level characters must be in the vocabulary), no id shared by two tokens, and
//!   merges in either JSON form.
//! * `added_tokens`: literal tokens (`normalized: false`, no `lstrip` / `rstrip` / `single_word`);
//!   special or not, they are split out of the raw input left-most-longest first, like `tokenizers` does.
//! * `post_processor`: anything built from `ByteLevel`, `TemplateProcessing`, `RobertaProcessing`,
//!   `BertProcessing`, `Sequence` (none changes ids when special tokens are not added); `truncation` and
//!   `padding` must be null. `decoder` is ignored.
//!
//! # How it is fast
//!
//! * A hand-written matcher for the split regex (see `src/pretok.rs`) over compact Unicode tables, instead of a
//!   backtracking regex engine.
//! * NFC is skipped when a table scan (or, failing that, the quick-check algorithm) proves the text is
//!   already normalized.
//! * BPE works on raw bytes with open-addressing tables, answers whole-word vocabulary hits directly when
//!   the word provably encodes to itself, and merges short words in stack arrays. Nothing is allocated
//!   per token and there is no cache, so speed does not depend on having seen the text before.
//!
//! # Example
//!
//! ```no_run
//! let json = std::fs::read("tokenizer.json").unwrap();
//! match mmrouter_tokenize::FastTokenizer::from_json(&json) {
//!     Ok(tok) => println!("{:?}", tok.encode("Hello, world!")),
//!     Err(why) => println!("falling back to tokenizers: {why}"),
//! }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod added;
mod bpe;
mod bytelevel;
mod hash;
mod load;
mod normalize;
mod par;
mod pretok;
mod tekken;
mod unicode;
mod unicode_data;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

pub use tekken::{TekkenError, TekkenImageConfig, TekkenTokenizer, TEKKEN_PATTERN, TEKKEN_STACK_LIMIT_RUN};

use added::AddedTokens;
use bpe::Bpe;

/// Why a `tokenizer.json` cannot be handled by [`FastTokenizer`] (unsupported feature or invalid file).
///
/// Callers are expected to fall back to the `tokenizers` crate when they get this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported {
    reason: String,
}

impl Unsupported {
    fn new(reason: impl Into<String>) -> Unsupported {
        Unsupported { reason: reason.into() }
    }

    /// Human-readable description of what was refused.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tokenizer.json not supported by mmrouter-tokenize: {}", self.reason)
    }
}

impl std::error::Error for Unsupported {}

/// An immutable, thread-safe encoder built from a `tokenizer.json`.
pub struct FastTokenizer {
    /// Shared with the helper thread that encodes the second part of a long text.
    text: Arc<TextEncoder>,
    added: AddedTokens,
    added_ids: HashMap<String, u32>,
    other_tokens: HashMap<String, u32>,
    /// Long texts are cut into parts encoded in parallel when the process is otherwise idle.
    parallel: bool,
}

/// Encodes text between added tokens: normalize, pre-tokenize, BPE.
struct TextEncoder {
    bpe: Bpe,
    nfc: bool,
    max_digits: usize,
}

impl TextEncoder {
    fn encode(&self, seg: &str, out: &mut Vec<u32>) {
        if seg.is_empty() {
            return;
        }
        if self.nfc {
            if let Some(normalized) = normalize::nfc(seg) {
                self.encode_normalized(&normalized, out);
                return;
            }
        }
        self.encode_normalized(seg, out);
    }

    #[inline]
    fn encode_normalized(&self, s: &str, out: &mut Vec<u32>) {
        pretok::for_each_piece(s, self.max_digits, |piece| self.bpe.encode_piece(piece, out));
    }
}

impl fmt::Debug for FastTokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FastTokenizer")
            .field("nfc", &self.text.nfc)
            .field("max_digits", &self.text.max_digits)
            .field("parallel", &self.parallel)
            .field("merges", &self.text.bpe.n_merges())
            .field("added_tokens", &self.added_ids.len())
            .finish_non_exhaustive()
    }
}

impl FastTokenizer {
    /// Loads a `tokenizer.json` (its bytes).
    ///
    /// Returns [`Unsupported`] when the file uses anything whose behaviour this crate does not reproduce
    /// exactly (see the crate documentation), or is not a valid tokenizer file.
    pub fn from_json(bytes: &[u8]) -> Result<FastTokenizer, Unsupported> {
        let cfg = load::parse(bytes)?;
        unicode::table(); // build the shared character table now rather than on the first encode
        let bpe = Bpe::new(cfg.vocab, &cfg.merges, cfg.ignore_merges);
        let added = AddedTokens::new(&cfg.added);
        Ok(FastTokenizer {
            text: Arc::new(TextEncoder { bpe, nfc: cfg.nfc, max_digits: cfg.max_digits }),
            added,
            added_ids: cfg.added.into_iter().collect(),
            other_tokens: cfg.other_tokens,
            parallel: false,
        })
    }

    /// Lets [`FastTokenizer::encode_into`] cut a long text (16 KiB and more between added tokens) in two
    /// while no other encode runs in the process, the second part encoded on a helper thread: same
    /// ids, lower latency on an idle machine (see `src/par.rs`). Off by default: one thread per encode.
    pub fn with_parallel_parts(mut self, on: bool) -> FastTokenizer {
        self.parallel = on;
        self
    }

    /// Encodes `text`; same ids as `tokenizers`' `encode_fast(text, false)`.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 4);
        self.encode_into(text, &mut out);
        out
    }

    /// Encodes `text`, appending the ids to `out` (which is not cleared). With
    /// [`FastTokenizer::with_parallel_parts`], a long text encoded while no other encode runs in the
    /// process is cut into parts encoded in parallel (same ids).
    pub fn encode_into(&self, text: &str, out: &mut Vec<u32>) {
        if !self.parallel {
            return self.encode_with(text, out, false);
        }
        let running = par::Running::start();
        self.encode_with(text, out, running.alone());
    }

    /// [`FastTokenizer::encode`], cutting every long text between added tokens into parts encoded in
    /// parallel, as a lone encode does (for tests and benchmarks of that path: the same ids).
    pub fn encode_split(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 4);
        self.encode_with(text, &mut out, true);
        out
    }

    /// Where [`FastTokenizer::encode_split`] first cuts `text`, if it contains no added token (so
    /// tests can show that the parallel path ran).
    #[doc(hidden)]
    pub fn first_cut(text: &str) -> Option<usize> {
        par::cuttable(text.len()).then(|| par::cut_near(text.as_bytes(), text.len() / 2, text.len() / 4)).flatten()
    }

    fn encode_with(&self, text: &str, out: &mut Vec<u32>, split: bool) {
        if self.added.is_empty() {
            self.encode_segment(text, out, split);
            return;
        }
        let b = text.as_bytes();
        let mut start = 0;
        while let Some((s, e, id)) = self.added.find(b, start) {
            self.encode_segment(&text[start..s], out, split);
            out.push(id);
            start = e;
        }
        self.encode_segment(&text[start..], out, split);
    }

    /// Text between added tokens; a long one cut in two when `split` and a safe cut is found, the
    /// second part encoded on the helper thread meanwhile (see `src/par.rs`).
    fn encode_segment(&self, seg: &str, out: &mut Vec<u32>, split: bool) {
        let Some(cut) = Self::first_cut(seg).filter(|_| split) else {
            return self.text.encode(seg, out);
        };
        let (head, tail) = seg.split_at(cut);
        let (text, tail) = (self.text.clone(), tail.to_owned());
        let tail_ids = par::Offloaded::start(move || {
            let mut ids = Vec::with_capacity(tail.len() / 3 + 4);
            text.encode(&tail, &mut ids);
            ids
        });
        self.text.encode(head, out);
        out.extend_from_slice(&tail_ids.join());
    }

    /// Id of a token given as it appears in `tokenizer.json` (added tokens first, then the BPE
    /// vocabulary, whose entries are byte-level strings such as `"Ġthe"`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        if let Some(&id) = self.added_ids.get(token) {
            return Some(id);
        }
        match load::bytelevel_decode(token) {
            Some(b) if !b.is_empty() => self.text.bpe.token_id(&b),
            _ => self.other_tokens.get(token).copied(),
        }
    }

    /// Approximate memory held by the tokenizer, in bytes.
    pub fn heap_bytes(&self) -> usize {
        self.text.bpe.heap_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<FastTokenizer>();
    }
}
