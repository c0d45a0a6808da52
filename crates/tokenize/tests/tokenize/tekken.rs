//! The tekken tokenizer against ids produced by `mistral_common` 1.13.1 itself
//! (`tests/fixtures/parity/mistral/gen_tekken_cases.py` wrote the fixtures).

use std::io::Read;
use std::sync::OnceLock;

use mmrouter_tokenize::{TekkenImageConfig, TekkenTokenizer, TEKKEN_PATTERN, TEKKEN_STACK_LIMIT_RUN};
use serde_json::{json, Value};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/parity/mistral");

fn tekken_json() -> &'static [u8] {
    static JSON: OnceLock<Vec<u8>> = OnceLock::new();
    JSON.get_or_init(|| {
        let gz = std::fs::read(format!("{FIXTURES}/tekken_240911.json.gz")).expect("read tekken fixture");
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&gz[..]).read_to_end(&mut out).expect("gunzip tekken fixture");
        out
    })
}

fn tok() -> &'static TekkenTokenizer {
    static TOK: OnceLock<TekkenTokenizer> = OnceLock::new();
    TOK.get_or_init(|| TekkenTokenizer::from_json(tekken_json()).expect("load tekken_240911.json"))
}

fn cases() -> &'static Value {
    static CASES: OnceLock<Value> = OnceLock::new();
    CASES.get_or_init(|| {
        serde_json::from_slice(&std::fs::read(format!("{FIXTURES}/tekken_cases.json")).expect("read cases")).unwrap()
    })
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn file_properties_match_mistral_common() {
    let t = tok();
    let meta = &cases()["meta"];
    assert_eq!(t.num_special_tokens() as u64, meta["num_special_tokens"].as_u64().unwrap());
    assert_eq!(t.vocab_size() as u64, meta["vocab_size"].as_u64().unwrap());
    assert_eq!(t.version(), meta["version"].as_str().unwrap());
    assert_eq!(
        t.image_config(),
        Some(TekkenImageConfig { image_patch_size: 16, max_image_size: 1024, spatial_merge_size: 1 })
    );
    for (name, id) in cases()["specials"].as_object().unwrap() {
        assert_eq!(t.special_id(name), Some(id.as_u64().unwrap() as u32), "{name}");
        assert_eq!(t.special_token(id.as_u64().unwrap() as u32), Some(name.as_str()));
    }
    assert_eq!((t.bos_id(), t.eos_id()), (Some(1), Some(2)));
    assert_eq!(t.special_id("[NOPE]"), None);
    assert_eq!(t.token_id(b"a"), Some(1000 + 97));
    assert_eq!(t.token_bytes(1000 + 97), Some(&b"a"[..]));
    assert_eq!(t.token_bytes(5), None);
    assert_eq!(t.token_bytes(t.vocab_size()), None);
}

#[test]
fn corpus_ids_match_mistral_common() {
    let t = tok();
    let list = cases()["cases"].as_array().unwrap();
    let mut failures = Vec::new();
    for case in list {
        let text = case["text"].as_str().unwrap();
        let want = ids_of(&case["ids"]);
        let got = t.encode(text);
        if got != want {
            failures.push(format!("{text:?}\n  want {want:?}\n  got  {got:?}"));
        }
        assert_eq!(t.try_encode(text).as_ref().ok(), Some(&got));
    }
    assert!(
        failures.is_empty(),
        "{} of {} texts differ:\n{}",
        failures.len(),
        list.len(),
        failures[..failures.len().min(5)].join("\n")
    );
    assert!(list.len() > 2000);
}

#[test]
fn long_generated_texts_and_the_engine_limit() {
    let t = tok();
    for g in cases()["generated"].as_array().unwrap() {
        let unit = g["unit"].as_str().unwrap();
        let count = g["count"].as_u64().unwrap() as usize;
        let text = format!("{}{}{}", g["prefix"].as_str().unwrap(), unit.repeat(count), g["suffix"].as_str().unwrap());
        let label = format!("{:?} + {unit:?} x {count} + {:?}", g["prefix"], g["suffix"]);
        match g.get("ids_rle") {
            Some(rle) => {
                let mut want = Vec::new();
                for pair in rle.as_array().unwrap() {
                    let (id, n) = (pair[0].as_u64().unwrap() as u32, pair[1].as_u64().unwrap() as usize);
                    want.extend(std::iter::repeat_n(id, n));
                }
                assert_eq!(t.try_encode(&text).expect(&label), want, "{label}");
            }
            None => {
                assert!(g["error"].as_str().unwrap().contains("Max stack size exceeded"), "{label}");
                let e = t.try_encode(&text).expect_err(&label);
                assert!(e.reason().contains("Max stack size exceeded"), "{label}: {e}");
                assert!(!t.encode(&text).is_empty()); // the infallible form still answers
            }
        }
    }
    assert_eq!(TEKKEN_STACK_LIMIT_RUN, 999_999);
}

#[test]
fn special_token_strings_are_ordinary_text() {
    let t = tok();
    for s in ["<s>", "[INST]", "[IMG]", "[/INST]", "</s>", "<SPECIAL_20>"] {
        let ids = t.encode(s);
        assert!(ids.iter().all(|&i| i >= t.num_special_tokens()), "{s}: {ids:?}");
        let bytes: Vec<u8> = ids.iter().flat_map(|&i| t.token_bytes(i).unwrap().to_vec()).collect();
        assert_eq!(bytes, s.as_bytes());
    }
}

#[test]
fn image_grids_match_mistral_common() {
    let t = tok();
    let mut n = 0;
    for g in cases()["grids_cols_rows"].as_array().unwrap() {
        let c = &g["config"];
        let cfg = TekkenImageConfig {
            image_patch_size: c["image_patch_size"].as_u64().unwrap() as u32,
            max_image_size: c["max_image_size"].as_u64().unwrap() as u32,
            spatial_merge_size: c["spatial_merge_size"].as_u64().unwrap() as u32,
        };
        for s in g["sizes"].as_array().unwrap() {
            let v: Vec<u32> = s.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
            assert_eq!(cfg.grid(v[0], v[1]), Some((v[2], v[3])), "{:?} {}x{}", cfg, v[0], v[1]);
            n += 1;
        }
    }
    assert!(n > 800);
    let ids = t.image_token_ids(2, 2).unwrap();
    assert_eq!(ids, [10, 10, 12, 10, 10, 13]);
    assert_eq!(t.image_token_ids(3, 1).unwrap(), [10, 10, 10, 13]);
    assert_eq!(t.image_token_ids(0, 1), None);
}

/// The prompt ids vLLM renders for Pixtral-12B (expected/pixtral_12b.json) decompose into the special
/// tokens, `[IMG]` runs and text this tokenizer encodes: every text-only run of the prompt re-encodes to
/// itself when decoded, and every image span is a well-formed `[IMG]` grid.
#[test]
fn rendered_prompts_are_consistent_with_the_tokenizer() {
    let t = tok();
    let v: Value =
        serde_json::from_slice(&std::fs::read(format!("{FIXTURES}/expected/pixtral_12b.json")).unwrap()).unwrap();
    let mut checked = 0;
    for chat in v["chats"].as_array().unwrap() {
        if chat["outcome"] != "ok" {
            continue;
        }
        let ids = ids_of(&chat["ids"]);
        assert_eq!(ids[0], t.bos_id().unwrap());
        for span in chat["image_spans"].as_array().unwrap() {
            let (o, l) = (span["offset"].as_u64().unwrap() as usize, span["length"].as_u64().unwrap() as usize);
            let run = &ids[o..o + l];
            let cols = run.iter().position(|&i| i != 10).unwrap() as u32;
            let rows = (l as u32) / (cols + 1);
            assert_eq!(Some(run.to_vec()), t.image_token_ids(cols, rows), "{}", chat["name"]);
        }
        // Text between special tokens: decoding then encoding gives the same ids.
        let mut seg: Vec<u32> = Vec::new();
        for &id in ids.iter().chain(std::iter::once(&0)) {
            if id >= t.num_special_tokens() {
                seg.push(id);
                continue;
            }
            if !seg.is_empty() {
                let bytes: Vec<u8> = seg.iter().flat_map(|&i| t.token_bytes(i).unwrap().to_vec()).collect();
                let text = String::from_utf8(bytes).expect("segments are whole characters");
                assert_eq!(t.encode(&text), seg, "{}: {text:?}", chat["name"]);
                checked += 1;
                seg.clear();
            }
        }
    }
    assert!(checked > 50, "{checked}");
}

/// A change to the parsed `tekken.json`.
type Edit = Box<dyn FnOnce(&mut Value)>;

fn modified(f: impl FnOnce(&mut Value)) -> Result<TekkenTokenizer, String> {
    let mut v: Value = serde_json::from_slice(tekken_json()).unwrap();
    f(&mut v);
    TekkenTokenizer::from_json(&serde_json::to_vec(&v).unwrap()).map_err(|e| e.to_string())
}

#[test]
fn refuses_what_it_does_not_reproduce() {
    assert_eq!(TEKKEN_PATTERN, serde_json::from_slice::<Value>(tekken_json()).unwrap()["config"]["pattern"]);
    let bad: Vec<(&str, Edit)> = vec![
        ("other pattern", Box::new(|v| v["config"]["pattern"] = json!(r"\w+|\s+"))),
        ("unknown version", Box::new(|v| v["config"]["version"] = json!("v4"))),
        ("v11 without special tokens", Box::new(|v| v["config"]["version"] = json!("v11"))),
        ("rank out of order", Box::new(|v| v["vocab"][300]["rank"] = json!(301))),
        ("duplicate token", Box::new(|v| v["vocab"][301]["token_bytes"] = v["vocab"][300]["token_bytes"].clone())),
        ("bad byte token", Box::new(|v| v["vocab"][65]["token_bytes"] = json!("Qg=="))),
        ("bad base64", Box::new(|v| v["vocab"][300]["token_bytes"] = json!("!!!!"))),
        ("vocab too small", Box::new(|v| v["config"]["default_vocab_size"] = json!(200_000))),
        ("bad image", Box::new(|v| v["image"]["image_patch_size"] = json!(0))),
        ("unknown image key", Box::new(|v| v["image"]["foo"] = json!(1))),
        (
            "repeated special",
            Box::new(
                |v| v["special_tokens"] = json!([{"rank": 0, "token_str": "<s>", "is_control": true}, {"rank": 1, "token_str": "<s>", "is_control": true}]),
            ),
        ),
        ("not json", Box::new(|v| *v = json!("x"))),
    ];
    for (what, f) in bad {
        assert!(modified(f).is_err(), "{what} was accepted");
    }
    // Accepted variants.
    let v7 = modified(|v| {
        v["config"]["version"] = json!("v7");
        v["image"] = json!({"image_patch_size": 14, "max_image_size": 1540, "spatial_merge_size": 2});
    })
    .unwrap();
    assert_eq!(v7.version(), "v7");
    assert_eq!(v7.special_id("[SYSTEM_PROMPT]"), Some(17));
    assert_eq!(v7.image_config().unwrap().spatial_merge_size, 2);
    let listed = modified(|v| {
        v["config"]["version"] = json!("v13");
        v["special_tokens"] = json!([
            {"rank": 0, "token_str": "<unk>", "is_control": true},
            {"rank": 1, "token_str": "<s>", "is_control": true},
            {"rank": 2, "token_str": "</s>", "is_control": true},
            {"rank": 3, "token_str": "[THINK]", "is_control": true}
        ]);
        v.as_object_mut().unwrap().remove("image");
    })
    .unwrap();
    assert_eq!(listed.special_id("[THINK]"), Some(3));
    assert_eq!(listed.special_id("<SPECIAL_4>"), Some(4));
    assert_eq!(listed.special_id("[INST]"), None);
    assert_eq!(listed.image_config(), None);
    assert_eq!(listed.encode("Hello"), tok().encode("Hello"));
}
