//! Shared helpers for the integration tests and the benchmark: the fixture and a seeded corpus.
#![allow(dead_code)]

pub mod corpus;

use std::io::Read;

/// The Qwen3 `tokenizer.json` shipped (gzipped) with the tests.
pub fn qwen_json() -> Vec<u8> {
    let gz = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/models/qwen-tokenizer.json.gz"))
        .expect("read fixture");
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(&gz[..]).read_to_end(&mut out).expect("gunzip fixture");
    out
}

/// `tokenizers` encoding, the reference.
pub fn hf_ids(tok: &tokenizers::Tokenizer, text: &str) -> Vec<u32> {
    tok.encode_fast(text, false).expect("hf encode").get_ids().to_vec()
}

/// Removes characters from `text` while `fails` keeps returning true; returns a small failing input.
pub fn shrink(text: &str, fails: impl Fn(&str) -> bool) -> String {
    let mut cur: Vec<char> = text.chars().collect();
    let mut chunk = (cur.len() / 2).max(1);
    while chunk >= 1 {
        let mut i = 0;
        let mut progressed = false;
        while i < cur.len() {
            let mut cand = cur.clone();
            let end = (i + chunk).min(cand.len());
            cand.drain(i..end);
            let s: String = cand.iter().collect();
            if fails(&s) {
                cur = cand;
                progressed = true;
            } else {
                i += chunk;
            }
        }
        if !progressed {
            if chunk == 1 {
                break;
            }
            chunk /= 2;
        }
    }
    cur.into_iter().collect()
}
