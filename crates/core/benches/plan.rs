//! Planning cost per request: parse + render + tokenize + expand + block keys for a chat request with one
//! ~150 KB data-URL image and a few hundred words; and block keys alone for a 4k-token prompt.

use std::borrow::Cow;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use mmrouter_core::accounting::RunPart;
use mmrouter_core::plan::{block_keys, expand, seed, tokenize_chat, ImageSpan};
use mmrouter_core::prompt::PromptModel;
use mmrouter_core::request::{Endpoint, Request};

const PAD: &str = "<|image_pad|>";

fn request() -> Vec<u8> {
    // ~150 KB of base64 (content is irrelevant to planning; the image is never decoded here).
    let data_url = format!("data:image/jpeg;base64,{}", "QUJD".repeat(150 * 1024 / 4));
    let words = "The quick brown fox jumps over the lazy dog while the router plans its prompt. ";
    let text = words.repeat(25); // ~375 words
    let body = serde_json::json!({
        "model": "qwen3-vl",
        "messages": [
            {"role": "system", "content": "You are a careful visual assistant."},
            {"role": "user", "content": [
                {"type": "text", "text": text},
                {"type": "image_url", "image_url": {"url": data_url}},
                {"type": "text", "text": "Describe the image in detail."}
            ]}
        ]
    });
    serde_json::to_vec(&body).unwrap()
}

fn bench(c: &mut Criterion) {
    let model = PromptModel::bundled("qwen3-vl").expect("bundled model");
    let req = request();
    // Accounting is not wired here: a fixed 300-pad run stands in for the image's count.
    let run = [RunPart { text: Cow::Borrowed(PAD), repeat: 300 }];
    let chain_seed = seed("qwen3-vl", None, None);

    c.bench_function("plan_chat_one_150kb_image", |b| {
        b.iter(|| {
            let parsed = Request::parse(Endpoint::Chat, black_box(&req)).expect("parse");
            let tokens = tokenize_chat(&model, &parsed, PAD, &Default::default()).expect("tokenize");
            let expanded = expand(&model, &tokens, &[(42, &run)]).expect("expand");
            black_box(block_keys(&expanded.ids, &expanded.spans, 16, chain_seed))
        })
    });

    let ids: Vec<u32> = (0..4096u32).map(|i| i.wrapping_mul(2_654_435_761) % 151_000).collect();
    let spans = [ImageSpan { offset: 100, len: 1000, hash: 7 }];
    c.bench_function("block_keys_4k_tokens", |b| {
        b.iter(|| black_box(block_keys(black_box(&ids), &spans, 16, chain_seed)))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
