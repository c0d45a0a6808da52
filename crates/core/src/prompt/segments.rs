//! Tokenization by segments, with a bounded cache.
//!
//! HF `tokenizers` first splits the input on its added tokens (`<|im_start|>`, `<|image_pad|>`, …) and
//! then normalizes, pre-tokenizes and BPE-encodes each piece in between on its own. So the ids of a
//! rendered chat prompt are the concatenation of the ids of those pieces, and the pieces repeat across
//! requests: system prompts, tool definitions, earlier turns of a conversation. Repeated pieces are
//! served from a cache.
//!
//! Pieces are encoded by `mmrouter-tokenize` ([`FastTokenizer`], ~0.1–0.2 µs per token on new text, ids
//! identical to `tokenizers`) when it accepts the model's `tokenizer.json`, else by `tokenizers` itself
//! (~1–2 µs per token). The cache stays with the fast encoder: a hit costs a hash of the piece and a
//! copy of its ids, far less than re-encoding it (a repeated system prompt or conversation history),
//! and a miss adds that same hash and copy, about 1 % of encoding the piece (a 6.5 KB turn: ~1 µs
//! against ~200 µs). A piece over 1 KiB is kept only from its second sighting: most are one-shot
//! prompts. See `docs/benchmarks.md`, "Tokenization on new text".
//!
//! Before any of that, a prompt that starts with one encoded recently (a conversation's history, up to
//! an added token) takes that prefix's ids from the prefix cache (`prefix.rs`) in one copy, and only
//! the rest is split and served as above: the history is neither scanned for added tokens nor hashed
//! piece by piece.
//!
//! The split is only reproduced when every added token matches literally (no `lstrip`, `rstrip`,
//! `single_word` or `normalized`) and the normalizer and pre-tokenizer treat every piece alike; a
//! tokenizer that prepends a word marker to the *first* piece only (SentencePiece-style `Prepend` /
//! `Metaspace`, as Llama 2 and Mistral use) would get one on every piece, so for those both caches are off
//! and whole strings are encoded.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use mmrouter_tokenize::FastTokenizer;
use tokenizers::Tokenizer;

use super::prefix::{self, Boundary, PrefixCache};
use crate::generations::Generations;

/// Pieces shorter than this are encoded directly: the lookup would cost about as much.
const MIN_CACHED_BYTES: usize = 48;
/// Longer pieces are encoded directly too: they rarely repeat whole, and caching them would let a
/// few huge prompts hold memory long after they were routed.
const MAX_CACHED_BYTES: usize = 64 * 1024;
/// Entries per generation; two generations are kept, so at most twice this many pieces.
const GENERATION_ENTRIES: usize = 4096;
/// Token ids per generation (4 B each): one-shot prompts never repeat, so a bound in entries alone
/// would let 8 192 cached long pieces hold hundreds of MB. Two generations: at most 32 MiB of ids.
const GENERATION_IDS: usize = 4 << 20;
/// Pieces longer than this are cached from their second sighting only (the first is remembered by
/// its digest): most long pieces are one-shot prompts, and caching each at once cost a copy of its
/// ids and a fresh allocation that the cache dropped a generation later (page faults, measured on
/// unique ~8 000-token prompts). Shorter ones — system prompts, tool definitions, turns — are cheap to
/// keep at once.
const FIRST_SIGHTING_MAX_BYTES: usize = 1024;

pub(crate) struct SegmentEncoder {
    /// The added tokens and their ids; `None` when the literal split would not match HF's.
    splitter: Option<(AhoCorasick, Vec<u32>)>,
    /// The fast encoder, when it accepted the model's `tokenizer.json`; its ids equal `tokenizers'`.
    fast: Option<Arc<FastTokenizer>>,
    /// Pieces' ids by the xxh3-128 of their text, weighed in ids.
    cache: Mutex<Generations<Arc<[u32]>>>,
    /// Digests of long pieces seen once and not cached yet (see [`FIRST_SIGHTING_MAX_BYTES`]).
    seen: Mutex<Generations<()>>,
    /// Whole prompts by their boundary prefixes (used only with `splitter`, as `cache`).
    prefixes: PrefixCache,
    /// Off only to measure what the prefix cache saves.
    prefix_reuse: bool,
}

fn piece_cache() -> Generations<Arc<[u32]>> {
    Generations::new(GENERATION_ENTRIES, GENERATION_IDS, |ids| ids.len())
}

fn seen_once() -> Generations<()> {
    Generations::new(GENERATION_ENTRIES, GENERATION_ENTRIES, |_| 1)
}

/// Whether encoding a piece alone gives the ids it gets inside a longer text: not so when the
/// normalizer or pre-tokenizer prepends a marker to the start of the input only.
fn position_free(tokenizer: &Tokenizer) -> bool {
    let json = |v: Option<String>| v.unwrap_or_default();
    let normalizer = json(tokenizer.get_normalizer().and_then(|n| serde_json::to_string(n).ok()));
    let pre = json(tokenizer.get_pre_tokenizer().and_then(|p| serde_json::to_string(p).ok()));
    let prepends = normalizer.contains("\"Prepend\"")
        || (pre.contains("\"Metaspace\"") && !pre.contains("\"prepend_scheme\":\"never\""));
    !prepends
}

impl SegmentEncoder {
    /// `fast` must have been loaded from the same `tokenizer.json` as `tokenizer`.
    pub(crate) fn new(tokenizer: &Tokenizer, fast: Option<Arc<FastTokenizer>>) -> SegmentEncoder {
        let added = tokenizer.get_added_tokens_decoder();
        let literal = added.values().all(|t| !t.lstrip && !t.rstrip && !t.single_word && !t.normalized);
        let splitter = (literal && !added.is_empty() && position_free(tokenizer))
            .then(|| {
                let mut tokens: Vec<(&u32, &tokenizers::AddedToken)> = added.iter().collect();
                tokens.sort_by_key(|(id, _)| **id);
                let ac = AhoCorasickBuilder::new()
                    .match_kind(MatchKind::LeftmostLongest)
                    .build(tokens.iter().map(|(_, t)| t.content.as_str()))
                    .ok()?;
                Some((ac, tokens.iter().map(|(id, _)| **id).collect()))
            })
            .flatten();
        SegmentEncoder {
            splitter,
            fast,
            cache: Mutex::new(piece_cache()),
            seen: Mutex::new(seen_once()),
            prefixes: PrefixCache::default(),
            prefix_reuse: true,
        }
    }

    /// The encoder without the prefix cache, to measure what it saves.
    pub(crate) fn without_prefix_reuse(self) -> SegmentEncoder {
        SegmentEncoder { prefix_reuse: false, ..self }
    }

    /// The fast encoder, if the model's tokenizer is one it reproduces.
    pub(crate) fn fast(&self) -> Option<&Arc<FastTokenizer>> {
        self.fast.as_ref()
    }

    /// `tokenizer.encode_fast(text, false)`'s ids, from the fast encoder when there is one.
    fn encode_uncached(&self, tokenizer: &Tokenizer, text: &str, out: &mut Vec<u32>) -> tokenizers::Result<()> {
        match &self.fast {
            Some(fast) => fast.encode_into(text, out),
            None => out.extend_from_slice(tokenizer.encode_fast(text, false)?.get_ids()),
        }
        Ok(())
    }

    /// True when pieces are encoded one by one (the cache is in use).
    #[cfg(test)]
    pub(crate) fn splits(&self) -> bool {
        self.splitter.is_some()
    }

    /// Encodes that reused a kept prefix.
    pub(crate) fn prefix_hits(&self) -> usize {
        self.prefixes.hits()
    }

    /// The ids `tokenizer.encode_fast(text, false)` gives: the longest prefix kept in the prefix cache,
    /// then the rest served piecewise from the segment cache. The prompt is kept for later prefixes
    /// when `keep` or when it extended a kept one: one-off prompts would only churn memory (measured:
    /// page faults took a fifth of the router's CPU on unique ~2 000-token prompts).
    pub(crate) fn encode(&self, tokenizer: &Tokenizer, text: &str, keep: bool) -> tokenizers::Result<Vec<u32>> {
        let mut out = Vec::with_capacity(text.len() / 3);
        let Some((ac, ids)) = &self.splitter else {
            self.encode_uncached(tokenizer, text, &mut out)?;
            return Ok(out);
        };
        if !self.prefix_reuse || text.len() < prefix::CHECKPOINT_BYTES {
            self.encode_split(tokenizer, (ac, ids), text, 0, &mut out, |_, _| {})?;
            return Ok(out);
        }
        let checkpoints = prefix::checkpoints(text);
        let hit = self.prefixes.lookup(&checkpoints, ac.max_pattern_len());
        let mut boundaries = Vec::new();
        if let Some(h) = &hit {
            out.extend_from_slice(h.ids());
            boundaries.extend_from_slice(h.boundaries());
        }
        let at = hit.as_ref().map_or(0, prefix::Hit::bytes);
        self.encode_split(tokenizer, (ac, ids), text, at, &mut out, |span, ids| {
            // Only the last of adjacent added tokens is kept (an image's run of pads counts once).
            if boundaries.last().is_some_and(|b| b.bytes == span.start) {
                boundaries.pop();
            }
            boundaries.push(Boundary { bytes: span.end, ids });
        })?;
        if keep || hit.is_some() {
            self.prefixes.insert(&out, boundaries, &checkpoints, hit.as_ref());
        }
        Ok(out)
    }

    /// Splits `text[at..]` (`at` is where a split ends, or 0) at the added tokens and encodes it onto
    /// `out` piece by piece; `after_token` gets each token's byte range and the number of ids in `out`
    /// after it.
    fn encode_split(
        &self,
        tokenizer: &Tokenizer,
        (ac, ids): (&AhoCorasick, &[u32]),
        text: &str,
        mut at: usize,
        out: &mut Vec<u32>,
        mut after_token: impl FnMut(Range<usize>, usize),
    ) -> tokenizers::Result<()> {
        let from = at;
        for m in ac.find_iter(&text[from..]) {
            let span = from + m.start()..from + m.end();
            self.encode_piece(tokenizer, &text[at..span.start], out)?;
            out.push(ids[m.pattern().as_usize()]);
            at = span.end;
            after_token(span, out.len());
        }
        self.encode_piece(tokenizer, &text[at..], out)
    }

    fn encode_piece(&self, tokenizer: &Tokenizer, piece: &str, out: &mut Vec<u32>) -> tokenizers::Result<()> {
        if piece.is_empty() {
            return Ok(());
        }
        if !(MIN_CACHED_BYTES..=MAX_CACHED_BYTES).contains(&piece.len()) {
            return self.encode_uncached(tokenizer, piece, out);
        }
        let key = xxhash_rust::xxh3::xxh3_128(piece.as_bytes());
        let hit = self.cache.lock().unwrap_or_else(|e| e.into_inner()).get(key);
        if hit.is_none() && piece.len() > FIRST_SIGHTING_MAX_BYTES && self.first_sighting(key) {
            return self.encode_uncached(tokenizer, piece, out);
        }
        let ids = match hit {
            Some(ids) => ids,
            None => {
                let mut fresh = Vec::with_capacity(piece.len() / 3);
                self.encode_uncached(tokenizer, piece, &mut fresh)?;
                let ids: Arc<[u32]> = fresh.into();
                let dropped = self.cache.lock().unwrap_or_else(|e| e.into_inner()).insert(key, ids.clone());
                drop(dropped); // freed after the lock
                ids
            }
        };
        out.extend_from_slice(&ids);
        Ok(())
    }

    /// Whether `key` is new to the long pieces seen once (remembering it if so).
    fn first_sighting(&self, key: u128) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.get(key).is_some() {
            return false;
        }
        drop(seen.insert(key, ()));
        true
    }
}

#[cfg(test)]
pub(in crate::prompt) mod tests {
    use super::*;
    use crate::prompt::PromptModel;
    use proptest::prelude::*;

    #[test]
    fn tokenizers_that_prepend_to_the_first_piece_are_encoded_whole() {
        assert!(PromptModel::bundled("qwen3-vl").unwrap().inner.segments.splits());
        let llava = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/parity/models/llava_1_5");
        let llava = PromptModel::from_dir(std::path::Path::new(llava)).unwrap();
        assert!(!llava.inner.segments.splits());
        // LLaVA keeps its file's `Prepend` normalizer (transformers 5.19 loads llava tokenizers as
        // the file says): a "▁" (28705) follows every special token, as `vllm launch render` shows.
        assert_eq!(llava.encode("<image>\nHi").unwrap(), llava.encode_with("<image>\nHi", false).unwrap());
        assert_eq!(llava.encode("<image>\n").unwrap(), [32000, 28705, 13]);
    }

    fn tokenizer() -> Tokenizer {
        PromptModel::bundled("qwen3-vl").unwrap().tokenizer().clone()
    }

    fn fast() -> Option<Arc<FastTokenizer>> {
        let fast = PromptModel::bundled("qwen3-vl").unwrap().inner.segments.fast().cloned();
        assert!(fast.is_some(), "the bundled Qwen tokenizer is encoded by mmrouter-tokenize");
        fast
    }

    /// Pieces whose concatenations cover the split's edge cases (partial tokens, NFC, contractions).
    pub(in crate::prompt) const PIECES: &[&str] = &[
        "<|im_start|>",
        "<|im_end|>",
        "<|image_pad|>",
        "<|vision_start|>",
        "<think>",
        "</think>",
        "system\n",
        "user\n",
        "You are a helpful assistant that answers questions about pictures in detail. ",
        "Ünïcödé ☃ 東京 ",
        "e\u{301}",
        "\r\n\t  ",
        "<|im_sta",
        "rt|>",
        "'s 're 123 4567 ",
        "  indented code();\n",
        "<tool_call>",
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        #[test]
        fn piecewise_encoding_equals_whole_encoding(parts in prop::collection::vec(0..PIECES.len(), 0..40)) {
            let tok = tokenizer();
            let text: String = parts.iter().map(|&i| PIECES[i]).collect();
            let whole = tok.encode_fast(text.as_str(), false).unwrap().get_ids().to_vec();
            // With `tokenizers` alone and with the fast encoder, twice each: the second pass is served
            // from the cache.
            for enc in [SegmentEncoder::new(&tok, None), SegmentEncoder::new(&tok, fast())] {
                prop_assert_eq!(&enc.encode(&tok, &text, true).unwrap(), &whole);
                prop_assert_eq!(&enc.encode(&tok, &text, true).unwrap(), &whole);
            }
        }
    }

    #[test]
    fn long_pieces_are_cached_from_their_second_sighting() {
        let tok = tokenizer();
        let enc = SegmentEncoder::new(&tok, fast());
        let cached = || enc.cache.lock().unwrap().len();
        let long = "A long one-shot prompt, written once and routed once. ".repeat(40);
        assert!(long.len() > FIRST_SIGHTING_MAX_BYTES);
        let want = tok.encode_fast(long.as_str(), false).unwrap().get_ids().to_vec();
        assert_eq!(enc.encode(&tok, &long, false).unwrap(), want);
        assert_eq!(cached(), 0, "a first sighting is only remembered");
        assert_eq!(enc.encode(&tok, &long, false).unwrap(), want);
        assert_eq!(cached(), 1, "the second is kept");
        assert_eq!(enc.encode(&tok, &long, false).unwrap(), want, "the third is served from the cache");
        let short = "You are a helpful assistant who answers briefly and well.";
        assert!((MIN_CACHED_BYTES..=FIRST_SIGHTING_MAX_BYTES).contains(&short.len()));
        enc.encode(&tok, short, false).unwrap();
        assert_eq!(cached(), 2, "a short piece is kept at once");
    }

    #[test]
    fn qwen_added_tokens_are_split_literally() {
        assert!(SegmentEncoder::new(&tokenizer(), None).splitter.is_some());
    }

    #[test]
    fn the_piece_cache_stays_bounded_in_pieces_and_ids() {
        let mut g = piece_cache();
        for k in 0..(3 * GENERATION_ENTRIES as u128) {
            let _ = g.insert(k, Arc::from(vec![k as u32]));
        }
        assert!(g.len() <= 2 * GENERATION_ENTRIES);
        // A recent key survives; the oldest are gone.
        assert!(g.get(3 * GENERATION_ENTRIES as u128 - 1).is_some());
        assert!(g.get(0).is_none());
        let long: Arc<[u32]> = Arc::from(vec![7u32; 16 * 1024]); // a ~64 KiB piece's ids
        for k in 0..2048u128 {
            let _ = g.insert(k, long.clone());
        }
        assert!(g.weight() <= 2 * GENERATION_IDS, "{} ids cached", g.weight());
        assert!(g.get(2047).is_some());
    }
}
