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
use std::time::Duration;

use serde_json::{json, Value};

use crate::client::*;
use crate::engine::{free_port, Engine, EngineOpts, Events};
use crate::{corpus, engines, feeds_connected, opts, router, BLOCK};

/// The kv-transfer config both P/D engines run (`kv_both`: prefill and decode; vLLM warns it prefers
/// `kv_producer`/`kv_consumer`, which the suite has not tried). `kv_load_failure_policy: recompute`
/// (vLLM's default is `fail`): a decode engine whose pull fails — its prefill engine died between
/// answering the prefill leg and the pull — computes the prompt itself instead of failing the request.
const NIXL_CONFIG: &str = r#"{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_buffer_device":"cpu","kv_load_failure_policy":"recompute"}"#;

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
    let long: String = (0..16).map(|i| format!("line {i} of case {};", corpus::nonce())).collect::<Vec<_>>().join(" ");
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

/// The sum of every sample of `name` whose labels contain each of `labels` (in any order).
fn metric_sum(page: &str, name: &str, labels: &[&str]) -> f64 {
    page.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

/// The legs the router sent to `worker` (`mmrouter_worker_legs_total`).
async fn legs_to(r: &str, worker: &str, leg: &str) -> f64 {
    metric_sum(
        &metrics(r).await,
        "mmrouter_worker_legs_total",
        &[&format!("worker=\"{worker}\""), &format!("leg=\"{leg}\"")],
    )
}

/// The router's `/metrics` page once `value(page)` reaches `want`, or after 3 s (a request is recorded
/// when its answer's body ends, a moment after the client has read it).
async fn page_when(r: &str, value: impl Fn(&str) -> f64, want: f64) -> String {
    for _ in 0..75 {
        let page = metrics(r).await;
        if value(&page) >= want {
            return page;
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    metrics(r).await
}

/// A router for one pool of workers with roles: `(name, url, role, kv_events)`.
async fn roles_router(workers: &[(&str, String, &str, Option<String>)]) -> String {
    let mut t = format!("[server]\nhealth_interval_ms = 1000\n[model]\ndir = \"qwen2.5-vl\"\nblock_size = {BLOCK}\n");
    for (name, url, role, events) in workers {
        t.push_str(&format!("[[workers]]\nname = {name:?}\nurl = {url:?}\nengine = \"vllm\"\nrole = {role:?}\n"));
        if let Some(events) = events {
            t.push_str(&format!("kv_events = {events:?}\n"));
        }
    }
    router(&t).await
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

/// Polls `engine`'s `source` count until it is at least `before + want` (its metrics follow the answer
/// by a few milliseconds), then a moment more; the growth since `before`.
async fn grown(engine: &str, source: &str, before: f64, want: u64) -> f64 {
    for _ in 0..50 {
        if by_source(engine, source).await - before >= want as f64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    by_source(engine, source).await - before
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
        let pulled = grown(&d.url(), "external_kv_transfer", before, n).await;
        assert_eq!(pulled, n as f64, "{name}: decode's external_kv_transfer tokens vs the prompt's");
        assert_eq!(by_source(&d.url(), "local_compute").await, computed, "{name}: decode computed none of the prompt");
        let whole = aggregated(&p.url(), &body).await;
        assert!(!whole.ids.is_empty(), "{name}: no token ids: {:?}", whole.json);
        assert_eq!(answer.ids, whole.ids, "{name}: P/D answer vs the prefill engine's whole answer");
        eprintln!("P/D by hand, {name}: {n} prompt tokens pulled by decode, {} ids as served whole", answer.ids.len());
    }
}

/// Through the router (a prefill and a decode worker): text and image chats, whole and streamed, each
/// served in two legs — one prefill leg on the prefill worker, then decode pulling every prompt token
/// the router predicted (its `external_kv_transfer` count grows by the plan's `prompt_tokens`) — and
/// answered token for token as the prefill engine answers the chat whole. Returns a served chat.
async fn pd_through_the_router(r: &str, p: &Engine, d: &Engine) -> Value {
    let chats = [
        ("text", text_chat(false)),
        ("text, streamed", text_chat(true)),
        ("image", image_chat("horse.png", "what is this?", false)),
        ("image, streamed", image_chat("chelsea.png", "name the animal.", true)),
    ];
    for (name, body) in &chats {
        let plan = debug(r, &serde_json::to_vec(body).unwrap()).await;
        assert!(matches!(plan["route"].as_str(), Some("exact" | "no_media")), "{name}: {plan}");
        let n = plan["prompt_tokens"].as_u64().unwrap();
        let pulled = by_source(&d.url(), "external_kv_transfer").await;
        let legs = legs_to(r, "prefill", "prefill").await;
        let answer = complete(r, body).await;
        assert_eq!(answer.prompt_tokens(), n, "{name}: predicted prompt tokens vs decode's usage");
        assert_eq!(answer.header("x-mmrouter-worker"), Some("decode"), "{name}: decode answers");
        assert_eq!(answer.header("x-mmrouter-prefill-worker"), Some("prefill"), "{name}: prefilled there");
        let prefill_legs =
            |page: &str| metric_sum(page, "mmrouter_worker_legs_total", &["worker=\"prefill\"", "leg=\"prefill\""]);
        let page = page_when(r, prefill_legs, legs + 1.0).await;
        assert_eq!(prefill_legs(&page) - legs, 1.0, "{name}: one prefill leg, on the prefill worker");
        let pulled = grown(&d.url(), "external_kv_transfer", pulled, n).await;
        assert_eq!(pulled, n as f64, "{name}: decode's external_kv_transfer tokens vs the predicted prompt tokens");
        let whole = aggregated(&p.url(), body).await;
        assert_eq!(answer.ids, whole.ids, "{name}: through the router vs the prefill engine serving it whole");
        eprintln!(
            "P/D through the router, {name}: {n} tokens predicted and pulled, {} ids as served whole",
            whole.ids.len()
        );
    }
    chats[2].1.clone()
}

/// A repeat: the router predicts from the prefill engine's KV events what it holds of the prompt, and
/// the prefill leg reuses exactly that (the prefill engine's `local_cache_hit` count grows by it; the
/// client's answer is decode's, whose `usage` does not show the prefill's cache).
async fn a_repeat_reuses_the_prefill_cache(r: &str, p: &Engine, body: &Value) {
    let bytes = serde_json::to_vec(body).unwrap();
    let plan = until(r, &bytes, "the prefill's events confirm the prompt's blocks", |v| {
        let w = index_of(v, "prefill");
        let n = v["prompt_tokens"].as_u64().unwrap_or(0);
        v["overlap_sources"][w]["pending"] == 0 && v["overlap_sources"][w]["events"].as_u64() >= Some(n / BLOCK)
    })
    .await;
    let (w, n) = (index_of(&plan, "prefill"), plan["prompt_tokens"].as_u64().unwrap());
    let expected = reusable(plan["overlap_blocks"][w].as_u64().unwrap() * BLOCK, n, BLOCK);
    assert_eq!(expected, (n - 1) / BLOCK * BLOCK, "the whole prompt but its last block: {plan}");
    let hits = by_source(&p.url(), "local_cache_hit").await;
    let answer = complete(r, body).await;
    let reused = grown(&p.url(), "local_cache_hit", hits, expected).await;
    assert_eq!(reused, expected as f64, "the prefill leg's cached tokens: the router's prediction vs the engine's");
    eprintln!(
        "P/D repeat: {expected} of {n} tokens predicted held and reused by the prefill leg (decode's usage: {} cached)",
        answer.cached_tokens()
    );
}

/// The prefill engine is killed (SIGKILL) while requests run through the router: every request is
/// still answered by decode (a failed prefill leg, or no prefill worker left, serves it whole there;
/// a pull from the dead engine is recomputed), and the router counts each request that lost its prefill
/// leg.
async fn prefill_dies_mid_run(r: &str, p: &mut Engine) {
    const N: usize = 8;
    let page = metrics(r).await;
    let count = |page: &str| {
        let served = metric_sum(page, "mmrouter_disagg_legs_total", &["leg=\"prefill\"", "outcome=\"served\""]);
        let fell = metric_sum(page, "mmrouter_disagg_fallback_total", &["leg=\"prefill\""]);
        (served, fell)
    };
    let (served0, fell0) = count(&page);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let router = r.to_owned();
    let run = tokio::spawn(async move {
        let mut answers = Vec::new();
        for i in 0..N {
            let content = format!("Case {}: count to {i}.", corpus::nonce());
            answers
                .push(complete(&router, &chat_body(json!([{ "role": "user", "content": content }]), i % 2 == 1)).await);
            let _ = tx.send(i);
        }
        answers
    });
    while rx.recv().await.is_some_and(|i| i < 1) {}
    tokio::task::block_in_place(|| p.kill());
    let answers = run.await.expect("every request answered");
    for (i, a) in answers.iter().enumerate() {
        assert!(!a.ids.is_empty(), "request {i}: no tokens: {:?}", a.json);
        assert_eq!(a.header("x-mmrouter-worker"), Some("decode"), "request {i}");
    }
    let page = page_when(r, |page| count(page).0 + count(page).1, served0 + fell0 + N as f64).await;
    let (served, fell) = count(&page);
    let (served, fell) = (served - served0, fell - fell0);
    assert!(fell >= (N - 3) as f64, "requests after the kill lost their prefill leg: {fell} counted\n{page}");
    assert_eq!(served + fell, N as f64, "each request's prefill leg served or counted as a fallback\n{page}");
    eprintln!("prefill killed mid-run: {N} of {N} answered, {served} prefill legs served, {fell} fallbacks counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs vLLM and NIXL: tests/engine/run.sh"]
async fn prefill_and_decode_over_nixl() {
    let started = std::time::Instant::now();
    let mut es = engines(vec![nixl(opts("prefill", "qwen2.5-vl")), nixl(opts("decode", "qwen2.5-vl"))]).await;
    let (p, d) = (&es[0], &es[1]);
    eprintln!(
        "P/D engines up in {:.0} s: prefill {} MiB, decode {} MiB",
        started.elapsed().as_secs_f64(),
        p.rss_mib(),
        d.rss_mib()
    );
    pd_engines_by_hand(p, d).await;
    let r = roles_router(&[
        ("prefill", p.url(), "prefill", Some("discover".to_owned())),
        ("decode", d.url(), "decode", Some("discover".to_owned())),
    ])
    .await;
    feeds_connected(&r, &["prefill", "decode"]).await;
    let served = pd_through_the_router(&r, p, d).await;
    a_repeat_reuses_the_prefill_cache(&r, p, &served).await;
    prefill_dies_mid_run(&r, &mut es[0]).await;
    eprintln!("P/D: {:.0} s in all", started.elapsed().as_secs_f64());
}

/// E + aggregated PD by hand (vLLM's `disagg_epd_proxy.py`): the encoder answers an image chat with one
/// token and the image's `ec_transfer_params` (keyed by the client's uuid, its mm hash); the PD engine
/// then loads the embeddings from storage (its log says so) and answers as it does encoding alone.
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
    // The same chat under a uuid the storage lacks: the PD engine encodes the image itself, and answers
    // the same tokens as with the encoder's embeddings.
    let local = format!("{uuid}-local");
    body["messages"][0]["content"][1]["uuid"] = json!(local);
    let itself = complete(&pd.url(), &body).await;
    assert!(!pd.log().contains(&format!("Success load encoder cache for hash {local}")), "{local} was loaded");
    assert!(!answer.ids.is_empty(), "no token ids: {:?}", answer.json);
    assert_eq!(answer.ids, itself.ids, "with the encoder's embeddings vs with the PD engine's own");
    eprintln!(
        "E/PD by hand: {uuid} encoded by the encoder, loaded by the PD engine, {} ids as it answers alone",
        answer.ids.len()
    );
}

/// An image chat about `file` for the E/PD checks: a question with a nonce before the image (no cached
/// prefix reaches it), then a tail long enough that a repeat's cached prefix covers the whole image.
fn about(file: &str, question: &str) -> Value {
    let tail: String = (0..16).map(|i| format!("detail {i};")).collect::<Vec<_>>().join(" ");
    chat_body(
        json!([{ "role": "user", "content": [
            { "type": "text", "text": format!("Case {}: {question}", corpus::nonce()) },
            { "type": "image_url", "image_url": { "url": corpus::image(file) } },
            { "type": "text", "text": tail }]}]),
        false,
    )
}

/// Waits until `log()` contains `line` (the engine writes it as the request runs).
async fn logged(engine: &Engine, line: &str) -> bool {
    for _ in 0..50 {
        if engine.log().contains(line) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    false
}

/// Through the router (two encode workers and a `both` worker), per image: the first chat's encode leg
/// goes to an encoder, whose embeddings the PD engine loads (its log names the router's uuid for the
/// image, the shared storage holds a file for it); a second chat about the same image goes to the same
/// encoder, which `/debug/route` shows strictly cheaper than the other (it holds the image), not a tie.
/// Then a repeat, whose image lies inside the PD engine's cached prefix: no encode leg (counted
/// `cached_prefix`), and the prefix the router predicted reused.
async fn epd_through_the_router(r: &str, pd: &Engine, dir: &Path) {
    let encoders = ["encoder-a", "encoder-b"];
    let mut used = std::collections::BTreeSet::new();
    let mut last = Value::Null;
    for file in ["rocket.jpg", "horse.png", "chelsea.png"] {
        let first = about(file, "what is this?");
        let plan = debug(r, &serde_json::to_vec(&first).unwrap()).await;
        assert_eq!(plan["route"], "exact", "{file}: {plan}");
        let hash = plan["images"][0]["hash"].as_str().unwrap().to_owned();
        let answer = complete(r, &first).await;
        assert_eq!(answer.prompt_tokens(), plan["prompt_tokens"].as_u64().unwrap(), "{file}: predicted vs usage");
        assert_eq!(answer.header("x-mmrouter-worker"), Some("pd"), "{file}");
        let encoder = answer.header("x-mmrouter-encode-worker").expect("an encode leg served").to_owned();
        let line = format!("Success load encoder cache for hash {hash}");
        assert!(logged(pd, &line).await, "{file}: the PD engine's log has no {line:?}:\n{}", pd.log_tail());
        assert!(
            std::fs::read_dir(dir).unwrap().flatten().any(|f| f.file_name().to_string_lossy().contains(&hash)),
            "{file}: no file for {hash} in the shared storage"
        );

        let second = about(file, "what colour is it?");
        let plan = debug(r, &serde_json::to_vec(&second).unwrap()).await;
        assert_eq!(plan["images"][0]["hash"], hash.as_str(), "{file}: the same image, the same uuid");
        let leg = &plan["legs"]["encode"];
        assert_eq!(leg["worker"], encoder.as_str(), "{file}: the encoder that holds the image: {plan}");
        let cost = |name: &str| leg["costs"][index_of(&plan, name)].as_f64().unwrap_or(f64::INFINITY);
        let other = encoders.iter().find(|e| **e != encoder).unwrap();
        assert!(cost(&encoder) < cost(other), "{file}: {encoder} is not strictly cheaper: {leg}");
        let again = complete(r, &second).await;
        assert_eq!(again.header("x-mmrouter-encode-worker"), Some(encoder.as_str()), "{file}: the same encoder");
        eprintln!("E/PD through the router, {file}: {hash} encoded on {encoder} twice, loaded by the PD engine");
        used.insert(encoder);
        last = first;
    }

    let bytes = serde_json::to_vec(&last).unwrap();
    let plan = until(r, &bytes, "the PD engine's events confirm the prompt's blocks", |v| {
        let w = index_of(v, "pd");
        let n = v["prompt_tokens"].as_u64().unwrap_or(0);
        v["overlap_sources"][w]["pending"] == 0 && v["overlap_sources"][w]["events"].as_u64() >= Some(n / BLOCK)
    })
    .await;
    assert_eq!(plan["legs"]["encode"]["skipped"], "cached_prefix", "{plan}");
    let (w, n) = (index_of(&plan, "pd"), plan["prompt_tokens"].as_u64().unwrap());
    let expected = reusable(plan["overlap_blocks"][w].as_u64().unwrap() * BLOCK, n, BLOCK);
    let skipped = |page: &str| {
        metric_sum(page, "mmrouter_disagg_fallback_total", &["leg=\"encode\"", "reason=\"cached_prefix\""])
    };
    let before = skipped(&metrics(r).await);
    let repeat = complete(r, &last).await;
    assert_eq!(repeat.header("x-mmrouter-encode-worker"), None, "no encode leg for an image already cached");
    assert_eq!(skipped(&page_when(r, skipped, before + 1.0).await) - before, 1.0, "the skipped encode leg counted");
    assert_eq!(repeat.cached_tokens(), expected, "predicted vs reused on the repeat");
    eprintln!("E/PD repeat: encode leg skipped (image inside {expected} cached tokens); encoders used: {used:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs vLLM: tests/engine/run.sh"]
async fn encoders_and_aggregated_pd_over_shared_storage() {
    let started = std::time::Instant::now();
    let dir = tempfile::tempdir().unwrap();
    // Three engines at once (~4.7 GB per encoder, ~6 GB for the PD engine): the second encoder is what
    // shows the router's choice between encoders.
    let es = engines(vec![
        ec(opts("encoder-a", "qwen2.5-vl"), "ec_producer", dir.path()),
        ec(opts("encoder-b", "qwen2.5-vl"), "ec_producer", dir.path()),
        ec(opts("pd", "qwen2.5-vl"), "ec_consumer", dir.path()),
    ])
    .await;
    let (a, b, pd) = (&es[0], &es[1], &es[2]);
    eprintln!(
        "E/PD engines up in {:.0} s: encoders {} and {} MiB, PD {} MiB",
        started.elapsed().as_secs_f64(),
        a.rss_mib(),
        b.rss_mib(),
        pd.rss_mib()
    );
    epd_engines_by_hand(a, pd, dir.path()).await;
    let r = roles_router(&[
        ("encoder-a", a.url(), "encode", None),
        ("encoder-b", b.url(), "encode", None),
        ("pd", pd.url(), "both", Some("discover".to_owned())),
    ])
    .await;
    feeds_connected(&r, &["pd"]).await;
    epd_through_the_router(&r, pd, dir.path()).await;
    eprintln!("E/PD: {:.0} s in all", started.elapsed().as_secs_f64());
}
