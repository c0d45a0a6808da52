//! LoRA adapters as the engines serve them: learnt from each worker's `/v1/models` at its health
//! checks (no adapter in the config), requests for an adapter routed only to workers that list it and
//! keyed with its name, the router's own `/v1/models` and `models.retrieve`.

use serde_json::Value;

use crate::harness::*;

fn adapter_chat(model: &str, text: &str) -> Vec<u8> {
    let body = serde_json::json!({
        "model": model, "max_tokens": 4,
        "messages": [{"role": "user", "content": text}],
    });
    serde_json::to_vec(&body).unwrap()
}

/// Waits until the router's `/v1/models/{id}` knows `id` (learnt at a health round).
async fn until_listed(url: &str, id: &str) -> Value {
    for _ in 0..100 {
        let r = client().get(format!("{url}/v1/models/{id}")).send().await.unwrap();
        if r.status() == 200 {
            return r.json().await.unwrap();
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("{id} never listed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapter_requests_go_only_to_workers_that_serve_the_adapter() {
    let mut s = sims(1, |o| {
        fast(o);
        o.lora_modules = vec!["sql-lora".into()];
    })
    .await;
    s.extend(sims(2, fast).await);
    let serving = s[0].name().to_owned();
    let c = cluster_with(s, "[server]\nhealth_interval_ms = 100\n").await;
    let entry = until_listed(&c.url, "sql-lora").await;
    assert_eq!(entry["parent"], "Qwen/Qwen3-VL-8B-Instruct", "{entry}");
    assert_eq!(entry["workers"]["serving"], 1);
    for i in 0..6 {
        let r = post(&c.url, adapter_chat("sql-lora", &format!("Adapter question {i}"))).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-mmrouter-worker"), serving, "request {i}");
    }
    // The base model still spreads over every worker.
    let mut seen = std::collections::HashSet::new();
    for i in 0..12 {
        let r = post(&c.url, adapter_chat("Qwen/Qwen3-VL-8B-Instruct", &format!("Base question number {i}"))).await;
        seen.insert(header(&r, "x-mmrouter-worker").to_owned());
    }
    assert!(seen.len() > 1, "base requests are not confined: {seen:?}");
    // An adapter no worker lists: OpenAI's 404 for an unknown model.
    let r = client().get(format!("{}/v1/models/other-lora", c.url)).send().await.unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adapters_prompt_is_keyed_apart_from_the_base_models() {
    let s = sims(1, |o| {
        fast(o);
        o.lora_modules = vec!["sql-lora".into()];
    })
    .await;
    let c = cluster_with(s, "[server]\nhealth_interval_ms = 100\n").await;
    until_listed(&c.url, "sql-lora").await;
    let text = "A long shared question about the same words, repeated so that several blocks fill up. ".repeat(8);
    let base = debug_route(&c.url, "", &adapter_chat("Qwen/Qwen3-VL-8B-Instruct", &text), None).await;
    let lora = debug_route(&c.url, "", &adapter_chat("sql-lora", &text), None).await;
    assert_eq!(base["prompt_tokens"], lora["prompt_tokens"]);
    // Served once under the adapter: its resend is a hit, the base model's is not (the engine's
    // blocks differ by adapter, and so do the router's keys).
    assert_eq!(post(&c.url, adapter_chat("sql-lora", &text)).await.status(), 200);
    let again = debug_route(&c.url, "", &adapter_chat("sql-lora", &text), None).await;
    let other = debug_route(&c.url, "", &adapter_chat("Qwen/Qwen3-VL-8B-Instruct", &text), None).await;
    let blocks = |v: &Value| v["overlap_blocks"][0].as_u64().unwrap();
    assert!(blocks(&again) > 0, "{again}");
    assert_eq!(blocks(&other), 0, "{other}");
}
