//! The whole planning path as the proxy runs it, per request: intake (parse + decode + hash + probe)
//! of a 150 KB data-URL photo, and parse + `Pipeline::plan` (intake → account → gate → plan) for a
//! text chat and for that image chat. Baseline in the same run: hashing the image's bytes alone.
//!
//! The `_unique` variants send new input every iteration (built outside the timed part), as real
//! traffic does: a user turn the tokenizer's segment cache has never seen and, for the image chat,
//! image bytes never seen before. The others repeat one request (every cache hits).

use std::hint::black_box;

use base64::Engine;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use mmrouter_core::media::{Intake, MediaConfig};
use mmrouter_core::model::{ModelSource, ModelSpec};
use mmrouter_core::pipeline::{Pipeline, PipelineConfig};
use mmrouter_core::request::{Endpoint, Request};

fn chat(parts: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "model": "Qwen/Qwen3-VL-8B-Instruct",
        "messages": [
            {"role": "system", "content": "You are a careful visual assistant."},
            {"role": "user", "content": parts}
        ]
    }))
    .unwrap()
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let photo = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/images/rocket.jpg")).unwrap();
    let url = format!("data:image/jpeg;base64,{}", base64::engine::general_purpose::STANDARD.encode(&photo));
    let text = "The quick brown fox jumps over the lazy dog while the router plans its prompt. ".repeat(25);
    let image_body = chat(serde_json::json!([
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": text}
    ]));
    let text_body = chat(serde_json::json!(text));
    let cfg = PipelineConfig { model: ModelSpec::new(ModelSource::Bundled("qwen3-vl")), media: MediaConfig::default() };
    let pipeline = rt.block_on(async { Pipeline::new(&cfg).unwrap() });
    let intake = rt.block_on(async { Intake::new(MediaConfig::default()).unwrap() });

    c.bench_function("baseline_xxh3_128_of_110kb", |b| {
        b.iter(|| black_box(xxhash_rust::xxh3::xxh3_128(black_box(&photo))))
    });
    c.bench_function("parse_150kb_image_chat", |b| {
        b.iter(|| black_box(Request::parse(Endpoint::Chat, black_box(&image_body)).unwrap().images.len()))
    });
    c.bench_function("intake_data_url_150kb", |b| {
        b.to_async(&rt).iter(|| async {
            let request = Request::parse(Endpoint::Chat, black_box(&image_body)).unwrap();
            let urls: Vec<&str> = request.images.iter().map(|i| i.url.as_ref()).collect();
            black_box(intake.process(&urls).await.images.unwrap())
        })
    });
    c.bench_function("pipeline_plan_text_chat", |b| {
        b.to_async(&rt).iter(|| async {
            let request = Request::parse(Endpoint::Chat, black_box(&text_body)).unwrap();
            black_box(pipeline.plan(&request).await.unwrap())
        })
    });
    c.bench_function("pipeline_plan_150kb_image_chat", |b| {
        b.to_async(&rt).iter(|| async {
            let request = Request::parse(Endpoint::Chat, black_box(&image_body)).unwrap();
            black_box(pipeline.plan(&request).await.unwrap())
        })
    });

    let planner = &pipeline;
    // A sequence number at the start makes every user turn new; each bench has its own label.
    let mut n = 0u64;
    let mut fresh = move |label: &str| {
        n += 1;
        format!("{label} request {n}, asked for the first time: {text}")
    };
    c.bench_function("pipeline_plan_text_chat_unique", |b| {
        b.to_async(&rt).iter_batched(
            || chat(serde_json::json!(fresh("Text"))),
            |body| async move {
                let request = Request::parse(Endpoint::Chat, black_box(&body)).unwrap();
                black_box(planner.plan(&request).await.unwrap())
            },
            BatchSize::SmallInput,
        )
    });
    let mut photo = photo.clone();
    // A counter written into the entropy-coded data, before the end-of-image marker: new bytes (a new
    // identity) every iteration, the same header.
    let at = photo.len() - 10;
    let mut images = 0u64;
    c.bench_function("pipeline_plan_150kb_image_chat_unique", |b| {
        b.to_async(&rt).iter_batched(
            || {
                images += 1;
                photo[at..at + 8].copy_from_slice(&images.to_le_bytes());
                let url =
                    format!("data:image/jpeg;base64,{}", base64::engine::general_purpose::STANDARD.encode(&photo));
                chat(serde_json::json!([
                    {"type": "image_url", "image_url": {"url": url}},
                    {"type": "text", "text": fresh("Image")}
                ]))
            },
            |body| async move {
                let request = Request::parse(Endpoint::Chat, black_box(&body)).unwrap();
                black_box(planner.plan(&request).await.unwrap())
            },
            BatchSize::SmallInput,
        )
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
