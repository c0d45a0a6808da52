//! Routing hot path: index probe and record for a 400-block prompt against an index holding 100k
//! blocks across 8 workers, and a full `kv` select over 8 workers.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use mmrouter_core::routing::{BlockIndex, Router, RoutingConfig, SelectRequest, Source, WorkerSpec};

const WORKERS: usize = 8;
const PROMPT_BLOCKS: u64 = 400;
const INDEX_BLOCKS: usize = 100_000;

fn prompt(seed: u64) -> Vec<u64> {
    (0..PROMPT_BLOCKS).map(|i| (seed * PROMPT_BLOCKS + i).wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect()
}

/// 250 prompts × 400 blocks = 100k keys, spread over the workers; prompt 0 is held by two workers.
fn fill(record: impl Fn(usize, &[u64])) {
    for seed in 0..(INDEX_BLOCKS as u64 / PROMPT_BLOCKS) {
        record((seed % WORKERS as u64) as usize, &prompt(seed));
    }
    record(3, &prompt(0));
}

fn index(c: &mut Criterion) {
    let idx = BlockIndex::new(INDEX_BLOCKS, 600, 30);
    fill(|w, b| idx.record(w, b, Source::Approximate));
    assert_eq!(idx.len(), INDEX_BLOCKS);
    let hot = prompt(0);
    c.bench_function("index_probe_400_blocks_hit", |b| b.iter(|| black_box(idx.probe(black_box(&hot), WORKERS))));
    let miss = prompt(1_000_000);
    c.bench_function("index_probe_400_blocks_miss", |b| b.iter(|| black_box(idx.probe(black_box(&miss), WORKERS))));
    c.bench_function("index_record_400_blocks_refresh", |b| {
        b.iter(|| idx.record(5, black_box(&hot), Source::Approximate))
    });
    // New keys every iteration: 400 inserts, each evicting the least recent key (the index is full).
    let mut seed = 2_000_000u64;
    c.bench_function("index_record_400_blocks_new_evicting", |b| {
        b.iter(|| {
            seed += 1;
            idx.record((seed % WORKERS as u64) as usize, black_box(&prompt(seed)), Source::Approximate);
        })
    });
}

fn select(c: &mut Criterion) {
    let names: Vec<WorkerSpec> =
        (0..WORKERS).map(|i| WorkerSpec::new(format!("w{i}"), format!("http://127.0.0.1:{}", 9000 + i))).collect();
    let cfg = RoutingConfig { index_max_blocks: INDEX_BLOCKS, ..RoutingConfig::default() };
    let router = Router::new(cfg, names).expect("valid router");
    fill(|w, b| router.record(w, b));
    let hot = prompt(0);
    let req = SelectRequest { blocks: &hot, block_size: 16, prompt_tokens: 6400, decode_tokens: 256 };
    c.bench_function("kv_select_8_workers_400_blocks", |b| b.iter(|| black_box(router.select(black_box(&req)))));
}

criterion_group!(benches, index, select);
criterion_main!(benches);
