//! Requests the suite makes: to the router (`/debug/route`, chats, `/metrics`) and to an engine
//! (render, chats), and a subscription to an engine's KV events.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mmrouter_kv_events::{spawn_feed, ExtraKey, FeedConfig, FeedEvent, FeedHandle, KvEvent};
use serde_json::Value;

pub fn http() -> reqwest::Client {
    mmrouter_core::http_client_builder().timeout(Duration::from_secs(120)).build().unwrap()
}

pub async fn post(url: &str, body: &[u8]) -> reqwest::Response {
    http().post(url).header("content-type", "application/json").body(body.to_vec()).send().await.unwrap()
}

/// The router's plan and choice, with its token ids.
pub async fn debug(router: &str, body: &[u8]) -> Value {
    post(&format!("{router}/debug/route?tokens=true"), body).await.json().await.unwrap()
}

/// A chat: its usage and the worker the router names (if through the router).
pub struct Chat {
    pub usage: Value,
    pub worker: Option<String>,
    pub route: Option<String>,
}

pub async fn chat(base: &str, body: &[u8]) -> Chat {
    let resp = post(&format!("{base}/v1/chat/completions"), body).await;
    let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let (worker, route) = (header("x-mmrouter-worker"), header("x-mmrouter-route"));
    let status = resp.status();
    let v: Value = resp.json().await.unwrap();
    assert!(status.is_success(), "{base}: {status} {v}");
    Chat { usage: v["usage"].clone(), worker, route }
}

impl Chat {
    pub fn prompt_tokens(&self) -> u64 {
        self.usage["prompt_tokens"].as_u64().unwrap()
    }

    pub fn cached_tokens(&self) -> u64 {
        self.usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()
    }
}

/// The engine's own rendering: `(token ids, image placeholder ranges)`.
pub async fn render(engine: &str, body: &[u8]) -> (Vec<u64>, Vec<(u64, u64)>) {
    let resp = post(&format!("{engine}/v1/chat/completions/render"), body).await;
    let status = resp.status();
    let v: Value = resp.json().await.unwrap();
    assert!(status.is_success(), "render: {status} {v}");
    let ids = v["token_ids"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
    let spans = v["features"]["mm_placeholders"]["image"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| (p["offset"].as_u64().unwrap(), p["length"].as_u64().unwrap()))
        .collect();
    (ids, spans)
}

pub fn ids(plan: &Value) -> Vec<u64> {
    plan["token_ids"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect()
}

pub fn spans(plan: &Value) -> Vec<(u64, u64)> {
    plan["image_spans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["offset"].as_u64().unwrap(), s["length"].as_u64().unwrap()))
        .collect()
}

/// Worker `name`'s index among the plan's workers.
pub fn index_of(plan: &Value, name: &str) -> usize {
    plan["workers"].as_array().unwrap().iter().position(|w| w == name).unwrap_or_else(|| panic!("{name} in {plan}"))
}

/// What vLLM reuses of a prompt of `n` tokens whose first `overlap` tokens it holds: full blocks only,
/// and never the block holding the last prompt token (it must compute at least one).
pub fn reusable(overlap: u64, n: u64, block_size: u64) -> u64 {
    overlap.min(n.saturating_sub(1) / block_size * block_size)
}

/// Polls the router's plan until `done` holds (events arrive a few milliseconds after the answer).
pub async fn until(router: &str, body: &[u8], what: &str, done: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..250 {
        let v = debug(router, body).await;
        if done(&v) {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    panic!("{what}: never; last plan {}", debug(router, body).await);
}

pub async fn metrics(router: &str) -> String {
    http().get(format!("{router}/metrics")).send().await.unwrap().text().await.unwrap()
}

/// The value of the first sample of `name` whose labels contain `labels`.
pub fn metric(page: &str, name: &str, labels: &str) -> f64 {
    page.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{') && l.contains(labels))
        .find_map(|l| l.rsplit(' ').next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0)
}

/// What an engine published since the subscription started (live batches only).
#[derive(Clone, Debug, Default)]
pub struct Published {
    pub stored: u64,
    pub removed: u64,
    pub mm_ids: BTreeSet<String>,
}

pub struct Watch {
    _handle: FeedHandle,
    seen: Arc<Mutex<Published>>,
}

impl Watch {
    pub async fn start(endpoint: &str) -> Watch {
        let (handle, mut events) = spawn_feed(FeedConfig::new(endpoint)).unwrap();
        let seen = Arc::new(Mutex::new(Published::default()));
        let sink = seen.clone();
        tokio::spawn(async move {
            while let Some(ev) = events.recv().await {
                let FeedEvent::Batch { batch, .. } = ev else { continue };
                let mut s = sink.lock().unwrap();
                for e in batch.events {
                    match e {
                        KvEvent::BlockStored(b) => {
                            s.stored += b.block_hashes.len() as u64;
                            for key in b.extra_keys.iter().flatten().flatten().flatten() {
                                if let ExtraKey::Mm { id, .. } | ExtraKey::Str(id) = key {
                                    s.mm_ids.insert(id.clone());
                                }
                            }
                        }
                        KvEvent::BlockRemoved(r) => s.removed += r.block_hashes.len() as u64,
                        _ => {}
                    }
                }
            }
        });
        for _ in 0..100 {
            if handle.stats().connected {
                break;
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        assert!(handle.stats().connected, "no subscription to {endpoint}");
        Watch { _handle: handle, seen }
    }

    pub fn published(&self) -> Published {
        self.seen.lock().unwrap().clone()
    }
}

/// `(count, sum)` of the router's `mmrouter_prompt_tokens_drift` histogram (usage minus predicted).
pub fn drift(page: &str) -> (f64, f64) {
    let value = |suffix: &str| {
        let name = format!("mmrouter_prompt_tokens_drift_{suffix}");
        page.lines()
            .filter(|l| l.starts_with(&name) && matches!(l.as_bytes().get(name.len()), Some(b' ' | b'{')))
            .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
            .sum()
    };
    (value("count"), value("sum"))
}

/// Waits until the router has observed `count` answers (the drift is recorded when a body ends).
pub async fn drift_after(router: &str, count: f64) -> (f64, f64) {
    for _ in 0..100 {
        let d = drift(&metrics(router).await);
        if d.0 >= count {
            return d;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("the router never observed {count} answers:\n{}", metrics(router).await);
}
