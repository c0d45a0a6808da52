//! The core's encoding (`mmrouter-tokenize` behind the segment cache) against Hugging Face `tokenizers`
//! on a seeded corpus of mixed text, code, CJK, emoji, white-space runs, special tokens and special-token
//! look-alikes, for each bundled tokenizer. `mmrouter-tokenize`'s own tests go further (every code point,
//! exhaustive short strings, many MB in release); this checks the integration: the added-token split, the
//! cache (each text is encoded twice), pieces longer than the cache takes, and the add-special path.
//!
//! Corpus size: `MMROUTER_TOKENIZE_PARITY_MB` megabytes per tokenizer (default 0.5 in debug builds, where
//! `tokenizers` is slow, 4 in release).

use std::io::Read;

use mmrouter_core::plan::tokenize_completion;
use mmrouter_core::prompt::PromptModel;
use mmrouter_core::request::{Endpoint, Request};
use serde_json::Value;
use tokenizers::Tokenizer;

use crate::corpus::{self, Mix, Rng};

/// Added tokens of the shared Qwen tokenizer that the Qwen2.5-VL profile does not have.
const QWEN25_DROPPED: [&str; 4] = ["<tool_response>", "</tool_response>", "<think>", "</think>"];

fn budget_bytes() -> usize {
    let mb: f64 = std::env::var("MMROUTER_TOKENIZE_PARITY_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) { 0.5 } else { 4.0 });
    (mb * 1e6) as usize
}

/// The reference: `tokenizers` loaded from the profile's tokenizer file, independently of the core.
fn reference(profile: &str) -> Tokenizer {
    let gz = PromptModel::bundled_file(profile, "tokenizer.json.gz").expect("bundled tokenizer");
    let mut json = Vec::new();
    flate2::read::GzDecoder::new(gz).read_to_end(&mut json).expect("gunzip");
    if profile == "qwen2.5-vl" {
        let mut value: Value = serde_json::from_slice(&json).unwrap();
        let added = value["added_tokens"].as_array_mut().unwrap();
        added.retain(|t| !QWEN25_DROPPED.contains(&t["content"].as_str().unwrap()));
        json = serde_json::to_vec(&value).unwrap();
    }
    Tokenizer::from_bytes(&json).expect("tokenizers loads the bundled tokenizer")
}

/// Seeded documents: the adversarial mix, chat-shaped wrappers around some, and a few pieces longer
/// than the segment cache keeps (64 KiB).
fn documents(seed: u64) -> Vec<String> {
    let mut docs = corpus::documents(seed, budget_bytes(), 100, 12_000, Mix::Adversarial);
    let mut r = Rng::new(seed ^ 0x00C4_A7ED);
    for d in docs.iter_mut().step_by(3) {
        let system = ["You are a helpful assistant.", "", "  Réponds en français.\n"][r.below(3)];
        *d =
            format!("<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{d}<|im_end|>\n<|im_start|>assistant\n");
    }
    for _ in 0..2 {
        docs.push(corpus::document(&mut r, 100_000, Mix::Realistic));
    }
    docs
}

fn first_difference(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()))
}

#[test]
fn core_encode_equals_tokenizers_on_a_mixed_corpus_for_each_bundled_tokenizer() {
    for (i, profile) in PromptModel::bundled_names().iter().enumerate() {
        let model = PromptModel::bundled(profile).unwrap();
        assert!(model.fast_tokenizer(), "{profile}: the bundled tokenizer is encoded by mmrouter-tokenize");
        let hf = reference(profile);
        let docs = documents(0x70CE_0000 + i as u64);
        let (mut bytes, mut tokens) = (0, 0);
        for (n, doc) in docs.iter().enumerate() {
            let want = hf.encode_fast(doc.as_str(), false).unwrap().get_ids().to_vec();
            for pass in ["new", "cached"] {
                let got = model.encode(doc).unwrap();
                assert!(
                    got == want,
                    "{profile}: document {n} ({} bytes, {pass}) differs from token {} on",
                    doc.len(),
                    first_difference(&got, &want)
                );
            }
            bytes += doc.len();
            tokens += want.len();
        }
        eprintln!("{profile}: {} documents, {bytes} bytes, {tokens} tokens, identical ids", docs.len());
    }
}

#[test]
fn completions_with_special_tokens_equal_tokenizers() {
    // `/v1/completions` strings get the post-processor's specials (none for Qwen's ByteLevel).
    for profile in PromptModel::bundled_names() {
        let model = PromptModel::bundled(profile).unwrap();
        let hf = reference(profile);
        for doc in corpus::documents(0x5EC1A1, 60_000, 50, 3_000, Mix::Adversarial) {
            let body = serde_json::to_vec(&serde_json::json!({"model": "m", "prompt": doc})).unwrap();
            let request = Request::parse(Endpoint::Completion, &body).unwrap();
            let got = tokenize_completion(&model, &request, None).unwrap();
            let want = hf.encode_fast(doc.as_str(), true).unwrap().get_ids().to_vec();
            assert!(got == want, "{profile}: {doc:?} differs from token {}", first_difference(&got, &want));
        }
    }
}

#[test]
fn the_hf_only_model_gives_the_same_ids() {
    let model = PromptModel::bundled("qwen3-vl").unwrap();
    let hf_only = model.with_hf_tokenizer_only();
    assert!(!hf_only.fast_tokenizer());
    for doc in corpus::documents(0xB0B, 40_000, 50, 4_000, Mix::Adversarial) {
        assert_eq!(model.encode(&doc).unwrap(), hf_only.encode(&doc).unwrap(), "{doc:?}");
    }
}
