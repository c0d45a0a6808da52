//! Encoding throughput, `mmrouter-tokenize` vs Hugging Face `tokenizers` 0.23.2, one core.
//!
//! The corpus is a fixed, seeded multilingual mix (prose 40%, code 25%, CJK 20%, other scripts 15%, with
//! emoji / special tokens sprinkled in) of `BENCH_CORPUS_MB` megabytes (default 24) cut into ~64 KB
//! documents. Every timed call encodes the *next* document, so consecutive iterations never see the same
//! text and a pass over the corpus is far larger than `tokenizers`' 10 000-word BPE cache (which is left
//! at its default, as in production). `mmrouter-tokenize` has no cache at all.
//!
//! Throughput is reported in tokens (criterion "elem/s"), using the corpus' average tokens per document.
//! Before the criterion runs, one timed pass over the whole corpus per implementation prints tokens/s and
//! the ratio, after checking that both produce identical ids for every document.
//!
//! Run: `cargo bench -p mmrouter-tokenize --bench encode` (optionally `BENCH_CORPUS_MB=8`).

#[path = "../tests/tokenize/common/corpus.rs"]
mod corpus;

use std::hint::black_box;
use std::io::Read;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use mmrouter_tokenize::FastTokenizer;

fn qwen_json() -> Vec<u8> {
    let gz = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/models/qwen-tokenizer.json.gz"))
        .expect("read fixture");
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(&gz[..]).read_to_end(&mut out).expect("gunzip fixture");
    out
}

fn encode(c: &mut Criterion) {
    let json = qwen_json();
    let t = Instant::now();
    let hf = tokenizers::Tokenizer::from_bytes(&json).expect("hf loads");
    let hf_load = t.elapsed();
    let t = Instant::now();
    let fast = FastTokenizer::from_json(&json).expect("supported");
    let fast_load = t.elapsed();
    eprintln!("load time: tokenizers {hf_load:?}, mmrouter-tokenize {fast_load:?}");

    let mb: f64 = std::env::var("BENCH_CORPUS_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(24.0);
    let docs = corpus::documents(0x5EED_BE7C, (mb * 1e6) as usize, 48_000, 80_000, corpus::Mix::Realistic);
    let bytes: usize = docs.iter().map(String::len).sum();

    // One pass each (this also warms `tokenizers`' cache, as a long-running server's would be), with a
    // parity check.
    let t = Instant::now();
    let hf_out: Vec<Vec<u32>> =
        docs.iter().map(|d| hf.encode_fast(d.as_str(), false).expect("hf encode").get_ids().to_vec()).collect();
    let hf_time = t.elapsed();
    let t = Instant::now();
    let fast_out: Vec<Vec<u32>> = docs.iter().map(|d| fast.encode(d)).collect();
    let fast_time = t.elapsed();
    let tokens: usize = hf_out.iter().map(Vec::len).sum();
    let differing = hf_out.iter().zip(&fast_out).filter(|(a, b)| a != b).count();
    assert_eq!(differing, 0, "{differing} documents encode differently");
    let per_s = |d: Duration| tokens as f64 / d.as_secs_f64();
    eprintln!(
        "corpus: {} documents, {bytes} bytes, {tokens} tokens (identical ids)\n\
         single pass: tokenizers {:.2} M tokens/s, mmrouter-tokenize {:.2} M tokens/s, ratio {:.1}x",
        docs.len(),
        per_s(hf_time) / 1e6,
        per_s(fast_time) / 1e6,
        hf_time.as_secs_f64() / fast_time.as_secs_f64()
    );
    drop((hf_out, fast_out));

    let avg_tokens = (tokens / docs.len()) as u64;
    let mut group = c.benchmark_group("encode_qwen3_multilingual");
    group.throughput(Throughput::Elements(avg_tokens));
    // Warm-up and measurement times come from the command line (e.g. `--warm-up-time 1 --measurement-time 3`).
    group.sample_size(10);

    let mut next = 0usize;
    group.bench_function("hf_tokenizers", |b| {
        b.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                let d = &docs[next % docs.len()];
                next += 1;
                black_box(hf.encode_fast(black_box(d.as_str()), false).expect("hf encode"));
            }
            t.elapsed()
        })
    });
    let mut next = 0usize;
    let mut out = Vec::new();
    group.bench_function("mmrouter_tokenize", |b| {
        b.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                let d = &docs[next % docs.len()];
                next += 1;
                out.clear();
                fast.encode_into(black_box(d), &mut out);
                black_box(&out);
            }
            t.elapsed()
        })
    });
    group.finish();

    // One ~8 000-token prompt of prose at a time (32 KB, no added token: one segment, as a long
    // user message is): on one thread, and cut in two with the second part on the helper thread,
    // as an idle router does (`with_parallel_parts`).
    let mut r = corpus::Rng::new(0x32_000);
    let prompts: Vec<String> = (0..64)
        .map(|_| {
            let mut p = String::new();
            while p.len() < 32_000 {
                corpus::prose(&mut r, &mut p);
            }
            p
        })
        .collect();
    assert!(prompts.iter().all(|p| FastTokenizer::first_cut(p).is_some()), "every prompt is cut");
    let mut group = c.benchmark_group("encode_qwen3_32kb_prompt");
    group.sample_size(20);
    for (label, split) in [("one_thread", false), ("parallel_parts", true)] {
        let mut next = 0usize;
        group.bench_function(label, |b| {
            b.iter(|| {
                let d = &prompts[next % prompts.len()];
                next += 1;
                black_box(if split { fast.encode_split(black_box(d)) } else { fast.encode(black_box(d)) })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, encode);
criterion_main!(benches);
