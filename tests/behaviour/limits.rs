//! Bounded work per request: prompt caps refuse oversized prompts before they are tokenized or
//! forwarded, and large prompts are planned off the async runtime so `/health` keeps answering.

use crate::harness::*;

/// A text of about `bytes` bytes of distinct words (no repeated piece a cache could serve).
fn text_of(bytes: usize) -> String {
    let mut s = String::with_capacity(bytes + 16);
    let mut i = 0u64;
    while s.len() < bytes {
        s.push_str(&format!("word{i} "));
        i += 1;
    }
    s
}

async fn assert_too_long(r: reqwest::Response, unit: &str) {
    assert_eq!(r.status(), 400);
    let err: serde_json::Value = r.json().await.unwrap();
    assert_eq!(err["error"]["code"], "prompt_too_long", "{err}");
    assert_eq!(err["error"]["type"], "invalid_request_error", "{err}");
    let message = err["error"]["message"].as_str().unwrap();
    assert!(message.contains(&format!("max_prompt_{unit}")), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_over_the_limits_are_refused_before_anything_is_forwarded() {
    let c = cluster_with(sims(1, fast).await, "[model]\nmax_prompt_bytes = 4000\nmax_prompt_tokens = 200").await;
    let chat = "/v1/chat/completions";
    // Over the byte cap: refused before tokenizing.
    assert_too_long(post_to(&c.url, chat, chat_body(&[], &text_of(5000), false)).await, "bytes").await;
    // Under the byte cap, over the token cap.
    assert_too_long(post_to(&c.url, chat, chat_body(&[], &text_of(2000), false)).await, "tokens").await;
    // Image tokens count: a short text with a 640x480 image is ~300 tokens for Qwen3-VL.
    let image = png_data_url(640, 480, 7);
    assert_too_long(post_to(&c.url, chat, chat_body(&[image], "what is this?", false)).await, "tokens").await;
    // Completions: the prompt string is capped the same way.
    let completion = serde_json::to_vec(&serde_json::json!({"model": "m", "prompt": text_of(5000)})).unwrap();
    assert_too_long(post_to(&c.url, "/v1/completions", completion).await, "bytes").await;
    assert_eq!(c.sims[0].stats().requests, 0, "a refused prompt was forwarded");

    let r = post_to(&c.url, chat, chat_body(&[], "hello there", false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(c.sims[0].stats().requests, 1);
    let m = metrics_text(&c.url).await;
    assert_eq!(metric(&m, mmrouter::observe::REJECTED_TOTAL, "reason=\"prompt_too_long\""), 4.0, "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ten_megabyte_prompt_is_refused_by_default() {
    let c = cluster_with(sims(1, fast).await, "").await;
    let r = post_to(&c.url, "/v1/chat/completions", chat_body(&[], &text_of(10 << 20), false)).await;
    assert_too_long(r, "bytes").await;
    assert_eq!(c.sims[0].stats().requests, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_while_large_prompts_are_planned() {
    // Prompts just under the default 4 MiB cap, token cap raised to admit them: with mmrouter-tokenize a
    // ~1.5 MB prompt is planned too quickly (a fraction of a second even in a debug build) for ten
    // `/health` round trips to fit in before it is forwarded. The simulated worker keeps its default
    // 1 Mi-token cap and answers these 400 `prompt_failed` once they are forwarded; that is fine here.
    let c = cluster_with(sims(1, fast).await, "[model]\nmax_prompt_tokens = 4000000").await;
    // Three prompts of ~4 MB, millions of tokens each: more than the runtime's two threads, so planning
    // them on the runtime would leave none for `/health`.
    // The bodies are built before any is sent: building one takes long enough in a debug build for the
    // first prompt to be planned and forwarded before the loop below starts (seen on CI).
    let bodies: Vec<_> = (0..3).map(|i| chat_body(&[], &format!("{i} {}", text_of(4_150_000)), false)).collect();
    let health = client();
    let big: Vec<_> = bodies
        .into_iter()
        .map(|body| {
            let url = c.url.clone();
            tokio::spawn(async move {
                let r = post_to(&url, "/v1/chat/completions", body).await;
                (r.status(), r.text().await.unwrap_or_default())
            })
        })
        .collect();
    // Until the proxy forwards the first of them (it has planned one), `/health` must keep answering.
    let mut answered = 0;
    // Five answers: planning on the runtime allows at most one (measured 15–36 with the blocking pool).
    let mut forwarded_meanwhile = 0;
    while answered < 5 {
        forwarded_meanwhile = c.sims[0].stats().requests;
        if forwarded_meanwhile > 0 {
            break;
        }
        let r = health.get(format!("{}/health", c.url)).send().await.unwrap();
        assert_eq!(r.status(), 200);
        answered += 1;
    }
    eprintln!("/health answered {answered} times before the first large prompt was forwarded");
    for b in big {
        let (status, text) = b.await.unwrap();
        // Routed and forwarded (the worker's own token cap refuses them), not refused by the router.
        assert_eq!(status, 400, "{text}");
        assert!(text.contains("model.max_prompt_tokens") && text.contains("prompt_failed"), "{text}");
    }
    assert_eq!(forwarded_meanwhile, 0, "/health answered only {answered} times before a large prompt was planned");
}
