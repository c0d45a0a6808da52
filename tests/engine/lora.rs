//! LoRA adapters against the real engine: a random adapter made offline (`tests/engine/lora_adapter.py`,
//! built by `prepare.sh` beside the checkpoints) served by one of two Qwen2.5-VL engines.
//!
//! * The router's block keys for an adapter's requests are the engine's: every block of the router's
//!   plan is confirmed by the engine's own KV events, which name the adapter; a resend's
//!   `cached_tokens` is the router's predicted overlap, and the same prompt shares nothing across the
//!   base model and the adapter (either way round), as the router predicts.
//! * Only the engine that serves the adapter (learnt from its `/v1/models`) gets the adapter's
//!   requests; the base model's still spread over both.
//! * The router's `/tokenize` answers what the engine answers, for the base model and the adapter.

use serde_json::{json, Value};

use crate::client::*;
use crate::corpus;
use crate::{engines, feeds_connected, opts, pool_toml, router, BLOCK};

/// The adapter's served name; the base model's is the checkpoint's.
pub const ADAPTER: &str = "tiny-lora";
const BASE: &str = "qwen2.5-vl";

/// `vllm serve` flags that serve the suite's adapter as [`ADAPTER`].
pub fn lora_flags() -> Vec<String> {
    let dir =
        std::env::var("MMROUTER_ENGINE_CHECKPOINTS").expect("MMROUTER_ENGINE_CHECKPOINTS: run tests/engine/run.sh");
    let path = std::path::Path::new(&dir).join("qwen2.5-vl-lora");
    assert!(
        path.join("adapter_config.json").is_file(),
        "no adapter in {}: run tests/engine/prepare.sh",
        path.display()
    );
    ["--enable-lora", "--max-lora-rank", "8", "--lora-modules", &format!("{ADAPTER}={}", path.display())]
        .map(str::to_owned)
        .to_vec()
}

/// Waits until the router lists `adapter` in its `/v1/models` (a health round read the engine's).
pub async fn adapter_learnt(router: &str, adapter: &str) {
    for _ in 0..300 {
        let v: Value = http().get(format!("{router}/v1/models")).send().await.unwrap().json().await.unwrap();
        if v["data"].as_array().is_some_and(|d| d.iter().any(|m| m["id"] == adapter)) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("the router never listed {adapter}");
}

/// `body` with its `model` replaced.
fn with_model(body: &[u8], model: &str) -> Vec<u8> {
    let mut v: Value = serde_json::from_slice(body).unwrap();
    v["model"] = model.into();
    serde_json::to_vec(&v).unwrap()
}

/// The worker's overlap in the plan: `(blocks, of them confirmed by events, pending)`.
fn overlap(plan: &Value, worker: &str) -> (u64, u64, u64) {
    let w = index_of(plan, worker);
    let sources = &plan["overlap_sources"][w];
    (
        plan["overlap_blocks"][w].as_u64().unwrap(),
        sources["events"].as_u64().unwrap(),
        sources["pending"].as_u64().unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs vLLM: tests/engine/run.sh"]
async fn lora_adapter_keys_and_routing_are_the_engines() {
    let mut a = opts("lora-a", BASE);
    a.extra = lora_flags();
    let es = engines(vec![a, opts("lora-b", BASE)]).await;
    let (a_url, b_url) = (es[0].url(), es[1].url());
    let a_watch = Watch::start(&es[0].events_endpoint()).await;
    let workers =
        [("lora-a", a_url.clone(), es[0].events_endpoint()), ("lora-b", b_url.clone(), es[1].events_endpoint())];
    let r = router(&pool_toml(BASE, &workers, "")).await;
    feeds_connected(&r, &["lora-a", "lora-b"]).await;
    adapter_learnt(&r, ADAPTER).await;

    adapter_keys_are_the_engines(&r, &a_url).await;
    assert!(a_watch.published().mm_ids.contains(ADAPTER), "the engine's events never named the adapter");
    // Base traffic for A alone goes through a router of its own: its image uuids are the ones this
    // router's keys name (traffic sent around any router is learnt only up to its first image).
    let only_a = router(&pool_toml(BASE, &workers[..1], "")).await;
    base_first_then_adapter(&r, &only_a).await;
    only_the_serving_engine_gets_the_adapter(&r).await;
    tokenize_like_the_engine(&r, &a_url).await;
}

/// Every corpus chat under the adapter: ids = the engine's render, predicted prompt tokens = usage, the
/// plan's every block confirmed by the engine's events, the resend's cached tokens = the predicted
/// overlap; the base model's same prompt is predicted and found uncached.
async fn adapter_keys_are_the_engines(r: &str, a_url: &str) {
    let (mut text, mut media) = (0, 0);
    // Each chat from a corpus of its own: a corpus shares its nonce, and so its first block.
    for i in 0..corpus::chats(ADAPTER).len() {
        let (name, body) = corpus::chats(ADAPTER).swap_remove(i);
        let plan = debug(r, &body).await;
        assert!(matches!(plan["route"].as_str(), Some("exact" | "no_media")), "{name}: {plan}");
        let (theirs, placeholders) = render(a_url, &body).await;
        assert_eq!(ids(&plan), theirs, "{name}: router ids vs the engine's render under the adapter");
        assert_eq!(spans(&plan), placeholders, "{name}: image spans");
        let (n, blocks) = (plan["prompt_tokens"].as_u64().unwrap(), plan["blocks"].as_u64().unwrap());
        let first = chat(r, &body).await;
        assert_eq!(first.worker.as_deref(), Some("lora-a"), "{name}: the adapter's engine");
        assert_eq!(first.prompt_tokens(), n, "{name}: predicted prompt tokens vs usage");
        // The router's keys for the adapter's blocks are the keys it derives from the engine's events.
        let settled = until(r, &body, &format!("{name}: the engine's events confirm the adapter's blocks"), |v| {
            let (_, events, pending) = overlap(v, "lora-a");
            pending == 0 && events == blocks
        })
        .await;
        let (held, _, _) = overlap(&settled, "lora-a");
        let expected = reusable(held * BLOCK, n, BLOCK);
        assert_eq!(expected, (n - 1) / BLOCK * BLOCK, "{name}: the whole prompt but its last block");
        let base = with_model(&body, BASE);
        let base_plan = debug(r, &base).await;
        assert_eq!(ids(&base_plan), ids(&plan), "{name}: the same prompt for the base model");
        assert_eq!(overlap(&base_plan, "lora-a"), (0, 0, 0), "{name}: the base model's keys differ from the adapter's");
        let again = chat(r, &body).await;
        assert_eq!(again.worker.as_deref(), Some("lora-a"));
        assert_eq!(again.cached_tokens(), expected, "{name}: predicted overlap vs cached tokens under the adapter");
        let across = chat(a_url, &base).await;
        assert_eq!(across.prompt_tokens(), n);
        assert_eq!(across.cached_tokens(), 0, "{name}: the base model reused the adapter's blocks");
        if plan["images"].as_array().is_some_and(|i| !i.is_empty()) {
            media += 1;
        } else {
            text += 1;
        }
        eprintln!("lora {name}: {n} tokens, {blocks} blocks confirmed by events; resend cached {expected} = predicted; base 0");
    }
    eprintln!("lora: adapter keys = the engine's for {text} text and {media} image chats");
}

/// The other way round: the base model's prompt sent first (to A through `only_a`, learnt from A's
/// events); the adapter's same prompt is predicted and found uncached; its resend hits its own blocks.
async fn base_first_then_adapter(r: &str, only_a: &str) {
    for i in [0, 2] {
        let (name, body) = corpus::chats(BASE).swap_remove(i);
        let plan = debug(r, &body).await;
        let (n, blocks) = (plan["prompt_tokens"].as_u64().unwrap(), plan["blocks"].as_u64().unwrap());
        assert_eq!(chat(only_a, &body).await.worker.as_deref(), Some("lora-a"));
        until(r, &body, &format!("{name}: base blocks learnt"), |v| overlap(v, "lora-a").1 == blocks).await;
        let adapted = with_model(&body, ADAPTER);
        assert_eq!(overlap(&debug(r, &adapted).await, "lora-a").0, 0, "{name}: predicted under the adapter");
        let first = chat(r, &adapted).await;
        assert_eq!(first.cached_tokens(), 0, "{name}: the adapter reused the base model's blocks");
        let settled =
            until(r, &adapted, &format!("{name}: adapter blocks learnt"), |v| overlap(v, "lora-a").1 == blocks).await;
        let expected = reusable(overlap(&settled, "lora-a").0 * BLOCK, n, BLOCK);
        assert_eq!(chat(r, &adapted).await.cached_tokens(), expected, "{name}: the adapter's resend");
        eprintln!("lora {name}, base first: adapter 0 cached, then {expected} = predicted");
    }
}

/// Eight adapter chats (text and images) all go to the engine that serves the adapter, ranked alone in
/// `/debug/route`; twelve base text chats of new prompts (ties between idle engines are random; an
/// image chat would lean to the engine holding its image) reach both.
async fn only_the_serving_engine_gets_the_adapter(r: &str) {
    for i in 0..8 {
        let (name, body) = corpus::chats(ADAPTER).swap_remove([0, 2, 3, 4][i % 4]);
        let plan = debug(r, &body).await;
        assert_eq!(plan["adapter"]["serving"], json!(["lora-a"]), "adapter chat {i} ({name}): {plan}");
        assert_eq!(plan["candidates"], json!(["lora-a"]), "adapter chat {i} ({name}): ranked alone");
        let c = chat(r, &body).await;
        assert_eq!(c.worker.as_deref(), Some("lora-a"), "adapter chat {i} ({name})");
    }
    let plan = debug(r, &corpus::chats(ADAPTER).swap_remove(0).1).await;
    assert_eq!(plan["adapter"]["active"], json!(["lora-a"]), "the adapter active where it was sent: {plan}");
    let mut on_b = 0;
    for _ in 0..12 {
        let (_, body) = corpus::chats(BASE).swap_remove(0);
        on_b += usize::from(chat(r, &body).await.worker.as_deref() == Some("lora-b"));
    }
    assert!((1..12).contains(&on_b), "base chats should reach both engines: {on_b} of 12 on lora-b");
    eprintln!("lora: 8 of 8 adapter chats on lora-a; base chats {} on lora-a, {on_b} on lora-b", 12 - on_b);
}

/// The router's `/tokenize` (sent to the pool of the body's model) answers what the engine answers.
async fn tokenize_like_the_engine(r: &str, a_url: &str) {
    let tokenize = |base: &str, body: &Value| {
        let (url, body) = (format!("{base}/tokenize"), serde_json::to_vec(body).unwrap());
        async move {
            let resp = post(&url, &body).await;
            let status = resp.status();
            let v: Value = resp.json().await.unwrap();
            assert!(status.is_success(), "{url}: {status} {v}");
            v
        }
    };
    let mut checked = 0;
    for model in [BASE, ADAPTER] {
        let bodies = [
            json!({"model": model, "messages": [{"role": "user", "content": "Tokenize this chat, please."}],
                   "add_generation_prompt": true}),
            json!({"model": model, "prompt": "Tokenize this prompt: 3 apples, 2 pears."}),
        ];
        for body in bodies {
            let theirs = tokenize(a_url, &body).await;
            assert!(theirs["count"].as_u64() > Some(0), "{theirs}");
            // Several times: the router may pick either engine for the base model, only A for the adapter.
            for _ in 0..4 {
                assert_eq!(tokenize(r, &body).await, theirs, "/tokenize through the router for {body}");
                checked += 1;
            }
        }
    }
    eprintln!("tokenize: {checked} router answers equal the engine's (chat and prompt bodies, base and adapter)");
}
