//! The real-engine suite: vLLM's CPU build serving tiny random-weight checkpoints of real model files,
//! with prefix caching, prompt-token details and KV events, behind the router. Every claim the
//! simulator-backed tests make about engines is checked here against the engine itself: token ids
//! (vLLM's own renderer), prompt-token counts, cached tokens after a repeat, image uuids in the
//! engine's events, traffic around the router, evictions, an engine restart, a fallback body byte for
//! byte, discovery, `mmrouter doctor`'s lines, a LoRA adapter's keys and routing (`lora.rs`) and the
//! Responses API (`responses.rs`).
//!
//! Ignored by a plain `cargo test` (it needs a 6 GB venv and minutes per engine start): run
//! `tests/engine/run.sh`, which installs vLLM, builds the checkpoints and runs these one at a time.

mod client;
mod corpus;
mod disagg;
mod engine;
mod lora;
mod responses;
mod tee;
mod video;

use std::time::Duration;

use mmrouter::cli::doctor::{diagnose, Line, Status};
use mmrouter::config::Settings;
use serde_json::Value;

use client::*;
use engine::{Engine, EngineOpts, Events};

const BLOCK: u64 = 32;

fn opts(name: &'static str, checkpoint: &'static str) -> EngineOpts {
    EngineOpts {
        name,
        checkpoint,
        block_size: BLOCK as u32,
        events: Events::Loopback,
        extra: Vec::new(),
        env: Vec::new(),
    }
}

/// Starts engines together (their startups overlap) and waits for all.
async fn engines(all: Vec<EngineOpts>) -> Vec<Engine> {
    let mut engines: Vec<Engine> = all.into_iter().map(Engine::spawn).collect();
    for e in &mut engines {
        e.ready().await;
    }
    engines
}

/// A router on 127.0.0.1 for `toml`; its URL.
async fn router(toml: &str) -> String {
    let cfg = Settings::parse(toml).expect("valid suite config");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (addr, _state) = mmrouter::server::spawn(cfg, listener).await.expect("router starts");
    format!("http://{addr}")
}

fn pool_toml(model: &str, workers: &[(&str, String, String)], extra: &str) -> String {
    let mut t =
        format!("[server]\nhealth_interval_ms = 1000\n{extra}\n[model]\ndir = {model:?}\nblock_size = {BLOCK}\n");
    for (name, url, events) in workers {
        t.push_str(&format!(
            "[[workers]]\nname = {name:?}\nurl = {url:?}\nengine = \"vllm\"\nkv_events = {events:?}\n"
        ));
    }
    t
}

/// Waits until the router's feed of every worker is connected (discovery done, subscription up).
async fn feeds_connected(router: &str, workers: &[&str]) {
    for _ in 0..300 {
        let page = metrics(router).await;
        if workers.iter().all(|w| metric(&page, "mmrouter_kv_event_connected", &format!("worker=\"{w}\"")) == 1.0) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the router's feeds never connected:\n{}", metrics(router).await);
}

fn failed(lines: &[Line]) -> Vec<String> {
    lines
        .iter()
        .filter(|l| l.status == Status::Fail)
        .map(|l| format!("{} {}: {}", l.worker, l.check, l.detail))
        .collect()
}

fn line<'a>(lines: &'a [Line], worker: &str, check: &str) -> &'a Line {
    lines
        .iter()
        .find(|l| l.worker == worker && l.check == check)
        .unwrap_or_else(|| panic!("no {check} for {worker}: {lines:#?}"))
}

/// Router ids = the engine's render ids; predicted prompt tokens = `usage`; after a repeat, the router's
/// expected cached tokens = `cached_tokens`. Returns each chat's plan.
async fn corpus_matches(router: &str, engine_url: &str, model: &str) -> Vec<(String, Value)> {
    let mut plans = Vec::new();
    for (name, body) in corpus::chats(model) {
        let plan = debug(router, &body).await;
        assert!(matches!(plan["route"].as_str(), Some("exact" | "no_media")), "{name}: {plan}");
        let (theirs, placeholders) = render(engine_url, &body).await;
        assert_eq!(ids(&plan), theirs, "{name}: router ids vs the engine's render");
        assert_eq!(spans(&plan), placeholders, "{name}: image spans");
        let first = chat(router, &body).await;
        let n = plan["prompt_tokens"].as_u64().unwrap();
        assert_eq!(first.prompt_tokens(), n, "{name}: predicted prompt tokens vs usage");
        let worker = first.worker.clone().expect("the router names the worker");
        let settled = until(router, &body, &format!("{name}: events confirm the blocks"), |v| {
            let w = index_of(v, &worker);
            v["overlap_sources"][w]["pending"] == 0 && v["overlap_sources"][w]["events"].as_u64() >= Some(n / BLOCK)
        })
        .await;
        let w = index_of(&settled, &worker);
        let expected = reusable(settled["overlap_blocks"][w].as_u64().unwrap() * BLOCK, n, BLOCK);
        let again = chat(router, &body).await;
        assert_eq!(again.worker.as_deref(), Some(worker.as_str()), "{name}: the repeat goes where the blocks are");
        assert_eq!(again.cached_tokens(), expected, "{name}: expected cached tokens vs the engine's");
        assert_eq!(expected, (n - 1) / BLOCK * BLOCK, "{name}: the whole prompt but its last block");
        eprintln!("{name}: {n} tokens, ids equal, {expected} cached on the repeat ({worker})");
        plans.push((name.to_owned(), plan));
    }
    plans
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs vLLM: tests/engine/run.sh"]
async fn qwen25_vl_pool_of_two_engines() {
    // B's cache is small (160 blocks) so that it evicts.
    let mut b_opts = opts("b", "qwen2.5-vl");
    b_opts.extra = vec!["--num-gpu-blocks-override".into(), "160".into()];
    let mut es = engines(vec![opts("a", "qwen2.5-vl"), b_opts]).await;
    let (a_url, b_url) = (es[0].url(), es[1].url());
    let (a_watch, b_watch) =
        (Watch::start(&es[0].events_endpoint()).await, Watch::start(&es[1].events_endpoint()).await);
    let workers = [("a", a_url.clone(), "discover".to_owned()), ("b", b_url.clone(), "discover".to_owned())];
    let toml = pool_toml("qwen2.5-vl", &workers, "");
    let r = router(&toml).await;
    feeds_connected(&r, &["a", "b"]).await; // `kv_events = "discover"` against the real document

    let lines = diagnose(&Settings::parse(&toml).unwrap(), Duration::from_secs(60)).await.unwrap();
    assert!(failed(&lines).is_empty(), "doctor on a healthy pool: {:#?}", failed(&lines));
    for w in ["a", "b"] {
        for check in ["render_image", "uuid_in_events", "cached_tokens", "kv_events_flowing"] {
            assert_eq!(line(&lines, w, check).status, Status::Ok, "{w} {check}");
        }
    }

    let plans = corpus_matches(&r, &a_url, "qwen2.5-vl").await;
    image_uuids_reach_the_engine(&r, &plans, [&a_watch, &b_watch]).await;
    traffic_around_the_router_is_learnt(&r, &b_url).await;
    a_fallback_reaches_the_engine_byte_for_byte(&a_url).await;
    evictions_are_followed(&r, &b_url, &b_watch).await;
    a_restart_is_followed(&r, &mut es[1]).await;
}

/// Every image the router accounted is named by its uuid in some engine's events; a client's own
/// uuid never reaches an engine (the router writes its own over it).
async fn image_uuids_reach_the_engine(r: &str, plans: &[(String, Value)], watches: [&Watch; 2]) {
    let named = |id: &str| watches.iter().any(|w| w.published().mm_ids.contains(id));
    for (name, plan) in plans {
        for image in plan["images"].as_array().unwrap() {
            let hash = image["hash"].as_str().unwrap();
            assert!(named(hash), "{name}: image {hash} not in the engines' extra_keys");
        }
    }
    let n = corpus::nonce();
    let body = corpus::body(
        "qwen2.5-vl",
        serde_json::json!([{ "role": "user", "content": [
            { "type": "text", "text": format!("Case {n}: a client names its image") },
            { "type": "image_url", "image_url": { "url": corpus::image("rocket.jpg") }, "uuid": format!("client-{n}") }]}]),
        &[],
    );
    let plan = debug(r, &body).await;
    let ours = plan["images"][0]["hash"].as_str().unwrap().to_owned();
    let answer = chat(r, &body).await;
    assert_eq!(answer.route.as_deref(), Some("exact"));
    until(r, &body, "the client's image named in events", |_| named(&ours)).await;
    assert!(!named(&format!("client-{n}")), "a client uuid reached the engine");
    eprintln!("uuids: every accounted image named by the router's uuid; the client's never");
}

/// A chat sent to engine B directly, never through the router, is learnt from B's events.
async fn traffic_around_the_router_is_learnt(r: &str, b_url: &str) {
    let body = corpus::chats("qwen2.5-vl").swap_remove(1).1;
    chat(b_url, &body).await;
    let plan = debug(r, &body).await;
    let (b, blocks) = (index_of(&plan, "b"), plan["blocks"].as_u64().unwrap());
    until(r, &body, "learnt B's own traffic", |v| v["overlap_sources"][b]["events"].as_u64() == Some(blocks)).await;
    eprintln!("around the router: {blocks} blocks learnt from B's events");
}

/// Through a router whose media limit sends a two-image chat to the fallback route, the engine
/// receives the client's bytes unchanged (no uuid spliced) and answers.
async fn a_fallback_reaches_the_engine_byte_for_byte(a_url: &str) {
    let tee = tee::Tee::start(a_url).await;
    let toml = pool_toml("qwen2.5-vl", &[("a", tee.url(), "discover".to_owned())], "[media]\nmax_images = 1\n");
    let toml = toml.replace("kv_events = \"discover\"\n", "");
    let r = router(&toml).await;
    let body = corpus::chats("qwen2.5-vl").swap_remove(3).1; // two images
    let answer = chat(&r, &body).await;
    assert_eq!(answer.route.as_deref(), Some("text_prefix"));
    assert!(answer.prompt_tokens() > 0);
    assert!(tee.received_contains(&body), "the body did not reach the engine byte for byte");
    let page = metrics(&r).await;
    assert_eq!(metric(&page, "mmrouter_mm_fallback_total", "reason=\"too_many_images\""), 1.0, "{page}");
    eprintln!("fallback: {} body bytes reached the engine unchanged", body.len());
    the_next_turn_weighs_the_images_as_the_engine_counted_them(&r).await;
}

/// The conversation's next turn: the router learnt from the engine's `usage` how many tokens the
/// unaccounted images took, and its prediction of what the engine holds (overlapping blocks + those
/// tokens) is what the engine then reuses, to within one block.
async fn the_next_turn_weighs_the_images_as_the_engine_counted_them(r: &str) {
    // Two images (over the router's media.max_images), then enough text that the last placeholder lies
    // in a whole block: the router learns only against keys that cover every image's place.
    let question: String = (0..40).map(|i| format!("detail {i};")).collect::<Vec<_>>().join(" ");
    let turn1 = corpus::body(
        "qwen2.5-vl",
        serde_json::json!([{ "role": "user", "content": [
            { "type": "image_url", "image_url": { "url": corpus::image("rocket.jpg") } },
            { "type": "text", "text": format!("Case {}: compare with", corpus::nonce()) },
            { "type": "image_url", "image_url": { "url": corpus::image("grace_hopper.jpg") } },
            { "type": "text", "text": question }]}]),
        &[],
    );
    let planned1 = debug(r, &turn1).await["prompt_tokens"].as_u64().unwrap();
    let answer = chat(r, &turn1).await;
    assert_eq!(answer.route.as_deref(), Some("text_prefix"));
    let mut v: Value = serde_json::from_slice(&turn1).unwrap();
    let messages = v["messages"].as_array_mut().unwrap();
    messages.push(serde_json::json!({"role": "assistant", "content": "Two pictures."}));
    messages.push(serde_json::json!({"role": "user", "content": "Which one has more red in it?"}));
    let turn2 = serde_json::to_vec(&v).unwrap();
    let plan = debug(r, &turn2).await;
    assert_eq!(plan["route"], "text_prefix");
    let unseen = answer.prompt_tokens() - planned1;
    assert_eq!(plan["unseen_tokens"]["total"].as_u64(), Some(unseen), "{plan}");
    let a = index_of(&plan, "a");
    let bs = plan["block_size"].as_u64().unwrap();
    let blocks = plan["overlap_blocks"][a].as_u64().unwrap();
    let held = blocks * bs + plan["unseen_tokens"]["per_worker"][a].as_u64().unwrap();
    let cached = chat(r, &turn2).await.cached_tokens();
    assert!(held.abs_diff(cached) < bs, "the router predicted {held} tokens held, the engine reused {cached}");
    eprintln!("fallback, next turn: {unseen} unseen tokens learnt; predicted {held} held, the engine reused {cached}");
}

/// Engine B's cache holds 160 blocks; long unique chats sent to it directly make it evict. Before each
/// repeat, the router's prediction of what B still holds equals what B then reuses.
async fn evictions_are_followed(r: &str, b_url: &str, b_watch: &Watch) {
    let bodies: Vec<Vec<u8>> = (0..12).map(|_| corpus::chats("qwen2.5-vl").swap_remove(1).1).collect();
    for body in &bodies {
        chat(b_url, body).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(b_watch.published().removed > 0, "B never evicted");
    let mut partial = 0;
    for (i, body) in bodies.iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let plan = debug(r, body).await;
        let (b, n) = (index_of(&plan, "b"), plan["prompt_tokens"].as_u64().unwrap());
        let expected = reusable(plan["overlap_blocks"][b].as_u64().unwrap() * BLOCK, n, BLOCK);
        let again = chat(b_url, body).await;
        assert_eq!(again.cached_tokens(), expected, "chat {i} after evictions: predicted vs reused");
        if expected < (n - 1) / BLOCK * BLOCK {
            partial += 1;
        }
    }
    assert!(partial > 0, "no prediction saw an eviction");
    eprintln!(
        "evictions: {} blocks removed; {partial} of 12 repeats predicted partly evicted, all exact",
        b_watch.published().removed
    );
}

/// B restarts: the router drops what B held, and predicts B's new cache exactly again.
async fn a_restart_is_followed(r: &str, b: &mut Engine) {
    let body = corpus::chats("qwen2.5-vl").swap_remove(1).1;
    chat(&b.url(), &body).await;
    let plan = debug(r, &body).await;
    let (bi, blocks) = (index_of(&plan, "b"), plan["blocks"].as_u64().unwrap());
    until(r, &body, "learnt before the restart", |v| v["overlap_sources"][bi]["events"].as_u64() == Some(blocks)).await;
    b.restart().await;
    let after = corpus::chats("qwen2.5-vl").swap_remove(1).1;
    chat(&b.url(), &after).await;
    until(r, &body, "dropped B's blocks after its restart", |v| v["overlap_sources"][bi]["events"] == 0).await;
    let page = metrics(r).await;
    let resets: f64 = ["restart", "reconnect"]
        .iter()
        .map(|k| metric(&page, "mmrouter_kv_event_sequence_total", &format!("worker=\"b\",kind=\"{k}\"")))
        .sum();
    assert!(resets >= 1.0, "{page}");
    let plan =
        until(r, &after, "learnt after the restart", |v| v["overlap_sources"][bi]["events"].as_u64() >= Some(1)).await;
    let n = plan["prompt_tokens"].as_u64().unwrap();
    let expected = reusable(plan["overlap_blocks"][bi].as_u64().unwrap() * BLOCK, n, BLOCK);
    assert_eq!(chat(&b.url(), &after).await.cached_tokens(), expected, "after the restart");
    eprintln!("restart: B's blocks dropped, {expected} cached tokens predicted and reused after");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs vLLM: tests/engine/run.sh"]
async fn qwen3_vl_engine_and_a_misconfigured_one() {
    let template = std::env::temp_dir().join(format!("mmrouter-qwen3-template-{}.jinja", std::process::id()));
    let qwen3: Value = serde_json::from_slice(
        &std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/config/models/qwen3-vl/tokenizer_config.json")).unwrap(),
    )
    .unwrap();
    std::fs::write(&template, qwen3["chat_template"].as_str().unwrap()).unwrap();
    // D: a Qwen2.5-VL engine with another block size, events that connect out, another chat template.
    let mut d = opts("d", "qwen2.5-vl");
    d.block_size = 64;
    d.events = Events::ConnectOut;
    d.extra = vec!["--chat-template".into(), template.display().to_string()];
    let es = engines(vec![opts("c", "qwen3-vl"), d]).await;
    let (c, d) = (&es[0], &es[1]);

    let toml = pool_toml("qwen3-vl", &[("c", c.url(), "discover".to_owned())], "");
    let r = router(&toml).await;
    feeds_connected(&r, &["c"]).await;
    let lines = diagnose(&Settings::parse(&toml).unwrap(), Duration::from_secs(60)).await.unwrap();
    assert!(failed(&lines).is_empty(), "doctor on Qwen3-VL: {:#?}", failed(&lines));
    corpus_matches(&r, &c.url(), "qwen3-vl").await;

    let bad = pool_toml("qwen2.5-vl", &[("d", d.url(), d.events_endpoint())], "");
    let lines = diagnose(&Settings::parse(&bad).unwrap(), Duration::from_secs(60)).await.unwrap();
    for check in ["block_size", "kv_events_bound", "render_text", "render_image", "render_tools"] {
        let l = line(&lines, "d", check);
        assert_eq!(l.status, Status::Fail, "{check} should fail on D: {lines:#?}");
        assert!(l.hint.is_some(), "{check} has a hint");
    }
    assert!(line(&lines, "d", "block_size").hint.as_deref().unwrap().contains("--block-size 32"));
    assert!(line(&lines, "d", "kv_events_bound").hint.as_deref().unwrap().contains("binds its PUB socket only when"));
    for check in ["reachable", "engine", "served_model", "prefix_caching"] {
        assert_eq!(line(&lines, "d", check).status, Status::Ok, "{check} on D: {lines:#?}");
    }
    eprintln!(
        "doctor on the misconfigured engine:\n{}",
        lines
            .iter()
            .filter(|l| l.status == Status::Fail)
            .map(|l| format!("  {} FAIL {}", l.check, l.detail))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let _ = std::fs::remove_file(template);
}
