//! The Responses API and the tokenizer endpoints, as vLLM 0.32 answers them.

use super::*;

const RESPONSES: &str = "/v1/responses";

fn stored() -> SimOptions {
    SimOptions { responses_store: true, ..fast() }
}

fn body(v: Value) -> Vec<u8> {
    serde_json::to_vec(&v).expect("json")
}

async fn answer(sim: &SimHandle, v: Value) -> Value {
    let resp = post(sim, RESPONSES, &body(v)).await;
    assert_eq!(resp.status(), 200);
    resp.json().await.expect("json")
}

async fn get(sim: &SimHandle, path: &str) -> reqwest::Response {
    client().get(format!("{}{path}", sim.url())).send().await.expect("request sent")
}

/// `prefix_` and 16 lowercase hex digits (vLLM's `random_uuid()`).
fn is_id(id: &Value, prefix: &str) -> bool {
    let hex = id.as_str().and_then(|id| id.strip_prefix(prefix)).and_then(|id| id.strip_prefix('_'));
    hex.is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

fn output_text(response: &Value) -> &str {
    response["output"][0]["content"][0]["text"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn an_answer_has_vllms_shape_and_the_plans_input_tokens() {
    let sim = start(stored()).await;
    let text = words(40, "q");
    let r = answer(&sim, json!({"model": DEFAULT, "input": text, "instructions": "be brief", "metadata": {"k": "v"}}))
        .await;
    assert!(is_id(&r["id"], "resp"), "{r}");
    assert_eq!(
        (r["object"].as_str(), r["status"].as_str(), r["model"].as_str()),
        (Some("response"), Some("completed"), Some(DEFAULT))
    );
    assert!(r["created_at"].as_u64().is_some_and(|t| t > 1_700_000_000));
    let item = &r["output"][0];
    assert!(is_id(&item["id"], "msg"), "{item}");
    assert_eq!(
        (item["type"].as_str(), item["role"].as_str(), item["status"].as_str()),
        (Some("message"), Some("assistant"), Some("completed"))
    );
    assert_eq!(item["content"][0]["type"], "output_text");
    assert_eq!(item["content"][0]["annotations"], json!([]));
    assert_eq!(output_text(&r), "The quick brown fox jumps over the lazy dog and keeps running The quick brown fox");
    assert_eq!(
        (r["instructions"].as_str(), &r["metadata"], r["tool_choice"].as_str()),
        (Some("be brief"), &json!({"k": "v"}), Some("none"))
    );
    assert_eq!(
        (r["temperature"].as_f64(), r["top_p"].as_f64(), r["truncation"].as_str()),
        (Some(1.0), Some(1.0), Some("disabled"))
    );
    // The prompt is the chat vLLM builds: the instructions as a system message, the input as the user's.
    let chat = chat_body_of(json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]));
    let usage = &r["usage"];
    assert_eq!(usage["input_tokens"].as_u64(), Some(u64::from(word_prompt(&chat).prompt_tokens)));
    assert_eq!(
        usage["input_tokens_details"],
        json!({"cached_tokens": 0, "cache_write_tokens": 0, "input_tokens_per_turn": [], "cached_tokens_per_turn": []})
    );
    assert_eq!(
        (usage["output_tokens"].as_u64(), usage["output_tokens_details"]["reasoning_tokens"].as_u64()),
        (Some(16), Some(0))
    );
    assert_eq!(usage["total_tokens"].as_u64(), Some(usage["input_tokens"].as_u64().unwrap_or(0) + 16));
    // A token limit ends the answer early: `incomplete`, as vLLM reports a "length" finish.
    let short = answer(&sim, json!({"input": "hi", "max_output_tokens": 3})).await;
    assert_eq!((short["status"].as_str(), short["max_output_tokens"].as_u64()), (Some("incomplete"), Some(3)));
    assert_eq!(short["incomplete_details"], json!({"reason": "max_output_tokens"}));
    assert_eq!((short["usage"]["output_tokens"].as_u64(), short["model"].as_str()), (Some(3), Some(DEFAULT)));
}

fn chat_body_of(messages: Value) -> Vec<u8> {
    body(json!({"messages": messages}))
}

#[tokio::test]
async fn a_follow_up_by_previous_response_id_hits_the_first_turns_blocks() {
    let sim = start(stored()).await;
    let (q1, q2) = (words(70, "a"), words(9, "b"));
    let first = answer(&sim, json!({"input": q1})).await;
    let next = answer(&sim, json!({"input": q2, "previous_response_id": first["id"]})).await;
    assert_eq!(next["previous_response_id"], first["id"]);
    // vLLM's history: the stored messages, the output, the new input.
    let turn1 = chat_body_of(json!([{"role": "user", "content": q1}]));
    let turn2 = chat_body_of(json!([
        {"role": "user", "content": q1}, {"role": "assistant", "content": output_text(&first)}, {"role": "user", "content": q2},
    ]));
    let usage = &next["usage"];
    assert_eq!(usage["input_tokens"].as_u64(), Some(u64::from(word_prompt(&turn2).prompt_tokens)));
    let cached = usage["input_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
    assert!(cached > 0, "{usage}");
    assert_eq!(cached, expected_cached(&turn2, &turn1));
    // Stored: retrievable as answered; a finished answer cannot be cancelled.
    let id = next["id"].as_str().unwrap_or_default();
    let resp = get(&sim, &format!("{RESPONSES}/{id}")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.json::<Value>().await.expect("json"), next);
    let resp = post(&sim, &format!("{RESPONSES}/{id}/cancel"), b"").await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.expect("json");
    let expected = json!({"message": "Cannot cancel a synchronous response.", "type": "invalid_request_error", "param": "response_id", "code": 400});
    assert_eq!(v["error"], expected);
    // `store: false` keeps nothing.
    let unstored = answer(&sim, json!({"input": "x", "store": false})).await;
    assert_eq!(get(&sim, &format!("{RESPONSES}/{}", unstored["id"].as_str().unwrap_or_default())).await.status(), 404);
}

fn not_found(id: &str) -> Value {
    json!({"error": {"message": format!("Response with id '{id}' not found."), "type": "invalid_request_error", "param": "response_id", "code": 404}})
}

#[tokio::test]
async fn unknown_ids_are_vllms_404_and_the_default_stores_nothing() {
    let sim = start(stored()).await;
    let resp =
        post(&sim, RESPONSES, &body(json!({"input": "x", "previous_response_id": "resp_0123456789abcdef"}))).await;
    assert_eq!(resp.status(), 404);
    assert_eq!(resp.json::<Value>().await.expect("json"), not_found("resp_0123456789abcdef"));
    assert_eq!(get(&sim, "/v1/responses/resp_nope").await.json::<Value>().await.expect("json"), not_found("resp_nope"));
    let resp = post(&sim, "/v1/responses/resp_nope/cancel", b"").await;
    assert_eq!((resp.status().as_u16(), resp.json::<Value>().await.expect("json")), (404, not_found("resp_nope")));
    // Without --responses-store (vLLM's default) `store` is ignored: the follow-up is 404.
    let plain = start(fast()).await;
    let first = answer(&plain, json!({"input": "x"})).await;
    let id = first["id"].as_str().unwrap_or_default();
    let resp = post(&plain, RESPONSES, &body(json!({"input": "y", "previous_response_id": id}))).await;
    assert_eq!((resp.status().as_u16(), resp.json::<Value>().await.expect("json")), (404, not_found(id)));
    // vLLM's other refusals.
    let resp = post(&plain, RESPONSES, &body(json!({"input": "x", "background": true}))).await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["error"]["param"], "background");
    let resp = post(&plain, RESPONSES, &body(json!({"input": "x", "model": "other"}))).await;
    assert_eq!(resp.status(), 404);
    let v: Value = resp.json().await.expect("json");
    let message = format!("The model `other` does not exist. Valid aliases: {DEFAULT}.");
    assert_eq!(v, json!({"error": {"message": message, "type": "NotFoundError", "param": "model", "code": 404}}));
    let resp = post(&plain, RESPONSES, &body(json!({"model": DEFAULT}))).await;
    assert_eq!(resp.status(), 400);
}

/// `(event, data)` of each SSE event, checking the framing.
fn events(text: &str) -> Vec<(String, Value)> {
    assert!(text.ends_with("\n\n"), "{text:?}");
    text.split_terminator("\n\n")
        .map(|e| {
            let (event, data) = e.split_once('\n').expect("two lines");
            let event = event.strip_prefix("event: ").expect("`event: …`");
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").expect("`data: …`")).expect("json");
            assert_eq!(data["type"], event, "the event names its data's type");
            (event.to_owned(), data)
        })
        .collect()
}

#[tokio::test]
async fn a_stream_is_vllms_event_sequence_and_its_answer_is_stored() {
    let sim = start(stored()).await;
    let first = answer(&sim, json!({"input": words(40, "s")})).await;
    let ask = json!({"input": "more", "stream": true, "max_output_tokens": 4, "previous_response_id": first["id"]});
    let resp = post(&sim, RESPONSES, &body(ask)).await;
    assert_eq!(resp.status(), 200);
    assert!(header(&resp, "content-type").starts_with("text/event-stream"));
    let events = events(&resp.text().await.expect("body"));
    let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    let delta = "response.output_text.delta";
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            delta,
            delta,
            delta,
            delta,
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let seqs: Vec<u64> = events.iter().filter_map(|(_, d)| d["sequence_number"].as_u64()).collect();
    assert_eq!(seqs, (0..12).collect::<Vec<u64>>());
    let opening = &events[0].1["response"];
    assert_eq!(
        (opening["status"].as_str(), &opening["usage"], &opening["output"]),
        (Some("in_progress"), &Value::Null, &json!([]))
    );
    let item_id = &events[2].1["item"]["id"];
    assert!(is_id(item_id, "msg"));
    let text: String = events.iter().filter(|(k, _)| k == delta).filter_map(|(_, d)| d["delta"].as_str()).collect();
    assert_eq!(text, "The quick brown fox");
    assert!(events[4..8].iter().all(|(_, d)| &d["item_id"] == item_id));
    assert_eq!(events[8].1["text"], text.as_str());
    let done = &events[11].1["response"];
    assert_eq!(
        (done["status"].as_str(), output_text(done), &done["output"][0]["id"]),
        (Some("incomplete"), text.as_str(), item_id)
    );
    assert_eq!(done["usage"]["output_tokens"], 4);
    assert!(done["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0) > 0, "{done}");
    let stored = get(&sim, &format!("{RESPONSES}/{}", done["id"].as_str().unwrap_or_default())).await;
    assert_eq!(stored.json::<Value>().await.expect("json"), *done);
}

const DEFAULT: &str = sim::DEFAULT_MODEL;

async fn tokenize(sim: &SimHandle, v: Value) -> Value {
    let resp = post(sim, "/tokenize", &body(v)).await;
    assert_eq!(resp.status(), 200);
    resp.json().await.expect("json")
}

/// Tokens a prefix cache of `bs`-token blocks holding `held` serves of `prompt` (whole blocks of
/// their common prefix, never the prompt's last token).
fn overlap(prompt: &[Value], held: &[Value], bs: usize) -> u64 {
    let common = prompt.iter().zip(held).take_while(|(a, b)| a == b).count();
    (common.min(prompt.len() - 1) / bs * bs) as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_answers_count_what_tokenize_counts_and_follow_ups_hit_the_overlap() {
    let sim = sim::spawn_exact(stored()).await.expect("sim starts");
    let q1 = "Describe the history of the printing press in Europe, from Gutenberg to the industrial age, in detail.";
    let first = answer(&sim, json!({"input": q1, "instructions": "You are terse."})).await;
    let messages1 = json!([{"role": "system", "content": "You are terse."}, {"role": "user", "content": q1}]);
    let t1 = tokenize(&sim, json!({"model": DEFAULT, "messages": messages1})).await;
    assert_eq!(first["usage"]["input_tokens"], t1["count"]);
    assert_eq!(t1["count"].as_u64(), t1["tokens"].as_array().map(|t| t.len() as u64));
    assert_eq!((t1["max_model_len"].as_u64(), &t1["token_strs"]), (Some(262_144), &Value::Null));
    // The chat plan counts the same tokens.
    let chat = post(&sim, CHAT, &body(json!({"messages": messages1}))).await.json::<Value>().await.expect("json");
    assert_eq!(chat["usage"]["prompt_tokens"], t1["count"]);
    let q2 = "And in Asia?";
    let next = answer(&sim, json!({"input": q2, "previous_response_id": first["id"]})).await;
    let messages2 = json!([
        {"role": "user", "content": q1}, {"role": "assistant", "content": output_text(&first)}, {"role": "user", "content": q2},
    ]);
    let t2 = tokenize(&sim, json!({"messages": messages2})).await;
    assert_eq!(next["usage"]["input_tokens"], t2["count"]);
    let (ids1, ids2) = (t1["tokens"].as_array().expect("ids"), t2["tokens"].as_array().expect("ids"));
    // The first turn's system message is gone, so the shared prefix is the template's opening only;
    // the chat answered above (same messages as turn 1) changes nothing: it holds the same blocks.
    let cached = next["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap_or(u64::MAX);
    assert_eq!(cached, overlap(ids2, ids1, BS));
    // Without instructions the follow-up shares the whole first prompt.
    let third = answer(&sim, json!({"input": q2, "previous_response_id": next["id"]})).await;
    let messages3 = json!([
        {"role": "user", "content": q1}, {"role": "assistant", "content": output_text(&first)}, {"role": "user", "content": q2},
        {"role": "assistant", "content": output_text(&next)}, {"role": "user", "content": q2},
    ]);
    let t3 = tokenize(&sim, json!({"messages": messages3})).await;
    assert_eq!(third["usage"]["input_tokens"], t3["count"]);
    let cached = third["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
    assert!(cached > 0);
    assert_eq!(cached, overlap(t3["tokens"].as_array().expect("ids"), ids2, BS));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_and_detokenize_as_vllm() {
    let sim = sim::spawn_exact(fast()).await.expect("sim starts");
    let t = tokenize(&sim, json!({"prompt": "Hello world, hello tokens!", "return_token_strs": true})).await;
    let ids = t["tokens"].clone();
    assert!(t["count"].as_u64().is_some_and(|n| n > 3), "{t}");
    let strs: Vec<&str> = t["token_strs"].as_array().expect("strs").iter().filter_map(Value::as_str).collect();
    assert_eq!(strs.first().copied(), Some("Hello"));
    assert!(strs.contains(&"Ġworld"), "{strs:?}");
    let resp = post(&sim, "/detokenize", &body(json!({"tokens": ids}))).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.json::<Value>().await.expect("json"), json!({"prompt": "Hello world, hello tokens!"}));
    // A chat ends with the generation prompt unless told otherwise.
    let messages = json!([{"role": "user", "content": "hi"}]);
    let with = tokenize(&sim, json!({"messages": messages})).await;
    let without = tokenize(&sim, json!({"messages": messages, "add_generation_prompt": false})).await;
    assert!(with["count"].as_u64() > without["count"].as_u64());
    // vLLM's refusals.
    let resp = post(&sim, "/tokenize", &body(json!({"model": "nope", "prompt": "x"}))).await;
    assert_eq!(resp.status(), 404);
    let v: Value = resp.json().await.expect("json");
    assert_eq!((v["error"]["type"].as_str(), v["error"]["param"].as_str()), (Some("NotFoundError"), Some("model")));
    let both = json!({"messages": messages, "add_generation_prompt": true, "continue_final_message": true});
    assert_eq!(post(&sim, "/tokenize", &body(both)).await.status(), 400);
    assert_eq!(post(&sim, "/detokenize", &body(json!({"tokens": [-1]}))).await.status(), 400);
    // The word prompter knows no token ids: 501.
    let words = start(fast()).await;
    assert_eq!(post(&words, "/tokenize", &body(json!({"prompt": "x"}))).await.status(), 501);
}

fn fixtures() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

/// A golden body as vLLM's render server got it: each `asset:<file>` a data URL of that image.
fn inline_assets(v: &mut Value) {
    use base64::Engine as _;
    match v {
        Value::String(s) if s.starts_with("asset:") => {
            let file = &s["asset:".len()..];
            let bytes = std::fs::read(fixtures().join("images").join(file)).expect("fixture image");
            let mime = if file.ends_with(".jpg") {
                "image/jpeg".to_owned()
            } else {
                format!("image/{}", file.rsplit('.').next().unwrap_or("png"))
            };
            *s = format!("data:{mime};base64,{}", base64::engine::general_purpose::STANDARD.encode(bytes));
        }
        Value::Array(items) => items.iter_mut().for_each(inline_assets),
        Value::Object(map) => map.values_mut().for_each(inline_assets),
        _ => {}
    }
}

/// vLLM 0.32's own renders of Responses bodies (`tests/fixtures/responses/goldens.json`, from its
/// `/v1/responses/render`): the sim's answer counts exactly the tokens vLLM rendered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_tokens_equal_vllms_own_render_of_each_golden_body() {
    let goldens: Value =
        serde_json::from_slice(&std::fs::read(fixtures().join("responses/goldens.json")).expect("goldens"))
            .expect("json");
    let sim = sim::spawn_exact(fast()).await.expect("sim starts");
    let (mut failures, mut checked) = (Vec::new(), 0);
    let bodies = goldens["bodies"].as_array().expect("bodies");
    for (b, row) in bodies.iter().zip(goldens["renders"]["qwen3_vl"].as_array().expect("renders")) {
        if row["outcome"] != "ok" {
            continue;
        }
        let mut request = b["request"].clone();
        inline_assets(&mut request);
        request["model"] = json!(DEFAULT);
        let resp = post(&sim, RESPONSES, &body(request)).await;
        let status = resp.status();
        let v: Value = resp.json().await.expect("json");
        let want = row["ids"].as_array().map_or(0, Vec::len) as u64;
        checked += 1;
        if status != 200 || v["usage"]["input_tokens"].as_u64() != Some(want) {
            failures.push(format!(
                "{}: {status}, {} input tokens, vLLM rendered {want}",
                b["name"], v["usage"]["input_tokens"]
            ));
        }
    }
    assert_eq!(checked, 23);
    assert!(failures.is_empty(), "{failures:#?}");
}
