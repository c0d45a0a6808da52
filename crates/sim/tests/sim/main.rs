//! Behaviour of the simulated worker through real sockets (127.0.0.1, ephemeral ports).

mod disagg;
mod kv_events;
mod mm_cache;
mod openai_fields;
mod responses;

use std::sync::Arc;
use std::time::Duration;

use mmrouter_sim::{self as sim, Prompter, SimHandle, SimOptions, WordPrompter};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const CHAT: &str = "/v1/chat/completions";
const BS: usize = 16;

/// A zero-delay worker unless the test overrides timing.
fn fast() -> SimOptions {
    SimOptions {
        ttft_base_ms: 0,
        prefill_us_per_token: 0,
        decode_ms_per_token: 0,
        name: "w1".into(),
        ..SimOptions::default()
    }
}

async fn start(opts: SimOptions) -> SimHandle {
    sim::spawn(opts, Arc::new(WordPrompter)).await.expect("sim starts")
}

fn client() -> reqwest::Client {
    mmrouter_core::http_client_builder().no_proxy().build().expect("client")
}

fn sha_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

async fn post(sim: &SimHandle, path: &str, body: &[u8]) -> reqwest::Response {
    client()
        .post(format!("{}{path}", sim.url()))
        .header("content-type", "application/json")
        .body(body.to_vec())
        .send()
        .await
        .expect("request sent")
}

fn header<'a>(resp: &'a reqwest::Response, name: &str) -> &'a str {
    resp.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

fn words(n: usize, tag: &str) -> String {
    (0..n).map(|i| format!("{tag}{i}")).collect::<Vec<_>>().join(" ")
}

fn chat_body(text: &str, extra: Value) -> Vec<u8> {
    let mut body = json!({"model": "m-test", "messages": [{"role": "user", "content": text}]});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    serde_json::to_vec(&body).expect("serialize")
}

fn word_prompt(body: &[u8]) -> sim::SimPrompt {
    let v: Value = serde_json::from_slice(body).expect("json");
    WordPrompter.prompt(CHAT, &v, body, BS).expect("prompt")
}

/// What the sim must report cached for `body` once `held` is the prompt whose blocks it holds.
fn expected_cached(body: &[u8], held: &[u8]) -> u64 {
    let (p, h) = (word_prompt(body), word_prompt(held));
    let shared = p.block_keys.iter().zip(&h.block_keys).take_while(|(a, b)| a == b).count();
    let cap = (p.prompt_tokens as usize - 1) / BS;
    (shared.min(cap) * BS) as u64
}

/// Splits an SSE body into its `data:` payloads, checking the framing.
fn sse_events(text: &str) -> Vec<&str> {
    assert!(text.ends_with("\n\n"), "SSE body ends with a blank line: {text:?}");
    text.split_terminator("\n\n").map(|event| event.strip_prefix("data: ").expect("every event is `data: …`")).collect()
}

async fn usage_of(sim: &SimHandle, body: &[u8]) -> Value {
    let resp = post(sim, CHAT, body).await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.expect("json");
    v["usage"].clone()
}

async fn metrics_text(sim: &SimHandle) -> String {
    let resp = client().get(format!("{}/metrics", sim.url())).send().await.expect("metrics");
    assert_eq!(resp.status(), 200);
    resp.text().await.expect("text")
}

/// Parses `name{labels} value` sample lines; panics on any other non-comment line.
fn samples(text: &str) -> Vec<(String, String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("`series value`");
            let (name, labels) = series.split_once('{').expect("labels present");
            let labels = labels.strip_suffix('}').expect("labels closed");
            assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'), "{name}");
            (name.to_owned(), labels.to_owned(), value.parse().expect("numeric value"))
        })
        .collect()
}

fn sample(text: &str, name: &str) -> f64 {
    samples(text)
        .into_iter()
        .find(|(n, _, _)| n == name)
        .map(|(_, _, v)| v)
        .unwrap_or_else(|| panic!("{name} missing in\n{text}"))
}

/// Polls `cond` every 20 ms for at most 5 s.
async fn eventually(mut cond: impl AsyncFnMut() -> bool) -> bool {
    for _ in 0..250 {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test]
async fn non_stream_chat_is_a_valid_completion() {
    let sim = start(fast()).await;
    let body = chat_body(&words(20, "w"), json!({"max_tokens": 5}));
    let resp = post(&sim, CHAT, &body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "x-sim-body-sha256"), sha_hex(&body));
    assert_eq!(header(&resp, "x-sim-worker"), "w1");
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "m-test");
    assert!(v["id"].as_str().is_some_and(|id| id.starts_with("chatcmpl-")));
    assert!(v["created"].is_u64());
    let choice = &v["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    let content = choice["message"]["content"].as_str().expect("content");
    assert_eq!(content.split_whitespace().count(), 5);
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(v["usage"]["prompt_tokens"], 20);
    assert_eq!(v["usage"]["completion_tokens"], 5);
    assert_eq!(v["usage"]["total_tokens"], 25);
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

    // Without max_tokens the simulated model stops by itself after the default length.
    let v: Value = post(&sim, CHAT, &chat_body("hi", json!({}))).await.json().await.expect("json");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["completion_tokens"], SimOptions::default().default_output_tokens);
    sim.shutdown().await;
}

#[tokio::test]
async fn stream_chat_frames_tokens_and_usage_only_when_asked() {
    let sim = start(fast()).await;
    for include_usage in [false, true] {
        let extra = json!({"max_tokens": 4, "stream": true, "stream_options": {"include_usage": include_usage}});
        let body = chat_body(&words(20, "s"), extra);
        let resp = post(&sim, CHAT, &body).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(header(&resp, "x-sim-body-sha256"), sha_hex(&body));
        assert!(header(&resp, "content-type").starts_with("text/event-stream"));
        let text = resp.text().await.expect("body");
        let events = sse_events(&text);
        assert_eq!(events.last(), Some(&"[DONE]"));
        let chunks: Vec<Value> =
            events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).expect("chunk is JSON")).collect();
        assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk" && c["model"] == "m-test"));
        let content: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
        assert_eq!(content.split_whitespace().count(), 4);
        let finishes: Vec<&Value> =
            chunks.iter().map(|c| &c["choices"][0]["finish_reason"]).filter(|f| !f.is_null()).collect();
        assert_eq!(finishes, vec![&json!("length")]);
        let usage: Vec<&Value> = chunks.iter().filter(|c| c.get("usage").is_some()).collect();
        if include_usage {
            assert_eq!(usage.len(), 1);
            let last = chunks.last().expect("chunks");
            assert_eq!(last["choices"], json!([]), "usage chunk has no choices");
            assert_eq!(last["usage"]["prompt_tokens"], 20);
            assert_eq!(last["usage"]["completion_tokens"], 4);
            assert!(last["usage"]["prompt_tokens_details"]["cached_tokens"].is_u64());
        } else {
            assert!(usage.is_empty());
        }
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn completions_endpoint_stream_and_not() {
    let sim = start(fast()).await;
    let body = serde_json::to_vec(&json!({"model": "m", "prompt": "a b c", "max_tokens": 3})).expect("ser");
    let v: Value = post(&sim, "/v1/completions", &body).await.json().await.expect("json");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"].as_str().expect("text").split_whitespace().count(), 3);
    assert_eq!(v["usage"]["prompt_tokens"], 3);

    let body = serde_json::to_vec(&json!({"prompt": "a b c", "max_tokens": 3, "stream": true})).expect("ser");
    let text = post(&sim, "/v1/completions", &body).await.text().await.expect("body");
    let events = sse_events(&text);
    assert_eq!(events.len(), 4, "three tokens then [DONE]: {events:?}");
    let first: Value = serde_json::from_str(events[0]).expect("json");
    assert_eq!(first["object"], "text_completion");
    assert_eq!(first["model"], SimOptions::default().model, "no model in the request: served name");
    sim.shutdown().await;
}

#[tokio::test]
async fn errors_are_openai_shaped_and_hashed() {
    let sim = start(fast()).await;
    let bad = b"{not json".to_vec();
    let resp = post(&sim, CHAT, &bad).await;
    assert_eq!(resp.status(), 400);
    assert_eq!(header(&resp, "x-sim-body-sha256"), sha_hex(&bad));
    // What vLLM refuses, the sim refuses in vLLM's `ErrorResponse` shape.
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["error"]["code"], 400);
    assert_eq!(v["error"]["type"], "BadRequestError");
    assert_eq!(v["error"]["param"], Value::Null);
    assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));

    let no_messages = br#"{"model":"m"}"#.to_vec();
    let resp = post(&sim, CHAT, &no_messages).await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.expect("json");
    assert_eq!((&v["error"]["type"], &v["error"]["param"]), (&json!("BadRequestError"), &json!("messages")));

    // A prompt the simulated engine cannot build keeps the sim's own label (tests read it).
    let no_prompt = br#"{"model":"m"}"#.to_vec();
    let v: Value = post(&sim, "/v1/completions", &no_prompt).await.json().await.expect("json");
    assert_eq!(v["error"]["code"], "prompt_failed");

    let body = b"anything at all".to_vec();
    let resp = post(&sim, "/v1/nope", &body).await;
    assert_eq!(resp.status(), 404);
    assert_eq!(header(&resp, "x-sim-body-sha256"), sha_hex(&body));
    assert_eq!(header(&resp, "x-sim-worker"), "w1");
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["error"]["code"], "not_found");

    let resp = client().get(format!("{}/health", sim.url())).send().await.expect("health");
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "x-sim-body-sha256"), sha_hex(b""));
    sim.shutdown().await;
}

#[tokio::test]
async fn body_over_the_limit_is_413_with_the_full_hash() {
    let sim = start(SimOptions { max_body_bytes: 64, ..fast() }).await;
    let body = chat_body(&words(50, "x"), json!({}));
    assert!(body.len() > 64);
    let resp = post(&sim, CHAT, &body).await;
    assert_eq!(resp.status(), 413);
    assert_eq!(header(&resp, "x-sim-body-sha256"), sha_hex(&body));
    sim.shutdown().await;
}

#[tokio::test]
async fn models_lists_the_served_name() {
    let sim = start(SimOptions { model: "org/served".into(), ..fast() }).await;
    let v: Value =
        client().get(format!("{}/v1/models", sim.url())).send().await.expect("models").json().await.expect("json");
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "org/served");
    sim.shutdown().await;
}

#[tokio::test]
async fn repeated_prompt_hits_full_blocks_and_shared_prefix_hits_partially() {
    let sim = start(fast()).await;
    let a = chat_body(&words(50, "p"), json!({"max_tokens": 1}));
    assert_eq!(usage_of(&sim, &a).await["prompt_tokens_details"]["cached_tokens"], 0);
    let again = usage_of(&sim, &a).await["prompt_tokens_details"]["cached_tokens"].as_u64();
    let expected = expected_cached(&a, &a);
    assert_eq!(expected, 48, "50 tokens = 3 full blocks, all hit (48 ≤ 49)");
    assert_eq!(again, Some(expected));

    // Same first 20 words, then different: only the first block is shared.
    let b = chat_body(&format!("{} {}", words(20, "p"), words(30, "q")), json!({"max_tokens": 1}));
    let partial = usage_of(&sim, &b).await["prompt_tokens_details"]["cached_tokens"].as_u64();
    assert_eq!(expected_cached(&b, &a), 16);
    assert_eq!(partial, Some(16));

    // Exactly 2 full blocks: the last block is recomputed, as vLLM must compute the last token.
    let c = chat_body(&words(32, "r"), json!({"max_tokens": 1}));
    usage_of(&sim, &c).await;
    let c_again = usage_of(&sim, &c).await["prompt_tokens_details"]["cached_tokens"].as_u64();
    assert_eq!(c_again, Some(16));

    let stats = sim.stats();
    assert_eq!(stats.requests, 5);
    assert_eq!(stats.prompt_tokens, 50 + 50 + 50 + 32 + 32);
    assert_eq!(stats.cached_tokens, 48 + 16 + 16);
    sim.shutdown().await;
}

#[tokio::test]
async fn capacity_pressure_evicts_least_recently_used() {
    // Room for 4 blocks of 16: each prompt below needs 2.
    let sim = start(SimOptions { kv_blocks: 4, ..fast() }).await;
    let prompt = |tag: &str| chat_body(&words(40, tag), json!({"max_tokens": 1}));
    let cached = |u: Value| u["prompt_tokens_details"]["cached_tokens"].as_u64();
    let (a, b, c) = (prompt("a"), prompt("b"), prompt("c"));
    usage_of(&sim, &a).await;
    usage_of(&sim, &b).await;
    assert_eq!(cached(usage_of(&sim, &a).await), Some(32), "a still cached, and now the most recent");
    usage_of(&sim, &c).await; // evicts b, the least recently used
    assert_eq!(cached(usage_of(&sim, &b).await), Some(0), "b was evicted");
    // b's re-insertion evicted a (c was used after a's last touch).
    assert_eq!(cached(usage_of(&sim, &c).await), Some(32));
    sim.shutdown().await;
}

#[tokio::test]
async fn metrics_use_vllm_names_and_count_tokens() {
    let sim = start(fast()).await;
    let a = chat_body(&words(40, "m"), json!({"max_tokens": 3}));
    usage_of(&sim, &a).await;
    usage_of(&sim, &a).await;
    let text = metrics_text(&sim).await;
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "sim_requests_cancelled_total",
    ] {
        assert!(text.contains(&format!("# TYPE {name} ")), "{name} typed");
        assert!(text.contains(&format!("# HELP {name} ")), "{name} described");
    }
    let all = samples(&text);
    assert!(all.iter().all(|(_, labels, _)| labels.contains(&format!("model_name=\"{}\"", sim::DEFAULT_MODEL))));
    assert_eq!(sample(&text, "vllm:prefix_cache_queries_total"), 80.0);
    assert_eq!(sample(&text, "vllm:prefix_cache_hits_total"), 32.0);
    assert_eq!(sample(&text, "vllm:prompt_tokens_total"), 80.0);
    assert_eq!(sample(&text, "vllm:generation_tokens_total"), 6.0);
    assert_eq!(sample(&text, "vllm:num_requests_running"), 0.0);
    assert_eq!(sample(&text, "vllm:kv_cache_usage_perc"), 0.0, "nothing pinned when idle");
    sim.shutdown().await;
}

#[tokio::test]
async fn requests_beyond_max_running_wait_and_pin_kv() {
    let sim = start(SimOptions { max_running: 1, decode_ms_per_token: 20, kv_blocks: 100, ..fast() }).await;
    let body = chat_body(&words(40, "k"), json!({"max_tokens": 500, "stream": true}));
    let mut first = post(&sim, CHAT, &body).await;
    first.chunk().await.expect("first chunk").expect("some bytes");
    let _second = post(&sim, CHAT, &body).await; // headers come at once; it queues inside the stream
    let mut text = String::new();
    let ok = eventually(async || {
        text = metrics_text(&sim).await;
        sample(&text, "vllm:num_requests_waiting") == 1.0
    })
    .await;
    assert!(ok, "second request never waited:\n{text}");
    assert_eq!(sample(&text, "vllm:num_requests_running"), 1.0);
    assert_eq!(sample(&text, "vllm:kv_cache_usage_perc"), 0.02, "2 of 100 blocks pinned");
    assert_eq!(sim.stats().in_flight, 2);
    drop((first, _second));
    sim.shutdown().await;
}

#[test]
fn ttft_grows_with_uncached_tokens() {
    let opts = SimOptions { ttft_base_ms: 10, prefill_us_per_token: 50, ..SimOptions::default() };
    assert_eq!(sim::ttft(0, &opts), Duration::from_millis(10));
    assert_eq!(sim::ttft(200, &opts), Duration::from_millis(20));
    assert!(sim::ttft(1000, &opts) > sim::ttft(999, &opts));
}

#[tokio::test]
async fn error_rate_one_answers_500() {
    let sim = start(SimOptions { error_rate: 1.0, ..fast() }).await;
    let body = chat_body("hello", json!({}));
    let resp = post(&sim, CHAT, &body).await;
    assert_eq!(resp.status(), 500);
    assert_eq!(header(&resp, "x-sim-body-sha256"), sha_hex(&body));
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["error"]["code"], "injected_error");
    assert_eq!(v["error"]["type"], "server_error");
    assert_eq!(sim.stats().errors_injected, 1);
    sim.shutdown().await;
}

#[tokio::test]
async fn error_status_429_carries_retry_after() {
    let sim = start(SimOptions { error_rate: 1.0, error_status: 429, error_retry_after_secs: Some(7), ..fast() }).await;
    let resp = post(&sim, CHAT, &chat_body("hello", json!({}))).await;
    assert_eq!(resp.status(), 429);
    assert_eq!(header(&resp, "retry-after"), "7");
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["error"]["code"], "rate_limited");
    let bad = SimOptions { error_status: 404, ..fast() };
    assert_eq!(bad.validate().map_err(|e| e.label()), Err("invalid_option"));
    sim.shutdown().await;
}

#[tokio::test]
async fn error_rate_changes_while_running() {
    let sim = start(SimOptions { error_rate: 1.0, ..fast() }).await;
    let body = chat_body("hello", json!({"max_tokens": 2}));
    assert_eq!(post(&sim, CHAT, &body).await.status(), 500);
    sim.set_error_rate(0.0);
    assert_eq!(post(&sim, CHAT, &body).await.status(), 200);
    sim.set_error_rate(1.0);
    assert_eq!(post(&sim, CHAT, &body).await.status(), 500);
    sim.shutdown().await;
}

#[tokio::test]
async fn stall_after_tokens_keeps_the_stream_open_and_silent() {
    let sim = start(SimOptions { stall_after_tokens: Some(2), ..fast() }).await;
    let body = chat_body("hello there", json!({"max_tokens": 10, "stream": true}));
    let mut resp = post(&sim, CHAT, &body).await;
    assert_eq!(resp.status(), 200);
    let mut received = Vec::new();
    // Role chunk and two tokens arrive; then nothing more (the read below never completes).
    while received.iter().filter(|&&b| b == b'\n').count() < 6 {
        received.extend_from_slice(&resp.chunk().await.expect("chunk").expect("bytes"));
    }
    let more = tokio::time::timeout(Duration::from_millis(300), resp.chunk()).await;
    assert!(more.is_err(), "the stream must stall, got {more:?}");
    assert_eq!(sim.stats().generation_tokens, 2);
    drop(resp);
    assert!(eventually(async || sim.stats().cancelled == 1).await, "{:?}", sim.stats());
    sim.shutdown().await;
}

#[tokio::test]
async fn drop_mid_stream_truncates_the_stream() {
    let sim = start(SimOptions { drop_mid_stream_rate: 1.0, decode_ms_per_token: 1, ..fast() }).await;
    let body = chat_body("hello there", json!({"max_tokens": 10, "stream": true}));
    let mut resp = post(&sim, CHAT, &body).await;
    assert_eq!(resp.status(), 200);
    let mut received = Vec::new();
    let mut failed = false;
    loop {
        match resp.chunk().await {
            Ok(Some(bytes)) => received.extend_from_slice(&bytes),
            Ok(None) => break,
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&received);
    assert!(failed, "the body must end in an error, not a clean end: {text}");
    assert!(!text.contains("[DONE]"));
    assert!(eventually(async || sim.stats().streams_dropped == 1).await);
    assert_eq!(sim.stats().cancelled, 0, "a dropped stream is the worker's doing");
    sim.shutdown().await;
}

#[tokio::test]
async fn usage_drift_skews_prompt_tokens() {
    for drift in [3_i64, -2] {
        let sim = start(SimOptions { usage_drift: drift, ..fast() }).await;
        let body = chat_body(&words(10, "d"), json!({"max_tokens": 2}));
        let usage = usage_of(&sim, &body).await;
        assert_eq!(usage["prompt_tokens"].as_i64(), Some(10 + drift));
        assert_eq!(usage["total_tokens"].as_i64(), Some(12 + drift));
        sim.shutdown().await;
    }
}

#[tokio::test]
async fn client_disconnect_mid_stream_cancels_the_generation() {
    let sim = start(SimOptions { decode_ms_per_token: 20, ..fast() }).await;
    let body = chat_body("tell me a long story", json!({"max_tokens": 1000, "stream": true}));
    let mut resp = post(&sim, CHAT, &body).await;
    resp.chunk().await.expect("first chunk").expect("bytes");
    assert_eq!(sim.stats().in_flight, 1);
    drop(resp);
    assert!(eventually(async || sim.stats().cancelled == 1).await, "{:?}", sim.stats());
    assert!(eventually(async || sim.stats().in_flight == 0).await);
    let text = metrics_text(&sim).await;
    assert_eq!(sample(&text, "sim_requests_cancelled_total"), 1.0);
    assert_eq!(sample(&text, "vllm:num_requests_running"), 0.0);
    assert!(sim.stats().generation_tokens < 1000);
    sim.shutdown().await;
}

#[tokio::test]
async fn shutdown_stops_listening_and_cuts_open_streams() {
    let sim = start(SimOptions { decode_ms_per_token: 50, ..fast() }).await;
    let url = sim.url();
    let body = chat_body("x", json!({"max_tokens": 10000, "stream": true}));
    let mut resp = post(&sim, CHAT, &body).await;
    resp.chunk().await.expect("first chunk");
    sim.shutdown().await; // bounded although the stream would run for minutes
    let mut rest = Vec::new();
    let drained = tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(Some(bytes)) = resp.chunk().await {
            rest.extend_from_slice(&bytes);
        }
    })
    .await;
    assert!(drained.is_ok(), "the open stream was cut");
    assert!(!String::from_utf8_lossy(&rest).contains("[DONE]"));
    assert!(client().get(format!("{url}/health")).send().await.is_err(), "no longer listening");
}

/// A GIF data URL whose header claims `width`×`height` (all the exact prompter reads of it).
fn gif_data_url(width: u16, height: u16) -> String {
    use base64::Engine as _;
    let mut gif = b"GIF89a".to_vec();
    gif.extend_from_slice(&width.to_le_bytes());
    gif.extend_from_slice(&height.to_le_bytes());
    gif.extend_from_slice(&[0, 0, 0, 0x3b]);
    format!("data:image/gif;base64,{}", base64::engine::general_purpose::STANDARD.encode(gif))
}

fn image_chat(url: &str) -> Vec<u8> {
    let content = json!([{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "what is it?"}]);
    serde_json::to_vec(&json!({"model": "m", "messages": [{"role": "user", "content": content}]})).expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_sim_answers_400_where_the_engine_rejects_an_image() {
    let sim = sim::spawn_exact(fast()).await.expect("sim starts");
    // Qwen's processor raises above an aspect ratio of 200, and a header with a zero side is no image
    // the engine can open: vLLM answers 400.
    for (w, h, reason) in [(5000, 20, "aspect_ratio"), (20, 5000, "aspect_ratio"), (0, 30, "probe_failed")] {
        let resp = post(&sim, CHAT, &image_chat(&gif_data_url(w, h))).await;
        assert_eq!(resp.status(), 400, "{w}x{h}");
        let v: Value = resp.json().await.expect("json");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(reason), "{w}x{h}: {v}");
    }
    assert_eq!(sim.stats().prompt_tokens, 0, "nothing admitted to the cache");
    // An image the processor accepts is served, its tokens counted.
    let resp = post(&sim, CHAT, &image_chat(&gif_data_url(640, 480))).await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.expect("json");
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap_or(0) > 256, "{v}");
}
