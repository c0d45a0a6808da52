//! What a demo user sees through the proxy (issue 46 item 3): the simulated workers' answers to `n`,
//! `logprobs`, `tools` and `response_format` in vLLM's shapes, their refusals in vLLM's shape, and the
//! demo's own word on what it does that `serve` would not.

use serde_json::{json, Value};

use crate::harness::*;

async fn demo_like() -> Cluster {
    cluster_with(sims(2, fast).await, "").await
}

fn chat(extra: Value) -> Vec<u8> {
    let mut body = json!({
        "model": "Qwen/Qwen3-VL-8B-Instruct",
        "max_tokens": 3,
        "messages": [{"role": "user", "content": "Is it raining? Use get_weather."}],
    });
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    serde_json::to_vec(&body).unwrap()
}

async fn post(url: &str, body: Vec<u8>) -> (u16, String) {
    let r = client()
        .post(format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answer_fields_come_back_through_the_proxy() {
    let c = demo_like().await;
    let (status, text) = post(&c.url, chat(json!({"n": 2, "logprobs": true, "top_logprobs": 2}))).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["choices"].as_array().map(Vec::len), Some(2), "{v}");
    for choice in v["choices"].as_array().unwrap() {
        let content = choice["logprobs"]["content"].as_array().expect("logprobs.content");
        assert_eq!(content.len(), 3);
        assert_eq!(content[0]["top_logprobs"].as_array().map(Vec::len), Some(2));
    }
    assert_eq!(v["usage"]["completion_tokens"], 6);

    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let (status, text) = post(&c.url, chat(json!({"tools": tools, "max_tokens": 100}))).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    let call = &v["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"].is_string(), "{args}");

    let format = json!({"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object",
        "properties": {"rain": {"type": "boolean"}}, "required": ["rain"]}}});
    let (status, text) = post(&c.url, chat(json!({"response_format": format, "max_tokens": 100}))).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let content: Value = serde_json::from_str(v["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
    assert_eq!(content, json!({"rain": true}));

    // Streamed: both choices, each with its per-token logprobs.
    let (status, text) = post(&c.url, chat(json!({"n": 2, "logprobs": true, "stream": true}))).await;
    assert_eq!(status, 200, "{text}");
    let chunks: Vec<Value> = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    for index in 0..2 {
        let with_logprobs = chunks
            .iter()
            .filter(|c| c["choices"][0]["index"] == index && c["choices"][0]["logprobs"]["content"].is_array())
            .count();
        assert_eq!(with_logprobs, 3, "choice {index}: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_vllm_refuses_comes_back_in_vllms_shape() {
    let c = demo_like().await;
    for (extra, param) in [
        (json!({"messages": []}), "messages"),
        (json!({"n": 0}), "n"),
        (json!({"top_logprobs": 3}), "top_logprobs"),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (json!({"response_format": {"type": "xml"}}), "response_format.type"),
    ] {
        let (status, text) = post(&c.url, chat(extra.clone())).await;
        assert_eq!(status, 400, "{extra}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["type"], "BadRequestError", "{extra}: {v}");
        assert_eq!(v["error"]["param"], param, "{extra}: {v}");
        assert_eq!(v["error"]["code"], 400, "{extra}: {v}");
    }
}

#[test]
fn the_demo_names_what_it_relaxes() {
    let toml = "[media]\nallow_cidrs = [\"127.0.0.0/8\"]\n[[workers]]\nname = \"w\"\nurl = \"http://127.0.0.1:1\"\n";
    let cfg = mmrouter::config::Settings::parse(toml).unwrap();
    let lines = mmrouter::cli::demo::relaxations(&cfg.pools, &mmrouter_sim::SimOptions::default());
    let text = lines.join("\n");
    assert!(text.contains("127.0.0.0/8") && text.contains("image_url_blocked"), "{text}");
    assert!(text.contains("simulated") && text.contains("::1/128") && text.contains("data: URLs"), "{text}");
    assert!(!text.contains("http://127.0.0.1:"), "the README test reads the demo's address from the first such URL");
    let strict =
        mmrouter::config::Settings::parse("[[workers]]\nname = \"w\"\nurl = \"http://127.0.0.1:1\"\n").unwrap();
    let lines = mmrouter::cli::demo::relaxations(&strict.pools, &mmrouter_sim::SimOptions::default());
    assert!(!lines.join("\n").contains("image_url_blocked"), "nothing relaxed, nothing said: {lines:?}");
}
