//! The load generator against small OpenAI-shaped servers on 127.0.0.1:0.
//!
//! The mock reads `x_prompt`, `x_cached`, `x_status` and `user` ("conversation/turn") from the
//! request body, answers `usage` with those numbers (SSE or JSON, as the body's `stream` asks),
//! and records the order in which turns arrive and complete.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::State;
use axum::http::{Response, StatusCode};
use axum::routing::post;
use axum::Router;
use mmrouter_loadgen::{generate_workload, run, LoadgenOptions, WorkloadOptions};
use serde_json::{json, Value};

#[derive(Default)]
struct Seen {
    /// Per conversation: turns whose handler finished.
    done: HashMap<String, Vec<u64>>,
    /// Requests whose previous turn had not finished when they arrived.
    out_of_order: Vec<String>,
    requests: u64,
    /// Requests per mock name.
    by_mock: HashMap<&'static str, u64>,
}

#[derive(Clone)]
struct Mock {
    name: &'static str,
    seen: Arc<Mutex<Seen>>,
}

async fn chat(State(m): State<Mock>, body: String) -> Response<Body> {
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let user = v["user"].as_str().unwrap_or("anon/0").to_string();
    let (conv, turn) = user.split_once('/').unwrap_or(("anon", "0"));
    let turn: u64 = turn.parse().unwrap_or(0);
    {
        let mut seen = m.seen.lock().expect("lock");
        seen.requests += 1;
        *seen.by_mock.entry(m.name).or_insert(0) += 1;
        let done = seen.done.get(conv).map_or(0, |d| d.len() as u64);
        if done != turn {
            seen.out_of_order.push(user.clone());
        }
    }
    // Hold first turns a little, so that a later turn sent too early would arrive meanwhile.
    if turn == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    }
    m.seen.lock().expect("lock").done.entry(conv.to_string()).or_default().push(turn);

    let status = v["x_status"].as_u64().unwrap_or(200) as u16;
    let usage = json!({
        "prompt_tokens": v["x_prompt"].as_u64().unwrap_or(0),
        "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": v["x_cached"].as_u64().unwrap_or(0)},
    });
    let builder = Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(
            "x-mmrouter-route",
            if v["x_route"].is_string() { v["x_route"].as_str().unwrap_or("") } else { "no_media" },
        )
        .header("x-mmrouter-worker", m.name);
    let resp = if status != 200 {
        builder.body(Body::from(r#"{"error":{"message":"boom","type":"server_error","code":null}}"#))
    } else if v["stream"] == true {
        let chunk = json!({"choices": [{"index": 0, "delta": {"content": "ok"}}], "usage": null});
        let last = json!({"choices": [], "usage": usage});
        builder
            .header("content-type", "text/event-stream")
            .body(Body::from(format!("data: {chunk}\n\ndata: {last}\n\ndata: [DONE]\n\n")))
    } else {
        let answer =
            json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}], "usage": usage});
        builder.header("content-type", "application/json").body(Body::from(answer.to_string()))
    };
    resp.unwrap_or_else(|_| Response::new(Body::empty()))
}

/// Starts a mock recording into `seen` (shared by mocks of one test: turns of a conversation may
/// go to different mocks).
async fn start_mock(name: &'static str, seen: Arc<Mutex<Seen>>) -> (String, Arc<Mutex<Seen>>) {
    let app = Router::new().route("/v1/chat/completions", post(chat)).with_state(Mock { name, seen: seen.clone() });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), seen)
}

/// Writes `conversations` × `turns` lines, conversation-major (so the loader must skip ahead to
/// other conversations while one is in flight); turn t of conversation c has
/// prompt 100·(t+1) tokens of which 50·t cached. One extra line answers 500.
fn write_workload(path: &Path, conversations: u64, turns: u64, stream: bool) -> (u64, u64) {
    let mut out = String::new();
    let (mut prompt, mut cached) = (0, 0);
    for c in 0..conversations {
        for t in 0..turns {
            let body = json!({
                "model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream,
                "user": format!("c{c}/{t}"), "x_prompt": 100 * (t + 1), "x_cached": 50 * t,
                "x_route": if c % 2 == 0 { "exact" } else { "text_prefix" },
            });
            out.push_str(
                &json!({"path": "/v1/chat/completions", "conversation": format!("c{c}"), "turn": t, "body": body})
                    .to_string(),
            );
            out.push('\n');
            prompt += 100 * (t + 1);
            cached += 50 * t;
        }
    }
    let failing = json!({"path": "/v1/chat/completions", "conversation": "bad", "turn": 0,
        "body": {"user": "bad/0", "x_status": 500}});
    out.push_str(&failing.to_string());
    out.push('\n');
    std::fs::write(path, out).expect("write workload");
    (prompt, cached)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_counts_usage_routes_and_keeps_turn_order() {
    for stream in [true, false] {
        let dir = tempfile::tempdir().expect("tempdir");
        let workload = dir.path().join("w.jsonl");
        let (prompt, cached) = write_workload(&workload, 5, 4, stream);
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (url_a, _) = start_mock("a", seen.clone()).await;
        let (url_b, _) = start_mock("b", seen.clone()).await;

        let mut opts = LoadgenOptions::new(vec![url_a, format!("{url_b}/")], workload);
        opts.concurrency = Some(4);
        opts.label = "mock".into();
        opts.json_out = Some(dir.path().join("r.json"));
        let r = run(opts).await.expect("run");

        assert_eq!(r.requests, 21);
        assert_eq!(r.ok, 20);
        assert_eq!(r.errors.get("http_500"), Some(&1));
        assert_eq!((r.prompt_tokens, r.cached_tokens), (prompt, cached));
        assert!((r.cached_ratio - cached as f64 / prompt as f64).abs() < 1e-12);
        assert_eq!(r.usage_missing, 0);
        // Conversations c0, c2, c4 are "exact", c1 and c3 "text_prefix", 4 turns each.
        assert_eq!(r.routes.get("exact"), Some(&12));
        assert_eq!(r.routes.get("text_prefix"), Some(&8));
        assert_eq!(r.latency_ms.count, 20);
        assert_eq!(r.ttfb_ms.count, 20);
        assert!(r.latency_ms.p50 <= r.latency_ms.p99);
        // The mocks name themselves in x-mmrouter-worker.
        assert_eq!(r.workers.values().sum::<u64>(), 20);
        let seen = seen.lock().expect("lock");
        assert_eq!(seen.requests, 21);
        // Round-robin over the two base URLs: 21 requests split 11/10.
        let (na, nb) = (seen.by_mock.get("a").copied().unwrap_or(0), seen.by_mock.get("b").copied().unwrap_or(0));
        assert!(na.abs_diff(nb) <= 1 && na + nb == 21, "{na} vs {nb}");
        // A turn was never sent before the previous turn of its conversation was answered.
        assert!(seen.out_of_order.is_empty(), "{:?}", seen.out_of_order);
        assert_eq!(seen.done.get("c3"), Some(&vec![0, 1, 2, 3]));

        let written: mmrouter_loadgen::Report =
            serde_json::from_slice(&std::fs::read(dir.path().join("r.json")).expect("json report")).expect("parse");
        // Floats may differ in the last digit after a JSON round trip; compare the counts.
        assert_eq!((written.requests, written.ok, &written.errors), (r.requests, r.ok, &r.errors));
        assert_eq!((written.prompt_tokens, written.cached_tokens, &written.routes), (prompt, cached, &r.routes));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_and_max_requests() {
    let dir = tempfile::tempdir().expect("tempdir");
    let workload = dir.path().join("w.jsonl");
    write_workload(&workload, 3, 3, true);
    let (url, seen) = start_mock("a", Arc::default()).await;

    let mut opts = LoadgenOptions::new(vec![url.clone()], workload.clone());
    opts.rate = Some(500.0);
    let r = run(opts).await.expect("open loop");
    assert_eq!((r.requests, r.ok), (10, 9));
    assert!(r.mode.starts_with("open("));
    assert!(seen.lock().expect("lock").out_of_order.is_empty());

    let mut opts = LoadgenOptions::new(vec![url], workload);
    opts.concurrency = Some(2);
    opts.max_requests = Some(4);
    let r = run(opts).await.expect("max requests");
    assert_eq!(r.requests, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_a_generated_workload() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = WorkloadOptions::with_out(dir.path().join("w.jsonl"));
    w.conversations = 4;
    w.turns = 2;
    w.images_dir = Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/images"));
    let n = generate_workload(&w).expect("generate");
    let (url, seen) = start_mock("a", Arc::default()).await;
    let mut opts = LoadgenOptions::new(vec![url], w.out.clone());
    opts.concurrency = Some(3);
    let r = run(opts).await.expect("run");
    assert_eq!(r.requests, n as u64);
    assert_eq!(r.ok, n as u64);
    assert_eq!(seen.lock().expect("lock").requests, n as u64);
}

#[tokio::test]
async fn a_bad_workload_line_names_the_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let workload = dir.path().join("w.jsonl");
    std::fs::write(&workload, "{\"path\":\"/v1/chat/completions\",\"conversation\":1,\"body\":{}}\nnot json\n")
        .expect("write");
    let err = run(LoadgenOptions::new(vec!["http://127.0.0.1:9".into()], workload)).await.expect_err("bad line");
    assert!(err.to_string().contains(":2:"), "{err}");
}

#[tokio::test]
async fn a_refused_connection_is_counted_not_fatal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let workload = dir.path().join("w.jsonl");
    write_workload(&workload, 1, 1, false);
    // Bind then drop: the port is (very likely) closed for the run.
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let r = run(LoadgenOptions::new(vec![format!("http://127.0.0.1:{port}")], workload)).await.expect("run");
    assert_eq!(r.ok, 0);
    assert_eq!(r.errors.values().sum::<u64>(), 2);
}
