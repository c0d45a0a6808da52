//! Precise routing from a worker's own KV events, through the real proxy: a publisher on 127.0.0.1
//! (a ZMQ PUB in this test, encoding vLLM ≥ 0.24 map-form batches with rmpv) announces and evicts the
//! blocks of a prompt; the router's view of that worker follows.

use std::time::Duration;

use rmpv::Value;
use zeromq::{Socket, SocketSend};

use crate::harness::*;

fn s(v: &str) -> Value {
    Value::from(v)
}

/// A vLLM ≥ 0.24 batch `[ts, [events…], dp_rank]` stamped now, events as maps keyed by field name.
pub(crate) fn batch(events: Vec<Value>) -> Vec<u8> {
    batch_at(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64(), events)
}

/// The same batch with the engine timestamp `ts`.
pub(crate) fn batch_at(ts: f64, events: Vec<Value>) -> Vec<u8> {
    let mut buf = Vec::new();
    rmpv::encode::write_value(&mut buf, &Value::Array(vec![Value::F64(ts), Value::Array(events), Value::from(0)]))
        .unwrap();
    buf
}

pub(crate) fn stored(hashes: &[u64], tokens: &[u64], block_size: u64) -> Value {
    Value::Map(vec![
        (s("type"), s("BlockStored")),
        (s("block_hashes"), Value::Array(hashes.iter().map(|&h| Value::from(h)).collect())),
        (s("parent_block_hash"), Value::Nil),
        (s("token_ids"), Value::Array(tokens.iter().map(|&t| Value::from(t)).collect())),
        (s("block_size"), Value::from(block_size)),
        (s("lora_id"), Value::Nil),
        (s("medium"), s("GPU")),
        (s("lora_name"), Value::Nil),
    ])
}

fn removed(hashes: &[u64]) -> Value {
    Value::Map(vec![
        (s("type"), s("BlockRemoved")),
        (s("block_hashes"), Value::Array(hashes.iter().map(|&h| Value::from(h)).collect())),
        (s("medium"), s("GPU")),
    ])
}

pub(crate) async fn debug(url: &str, body: &[u8]) -> serde_json::Value {
    debug_route(url, "tokens=true", body, None).await
}

/// Polls `/debug/route` until worker 0's event-sourced overlap is `want` blocks.
async fn wait_for_event_overlap(url: &str, body: &[u8], want: u64) -> serde_json::Value {
    for _ in 0..200 {
        let v = debug(url, body).await;
        if v["overlap_sources"][0]["events"].as_u64() == Some(want) {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("worker 0 never reached {want} event blocks: {}", debug(url, body).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_index_follows_a_workers_stores_and_evictions() {
    let mut publisher = zeromq::PubSocket::new();
    let endpoint = publisher.bind("tcp://127.0.0.1:0").await.unwrap().to_string();
    let sims = sims(2, fast).await;
    let toml = format!(
        "[server]\nhealth_interval_ms = 0\n[[workers]]\nname = {:?}\nurl = {:?}\nkv_events = {endpoint:?}\n[[workers]]\nname = {:?}\nurl = {:?}\n",
        sims[0].name(),
        sims[0].url(),
        sims[1].name(),
        sims[1].url()
    );
    let c = proxy(sims, &toml).await;
    let body = chat_body(&[], &"Tell me a long story about routers and caches. ".repeat(8), false);
    let plan = debug(&c.url, &body).await;
    let ids: Vec<u64> = serde_json::from_value(plan["token_ids"].clone()).unwrap();
    let blocks = ids.len() / 16;
    assert!(blocks >= 4, "{}", ids.len());
    let hashes: Vec<u64> = (0..blocks as u64).map(|i| 0xE000 + i).collect();
    let event = batch(vec![stored(&hashes, &ids[..blocks * 16], 16)]);
    let msg = |seq: u64, payload: Vec<u8>| {
        let frames =
            vec![bytes::Bytes::new(), bytes::Bytes::from(seq.to_be_bytes().to_vec()), bytes::Bytes::from(payload)];
        zeromq::ZmqMessage::try_from(frames).unwrap()
    };

    // The SUB joins after a moment (ZMQ slow joiner): publish seq 0 until the worker's view follows.
    let mut seen = None;
    for _ in 0..100 {
        publisher.send(msg(0, event.clone())).await.unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        let v = debug(&c.url, &body).await;
        if v["overlap_sources"][0]["events"].as_u64() == Some(blocks as u64) {
            seen = Some(v);
            break;
        }
    }
    let v = seen.expect("the worker's BlockStored reached the index");
    assert_eq!(v["worker"], c.sims[0].name(), "the worker holding the prompt wins");
    assert_eq!(v["overlap_blocks"][1], 0);

    // The worker evicts the second half: the overlap stops where the chain breaks.
    publisher.send(msg(1, batch(vec![removed(&hashes[blocks / 2..])]))).await.unwrap();
    wait_for_event_overlap(&c.url, &body, (blocks / 2) as u64).await;

    // A sequence going back to 0 is a restart: everything the worker held is forgotten.
    publisher.send(msg(0, batch(vec![]))).await.unwrap();
    let v = wait_for_event_overlap(&c.url, &body, 0).await;
    assert_eq!(v["overlap_blocks"][0], 0);
    let page = metrics_text(&c.url).await;
    let worker = format!("worker=\"{}\"", c.sims[0].name());
    assert!(metric(&page, "mmrouter_kv_events_total", &format!("{worker},kind=\"stored\"")) >= blocks as f64, "{page}");
    assert!(metric(&page, "mmrouter_kv_event_sequence_total", &format!("{worker},kind=\"restart\"")) >= 1.0, "{page}");
    crate::metrics_format::promtool_accepts(&page);
}

/// Posts `body` to a proxy's chat endpoint and reads the answer to its end.
async fn chat(url: &str, body: &[u8]) {
    let resp = post(url, body.to_vec()).await;
    let status = resp.status();
    let text = resp.text().await.unwrap();
    assert!(status.is_success(), "{status} {text}");
}

/// Polls until `f` holds for the event-fed proxy's plan of `body`.
async fn until(url: &str, body: &[u8], what: &str, f: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    for _ in 0..300 {
        let v = debug(url, body).await;
        if f(&v) {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("never {what}: {}", debug(url, body).await);
}

/// The simulator publishes real KV events for what it caches. Two routers front it: `precise` follows
/// its events, `guess` only remembers what it routed. The precise one learns traffic it never saw
/// (image blocks included, named by the spliced uuid), forgets what the worker evicts, and forgets
/// everything when the worker restarts; the guessing one keeps predicting an evicted prompt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn precise_routing_follows_the_simulators_cache() {
    let sim = sims(1, |o| {
        fast(o);
        o.kv_blocks = 24;
        o.kv_events = Some("tcp://127.0.0.1:0".into());
    })
    .await
    .remove(0);
    let (name, url, endpoint) =
        (sim.name().to_owned(), sim.url().to_owned(), sim.kv_events_endpoint().unwrap().to_owned());
    let worker =
        |extra: &str| format!("[server]\nhealth_interval_ms = 0\n[[workers]]\nname = {name:?}\nurl = {url:?}\n{extra}");
    let precise = proxy(vec![], &worker(&format!("kv_events = {endpoint:?}\n"))).await;
    let guess = proxy(vec![sim], &worker("")).await;
    let sim = &guess.sims[0];
    for _ in 0..300 {
        if sim.kv_event_subscriptions() >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(sim.kv_event_subscriptions() >= 1, "the precise router never subscribed");

    // A, with an image, goes through the guessing router only.
    let a = chat_body(&[png_data_url(224, 224, 3)], &unique("describe the picture"), false);
    chat(&guess.url, &a).await;
    let plan = debug(&precise.url, &a).await;
    let blocks = plan["token_ids"].as_array().unwrap().len() / 16;
    assert!(blocks >= 4, "{plan}");
    let v = until(&precise.url, &a, "learnt A from events", |v| {
        v["overlap_sources"][0]["events"].as_u64() == Some(blocks as u64)
    })
    .await;
    assert_eq!(v["overlap_sources"][0]["pending"], 0, "{v}");
    assert_eq!(v["route"], "exact", "{v}");
    assert_eq!(debug(&guess.url, &a).await["overlap_sources"][0]["approximate"], blocks as u64);

    // B, long enough to fill the 24-block cache, goes through the precise router: the worker evicts A
    // except the system-prompt block B shares (B hit it, so it is the most recently used).
    let b = chat_body(&[], &(0..400).map(|i| format!("w{i}")).collect::<Vec<_>>().join(" "), false);
    chat(&precise.url, &b).await;
    until(&precise.url, &a, "forgot the evicted A", |v| v["overlap_blocks"][0] == 1).await;
    assert_eq!(debug(&guess.url, &a).await["overlap_blocks"][0], blocks as u64, "the guess still predicts A");
    let before = sim.stats().cached_tokens;
    chat(&guess.url, &a).await;
    assert_eq!(sim.stats().cached_tokens, before + 16, "the worker held only A's first block");

    // A is cached again; the worker restarts (sequence back to 0, no AllBlocksCleared): the next batch
    // tells the precise router, which drops everything it had for the worker.
    until(&precise.url, &a, "relearnt A", |v| v["overlap_sources"][0]["events"].as_u64() == Some(blocks as u64)).await;
    let resp = client().post(format!("{}/sim/restart", sim.url())).send().await.unwrap();
    assert!(resp.status().is_success());
    let c = chat_body(&[], &unique("after the restart"), false);
    chat(&guess.url, &c).await;
    let c_blocks = debug(&precise.url, &c).await["blocks"].as_u64().unwrap();
    let v = until(&precise.url, &c, "learnt C", |v| v["overlap_sources"][0]["events"].as_u64() == Some(c_blocks)).await;
    assert_eq!(v["overlap_sources"][0]["pending"], 0);
    assert_eq!(debug(&precise.url, &a).await["overlap_blocks"][0], 1, "only the block A shares with C");
    let page = metrics_text(&precise.url).await;
    let events = metric(&page, "mmrouter_index_blocks_by_source", "source=\"events\"");
    assert_eq!(events, c_blocks as f64, "everything before the restart was dropped:\n{page}");
    let w = format!("worker=\"{name}\"");
    assert!(metric(&page, "mmrouter_kv_event_sequence_total", &format!("{w},kind=\"restart\"")) >= 1.0, "{page}");
    assert_eq!(metric(&page, "mmrouter_kv_events_total", &format!("{w},kind=\"unmatchable\"")), 0.0, "{page}");
}

/// Starts one sim publishing `format` events and a proxy whose single worker runs `engine` and follows
/// them; `extra` is TOML placed before the worker (sections allowed).
async fn event_cluster(format: mmrouter_sim::KvEventsFormat, engine: &str, extra: &str) -> Cluster {
    let sim = sims(1, |o| {
        fast(o);
        o.kv_events = Some("tcp://127.0.0.1:0".into());
        o.kv_events_format = format;
    })
    .await
    .remove(0);
    let toml = format!(
        "{extra}\n[server]\nhealth_interval_ms = 0\n[[workers]]\nname = {:?}\nurl = {:?}\nengine = {engine:?}\nkv_events = {:?}\n",
        sim.name(),
        sim.url(),
        sim.kv_events_endpoint().unwrap()
    );
    let c = proxy(vec![sim], &toml).await;
    for _ in 0..300 {
        if c.sims[0].kv_event_subscriptions() >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    c
}

/// Sends `body` through `c` and waits until its text blocks are confirmed by events; asserts the image
/// blocks stay approximate (what the router routed), none pending, the whole prompt still predicted.
async fn image_blocks_stay_approximate(c: &Cluster, body: &[u8]) -> u64 {
    let plan = debug(&c.url, body).await;
    assert_eq!(plan["route"], "exact", "{plan}");
    let (blocks, image_from) =
        (plan["blocks"].as_u64().unwrap(), plan["image_spans"][0]["offset"].as_u64().unwrap() / 16);
    assert!(image_from >= 1 && blocks > image_from + 2, "{plan}");
    chat(&c.url, body).await;
    let v = until(&c.url, body, "confirmed the text blocks", |v| {
        v["overlap_sources"][0]["events"].as_u64() == Some(image_from)
    })
    .await;
    assert_eq!(v["overlap_sources"][0]["pending"], 0, "{v}");
    assert_eq!(v["overlap_sources"][0]["approximate"], blocks - image_from, "{v}");
    assert_eq!(v["overlap_blocks"][0], blocks, "{v}");
    blocks - image_from
}

/// An SGLang worker's events name image tokens by pad values the router cannot compute: its text blocks
/// are confirmed by events, the image blocks stay what the router routed (approximate), so an image
/// prompt keeps its predicted overlap there instead of losing it when the pending entries expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_image_blocks_stay_approximate() {
    let c = event_cluster(mmrouter_sim::KvEventsFormat::Sglang, "sglang", "").await;
    let a = chat_body(&[png_data_url(224, 224, 9)], &unique("what colour is it"), false);
    let image_blocks = image_blocks_stay_approximate(&c, &a).await;
    let page = metrics_text(&c.url).await;
    let w = format!("worker=\"{}\"", c.sims[0].name());
    assert_eq!(
        metric(&page, "mmrouter_kv_events_total", &format!("{w},kind=\"unmatchable\"")),
        image_blocks as f64,
        "{page}"
    );
}

/// With per-request `mm_processor_kwargs` vLLM hashes the uuid together with them, so its events will
/// not name the image as the router does: the image blocks are recorded approximate from the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_image_blocks_with_request_kwargs_stay_approximate() {
    let c = event_cluster(mmrouter_sim::KvEventsFormat::VllmMap, "vllm", "").await;
    let body = chat_body(&[png_data_url(224, 224, 11)], &unique("kwargs"), false);
    let mut v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    v["mm_processor_kwargs"] = serde_json::json!({"max_pixels": 1003520});
    let body = serde_json::to_vec(&v).unwrap();
    image_blocks_stay_approximate(&c, &body).await;
}

/// A fallback's affinity tail (the prompt past its first image, unexpanded) can never be announced by
/// the engine: on a vLLM worker with events its text prefix is confirmed by events and the tail is
/// recorded approximate, never pending (pending entries would expire and the affinity with them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallbacks_affinity_tail_stays_approximate_on_vllm() {
    let c = event_cluster(mmrouter_sim::KvEventsFormat::VllmMap, "vllm", "[media]\nmax_pixels = 1000000").await;
    let body = chat_body(&[png_data_url(1200, 1000, 12)], &unique("too large for the router"), false);
    let plan = debug(&c.url, &body).await;
    assert_eq!(plan["route"], "text_prefix", "{plan}");
    let (blocks, text) = (plan["blocks"].as_u64().unwrap(), plan["text_blocks"].as_u64().unwrap());
    assert!(text >= 1 && blocks > text, "{plan}");
    chat(&c.url, &body).await;
    let v =
        until(&c.url, &body, "confirmed the text prefix", |v| v["overlap_sources"][0]["events"].as_u64() == Some(text))
            .await;
    assert_eq!(v["overlap_sources"][0]["pending"], 0, "{v}");
    assert_eq!(v["overlap_sources"][0]["approximate"], blocks - text, "{v}");
    assert_eq!(v["overlap_blocks"][0], blocks, "{v}");
}

/// Issue 20: feeds were started once, for the first workers: a worker added at run time had none,
/// and a removed one kept its feed (its blocks kept entering the index). Feeds now live with their
/// worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_added_at_run_time_gets_its_feed_and_a_removed_one_loses_it() {
    let mut publisher = zeromq::PubSocket::new();
    let endpoint = publisher.bind("tcp://127.0.0.1:0").await.unwrap().to_string();
    let mut all = sims(2, fast).await;
    let extra = all.pop().unwrap();
    let c = cluster_with(all, "[server]\nhealth_interval_ms = 0").await;
    let body = chat_body(&[], &"Tell me a long story about routers and caches. ".repeat(8), false);
    let ids: Vec<u64> = serde_json::from_value(debug(&c.url, &body).await["token_ids"].clone()).unwrap();
    let blocks = ids.len() / 16;
    let msg = |seq: u64, payload: Vec<u8>| {
        let frames =
            vec![bytes::Bytes::new(), bytes::Bytes::from(seq.to_be_bytes().to_vec()), bytes::Bytes::from(payload)];
        zeromq::ZmqMessage::try_from(frames).unwrap()
    };
    let hashes: Vec<u64> = (0..blocks as u64).map(|i| 0xF000 + i).collect();
    let event = batch(vec![stored(&hashes, &ids[..blocks * 16], 16)]);

    let pool = c.state.pools()[0].clone();
    let add = format!("{}/admin/pools/{}/workers", c.url, pool.name);
    let new = serde_json::json!({"name": extra.name(), "url": extra.url(), "kv_events": endpoint});
    let r = client().post(add).json(&new).send().await.unwrap();
    assert_eq!(r.status(), 201);
    let id = pool.router.find(extra.name()).unwrap();
    assert_eq!(pool.feeds().len(), 1, "the added worker's feed started");
    let mut held = 0;
    for _ in 0..100 {
        publisher.send(msg(0, event.clone())).await.unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        held = pool.router.events_held_by(id);
        if held == blocks {
            break;
        }
    }
    assert_eq!(held, blocks, "the added worker's events reached the index");

    let r = client().delete(format!("{}/admin/workers/{}", c.url, extra.name())).send().await.unwrap();
    assert_eq!(r.status(), 202);
    for _ in 0..200 {
        if pool.feeds().is_empty() && pool.router.live_workers().len() == 1 && pool.router.held_by(id) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(pool.feeds().is_empty(), "the removed worker's feed stopped");
    let more: Vec<u64> = (0..blocks as u64).map(|i| 0xF800 + i).collect();
    for seq in 1..10 {
        publisher.send(msg(seq, batch(vec![stored(&more, &ids[..blocks * 16], 16)]))).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(pool.router.held_by(id), 0, "a removed worker's blocks no longer enter the index");
    assert_eq!(pool.router.index_entries().events, 0);
    let page = metrics_text(&c.url).await;
    assert!(!page.contains(&format!("worker=\"{}\"", extra.name())), "its series are gone");
    crate::metrics_format::promtool_accepts(&page);
}

/// `kv_events = "discover"` against the simulator, which answers `/kv_event_sources` as vLLM 0.32–0.34
/// do (a map keyed by data-parallel rank): the router finds the publisher and follows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_reads_vllms_rank_keyed_document() {
    let sim = sims(1, |o| {
        fast(o);
        o.kv_events = Some("tcp://127.0.0.1:0".into());
    })
    .await
    .remove(0);
    let doc: serde_json::Value =
        client().get(format!("{}/kv_event_sources", sim.url())).send().await.unwrap().json().await.unwrap();
    assert_eq!(doc["0"]["endpoint"], sim.kv_events_endpoint().unwrap(), "{doc}");
    assert_eq!(doc["0"]["publisher"], "zmq", "{doc}");
    let toml = format!(
        "[server]\nhealth_interval_ms = 0\n[[workers]]\nname = {:?}\nurl = {:?}\nkv_events = \"discover\"\n",
        sim.name(),
        sim.url()
    );
    let c = proxy(vec![sim], &toml).await;
    // Discovery first, then the subscription: events published before it joins are not seen.
    for _ in 0..500 {
        if c.sims[0].kv_event_subscriptions() >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(c.sims[0].kv_event_subscriptions() >= 1, "the router never subscribed to the discovered endpoint");
    let a = chat_body(&[], &unique("discovered"), false);
    chat(&c.url, &a).await;
    let blocks = debug(&c.url, &a).await["blocks"].as_u64().unwrap();
    until(&c.url, &a, "learnt A from discovered events", |v| {
        v["overlap_sources"][0]["events"].as_u64() == Some(blocks)
    })
    .await;
    let page = metrics_text(&c.url).await;
    assert!(!page.contains("discovery_bad_shape"), "{page}");
}
