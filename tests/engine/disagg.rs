//! Disaggregated serving (`docs/disaggregated.md`) against vLLM itself: prefill and decode engines
//! joined by vLLM's NIXL connector (DRAM to DRAM over UCX's TCP transport on loopback), and an
//! encoder-only engine handing its embeddings to an aggregated engine through the EC connector's shared
//! storage. Two engines per test (~6 GB each on a 24 GB machine), started together.
//!
//! Answers are compared by token ids (`return_token_ids`) at temperature 0 with the prefill engine
//! serving the same chat whole: the checkpoints are random weights, so only the same weights on the same
//! kernels give the same ids, and the prefill engine is the one that computed the prompt's KV cache the
//! decode engine pulled (its answer reuses those very blocks, then computes the rest as any aggregated
//! engine does).

use std::path::Path;

use serde_json::{json, Value};

use crate::client::*;
use crate::engine::{free_port, Engine, EngineOpts, Events};
use crate::{corpus, engines, opts};

/// The kv-transfer config both P/D engines run (`kv_both`: prefill and decode; vLLM warns it prefers
/// `kv_producer`/`kv_consumer`, which the suite has not tried).
const NIXL_CONFIG: &str = r#"{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_buffer_device":"cpu"}"#;

/// An engine with vLLM's NIXL connector: NIXL from the suite's cache (`install.sh`), UCX on TCP over
/// loopback only, and its own handshake port (`VLLM_NIXL_SIDE_CHANNEL_PORT`, read by vLLM's
/// `nixl/base_scheduler.py`; the default 5600 would collide between the two engines).
fn nixl(mut o: EngineOpts) -> EngineOpts {
    let path = std::env::var("MMROUTER_NIXL_PYTHONPATH")
        .expect("MMROUTER_NIXL_PYTHONPATH is not set: run tests/engine/run.sh (prepare.sh installs NIXL)");
    o.extra.extend(["--kv-transfer-config".to_owned(), NIXL_CONFIG.to_owned()]);
    o.env.extend([
        ("PYTHONPATH".to_owned(), path),
        ("UCX_TLS".to_owned(), "tcp,self".to_owned()),
        ("UCX_NET_DEVICES".to_owned(), "lo".to_owned()),
        ("VLLM_NIXL_SIDE_CHANNEL_HOST".to_owned(), "127.0.0.1".to_owned()),
        ("VLLM_NIXL_SIDE_CHANNEL_PORT".to_owned(), free_port().to_string()),
    ]);
    o
}

/// An engine with vLLM's `ECExampleConnector` on `dir`: the producer (`ec_producer`: encoder-only
/// mode, no KV cache, so no prefix caching and no KV events) writes one safetensors file per image's mm
/// hash there, a consumer loads it instead of running the encoder. The consumer's `Success load encoder
/// cache for hash …` line is a debug line of that connector: its logger alone is turned to DEBUG.
fn ec(mut o: EngineOpts, role: &str, dir: &Path) -> EngineOpts {
    let config = json!({ "ec_connector": "ECExampleConnector", "ec_role": role,
                         "ec_connector_extra_config": { "shared_storage_path": dir } });
    o.extra.extend(["--ec-transfer-config".to_owned(), config.to_string()]);
    if role == "ec_producer" {
        o.extra.push("--no-enable-prefix-caching".to_owned());
        o.events = Events::Off;
    } else {
        let logging = dir.join(format!("logging-{}.json", o.name));
        let config = json!({
            "version": 1, "disable_existing_loggers": false,
            "formatters": { "plain": { "format": "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s" } },
            "handlers": { "vllm": { "class": "logging.StreamHandler", "formatter": "plain", "level": "DEBUG",
                                    "stream": "ext://sys.stdout" } },
            "loggers": {
                "vllm": { "handlers": ["vllm"], "level": "INFO", "propagate": false },
                "vllm.distributed.ec_transfer": { "level": "DEBUG" }
            }
        });
        std::fs::write(&logging, config.to_string()).unwrap();
        o.env.push(("VLLM_LOGGING_CONFIG_PATH".to_owned(), logging.display().to_string()));
    }
    o
}

/// A chat answer, whole or streamed: the generated token ids and text, `usage`, the answer's JSON (the
/// last chunk's when streamed) and the response's headers.
#[derive(Debug)]
pub struct Answer {
    pub ids: Vec<u64>,
    pub text: String,
    pub usage: Value,
    pub json: Value,
    pub headers: Vec<(String, String)>,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    pub fn prompt_tokens(&self) -> u64 {
        self.usage["prompt_tokens"].as_u64().unwrap_or_else(|| panic!("no usage: {self:?}"))
    }

    pub fn cached_tokens(&self) -> u64 {
        self.usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0)
    }
}

/// Posts `body` to `base`'s chat endpoint and reads the answer, streamed (SSE) or whole.
pub async fn complete(base: &str, body: &Value) -> Answer {
    let resp = post(&format!("{base}/v1/chat/completions"), &serde_json::to_vec(body).unwrap()).await;
    let status = resp.status();
    let headers =
        resp.headers().iter().map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned())).collect();
    let text = resp.text().await.unwrap();
    assert!(status.is_success(), "{base}: {status} {text}");
    let mut answer = Answer { ids: Vec::new(), text: String::new(), usage: Value::Null, json: Value::Null, headers };
    if body["stream"] == true {
        for data in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
            if data == "[DONE]" {
                break;
            }
            let chunk: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}"));
            assert!(chunk.get("error").is_none(), "{base}: an error event: {data}");
            let choice = &chunk["choices"][0];
            answer.text.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
            answer.ids.extend(choice["token_ids"].as_array().into_iter().flatten().filter_map(Value::as_u64));
            if !chunk["usage"].is_null() {
                answer.usage = chunk["usage"].clone();
            }
            answer.json = chunk;
        }
    } else {
        let v: Value = serde_json::from_str(&text).unwrap();
        answer.text = v["choices"][0]["message"]["content"].as_str().unwrap_or("").to_owned();
        answer.ids = v["choices"][0]["token_ids"].as_array().into_iter().flatten().filter_map(Value::as_u64).collect();
        answer.usage = v["usage"].clone();
        answer.json = v;
    }
    answer
}

/// A chat for the P/D checks: 8 tokens at temperature 0 with their ids, whole or streamed (with usage).
fn chat_body(messages: Value, stream: bool) -> Value {
    let mut b: Value = serde_json::from_slice(&corpus::body("qwen2.5-vl", messages, &[])).unwrap();
    b["max_tokens"] = json!(8);
    b["return_token_ids"] = json!(true);
    if stream {
        b["stream"] = json!(true);
        b["stream_options"] = json!({ "include_usage": true });
    }
    b
}

fn text_chat(stream: bool) -> Value {
    let long: String = (0..40).map(|i| format!("line {i} of case {};", corpus::nonce())).collect::<Vec<_>>().join(" ");
    chat_body(json!([{ "role": "user", "content": long }]), stream)
}

fn image_chat(file: &str, question: &str, stream: bool) -> Value {
    chat_body(
        json!([{ "role": "user", "content": [
            { "type": "text", "text": format!("Case {}: {question}", corpus::nonce()) },
            { "type": "image_url", "image_url": { "url": corpus::image(file) } }]}]),
        stream,
    )
}

/// A sample of an engine's own `/metrics`.
async fn engine_metric(engine: &str, name: &str, labels: &str) -> f64 {
    metric(&metrics(engine).await, name, labels)
}

/// Prompt tokens by where the engine got their KV: `local_compute`, `local_cache_hit` or
/// `external_kv_transfer` (vLLM's `PromptTokenStats`).
async fn by_source(engine: &str, source: &str) -> f64 {
    engine_metric(engine, "vllm:prompt_tokens_by_source_total", &format!("source=\"{source}\"")).await
}

/// The prefill leg as `docs/disaggregated.md` says the router sends it.
fn prefill_leg(body: &Value) -> Value {
    let mut b = body.clone();
    let o = b.as_object_mut().unwrap();
    o.insert(
        "kv_transfer_params".into(),
        json!({ "do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
                "remote_block_ids": null, "remote_host": null, "remote_port": null }),
    );
    o.insert("max_tokens".into(), json!(1));
    if o.contains_key("max_completion_tokens") {
        o.insert("max_completion_tokens".into(), json!(1));
    }
    o.insert("stream".into(), json!(false));
    o.insert("n".into(), json!(1));
    o.remove("stream_options");
    o.remove("min_tokens");
    b
}

/// One P/D exchange by hand, the router's protocol: the prefill leg, then the received body with the
/// prefill's `kv_transfer_params` to decode. Returns both answers.
async fn pd_by_hand(prefill: &str, decode: &str, body: &Value) -> (Answer, Answer) {
    let first = complete(prefill, &prefill_leg(body)).await;
    let params = first.json["kv_transfer_params"].clone();
    assert_eq!(params["do_remote_prefill"], true, "the prefill's kv_transfer_params: {}", first.json);
    assert!(params["remote_block_ids"].is_array(), "{params}");
    let mut b = body.clone();
    b["kv_transfer_params"] = params;
    (first, complete(decode, &b).await)
}

/// Sends `body` to the prefill engine whole (no transfer): the aggregated answer to compare with.
async fn aggregated(engine: &str, body: &Value) -> Answer {
    let mut b = body.clone();
    b["stream"] = json!(false);
    b.as_object_mut().unwrap().remove("stream_options");
    complete(engine, &b).await
}

/// The P/D protocol against the two engines directly: for a text and an image chat, decode pulls every
/// prompt token over NIXL (its `external_kv_transfer` count grows by the prompt's tokens, none computed
/// there) and answers what the prefill engine answers whole.
async fn pd_engines_by_hand(p: &Engine, d: &Engine) {
    for (name, body) in [("text", text_chat(false)), ("image", image_chat("horse.png", "what is this?", true))] {
        let before = by_source(&d.url(), "external_kv_transfer").await;
        let computed = by_source(&d.url(), "local_compute").await;
        let (first, answer) = pd_by_hand(&p.url(), &d.url(), &body).await;
        let n = first.prompt_tokens();
        assert_eq!(answer.prompt_tokens(), n, "{name}: both legs count the same prompt");
        let pulled = by_source(&d.url(), "external_kv_transfer").await - before;
        assert_eq!(pulled, n as f64, "{name}: decode's external_kv_transfer tokens vs the prompt's");
        assert_eq!(by_source(&d.url(), "local_compute").await, computed, "{name}: decode computed none of the prompt");
        let whole = aggregated(&p.url(), &body).await;
        assert!(!whole.ids.is_empty(), "{name}: no token ids: {:?}", whole.json);
        assert_eq!(answer.ids, whole.ids, "{name}: P/D answer vs the prefill engine's whole answer");
        eprintln!("P/D by hand, {name}: {n} prompt tokens pulled by decode, {} ids as served whole", answer.ids.len());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs vLLM and NIXL: tests/engine/run.sh"]
async fn prefill_and_decode_over_nixl() {
    let started = std::time::Instant::now();
    let es = engines(vec![nixl(opts("prefill", "qwen2.5-vl")), nixl(opts("decode", "qwen2.5-vl"))]).await;
    let (p, d) = (&es[0], &es[1]);
    eprintln!(
        "P/D engines up in {:.0} s: prefill {} MiB, decode {} MiB",
        started.elapsed().as_secs_f64(),
        p.rss_mib(),
        d.rss_mib()
    );
    pd_engines_by_hand(p, d).await;
    eprintln!("P/D: {:.0} s in all", started.elapsed().as_secs_f64());
}

/// E + aggregated PD by hand (vLLM's `disagg_epd_proxy.py`): the encoder answers an image chat with one
/// token and the image's `ec_transfer_params` (keyed by the client's uuid, its mm hash); the PD engine
/// then loads the embeddings from storage (its log says so) and answers.
async fn epd_engines_by_hand(e: &Engine, pd: &Engine, dir: &Path) {
    let uuid = format!("epd-{}", corpus::nonce());
    let mut body = image_chat("rocket.jpg", "describe it", false);
    body["messages"][0]["content"][1]["uuid"] = json!(uuid);
    let mut leg = body.clone();
    leg["max_tokens"] = json!(1);
    let encoded = complete(&e.url(), &leg).await;
    assert!(encoded.json["ec_transfer_params"][&uuid].is_object(), "the encoder's answer: {}", encoded.json);
    assert!(
        std::fs::read_dir(dir).unwrap().flatten().any(|f| f.file_name().to_string_lossy().contains(&uuid)),
        "no file for {uuid} in the shared storage"
    );
    let answer = complete(&pd.url(), &body).await;
    assert_eq!(answer.prompt_tokens(), encoded.prompt_tokens(), "both count the same prompt");
    let line = format!("Success load encoder cache for hash {uuid}");
    assert!(pd.log().contains(&line), "the PD engine's log has no {line:?}:\n{}", pd.log_tail());
    eprintln!("E/PD by hand: {uuid} encoded by the encoder, loaded by the PD engine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs vLLM: tests/engine/run.sh"]
async fn encoder_and_aggregated_pd_over_shared_storage() {
    let started = std::time::Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let es = engines(vec![
        ec(opts("encoder", "qwen2.5-vl"), "ec_producer", dir.path()),
        ec(opts("pd", "qwen2.5-vl"), "ec_consumer", dir.path()),
    ])
    .await;
    let (e, pd) = (&es[0], &es[1]);
    eprintln!(
        "E/PD engines up in {:.0} s: encoder {} MiB, PD {} MiB",
        started.elapsed().as_secs_f64(),
        e.rss_mib(),
        pd.rss_mib()
    );
    epd_engines_by_hand(e, pd, dir.path()).await;
    eprintln!("E/PD: {:.0} s in all", started.elapsed().as_secs_f64());
}
