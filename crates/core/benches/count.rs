//! `Counter::count` per golden profile (ns per image), over a fixed mix of sizes.

use std::hint::black_box;
use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion};
use mmrouter_core::accounting::Counter;
use serde_json::{Map, Value};

const SIZES: [(u32, u32); 8] =
    [(1, 1), (640, 480), (480, 640), (1920, 1080), (4032, 3024), (10, 1900), (8000, 100), (2243, 1047)];

fn bench_count(c: &mut Criterion) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/image_tokens.json");
    let text = std::fs::read_to_string(path).expect("golden fixture");
    let golden: Value = serde_json::from_str(&text).expect("golden JSON");
    let profiles = golden["profiles"].as_object().expect("profiles");
    let mut group = c.benchmark_group("count");
    for (name, p) in profiles {
        let mut kwargs = Map::new();
        if name == "mistral_small_3_1" {
            kwargs.insert("tokenizer_mode".into(), Value::from("mistral"));
        }
        let counter = Counter::from_json(&p["preprocessor_config"], &p["config"], None, &kwargs).expect("counter");
        group.bench_function(name.as_str(), |b| {
            let mut i = 0usize;
            b.iter(|| {
                let (w, h) = SIZES[i % SIZES.len()];
                i += 1;
                black_box(counter.count(black_box(w), black_box(h)))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_count);
criterion_main!(benches);
