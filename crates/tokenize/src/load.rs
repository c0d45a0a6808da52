//! Reading and validating `tokenizer.json`.
//!
//! Everything that influences the ids `tokenizers` 0.23.2 produces for `encode_fast(text, false)` is
//! checked; anything this crate does not reproduce exactly is refused with [`Unsupported`].

use std::collections::HashMap;

use serde_json::{Map, Value};

use crate::bytelevel::{char_to_byte, BYTE_TO_CHAR};
use crate::hash::BytesMap;
use crate::Unsupported;

/// The Qwen2 / Qwen2.5 / Qwen3 split pattern.
pub(crate) const QWEN_PATTERN: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The Llama-3 split pattern (numbers in groups of up to three digits).
pub(crate) const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// What `tokenizer.json` describes, reduced to what encoding needs.
pub(crate) struct Config {
    pub(crate) nfc: bool,
    pub(crate) max_digits: usize,
    pub(crate) ignore_merges: bool,
    /// Vocabulary tokens that are byte-level strings, by raw bytes.
    pub(crate) vocab: BytesMap,
    /// Vocabulary tokens that contain characters outside the byte-level alphabet (unreachable by
    /// encoding, kept for `token_to_id`).
    pub(crate) other_tokens: HashMap<String, u32>,
    /// `(left, right, merged)` ids in rank order.
    pub(crate) merges: Vec<(u32, u32, u32)>,
    /// Added tokens `(content, id)`, with the ids `tokenizers` assigns.
    pub(crate) added: Vec<(String, u32)>,
}

fn unsupported(msg: impl Into<String>) -> Unsupported {
    Unsupported::new(msg)
}

fn type_of(v: &Value) -> Option<&str> {
    v.get("type").and_then(Value::as_str)
}

/// `null` or absent.
fn is_null(v: Option<&Value>) -> bool {
    matches!(v, None | Some(Value::Null))
}

/// A field that must be present and a boolean.
fn req_bool(obj: &Value, key: &str, ctx: &str) -> Result<bool, Unsupported> {
    obj.get(key).and_then(Value::as_bool).ok_or_else(|| unsupported(format!("{ctx}: `{key}` must be a boolean")))
}

/// A field that may be absent or null (-> `default`), else must be a boolean.
fn opt_bool(obj: &Value, key: &str, default: bool, ctx: &str) -> Result<bool, Unsupported> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(unsupported(format!("{ctx}: `{key}` must be a boolean"))),
    }
}

fn parse_normalizer(v: Option<&Value>) -> Result<bool, Unsupported> {
    if is_null(v) {
        return Ok(false);
    }
    let v = v.expect("checked");
    match type_of(v) {
        Some("NFC") => Ok(true),
        Some("Sequence") => {
            let items = v
                .get("normalizers")
                .and_then(Value::as_array)
                .ok_or_else(|| unsupported("normalizer Sequence without `normalizers`"))?;
            let mut nfc = false;
            for item in items {
                // NFC is idempotent, so any number of NFC steps is one NFC.
                nfc |= parse_normalizer(Some(item))?;
                if type_of(item) != Some("NFC") {
                    return Err(unsupported(format!("normalizer {:?} is not supported", type_of(item))));
                }
            }
            Ok(nfc)
        }
        other => Err(unsupported(format!("normalizer {other:?} is not supported (only NFC or none)"))),
    }
}

/// Returns `max_digits` for the recognised split pattern.
fn parse_pre_tokenizer(v: Option<&Value>) -> Result<usize, Unsupported> {
    let v = v.filter(|v| !v.is_null()).ok_or_else(|| unsupported("a pre_tokenizer is required"))?;
    if type_of(v) != Some("Sequence") {
        return Err(unsupported(format!(
            "pre_tokenizer {:?} is not supported (need Sequence[Split, ByteLevel])",
            type_of(v)
        )));
    }
    let items = v
        .get("pretokenizers")
        .and_then(Value::as_array)
        .ok_or_else(|| unsupported("pre_tokenizer Sequence without `pretokenizers`"))?;
    let [split, byte_level] = items.as_slice() else {
        return Err(unsupported("pre_tokenizer Sequence must be exactly [Split, ByteLevel]"));
    };
    if type_of(split) != Some("Split") {
        return Err(unsupported("first pre_tokenizer must be Split"));
    }
    let pattern = split
        .get("pattern")
        .and_then(|p| p.get("Regex"))
        .and_then(Value::as_str)
        .ok_or_else(|| unsupported("Split pattern must be a Regex"))?;
    let max_digits = match pattern {
        QWEN_PATTERN => 1,
        LLAMA3_PATTERN => 3,
        _ => return Err(unsupported(format!("Split regex is not a recognised pattern: {pattern}"))),
    };
    if split.get("behavior").and_then(Value::as_str) != Some("Isolated") {
        return Err(unsupported("Split behavior must be Isolated"));
    }
    if req_bool(split, "invert", "Split")? {
        return Err(unsupported("Split invert must be false"));
    }
    if type_of(byte_level) != Some("ByteLevel") {
        return Err(unsupported("second pre_tokenizer must be ByteLevel"));
    }
    if req_bool(byte_level, "add_prefix_space", "ByteLevel")? {
        return Err(unsupported("ByteLevel add_prefix_space must be false"));
    }
    if req_bool(byte_level, "use_regex", "ByteLevel")? {
        return Err(unsupported("ByteLevel use_regex must be false"));
    }
    // `trim_offsets` only affects offsets.
    Ok(max_digits)
}

fn check_post_processor(v: Option<&Value>) -> Result<(), Unsupported> {
    if is_null(v) {
        return Ok(());
    }
    let v = v.expect("checked");
    // With add_special_tokens = false, none of these changes the ids.
    match type_of(v) {
        Some("ByteLevel" | "TemplateProcessing" | "RobertaProcessing" | "BertProcessing") => Ok(()),
        Some("Sequence") => {
            let items = v
                .get("processors")
                .and_then(Value::as_array)
                .ok_or_else(|| unsupported("post_processor Sequence without `processors`"))?;
            items.iter().try_for_each(|p| check_post_processor(Some(p)))
        }
        other => Err(unsupported(format!("post_processor {other:?} is not supported"))),
    }
}

/// A vocabulary string as raw bytes, when every character is in the byte-level alphabet.
pub(crate) fn bytelevel_decode(s: &str) -> Option<Vec<u8>> {
    let mut v = Vec::with_capacity(s.len());
    bytelevel_decode_into(s, &mut v).then_some(v)
}

/// Appends the raw bytes of a byte-level string to `out`; false (with `out` partly written) when some
/// character is not in the byte-level alphabet.
fn bytelevel_decode_into(s: &str, out: &mut Vec<u8>) -> bool {
    for c in s.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => return false,
        }
    }
    true
}

/// Id of a string of the model vocabulary (`buf` is scratch space).
fn vocab_id(vocab: &BytesMap, other: &HashMap<String, u32>, s: &str, buf: &mut Vec<u8>) -> Option<u32> {
    buf.clear();
    if bytelevel_decode_into(s, buf) && !buf.is_empty() {
        vocab.get(buf)
    } else {
        other.get(s).copied()
    }
}

type Model = (bool, BytesMap, HashMap<String, u32>, Vec<(u32, u32, u32)>);

fn parse_model(model: &Value) -> Result<Model, Unsupported> {
    if type_of(model) != Some("BPE") {
        return Err(unsupported(format!("model {:?} is not supported (only BPE)", type_of(model))));
    }
    match model.get("dropout") {
        None | Some(Value::Null) => {}
        Some(v) if v.as_f64() == Some(0.0) => {}
        Some(v) => return Err(unsupported(format!("BPE dropout {v} is not supported"))),
    }
    for key in ["continuing_subword_prefix", "end_of_word_suffix"] {
        match model.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s.is_empty() => {}
            Some(v) => return Err(unsupported(format!("BPE {key} {v} is not supported"))),
        }
    }
    if opt_bool(model, "byte_fallback", false, "BPE")? {
        return Err(unsupported("BPE byte_fallback is not supported"));
    }
    // `fuse_unk` and `unk_token` only matter for characters missing from the vocabulary, and every
    // byte-level character is required to be present (checked below).
    opt_bool(model, "fuse_unk", false, "BPE")?;
    match model.get("unk_token") {
        None | Some(Value::Null | Value::String(_)) => {}
        Some(_) => return Err(unsupported("BPE unk_token must be a string or null")),
    }
    let ignore_merges = opt_bool(model, "ignore_merges", false, "BPE")?;

    let vocab_obj: &Map<String, Value> =
        model.get("vocab").and_then(Value::as_object).ok_or_else(|| unsupported("BPE vocab must be an object"))?;
    let mut vocab = BytesMap::with_capacity(vocab_obj.len());
    let mut other = HashMap::new();
    let mut ids = Vec::with_capacity(vocab_obj.len());
    let mut buf = Vec::new();
    for (tok, id) in vocab_obj {
        let id = id
            .as_u64()
            .filter(|&i| i < (1 << 31))
            .ok_or_else(|| unsupported(format!("vocab id of {tok:?} must be an integer below 2^31")))?
            as u32;
        ids.push(id);
        buf.clear();
        if bytelevel_decode_into(tok, &mut buf) && !buf.is_empty() {
            vocab.insert(&buf, id);
        } else {
            other.insert(tok.clone(), id);
        }
    }
    ids.sort_unstable();
    if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
        return Err(unsupported(format!("vocab id {} is used by two tokens", w[0])));
    }
    for (b, c) in BYTE_TO_CHAR.iter().enumerate() {
        if vocab.get(&[b as u8]).is_none() {
            return Err(unsupported(format!("vocab lacks the byte-level character {c:?} (byte {b})")));
        }
    }

    let merges_val =
        model.get("merges").and_then(Value::as_array).ok_or_else(|| unsupported("BPE merges must be an array"))?;
    let mut merges = Vec::with_capacity(merges_val.len());
    let mut resolve = |a: &str, b: &str| -> Result<(), Unsupported> {
        let ia = vocab_id(&vocab, &other, a, &mut buf)
            .ok_or_else(|| unsupported(format!("merge token {a:?} not in vocab")))?;
        let ib = vocab_id(&vocab, &other, b, &mut buf)
            .ok_or_else(|| unsupported(format!("merge token {b:?} not in vocab")))?;
        buf.clear();
        let iab = if bytelevel_decode_into(a, &mut buf) && bytelevel_decode_into(b, &mut buf) {
            vocab.get(&buf)
        } else {
            other.get(&format!("{a}{b}")).copied()
        };
        let iab = iab.ok_or_else(|| unsupported(format!("merge result {a:?} + {b:?} not in vocab")))?;
        merges.push((ia, ib, iab));
        Ok(())
    };
    for m in merges_val {
        match m {
            // Legacy "a b" lines; `#version` lines are skipped before ranks are assigned.
            Value::String(line) => {
                if line.starts_with("#version") {
                    continue;
                }
                let mut parts = line.split(' ');
                match (parts.next(), parts.next(), parts.next()) {
                    (Some(a), Some(b), None) => resolve(a, b)?,
                    _ => return Err(unsupported(format!("bad merge line {line:?}"))),
                }
            }
            Value::Array(ab) => match ab.as_slice() {
                [Value::String(a), Value::String(b)] => resolve(a, b)?,
                _ => return Err(unsupported("a merge must be a pair of strings")),
            },
            _ => return Err(unsupported("a merge must be a string or a pair of strings")),
        }
    }
    Ok((ignore_merges, vocab, other, merges))
}

/// Added tokens with the ids `tokenizers` assigns (see `AddedVocabulary::add_tokens`).
fn parse_added(
    v: Option<&Value>,
    vocab_size: usize,
    mut model_id: impl FnMut(&str) -> Option<u32>,
) -> Result<Vec<(String, u32)>, Unsupported> {
    let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(Vec::new()) };
    let items = v.as_array().ok_or_else(|| unsupported("added_tokens must be an array"))?;
    // Mirrors `add_tokens`: the id is the existing one if the content is already known (added or model
    // vocabulary), otherwise the next free id after the model vocabulary. The `id` field of the JSON is
    // only used for a warning by `tokenizers`, and so is ignored here as well.
    let mut by_content: HashMap<String, u32> = HashMap::new();
    let mut by_id: HashMap<u32, String> = HashMap::new();
    let mut order: Vec<u32> = Vec::new();
    let mut next_id = vocab_size as u32;
    for t in items {
        let content = t
            .get("content")
            .and_then(Value::as_str)
            .ok_or_else(|| unsupported("added token without string `content`"))?;
        let ctx = format!("added token {content:?}");
        let single_word = req_bool(t, "single_word", &ctx)?;
        let lstrip = req_bool(t, "lstrip", &ctx)?;
        let rstrip = req_bool(t, "rstrip", &ctx)?;
        let normalized = req_bool(t, "normalized", &ctx)?;
        req_bool(t, "special", &ctx)?;
        if content.is_empty() {
            continue; // `tokenizers` ignores empty added tokens.
        }
        if single_word || lstrip || rstrip {
            return Err(unsupported(format!("{ctx}: single_word / lstrip / rstrip are not supported")));
        }
        if normalized {
            return Err(unsupported(format!("{ctx}: normalized added tokens are not supported")));
        }
        let id = match by_content.get(content).copied().or_else(|| model_id(content)) {
            Some(id) => id,
            None => {
                next_id += 1;
                next_id - 1
            }
        };
        by_content.insert(content.to_string(), id);
        if let Some(old) = by_id.insert(id, content.to_string()) {
            if old != content {
                // Another content already owns this id: `tokenizers` would keep only the last one in
                // its matcher while the first stays in its content map. Too odd to reproduce.
                return Err(unsupported(format!("{ctx}: id {id} is shared with added token {old:?}")));
            }
        } else {
            order.push(id);
        }
    }
    Ok(order.into_iter().map(|id| (by_id[&id].clone(), id)).collect())
}

pub(crate) fn parse(bytes: &[u8]) -> Result<Config, Unsupported> {
    let root: Value = serde_json::from_slice(bytes).map_err(|e| unsupported(format!("invalid JSON: {e}")))?;
    if !root.is_object() {
        return Err(unsupported("tokenizer.json must be an object"));
    }
    match root.get("version") {
        None => {}
        Some(Value::String(v)) if v == "1.0" => {}
        Some(v) => return Err(unsupported(format!("tokenizer.json version {v} is not supported"))),
    }
    if !is_null(root.get("truncation")) {
        return Err(unsupported("truncation must be null"));
    }
    if !is_null(root.get("padding")) {
        return Err(unsupported("padding must be null"));
    }
    let nfc = parse_normalizer(root.get("normalizer"))?;
    let max_digits = parse_pre_tokenizer(root.get("pre_tokenizer"))?;
    check_post_processor(root.get("post_processor"))?;
    let model = root.get("model").ok_or_else(|| unsupported("model is missing"))?;
    let (ignore_merges, vocab, other_tokens, merges) = parse_model(model)?;
    let vocab_size = vocab.len() + other_tokens.len();
    let mut buf = Vec::new();
    let model_id = |s: &str| vocab_id(&vocab, &other_tokens, s, &mut buf);
    let added = parse_added(root.get("added_tokens"), vocab_size, model_id)?;
    Ok(Config { nfc, max_digits, ignore_merges, vocab, other_tokens, merges, added })
}
