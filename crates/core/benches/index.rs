//! Routing hot path.
//!
//! Baseline (small scale): index probe and record for a 400-block prompt against an index holding 100k
//! blocks across 8 workers, and a full `kv` select over 8 workers.
//!
//! At scale: 1024 workers and 10 M indexed blocks, fed as KV events. Prompts are chains (a key encodes
//! its prefix): 16 system prompts of 32 blocks, each held by nearly every worker, then a 224-block body
//! held by 1–4 workers (1: 50 %, 2: 25 %, 3: 15 %, 4: 10 %). Measured: bytes per indexed block (a
//! counting allocator, and the process's resident memory), probe and `Router::select` latency
//! (criterion's mean, plus p50/p99/p99.9 over individually timed calls, also while another thread
//! ingests), event ingestion throughput in batches of BlockStored sizes, and `remove_worker`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use mmrouter_core::routing::index::SCAN_CHUNK;
use mmrouter_core::routing::{BlockIndex, Router, RoutingConfig, SelectRequest, Source, WorkerSpec};

/// Live heap bytes (requested sizes; the allocator's own per-chunk overhead is not included).
static LIVE: AtomicIsize = AtomicIsize::new(0);

struct Counting;

// SAFETY: delegates every call to `System` unchanged; the bookkeeping allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
    // Forwarded so a large zeroed allocation stays lazily committed, as it is without this allocator.
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

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

/// The router's default budget (1 M keys: a 16 MiB table and 32 MiB of nodes, far beyond the CPU's
/// caches, so every lookup misses), full, and a 500-block prompt of new keys recorded per iteration:
/// what a unique ~8 000-token prompt costs the router in approximate mode.
fn record_at_default_budget(c: &mut Criterion) {
    const BUDGET: usize = 1_000_000;
    let idx = BlockIndex::new(BUDGET, 600, 30);
    for seed in 0..(BUDGET as u64 / PROMPT_BLOCKS) {
        idx.record((seed % WORKERS as u64) as usize, &prompt(1 << 32 | seed), Source::Approximate);
    }
    assert_eq!(idx.len(), BUDGET);
    let mut seed = 1u64 << 33;
    let mut group = c.benchmark_group("index_1m_record_500_blocks_new_evicting");
    group.throughput(Throughput::Elements(500));
    group.bench_function("approximate", |b| {
        b.iter_batched(
            || {
                seed += 1;
                let keys: Vec<u64> =
                    (0..500u64).map(|i| (seed * 1000 + i).wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect();
                (keys, (seed % WORKERS as u64) as usize)
            },
            |(keys, w)| idx.record(w, &keys, Source::Approximate),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

fn select(c: &mut Criterion) {
    let router =
        Router::new(RoutingConfig { index_max_blocks: INDEX_BLOCKS, ..RoutingConfig::default() }, specs(WORKERS))
            .expect("valid router");
    fill(|w, b| router.record(w, b));
    let hot = prompt(0);
    let req = SelectRequest {
        blocks: &hot,
        block_size: 16,
        prompt_tokens: 6400,
        decode_tokens: 256,
        images: Vec::new(),
        unseen: false,
    };
    c.bench_function("kv_select_8_workers_400_blocks", |b| b.iter(|| black_box(router.select(black_box(&req)))));
}

fn specs(n: usize) -> Vec<WorkerSpec> {
    (0..n).map(|i| WorkerSpec::new(format!("w{i}"), format!("http://127.0.0.1:{}", 9000 + i))).collect()
}

// ---------------------------------------------------------------------------------------------------
// At scale.

const SCALE_WORKERS: usize = 1024;
const SCALE_BLOCKS: usize = 10_000_000;
const HEADS: u64 = 16;
const HEAD_LEN: usize = 32;
const BODY_LEN: usize = 224;
/// Enough prompts for the budget (the first few hundred keys are evicted at the end of the fill).
const PROMPTS: u64 = (SCALE_BLOCKS / BODY_LEN) as u64;

/// A 64-bit mixer standing in for the chained block hash.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// `len` chained keys after `parent`: each key depends on its parent and its own content.
fn chain(parent: u64, salt: u64, len: usize) -> Vec<u64> {
    let mut key = parent;
    (0..len as u64)
        .map(|i| {
            key = mix(key ^ mix(salt.wrapping_mul(1 << 20).wrapping_add(i)));
            key
        })
        .collect()
}

/// Prompt `p`: system prompt `p % HEADS`, then its own body. `p` beyond PROMPTS is a prompt never seen.
fn scale_prompt(p: u64) -> Vec<u64> {
    let mut keys = chain(0, 1 + p % HEADS, HEAD_LEN);
    let tail = *keys.last().expect("non-empty head");
    keys.extend(chain(tail, 1_000 + p, BODY_LEN));
    keys
}

/// The workers holding prompt `p`: 1 (50 %), 2 (25 %), 3 (15 %) or 4 (10 %), spread over all 1024.
fn holders(p: u64) -> impl Iterator<Item = usize> {
    const COUNT: [u64; 20] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 3, 4, 4];
    (0..COUNT[(p % 20) as usize]).map(move |j| ((p * 7919 + j * 257) % SCALE_WORKERS as u64) as usize)
}

/// Feeds the whole population as events, one BlockStored per (prompt, holder).
fn scale_fill(store: impl Fn(usize, &[u64])) {
    for p in 0..PROMPTS {
        let keys = scale_prompt(p);
        for w in holders(p) {
            store(w, &keys);
        }
    }
}

/// Prompts to probe with, cycling, so the measurement is not one cache-hot prompt: held by 4 workers.
fn probe_set() -> Vec<Vec<u64>> {
    (0..256u64).map(|i| 18 + 20 * (i * 173 % (PROMPTS / 20 - 1))).map(scale_prompt).collect()
}

fn resident_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    statm.split_whitespace().nth(1).and_then(|p| p.parse::<usize>().ok()).unwrap_or(0) * 4096
}

/// p50 / p99 / p99.9 / max of `n` individually timed calls of `f(i)`.
fn percentiles(n: usize, mut f: impl FnMut(usize)) -> String {
    let mut t: Vec<Duration> = (0..n)
        .map(|i| {
            let start = Instant::now();
            f(i);
            start.elapsed()
        })
        .collect();
    t.sort();
    let at = |q: f64| t[((n as f64 * q) as usize).min(n - 1)];
    format!("p50 {:?}, p99 {:?}, p99.9 {:?}, max {:?} (n = {n})", at(0.5), at(0.99), at(0.999), t[n - 1])
}

fn scale_index(c: &mut Criterion) {
    let (heap0, rss0) = (LIVE.load(Ordering::Relaxed), resident_bytes());
    let start = Instant::now();
    let idx = BlockIndex::new(SCALE_BLOCKS, 600, 30);
    scale_fill(|w, keys| _ = idx.store_events(w, keys));
    let fill_time = start.elapsed();
    let heap = (LIVE.load(Ordering::Relaxed) - heap0) as f64;
    let rss = resident_bytes().saturating_sub(rss0) as f64;
    let (len, entries) = (idx.len(), idx.counts().total());
    assert_eq!(len, SCALE_BLOCKS);
    println!(
        "scale: {len} blocks, {entries} (block, worker) entries ({:.2} per block), filled in {fill_time:.1?}",
        entries as f64 / len as f64
    );
    println!(
        "scale: bytes per indexed block: {:.1} heap (counting allocator), {:.1} resident (RSS delta)",
        heap / len as f64,
        rss / len as f64
    );

    let probes = probe_set();
    let mut i = 0;
    c.bench_function("scale_probe_1024w_10m_256_blocks_hit", |b| {
        b.iter(|| {
            i += 1;
            black_box(idx.probe(&probes[i % probes.len()], SCALE_WORKERS))
        })
    });
    let want = idx.probe(&probes[0], SCALE_WORKERS);
    assert_eq!(want.iter().filter(|&&o| o == 256).count(), 4, "four workers hold the whole prompt");
    // A known system prompt with a body never seen: the 32 head blocks are held by ~every worker.
    let new_body = scale_prompt(u64::MAX / 2);
    let unknown = chain(99, 99, HEAD_LEN + BODY_LEN);
    c.bench_function("scale_probe_1024w_10m_known_head_new_body", |b| {
        b.iter(|| black_box(idx.probe(black_box(&new_body), SCALE_WORKERS)))
    });
    c.bench_function("scale_probe_1024w_10m_miss", |b| {
        b.iter(|| black_box(idx.probe(black_box(&unknown), SCALE_WORKERS)))
    });
    println!(
        "scale: probe hit {}",
        percentiles(20_000, |i| _ = black_box(idx.probe(&probes[i % probes.len()], SCALE_WORKERS)))
    );

    ingestion(c, &idx);
    probes_during_ingestion(&idx, &probes);
    clear_workers(&idx);
}

/// New chains (the budget is full: every new key evicts the least recent one), in BlockStored sizes:
/// 1 block (a decode step filled one), 16 and 64 (prefill chunks), 256 (the chunk limit).
fn ingestion(c: &mut Criterion, idx: &BlockIndex) {
    let mut group = c.benchmark_group("scale_store_events_new");
    let mut salt = 1u64 << 40;
    for size in [1usize, 16, 64, 256] {
        group.throughput(Throughput::Elements(size as u64));
        group.bench_function(format!("{size}_blocks"), |b| {
            b.iter_batched(
                || {
                    salt += 1;
                    (chain(salt, salt, size), (salt % SCALE_WORKERS as u64) as usize)
                },
                |(keys, w)| idx.store_events(w, &keys),
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
    // A worker evicting blocks it holds: store 64, then remove the same 64.
    let mut group = c.benchmark_group("scale_store_then_remove_events");
    group.throughput(Throughput::Elements(128));
    group.bench_function("64_blocks", |b| {
        b.iter_batched(
            || {
                salt += 1;
                chain(salt, salt, 64)
            },
            |keys| {
                idx.store_events(7, &keys);
                idx.remove_events(7, &keys);
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
    assert!(idx.len() <= SCALE_BLOCKS);
}

/// Probe latency while another thread applies 4096-block event batches as fast as it can: the writer
/// takes the lock for at most 256 keys at a time and hands it to a waiting probe between chunks.
fn probes_during_ingestion(idx: &BlockIndex, probes: &[Vec<u64>]) {
    // The ingestion benches evicted the oldest prompts: announce the probed ones again.
    for (i, keys) in probes.iter().enumerate() {
        for w in 0..4 {
            idx.store_events((i * 4 + w) % SCALE_WORKERS, keys);
        }
    }
    let full = |o: &Vec<u32>| o.iter().filter(|&&b| b == 256).count() >= 4;
    assert!(probes.iter().all(|p| full(&idx.probe(p, SCALE_WORKERS))));
    let mut all_full = true;
    let line = while_ingesting(
        |w, keys| _ = idx.store_events(w, keys),
        || percentiles(20_000, |i| all_full &= full(&black_box(idx.probe(&probes[i % probes.len()], SCALE_WORKERS)))),
    );
    assert!(all_full, "the writer evicted a probed prompt");
    println!("scale: probe hit while another thread ingests 4096-block batches: {line}");
}

/// Runs `measure` while another thread stores 4096-block event batches (new prompts on rotating
/// workers) through `store` as fast as it can; prints how many it stored meanwhile.
fn while_ingesting<T>(store: impl Fn(usize, &[u64]) + Sync, measure: impl FnOnce() -> T) -> T {
    let stop = AtomicBool::new(false);
    let (out, stored) = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                store((n % SCALE_WORKERS as u64) as usize, &chain(n << 44, n, 4096));
            }
            n * 4096
        });
        let out = measure();
        stop.store(true, Ordering::Relaxed);
        (out, writer.join().expect("writer"))
    });
    println!("scale: (the writer stored {stored} blocks meanwhile)");
    out
}

/// `remove_worker` (a worker restart): scans the slab [`SCAN_CHUNK`] slots per lock hold.
fn clear_workers(idx: &BlockIndex) {
    for w in [1usize, 512, 1023] {
        let before = idx.counts().total();
        let start = Instant::now();
        idx.remove_worker(w);
        let took = start.elapsed();
        let chunks = idx.len().div_ceil(SCAN_CHUNK);
        println!(
            "scale: remove_worker({w}) dropped {} entries in {took:.1?} (≤ {chunks} lock holds of {SCAN_CHUNK} slots)",
            before - idx.counts().total()
        );
    }
}

fn scale_select(c: &mut Criterion) {
    let cfg = RoutingConfig { index_max_blocks: SCALE_BLOCKS, ..RoutingConfig::default() };
    let router = Router::new(cfg, specs(SCALE_WORKERS)).expect("valid router");
    scale_fill(|w, keys| router.store_events(w, keys));
    let probes = probe_set();
    let reqs: Vec<SelectRequest<'_>> = probes
        .iter()
        .map(|b| SelectRequest {
            blocks: b,
            block_size: 16,
            prompt_tokens: 256 * 16,
            decode_tokens: 256,
            images: Vec::new(),
            unseen: false,
        })
        .collect();
    let mut i = 0;
    c.bench_function("scale_kv_select_1024w_10m_256_blocks", |b| {
        b.iter(|| {
            i += 1;
            black_box(router.select(&reqs[i % reqs.len()]))
        })
    });
    let miss = chain(99, 99, HEAD_LEN + BODY_LEN);
    let miss = SelectRequest {
        blocks: &miss,
        block_size: 16,
        prompt_tokens: 256 * 16,
        decode_tokens: 256,
        images: Vec::new(),
        unseen: false,
    };
    c.bench_function("scale_kv_select_1024w_10m_miss", |b| b.iter(|| black_box(router.select(black_box(&miss)))));
    println!("scale: kv select {}", percentiles(20_000, |i| _ = black_box(router.select(&reqs[i % reqs.len()]))));
    select_during_ingestion(&router, &reqs);
}

/// `kv` select while another thread applies 4096-block event batches as fast as it can (new prompts on
/// rotating workers): what a request waits for the index while the workers' feeds are busy.
fn select_during_ingestion(router: &Router, reqs: &[SelectRequest<'_>]) {
    let line = while_ingesting(
        |w, keys| router.store_events(w, keys),
        || percentiles(20_000, |i| _ = black_box(router.select(&reqs[i % reqs.len()]))),
    );
    println!("scale: kv select while another thread ingests 4096-block batches: {line}");
}

criterion_group!(benches, index, record_at_default_budget, select);
criterion_group!(scale, scale_index, scale_select);
criterion_main!(benches, scale);
