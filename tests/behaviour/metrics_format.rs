//! `/metrics` after traffic that touches every metric family is valid Prometheus text as
//! `promtool check metrics` (what Prometheus' own tooling and CI use) judges it, and names every
//! metric of `mmrouter::observe`.
//!
//! promtool comes from the Debian package `prometheus` (`.ci/run` installs it). Without it the test
//! skips with a message, except under `CI`, where a missing promtool is a failure.

use std::io::Write;
use std::process::{Command, Stdio};

use mmrouter::observe as m;
use serde_json::json;

use crate::harness;

const MODEL: &str = "Qwen/Qwen3-VL-8B-Instruct";

/// Every metric family of the design; the text must describe and sample each one.
const FAMILIES: [&str; 15] = [
    m::REQUESTS_TOTAL,
    m::MM_FALLBACK_TOTAL,
    m::IMAGE_TOKENS_PER_REQUEST,
    m::IMAGES_PER_REQUEST,
    m::WORKER_INFLIGHT_IMAGE_TOKENS,
    m::WORKER_INFLIGHT_REQUESTS,
    m::WORKER_INFLIGHT_PREFILL_TOKENS,
    m::KV_OVERLAP_TOKENS,
    m::STAGE_DURATION_SECONDS,
    m::IMAGE_PROBE_DURATION_SECONDS,
    m::PROMPT_TOKENS_DRIFT,
    m::INDEX_BLOCKS,
    m::UPSTREAM_REQUESTS_TOTAL,
    m::INDEX_BLOCKS_BY_SOURCE,
    m::WORKER_STATE,
];

const STAGES: [&str; 5] =
    [m::stage::INTAKE, m::stage::ACCOUNT, m::stage::PLAN, m::stage::SELECT, m::stage::FORWARD_TTFB];

#[test]
fn metrics_page_passes_promtool_and_names_every_family() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let text = rt.block_on(traffic_then_metrics());

    for name in FAMILIES {
        assert!(text.lines().any(|l| l.starts_with(&format!("# TYPE {name} "))), "no # TYPE line for {name}");
        assert!(text.lines().any(|l| l.starts_with(&format!("# HELP {name} "))), "no # HELP line for {name}");
        assert!(text.lines().any(|l| !l.starts_with('#') && l.starts_with(name)), "no sample of {name} in:\n{text}");
    }
    for stage in STAGES {
        let count = format!("{}_count{{stage=\"{stage}\"}}", m::STAGE_DURATION_SECONDS);
        assert!(text.lines().any(|l| l.starts_with(&count)), "stage {stage} never recorded");
    }
    for route in ["no_media", "exact", "text_prefix"] {
        let key = format!("{}{{route=\"{route}\",status=\"200\"}}", m::REQUESTS_TOTAL);
        assert!(text.lines().any(|l| l.starts_with(&key)), "no {key} sample");
    }
    assert!(harness::metric(&text, &format!("{}_count", m::PROMPT_TOKENS_DRIFT), "") >= 1.0, "no drift sample");
    assert!(
        harness::metric(&text, m::MM_FALLBACK_TOTAL, "reason=\"too_large\"") >= 1.0,
        "the 1.2 MP image fell back for another reason:\n{text}"
    );

    promtool_accepts(&text);
}

/// Fails unless `promtool check metrics` accepts `text` (skips where promtool is missing, outside CI).
pub(crate) fn promtool_accepts(text: &str) {
    let Some(promtool) = promtool() else { return };
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(text.as_bytes()).unwrap();
    let stdin = std::fs::File::open(file.path()).unwrap();
    let out = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::from(stdin))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {promtool}: {e}"));
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("promtool check metrics ({}):\n{report}", out.status);
    assert!(
        out.status.success(),
        "promtool check metrics failed ({}):\n{report}\n--- /metrics ---\n{text}",
        out.status
    );
}

/// `promtool` if on PATH; `None` (skip) outside CI, a failure under `CI`.
fn promtool() -> Option<String> {
    let found = Command::new("promtool").arg("--version").output().is_ok_and(|o| o.status.success());
    if found {
        return Some("promtool".into());
    }
    assert!(std::env::var_os("CI").is_none(), "promtool missing: .ci/run should install Debian package prometheus");
    eprintln!("skipping promtool check: promtool not found (Debian package prometheus)");
    None
}

/// Sends one request per route and endpoint (reading every body to its end, so end-of-stream metrics
/// are recorded), then returns the proxy's `/metrics` text.
async fn traffic_then_metrics() -> String {
    let sims = harness::sims(2, |o| {
        o.ttft_base_ms = 0;
        o.prefill_us_per_token = 0;
        o.decode_ms_per_token = 0;
    })
    .await;
    // A router pixel limit below the worker's: the router falls back, the worker serves the image.
    let cluster = harness::cluster_with(sims, "[media]\nmax_pixels = 1000000").await;
    let chat = format!("{}/v1/chat/completions", cluster.url);

    let large = harness::png_data_url(1200, 1000, 7);
    let cases = [
        ("no_media", harness::chat_body(&[], &harness::unique("text"), false)),
        ("exact", harness::chat_body(&[harness::data_url("rocket.jpg")], &harness::unique("image"), false)),
        ("text_prefix", harness::chat_body(&[large], &harness::unique("large"), false)),
        ("no_media", harness::chat_body(&[], &harness::unique("stream"), true)),
    ];
    for (route, body) in cases {
        let resp = post(&chat, body).await;
        assert_eq!(header(&resp, "x-mmrouter-route"), route);
        let status = resp.status();
        let text = resp.text().await.unwrap();
        assert!(status.is_success(), "{route}: {status} {text}");
    }

    let completion = json!({"model": MODEL, "prompt": harness::unique("complete"), "max_tokens": 4});
    let resp = post(&format!("{}/v1/completions", cluster.url), serde_json::to_vec(&completion).unwrap()).await;
    let status = resp.status();
    let text = resp.text().await.unwrap();
    assert!(status.is_success(), "completion: {status} {text}");

    harness::metrics_text(&cluster.url).await
}

async fn post(url: &str, body: Vec<u8>) -> reqwest::Response {
    harness::client().post(url).header("content-type", "application/json").body(body).send().await.unwrap()
}

fn header<'a>(resp: &'a reqwest::Response, name: &str) -> &'a str {
    resp.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}
