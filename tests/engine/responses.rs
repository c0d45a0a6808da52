//! The Responses API (`/v1/responses`) against two Qwen2.5-VL engines that store their responses
//! (`VLLM_ENABLE_RESPONSES_API_STORE=1`), behind the router.
//!
//! * A Responses request is planned as the engine renders it: the router's predicted prompt tokens
//!   (its `mmrouter_prompt_tokens_drift`, usage minus predicted, stays 0) are the engine's
//!   `usage.input_tokens`, and equal the plan of the same conversation sent as a chat (`/debug/route`
//!   plans chats); a repeat lands where the blocks are, with `cached_tokens` = the predicted overlap.
//! * A follow-up by `previous_response_id` (streamed or not) goes to the engine that stored the
//!   response, turn after turn, while that engine is the busier one and the policy would pick the
//!   other (which cannot answer it).
//! * The OpenAI SDK's `client.responses.create` works through the router (`responses_sdk.py`).

use serde_json::{json, Value};

use crate::client::*;
use crate::{corpus, engines, feeds_connected, opts, pool_toml, router, BLOCK};

const MODEL: &str = "qwen2.5-vl";

/// A Responses answer through the router (or from an engine).
struct Answer {
    response: Value,
    worker: Option<String>,
    pinned: Option<String>,
}

impl Answer {
    fn id(&self) -> String {
        self.response["id"].as_str().unwrap_or_else(|| panic!("no id: {}", self.response)).to_owned()
    }

    fn input_tokens(&self) -> u64 {
        self.response["usage"]["input_tokens"].as_u64().unwrap_or_else(|| panic!("no usage: {}", self.response))
    }

    fn cached_tokens(&self) -> u64 {
        self.response["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap()
    }
}

/// `POST {base}/v1/responses`; a streamed answer is read to its `response.completed` event.
async fn respond(base: &str, body: &Value) -> Answer {
    let resp = post(&format!("{base}/v1/responses"), &serde_json::to_vec(body).unwrap()).await;
    let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let (worker, pinned) = (header("x-mmrouter-worker"), header("x-mmrouter-pinned"));
    let status = resp.status();
    let text = resp.text().await.unwrap();
    assert!(status.is_success(), "{base}: {status} {text}");
    let response = if body["stream"] == true {
        let completed = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .find(|e| e["type"] == "response.completed");
        completed.unwrap_or_else(|| panic!("no response.completed in the stream:\n{text}"))["response"].clone()
    } else {
        serde_json::from_str(&text).unwrap()
    };
    Answer { response, worker, pinned }
}

/// `(name, Responses body, the same conversation as a chat body)`, each with a nonce of its own.
fn cases() -> Vec<(&'static str, Value, Vec<u8>)> {
    let (n1, n2, n3) = (corpus::nonce(), corpus::nonce(), corpus::nonce());
    let text = format!("Case {n1}: tell me about foxes and the long way they travel in winter.");
    let image = corpus::image("horse.png");
    let question = format!("Case {n2}: what is this animal doing?");
    let long: String = (0..60).map(|i| format!("item {i} of case {n3};")).collect::<Vec<_>>().join(" ");
    let msg = |m: Value| corpus::body(MODEL, m, &[]);
    vec![
        ("text", json!({ "model": MODEL, "input": text }), msg(json!([{ "role": "user", "content": text }]))),
        (
            "image",
            json!({ "model": MODEL, "input": [{ "role": "user", "content": [
                { "type": "input_text", "text": question },
                { "type": "input_image", "image_url": image }] }] }),
            msg(json!([{ "role": "user", "content": [
                { "type": "text", "text": question },
                { "type": "image_url", "image_url": { "url": image } }] }])),
        ),
        (
            "instructions_and_long_text",
            json!({ "model": MODEL, "instructions": "You are terse.", "input": long }),
            msg(json!([{ "role": "system", "content": "You are terse." }, { "role": "user", "content": long }])),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs vLLM: tests/engine/run.sh"]
async fn responses_are_planned_and_pinned_like_the_engines() {
    let store = |name| {
        let mut o = opts(name, MODEL);
        o.env = vec![("VLLM_ENABLE_RESPONSES_API_STORE".into(), "1".into())];
        o
    };
    let es = engines(vec![store("resp-a"), store("resp-b")]).await;
    let workers = [("resp-a", es[0].url(), es[0].events_endpoint()), ("resp-b", es[1].url(), es[1].events_endpoint())];
    let r = router(&pool_toml(MODEL, &workers, "")).await;
    feeds_connected(&r, &["resp-a", "resp-b"]).await;
    let url = |w: &str| if w == "resp-a" { es[0].url() } else { es[1].url() };

    planned_like_the_engine(&r).await;
    follow_ups_stay_with_their_response(&r, &url).await;
    the_sdk_creates_through_the_router(&r).await;
}

/// Predicted prompt tokens = `usage.input_tokens`; a repeat's cached tokens = the predicted overlap.
async fn planned_like_the_engine(r: &str) {
    for (name, mut body, chat_body) in cases() {
        body["max_output_tokens"] = 2.into();
        body["temperature"] = 0.into();
        let plan = debug(r, &chat_body).await;
        assert!(matches!(plan["route"].as_str(), Some("exact" | "no_media")), "{name}: {plan}");
        let (n, blocks) = (plan["prompt_tokens"].as_u64().unwrap(), plan["blocks"].as_u64().unwrap());
        let before = drift(&metrics(r).await);
        let first = respond(r, &body).await;
        assert_eq!(first.input_tokens(), n, "{name}: the chat's plan vs the engine's input_tokens");
        assert_eq!(
            drift_after(r, before.0 + 1.0).await,
            (before.0 + 1.0, before.1),
            "{name}: the router's own prediction"
        );
        let worker = first.worker.clone().expect("the router names the worker");
        let settled = until(r, &chat_body, &format!("{name}: events confirm the blocks"), |v| {
            let w = index_of(v, &worker);
            v["overlap_sources"][w]["pending"] == 0 && v["overlap_sources"][w]["events"].as_u64() == Some(blocks)
        })
        .await;
        let w = index_of(&settled, &worker);
        let expected = reusable(settled["overlap_blocks"][w].as_u64().unwrap() * BLOCK, n, BLOCK);
        assert_eq!(expected, (n - 1) / BLOCK * BLOCK, "{name}: the whole prompt but its last block");
        let again = respond(r, &body).await;
        assert_eq!(again.worker.as_deref(), Some(worker.as_str()), "{name}: the repeat goes where the blocks are");
        assert_eq!(again.cached_tokens(), expected, "{name}: predicted overlap vs the engine's cached tokens");
        eprintln!("responses {name}: {n} input tokens = predicted; repeat cached {expected} = predicted ({worker})");
    }
}

/// A conversation stored on one engine: its follow-ups (streamed and not) all go there, while four
/// long follow-ups keep that engine the busier one; the other engine refuses the id.
async fn follow_ups_stay_with_their_response(r: &str, url: &dyn Fn(&str) -> String) {
    let opening = json!({ "model": MODEL, "max_output_tokens": 4,
                          "input": format!("Case {}: let us talk about rivers.", corpus::nonce()) });
    let t1 = respond(r, &opening).await;
    let home = t1.worker.clone().unwrap();
    let other = if home == "resp-a" { "resp-b" } else { "resp-a" };
    let elsewhere =
        json!({ "model": MODEL, "max_output_tokens": 2, "input": "And then?", "previous_response_id": t1.id() });
    let refused = post(&format!("{}/v1/responses", url(other)), &serde_json::to_vec(&elsewhere).unwrap()).await;
    assert!(!refused.status().is_success(), "{other} answered a response it never stored");

    // Load on `home`: long follow-ups, pinned there.
    let load: Vec<_> = (0..4)
        .map(|i| {
            let (r, body) = (r.to_owned(), json!({ "model": MODEL, "max_output_tokens": 800, "ignore_eos": true,
                                                    "input": format!("Go on, at length ({i})."), "previous_response_id": t1.id() }));
            tokio::spawn(async move { respond(&r, &body).await.worker })
        })
        .collect();
    let probe = corpus::chats(MODEL).swap_remove(0).1;
    let busy = until(r, &probe, "home busier than the other engine", |v| {
        let local = |w: &str| {
            v["inflight"].as_array().unwrap().iter().find(|x| x["worker"] == w).unwrap()["local"]["requests"].as_u64()
        };
        local(&home) >= Some(3) && local(other) == Some(0)
    })
    .await;
    assert_eq!(busy["worker"], other, "the policy would pick the less loaded engine: {busy}");

    let mut previous = t1.id();
    for turn in 0..6 {
        let body = json!({ "model": MODEL, "max_output_tokens": 3, "stream": turn % 2 == 1,
                           "input": format!("Turn {turn}: and then?"), "previous_response_id": previous });
        let answer = respond(r, &body).await;
        assert_eq!(answer.worker.as_deref(), Some(home.as_str()), "turn {turn} (stream {})", turn % 2 == 1);
        assert!(answer.pinned.is_some(), "turn {turn}: x-mmrouter-pinned");
        assert_eq!(answer.response["previous_response_id"], previous, "turn {turn}");
        previous = answer.id();
    }
    let stored = http().get(format!("{r}/v1/responses/{previous}")).send().await.unwrap();
    assert!(stored.status().is_success(), "GET the last response through the router: {}", stored.status());
    assert_eq!(stored.json::<Value>().await.unwrap()["id"], previous.as_str());
    for l in load {
        assert_eq!(l.await.unwrap().as_deref(), Some(home.as_str()), "a long follow-up");
    }
    eprintln!("responses: 6 follow-ups (3 streamed) and 4 long ones all on {home}, which stored the response; {other} refuses it");
}

/// `client.responses.create` (plain, streamed, a follow-up) through the router with the OpenAI SDK.
async fn the_sdk_creates_through_the_router(r: &str) {
    let python = std::env::var("MMROUTER_VLLM_PYTHON").expect("MMROUTER_VLLM_PYTHON: run tests/engine/run.sh");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/engine/responses_sdk.py");
    let job = json!({ "base_url": format!("{r}/v1"), "model": MODEL,
                      "input": format!("Case {}: name three rivers.", corpus::nonce()) });
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python).arg(script).arg(job.to_string()).env("HF_HUB_OFFLINE", "1").output()
    })
    .await
    .unwrap()
    .unwrap();
    assert!(out.status.success(), "responses_sdk.py: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    for turn in ["first", "streamed", "follow_up"] {
        assert_eq!(v[turn]["object"], "response", "{turn}: {v}");
        assert!(v[turn]["id"].as_str().is_some_and(|id| id.starts_with("resp")), "{turn}: {v}");
        assert!(v[turn]["input_tokens"].as_u64() > Some(0), "{turn}: {v}");
    }
    assert_eq!(v["follow_up"]["worker"], v["first"]["worker"], "the SDK's follow-up: {v}");
    assert_eq!(v["follow_up"]["previous_response_id"], v["first"]["id"], "{v}");
    eprintln!("responses: the OpenAI SDK's responses.create (plain, streamed, follow-up) through the router: {v}");
}
