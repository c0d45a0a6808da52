//! The all-or-nothing gate and exact multimodal routing, through the real proxy and sims.
//!
//! The matrix uses a counter that fails on chosen image sizes (wrapping the real Qwen3-VL counter), so
//! the gate is exercised independently of any family's formulas.

use std::sync::Arc;
use std::time::Duration;

use crate::harness::*;
use mmrouter::config::Settings;
use mmrouter_core::accounting::{AccountingError, Counter, ImageTokens, RequestContext};
use mmrouter_core::model::{ModelSource, ModelSpec};
use mmrouter_core::pipeline::{ImageCounter, Pipeline};
use mmrouter_core::plan;
use mmrouter_core::request::{Endpoint, Request};
use mmrouter_core::routing::{SelectRequest, WorkerSpec};

const QWEN3: ModelSource = ModelSource::Bundled("qwen3-vl");

/// The real counter, except that images of a chosen width fail with a chosen error.
struct FailOn {
    real: Counter,
    width: u32,
    error: fn(u32, u32) -> AccountingError,
}

impl ImageCounter for FailOn {
    fn placeholder(&self) -> &str {
        self.real.placeholder()
    }
    fn count_request(
        &self,
        sizes: &[(u32, u32)],
        ctx: &RequestContext,
        kw: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<Vec<ImageTokens>, AccountingError> {
        if let Some(&(w, h)) = sizes.iter().find(|(w, _)| *w == self.width) {
            return Err((self.error)(w, h));
        }
        self.real.count_request(sizes, ctx, kw)
    }
}

fn aspect(width: u32, height: u32) -> AccountingError {
    AccountingError::AspectRatio { width, height, limit: 200 }
}

struct Snapshot {
    fallback: f64,
    img_tok_count: f64,
    img_tok_sum: f64,
    images_count: f64,
}

async fn snapshot(url: &str, reason: &str) -> (Snapshot, String) {
    let t = metrics_text(url).await;
    let s = Snapshot {
        fallback: metric(&t, "mmrouter_mm_fallback_total", &format!("reason=\"{reason}\"")),
        img_tok_count: metric(&t, "mmrouter_image_tokens_per_request_count", ""),
        img_tok_sum: metric(&t, "mmrouter_image_tokens_per_request_sum", ""),
        images_count: metric(&t, "mmrouter_images_per_request_count", ""),
    };
    (s, t)
}

fn chat_tokens(body: &[u8]) -> plan::ChatTokens {
    let model = QWEN3.load_prompt().unwrap();
    let counter = QWEN3.load_counter(None, &Default::default()).unwrap();
    let request = Request::parse(Endpoint::Chat, body).unwrap();
    plan::tokenize_chat(&model, &request, counter.placeholder(), &Default::default()).unwrap()
}

/// Text-prefix block keys of a chat body, computed independently of the proxy.
fn prefix_blocks(body: &[u8]) -> Vec<u64> {
    plan::block_keys(plan::text_prefix(&chat_tokens(body)), &[], 16, plan::seed("qwen3-vl", None, None))
}

/// A text-prefix plan's keys: the prefix, then the affinity tail over the unexpanded prompt (each
/// image its one placeholder token), computed independently of the proxy.
fn fallback_blocks(body: &[u8]) -> Vec<u64> {
    plan::block_keys(&chat_tokens(body).ids, &[], 16, plan::seed("qwen3-vl", None, None))
}

enum Model {
    Failing { width: u32 },
    Unsupported,
}

async fn gated_cluster(model: Model) -> Cluster {
    let sims = sims(1, fast).await;
    let specs = sims.iter().map(|s| WorkerSpec::new(s.name().to_owned(), s.url())).collect();
    let mut cfg = Settings::new(ModelSpec::new(QWEN3), specs);
    cfg.pool().pipeline.media.allow_cidrs = vec!["127.0.0.0/8".to_owned()];
    cfg.server.health_interval = None;
    let real = QWEN3.load_counter(None, &Default::default()).unwrap();
    let counter: Result<Arc<dyn ImageCounter>, AccountingError> = match model {
        Model::Failing { width } => Ok(Arc::new(FailOn { real, width, error: aspect })),
        Model::Unsupported => Err(AccountingError::UnsupportedModel { detail: "test model".into() }),
    };
    let pipeline = Pipeline::with_counter(&cfg.pools[0].pipeline, QWEN3.load_prompt().unwrap(), counter).unwrap();
    let state = mmrouter::server::AppState::with_pipeline(&cfg, pipeline).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (addr, state) = mmrouter::server::spawn_state(&cfg, state, listener).await.unwrap();
    Cluster { sims, url: format!("http://{addr}"), state }
}

struct Case {
    name: &'static str,
    model: Model,
    images: Vec<String>,
    route: &'static str,
    reason: Option<&'static str>,
}

const TEXT: &str = "Compare these pictures in detail, please.";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_matrix() {
    let ok_a = png_data_url(640, 480, 10);
    let ok_b = png_data_url(800, 600, 20);
    let failing = png_data_url(333, 222, 30); // the fake counter fails on width 333
    let cases = vec![
        Case {
            name: "all images ok",
            model: Model::Failing { width: 333 },
            images: vec![ok_a.clone(), ok_b.clone()],
            route: "exact",
            reason: None,
        },
        Case {
            name: "failure on the first image",
            model: Model::Failing { width: 333 },
            images: vec![failing.clone(), ok_a.clone()],
            route: "text_prefix",
            reason: Some("aspect_ratio"),
        },
        Case {
            name: "failure after a valid image",
            model: Model::Failing { width: 333 },
            images: vec![ok_a.clone(), failing.clone()],
            route: "text_prefix",
            reason: Some("aspect_ratio"),
        },
        Case {
            name: "failure in intake",
            model: Model::Failing { width: 333 },
            // Loopback is in allow_cidrs here and nothing listens on the discard port: the fetch fails.
            images: vec![ok_a.clone(), "http://127.0.0.1:9/x.png".to_owned()],
            route: "text_prefix",
            reason: Some("fetch_failed"),
        },
        Case {
            name: "unknown model",
            model: Model::Unsupported,
            images: vec![ok_a.clone()],
            route: "text_prefix",
            reason: Some("unsupported_model"),
        },
    ];
    for case in cases {
        let c = gated_cluster(case.model).await;
        let worker = c.sims[0].name().to_owned();
        let body = chat_body(&case.images, TEXT, false);
        let reason = case.reason.unwrap_or("none");
        let (before, _) = snapshot(&c.url, reason).await;

        let r = post(&c.url, body.clone()).await;
        assert_eq!(r.status(), 200, "{}", case.name);
        let route = r.headers()["x-mmrouter-route"].to_str().unwrap().to_owned();
        let seen_hash = r.headers()["x-sim-body-sha256"].to_str().unwrap().to_owned();
        let _ = r.text().await.unwrap();
        assert_eq!(route, case.route, "{}", case.name);
        // Unchanged on a fallback; on the exact route to vLLM only the images' uuids are added.
        let expected = if case.route == "exact" { with_uuids(&body) } else { body.clone() };
        assert_eq!(seen_hash, sha256_hex(&expected), "{}: body changed", case.name);

        let (after, text) = snapshot(&c.url, reason).await;
        let gauge_line = format!("mmrouter_worker_inflight_image_tokens{{worker=\"{worker}\"}}");
        let prefix = prefix_blocks(&body);
        if case.route == "exact" {
            assert_eq!(after.fallback - before.fallback, 0.0, "{}", case.name);
            assert_eq!(after.img_tok_count - before.img_tok_count, 1.0, "{}", case.name);
            assert_eq!(after.images_count - before.images_count, 1.0, "{}", case.name);
            assert!(after.img_tok_sum - before.img_tok_sum > 0.0, "{}", case.name);
            // The gauge was raised while in flight and is back to zero.
            assert_eq!(metric(&text, "mmrouter_worker_inflight_image_tokens", &format!("worker=\"{worker}\"")), 0.0);
            assert!(text.contains(&gauge_line), "{}: image gauge never touched", case.name);
            // The index holds the whole prompt, images included: more than the text prefix.
            assert!(c.state.pools()[0].router.index_blocks() > prefix.len(), "{}", case.name);
        } else {
            assert_eq!(after.fallback - before.fallback, 1.0, "{}: fallback counter", case.name);
            assert_eq!(after.img_tok_count, before.img_tok_count, "{}: image-token sample", case.name);
            assert_eq!(after.img_tok_sum, before.img_tok_sum, "{}: partial image total", case.name);
            assert_eq!(after.images_count, before.images_count, "{}: images sample", case.name);
            assert!(!text.contains(&gauge_line), "{}: image gauge touched on fallback", case.name);
            // Exactly the text-prefix blocks and the affinity tail were installed: no image keys. The
            // tail does not depend on the images (the same text with other images has the same keys).
            let installed = fallback_blocks(&body);
            assert!(installed.starts_with(&prefix), "{}", case.name);
            let others: Vec<String> = (0..case.images.len() as u32).map(|i| png_data_url(50 + i, 40, 200)).collect();
            let other = chat_body(&others, TEXT, false);
            assert_eq!(fallback_blocks(&other), installed, "{}: the tail names an image", case.name);
            let expected = if case.reason == Some("unsupported_model") { 0 } else { installed.len() };
            assert_eq!(c.state.pools()[0].router.index_blocks(), expected, "{}: index contents", case.name);
            if expected > 0 {
                let d = c.state.pools()[0]
                    .router
                    .select(&SelectRequest {
                        blocks: &installed,
                        block_size: 16,
                        prompt_tokens: installed.len() as u32 * 16,
                        decode_tokens: 0,
                        images: Vec::new(),
                        unseen: false,
                    })
                    .unwrap();
                assert_eq!(d.overlap_blocks[0] as usize, installed.len(), "{}", case.name);
            }
        }
        for l in c.state.pools()[0].router.loads() {
            assert_eq!(l.inflight.requests, 0);
            assert_eq!(l.inflight.image_tokens, 0);
        }
    }
}

async fn chat(url: &str, body: &[u8]) -> (String, String, serde_json::Value) {
    let r = post(url, body.to_vec()).await;
    assert_eq!(r.status(), 200);
    let route = r.headers()["x-mmrouter-route"].to_str().unwrap().to_owned();
    let worker = r.headers()["x-mmrouter-worker"].to_str().unwrap().to_owned();
    (route, worker, r.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_routing_reuses_image_blocks_and_never_false_hits() {
    let c = cluster_with(sims(4, fast).await, "[media]\nallow_cidrs = [\"127.0.0.0/8\"]").await;
    let rocket = data_url("rocket.jpg");
    let body = chat_body(std::slice::from_ref(&rocket), "What is shown here? Answer briefly.", false);

    let plan = debug_route(&c.url, "", &body, None).await;
    assert_eq!(plan["route"], "exact");
    let image_run = plan["image_tokens"][0].as_u64().unwrap();
    assert!(image_run > 0);

    let (route1, w1, _) = chat(&c.url, &body).await;
    let (route2, w2, v2) = chat(&c.url, &body).await;
    assert_eq!((route1.as_str(), route2.as_str()), ("exact", "exact"));
    assert_eq!(w1, w2, "the repeat must land on the worker that cached it");
    let cached = v2["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached >= image_run, "cached {cached} < image run {image_run}");

    // Same text, a different image: only blocks wholly before the image may match.
    let other = data_url("coffee.png");
    let body_b = chat_body(std::slice::from_ref(&other), "What is shown here? Answer briefly.", false);
    let plan_b = debug_route(&c.url, "", &body_b, None).await;
    assert_eq!(plan_b["route"], "exact");
    let prefix = prefix_blocks(&body_b).len() as u64;
    let max_overlap = plan_b["overlap_blocks"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).max().unwrap();
    assert!(max_overlap <= prefix, "false image hit: overlap {max_overlap} blocks > text prefix {prefix}");
    let (_, _, vb) = chat(&c.url, &body_b).await;
    let cached_b = vb["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached_b <= prefix * 16, "the sim reused image blocks of a different image: {cached_b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extreme_aspect_ratio_falls_back_and_the_workers_400_reaches_the_client() {
    let c = cluster_with(sims(4, fast).await, "").await;
    let body = chat_body(&[png_data_url(5000, 20, 1)], "What is this strip?", false);
    let plan = debug_route(&c.url, "", &body, None).await;
    assert_eq!(plan["route"], "text_prefix");
    assert_eq!(plan["reason"], "aspect_ratio");
    assert_eq!(plan["image_tokens"], serde_json::json!([]));
    let before = metric(&metrics_text(&c.url).await, "mmrouter_mm_fallback_total", "reason=\"aspect_ratio\"");
    // The worker's processor refuses the strip as vLLM's does: its 400 reaches the client as it is.
    let r = post(&c.url, body.clone()).await;
    assert_eq!(r.status(), 400);
    assert_eq!(header(&r, "x-mmrouter-route"), "text_prefix");
    let err: serde_json::Value = r.json().await.unwrap();
    assert!(err["error"]["message"].as_str().unwrap_or_default().contains("aspect_ratio"), "{err}");
    let after = metric(&metrics_text(&c.url).await, "mmrouter_mm_fallback_total", "reason=\"aspect_ratio\"");
    assert_eq!(after - before, 1.0);
}

async fn drift(url: &str) -> (f64, f64) {
    let t = metrics_text(url).await;
    (metric(&t, "mmrouter_prompt_tokens_drift_count", ""), metric(&t, "mmrouter_prompt_tokens_drift_sum", ""))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_is_measured_from_worker_usage() {
    // Knob on: the worker over-reports by 7, stream (with usage) and non-stream.
    let c = cluster_with(
        sims(1, |o| {
            fast(o);
            o.usage_drift = 7;
        })
        .await,
        "",
    )
    .await;
    let img = data_url("rocket.jpg");
    for stream in [false, true] {
        let (n0, s0) = drift(&c.url).await;
        let r = client()
            .post(format!("{}/v1/chat/completions", c.url))
            .header("content-type", "application/json")
            .body(chat_body(std::slice::from_ref(&img), "describe", stream))
            .send()
            .await
            .unwrap();
        let _ = r.text().await.unwrap();
        // The drift sample is recorded when the relayed body ends.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (n1, s1) = drift(&c.url).await;
        assert_eq!((n1 - n0, s1 - s0), (1.0, 7.0), "stream={stream}");
    }

    // Knob off: every real photo's exact prediction matches the worker's count.
    let c = cluster_with(sims(1, fast).await, "").await;
    let photos = [
        "rocket.jpg",
        "grace_hopper.jpg",
        "chelsea.png",
        "coffee.png",
        "horse.png",
        "no_time_for_that_tiny.gif",
        "alien1.gif",
        "red.jpg",
        "rocket_lossless.webp",
        "rocket_lossy_alpha.webp",
        "rocket_exif_rot6.jpg",
    ];
    let (n0, s0) = drift(&c.url).await;
    for p in photos {
        let (route, _, _) = chat(&c.url, &chat_body(&[data_url(p)], "describe", false)).await;
        assert_eq!(route, "exact", "{p}");
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (n1, s1) = drift(&c.url).await;
    assert_eq!(n1 - n0, photos.len() as f64);
    assert_eq!(s1 - s0, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_route_shows_the_token_ids_on_request() {
    let c = cluster_with(sims(1, fast).await, "").await;
    let body = chat_body(&[data_url("rocket.jpg")], "What is shown here?", false);
    let plain = debug_route(&c.url, "", &body, None).await;
    assert!(plain.get("token_ids").is_none(), "ids only when asked for");
    let r = client()
        .post(format!("{}/debug/route?tokens=true", c.url))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let raw = r.bytes().await.unwrap();
    let keys = object_keys(&raw);
    assert!(keys.iter().any(|k| k == "overlap_sources"), "{keys:?}");
    let v: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(v["route"], "exact");
    let ids: Vec<u64> = serde_json::from_value(v["token_ids"].clone()).unwrap();
    assert_eq!(ids.len() as u64, v["prompt_tokens"].as_u64().unwrap());
    let span = &v["image_spans"][0];
    let (offset, len) = (span["offset"].as_u64().unwrap() as usize, span["length"].as_u64().unwrap() as usize);
    assert_eq!(len as u64, v["image_tokens"][0].as_u64().unwrap());
    // The span is the image's run of <|image_pad|>, inside <|vision_start|> … <|vision_end|>.
    assert!(ids[offset..offset + len].iter().all(|&id| id == 151655));
    assert_eq!((ids[offset - 1], ids[offset + len]), (151652, 151653));
    assert!(v["text"].as_str().unwrap().contains("<|vision_start|><|image_pad|><|vision_end|>What is shown here?"));
}

/// The top-level keys of a JSON object as written, in order; panics on a key written twice (a
/// `serde_json::Value` would keep only the last).
fn object_keys(raw: &[u8]) -> Vec<String> {
    struct Keys;
    impl<'de> serde::de::Visitor<'de> for Keys {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Vec<String>, A::Error> {
            let mut keys = Vec::new();
            while let Some(k) = map.next_key::<String>()? {
                map.next_value::<serde::de::IgnoredAny>()?;
                assert!(!keys.contains(&k), "key {k:?} written twice");
                keys.push(k);
            }
            Ok(keys)
        }
    }
    serde::Deserializer::deserialize_map(&mut serde_json::Deserializer::from_slice(raw), Keys).unwrap()
}

/// A text chat the router cannot render (vLLM refuses `null` user content) routes by load on no ids,
/// and is counted with its reason; `/debug/route` says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrenderable_text_chat_is_counted_and_routed_by_load() {
    let c = cluster_with(sims(2, fast).await, "").await;
    let body = serde_json::to_vec(&serde_json::json!({
        "model": "Qwen/Qwen3-VL-8B-Instruct", "max_tokens": 4, "messages": [{"role": "user", "content": null}]
    }))
    .unwrap();
    let plan = debug_route(&c.url, "", &body, None).await;
    assert_eq!(plan["route"], "no_media");
    assert_eq!(plan["reason"], "invalid_request");
    assert_eq!(plan["prompt_tokens"], 0);
    assert_eq!(plan["blocks"], 0);
    let series = "reason=\"invalid_request\"";
    let before = metric(&metrics_text(&c.url).await, "mmrouter_prompt_unrendered_total", series);
    let r = post(&c.url, body).await;
    assert_eq!(header(&r, "x-mmrouter-route"), "no_media");
    let after = metric(&metrics_text(&c.url).await, "mmrouter_prompt_unrendered_total", series);
    assert_eq!(after - before, 1.0);
    // A chat it renders is not counted.
    let ok = chat_body(&[], "Hello there", false);
    let _ = post(&c.url, ok).await;
    assert_eq!(metric(&metrics_text(&c.url).await, "mmrouter_prompt_unrendered_total", series), after);
}

/// `turn`'s conversation with an answer and one more question.
fn next_turn(turn: &[u8]) -> Vec<u8> {
    let mut v: serde_json::Value = serde_json::from_slice(turn).unwrap();
    let messages = v["messages"].as_array_mut().unwrap();
    messages.push(serde_json::json!({"role": "assistant", "content": "A flat grey surface, nothing else."}));
    messages.push(serde_json::json!({"role": "user", "content": "Are you sure? Look at the corners again."}));
    serde_json::to_vec(&v).unwrap()
}

/// A conversation whose image the router cannot account (here: over its pixel limit, which the worker
/// serves) keeps its worker on the next turn: the text-prefix plan's affinity tail matches the turn it
/// sent before, so the worker's cache of the image is reused, and the request still falls back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_that_falls_back_keeps_its_worker() {
    let c = cluster_with(sims(4, fast).await, "[media]\nmax_pixels = 1000000").await;
    let large = png_data_url(1200, 1000, 41);
    let turn1 = chat_body(std::slice::from_ref(&large), "What is in this picture?", false);
    let turn2 = next_turn(&turn1);

    let (route1, w1, _) = chat(&c.url, &turn1).await;
    assert_eq!(route1, "text_prefix");
    let plan = debug_route(&c.url, "", &turn2, None).await;
    assert_eq!(plan["route"], "text_prefix");
    let text_blocks = plan["text_blocks"].as_u64().unwrap();
    assert_eq!(text_blocks as usize, prefix_blocks(&turn2).len());
    let workers: Vec<String> = serde_json::from_value(plan["workers"].clone()).unwrap();
    let overlap: Vec<u64> = serde_json::from_value(plan["overlap_blocks"].clone()).unwrap();
    let held = overlap[workers.iter().position(|w| *w == w1).unwrap()];
    // Past the image: as far as turn 2's keys agree with turn 1's.
    assert!(held > text_blocks, "the tail did not match: {held} blocks on {w1}, text prefix {text_blocks}");
    let (k1, k2) = (fallback_blocks(&turn1), fallback_blocks(&turn2));
    assert_eq!(held as usize, k1.iter().zip(&k2).take_while(|(a, b)| a == b).count());
    for (w, &o) in workers.iter().zip(&overlap) {
        assert!(*w == w1 || o <= text_blocks, "{w} holds {o} blocks of a conversation it never served");
    }

    let (route2, w2, v2) = chat(&c.url, &turn2).await;
    assert_eq!((route2.as_str(), w2.as_str()), ("text_prefix", w1.as_str()));
    // The worker reused turn 1's prompt, the image's tokens included (far more than the text prefix).
    let cached = v2["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached > 16 * held, "cached {cached} tokens, the router's keys alone cover {}", 16 * held);
}

/// The next turn of a conversation that fell back weighs its prefix as the engine counted it: the
/// worker's answer to turn 1 says how many tokens the unaccounted image took, and turn 2's plan, whose
/// keys extend turn 1's, carries them — whole on the worker holding turn 1, as uncached work on the
/// others. Nothing of the image itself is learnt: the same image in another conversation gets nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_turn_weighs_its_prefix_as_the_engine_counted_it() {
    let c = cluster_with(sims(2, fast).await, "[media]\nmax_pixels = 1000000").await;
    let large = png_data_url(1200, 1000, 43);
    let turn1 = chat_body(std::slice::from_ref(&large), "What is in this picture?", false);
    let turn2 = next_turn(&turn1);

    let planned1 = debug_route(&c.url, "", &turn1, None).await["prompt_tokens"].as_u64().unwrap();
    let (route1, w1, v1) = chat(&c.url, &turn1).await;
    assert_eq!(route1, "text_prefix");
    let engine1 = v1["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(engine1 > planned1 + 1000, "the worker counted {engine1} tokens, the plan {planned1}");

    let plan = debug_route(&c.url, "", &turn2, None).await;
    assert_eq!(plan["route"], "text_prefix");
    let unseen = &plan["unseen_tokens"];
    assert_eq!(unseen["total"].as_u64().unwrap(), engine1 - planned1);
    let workers: Vec<String> = serde_json::from_value(plan["workers"].clone()).unwrap();
    let per_worker: Vec<u64> = serde_json::from_value(unseen["per_worker"].clone()).unwrap();
    let costs: Vec<f64> = serde_json::from_value(plan["costs"].clone()).unwrap();
    let (holder, other) = match workers.iter().position(|w| *w == w1).unwrap() {
        0 => (0, 1),
        _ => (1, 0),
    };
    assert_eq!((per_worker[holder], per_worker[other]), (engine1 - planned1, 0));
    // The other worker would recompute the image: its cost is higher by at least the image's tokens.
    assert!(costs[other] - costs[holder] >= (engine1 - planned1) as f64, "costs {costs:?}");

    // The same image under another conversation: nothing learnt applies.
    let elsewhere = chat_body(std::slice::from_ref(&large), "Describe the colours, please.", false);
    let plan = debug_route(&c.url, "", &elsewhere, None).await;
    assert_eq!(plan["route"], "text_prefix");
    assert_eq!(plan["unseen_tokens"]["total"], 0);
}
