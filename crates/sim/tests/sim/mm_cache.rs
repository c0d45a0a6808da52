//! The simulator's image caches (vLLM's processor and encoder caches) through real requests to an
//! exact sim, read back from its counters and `/metrics`; the time they save through the timing model's
//! pure functions.

use std::time::Duration;

use mmrouter_sim::timing::{ttft_alone, ImageWork};
use mmrouter_sim::{self as sim, SimHandle, SimOptions, SimStats};
use serde_json::{json, Value};

use super::{fast, metrics_text, post, sample, words, CHAT};

/// A GIF data URL whose header claims `width`×`height`; `tag` (the background colour index) makes
/// images of one size distinct (another content hash, so another identity).
pub(super) fn gif(width: u16, height: u16, tag: u8) -> String {
    use base64::Engine as _;
    let mut gif = b"GIF89a".to_vec();
    gif.extend_from_slice(&width.to_le_bytes());
    gif.extend_from_slice(&height.to_le_bytes());
    gif.extend_from_slice(&[0, tag, 0, 0x3b]);
    format!("data:image/gif;base64,{}", base64::engine::general_purpose::STANDARD.encode(gif))
}

/// A chat with its own system text, then the image, then a question long enough that the image's run
/// lies well inside the cacheable prefix.
fn chat(system: &str, url: &str) -> Vec<u8> {
    let content = json!([{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": words(40, "q")}]);
    let messages = json!([{"role": "system", "content": system}, {"role": "user", "content": content}]);
    serde_json::to_vec(&json!({"model": "m", "messages": messages, "max_tokens": 1})).expect("json")
}

async fn exact(opts: SimOptions) -> SimHandle {
    sim::spawn_exact(opts).await.expect("sim starts")
}

async fn ask(sim: &SimHandle, body: &[u8]) -> Value {
    let resp = post(sim, CHAT, body).await;
    assert_eq!(resp.status(), 200);
    resp.json().await.expect("json")
}

/// Encoder tokens of a 640×480 image for the default model, as the sim counts them.
async fn tokens_of_one_image() -> u64 {
    let sim = exact(fast()).await;
    ask(&sim, &chat("probe", &gif(640, 480, 0))).await;
    let tokens = sim.stats().image_encoded_tokens;
    assert!(tokens > 100, "{tokens}");
    sim.shutdown().await;
    tokens
}

fn caches(s: &SimStats) -> [u64; 4] {
    [s.mm_cache_queries, s.mm_cache_hits, s.encoder_cache_queries, s.encoder_cache_hits]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_asked_twice_hits_both_caches_the_second_time() {
    let sim = exact(fast()).await;
    let image = gif(640, 480, 1);
    ask(&sim, &chat("You are terse.", &image)).await;
    let first = sim.stats();
    assert_eq!(caches(&first), [1, 0, 1, 0]);
    let tokens = first.image_encoded_tokens;
    assert_eq!(first.image_preprocessed_tokens, tokens);
    // Another system prompt: no shared prefix, so the image is looked up again in both caches.
    ask(&sim, &chat("You answer in French.", &image)).await;
    let second = sim.stats();
    assert_eq!(caches(&second), [2, 1, 2, 1]);
    assert_eq!((second.image_preprocessed_tokens, second.image_encoded_tokens), (tokens, tokens), "nothing redone");

    let text = metrics_text(&sim).await;
    assert_eq!(sample(&text, "vllm:mm_cache_queries_total"), 2.0);
    assert_eq!(sample(&text, "vllm:mm_cache_hits_total"), 1.0);
    assert_eq!(sample(&text, "sim_encoder_cache_queries_total"), 2.0);
    assert_eq!(sample(&text, "sim_encoder_cache_hits_total"), 1.0);
    assert_eq!(sample(&text, "sim_image_encoded_tokens_total"), tokens as f64);
    assert_eq!(sample(&text, "sim_mm_processor_cache_bytes"), sim::processor_item_bytes(tokens as u32) as f64);
    assert_eq!(sample(&text, "sim_encoder_cache_tokens"), tokens as f64);
    for name in ["vllm:mm_cache_queries_total", "vllm:mm_cache_hits_total"] {
        assert!(text.contains(&format!("# TYPE {name} counter\n")), "{name} is a counter");
    }
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_inside_the_cached_prefix_is_not_encoded_again() {
    // Processor cache off: the front end processes the image every time, the encoder runs once.
    let sim = exact(SimOptions { mm_processor_cache_gb: 0.0, ..fast() }).await;
    let body = chat("You are terse.", &gif(640, 480, 2));
    ask(&sim, &body).await;
    let tokens = sim.stats().image_encoded_tokens;
    let again = ask(&sim, &body).await;
    let cached = again["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
    assert!(cached > tokens, "the repeat's cached prefix covers the image: {cached} cached");
    let s = sim.stats();
    assert_eq!(caches(&s), [0, 0, 1, 0], "inside the prefix: no encoder lookup; disabled processor cache: none");
    assert_eq!((s.image_preprocessed_tokens, s.image_encoded_tokens), (2 * tokens, tokens));
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_caches_evict_by_bytes_and_by_tokens_as_sized() {
    let tokens = tokens_of_one_image().await;
    let one_and_a_half = |n: u64| n + n / 2;
    let gib = one_and_a_half(sim::processor_item_bytes(tokens as u32)) as f64 / f64::from(1u32 << 30);
    // Each cache holds one such image and a half: a second evicts the first.
    let tight =
        SimOptions { mm_processor_cache_gb: gib, encoder_cache_tokens: one_and_a_half(tokens) as u32, ..fast() };
    let sim = exact(tight).await;
    let (a, b) = (gif(640, 480, 3), gif(640, 480, 4));
    for (i, image) in [&a, &b, &a].into_iter().enumerate() {
        ask(&sim, &chat(&format!("System prompt number {i}."), image)).await;
    }
    let s = sim.stats();
    assert_eq!(caches(&s), [3, 0, 3, 0], "a was evicted from both");
    assert_eq!((s.image_preprocessed_tokens, s.image_encoded_tokens), (3 * tokens, 3 * tokens));
    let text = metrics_text(&sim).await;
    assert_eq!(sample(&text, "sim_mm_processor_cache_bytes"), sim::processor_item_bytes(tokens as u32) as f64);
    assert_eq!(sample(&text, "sim_encoder_cache_tokens"), tokens as f64);
    sim.shutdown().await;

    // Room for two: the same sequence hits a on its return.
    let roomy = SimOptions {
        mm_processor_cache_gb: 2.0 * gib,
        encoder_cache_tokens: 2 * one_and_a_half(tokens) as u32,
        ..fast()
    };
    let sim = exact(roomy).await;
    for (i, image) in [&a, &b, &a].into_iter().enumerate() {
        ask(&sim, &chat(&format!("System prompt number {i}."), image)).await;
    }
    assert_eq!(caches(&sim.stats()), [3, 1, 3, 1]);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_empties_the_image_caches() {
    let sim = exact(fast()).await;
    let image = gif(640, 480, 5);
    ask(&sim, &chat("one", &image)).await;
    let resp = super::client().post(format!("{}/sim/restart", sim.url())).send().await.expect("restart");
    assert_eq!(resp.status(), 200);
    ask(&sim, &chat("two", &image)).await;
    assert_eq!(caches(&sim.stats()), [2, 0, 2, 0], "the restarted engine processes and encodes it again");
    sim.shutdown().await;
}

#[test]
fn the_work_a_hit_skips_is_not_charged() {
    let opts = SimOptions {
        ttft_base_ms: 1,
        prefill_us_per_token: 20,
        image_preprocess_us_per_token: 5,
        image_encode_us_per_token: 10,
        ..SimOptions::default()
    };
    let miss = ImageWork { preprocess_tokens: 1000, encode_tokens: 1000 };
    let encoder_hit = ImageWork { encode_tokens: 0, ..miss };
    let both_hit = ImageWork::default();
    // 100 uncached tokens: 1 ms base + 2 ms prefill, + 5 ms preprocessing, + 10 ms encoding.
    assert_eq!(ttft_alone(100, miss, &opts), Duration::from_millis(18));
    assert_eq!(ttft_alone(100, encoder_hit, &opts), Duration::from_millis(8));
    assert_eq!(ttft_alone(100, both_hit, &opts), sim::ttft(100, &opts));
    let off = SimOptions { image_preprocess_us_per_token: 0, image_encode_us_per_token: 0, ..opts };
    assert_eq!(ttft_alone(100, miss, &off), sim::ttft(100, &off), "both knobs at 0: the text-only model");
}
