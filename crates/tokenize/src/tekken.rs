//! Mistral's tekken tokenizer (`tekken.json`), exactly as `mistral_common` 1.13's `Tekkenizer` encodes.
//!
//! `Tekkenizer.encode(text, bos=False, eos=False)` hands the text to `tiktoken` (`Encoding.encode` with no
//! special tokens registered, so special-token strings such as `[INST]` or `<s>` in the text are ordinary
//! text) and adds the number of special tokens to every rank. `tiktoken` splits the text with the file's
//! regex (`fancy-regex`, leftmost-first, `find_iter`), and each piece becomes one id when the piece is a
//! vocabulary entry, else goes through rank-ordered byte-pair merging (repeatedly join the left-most
//! adjacent pair whose concatenation has the lowest rank). The vocabulary is the file's first
//! `default_vocab_size - default_num_special_tokens` entries; ids `0..default_num_special_tokens` are the
//! special tokens (the file's `special_tokens` list, or for files of version v7 and older without one,
//! `mistral_common`'s built-in list of 20, padded with `<SPECIAL_{i}>` fillers).
//!
//! The split pattern of every published tekken file is [`TEKKEN_PATTERN`]; [`TekkenTokenizer::from_json`]
//! refuses any other. It is matched by hand (see [`match_at`]) over character classes generated from
//! `regex-syntax` 0.8 (Unicode 16.0, the tables of the `regex-syntax` 0.8.11 that `tiktoken`'s build uses).
//!
//! One engine limit is reproduced too: `fancy-regex` runs `\s+(?!\S)` in its backtracking VM, one stack
//! entry per character, and fails at 1 000 000 entries; `tiktoken` then raises `ValueError: Regex error while
//! tokenizing` (so vLLM answers 400). That happens when that alternative is reached with a CR/LF-free
//! white-space run of [`TEKKEN_STACK_LIMIT_RUN`] characters or more; [`TekkenTokenizer::try_encode`] reports it.

use std::collections::HashMap;
use std::fmt;
use std::sync::OnceLock;

use serde_json::{Map, Value};

use crate::hash::BytesMap;
use crate::unicode::decode;
use crate::unicode_data;

/// The split regex of the tekken files (`config.pattern`), compared as an exact string.
pub const TEKKEN_PATTERN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Length (in characters) of a CR/LF-free white-space run at which `tiktoken`'s regex engine fails.
pub const TEKKEN_STACK_LIMIT_RUN: usize = 999_999;

/// Versions `mistral_common` 1.13 knows (`TokenizerVersion`).
const VERSIONS: [&str; 7] = ["v1", "v2", "v3", "v7", "v11", "v13", "v15"];

/// `Tekkenizer.DEPRECATED_SPECIAL_TOKENS`: the special tokens of files (v7 and older) without a list.
const DEFAULT_SPECIALS: [&str; 20] = [
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    "[IMG]",
    "<pad>",
    "[IMG_BREAK]",
    "[IMG_END]",
    "[PREFIX]",
    "[MIDDLE]",
    "[SUFFIX]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
];

/// Why a `tekken.json` was refused, or why a text cannot be encoded (see [`TekkenTokenizer::try_encode`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TekkenError {
    reason: String,
}

impl TekkenError {
    fn new(reason: impl Into<String>) -> TekkenError {
        TekkenError { reason: reason.into() }
    }

    /// Human-readable description.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for TekkenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tekken: {}", self.reason)
    }
}

impl std::error::Error for TekkenError {}

/// The `image` section of a `tekken.json` (`mistral_common`'s `ImageConfig`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TekkenImageConfig {
    /// Pixels per patch side.
    pub image_patch_size: u32,
    /// Longest side, in pixels, before the image is scaled down.
    pub max_image_size: u32,
    /// Patches merged into one `[IMG]` token along each side (1 when absent).
    pub spatial_merge_size: u32,
}

impl TekkenImageConfig {
    /// `(columns, rows)` of `[IMG]` tokens for an image of `width` x `height` pixels, as
    /// `ImageEncoder._image_to_num_tokens` computes them: when the longer side exceeds `max_image_size`,
    /// both sides are divided by `max(w, h) / max_image_size` and rounded half to even (at least 1); then
    /// each side takes `ceil(side / (image_patch_size * spatial_merge_size))` tokens. `None` when a side is
    /// zero (`mistral_common` asserts).
    pub fn grid(&self, width: u32, height: u32) -> Option<(u32, u32)> {
        let (mut w, mut h) = (width as f64, height as f64);
        let max = self.max_image_size as f64;
        let ratio = f64::max(h / max, w / max);
        if ratio > 1.0 {
            w = (w / ratio).round_ties_even().max(1.0);
            h = (h / ratio).round_ties_even().max(1.0);
        }
        let step = (self.image_patch_size as u64) * (self.spatial_merge_size as u64);
        let tokens = |side: f64| -> u64 {
            let side = side as u64; // an integer already
            if side == 0 {
                0
            } else {
                (side - 1) / step + 1
            }
        };
        let (cols, rows) = (tokens(w), tokens(h));
        if cols == 0 || rows == 0 {
            return None;
        }
        Some((cols as u32, rows as u32))
    }
}

/// An immutable, thread-safe tekken encoder.
pub struct TekkenTokenizer {
    /// Token bytes -> rank (the id minus the number of special tokens).
    vocab: BytesMap,
    /// Bytes of each rank.
    token_bytes: Vec<Box<[u8]>>,
    max_token_len: usize,
    num_special: u32,
    specials: Vec<String>,
    special_ids: HashMap<String, u32>,
    version: String,
    image: Option<TekkenImageConfig>,
}

impl fmt::Debug for TekkenTokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TekkenTokenizer")
            .field("version", &self.version)
            .field("vocab_size", &self.vocab_size())
            .field("num_special_tokens", &self.num_special)
            .field("image", &self.image)
            .finish_non_exhaustive()
    }
}

fn err(msg: impl Into<String>) -> TekkenError {
    TekkenError::new(msg)
}

fn req_u32(obj: &Map<String, Value>, key: &str, ctx: &str) -> Result<u32, TekkenError> {
    obj.get(key)
        .and_then(Value::as_u64)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| err(format!("{ctx}: `{key}` must be a non-negative integer")))
}

/// Standard base64 (with `=` padding), as `base64.b64decode` reads well-formed input.
fn b64decode(s: &str) -> Option<Vec<u8>> {
    fn val(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    }
    let b = s.as_bytes();
    if !b.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(b.len() / 4 * 3);
    for (ci, chunk) in b.chunks_exact(4).enumerate() {
        let last = ci + 1 == b.len() / 4;
        let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut acc = 0u32;
        for &c in &chunk[..4 - pad] {
            acc = (acc << 6) | val(c)?;
        }
        acc <<= 6 * pad as u32;
        let bytes = [(acc >> 16) as u8, (acc >> 8) as u8, acc as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Some(out)
}

fn parse_image(v: &Value, ctx: &str) -> Result<TekkenImageConfig, TekkenError> {
    let obj = v.as_object().ok_or_else(|| err(format!("{ctx} must be an object")))?;
    for key in obj.keys() {
        if !matches!(key.as_str(), "image_patch_size" | "max_image_size" | "spatial_merge_size") {
            return Err(err(format!("{ctx}: unknown key `{key}`")));
        }
    }
    let image_patch_size = req_u32(obj, "image_patch_size", ctx)?;
    let max_image_size = req_u32(obj, "max_image_size", ctx)?;
    let spatial_merge_size = match obj.get("spatial_merge_size") {
        None => 1,
        Some(_) => req_u32(obj, "spatial_merge_size", ctx)?,
    };
    if image_patch_size == 0 || max_image_size == 0 || spatial_merge_size == 0 {
        return Err(err(format!("{ctx}: sizes must be > 0")));
    }
    Ok(TekkenImageConfig { image_patch_size, max_image_size, spatial_merge_size })
}

impl TekkenTokenizer {
    /// Loads a `tekken.json` (its bytes).
    ///
    /// Refuses files `mistral_common` 1.13 would refuse (unknown version, inconsistent vocabulary or special
    /// tokens) and files whose encoding this crate does not reproduce (a split pattern other than
    /// [`TEKKEN_PATTERN`]).
    pub fn from_json(bytes: &[u8]) -> Result<TekkenTokenizer, TekkenError> {
        let root: Value = serde_json::from_slice(bytes).map_err(|e| err(format!("invalid JSON: {e}")))?;
        let root = root.as_object().ok_or_else(|| err("the file must be a JSON object"))?;
        let config = root.get("config").and_then(Value::as_object).ok_or_else(|| err("`config` is missing"))?;
        let version = config.get("version").and_then(Value::as_str).unwrap_or("");
        if !VERSIONS.contains(&version) {
            return Err(err(format!("unknown version {version:?}")));
        }
        let pattern =
            config.get("pattern").and_then(Value::as_str).ok_or_else(|| err("`config.pattern` is missing"))?;
        if pattern != TEKKEN_PATTERN {
            return Err(err(format!("unsupported split pattern {pattern:?}")));
        }
        let vocab_size = req_u32(config, "default_vocab_size", "config")?;
        let num_special = req_u32(config, "default_num_special_tokens", "config")?;
        let vocab = root.get("vocab").and_then(Value::as_array).ok_or_else(|| err("`vocab` must be a list"))?;
        if vocab_size as usize > vocab.len() + num_special as usize || vocab_size < num_special {
            return Err(err(format!(
                "default_vocab_size {vocab_size} does not fit {} tokens and {num_special} special tokens",
                vocab.len()
            )));
        }
        let inner = (vocab_size - num_special) as usize;
        if inner < 256 {
            return Err(err("the vocabulary must hold the 256 single bytes"));
        }

        // Regular tokens.
        let mut map = BytesMap::with_capacity(inner);
        let mut token_bytes = Vec::with_capacity(inner);
        let mut max_token_len = 1;
        for (i, entry) in vocab[..inner].iter().enumerate() {
            let obj = entry.as_object().ok_or_else(|| err(format!("vocab[{i}] must be an object")))?;
            if obj.len() != 3 || !obj.contains_key("token_str") {
                return Err(err(format!("vocab[{i}] must have exactly rank, token_bytes and token_str")));
            }
            if obj.get("rank").and_then(Value::as_u64) != Some(i as u64) {
                return Err(err(format!("vocab[{i}] has rank {:?}, expected {i}", obj.get("rank"))));
            }
            let b64 =
                obj.get("token_bytes").and_then(Value::as_str).ok_or_else(|| err(format!("vocab[{i}].token_bytes")))?;
            let b = b64decode(b64).ok_or_else(|| err(format!("vocab[{i}].token_bytes is not base64")))?;
            if b.is_empty() || (i < 256 && b != [i as u8]) {
                return Err(err(format!("vocab[{i}] must be the single byte {i}")));
            }
            if map.get(&b).is_some() {
                return Err(err(format!("vocab[{i}] repeats an earlier token")));
            }
            map.insert(&b, i as u32);
            max_token_len = max_token_len.max(b.len());
            token_bytes.push(b.into_boxed_slice());
        }

        // Special tokens.
        let mut specials: Vec<String> = match root.get("special_tokens") {
            None | Some(Value::Null) => {
                if VERSIONS.iter().position(|v| *v == version) > VERSIONS.iter().position(|v| *v == "v7") {
                    return Err(err(format!("a {version} file must list its special tokens")));
                }
                DEFAULT_SPECIALS.iter().map(|s| s.to_string()).collect()
            }
            Some(Value::Array(list)) => {
                let mut names = Vec::with_capacity(list.len());
                for (i, t) in list.iter().enumerate() {
                    let name = t.get("token_str").and_then(Value::as_str);
                    let rank = t.get("rank").and_then(Value::as_u64);
                    match (name, rank) {
                        (Some(name), Some(r)) if r == i as u64 => names.push(name.to_string()),
                        _ => return Err(err(format!("special_tokens[{i}] must have token_str and rank {i}"))),
                    }
                }
                names
            }
            Some(_) => return Err(err("`special_tokens` must be a list")),
        };
        if specials.len() > num_special as usize {
            return Err(err(format!("{} special tokens for {num_special} slots", specials.len())));
        }
        for i in specials.len()..num_special as usize {
            specials.push(format!("<SPECIAL_{i}>"));
        }
        let mut special_ids = HashMap::with_capacity(specials.len());
        for (i, s) in specials.iter().enumerate() {
            if special_ids.insert(s.clone(), i as u32).is_some() {
                return Err(err(format!("special token {s:?} is listed twice")));
            }
        }

        // Images.
        let image = match (root.get("multimodal"), root.get("image")) {
            (Some(mm), _) if !mm.is_null() && mm.as_object().is_some_and(|o| !o.is_empty()) => {
                if VERSIONS.iter().position(|v| *v == version) > VERSIONS.iter().position(|v| *v == "v11") {
                    return Err(err("the image config must be called `image` after v11"));
                }
                Some(parse_image(mm, "multimodal")?)
            }
            (_, Some(im)) if !im.is_null() && im.as_object().is_some_and(|o| !o.is_empty()) => {
                Some(parse_image(im, "image")?)
            }
            _ => None,
        };

        table(); // build the character classes now rather than on the first encode
        Ok(TekkenTokenizer {
            vocab: map,
            token_bytes,
            max_token_len,
            num_special,
            specials,
            special_ids,
            version: version.to_string(),
            image,
        })
    }

    /// Encodes ordinary text (no BOS/EOS), like `Tekkenizer.encode(text, bos=False, eos=False)`.
    ///
    /// Special-token strings in `text` are encoded as the characters they are made of. For a text that
    /// `mistral_common` cannot encode at all (see [`try_encode`](Self::try_encode)) this returns the ids the
    /// split regex defines, with no engine limit.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 4);
        self.encode_into(text, &mut out);
        out
    }

    /// [`encode`](Self::encode), appending to `out` (which is not cleared).
    pub fn encode_into(&self, text: &str, out: &mut Vec<u32>) {
        for_each_piece(text, |piece| self.encode_piece(piece, out));
    }

    /// [`encode`](Self::encode), or an error exactly where `mistral_common` raises (a CR/LF-free white-space
    /// run of [`TEKKEN_STACK_LIMIT_RUN`] characters or more reaching the `\s+(?!\S)` alternative).
    pub fn try_encode(&self, text: &str) -> Result<Vec<u32>, TekkenError> {
        let mut out = Vec::with_capacity(text.len() / 3 + 4);
        let overflow = for_each_piece(text, |piece| self.encode_piece(piece, &mut out));
        match overflow {
            None => Ok(out),
            Some(at) => Err(err(format!(
                "a run of {TEKKEN_STACK_LIMIT_RUN} or more white-space characters at byte {at}: mistral_common fails \
                 with \"Regex error while tokenizing: Max stack size exceeded for backtracking\""
            ))),
        }
    }

    /// Id of a special token by its string (`"<s>"`, `"[INST]"`, `"[IMG]"`, `"<SPECIAL_42>"`, ...).
    pub fn special_id(&self, name: &str) -> Option<u32> {
        self.special_ids.get(name).copied()
    }

    /// String of special token `id` (`id < num_special_tokens()`).
    pub fn special_token(&self, id: u32) -> Option<&str> {
        self.specials.get(id as usize).map(String::as_str)
    }

    /// Id of a regular token given by its bytes (already offset past the special tokens).
    pub fn token_id(&self, bytes: &[u8]) -> Option<u32> {
        self.vocab.get(bytes).map(|r| r + self.num_special)
    }

    /// Bytes of regular token `id` (`None` for special ids and ids out of range).
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        let rank = id.checked_sub(self.num_special)?;
        self.token_bytes.get(rank as usize).map(|b| &b[..])
    }

    /// `<s>`.
    pub fn bos_id(&self) -> Option<u32> {
        self.special_id("<s>")
    }

    /// `</s>`.
    pub fn eos_id(&self) -> Option<u32> {
        self.special_id("</s>")
    }

    /// Number of special tokens (the offset of every regular id).
    pub fn num_special_tokens(&self) -> u32 {
        self.num_special
    }

    /// Special plus regular tokens (`config.default_vocab_size`).
    pub fn vocab_size(&self) -> u32 {
        self.num_special + self.token_bytes.len() as u32
    }

    /// `config.version` (`"v3"`, `"v7"`, ...).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The image config, when the file has one.
    pub fn image_config(&self) -> Option<TekkenImageConfig> {
        self.image
    }

    /// The ids of an image of `cols` x `rows` tokens: each row is `cols` `[IMG]` followed by `[IMG_BREAK]`,
    /// and the last row's `[IMG_BREAK]` is `[IMG_END]`. `None` when a size is 0 or the tokens are missing.
    pub fn image_token_ids(&self, cols: u32, rows: u32) -> Option<Vec<u32>> {
        let (img, brk, end) =
            (self.special_id("[IMG]")?, self.special_id("[IMG_BREAK]")?, self.special_id("[IMG_END]")?);
        if cols == 0 || rows == 0 {
            return None;
        }
        let mut out = Vec::with_capacity(((cols + 1) * rows) as usize);
        for _ in 0..rows {
            out.extend(std::iter::repeat_n(img, cols as usize));
            out.push(brk);
        }
        *out.last_mut().expect("rows > 0") = end;
        Some(out)
    }

    /// Approximate memory held, in bytes.
    pub fn heap_bytes(&self) -> usize {
        self.vocab.heap_bytes() + self.token_bytes.iter().map(|b| b.len() + 16).sum::<usize>()
    }

    /// Rank of `bytes`, if it is a token no longer than the longest one.
    #[inline(always)]
    fn rank(&self, bytes: &[u8]) -> u32 {
        if bytes.len() > self.max_token_len {
            return NONE;
        }
        self.vocab.get(bytes).unwrap_or(NONE)
    }

    /// Appends the ids of one (non-empty) piece.
    #[inline]
    fn encode_piece(&self, w: &[u8], out: &mut Vec<u32>) {
        let off = self.num_special;
        if w.len() == 1 {
            out.push(w[0] as u32 + off); // ranks 0..256 are the single bytes
            return;
        }
        if let Some(r) = self.vocab.get(w) {
            out.push(r + off);
            return;
        }
        if w.len() <= LINEAR_MAX {
            self.merge_linear(w, out)
        } else {
            self.merge_tree(w, out)
        }
    }

    /// tiktoken's byte-pair merge for short pieces: flat arrays, left-most minimum by a scan.
    fn merge_linear(&self, w: &[u8], out: &mut Vec<u32>) {
        let n = w.len();
        // start[k]: first byte of part k; start[m] == n.
        let mut start = [0usize; LINEAR_MAX + 1];
        // rank[k]: rank of part k joined with part k + 1.
        let mut rank = [NONE; LINEAR_MAX];
        for (k, s) in start.iter_mut().enumerate().take(n + 1) {
            *s = k;
        }
        for k in 0..n - 1 {
            rank[k] = self.rank(&w[k..k + 2]);
        }
        let mut m = n;
        while m > 1 {
            let mut best = NONE;
            let mut bi = 0;
            for (k, &r) in rank[..m - 1].iter().enumerate() {
                if r < best {
                    best = r;
                    bi = k;
                }
            }
            if best == NONE {
                break;
            }
            // Join part bi with part bi + 1.
            for k in bi + 1..m {
                start[k] = start[k + 1];
            }
            for k in bi + 1..m - 1 {
                rank[k] = rank[k + 1];
            }
            m -= 1;
            rank[bi] = if bi + 1 < m { self.rank(&w[start[bi]..start[bi + 2]]) } else { NONE };
            if bi > 0 {
                rank[bi - 1] = self.rank(&w[start[bi - 1]..start[bi + 1]]);
            }
        }
        for k in 0..m {
            out.push(self.rank(&w[start[k]..start[k + 1]]) + self.num_special);
        }
    }

    /// The same merge for long pieces: a linked list of parts and a min-tree keyed by `(rank, position)`,
    /// whose root is always the left-most pair of minimal rank.
    fn merge_tree(&self, w: &[u8], out: &mut Vec<u32>) {
        const NO: u64 = u64::MAX;
        let n = w.len();
        let size = n.next_power_of_two();
        let mut next: Vec<u32> = (1..=n as u32).collect();
        let mut prev: Vec<u32> = (0..n as u32).map(|i| i.wrapping_sub(1)).collect();
        let mut tree = vec![NO; 2 * size];
        let key = |r: u32, p: usize| if r == NONE { NO } else { ((r as u64) << 32) | p as u64 };
        for i in 0..n - 1 {
            tree[size + i] = key(self.rank(&w[i..i + 2]), i);
        }
        for k in (1..size).rev() {
            tree[k] = tree[2 * k].min(tree[2 * k + 1]);
        }
        fn set(tree: &mut [u64], size: usize, i: usize, v: u64) {
            let mut k = size + i;
            tree[k] = v;
            while k > 1 {
                k >>= 1;
                tree[k] = tree[2 * k].min(tree[2 * k + 1]);
            }
        }
        loop {
            let top = tree[1];
            if top == NO {
                break;
            }
            let p = (top & 0xFFFF_FFFF) as usize;
            let q = next[p] as usize; // the part joined to p
            let r = next[q] as usize; // the part after the joined one
            next[p] = r as u32;
            if r < n {
                prev[r] = p as u32;
            }
            set(&mut tree, size, q, NO);
            let v = if r < n { key(self.rank(&w[p..next[r] as usize]), p) } else { NO };
            set(&mut tree, size, p, v);
            if p > 0 {
                let pp = prev[p] as usize;
                set(&mut tree, size, pp, key(self.rank(&w[pp..r]), pp));
            }
        }
        let mut p = 0;
        while p < n {
            let e = next[p] as usize;
            out.push(self.rank(&w[p..e]) + self.num_special);
            p = e;
        }
    }
}

/// No rank (larger than every rank).
const NONE: u32 = u32::MAX;
/// Pieces up to this many bytes use the flat-array merge.
const LINEAR_MAX: usize = 32;

// ---------------------------------------------------------------------------------------------------------
// Character classes and the split.

/// `\p{L}`.
const LET: u8 = 1;
/// `\p{N}`.
const NUM: u8 = 2;
/// `\s` (White_Space).
const SPC: u8 = 4;
/// `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]`.
const XC: u8 = 8;
/// `[\p{Ll}\p{Lm}\p{Lo}\p{M}]`.
const YC: u8 = 16;

/// Two-level class table: `blocks[index[cp >> 8]][cp & 0xff]`.
struct Table {
    index: Vec<u16>,
    blocks: Vec<[u8; 256]>,
}

impl Table {
    fn build() -> Table {
        let mut flat = vec![0u8; 0x11_0000];
        let mut fill = |ranges: &[(u32, u32)], bits: u8| {
            for &(lo, hi) in ranges {
                for b in &mut flat[lo as usize..=hi as usize] {
                    *b |= bits;
                }
            }
        };
        fill(unicode_data::LETTER, LET);
        fill(unicode_data::NUMBER, NUM);
        fill(unicode_data::WHITE_SPACE, SPC);
        // Lu|Lt are in XC only, Ll in YC only, Lm|Lo (the other letters) and M in both.
        fill(UPPER_TITLE, XC);
        fill(LOWER, YC);
        fill(MARK, XC | YC);
        for b in flat.iter_mut() {
            if *b & LET != 0 && *b & (XC | YC) == 0 {
                *b |= XC | YC;
            }
        }
        let mut index = Vec::with_capacity(0x1100);
        let mut blocks: Vec<[u8; 256]> = Vec::new();
        let mut seen = HashMap::new();
        for chunk in flat.chunks_exact(256) {
            let block: [u8; 256] = chunk.try_into().expect("block size");
            let next = blocks.len();
            let id = *seen.entry(block).or_insert_with(|| {
                blocks.push(block);
                next
            });
            index.push(u16::try_from(id).expect("fewer than 65536 distinct blocks"));
        }
        Table { index, blocks }
    }

    #[inline(always)]
    fn get(&self, cp: u32) -> u8 {
        self.blocks[self.index[(cp >> 8) as usize] as usize][(cp & 0xff) as usize]
    }
}

fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(Table::build)
}

static ASCII: [u8; 128] = {
    let mut t = [0u8; 128];
    let mut i = 0;
    while i < 128 {
        let c = i as u8;
        t[i] = if c.is_ascii_uppercase() {
            LET | XC
        } else if c.is_ascii_lowercase() {
            LET | YC
        } else if c.is_ascii_digit() {
            NUM
        } else if matches!(c, b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | b' ') {
            SPC
        } else {
            0
        };
        i += 1;
    }
    t
};

/// `(code point, byte length, class)` of the character at `i`.
#[inline(always)]
fn at(t: &Table, b: &[u8], i: usize) -> (u32, usize, u8) {
    let b0 = b[i];
    if b0 < 0x80 {
        (b0 as u32, 1, ASCII[b0 as usize])
    } else {
        let (cp, len) = decode(b, i);
        (cp, len, t.get(cp))
    }
}

/// End of the run, from `i`, of characters whose class has a bit of `mask`.
#[inline(always)]
fn run_any(t: &Table, b: &[u8], mut i: usize, mask: u8) -> usize {
    while i < b.len() {
        let (_, len, k) = at(t, b, i);
        if k & mask == 0 {
            break;
        }
        i += len;
    }
    i
}

/// End of the run, from `i`, of characters whose class has no bit of `mask`.
#[inline(always)]
fn run_none(t: &Table, b: &[u8], mut i: usize, mask: u8) -> usize {
    while i < b.len() {
        let (_, len, k) = at(t, b, i);
        if k & mask != 0 {
            break;
        }
        i += len;
    }
    i
}

/// `X*Y+` from `s` (X = `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]`, Y = `[\p{Ll}\p{Lm}\p{Lo}\p{M}]`), with
/// backtracking: the greedy `X*` gives characters back until `Y+` can start. If the character after the
/// X run is in Y, `Y+` runs from there; otherwise it starts at the last character of the X run that is
/// also in Y (and stops right after it, the next one being X-only or the end of the run).
#[inline(always)]
fn x_star_y_plus(t: &Table, b: &[u8], s: usize) -> Option<usize> {
    let mut j = s;
    let mut last_xy_end = None;
    while j < b.len() {
        let (_, len, k) = at(t, b, j);
        if k & XC == 0 {
            if k & YC != 0 {
                return Some(run_any(t, b, j, YC));
            }
            break;
        }
        if k & YC != 0 {
            last_xy_end = Some(j + len);
        }
        j += len;
    }
    last_xy_end
}

/// `X+Y*` from `s`.
#[inline(always)]
fn x_plus_y_star(t: &Table, b: &[u8], s: usize) -> Option<usize> {
    if s >= b.len() {
        return None;
    }
    let e = run_any(t, b, s, XC);
    if e == s {
        return None;
    }
    Some(run_any(t, b, e, YC))
}

/// End of the match of [`TEKKEN_PATTERN`] at `i` (< `b.len()`), and whether the engine would overflow here.
///
/// The alternatives, tried in order (leftmost-first, backtracking):
/// 1. `[^\r\n\p{L}\p{N}]?X*Y+` — first with the optional prefix character, then without;
/// 2. `[^\r\n\p{L}\p{N}]?X+Y*` — the same;
/// 3. `\p{N}` — one character;
/// 4. ` ?[^\s\p{L}\p{N}]+[\r\n/]*`;
/// 5. `\s*[\r\n]+` — the white-space run `W` from here up to and including its last CR/LF;
/// 6. `\s+(?!\S)` — all of `W` at the end of the text, else `W` minus its last character;
/// 7. `\s+` — all of `W` (a single white-space character before a non-space).
///
/// Every character is matched by one of them, so the matches tile the text.
#[inline(always)]
fn match_at(t: &Table, b: &[u8], i: usize) -> (usize, bool) {
    let n = b.len();
    let (c0, l0, k0) = at(t, b, i);
    let j = i + l0;
    let prefix = k0 & (LET | NUM) == 0 && c0 != b'\r' as u32 && c0 != b'\n' as u32 && j < n;
    // 1.
    if prefix {
        if let Some(e) = x_star_y_plus(t, b, j) {
            return (e, false);
        }
    }
    if let Some(e) = x_star_y_plus(t, b, i) {
        return (e, false);
    }
    // 2.
    if prefix {
        if let Some(e) = x_plus_y_star(t, b, j) {
            return (e, false);
        }
    }
    if let Some(e) = x_plus_y_star(t, b, i) {
        return (e, false);
    }
    // 3.
    if k0 & NUM != 0 {
        return (j, false);
    }
    // 4.
    let tail = |mut e: usize| {
        while e < n && matches!(b[e], b'\r' | b'\n' | b'/') {
            e += 1;
        }
        e
    };
    if c0 == b' ' as u32 && j < n {
        let (_, l1, k1) = at(t, b, j);
        if k1 & (SPC | LET | NUM) == 0 {
            return (tail(run_none(t, b, j + l1, SPC | LET | NUM)), false);
        }
    }
    if k0 & (SPC | LET | NUM) == 0 {
        return (tail(run_none(t, b, j, SPC | LET | NUM)), false);
    }
    // 5-7: white space.
    debug_assert!(k0 & SPC != 0);
    let mut last_crlf_end = if c0 == b'\r' as u32 || c0 == b'\n' as u32 { j } else { 0 };
    let mut last_start = i;
    let mut e = j;
    let mut chars = 1;
    while e < n {
        let (c, l, k) = at(t, b, e);
        if k & SPC == 0 {
            break;
        }
        if c == b'\r' as u32 || c == b'\n' as u32 {
            last_crlf_end = e + l;
        }
        last_start = e;
        e += l;
        chars += 1;
    }
    if last_crlf_end != 0 {
        (last_crlf_end, false)
    } else if e == n || last_start == i {
        (e, chars >= TEKKEN_STACK_LIMIT_RUN)
    } else {
        (last_start, chars >= TEKKEN_STACK_LIMIT_RUN)
    }
}

/// Calls `f` with each piece of `text`, in order; returns the byte offset of the first piece at which
/// `tiktoken`'s engine would fail, if any.
fn for_each_piece(text: &str, mut f: impl FnMut(&[u8])) -> Option<usize> {
    let t = table();
    let b = text.as_bytes();
    let mut i = 0;
    let mut overflow = None;
    while i < b.len() {
        let (e, over) = match_at(t, b, i);
        if over && overflow.is_none() {
            overflow = Some(i);
        }
        f(&b[i..e]);
        i = e;
    }
    overflow
}

// ---------------------------------------------------------------------------------------------------------
// Generated by `MMROUTER_TOKENIZE_REGEN=1 cargo test -p mmrouter-tokenize --lib tekken`, from `regex-syntax`
// 0.8 (Unicode 16.0). Do not edit by hand.
// BEGIN GENERATED
/// `[\p{Lu}\p{Lt}]`.
#[rustfmt::skip]
const UPPER_TITLE: &[(u32, u32)] = &[
    (0x0041, 0x005A), (0x00C0, 0x00D6), (0x00D8, 0x00DE), (0x0100, 0x0100), (0x0102, 0x0102), (0x0104, 0x0104),
    (0x0106, 0x0106), (0x0108, 0x0108), (0x010A, 0x010A), (0x010C, 0x010C), (0x010E, 0x010E), (0x0110, 0x0110),
    (0x0112, 0x0112), (0x0114, 0x0114), (0x0116, 0x0116), (0x0118, 0x0118), (0x011A, 0x011A), (0x011C, 0x011C),
    (0x011E, 0x011E), (0x0120, 0x0120), (0x0122, 0x0122), (0x0124, 0x0124), (0x0126, 0x0126), (0x0128, 0x0128),
    (0x012A, 0x012A), (0x012C, 0x012C), (0x012E, 0x012E), (0x0130, 0x0130), (0x0132, 0x0132), (0x0134, 0x0134),
    (0x0136, 0x0136), (0x0139, 0x0139), (0x013B, 0x013B), (0x013D, 0x013D), (0x013F, 0x013F), (0x0141, 0x0141),
    (0x0143, 0x0143), (0x0145, 0x0145), (0x0147, 0x0147), (0x014A, 0x014A), (0x014C, 0x014C), (0x014E, 0x014E),
    (0x0150, 0x0150), (0x0152, 0x0152), (0x0154, 0x0154), (0x0156, 0x0156), (0x0158, 0x0158), (0x015A, 0x015A),
    (0x015C, 0x015C), (0x015E, 0x015E), (0x0160, 0x0160), (0x0162, 0x0162), (0x0164, 0x0164), (0x0166, 0x0166),
    (0x0168, 0x0168), (0x016A, 0x016A), (0x016C, 0x016C), (0x016E, 0x016E), (0x0170, 0x0170), (0x0172, 0x0172),
    (0x0174, 0x0174), (0x0176, 0x0176), (0x0178, 0x0179), (0x017B, 0x017B), (0x017D, 0x017D), (0x0181, 0x0182),
    (0x0184, 0x0184), (0x0186, 0x0187), (0x0189, 0x018B), (0x018E, 0x0191), (0x0193, 0x0194), (0x0196, 0x0198),
    (0x019C, 0x019D), (0x019F, 0x01A0), (0x01A2, 0x01A2), (0x01A4, 0x01A4), (0x01A6, 0x01A7), (0x01A9, 0x01A9),
    (0x01AC, 0x01AC), (0x01AE, 0x01AF), (0x01B1, 0x01B3), (0x01B5, 0x01B5), (0x01B7, 0x01B8), (0x01BC, 0x01BC),
    (0x01C4, 0x01C5), (0x01C7, 0x01C8), (0x01CA, 0x01CB), (0x01CD, 0x01CD), (0x01CF, 0x01CF), (0x01D1, 0x01D1),
    (0x01D3, 0x01D3), (0x01D5, 0x01D5), (0x01D7, 0x01D7), (0x01D9, 0x01D9), (0x01DB, 0x01DB), (0x01DE, 0x01DE),
    (0x01E0, 0x01E0), (0x01E2, 0x01E2), (0x01E4, 0x01E4), (0x01E6, 0x01E6), (0x01E8, 0x01E8), (0x01EA, 0x01EA),
    (0x01EC, 0x01EC), (0x01EE, 0x01EE), (0x01F1, 0x01F2), (0x01F4, 0x01F4), (0x01F6, 0x01F8), (0x01FA, 0x01FA),
    (0x01FC, 0x01FC), (0x01FE, 0x01FE), (0x0200, 0x0200), (0x0202, 0x0202), (0x0204, 0x0204), (0x0206, 0x0206),
    (0x0208, 0x0208), (0x020A, 0x020A), (0x020C, 0x020C), (0x020E, 0x020E), (0x0210, 0x0210), (0x0212, 0x0212),
    (0x0214, 0x0214), (0x0216, 0x0216), (0x0218, 0x0218), (0x021A, 0x021A), (0x021C, 0x021C), (0x021E, 0x021E),
    (0x0220, 0x0220), (0x0222, 0x0222), (0x0224, 0x0224), (0x0226, 0x0226), (0x0228, 0x0228), (0x022A, 0x022A),
    (0x022C, 0x022C), (0x022E, 0x022E), (0x0230, 0x0230), (0x0232, 0x0232), (0x023A, 0x023B), (0x023D, 0x023E),
    (0x0241, 0x0241), (0x0243, 0x0246), (0x0248, 0x0248), (0x024A, 0x024A), (0x024C, 0x024C), (0x024E, 0x024E),
    (0x0370, 0x0370), (0x0372, 0x0372), (0x0376, 0x0376), (0x037F, 0x037F), (0x0386, 0x0386), (0x0388, 0x038A),
    (0x038C, 0x038C), (0x038E, 0x038F), (0x0391, 0x03A1), (0x03A3, 0x03AB), (0x03CF, 0x03CF), (0x03D2, 0x03D4),
    (0x03D8, 0x03D8), (0x03DA, 0x03DA), (0x03DC, 0x03DC), (0x03DE, 0x03DE), (0x03E0, 0x03E0), (0x03E2, 0x03E2),
    (0x03E4, 0x03E4), (0x03E6, 0x03E6), (0x03E8, 0x03E8), (0x03EA, 0x03EA), (0x03EC, 0x03EC), (0x03EE, 0x03EE),
    (0x03F4, 0x03F4), (0x03F7, 0x03F7), (0x03F9, 0x03FA), (0x03FD, 0x042F), (0x0460, 0x0460), (0x0462, 0x0462),
    (0x0464, 0x0464), (0x0466, 0x0466), (0x0468, 0x0468), (0x046A, 0x046A), (0x046C, 0x046C), (0x046E, 0x046E),
    (0x0470, 0x0470), (0x0472, 0x0472), (0x0474, 0x0474), (0x0476, 0x0476), (0x0478, 0x0478), (0x047A, 0x047A),
    (0x047C, 0x047C), (0x047E, 0x047E), (0x0480, 0x0480), (0x048A, 0x048A), (0x048C, 0x048C), (0x048E, 0x048E),
    (0x0490, 0x0490), (0x0492, 0x0492), (0x0494, 0x0494), (0x0496, 0x0496), (0x0498, 0x0498), (0x049A, 0x049A),
    (0x049C, 0x049C), (0x049E, 0x049E), (0x04A0, 0x04A0), (0x04A2, 0x04A2), (0x04A4, 0x04A4), (0x04A6, 0x04A6),
    (0x04A8, 0x04A8), (0x04AA, 0x04AA), (0x04AC, 0x04AC), (0x04AE, 0x04AE), (0x04B0, 0x04B0), (0x04B2, 0x04B2),
    (0x04B4, 0x04B4), (0x04B6, 0x04B6), (0x04B8, 0x04B8), (0x04BA, 0x04BA), (0x04BC, 0x04BC), (0x04BE, 0x04BE),
    (0x04C0, 0x04C1), (0x04C3, 0x04C3), (0x04C5, 0x04C5), (0x04C7, 0x04C7), (0x04C9, 0x04C9), (0x04CB, 0x04CB),
    (0x04CD, 0x04CD), (0x04D0, 0x04D0), (0x04D2, 0x04D2), (0x04D4, 0x04D4), (0x04D6, 0x04D6), (0x04D8, 0x04D8),
    (0x04DA, 0x04DA), (0x04DC, 0x04DC), (0x04DE, 0x04DE), (0x04E0, 0x04E0), (0x04E2, 0x04E2), (0x04E4, 0x04E4),
    (0x04E6, 0x04E6), (0x04E8, 0x04E8), (0x04EA, 0x04EA), (0x04EC, 0x04EC), (0x04EE, 0x04EE), (0x04F0, 0x04F0),
    (0x04F2, 0x04F2), (0x04F4, 0x04F4), (0x04F6, 0x04F6), (0x04F8, 0x04F8), (0x04FA, 0x04FA), (0x04FC, 0x04FC),
    (0x04FE, 0x04FE), (0x0500, 0x0500), (0x0502, 0x0502), (0x0504, 0x0504), (0x0506, 0x0506), (0x0508, 0x0508),
    (0x050A, 0x050A), (0x050C, 0x050C), (0x050E, 0x050E), (0x0510, 0x0510), (0x0512, 0x0512), (0x0514, 0x0514),
    (0x0516, 0x0516), (0x0518, 0x0518), (0x051A, 0x051A), (0x051C, 0x051C), (0x051E, 0x051E), (0x0520, 0x0520),
    (0x0522, 0x0522), (0x0524, 0x0524), (0x0526, 0x0526), (0x0528, 0x0528), (0x052A, 0x052A), (0x052C, 0x052C),
    (0x052E, 0x052E), (0x0531, 0x0556), (0x10A0, 0x10C5), (0x10C7, 0x10C7), (0x10CD, 0x10CD), (0x13A0, 0x13F5),
    (0x1C89, 0x1C89), (0x1C90, 0x1CBA), (0x1CBD, 0x1CBF), (0x1E00, 0x1E00), (0x1E02, 0x1E02), (0x1E04, 0x1E04),
    (0x1E06, 0x1E06), (0x1E08, 0x1E08), (0x1E0A, 0x1E0A), (0x1E0C, 0x1E0C), (0x1E0E, 0x1E0E), (0x1E10, 0x1E10),
    (0x1E12, 0x1E12), (0x1E14, 0x1E14), (0x1E16, 0x1E16), (0x1E18, 0x1E18), (0x1E1A, 0x1E1A), (0x1E1C, 0x1E1C),
    (0x1E1E, 0x1E1E), (0x1E20, 0x1E20), (0x1E22, 0x1E22), (0x1E24, 0x1E24), (0x1E26, 0x1E26), (0x1E28, 0x1E28),
    (0x1E2A, 0x1E2A), (0x1E2C, 0x1E2C), (0x1E2E, 0x1E2E), (0x1E30, 0x1E30), (0x1E32, 0x1E32), (0x1E34, 0x1E34),
    (0x1E36, 0x1E36), (0x1E38, 0x1E38), (0x1E3A, 0x1E3A), (0x1E3C, 0x1E3C), (0x1E3E, 0x1E3E), (0x1E40, 0x1E40),
    (0x1E42, 0x1E42), (0x1E44, 0x1E44), (0x1E46, 0x1E46), (0x1E48, 0x1E48), (0x1E4A, 0x1E4A), (0x1E4C, 0x1E4C),
    (0x1E4E, 0x1E4E), (0x1E50, 0x1E50), (0x1E52, 0x1E52), (0x1E54, 0x1E54), (0x1E56, 0x1E56), (0x1E58, 0x1E58),
    (0x1E5A, 0x1E5A), (0x1E5C, 0x1E5C), (0x1E5E, 0x1E5E), (0x1E60, 0x1E60), (0x1E62, 0x1E62), (0x1E64, 0x1E64),
    (0x1E66, 0x1E66), (0x1E68, 0x1E68), (0x1E6A, 0x1E6A), (0x1E6C, 0x1E6C), (0x1E6E, 0x1E6E), (0x1E70, 0x1E70),
    (0x1E72, 0x1E72), (0x1E74, 0x1E74), (0x1E76, 0x1E76), (0x1E78, 0x1E78), (0x1E7A, 0x1E7A), (0x1E7C, 0x1E7C),
    (0x1E7E, 0x1E7E), (0x1E80, 0x1E80), (0x1E82, 0x1E82), (0x1E84, 0x1E84), (0x1E86, 0x1E86), (0x1E88, 0x1E88),
    (0x1E8A, 0x1E8A), (0x1E8C, 0x1E8C), (0x1E8E, 0x1E8E), (0x1E90, 0x1E90), (0x1E92, 0x1E92), (0x1E94, 0x1E94),
    (0x1E9E, 0x1E9E), (0x1EA0, 0x1EA0), (0x1EA2, 0x1EA2), (0x1EA4, 0x1EA4), (0x1EA6, 0x1EA6), (0x1EA8, 0x1EA8),
    (0x1EAA, 0x1EAA), (0x1EAC, 0x1EAC), (0x1EAE, 0x1EAE), (0x1EB0, 0x1EB0), (0x1EB2, 0x1EB2), (0x1EB4, 0x1EB4),
    (0x1EB6, 0x1EB6), (0x1EB8, 0x1EB8), (0x1EBA, 0x1EBA), (0x1EBC, 0x1EBC), (0x1EBE, 0x1EBE), (0x1EC0, 0x1EC0),
    (0x1EC2, 0x1EC2), (0x1EC4, 0x1EC4), (0x1EC6, 0x1EC6), (0x1EC8, 0x1EC8), (0x1ECA, 0x1ECA), (0x1ECC, 0x1ECC),
    (0x1ECE, 0x1ECE), (0x1ED0, 0x1ED0), (0x1ED2, 0x1ED2), (0x1ED4, 0x1ED4), (0x1ED6, 0x1ED6), (0x1ED8, 0x1ED8),
    (0x1EDA, 0x1EDA), (0x1EDC, 0x1EDC), (0x1EDE, 0x1EDE), (0x1EE0, 0x1EE0), (0x1EE2, 0x1EE2), (0x1EE4, 0x1EE4),
    (0x1EE6, 0x1EE6), (0x1EE8, 0x1EE8), (0x1EEA, 0x1EEA), (0x1EEC, 0x1EEC), (0x1EEE, 0x1EEE), (0x1EF0, 0x1EF0),
    (0x1EF2, 0x1EF2), (0x1EF4, 0x1EF4), (0x1EF6, 0x1EF6), (0x1EF8, 0x1EF8), (0x1EFA, 0x1EFA), (0x1EFC, 0x1EFC),
    (0x1EFE, 0x1EFE), (0x1F08, 0x1F0F), (0x1F18, 0x1F1D), (0x1F28, 0x1F2F), (0x1F38, 0x1F3F), (0x1F48, 0x1F4D),
    (0x1F59, 0x1F59), (0x1F5B, 0x1F5B), (0x1F5D, 0x1F5D), (0x1F5F, 0x1F5F), (0x1F68, 0x1F6F), (0x1F88, 0x1F8F),
    (0x1F98, 0x1F9F), (0x1FA8, 0x1FAF), (0x1FB8, 0x1FBC), (0x1FC8, 0x1FCC), (0x1FD8, 0x1FDB), (0x1FE8, 0x1FEC),
    (0x1FF8, 0x1FFC), (0x2102, 0x2102), (0x2107, 0x2107), (0x210B, 0x210D), (0x2110, 0x2112), (0x2115, 0x2115),
    (0x2119, 0x211D), (0x2124, 0x2124), (0x2126, 0x2126), (0x2128, 0x2128), (0x212A, 0x212D), (0x2130, 0x2133),
    (0x213E, 0x213F), (0x2145, 0x2145), (0x2183, 0x2183), (0x2C00, 0x2C2F), (0x2C60, 0x2C60), (0x2C62, 0x2C64),
    (0x2C67, 0x2C67), (0x2C69, 0x2C69), (0x2C6B, 0x2C6B), (0x2C6D, 0x2C70), (0x2C72, 0x2C72), (0x2C75, 0x2C75),
    (0x2C7E, 0x2C80), (0x2C82, 0x2C82), (0x2C84, 0x2C84), (0x2C86, 0x2C86), (0x2C88, 0x2C88), (0x2C8A, 0x2C8A),
    (0x2C8C, 0x2C8C), (0x2C8E, 0x2C8E), (0x2C90, 0x2C90), (0x2C92, 0x2C92), (0x2C94, 0x2C94), (0x2C96, 0x2C96),
    (0x2C98, 0x2C98), (0x2C9A, 0x2C9A), (0x2C9C, 0x2C9C), (0x2C9E, 0x2C9E), (0x2CA0, 0x2CA0), (0x2CA2, 0x2CA2),
    (0x2CA4, 0x2CA4), (0x2CA6, 0x2CA6), (0x2CA8, 0x2CA8), (0x2CAA, 0x2CAA), (0x2CAC, 0x2CAC), (0x2CAE, 0x2CAE),
    (0x2CB0, 0x2CB0), (0x2CB2, 0x2CB2), (0x2CB4, 0x2CB4), (0x2CB6, 0x2CB6), (0x2CB8, 0x2CB8), (0x2CBA, 0x2CBA),
    (0x2CBC, 0x2CBC), (0x2CBE, 0x2CBE), (0x2CC0, 0x2CC0), (0x2CC2, 0x2CC2), (0x2CC4, 0x2CC4), (0x2CC6, 0x2CC6),
    (0x2CC8, 0x2CC8), (0x2CCA, 0x2CCA), (0x2CCC, 0x2CCC), (0x2CCE, 0x2CCE), (0x2CD0, 0x2CD0), (0x2CD2, 0x2CD2),
    (0x2CD4, 0x2CD4), (0x2CD6, 0x2CD6), (0x2CD8, 0x2CD8), (0x2CDA, 0x2CDA), (0x2CDC, 0x2CDC), (0x2CDE, 0x2CDE),
    (0x2CE0, 0x2CE0), (0x2CE2, 0x2CE2), (0x2CEB, 0x2CEB), (0x2CED, 0x2CED), (0x2CF2, 0x2CF2), (0xA640, 0xA640),
    (0xA642, 0xA642), (0xA644, 0xA644), (0xA646, 0xA646), (0xA648, 0xA648), (0xA64A, 0xA64A), (0xA64C, 0xA64C),
    (0xA64E, 0xA64E), (0xA650, 0xA650), (0xA652, 0xA652), (0xA654, 0xA654), (0xA656, 0xA656), (0xA658, 0xA658),
    (0xA65A, 0xA65A), (0xA65C, 0xA65C), (0xA65E, 0xA65E), (0xA660, 0xA660), (0xA662, 0xA662), (0xA664, 0xA664),
    (0xA666, 0xA666), (0xA668, 0xA668), (0xA66A, 0xA66A), (0xA66C, 0xA66C), (0xA680, 0xA680), (0xA682, 0xA682),
    (0xA684, 0xA684), (0xA686, 0xA686), (0xA688, 0xA688), (0xA68A, 0xA68A), (0xA68C, 0xA68C), (0xA68E, 0xA68E),
    (0xA690, 0xA690), (0xA692, 0xA692), (0xA694, 0xA694), (0xA696, 0xA696), (0xA698, 0xA698), (0xA69A, 0xA69A),
    (0xA722, 0xA722), (0xA724, 0xA724), (0xA726, 0xA726), (0xA728, 0xA728), (0xA72A, 0xA72A), (0xA72C, 0xA72C),
    (0xA72E, 0xA72E), (0xA732, 0xA732), (0xA734, 0xA734), (0xA736, 0xA736), (0xA738, 0xA738), (0xA73A, 0xA73A),
    (0xA73C, 0xA73C), (0xA73E, 0xA73E), (0xA740, 0xA740), (0xA742, 0xA742), (0xA744, 0xA744), (0xA746, 0xA746),
    (0xA748, 0xA748), (0xA74A, 0xA74A), (0xA74C, 0xA74C), (0xA74E, 0xA74E), (0xA750, 0xA750), (0xA752, 0xA752),
    (0xA754, 0xA754), (0xA756, 0xA756), (0xA758, 0xA758), (0xA75A, 0xA75A), (0xA75C, 0xA75C), (0xA75E, 0xA75E),
    (0xA760, 0xA760), (0xA762, 0xA762), (0xA764, 0xA764), (0xA766, 0xA766), (0xA768, 0xA768), (0xA76A, 0xA76A),
    (0xA76C, 0xA76C), (0xA76E, 0xA76E), (0xA779, 0xA779), (0xA77B, 0xA77B), (0xA77D, 0xA77E), (0xA780, 0xA780),
    (0xA782, 0xA782), (0xA784, 0xA784), (0xA786, 0xA786), (0xA78B, 0xA78B), (0xA78D, 0xA78D), (0xA790, 0xA790),
    (0xA792, 0xA792), (0xA796, 0xA796), (0xA798, 0xA798), (0xA79A, 0xA79A), (0xA79C, 0xA79C), (0xA79E, 0xA79E),
    (0xA7A0, 0xA7A0), (0xA7A2, 0xA7A2), (0xA7A4, 0xA7A4), (0xA7A6, 0xA7A6), (0xA7A8, 0xA7A8), (0xA7AA, 0xA7AE),
    (0xA7B0, 0xA7B4), (0xA7B6, 0xA7B6), (0xA7B8, 0xA7B8), (0xA7BA, 0xA7BA), (0xA7BC, 0xA7BC), (0xA7BE, 0xA7BE),
    (0xA7C0, 0xA7C0), (0xA7C2, 0xA7C2), (0xA7C4, 0xA7C7), (0xA7C9, 0xA7C9), (0xA7CB, 0xA7CC), (0xA7D0, 0xA7D0),
    (0xA7D6, 0xA7D6), (0xA7D8, 0xA7D8), (0xA7DA, 0xA7DA), (0xA7DC, 0xA7DC), (0xA7F5, 0xA7F5), (0xFF21, 0xFF3A),
    (0x10400, 0x10427), (0x104B0, 0x104D3), (0x10570, 0x1057A), (0x1057C, 0x1058A), (0x1058C, 0x10592), (0x10594, 0x10595),
    (0x10C80, 0x10CB2), (0x10D50, 0x10D65), (0x118A0, 0x118BF), (0x16E40, 0x16E5F), (0x1D400, 0x1D419), (0x1D434, 0x1D44D),
    (0x1D468, 0x1D481), (0x1D49C, 0x1D49C), (0x1D49E, 0x1D49F), (0x1D4A2, 0x1D4A2), (0x1D4A5, 0x1D4A6), (0x1D4A9, 0x1D4AC),
    (0x1D4AE, 0x1D4B5), (0x1D4D0, 0x1D4E9), (0x1D504, 0x1D505), (0x1D507, 0x1D50A), (0x1D50D, 0x1D514), (0x1D516, 0x1D51C),
    (0x1D538, 0x1D539), (0x1D53B, 0x1D53E), (0x1D540, 0x1D544), (0x1D546, 0x1D546), (0x1D54A, 0x1D550), (0x1D56C, 0x1D585),
    (0x1D5A0, 0x1D5B9), (0x1D5D4, 0x1D5ED), (0x1D608, 0x1D621), (0x1D63C, 0x1D655), (0x1D670, 0x1D689), (0x1D6A8, 0x1D6C0),
    (0x1D6E2, 0x1D6FA), (0x1D71C, 0x1D734), (0x1D756, 0x1D76E), (0x1D790, 0x1D7A8), (0x1D7CA, 0x1D7CA), (0x1E900, 0x1E921),
];
/// `\p{Ll}`.
#[rustfmt::skip]
const LOWER: &[(u32, u32)] = &[
    (0x0061, 0x007A), (0x00B5, 0x00B5), (0x00DF, 0x00F6), (0x00F8, 0x00FF), (0x0101, 0x0101), (0x0103, 0x0103),
    (0x0105, 0x0105), (0x0107, 0x0107), (0x0109, 0x0109), (0x010B, 0x010B), (0x010D, 0x010D), (0x010F, 0x010F),
    (0x0111, 0x0111), (0x0113, 0x0113), (0x0115, 0x0115), (0x0117, 0x0117), (0x0119, 0x0119), (0x011B, 0x011B),
    (0x011D, 0x011D), (0x011F, 0x011F), (0x0121, 0x0121), (0x0123, 0x0123), (0x0125, 0x0125), (0x0127, 0x0127),
    (0x0129, 0x0129), (0x012B, 0x012B), (0x012D, 0x012D), (0x012F, 0x012F), (0x0131, 0x0131), (0x0133, 0x0133),
    (0x0135, 0x0135), (0x0137, 0x0138), (0x013A, 0x013A), (0x013C, 0x013C), (0x013E, 0x013E), (0x0140, 0x0140),
    (0x0142, 0x0142), (0x0144, 0x0144), (0x0146, 0x0146), (0x0148, 0x0149), (0x014B, 0x014B), (0x014D, 0x014D),
    (0x014F, 0x014F), (0x0151, 0x0151), (0x0153, 0x0153), (0x0155, 0x0155), (0x0157, 0x0157), (0x0159, 0x0159),
    (0x015B, 0x015B), (0x015D, 0x015D), (0x015F, 0x015F), (0x0161, 0x0161), (0x0163, 0x0163), (0x0165, 0x0165),
    (0x0167, 0x0167), (0x0169, 0x0169), (0x016B, 0x016B), (0x016D, 0x016D), (0x016F, 0x016F), (0x0171, 0x0171),
    (0x0173, 0x0173), (0x0175, 0x0175), (0x0177, 0x0177), (0x017A, 0x017A), (0x017C, 0x017C), (0x017E, 0x0180),
    (0x0183, 0x0183), (0x0185, 0x0185), (0x0188, 0x0188), (0x018C, 0x018D), (0x0192, 0x0192), (0x0195, 0x0195),
    (0x0199, 0x019B), (0x019E, 0x019E), (0x01A1, 0x01A1), (0x01A3, 0x01A3), (0x01A5, 0x01A5), (0x01A8, 0x01A8),
    (0x01AA, 0x01AB), (0x01AD, 0x01AD), (0x01B0, 0x01B0), (0x01B4, 0x01B4), (0x01B6, 0x01B6), (0x01B9, 0x01BA),
    (0x01BD, 0x01BF), (0x01C6, 0x01C6), (0x01C9, 0x01C9), (0x01CC, 0x01CC), (0x01CE, 0x01CE), (0x01D0, 0x01D0),
    (0x01D2, 0x01D2), (0x01D4, 0x01D4), (0x01D6, 0x01D6), (0x01D8, 0x01D8), (0x01DA, 0x01DA), (0x01DC, 0x01DD),
    (0x01DF, 0x01DF), (0x01E1, 0x01E1), (0x01E3, 0x01E3), (0x01E5, 0x01E5), (0x01E7, 0x01E7), (0x01E9, 0x01E9),
    (0x01EB, 0x01EB), (0x01ED, 0x01ED), (0x01EF, 0x01F0), (0x01F3, 0x01F3), (0x01F5, 0x01F5), (0x01F9, 0x01F9),
    (0x01FB, 0x01FB), (0x01FD, 0x01FD), (0x01FF, 0x01FF), (0x0201, 0x0201), (0x0203, 0x0203), (0x0205, 0x0205),
    (0x0207, 0x0207), (0x0209, 0x0209), (0x020B, 0x020B), (0x020D, 0x020D), (0x020F, 0x020F), (0x0211, 0x0211),
    (0x0213, 0x0213), (0x0215, 0x0215), (0x0217, 0x0217), (0x0219, 0x0219), (0x021B, 0x021B), (0x021D, 0x021D),
    (0x021F, 0x021F), (0x0221, 0x0221), (0x0223, 0x0223), (0x0225, 0x0225), (0x0227, 0x0227), (0x0229, 0x0229),
    (0x022B, 0x022B), (0x022D, 0x022D), (0x022F, 0x022F), (0x0231, 0x0231), (0x0233, 0x0239), (0x023C, 0x023C),
    (0x023F, 0x0240), (0x0242, 0x0242), (0x0247, 0x0247), (0x0249, 0x0249), (0x024B, 0x024B), (0x024D, 0x024D),
    (0x024F, 0x0293), (0x0295, 0x02AF), (0x0371, 0x0371), (0x0373, 0x0373), (0x0377, 0x0377), (0x037B, 0x037D),
    (0x0390, 0x0390), (0x03AC, 0x03CE), (0x03D0, 0x03D1), (0x03D5, 0x03D7), (0x03D9, 0x03D9), (0x03DB, 0x03DB),
    (0x03DD, 0x03DD), (0x03DF, 0x03DF), (0x03E1, 0x03E1), (0x03E3, 0x03E3), (0x03E5, 0x03E5), (0x03E7, 0x03E7),
    (0x03E9, 0x03E9), (0x03EB, 0x03EB), (0x03ED, 0x03ED), (0x03EF, 0x03F3), (0x03F5, 0x03F5), (0x03F8, 0x03F8),
    (0x03FB, 0x03FC), (0x0430, 0x045F), (0x0461, 0x0461), (0x0463, 0x0463), (0x0465, 0x0465), (0x0467, 0x0467),
    (0x0469, 0x0469), (0x046B, 0x046B), (0x046D, 0x046D), (0x046F, 0x046F), (0x0471, 0x0471), (0x0473, 0x0473),
    (0x0475, 0x0475), (0x0477, 0x0477), (0x0479, 0x0479), (0x047B, 0x047B), (0x047D, 0x047D), (0x047F, 0x047F),
    (0x0481, 0x0481), (0x048B, 0x048B), (0x048D, 0x048D), (0x048F, 0x048F), (0x0491, 0x0491), (0x0493, 0x0493),
    (0x0495, 0x0495), (0x0497, 0x0497), (0x0499, 0x0499), (0x049B, 0x049B), (0x049D, 0x049D), (0x049F, 0x049F),
    (0x04A1, 0x04A1), (0x04A3, 0x04A3), (0x04A5, 0x04A5), (0x04A7, 0x04A7), (0x04A9, 0x04A9), (0x04AB, 0x04AB),
    (0x04AD, 0x04AD), (0x04AF, 0x04AF), (0x04B1, 0x04B1), (0x04B3, 0x04B3), (0x04B5, 0x04B5), (0x04B7, 0x04B7),
    (0x04B9, 0x04B9), (0x04BB, 0x04BB), (0x04BD, 0x04BD), (0x04BF, 0x04BF), (0x04C2, 0x04C2), (0x04C4, 0x04C4),
    (0x04C6, 0x04C6), (0x04C8, 0x04C8), (0x04CA, 0x04CA), (0x04CC, 0x04CC), (0x04CE, 0x04CF), (0x04D1, 0x04D1),
    (0x04D3, 0x04D3), (0x04D5, 0x04D5), (0x04D7, 0x04D7), (0x04D9, 0x04D9), (0x04DB, 0x04DB), (0x04DD, 0x04DD),
    (0x04DF, 0x04DF), (0x04E1, 0x04E1), (0x04E3, 0x04E3), (0x04E5, 0x04E5), (0x04E7, 0x04E7), (0x04E9, 0x04E9),
    (0x04EB, 0x04EB), (0x04ED, 0x04ED), (0x04EF, 0x04EF), (0x04F1, 0x04F1), (0x04F3, 0x04F3), (0x04F5, 0x04F5),
    (0x04F7, 0x04F7), (0x04F9, 0x04F9), (0x04FB, 0x04FB), (0x04FD, 0x04FD), (0x04FF, 0x04FF), (0x0501, 0x0501),
    (0x0503, 0x0503), (0x0505, 0x0505), (0x0507, 0x0507), (0x0509, 0x0509), (0x050B, 0x050B), (0x050D, 0x050D),
    (0x050F, 0x050F), (0x0511, 0x0511), (0x0513, 0x0513), (0x0515, 0x0515), (0x0517, 0x0517), (0x0519, 0x0519),
    (0x051B, 0x051B), (0x051D, 0x051D), (0x051F, 0x051F), (0x0521, 0x0521), (0x0523, 0x0523), (0x0525, 0x0525),
    (0x0527, 0x0527), (0x0529, 0x0529), (0x052B, 0x052B), (0x052D, 0x052D), (0x052F, 0x052F), (0x0560, 0x0588),
    (0x10D0, 0x10FA), (0x10FD, 0x10FF), (0x13F8, 0x13FD), (0x1C80, 0x1C88), (0x1C8A, 0x1C8A), (0x1D00, 0x1D2B),
    (0x1D6B, 0x1D77), (0x1D79, 0x1D9A), (0x1E01, 0x1E01), (0x1E03, 0x1E03), (0x1E05, 0x1E05), (0x1E07, 0x1E07),
    (0x1E09, 0x1E09), (0x1E0B, 0x1E0B), (0x1E0D, 0x1E0D), (0x1E0F, 0x1E0F), (0x1E11, 0x1E11), (0x1E13, 0x1E13),
    (0x1E15, 0x1E15), (0x1E17, 0x1E17), (0x1E19, 0x1E19), (0x1E1B, 0x1E1B), (0x1E1D, 0x1E1D), (0x1E1F, 0x1E1F),
    (0x1E21, 0x1E21), (0x1E23, 0x1E23), (0x1E25, 0x1E25), (0x1E27, 0x1E27), (0x1E29, 0x1E29), (0x1E2B, 0x1E2B),
    (0x1E2D, 0x1E2D), (0x1E2F, 0x1E2F), (0x1E31, 0x1E31), (0x1E33, 0x1E33), (0x1E35, 0x1E35), (0x1E37, 0x1E37),
    (0x1E39, 0x1E39), (0x1E3B, 0x1E3B), (0x1E3D, 0x1E3D), (0x1E3F, 0x1E3F), (0x1E41, 0x1E41), (0x1E43, 0x1E43),
    (0x1E45, 0x1E45), (0x1E47, 0x1E47), (0x1E49, 0x1E49), (0x1E4B, 0x1E4B), (0x1E4D, 0x1E4D), (0x1E4F, 0x1E4F),
    (0x1E51, 0x1E51), (0x1E53, 0x1E53), (0x1E55, 0x1E55), (0x1E57, 0x1E57), (0x1E59, 0x1E59), (0x1E5B, 0x1E5B),
    (0x1E5D, 0x1E5D), (0x1E5F, 0x1E5F), (0x1E61, 0x1E61), (0x1E63, 0x1E63), (0x1E65, 0x1E65), (0x1E67, 0x1E67),
    (0x1E69, 0x1E69), (0x1E6B, 0x1E6B), (0x1E6D, 0x1E6D), (0x1E6F, 0x1E6F), (0x1E71, 0x1E71), (0x1E73, 0x1E73),
    (0x1E75, 0x1E75), (0x1E77, 0x1E77), (0x1E79, 0x1E79), (0x1E7B, 0x1E7B), (0x1E7D, 0x1E7D), (0x1E7F, 0x1E7F),
    (0x1E81, 0x1E81), (0x1E83, 0x1E83), (0x1E85, 0x1E85), (0x1E87, 0x1E87), (0x1E89, 0x1E89), (0x1E8B, 0x1E8B),
    (0x1E8D, 0x1E8D), (0x1E8F, 0x1E8F), (0x1E91, 0x1E91), (0x1E93, 0x1E93), (0x1E95, 0x1E9D), (0x1E9F, 0x1E9F),
    (0x1EA1, 0x1EA1), (0x1EA3, 0x1EA3), (0x1EA5, 0x1EA5), (0x1EA7, 0x1EA7), (0x1EA9, 0x1EA9), (0x1EAB, 0x1EAB),
    (0x1EAD, 0x1EAD), (0x1EAF, 0x1EAF), (0x1EB1, 0x1EB1), (0x1EB3, 0x1EB3), (0x1EB5, 0x1EB5), (0x1EB7, 0x1EB7),
    (0x1EB9, 0x1EB9), (0x1EBB, 0x1EBB), (0x1EBD, 0x1EBD), (0x1EBF, 0x1EBF), (0x1EC1, 0x1EC1), (0x1EC3, 0x1EC3),
    (0x1EC5, 0x1EC5), (0x1EC7, 0x1EC7), (0x1EC9, 0x1EC9), (0x1ECB, 0x1ECB), (0x1ECD, 0x1ECD), (0x1ECF, 0x1ECF),
    (0x1ED1, 0x1ED1), (0x1ED3, 0x1ED3), (0x1ED5, 0x1ED5), (0x1ED7, 0x1ED7), (0x1ED9, 0x1ED9), (0x1EDB, 0x1EDB),
    (0x1EDD, 0x1EDD), (0x1EDF, 0x1EDF), (0x1EE1, 0x1EE1), (0x1EE3, 0x1EE3), (0x1EE5, 0x1EE5), (0x1EE7, 0x1EE7),
    (0x1EE9, 0x1EE9), (0x1EEB, 0x1EEB), (0x1EED, 0x1EED), (0x1EEF, 0x1EEF), (0x1EF1, 0x1EF1), (0x1EF3, 0x1EF3),
    (0x1EF5, 0x1EF5), (0x1EF7, 0x1EF7), (0x1EF9, 0x1EF9), (0x1EFB, 0x1EFB), (0x1EFD, 0x1EFD), (0x1EFF, 0x1F07),
    (0x1F10, 0x1F15), (0x1F20, 0x1F27), (0x1F30, 0x1F37), (0x1F40, 0x1F45), (0x1F50, 0x1F57), (0x1F60, 0x1F67),
    (0x1F70, 0x1F7D), (0x1F80, 0x1F87), (0x1F90, 0x1F97), (0x1FA0, 0x1FA7), (0x1FB0, 0x1FB4), (0x1FB6, 0x1FB7),
    (0x1FBE, 0x1FBE), (0x1FC2, 0x1FC4), (0x1FC6, 0x1FC7), (0x1FD0, 0x1FD3), (0x1FD6, 0x1FD7), (0x1FE0, 0x1FE7),
    (0x1FF2, 0x1FF4), (0x1FF6, 0x1FF7), (0x210A, 0x210A), (0x210E, 0x210F), (0x2113, 0x2113), (0x212F, 0x212F),
    (0x2134, 0x2134), (0x2139, 0x2139), (0x213C, 0x213D), (0x2146, 0x2149), (0x214E, 0x214E), (0x2184, 0x2184),
    (0x2C30, 0x2C5F), (0x2C61, 0x2C61), (0x2C65, 0x2C66), (0x2C68, 0x2C68), (0x2C6A, 0x2C6A), (0x2C6C, 0x2C6C),
    (0x2C71, 0x2C71), (0x2C73, 0x2C74), (0x2C76, 0x2C7B), (0x2C81, 0x2C81), (0x2C83, 0x2C83), (0x2C85, 0x2C85),
    (0x2C87, 0x2C87), (0x2C89, 0x2C89), (0x2C8B, 0x2C8B), (0x2C8D, 0x2C8D), (0x2C8F, 0x2C8F), (0x2C91, 0x2C91),
    (0x2C93, 0x2C93), (0x2C95, 0x2C95), (0x2C97, 0x2C97), (0x2C99, 0x2C99), (0x2C9B, 0x2C9B), (0x2C9D, 0x2C9D),
    (0x2C9F, 0x2C9F), (0x2CA1, 0x2CA1), (0x2CA3, 0x2CA3), (0x2CA5, 0x2CA5), (0x2CA7, 0x2CA7), (0x2CA9, 0x2CA9),
    (0x2CAB, 0x2CAB), (0x2CAD, 0x2CAD), (0x2CAF, 0x2CAF), (0x2CB1, 0x2CB1), (0x2CB3, 0x2CB3), (0x2CB5, 0x2CB5),
    (0x2CB7, 0x2CB7), (0x2CB9, 0x2CB9), (0x2CBB, 0x2CBB), (0x2CBD, 0x2CBD), (0x2CBF, 0x2CBF), (0x2CC1, 0x2CC1),
    (0x2CC3, 0x2CC3), (0x2CC5, 0x2CC5), (0x2CC7, 0x2CC7), (0x2CC9, 0x2CC9), (0x2CCB, 0x2CCB), (0x2CCD, 0x2CCD),
    (0x2CCF, 0x2CCF), (0x2CD1, 0x2CD1), (0x2CD3, 0x2CD3), (0x2CD5, 0x2CD5), (0x2CD7, 0x2CD7), (0x2CD9, 0x2CD9),
    (0x2CDB, 0x2CDB), (0x2CDD, 0x2CDD), (0x2CDF, 0x2CDF), (0x2CE1, 0x2CE1), (0x2CE3, 0x2CE4), (0x2CEC, 0x2CEC),
    (0x2CEE, 0x2CEE), (0x2CF3, 0x2CF3), (0x2D00, 0x2D25), (0x2D27, 0x2D27), (0x2D2D, 0x2D2D), (0xA641, 0xA641),
    (0xA643, 0xA643), (0xA645, 0xA645), (0xA647, 0xA647), (0xA649, 0xA649), (0xA64B, 0xA64B), (0xA64D, 0xA64D),
    (0xA64F, 0xA64F), (0xA651, 0xA651), (0xA653, 0xA653), (0xA655, 0xA655), (0xA657, 0xA657), (0xA659, 0xA659),
    (0xA65B, 0xA65B), (0xA65D, 0xA65D), (0xA65F, 0xA65F), (0xA661, 0xA661), (0xA663, 0xA663), (0xA665, 0xA665),
    (0xA667, 0xA667), (0xA669, 0xA669), (0xA66B, 0xA66B), (0xA66D, 0xA66D), (0xA681, 0xA681), (0xA683, 0xA683),
    (0xA685, 0xA685), (0xA687, 0xA687), (0xA689, 0xA689), (0xA68B, 0xA68B), (0xA68D, 0xA68D), (0xA68F, 0xA68F),
    (0xA691, 0xA691), (0xA693, 0xA693), (0xA695, 0xA695), (0xA697, 0xA697), (0xA699, 0xA699), (0xA69B, 0xA69B),
    (0xA723, 0xA723), (0xA725, 0xA725), (0xA727, 0xA727), (0xA729, 0xA729), (0xA72B, 0xA72B), (0xA72D, 0xA72D),
    (0xA72F, 0xA731), (0xA733, 0xA733), (0xA735, 0xA735), (0xA737, 0xA737), (0xA739, 0xA739), (0xA73B, 0xA73B),
    (0xA73D, 0xA73D), (0xA73F, 0xA73F), (0xA741, 0xA741), (0xA743, 0xA743), (0xA745, 0xA745), (0xA747, 0xA747),
    (0xA749, 0xA749), (0xA74B, 0xA74B), (0xA74D, 0xA74D), (0xA74F, 0xA74F), (0xA751, 0xA751), (0xA753, 0xA753),
    (0xA755, 0xA755), (0xA757, 0xA757), (0xA759, 0xA759), (0xA75B, 0xA75B), (0xA75D, 0xA75D), (0xA75F, 0xA75F),
    (0xA761, 0xA761), (0xA763, 0xA763), (0xA765, 0xA765), (0xA767, 0xA767), (0xA769, 0xA769), (0xA76B, 0xA76B),
    (0xA76D, 0xA76D), (0xA76F, 0xA76F), (0xA771, 0xA778), (0xA77A, 0xA77A), (0xA77C, 0xA77C), (0xA77F, 0xA77F),
    (0xA781, 0xA781), (0xA783, 0xA783), (0xA785, 0xA785), (0xA787, 0xA787), (0xA78C, 0xA78C), (0xA78E, 0xA78E),
    (0xA791, 0xA791), (0xA793, 0xA795), (0xA797, 0xA797), (0xA799, 0xA799), (0xA79B, 0xA79B), (0xA79D, 0xA79D),
    (0xA79F, 0xA79F), (0xA7A1, 0xA7A1), (0xA7A3, 0xA7A3), (0xA7A5, 0xA7A5), (0xA7A7, 0xA7A7), (0xA7A9, 0xA7A9),
    (0xA7AF, 0xA7AF), (0xA7B5, 0xA7B5), (0xA7B7, 0xA7B7), (0xA7B9, 0xA7B9), (0xA7BB, 0xA7BB), (0xA7BD, 0xA7BD),
    (0xA7BF, 0xA7BF), (0xA7C1, 0xA7C1), (0xA7C3, 0xA7C3), (0xA7C8, 0xA7C8), (0xA7CA, 0xA7CA), (0xA7CD, 0xA7CD),
    (0xA7D1, 0xA7D1), (0xA7D3, 0xA7D3), (0xA7D5, 0xA7D5), (0xA7D7, 0xA7D7), (0xA7D9, 0xA7D9), (0xA7DB, 0xA7DB),
    (0xA7F6, 0xA7F6), (0xA7FA, 0xA7FA), (0xAB30, 0xAB5A), (0xAB60, 0xAB68), (0xAB70, 0xABBF), (0xFB00, 0xFB06),
    (0xFB13, 0xFB17), (0xFF41, 0xFF5A), (0x10428, 0x1044F), (0x104D8, 0x104FB), (0x10597, 0x105A1), (0x105A3, 0x105B1),
    (0x105B3, 0x105B9), (0x105BB, 0x105BC), (0x10CC0, 0x10CF2), (0x10D70, 0x10D85), (0x118C0, 0x118DF), (0x16E60, 0x16E7F),
    (0x1D41A, 0x1D433), (0x1D44E, 0x1D454), (0x1D456, 0x1D467), (0x1D482, 0x1D49B), (0x1D4B6, 0x1D4B9), (0x1D4BB, 0x1D4BB),
    (0x1D4BD, 0x1D4C3), (0x1D4C5, 0x1D4CF), (0x1D4EA, 0x1D503), (0x1D51E, 0x1D537), (0x1D552, 0x1D56B), (0x1D586, 0x1D59F),
    (0x1D5BA, 0x1D5D3), (0x1D5EE, 0x1D607), (0x1D622, 0x1D63B), (0x1D656, 0x1D66F), (0x1D68A, 0x1D6A5), (0x1D6C2, 0x1D6DA),
    (0x1D6DC, 0x1D6E1), (0x1D6FC, 0x1D714), (0x1D716, 0x1D71B), (0x1D736, 0x1D74E), (0x1D750, 0x1D755), (0x1D770, 0x1D788),
    (0x1D78A, 0x1D78F), (0x1D7AA, 0x1D7C2), (0x1D7C4, 0x1D7C9), (0x1D7CB, 0x1D7CB), (0x1DF00, 0x1DF09), (0x1DF0B, 0x1DF1E),
    (0x1DF25, 0x1DF2A), (0x1E922, 0x1E943),
];
/// `\p{M}`.
#[rustfmt::skip]
const MARK: &[(u32, u32)] = &[
    (0x0300, 0x036F), (0x0483, 0x0489), (0x0591, 0x05BD), (0x05BF, 0x05BF), (0x05C1, 0x05C2), (0x05C4, 0x05C5),
    (0x05C7, 0x05C7), (0x0610, 0x061A), (0x064B, 0x065F), (0x0670, 0x0670), (0x06D6, 0x06DC), (0x06DF, 0x06E4),
    (0x06E7, 0x06E8), (0x06EA, 0x06ED), (0x0711, 0x0711), (0x0730, 0x074A), (0x07A6, 0x07B0), (0x07EB, 0x07F3),
    (0x07FD, 0x07FD), (0x0816, 0x0819), (0x081B, 0x0823), (0x0825, 0x0827), (0x0829, 0x082D), (0x0859, 0x085B),
    (0x0897, 0x089F), (0x08CA, 0x08E1), (0x08E3, 0x0903), (0x093A, 0x093C), (0x093E, 0x094F), (0x0951, 0x0957),
    (0x0962, 0x0963), (0x0981, 0x0983), (0x09BC, 0x09BC), (0x09BE, 0x09C4), (0x09C7, 0x09C8), (0x09CB, 0x09CD),
    (0x09D7, 0x09D7), (0x09E2, 0x09E3), (0x09FE, 0x09FE), (0x0A01, 0x0A03), (0x0A3C, 0x0A3C), (0x0A3E, 0x0A42),
    (0x0A47, 0x0A48), (0x0A4B, 0x0A4D), (0x0A51, 0x0A51), (0x0A70, 0x0A71), (0x0A75, 0x0A75), (0x0A81, 0x0A83),
    (0x0ABC, 0x0ABC), (0x0ABE, 0x0AC5), (0x0AC7, 0x0AC9), (0x0ACB, 0x0ACD), (0x0AE2, 0x0AE3), (0x0AFA, 0x0AFF),
    (0x0B01, 0x0B03), (0x0B3C, 0x0B3C), (0x0B3E, 0x0B44), (0x0B47, 0x0B48), (0x0B4B, 0x0B4D), (0x0B55, 0x0B57),
    (0x0B62, 0x0B63), (0x0B82, 0x0B82), (0x0BBE, 0x0BC2), (0x0BC6, 0x0BC8), (0x0BCA, 0x0BCD), (0x0BD7, 0x0BD7),
    (0x0C00, 0x0C04), (0x0C3C, 0x0C3C), (0x0C3E, 0x0C44), (0x0C46, 0x0C48), (0x0C4A, 0x0C4D), (0x0C55, 0x0C56),
    (0x0C62, 0x0C63), (0x0C81, 0x0C83), (0x0CBC, 0x0CBC), (0x0CBE, 0x0CC4), (0x0CC6, 0x0CC8), (0x0CCA, 0x0CCD),
    (0x0CD5, 0x0CD6), (0x0CE2, 0x0CE3), (0x0CF3, 0x0CF3), (0x0D00, 0x0D03), (0x0D3B, 0x0D3C), (0x0D3E, 0x0D44),
    (0x0D46, 0x0D48), (0x0D4A, 0x0D4D), (0x0D57, 0x0D57), (0x0D62, 0x0D63), (0x0D81, 0x0D83), (0x0DCA, 0x0DCA),
    (0x0DCF, 0x0DD4), (0x0DD6, 0x0DD6), (0x0DD8, 0x0DDF), (0x0DF2, 0x0DF3), (0x0E31, 0x0E31), (0x0E34, 0x0E3A),
    (0x0E47, 0x0E4E), (0x0EB1, 0x0EB1), (0x0EB4, 0x0EBC), (0x0EC8, 0x0ECE), (0x0F18, 0x0F19), (0x0F35, 0x0F35),
    (0x0F37, 0x0F37), (0x0F39, 0x0F39), (0x0F3E, 0x0F3F), (0x0F71, 0x0F84), (0x0F86, 0x0F87), (0x0F8D, 0x0F97),
    (0x0F99, 0x0FBC), (0x0FC6, 0x0FC6), (0x102B, 0x103E), (0x1056, 0x1059), (0x105E, 0x1060), (0x1062, 0x1064),
    (0x1067, 0x106D), (0x1071, 0x1074), (0x1082, 0x108D), (0x108F, 0x108F), (0x109A, 0x109D), (0x135D, 0x135F),
    (0x1712, 0x1715), (0x1732, 0x1734), (0x1752, 0x1753), (0x1772, 0x1773), (0x17B4, 0x17D3), (0x17DD, 0x17DD),
    (0x180B, 0x180D), (0x180F, 0x180F), (0x1885, 0x1886), (0x18A9, 0x18A9), (0x1920, 0x192B), (0x1930, 0x193B),
    (0x1A17, 0x1A1B), (0x1A55, 0x1A5E), (0x1A60, 0x1A7C), (0x1A7F, 0x1A7F), (0x1AB0, 0x1ACE), (0x1B00, 0x1B04),
    (0x1B34, 0x1B44), (0x1B6B, 0x1B73), (0x1B80, 0x1B82), (0x1BA1, 0x1BAD), (0x1BE6, 0x1BF3), (0x1C24, 0x1C37),
    (0x1CD0, 0x1CD2), (0x1CD4, 0x1CE8), (0x1CED, 0x1CED), (0x1CF4, 0x1CF4), (0x1CF7, 0x1CF9), (0x1DC0, 0x1DFF),
    (0x20D0, 0x20F0), (0x2CEF, 0x2CF1), (0x2D7F, 0x2D7F), (0x2DE0, 0x2DFF), (0x302A, 0x302F), (0x3099, 0x309A),
    (0xA66F, 0xA672), (0xA674, 0xA67D), (0xA69E, 0xA69F), (0xA6F0, 0xA6F1), (0xA802, 0xA802), (0xA806, 0xA806),
    (0xA80B, 0xA80B), (0xA823, 0xA827), (0xA82C, 0xA82C), (0xA880, 0xA881), (0xA8B4, 0xA8C5), (0xA8E0, 0xA8F1),
    (0xA8FF, 0xA8FF), (0xA926, 0xA92D), (0xA947, 0xA953), (0xA980, 0xA983), (0xA9B3, 0xA9C0), (0xA9E5, 0xA9E5),
    (0xAA29, 0xAA36), (0xAA43, 0xAA43), (0xAA4C, 0xAA4D), (0xAA7B, 0xAA7D), (0xAAB0, 0xAAB0), (0xAAB2, 0xAAB4),
    (0xAAB7, 0xAAB8), (0xAABE, 0xAABF), (0xAAC1, 0xAAC1), (0xAAEB, 0xAAEF), (0xAAF5, 0xAAF6), (0xABE3, 0xABEA),
    (0xABEC, 0xABED), (0xFB1E, 0xFB1E), (0xFE00, 0xFE0F), (0xFE20, 0xFE2F), (0x101FD, 0x101FD), (0x102E0, 0x102E0),
    (0x10376, 0x1037A), (0x10A01, 0x10A03), (0x10A05, 0x10A06), (0x10A0C, 0x10A0F), (0x10A38, 0x10A3A), (0x10A3F, 0x10A3F),
    (0x10AE5, 0x10AE6), (0x10D24, 0x10D27), (0x10D69, 0x10D6D), (0x10EAB, 0x10EAC), (0x10EFC, 0x10EFF), (0x10F46, 0x10F50),
    (0x10F82, 0x10F85), (0x11000, 0x11002), (0x11038, 0x11046), (0x11070, 0x11070), (0x11073, 0x11074), (0x1107F, 0x11082),
    (0x110B0, 0x110BA), (0x110C2, 0x110C2), (0x11100, 0x11102), (0x11127, 0x11134), (0x11145, 0x11146), (0x11173, 0x11173),
    (0x11180, 0x11182), (0x111B3, 0x111C0), (0x111C9, 0x111CC), (0x111CE, 0x111CF), (0x1122C, 0x11237), (0x1123E, 0x1123E),
    (0x11241, 0x11241), (0x112DF, 0x112EA), (0x11300, 0x11303), (0x1133B, 0x1133C), (0x1133E, 0x11344), (0x11347, 0x11348),
    (0x1134B, 0x1134D), (0x11357, 0x11357), (0x11362, 0x11363), (0x11366, 0x1136C), (0x11370, 0x11374), (0x113B8, 0x113C0),
    (0x113C2, 0x113C2), (0x113C5, 0x113C5), (0x113C7, 0x113CA), (0x113CC, 0x113D0), (0x113D2, 0x113D2), (0x113E1, 0x113E2),
    (0x11435, 0x11446), (0x1145E, 0x1145E), (0x114B0, 0x114C3), (0x115AF, 0x115B5), (0x115B8, 0x115C0), (0x115DC, 0x115DD),
    (0x11630, 0x11640), (0x116AB, 0x116B7), (0x1171D, 0x1172B), (0x1182C, 0x1183A), (0x11930, 0x11935), (0x11937, 0x11938),
    (0x1193B, 0x1193E), (0x11940, 0x11940), (0x11942, 0x11943), (0x119D1, 0x119D7), (0x119DA, 0x119E0), (0x119E4, 0x119E4),
    (0x11A01, 0x11A0A), (0x11A33, 0x11A39), (0x11A3B, 0x11A3E), (0x11A47, 0x11A47), (0x11A51, 0x11A5B), (0x11A8A, 0x11A99),
    (0x11C2F, 0x11C36), (0x11C38, 0x11C3F), (0x11C92, 0x11CA7), (0x11CA9, 0x11CB6), (0x11D31, 0x11D36), (0x11D3A, 0x11D3A),
    (0x11D3C, 0x11D3D), (0x11D3F, 0x11D45), (0x11D47, 0x11D47), (0x11D8A, 0x11D8E), (0x11D90, 0x11D91), (0x11D93, 0x11D97),
    (0x11EF3, 0x11EF6), (0x11F00, 0x11F01), (0x11F03, 0x11F03), (0x11F34, 0x11F3A), (0x11F3E, 0x11F42), (0x11F5A, 0x11F5A),
    (0x13440, 0x13440), (0x13447, 0x13455), (0x1611E, 0x1612F), (0x16AF0, 0x16AF4), (0x16B30, 0x16B36), (0x16F4F, 0x16F4F),
    (0x16F51, 0x16F87), (0x16F8F, 0x16F92), (0x16FE4, 0x16FE4), (0x16FF0, 0x16FF1), (0x1BC9D, 0x1BC9E), (0x1CF00, 0x1CF2D),
    (0x1CF30, 0x1CF46), (0x1D165, 0x1D169), (0x1D16D, 0x1D172), (0x1D17B, 0x1D182), (0x1D185, 0x1D18B), (0x1D1AA, 0x1D1AD),
    (0x1D242, 0x1D244), (0x1DA00, 0x1DA36), (0x1DA3B, 0x1DA6C), (0x1DA75, 0x1DA75), (0x1DA84, 0x1DA84), (0x1DA9B, 0x1DA9F),
    (0x1DAA1, 0x1DAAF), (0x1E000, 0x1E006), (0x1E008, 0x1E018), (0x1E01B, 0x1E021), (0x1E023, 0x1E024), (0x1E026, 0x1E02A),
    (0x1E08F, 0x1E08F), (0x1E130, 0x1E136), (0x1E2AE, 0x1E2AE), (0x1E2EC, 0x1E2EF), (0x1E4EC, 0x1E4EF), (0x1E5EE, 0x1E5EF),
    (0x1E8D0, 0x1E8D6), (0x1E944, 0x1E94A), (0xE0100, 0xE01EF),
];
// END GENERATED

#[cfg(test)]
mod tests {
    use super::*;
    use regex_syntax::hir::{Class, HirKind};

    fn class_ranges(pattern: &str) -> Vec<(u32, u32)> {
        let hir = regex_syntax::Parser::new().parse(pattern).expect("valid pattern");
        match hir.kind() {
            HirKind::Class(Class::Unicode(c)) => {
                c.ranges().iter().map(|r| (r.start() as u32, r.end() as u32)).collect()
            }
            other => panic!("{pattern}: not a Unicode class: {other:?}"),
        }
    }

    fn render(name: &str, doc: &str, ranges: &[(u32, u32)]) -> String {
        let mut s = format!("/// {doc}\n#[rustfmt::skip]\nconst {name}: &[(u32, u32)] = &[\n");
        for chunk in ranges.chunks(6) {
            let items: Vec<String> = chunk.iter().map(|(a, b)| format!("(0x{a:04X}, 0x{b:04X})")).collect();
            s.push_str("    ");
            s.push_str(&items.join(", "));
            s.push_str(",\n");
        }
        s.push_str("];\n");
        s
    }

    /// The generated tables match `regex-syntax`; `MMROUTER_TOKENIZE_REGEN=1` rewrites them.
    #[test]
    fn generated_tables_match_regex_syntax() {
        let upper = class_ranges(r"[\p{Lu}\p{Lt}]");
        let lower = class_ranges(r"\p{Ll}");
        let mark = class_ranges(r"\p{M}");
        if std::env::var("MMROUTER_TOKENIZE_REGEN").as_deref() == Ok("1") {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/tekken.rs");
            let src = std::fs::read_to_string(path).unwrap();
            let (head, rest) = src.split_once("// BEGIN GENERATED\n").unwrap();
            let (_, tail) = rest.split_once("// END GENERATED\n").unwrap();
            let mut gen = String::new();
            gen.push_str(&render("UPPER_TITLE", r"`[\p{Lu}\p{Lt}]`.", &upper));
            gen.push_str(&render("LOWER", r"`\p{Ll}`.", &lower));
            gen.push_str(&render("MARK", r"`\p{M}`.", &mark));
            std::fs::write(path, format!("{head}// BEGIN GENERATED\n{gen}// END GENERATED\n{tail}")).unwrap();
            return;
        }
        assert_eq!(UPPER_TITLE, &upper[..], "UPPER_TITLE is stale: regenerate");
        assert_eq!(LOWER, &lower[..], "LOWER is stale: regenerate");
        assert_eq!(MARK, &mark[..], "MARK is stale: regenerate");
    }

    /// Every code point's class agrees with the pattern's classes as `regex-syntax` defines them.
    #[test]
    fn classes_agree_for_every_code_point() {
        let sets = [
            (LET, class_ranges(r"\p{L}")),
            (NUM, class_ranges(r"\p{N}")),
            (SPC, class_ranges(r"\s")),
            (XC, class_ranges(r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]")),
            (YC, class_ranges(r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]")),
        ];
        let t = table();
        for (bit, ranges) in &sets {
            let mut k = 0;
            for cp in 0..0x11_0000u32 {
                while k < ranges.len() && ranges[k].1 < cp {
                    k += 1;
                }
                let want = k < ranges.len() && ranges[k].0 <= cp;
                assert_eq!(t.get(cp) & bit != 0, want, "bit {bit} of U+{cp:04X}");
                if cp < 128 {
                    assert_eq!(ASCII[cp as usize] & bit != 0, want, "ASCII bit {bit} of U+{cp:04X}");
                }
            }
        }
    }

    fn pieces(s: &str) -> Vec<&str> {
        let mut v = Vec::new();
        let mut i = 0;
        for_each_piece(s, |p| {
            v.push(&s[i..i + p.len()]);
            i += p.len();
        });
        v
    }

    /// Pieces as `fancy-regex` (through `tokenizers`' `Split`, same pattern, same Unicode tables) finds them.
    fn regex_pieces(split: &tokenizers::pre_tokenizers::split::Split, s: &str) -> Vec<String> {
        use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
        let mut pts = PreTokenizedString::from(s);
        split.pre_tokenize(&mut pts).unwrap();
        pts.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(p, _, _)| p.to_string())
            .collect()
    }

    #[test]
    fn split_matches_fancy_regex() {
        use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
        use tokenizers::SplitDelimiterBehavior;
        let split =
            Split::new(SplitPattern::Regex(TEKKEN_PATTERN.into()), SplitDelimiterBehavior::Isolated, false).unwrap();
        // One or more characters of every class the pattern distinguishes.
        let pool: Vec<char> = [
            "aZ",
            "bcXY",
            " ",
            "  ",
            "\t",
            "\r",
            "\n",
            "/",
            "!",
            "?.",
            "'",
            "0",
            "7",
            "\u{0301}",
            "\u{0903}",
            "\u{20DD}",
            "\u{01C5}",
            "\u{02B0}",
            "\u{4E2D}",
            "\u{05D0}",
            "\u{00C9}",
            "\u{00E9}",
            "\u{0661}",
            "\u{2163}",
            "\u{00B2}",
            "\u{00A0}",
            "\u{3000}",
            "\u{2028}",
            "\u{0085}",
            "\u{200B}",
            "\u{1F600}",
            "\u{E000}",
            "\u{0378}",
            "\u{A7CB}",
            "\u{A7CD}",
            "\u{1CCF0}",
            "\u{10D40}",
            "\u{1E030}",
            "_",
            "-",
            "\u{FF01}",
            "\u{00AD}",
        ]
        .iter()
        .flat_map(|s| s.chars())
        .collect();
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut rnd = || {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        let fixed = [
            "Hello world",
            "HELLO world",
            "HTTPServer",
            "iPhone",
            "McDonald's",
            "a\u{0301}b",
            "\u{0301}\u{0301}A",
            "!\u{0301}A",
            " \u{0301}",
            "A\u{02B0}B",
            "AB\u{4E2D}C",
            "\u{01C5}a\u{01C5}",
            "x\r\n\r\ny",
            "a  \n  b",
            "1/2/3\n/x",
            "!!\n/\n//",
            "  ",
            "\t\tfoo",
            " ...",
            "a\u{3000}\u{3000}b",
            "",
            "\u{2028}x",
        ];
        let mut n_cases = 0;
        for s in fixed.iter().map(|s| s.to_string()).chain((0..30_000).map(|_| {
            let len = (rnd() % 24) as usize;
            (0..len).map(|_| pool[(rnd() % pool.len() as u64) as usize]).collect::<String>()
        })) {
            assert_eq!(pieces(&s), regex_pieces(&split, &s), "{s:?}");
            n_cases += 1;
        }
        assert!(n_cases > 30_000);
    }

    #[test]
    fn base64_decodes() {
        assert_eq!(b64decode("AA==").unwrap(), [0]);
        assert_eq!(b64decode("IGVudGFuZw==").unwrap(), b" entang");
        assert_eq!(b64decode("aW5zdGFsbGVk").unwrap(), b"installed");
        assert_eq!(b64decode("IE5laHJ1").unwrap(), b" Nehru");
        assert!(b64decode("A").is_none());
        assert!(b64decode("A===").is_none());
        assert!(b64decode("AA==AA==").is_none());
        assert!(b64decode("A*A=").is_none());
    }

    #[test]
    fn image_grid_rounds_like_python() {
        let pix = TekkenImageConfig { image_patch_size: 16, max_image_size: 1024, spatial_merge_size: 1 };
        assert_eq!(pix.grid(32, 32), Some((2, 2)));
        assert_eq!(pix.grid(2048, 1536), Some((64, 48)));
        assert_eq!(pix.grid(1, 1), Some((1, 1)));
        assert_eq!(pix.grid(0, 5), None);
        // 1025 x 3: ratio 1025/1024; 3 / ratio = 2.997 -> 3
        assert_eq!(pix.grid(1025, 3), Some((64, 1)));
        let small = TekkenImageConfig { image_patch_size: 14, max_image_size: 1540, spatial_merge_size: 2 };
        assert_eq!(small.grid(32, 32), Some((2, 2)));
        assert_eq!(small.grid(28, 29), Some((1, 2)));
    }
}
