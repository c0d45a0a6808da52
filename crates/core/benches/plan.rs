//! Planning cost per request: parse + render + tokenize + expand + block keys for a chat request with one
//! ~150 KB data-URL image and a few hundred words (the same request every iteration: a segment-cache
//! hit); block keys alone for a 4k-token prompt; and a text-only chat of ~2 000 tokens of multilingual
//! text, repeated (cache hit) and unique (a new user turn every iteration, so the cache cannot help),
//! each with the production encoder (`mmrouter-tokenize`) and with HF `tokenizers` as the baseline; and
//! the next turn of a multi-turn conversation (history resent plus one new ~200-token user turn, the load
//! generator's `multi-turn` shape), planned and tokenized only, with and without the prefix cache, and
//! planned with every chat rendered whole (no resumed conversation).

use std::borrow::Cow;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use mmrouter_core::accounting::RunPart;
use mmrouter_core::plan::{block_keys, expand, seed, tokenize_chat, ImageSpan};
use mmrouter_core::prompt::PromptModel;
use mmrouter_core::request::{Endpoint, Request};

/// The seeded multilingual corpus generator of mmrouter-tokenize's tests and benchmark.
#[path = "../../tokenize/tests/tokenize/common/corpus.rs"]
mod corpus;

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

/// A text-only chat whose user turn is `text`.
fn text_request(text: &str) -> Vec<u8> {
    let body = serde_json::json!({
        "model": "qwen3-vl",
        "messages": [
            {"role": "system", "content": "You are a careful assistant."},
            {"role": "user", "content": text}
        ]
    });
    serde_json::to_vec(&body).unwrap()
}

/// ~2 000 tokens of the seeded realistic mix (prose, code, CJK, other scripts) per user turn.
const TURN_BYTES: usize = 6_500;

fn bench_unique(c: &mut Criterion) {
    let fast = PromptModel::bundled("qwen3-vl").expect("bundled model");
    assert!(fast.fast_tokenizer(), "the bundled tokenizer is encoded by mmrouter-tokenize");
    let hf = fast.with_hf_tokenizer_only();
    let chain_seed = seed("qwen3-vl", None, None);
    let plan = |model: &PromptModel, body: &Vec<u8>| {
        let parsed = Request::parse(Endpoint::Chat, black_box(body)).expect("parse");
        let tokens = tokenize_chat(model, &parsed, PAD, &Default::default()).expect("tokenize");
        black_box(block_keys(&tokens.ids, &[], 16, chain_seed))
    };
    // Average prompt tokens of a turn, for the throughput figure.
    let mut r = corpus::Rng::new(0x2000);
    let sample: Vec<Vec<u8>> =
        (0..64).map(|_| text_request(&corpus::document(&mut r, TURN_BYTES, corpus::Mix::Realistic))).collect();
    let tokens: usize = sample
        .iter()
        .map(|b| {
            let parsed = Request::parse(Endpoint::Chat, b).unwrap();
            tokenize_chat(&fast, &parsed, PAD, &Default::default()).unwrap().ids.len()
        })
        .sum();
    let avg_tokens = (tokens / sample.len()) as u64;
    eprintln!("plan_chat_*_2000_tokens: {avg_tokens} prompt tokens per request on average");

    // The same request every iteration: the user turn is served from the segment cache.
    let mut group = c.benchmark_group("plan_chat_cache_hit_2000_tokens");
    group.throughput(Throughput::Elements(avg_tokens));
    for (label, model) in [("mmrouter_tokenize", &fast), ("hf_tokenizers", &hf)] {
        let body = &sample[0];
        group.bench_function(label, |b| b.iter(|| plan(model, body)));
    }
    group.finish();

    // A new user turn every iteration (generated outside the timed part), never seen before: the
    // segment cache cannot help, as on real traffic's new turns and one-shot prompts.
    let mut group = c.benchmark_group("plan_chat_unique_2000_tokens");
    group.throughput(Throughput::Elements(avg_tokens));
    for (label, model) in [("mmrouter_tokenize", &fast), ("hf_tokenizers", &hf)] {
        let mut r = corpus::Rng::new(0xC0DE);
        let mut n = 0u64;
        group.bench_function(label, |b| {
            b.iter_batched(
                || {
                    n += 1;
                    text_request(&format!("{n} {}", corpus::document(&mut r, TURN_BYTES, corpus::Mix::Realistic)))
                },
                |body| plan(model, &body),
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

/// A user or assistant turn of the multi-turn shape: ~200 tokens of the realistic mix.
const SHORT_TURN_BYTES: usize = 400;
/// User turns before the planned one (the load generator's conversations have 8 turns).
const HISTORY_TURNS: usize = 7;

/// The requests of turns `history` and `history + 1` of a conversation never seen before: the history
/// (a shared system prompt, user turns and replies) plus one new user turn each.
fn next_turn(r: &mut corpus::Rng, n: u64, history: usize) -> (Vec<u8>, Vec<u8>) {
    let mut turn = || corpus::document(r, SHORT_TURN_BYTES, corpus::Mix::Realistic);
    let mut messages = vec![serde_json::json!({"role": "system", "content": "You are a careful assistant."})];
    for i in 0..history {
        if i > 0 {
            messages.push(serde_json::json!({"role": "assistant", "content": turn()}));
        }
        messages.push(serde_json::json!({"role": "user", "content": format!("{n} {}", turn())}));
    }
    let previous = serde_json::to_vec(&serde_json::json!({"model": "qwen3-vl", "messages": messages})).unwrap();
    messages.push(serde_json::json!({"role": "assistant", "content": turn()}));
    messages.push(serde_json::json!({"role": "user", "content": turn()}));
    (previous, serde_json::to_vec(&serde_json::json!({"model": "qwen3-vl", "messages": messages})).unwrap())
}

fn bench_multi_turn(c: &mut Criterion) {
    let model = PromptModel::bundled("qwen3-vl").expect("bundled model");
    let chain_seed = seed("qwen3-vl", None, None);
    let plan = |model: &PromptModel, body: &Vec<u8>| {
        let parsed = Request::parse(Endpoint::Chat, black_box(body)).expect("parse");
        let tokens = tokenize_chat(model, &parsed, PAD, &Default::default()).expect("tokenize");
        black_box(block_keys(&tokens.ids, &[], 16, chain_seed))
    };
    let (_, sample) = next_turn(&mut corpus::Rng::new(0x3000), 0, HISTORY_TURNS);
    let tokens = tokenize_chat(&model, &Request::parse(Endpoint::Chat, &sample).unwrap(), PAD, &Default::default());
    let tokens = tokens.unwrap().ids.len() as u64;
    eprintln!("plan_chat_multi_turn: {tokens} prompt tokens per request");

    // Each iteration plans a conversation's next turn; the previous turn was planned first (untimed),
    // as the router planned it when the client sent it.
    let mut group = c.benchmark_group("plan_chat_multi_turn");
    group.throughput(Throughput::Elements(tokens));
    let variants = [
        ("prefix_reuse", model.clone()),
        ("segment_cache_only", model.without_prefix_reuse()),
        ("whole_render", model.without_render_resume()),
    ];
    for (label, model) in variants {
        let mut r = corpus::Rng::new(0x3001);
        let mut n = 0u64;
        group.bench_function(label, |b| {
            b.iter_batched(
                || {
                    n += 1;
                    let (previous, next) = next_turn(&mut r, n, HISTORY_TURNS);
                    plan(&model, &previous);
                    next
                },
                |body| plan(&model, &body),
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();

    // The tokenization step alone, on the same turns rendered (untimed).
    let render = |model: &PromptModel, body: &[u8]| {
        model.render_chat(&Request::parse(Endpoint::Chat, body).unwrap(), &Default::default()).unwrap()
    };
    let mut group = c.benchmark_group("encode_chat_multi_turn");
    group.throughput(Throughput::Elements(tokens));
    for (label, model) in [("prefix_reuse", model.clone()), ("segment_cache_only", model.without_prefix_reuse())] {
        let mut r = corpus::Rng::new(0x3002);
        let mut n = 0u64;
        group.bench_function(label, |b| {
            b.iter_batched(
                || {
                    n += 1;
                    let (previous, next) = next_turn(&mut r, n, HISTORY_TURNS);
                    model.encode(&render(&model, &previous)).unwrap();
                    render(&model, &next)
                },
                |text| black_box(model.encode(black_box(&text)).unwrap()),
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

/// The next turn with and without the prefix cache, interleaved turn by turn (the order alternating)
/// so that a shared machine's load drifts alike for both: planned (parse, render, tokenize, block
/// keys) and tokenized only, for conversations of 8 and of 32 turns; prints the medians. Runs only
/// with `MMROUTER_BENCH_INTERLEAVED=1` (criterion's filter does not reach it).
fn bench_multi_turn_interleaved(_: &mut Criterion) {
    if std::env::var_os("MMROUTER_BENCH_INTERLEAVED").is_none() {
        return;
    }
    let model = PromptModel::bundled("qwen3-vl").expect("bundled model");
    let render =
        |body: &[u8]| model.render_chat(&Request::parse(Endpoint::Chat, body).unwrap(), &Default::default()).unwrap();
    let chain_seed = seed("qwen3-vl", None, None);
    let plan = |model: &PromptModel, body: &Vec<u8>| {
        let parsed = Request::parse(Endpoint::Chat, black_box(body)).expect("parse");
        let tokens = tokenize_chat(model, &parsed, PAD, &Default::default()).expect("tokenize");
        black_box(block_keys(&tokens.ids, &[], 16, chain_seed)).len()
    };
    for history in [HISTORY_TURNS, 31] {
        interleaved("plan_chat_multi_turn", history, |r, n| next_turn(r, n, history), plan);
        let encode = |model: &PromptModel, text: &String| model.encode(black_box(text)).unwrap().len();
        let turn = |r: &mut corpus::Rng, n| {
            let (previous, next) = next_turn(r, n, history);
            (render(&previous), render(&next))
        };
        interleaved("encode_chat_multi_turn", history, turn, encode);
    }
}

/// Times `step` on the next turn (after the previous one, untimed) with a fresh model with and one
/// without the prefix cache, alternating which goes first; prints the medians.
fn interleaved<T>(
    name: &str,
    history: usize,
    mut turn: impl FnMut(&mut corpus::Rng, u64) -> (T, T),
    step: impl Fn(&PromptModel, &T) -> usize,
) {
    const TURNS: usize = 3000;
    let model = PromptModel::bundled("qwen3-vl").expect("bundled model");
    let models = [model.with_overrides(None, None).unwrap(), model.without_prefix_reuse()];
    let mut micros: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut r = corpus::Rng::new(0x3003);
    for n in 0..TURNS {
        let (previous, next) = turn(&mut r, n as u64);
        for k in [n % 2, 1 - n % 2] {
            step(&models[k], &previous);
            let start = std::time::Instant::now();
            black_box(step(&models[k], &next));
            micros[k].push(start.elapsed().as_secs_f64() * 1e6);
        }
    }
    let [with, without] = micros.map(|mut v| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    });
    eprintln!(
        "{name} interleaved ({TURNS} conversations, turn {}): prefix_reuse {with:.1} µs, segment_cache_only \
         {without:.1} µs (medians); segment_cache_only / prefix_reuse = {:.3}",
        history + 1,
        without / with
    );
}

/// Replays the bodies of a `mmrouter workload` file (`MMROUTER_BENCH_REPLAY=path`) through one model
/// in file order, as one router plans them, and prints the plan time per request and how many
/// renders resumed and prompts reused a kept prefix (the caches' retention on interleaved traffic).
fn bench_replay(_: &mut Criterion) {
    let Some(path) = std::env::var_os("MMROUTER_BENCH_REPLAY") else { return };
    let model = PromptModel::bundled("qwen3-vl").expect("bundled model");
    let chain_seed = seed("qwen3-vl", None, None);
    let lines = std::fs::read_to_string(path).expect("workload");
    let bodies: Vec<Vec<u8>> = lines
        .lines()
        .map(|l| serde_json::to_vec(&serde_json::from_str::<serde_json::Value>(l).unwrap()["body"]).unwrap())
        .collect();
    let start = std::time::Instant::now();
    for body in &bodies {
        let parsed = Request::parse(Endpoint::Chat, body).expect("parse");
        let tokens = tokenize_chat(&model, &parsed, PAD, &Default::default()).expect("tokenize");
        black_box(block_keys(&tokens.ids, &[], 16, chain_seed));
    }
    eprintln!(
        "replay: {} requests, {:.1} µs each, {} renders resumed, {} prompts reused a kept prefix",
        bodies.len(),
        start.elapsed().as_secs_f64() * 1e6 / bodies.len() as f64,
        model.resumed_renders(),
        model.prefix_hits()
    );
}

criterion_group!(benches, bench, bench_unique, bench_multi_turn, bench_multi_turn_interleaved, bench_replay);
criterion_main!(benches);
