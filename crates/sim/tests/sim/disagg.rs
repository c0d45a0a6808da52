//! Disaggregated serving's legs (`--role`) through real sockets: vLLM's NIXL prefill handoff and
//! decode pull, the E/PD encoder and its shared storage, SGLang's bootstrap between concurrent legs.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use mmrouter_sim::{self as sim, Role, SimHandle, SimOptions};
use serde_json::{json, Value};

use super::mm_cache::gif;
use super::{
    chat_body, client, expected_cached, fast, header, metrics_text, post, sample, samples, sse_events, start,
    word_prompt, words, CHAT,
};

fn role(role: Role) -> SimOptions {
    SimOptions { role, ..fast() }
}

/// What the router adds to a prefill leg (docs/disaggregated.md).
fn prefill_params() -> Value {
    json!({"kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
        "remote_block_ids": null, "remote_host": null, "remote_port": null}, "max_tokens": 1, "stream": false})
}

async fn json_of(sim: &SimHandle, body: &[u8]) -> Value {
    let resp = post(sim, CHAT, body).await;
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
    resp.json().await.expect("json")
}

/// `vllm:prompt_tokens_by_source_total{source=…}`.
fn by_source(text: &str, source: &str) -> f64 {
    let label = format!("source=\"{source}\"");
    let found =
        samples(text).into_iter().find(|(n, l, _)| n == "vllm:prompt_tokens_by_source_total" && l.contains(&label));
    found.map(|(_, _, v)| v).unwrap_or_else(|| panic!("{source} missing in\n{text}"))
}

async fn get_json(url: &str) -> (u16, Value) {
    let resp = client().get(url).send().await.expect("get");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_vllm_prefill_leg_answers_one_token_and_the_nixl_handoff() {
    let sim = start(role(Role::Prefill)).await;
    let body = chat_body(&words(40, "p"), prefill_params());
    let prompt_tokens = word_prompt(&body).prompt_tokens;
    let v = json_of(&sim, &body).await;
    assert_eq!(v["usage"]["completion_tokens"], 1);
    assert_eq!(v["usage"]["prompt_tokens"], prompt_tokens);
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let kv = &v["kv_transfer_params"];
    let mut keys: Vec<&str> = kv.as_object().expect("an object").keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "dcp_size",
            "do_remote_decode",
            "do_remote_prefill",
            "pp_size",
            "remote_block_ids",
            "remote_blocks_expiry_time",
            "remote_engine_id",
            "remote_host",
            "remote_num_tokens",
            "remote_port",
            "remote_prefill_cached_tokens",
            "remote_request_id",
            "tp_size",
            "transfer_mode"
        ]
    );
    assert_eq!((kv["do_remote_prefill"].as_bool(), kv["do_remote_decode"].as_bool()), (Some(true), Some(false)));
    assert_eq!((kv["remote_host"].as_str(), kv["transfer_mode"].as_str()), (Some("127.0.0.1"), Some("pull")));
    assert_eq!(kv["remote_request_id"], v["id"]);
    assert_eq!(kv["remote_num_tokens"], prompt_tokens);
    assert!(kv["remote_port"].is_u64() && kv["remote_blocks_expiry_time"].is_null());
    assert_eq!((kv["tp_size"].as_u64(), kv["dcp_size"].as_u64(), kv["pp_size"].as_u64()), (Some(1), Some(1), Some(1)));
    let groups = kv["remote_block_ids"].as_array().expect("groups");
    assert_eq!(groups.len(), 1, "one KV cache group");
    let blocks = groups[0].as_array().expect("ids").len();
    assert_eq!(blocks, (prompt_tokens as usize).div_ceil(16), "every prompt block, the partial one too");

    // Again: a prefix hit, reported in usage and in the handoff; the engine id stays.
    let again = json_of(&sim, &body).await;
    let cached = expected_cached(&body, &body);
    assert!(cached > 0);
    assert_eq!(again["usage"]["prompt_tokens_details"]["cached_tokens"], cached);
    assert_eq!(again["kv_transfer_params"]["remote_prefill_cached_tokens"], cached);
    assert_eq!(again["kv_transfer_params"]["remote_engine_id"], kv["remote_engine_id"]);
    let (_, role) = get_json(&format!("{}/sim/role", sim.url())).await;
    assert_eq!((role["role"].as_str(), &role["engine_id"]), (Some("prefill"), &kv["remote_engine_id"]));

    // Without `do_remote_decode` the prefill engine serves the request whole, as vLLM does.
    let whole = json_of(&sim, &chat_body(&words(40, "w"), json!({"max_tokens": 5}))).await;
    assert_eq!(whole["usage"]["completion_tokens"], 5);
    assert!(whole.get("kv_transfer_params").is_none());
    sim.shutdown().await;
}

/// A decode leg's body: the client's request plus a prefill's handoff.
fn decode_body(text: &str, extra: Value) -> Vec<u8> {
    let kv = json!({"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": [[0, 1, 2]],
        "remote_engine_id": "9d4e1a52-0000-4000-8000-000000000000", "remote_request_id": "chatcmpl-p-0",
        "remote_host": "127.0.0.1", "remote_port": 5600, "tp_size": 1, "remote_num_tokens": 40,
        "remote_blocks_expiry_time": null, "transfer_mode": "pull", "remote_prefill_cached_tokens": 0});
    let mut extra = extra;
    extra["kv_transfer_params"] = kv;
    chat_body(text, extra)
}

#[tokio::test]
async fn a_vllm_decode_leg_pulls_its_uncached_tokens_and_caches_them() {
    let sim = start(role(Role::Decode)).await;
    let text = words(60, "d");
    let body = decode_body(&text, json!({"max_tokens": 4}));
    let prompt_tokens = u64::from(word_prompt(&body).prompt_tokens);
    let v = json_of(&sim, &body).await;
    assert_eq!(v["usage"]["completion_tokens"], 4, "decodes as the client asked");
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "the pull is no local hit");
    assert!(v.get("kv_transfer_params").is_none());
    let m = metrics_text(&sim).await;
    assert_eq!(by_source(&m, "external_kv_transfer"), prompt_tokens as f64);
    assert_eq!((by_source(&m, "local_compute"), by_source(&m, "local_cache_hit")), (0.0, 0.0));
    assert_eq!(sample(&m, "sim_kv_transfers_total"), 1.0);
    assert_eq!(sim.stats().external_kv_tokens, prompt_tokens);

    // The pulled blocks joined the cache: the same request without the handoff hits them.
    let plain = chat_body(&text, json!({"max_tokens": 4}));
    let local = json_of(&sim, &plain).await;
    let hit = expected_cached(&plain, &body);
    assert!(hit > 0);
    assert_eq!(local["usage"]["prompt_tokens_details"]["cached_tokens"], hit);
    // A longer prompt on that prefix, streamed: only the tokens past the local hit are pulled.
    let longer_text = format!("{text} {}", words(30, "e"));
    let longer =
        decode_body(&longer_text, json!({"max_tokens": 3, "stream": true, "stream_options": {"include_usage": true}}));
    let resp = post(&sim, CHAT, &longer).await;
    assert_eq!(resp.status(), 200);
    let stream = resp.text().await.expect("stream");
    let events = sse_events(&stream);
    assert_eq!(events.last(), Some(&"[DONE]"));
    let usage: Value = serde_json::from_str(events[events.len() - 2]).expect("usage chunk");
    let longer_hit = expected_cached(&longer, &body);
    assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], longer_hit);
    let longer_tokens = u64::from(word_prompt(&longer).prompt_tokens);
    let m = metrics_text(&sim).await;
    assert_eq!(by_source(&m, "external_kv_transfer"), (prompt_tokens + longer_tokens - longer_hit) as f64);
    assert_eq!(by_source(&m, "local_cache_hit"), (hit + longer_hit) as f64);
    assert_eq!(by_source(&m, "local_compute"), (prompt_tokens - hit) as f64, "only the plain resend computed");
    assert_eq!(sample(&m, "sim_kv_transfers_total"), 2.0);
    sim.shutdown().await;
}

#[tokio::test]
async fn a_pull_costs_the_transfer_not_the_prefill() {
    let opts = SimOptions { prefill_us_per_token: 4000, transfer_us_per_token: 2, ..role(Role::Decode) };
    let sim = start(opts).await;
    let timed = async |body: &[u8]| {
        let started = Instant::now();
        json_of(&sim, body).await;
        started.elapsed()
    };
    // 100 words: about 400 ms to prefill, 0.2 ms to pull.
    let pulled = timed(&decode_body(&words(100, "t"), json!({"max_tokens": 1}))).await;
    let computed = timed(&chat_body(&words(100, "u"), json!({"max_tokens": 1}))).await;
    assert!(computed >= Duration::from_millis(390), "computed locally: {computed:?}");
    assert!(pulled < Duration::from_millis(200), "pulled: {pulled:?}");
    sim.shutdown().await;
}

#[tokio::test]
async fn a_malformed_handoff_is_refused_as_vllm_refuses_it() {
    let sim = start(role(Role::Decode)).await;
    let mut body: Value = serde_json::from_slice(&decode_body("hello there", json!({}))).expect("json");
    body["kv_transfer_params"]["remote_block_ids"] = json!("all of them");
    let resp = post(&sim, CHAT, &serde_json::to_vec(&body).expect("json")).await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.expect("json");
    assert_eq!(
        (v["error"]["type"].as_str(), v["error"]["param"].as_str()),
        (Some("BadRequestError"), Some("kv_transfer_params"))
    );
    assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("remote_block_ids")), "{v}");
    body["kv_transfer_params"] = json!("pull");
    let resp = post(&sim, CHAT, &serde_json::to_vec(&body).expect("json")).await;
    assert_eq!(resp.status(), 400);
    assert_eq!(sim.stats().kv_transfers, 0);
    sim.shutdown().await;
}

#[tokio::test]
async fn each_role_names_itself() {
    for r in [Role::Both, Role::Prefill, Role::Decode, Role::Encode] {
        let sim = start(role(r)).await;
        assert_eq!(sim.role(), r);
        let (status, v) = get_json(&format!("{}/sim/role", sim.url())).await;
        assert_eq!((status, v["role"].as_str()), (200, Some(r.as_str())));
        let m = metrics_text(&sim).await;
        assert!(samples(&m)
            .iter()
            .any(|(n, l, v)| n == "sim_role_info" && l.contains(&format!("role=\"{}\"", r.as_str())) && *v == 1.0));
        sim.shutdown().await;
    }
}

fn scratch_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mmrouter-sim-{tag}-{}-{:x}", std::process::id(), rand_tag()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn rand_tag() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// A chat with one image (with `uuid` when given) after some text.
fn image_chat(uuid: Option<&str>, url: &str, extra: Value) -> Vec<u8> {
    let mut image = json!({"type": "image_url", "image_url": {"url": url}});
    if let Some(uuid) = uuid {
        image["uuid"] = json!(uuid);
    }
    let content = json!([{"type": "text", "text": words(20, "pre")}, image, {"type": "text", "text": "what is it?"}]);
    let mut body = json!({"model": "m", "messages": [{"role": "user", "content": content}]});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    serde_json::to_vec(&body).expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encoder_hands_its_images_to_prefill_through_the_shared_storage() {
    // The encoder creates the directory, as vLLM's producer does.
    let dir = scratch_dir("ec").join("storage");
    let shared = |r: Role| SimOptions { ec_shared_storage: Some(dir.clone()), ..role(r) };
    let encoder = sim::spawn_exact(shared(Role::Encode)).await.expect("encoder");
    let url = gif(640, 480, 3);
    let leg = image_chat(Some("img-one"), &url, json!({"max_tokens": 1, "stream": false}));
    let v = json_of(&encoder, &leg).await;
    assert_eq!(v["choices"][0]["message"]["content"], "");
    assert!(v["usage"]["prompt_tokens"].as_u64() > Some(100), "the whole prompt, image included: {v}");
    assert_eq!(v["usage"]["completion_tokens"], 0);
    let entry = &v["ec_transfer_params"]["img-one"];
    assert_eq!(entry["item_indices"], json!([0]));
    let grid = entry["metadata"]["image_grid_thw"].as_array().expect("grid");
    assert_eq!(grid.len(), 3);
    assert!(grid[2].as_u64() > grid[1].as_u64(), "640×480 is wider than tall: {grid:?}");
    assert_eq!(v["ec_transfer_params"].as_object().map(|o| o.len()), Some(1));
    let stats = encoder.stats();
    let tokens = stats.image_encoded_tokens;
    assert!(tokens > 100);
    assert_eq!(grid[1].as_u64().zip(grid[2].as_u64()).map(|(h, w)| h * w), Some(4 * tokens), "2×2 patches a token");
    assert_eq!((stats.prompt_tokens, stats.kv_batches, stats.ec_stores), (0, 0, 1), "no prefill, no KV");
    let m = metrics_text(&encoder).await;
    assert_eq!(sample(&m, "vllm:prefix_cache_queries_total"), 0.0);
    assert_eq!(sample(&m, "sim_ec_stores_total"), 1.0);
    assert_eq!(std::fs::read_dir(&dir).expect("dir").count(), 1, "one file for the image");

    // The encoder's own caches: the same image again costs it nothing and writes nothing new.
    json_of(&encoder, &leg).await;
    let again = encoder.stats();
    assert_eq!((again.encoder_cache_hits, again.image_encoded_tokens, again.ec_stores), (1, tokens, 1));

    // A prefill (here aggregated) sim on the same storage loads the image instead of encoding it…
    let pd = sim::spawn_exact(shared(Role::Both)).await.expect("pd");
    json_of(&pd, &image_chat(Some("img-one"), &url, json!({"max_tokens": 2}))).await;
    let s = pd.stats();
    assert_eq!((s.ec_loads, s.image_encoded_tokens, s.encoder_cache_queries), (1, 0, 1));
    assert_eq!(sample(&metrics_text(&pd).await, "sim_ec_loads_total"), 1.0);
    // …but encodes an image the encoder never saw.
    json_of(&pd, &image_chat(Some("img-two"), &gif(640, 480, 4), json!({"max_tokens": 2}))).await;
    assert_eq!((pd.stats().ec_loads, pd.stats().image_encoded_tokens), (1, tokens));
    // Without the storage the same first request is encoded.
    let alone = sim::spawn_exact(role(Role::Both)).await.expect("alone");
    json_of(&alone, &image_chat(Some("img-one"), &url, json!({"max_tokens": 2}))).await;
    assert_eq!((alone.stats().ec_loads, alone.stats().image_encoded_tokens), (0, tokens));
    for s in [encoder, pd, alone] {
        s.shutdown().await;
    }
    std::fs::remove_dir_all(dir.parent().expect("scratch")).expect("clean up");
}

/// SGLang's fields on both legs.
fn sglang_body(text: &str, host: &str, port: u16, room: u64, extra: Value) -> Vec<u8> {
    let mut extra = extra;
    extra["bootstrap_host"] = json!(host);
    extra["bootstrap_port"] = json!(port);
    extra["bootstrap_room"] = json!(room);
    chat_body(text, extra)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sglang_decode_waits_for_its_prefill() {
    let prefill_opts = SimOptions { bootstrap_port: Some(0), prefill_us_per_token: 3000, ..role(Role::Prefill) };
    let prefill = start(prefill_opts).await;
    let decode = start(role(Role::Decode)).await;
    let port = prefill.bootstrap_port().expect("bound");
    assert_ne!(port, 0);
    let (status, _) = get_json(&format!("http://127.0.0.1:{port}/sim/bootstrap/77")).await;
    assert_eq!(status, 404, "not prefilled yet");

    let text = words(100, "g");
    let p_body = sglang_body(&text, "127.0.0.1", port, 77, json!({"max_tokens": 1}));
    let d_body = sglang_body(&text, "127.0.0.1", port, 77, json!({"max_tokens": 3, "stream": true}));
    let started = Instant::now();
    let decoded = async {
        let resp = post(&decode, CHAT, &d_body).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(header(&resp, "x-sim-worker"), "w1");
        let text = resp.text().await.expect("stream");
        (started.elapsed(), text)
    };
    let prefilled = async {
        let v = json_of(&prefill, &p_body).await;
        (started.elapsed(), v)
    };
    let ((decode_at, stream), (prefill_at, p)) = tokio::join!(decoded, prefilled);
    assert_eq!(p["usage"]["completion_tokens"], 1);
    assert!(decode_at >= Duration::from_millis(290), "the decode waited for the ~300 ms prefill: {decode_at:?}");
    assert!(prefill_at >= Duration::from_millis(290), "{prefill_at:?}");
    assert_eq!(sse_events(&stream).last(), Some(&"[DONE]"));
    let (status, v) = get_json(&format!("http://127.0.0.1:{port}/sim/bootstrap/77")).await;
    assert_eq!((status, v), (200, json!({"done": true})));
    let prompt_tokens = u64::from(word_prompt(&d_body).prompt_tokens);
    let stats = decode.stats();
    assert_eq!((stats.kv_transfers, stats.external_kv_tokens), (1, prompt_tokens));
    assert_eq!(prefill.stats().kv_transfers, 0);
    prefill.shutdown().await;
    decode.shutdown().await;
}

#[tokio::test]
async fn an_sglang_decode_whose_room_never_completes_fails_with_500() {
    let prefill = start(SimOptions { bootstrap_port: Some(0), ..role(Role::Prefill) }).await;
    let decode = start(SimOptions { bootstrap_timeout_ms: 150, ..role(Role::Decode) }).await;
    let port = prefill.bootstrap_port().expect("bound");
    let started = Instant::now();
    let resp = post(&decode, CHAT, &sglang_body("lonely decode", "127.0.0.1", port, 5, json!({}))).await;
    assert_eq!(resp.status(), 500);
    assert!(started.elapsed() >= Duration::from_millis(140), "{:?}", started.elapsed());
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["error"]["code"], "bootstrap_timeout");
    let stats = decode.stats();
    assert_eq!((stats.kv_transfers, stats.cancelled, stats.in_flight), (0, 0, 0));
    prefill.shutdown().await;
    decode.shutdown().await;
}

#[tokio::test]
async fn an_sglang_decode_refuses_a_bootstrap_host_off_this_machine() {
    let decode = start(role(Role::Decode)).await;
    for host in ["10.0.0.7", "example.com", "0.0.0.0"] {
        let resp = post(&decode, CHAT, &sglang_body("far away", host, 8998, 1, json!({}))).await;
        assert_eq!(resp.status(), 400, "{host}");
        let v: Value = resp.json().await.expect("json");
        assert_eq!(v["error"]["code"], "bootstrap_host_refused", "{host}");
    }
    decode.shutdown().await;
}
