//! Video chats through the real proxy and sims (which plan with the core pipeline, so they count what
//! the router counts): a chat with a committed clip is routed exact, its `video_url` part gets the
//! router's `uuid` and nothing else changes, the prompt the worker counts is vLLM's renderer's (the
//! goldens of `tests/fixtures/video/`), a repeat lands on the same worker with its blocks cached, and a
//! clip the router cannot size is a counted text-prefix fallback forwarded as sent, with no media state.

use crate::harness::*;
use base64::Engine;
use serde_json::{json, Value};

const MODEL: &str = "Qwen/Qwen3-VL-8B-Instruct";

fn clip(name: &str) -> Vec<u8> {
    fixture(&format!("video/clips/{name}"))
}

/// The chat `tests/fixtures/video/oracle.py` rendered for a clip, as a data URL.
fn video_chat(name: &str, mime: &str) -> Vec<u8> {
    let url = format!("data:{mime};base64,{}", base64::engine::general_purpose::STANDARD.encode(clip(name)));
    let body = json!({
        "model": MODEL,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What happens in this clip?"},
            {"type": "video_url", "video_url": {"url": url}}
        ]}]
    });
    serde_json::to_vec(&body).unwrap()
}

/// The renderer's ids for a clip's chat on the bundled Qwen3-VL profile, default settings.
fn golden_ids(name: &str) -> Vec<u64> {
    let g: Value = serde_json::from_slice(&fixture("video/goldens.json")).unwrap();
    let rows = g["renders"]["qwen3_vl/default"].as_array().unwrap();
    let row = rows.iter().find(|r| r["name"] == name).unwrap();
    serde_json::from_value(row["ids"].clone()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_video_chat_is_routed_exact_and_its_repeat_hits_the_same_worker() {
    let c = cluster_with(sims(2, fast).await, "").await;
    let name = "v02_100x60_24fps_30f.mp4";
    let body = video_chat(name, "video/mp4");
    let want = golden_ids(name);

    // /debug/route: the video's frames, groups and tokens, and the renderer's ids.
    let d = debug_route(&c.url, "tokens=true", &body, None).await;
    assert_eq!(d["route"], "exact", "{d}");
    let ids: Vec<u64> = serde_json::from_value(d["token_ids"].clone()).unwrap();
    assert_eq!(ids, want, "the prompt vLLM's renderer builds");
    let v = &d["videos"][0];
    assert_eq!((v["format"].as_str(), v["frames"].as_u64(), v["groups"].as_u64()), (Some("mp4"), Some(4), Some(2)));
    assert_eq!(v["timestamps"], json!(["<0.2 seconds>", "<1.0 seconds>"]), "{v}");
    assert_eq!(v["tokens"].as_u64(), d["image_spans"][0]["length"].as_u64(), "the run is its span");
    assert_eq!(
        v["feature_tokens"].as_u64(),
        Some(v["groups"].as_u64().unwrap() * v["tokens_per_group"].as_u64().unwrap())
    );

    let before = metrics_text(&c.url).await;
    let r = post(&c.url, body.clone()).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-mmrouter-route"), "exact");
    let worker = header(&r, "x-mmrouter-worker").to_owned();
    // The worker got the body as sent, the video part's uuid (BLAKE3 of the clip) written in.
    assert_eq!(header(&r, "x-sim-body-sha256"), sha256_hex(&with_uuids(&body)));
    let first: Value = r.json().await.unwrap();
    assert_eq!(first["usage"]["prompt_tokens"].as_u64(), Some(want.len() as u64), "{first}");

    let r = post(&c.url, body.clone()).await;
    assert_eq!(header(&r, "x-mmrouter-route"), "exact");
    assert_eq!(header(&r, "x-mmrouter-worker"), worker, "the repeat goes where the video is cached");
    let again: Value = r.json().await.unwrap();
    let cached = again["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
    // Every full block is cached, the video's included, but the one holding the prompt's last token:
    // as vLLM, the engine computes at least that token again.
    let overlap = (want.len() as u64 - 1) / 16 * 16;
    assert!(overlap > d["image_spans"][0]["offset"].as_u64().unwrap(), "the overlap covers video blocks");
    assert_eq!(cached, overlap, "{again}");

    // Counted like an image: media tokens recorded for both exact requests, no fallback.
    let after = metrics_text(&c.url).await;
    let count = |t: &str| metric(t, "mmrouter_image_tokens_per_request_count", "");
    assert_eq!(count(&after) - count(&before), 2.0);
    let fallback = |t: &str| metric(t, "mmrouter_mm_fallback_total", "reason=\"video_container\"");
    assert_eq!(fallback(&after), fallback(&before));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clip_the_router_cannot_size_is_a_counted_fallback_forwarded_as_sent() {
    let c = cluster_with(sims(1, fast).await, "").await;
    let count = |t: &str| metric(t, "mmrouter_image_tokens_per_request_count", "");
    let fallback = |t: &str| metric(t, "mmrouter_mm_fallback_total", "reason=\"video_container\"");
    for (name, mime) in [("v10_64x48_10fps_20f.avi", "video/x-msvideo"), ("v11_64x48_10fps_20f.webm", "video/webm")] {
        let before = metrics_text(&c.url).await;
        let body = video_chat(name, mime);
        let r = post(&c.url, body.clone()).await;
        assert_eq!(r.status(), 200, "{name}");
        assert_eq!(header(&r, "x-mmrouter-route"), "text_prefix", "{name}");
        assert_eq!(header(&r, "x-sim-body-sha256"), sha256_hex(&body), "{name}: forwarded unchanged");
        let after = metrics_text(&c.url).await;
        assert_eq!(fallback(&after) - fallback(&before), 1.0, "{name}");
        assert_eq!(count(&after), count(&before), "{name}: no media tokens recorded");
        let d = debug_route(&c.url, "", &body, None).await;
        assert_eq!((d["reason"].as_str(), d["videos"].as_array().map(Vec::len)), (Some("video_container"), Some(0)));
        assert_eq!(d["images"], json!([]));
    }
}

/// `mmrouter render` and `mmrouter count` on a video: the renderer's ids with the video's frames and
/// groups, and the clip's tokens.
#[test]
fn render_and_count_show_a_videos_frames_groups_and_tokens() {
    let name = "v01_64x48_10fps_20f.mp4";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("request.json");
    std::fs::write(&path, video_chat(name, "video/mp4")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mmrouter"))
        .args(["render", "--model-dir", "qwen3-vl"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got["route"], "exact");
    let ids: Vec<u64> = serde_json::from_value(got["token_ids"].clone()).unwrap();
    assert_eq!(ids, golden_ids(name));
    let video = &got["images"][0]["video"];
    assert_eq!((video["frames"].as_u64(), video["groups"].as_u64()), (Some(4), Some(2)), "{got}");
    assert_eq!(got["images"][0]["tokens"], got["image_spans"][0]["length"]);

    let clip = format!("{}/tests/fixtures/video/clips/{name}", env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mmrouter"))
        .args(["count", "--model-dir", "qwen3-vl", "--json"])
        .arg(&clip)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    let span = got["image_spans"][0]["length"].as_u64();
    assert_eq!((rows[0]["width"].as_u64(), rows[0]["expansion_tokens"].as_u64()), (Some(64), span), "{rows}");
}
