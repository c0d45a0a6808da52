//! The answer fields a client asks for — `n`, `logprobs`, `tools`/`tool_choice`, `response_format` —
//! answered in vLLM's shapes, whole and streamed, and vLLM's 400 `BadRequestError` for what vLLM refuses.

use super::*;

async fn whole(sim: &SimHandle, path: &str, body: &[u8]) -> Value {
    let resp = post(sim, path, body).await;
    assert_eq!(resp.status(), 200);
    resp.json().await.expect("json")
}

/// The chunks of a streamed answer, `[DONE]` checked and dropped.
async fn chunks(sim: &SimHandle, path: &str, body: &[u8]) -> Vec<Value> {
    let resp = post(sim, path, body).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.expect("body");
    let events = sse_events(&text);
    assert_eq!(events.last(), Some(&"[DONE]"));
    events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).expect("chunk is JSON")).collect()
}

/// The choice entries of `chunks` for choice `index` (every chunk holds one choice, as vLLM sends).
fn of_choice(chunks: &[Value], index: u64) -> Vec<&Value> {
    let choices = chunks.iter().filter_map(|c| c["choices"].as_array()).filter(|c| !c.is_empty());
    choices
        .map(|c| {
            assert_eq!(c.len(), 1, "one choice per chunk");
            &c[0]
        })
        .filter(|c| c["index"] == index)
        .collect()
}

fn finishes(choices: &[&Value]) -> Vec<Value> {
    choices.iter().map(|c| c["finish_reason"].clone()).filter(|f| !f.is_null()).collect()
}

#[tokio::test]
async fn n_answers_that_many_choices_and_usage_counts_them_all() {
    let sim = start(fast()).await;
    let body = chat_body(&words(20, "n"), json!({"n": 3, "max_tokens": 4}));
    let v = whole(&sim, CHAT, &body).await;
    let choices = v["choices"].as_array().expect("choices");
    assert_eq!(choices.iter().map(|c| c["index"].as_u64().expect("index")).collect::<Vec<_>>(), [0, 1, 2]);
    let texts: Vec<&str> = choices.iter().map(|c| c["message"]["content"].as_str().expect("content")).collect();
    assert!(texts.iter().all(|t| t.split_whitespace().count() == 4), "{texts:?}");
    assert_ne!(texts[0], texts[1], "choices differ");
    assert_eq!(v["usage"]["prompt_tokens"], 20, "the prompt is counted once");
    assert_eq!(v["usage"]["completion_tokens"], 12);
    assert_eq!(v["usage"]["total_tokens"], 32);

    let stream = chat_body(
        &words(20, "n"),
        json!({"n": 2, "max_tokens": 3, "stream": true, "stream_options": {"include_usage": true}}),
    );
    let chunks = chunks(&sim, CHAT, &stream).await;
    for index in 0..2 {
        let mine = of_choice(&chunks, index);
        assert_eq!(mine[0]["delta"], json!({"role": "assistant", "content": ""}), "opened with the role");
        let text: String = mine.iter().filter_map(|c| c["delta"]["content"].as_str()).collect();
        assert_eq!(text, texts[index as usize].split(' ').take(3).collect::<Vec<_>>().join(" "));
        assert_eq!(finishes(&mine), [json!("length")]);
    }
    let usage = &chunks.last().expect("usage chunk")["usage"];
    assert_eq!(usage["completion_tokens"], 6);
    assert_eq!(sim.stats().generation_tokens, 12 + 6);

    let completion = serde_json::to_vec(&json!({"prompt": "a b c", "max_tokens": 2, "n": 2})).expect("ser");
    let v = whole(&sim, "/v1/completions", &completion).await;
    assert_eq!(v["choices"][1]["index"], 1);
    assert_eq!(v["usage"]["completion_tokens"], 4);
    sim.shutdown().await;
}

/// A chat `logprobs.content` entry in vLLM's shape for `token`, with `k` alternatives led by itself.
fn assert_entry(e: &Value, k: usize) {
    let token = e["token"].as_str().expect("token");
    assert!(e["logprob"].as_f64().is_some_and(|lp| lp < 0.0), "{e}");
    assert_eq!(e["bytes"], json!(token.as_bytes()));
    let top = e["top_logprobs"].as_array().expect("top_logprobs");
    assert_eq!(top.len(), k, "{e}");
    if k > 0 {
        assert_eq!(top[0]["token"], token);
        assert_eq!(top[0]["logprob"], e["logprob"]);
    }
    for t in top {
        assert_eq!(t.as_object().map(|o| o.len()), Some(3), "{{token, logprob, bytes}}: {t}");
        assert_eq!(t["bytes"], json!(t["token"].as_str().expect("token").as_bytes()));
    }
}

#[tokio::test]
async fn logprobs_come_per_token_whole_and_streamed() {
    let sim = start(fast()).await;
    let body = chat_body("hello", json!({"max_tokens": 5, "logprobs": true, "top_logprobs": 3}));
    let v = whole(&sim, CHAT, &body).await;
    let choice = &v["choices"][0];
    let content = choice["logprobs"]["content"].as_array().expect("logprobs.content");
    assert_eq!(content.len(), 5);
    content.iter().for_each(|e| assert_entry(e, 3));
    let tokens: String = content.iter().map(|e| e["token"].as_str().expect("token")).collect();
    assert_eq!(tokens, choice["message"]["content"].as_str().expect("content"));

    let plain = whole(&sim, CHAT, &chat_body("hello", json!({"max_tokens": 2, "logprobs": true}))).await;
    plain["choices"][0]["logprobs"]["content"].as_array().expect("content").iter().for_each(|e| assert_entry(e, 0));
    let off = whole(&sim, CHAT, &chat_body("hello", json!({"max_tokens": 2}))).await;
    assert_eq!(off["choices"][0]["logprobs"], Value::Null);

    let stream = chat_body("hello", json!({"max_tokens": 4, "logprobs": true, "top_logprobs": 2, "stream": true}));
    let chunks = chunks(&sim, CHAT, &stream).await;
    let tokens: Vec<&Value> = of_choice(&chunks, 0).into_iter().filter(|c| c["delta"]["content"] != "").collect();
    assert_eq!(tokens.len(), 4);
    for c in tokens {
        let entries = c["logprobs"]["content"].as_array().expect("a streamed token's logprobs");
        assert_eq!(entries.len(), 1);
        assert_entry(&entries[0], 2);
        assert_eq!(entries[0]["token"], c["delta"]["content"]);
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn completions_logprobs_are_the_legacy_lists() {
    let sim = start(fast()).await;
    let body = serde_json::to_vec(&json!({"prompt": "a b c", "max_tokens": 3, "logprobs": 2})).expect("ser");
    let v = whole(&sim, "/v1/completions", &body).await;
    let lp = &v["choices"][0]["logprobs"];
    let tokens: Vec<&str> = lp["tokens"].as_array().expect("tokens").iter().filter_map(Value::as_str).collect();
    assert_eq!(tokens.concat(), v["choices"][0]["text"].as_str().expect("text"));
    assert_eq!(lp["token_logprobs"].as_array().map(Vec::len), Some(3));
    assert_eq!(lp["text_offset"], json!([0, tokens[0].len(), tokens[0].len() + tokens[1].len()]));
    let tops = lp["top_logprobs"].as_array().expect("top_logprobs");
    assert!(tops
        .iter()
        .zip(&tokens)
        .all(|(t, tok)| t.as_object().is_some_and(|o| o.len() == 2 && o.contains_key(*tok))));

    let stream =
        serde_json::to_vec(&json!({"prompt": "a", "max_tokens": 2, "logprobs": 1, "stream": true})).expect("ser");
    let chunks = chunks(&sim, "/v1/completions", &stream).await;
    for c in of_choice(&chunks, 0) {
        assert_eq!(c["logprobs"]["tokens"], json!([c["text"]]));
    }
    sim.shutdown().await;
}

const TOOLS: &str = r#"[
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"enum": ["c", "f"]},
                   "verbose": {"type": "boolean"}},
    "required": ["city", "days", "unit"]}}},
  {"type": "function", "function": {"name": "search_web", "parameters": {"type": "object",
    "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
]"#;

fn tools() -> Value {
    serde_json::from_str(TOOLS).expect("tools")
}

fn tool_chat(text: &str, extra: Value) -> Vec<u8> {
    let mut e = json!({"tools": tools()});
    e.as_object_mut().expect("object").extend(extra.as_object().expect("object").clone());
    chat_body(text, e)
}

/// The one tool call of a whole answer: its name and parsed arguments.
fn the_call(v: &Value) -> (String, Value) {
    let calls = v["choices"][0]["message"]["tool_calls"].as_array().expect("tool_calls");
    assert_eq!(calls.len(), 1);
    let call = &calls[0];
    assert!(call["id"].as_str().is_some_and(|id| id.starts_with("chatcmpl-tool-")), "{call}");
    assert_eq!(call["type"], "function");
    let args = call["function"]["arguments"].as_str().expect("arguments are a JSON string");
    (call["function"]["name"].as_str().expect("name").to_owned(), serde_json::from_str(args).expect("JSON"))
}

#[tokio::test]
async fn tools_are_called_by_the_documented_rule() {
    let sim = start(fast()).await;
    // "auto" (the default with tools): the tool the last user message names.
    let v = whole(&sim, CHAT, &tool_chat("please use get_weather for Paris", json!({}))).await;
    let (name, args) = the_call(&v);
    assert_eq!(name, "get_weather");
    assert!(args["city"].is_string() && args["days"].is_i64() && args["unit"] == "c", "{args}");
    assert_eq!(args.get("verbose"), None, "only the required properties");
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(v["choices"][0]["message"]["content"], Value::Null);

    // "auto" with no tool named: text, no tool_calls.
    let v = whole(&sim, CHAT, &tool_chat("hello there", json!({"max_tokens": 3}))).await;
    assert_eq!(v["choices"][0]["message"].get("tool_calls"), None);
    assert_eq!(v["choices"][0]["message"]["content"], "The quick brown");

    // "required": the named tool, else the first.
    let v = whole(&sim, CHAT, &tool_chat("hello", json!({"tool_choice": "required"}))).await;
    assert_eq!(the_call(&v).0, "get_weather");
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    let v = whole(&sim, CHAT, &tool_chat("try search_web", json!({"tool_choice": "required"}))).await;
    assert_eq!(the_call(&v), ("search_web".to_owned(), json!({"query": "sample query"})));

    // A named function: that one, finishing "stop" as vLLM does for named calls.
    let named = json!({"tool_choice": {"type": "function", "function": {"name": "search_web"}}});
    let v = whole(&sim, CHAT, &tool_chat("get_weather please", named)).await;
    assert_eq!(the_call(&v).0, "search_web");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["message"]["content"], "");

    // "none": text even when a tool is named.
    let v = whole(&sim, CHAT, &tool_chat("get_weather", json!({"tool_choice": "none", "max_tokens": 2}))).await;
    assert_eq!(v["choices"][0]["message"]["content"], "The quick");
    sim.shutdown().await;
}

#[tokio::test]
async fn a_streamed_tool_call_names_itself_then_streams_its_arguments() {
    let sim = start(fast()).await;
    let body = tool_chat("get_weather in Rome", json!({"stream": true, "n": 2}));
    let chunks = chunks(&sim, CHAT, &body).await;
    for index in 0..2 {
        let mine = of_choice(&chunks, index);
        let calls: Vec<&Value> = mine.iter().filter_map(|c| c["delta"]["tool_calls"].get(0)).collect();
        assert!(calls[0]["id"].as_str().is_some_and(|id| id.starts_with("chatcmpl-tool-")));
        assert_eq!((&calls[0]["type"], &calls[0]["function"]["name"]), (&json!("function"), &json!("get_weather")));
        assert!(calls[1..].iter().all(|c| c.get("id").is_none() && c["index"] == 0));
        let args: String = calls.iter().filter_map(|c| c["function"]["arguments"].as_str()).collect();
        let args: Value = serde_json::from_str(&args).expect("the streamed arguments are JSON");
        assert_eq!(args["unit"], "c");
        assert_eq!(finishes(&mine), [json!("tool_calls")]);
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn response_format_answers_json() {
    let sim = start(fast()).await;
    let v = whole(&sim, CHAT, &chat_body("hi", json!({"response_format": {"type": "json_object"}}))).await;
    let content = v["choices"][0]["message"]["content"].as_str().expect("content");
    assert!(serde_json::from_str::<Value>(content).expect("JSON").is_object(), "{content}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    let schema = json!({"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer", "minimum": 18}, "score": {"type": "number"},
        "member": {"type": "boolean"}, "tier": {"enum": ["gold", "silver"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {"zip": {"type": "string"}}, "required": ["zip"]}},
        "required": ["name", "age", "score", "member", "tier", "tags", "address"]});
    let format = json!({"type": "json_schema", "json_schema": {"name": "person", "schema": schema}});
    let v = whole(&sim, CHAT, &chat_body("hi", json!({"response_format": format}))).await;
    let person: Value = serde_json::from_str(v["choices"][0]["message"]["content"].as_str().expect("content"))
        .expect("content is JSON");
    assert!(person["name"].is_string() && person["score"].is_number() && person["member"].is_boolean(), "{person}");
    assert!(person["age"].as_i64().is_some_and(|a| a >= 18));
    assert_eq!((&person["tier"], &person["tags"][0].is_string()), (&json!("gold"), &true));
    assert!(person["address"]["zip"].is_string());
    assert_eq!(
        v["usage"]["completion_tokens"].as_u64(),
        Some(v["choices"][0]["message"]["content"].as_str().map_or(0, |c| c.chars().count().div_ceil(4)) as u64)
    );

    // Streamed, the pieces make the same JSON; a budget too small cuts it with "length".
    let stream = chat_body("hi", json!({"response_format": format, "stream": true}));
    let text: String = of_choice(&chunks(&sim, CHAT, &stream).await, 0)
        .iter()
        .filter_map(|c| c["delta"]["content"].as_str())
        .collect();
    assert_eq!(serde_json::from_str::<Value>(&text).expect("JSON"), person);
    let cut = whole(&sim, CHAT, &chat_body("hi", json!({"response_format": format, "max_tokens": 3}))).await;
    assert_eq!(cut["choices"][0]["finish_reason"], "length");
    assert_eq!(cut["usage"]["completion_tokens"], 3);
    sim.shutdown().await;
}

#[tokio::test]
async fn what_vllm_refuses_is_refused_in_vllms_shape() {
    let sim = start(fast()).await;
    let named = |name: &str| json!({"type": "function", "function": {"name": name}});
    let cases: Vec<(Value, &str)> = vec![
        (json!({"messages": []}), "messages"),
        (json!({"n": 0}), "n"),
        (json!({"n": -1}), "n"),
        (json!({"top_logprobs": 2}), "top_logprobs"),
        (json!({"logprobs": true, "top_logprobs": 21}), "top_logprobs"),
        (json!({"logprobs": true, "top_logprobs": -2}), "top_logprobs"),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (json!({"tool_choice": named("get_weather")}), "tool_choice"),
        (json!({"tools": []}), "tools"),
        (json!({"tools": tools(), "tool_choice": named("nope")}), "tool_choice"),
        (json!({"tools": tools(), "tool_choice": "sometimes"}), "tool_choice"),
        (json!({"response_format": {"type": "yaml"}}), "response_format.type"),
        (json!({"response_format": {"type": "json_schema"}}), "response_format"),
        (json!({"stream_options": {"include_usage": true}}), "stream_options"),
        (json!({"max_tokens": 0}), "max_tokens"),
    ];
    for (extra, param) in cases {
        let body = chat_body("hi", extra.clone());
        let resp = post(&sim, CHAT, &body).await;
        assert_eq!(resp.status(), 400, "{extra}");
        assert_eq!(header(&resp, "x-sim-body-sha256"), sha_hex(&body));
        let v: Value = resp.json().await.expect("json");
        let e = &v["error"];
        assert_eq!(e.as_object().map(|o| o.len()), Some(4), "{{message, type, param, code}}: {v}");
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert_eq!(
            (&e["type"], &e["param"], &e["code"]),
            (&json!("BadRequestError"), &json!(param), &json!(400)),
            "{extra}"
        );
    }
    let completion = serde_json::to_vec(&json!({"prompt": "a", "logprobs": 21})).expect("ser");
    let resp = post(&sim, "/v1/completions", &completion).await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["error"]["param"], "logprobs");
    assert_eq!(sim.stats().prompt_tokens, 0, "nothing refused reached the cache");
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exact_sim_refuses_an_empty_conversation() {
    let sim = sim::spawn_exact(fast()).await.expect("sim starts");
    let body = serde_json::to_vec(&json!({"model": "m", "messages": []})).expect("ser");
    let resp = post(&sim, CHAT, &body).await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.expect("json");
    assert_eq!((&v["error"]["type"], &v["error"]["param"]), (&json!("BadRequestError"), &json!("messages")));
    sim.shutdown().await;
}
