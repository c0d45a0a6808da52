//! Which `tokenizer.json` configurations are accepted (and then match `tokenizers`) and which are refused.

use crate::common::corpus::{self, Mix};
use crate::common::{hf_ids, qwen_json, shrink};
use mmrouter_tokenize::FastTokenizer;
use serde_json::{json, Value};

const QWEN_RE: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3_RE: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The GPT-2 byte-level alphabet, in byte order.
fn byte_chars() -> Vec<char> {
    let printable: Vec<u32> = (0x21..=0x7E).chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
    let mut map = vec!['\0'; 256];
    for &b in &printable {
        map[b as usize] = char::from_u32(b).unwrap();
    }
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            map[b as usize] = char::from_u32(256 + n).unwrap();
            n += 1;
        }
    }
    map
}

/// A small but complete Qwen-style tokenizer: the 256 byte tokens plus a handful of merges (including
/// multi-byte characters and a merge whose rank is lower than its parts').
fn tiny() -> Value {
    let mut vocab = serde_json::Map::new();
    for (i, c) in byte_chars().into_iter().enumerate() {
        vocab.insert(c.to_string(), json!(i));
    }
    // Merge operands are written with one `char` per *byte*: U+0000..=U+00FF stand for the byte with that
    // value (so "\u{e4}\u{b8}" is the first two bytes of "中", e4 b8 ad).
    let m = byte_chars();
    let fix = |s: &str| -> String {
        s.chars()
            .map(|c| {
                assert!((c as u32) < 256);
                m[c as usize]
            })
            .collect()
    };
    let merges: Vec<(String, String)> = [
        (" ", "t"),
        ("h", "e"),
        (" t", "he"),
        ("i", "n"),
        ("in", "g"),
        (" ", "a"),
        ("e", "r"),
        ("\u{e4}", "\u{b8}"),
        ("\u{e4}\u{b8}", "\u{ad}"),
        ("'", "s"),
        ("1", "2"),
        ("12", "3"),
        (" ", " "),
        ("  ", "  "),
        ("\n", "\n"),
    ]
    .iter()
    .map(|(a, b)| (fix(a), fix(b)))
    .collect();
    let mut next = 256;
    for (a, b) in &merges {
        let ab = format!("{a}{b}");
        if !vocab.contains_key(&ab) {
            vocab.insert(ab, json!(next));
            next += 1;
        }
    }
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [
            {"id": next, "content": "<|im_start|>", "single_word": false, "lstrip": false, "rstrip": false,
             "normalized": false, "special": true},
            {"id": next + 1, "content": "<|im_end|>", "single_word": false, "lstrip": false, "rstrip": false,
             "normalized": false, "special": true},
            {"id": next + 2, "content": "<think>", "single_word": false, "lstrip": false, "rstrip": false,
             "normalized": false, "special": false}
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN_RE}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}
        ]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges}
    })
}

fn bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

fn small_corpus() -> Vec<String> {
    let mb = if cfg!(debug_assertions) { 30_000 } else { 300_000 };
    let mut docs = corpus::documents(11, mb, 50, 3000, Mix::Adversarial);
    docs.extend(
        ["the thing's ringing", "中中中 中", "123123 1234", "  the\n\n\n  a", "<|im_start|>the<think>x<|im_end|>"]
            .map(String::from),
    );
    docs
}

/// Loads `v` with both implementations and compares them on a small corpus.
fn assert_parity(name: &str, v: &Value, docs: &[String]) {
    let j = bytes(v);
    let fast = FastTokenizer::from_json(&j).unwrap_or_else(|e| panic!("{name}: refused: {e}"));
    let hf = tokenizers::Tokenizer::from_bytes(&j).unwrap_or_else(|e| panic!("{name}: hf refused: {e}"));
    for d in docs {
        if fast.encode(d) != hf_ids(&hf, d) {
            let small = shrink(d, |s| fast.encode(s) != hf_ids(&hf, s));
            panic!("{name}: differs on {small:?}: hf {:?} fast {:?}", hf_ids(&hf, &small), fast.encode(&small));
        }
    }
}

fn refused(name: &str, v: &Value) {
    match FastTokenizer::from_json(&bytes(v)) {
        Ok(_) => panic!("{name}: should have been refused"),
        Err(e) => assert!(!e.reason().is_empty(), "{name}"),
    }
}

#[test]
fn tiny_tokenizer_variants_match_hf() {
    let docs = small_corpus();
    let base = tiny();
    assert_parity("tiny", &base, &docs);

    let mut v = base.clone();
    v["normalizer"] = Value::Null;
    assert_parity("no normalizer", &v, &docs);

    let mut v = base.clone();
    v["normalizer"] = json!({"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "NFC"}]});
    assert_parity("Sequence[NFC, NFC]", &v, &docs);

    let mut v = base.clone();
    v["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = json!(LLAMA3_RE);
    assert_parity("llama3 regex", &v, &docs);

    let mut v = base.clone();
    v["model"]["ignore_merges"] = json!(true);
    assert_parity("ignore_merges", &v, &docs);

    let mut v = base.clone();
    let legacy: Vec<Value> = v["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| json!(format!("{} {}", m[0].as_str().unwrap(), m[1].as_str().unwrap())))
        .collect();
    v["model"]["merges"] = Value::Array(legacy);
    assert_parity("legacy merges", &v, &docs);

    let mut v = base.clone();
    v["model"]["dropout"] = json!(0.0);
    v["model"]["unk_token"] = json!("<unk>");
    v["model"]["continuing_subword_prefix"] = Value::Null;
    v["model"]["end_of_word_suffix"] = Value::Null;
    v["post_processor"] = Value::Null;
    assert_parity("inert model options", &v, &docs);

    let mut v = base.clone();
    v["added_tokens"] = json!([]);
    assert_parity("no added tokens", &v, &docs);

    let mut v = base.clone();
    // Overlapping added tokens: left-most-longest wins.
    v["added_tokens"].as_array_mut().unwrap().push(json!({"id": 999, "content": "<|im_start|>the",
        "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}));
    v["added_tokens"].as_array_mut().unwrap().push(json!({"id": 1000, "content": "the",
        "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": false}));
    assert_parity("overlapping added tokens", &v, &docs);
}

#[test]
fn unsupported_configurations_are_refused() {
    let base = tiny();
    type Edit = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(&str, Edit)> = vec![
        ("NFKC", Box::new(|v| v["normalizer"] = json!({"type": "NFKC"}))),
        (
            "Lowercase in sequence",
            Box::new(|v| {
                v["normalizer"] = json!({"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]})
            }),
        ),
        ("other regex", Box::new(|v| v["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = json!(r"\w+|\s+"))),
        ("string pattern", Box::new(|v| v["pre_tokenizer"]["pretokenizers"][0]["pattern"] = json!({"String": " "}))),
        ("behavior Removed", Box::new(|v| v["pre_tokenizer"]["pretokenizers"][0]["behavior"] = json!("Removed"))),
        ("invert", Box::new(|v| v["pre_tokenizer"]["pretokenizers"][0]["invert"] = json!(true))),
        ("add_prefix_space", Box::new(|v| v["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = json!(true))),
        ("use_regex", Box::new(|v| v["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = json!(true))),
        (
            "use_regex missing",
            Box::new(|v| {
                v["pre_tokenizer"]["pretokenizers"][1].as_object_mut().unwrap().remove("use_regex");
            }),
        ),
        (
            "ByteLevel alone",
            Box::new(|v| {
                v["pre_tokenizer"] = json!({"type": "ByteLevel", "add_prefix_space": false, "use_regex": true})
            }),
        ),
        ("no pre_tokenizer", Box::new(|v| v["pre_tokenizer"] = Value::Null)),
        ("WordPiece", Box::new(|v| v["model"]["type"] = json!("WordPiece"))),
        ("dropout", Box::new(|v| v["model"]["dropout"] = json!(0.1))),
        ("byte_fallback", Box::new(|v| v["model"]["byte_fallback"] = json!(true))),
        ("prefix", Box::new(|v| v["model"]["continuing_subword_prefix"] = json!("##"))),
        ("suffix", Box::new(|v| v["model"]["end_of_word_suffix"] = json!("</w>"))),
        (
            "missing byte",
            Box::new(|v| {
                v["model"]["vocab"].as_object_mut().unwrap().remove("Ā");
            }),
        ),
        ("duplicate id", Box::new(|v| v["model"]["vocab"]["Ā"] = json!(5))),
        ("merge out of vocab", Box::new(|v| v["model"]["merges"].as_array_mut().unwrap().push(json!(["q", "z"])))),
        ("normalized added token", Box::new(|v| v["added_tokens"][0]["normalized"] = json!(true))),
        ("lstrip added token", Box::new(|v| v["added_tokens"][0]["lstrip"] = json!(true))),
        ("rstrip added token", Box::new(|v| v["added_tokens"][1]["rstrip"] = json!(true))),
        ("single_word added token", Box::new(|v| v["added_tokens"][2]["single_word"] = json!(true))),
        (
            "truncation",
            Box::new(|v| {
                v["truncation"] =
                    json!({"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0})
            }),
        ),
        ("padding", Box::new(|v| v["padding"] = json!({"strategy": "BatchLongest"}))),
        ("unknown post_processor", Box::new(|v| v["post_processor"] = json!({"type": "Mystery"}))),
        ("version", Box::new(|v| v["version"] = json!("2.0"))),
    ];
    for (name, f) in cases {
        let mut v = base.clone();
        f(&mut v);
        refused(name, &v);
    }
    assert!(FastTokenizer::from_json(b"not json").is_err());
    assert!(FastTokenizer::from_json(b"[]").is_err());
}

/// Llama-3 style configuration (its regex, `ignore_merges: true`, no normalizer) on the real vocabulary.
#[test]
fn llama3_style_on_qwen_vocabulary() {
    let mut v: Value = serde_json::from_slice(&qwen_json()).unwrap();
    v["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = json!(LLAMA3_RE);
    v["model"]["ignore_merges"] = json!(true);
    v["normalizer"] = Value::Null;
    let total = if cfg!(debug_assertions) { 100_000 } else { 1_500_000 };
    let docs = corpus::documents(21, total, 100, 20_000, Mix::Adversarial);
    assert_parity("llama3-style qwen", &v, &docs);
}

#[test]
fn debug_output_is_compact() {
    let f = FastTokenizer::from_json(&bytes(&tiny())).unwrap();
    let s = format!("{f:?}");
    assert!(s.len() < 200, "{s}");
}
