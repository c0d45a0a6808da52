//! Faulty workers behind a real proxy (issue 12, the upstream side): retries before the first byte,
//! the retry budget, 429s, passive ejection and the half-open probe, honest stream endings, the
//! inter-chunk idle timeout, and `Connection`-listed headers. Behaviour is asserted, not durations.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::harness::*;

/// Sum of the samples of `name` whose label set contains every one of `labels` (`key="value"`),
/// whatever the label order.
fn sample(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            (n == name && labels.iter().all(|lab| rest.contains(lab))).then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

fn worker_label(name: &str) -> String {
    format!("worker=\"{name}\"")
}

/// Polls `cond` every 20 ms, at most 10 s.
async fn eventually(mut cond: impl AsyncFnMut() -> bool) -> bool {
    for _ in 0..500 {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Round robin spreads the requests (with `kv` the shared prompt prefix would pin them to one worker).
const SPREAD: &str = "[routing]\npolicy = \"round_robin\"";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_failing_30_percent_costs_no_client_500s_and_is_ejected() {
    let mut workers = sims(2, fast).await;
    workers.extend(
        sims(1, |o| {
            fast(o);
            o.error_rate = 0.3;
            o.seed = 7;
        })
        .await,
    );
    let bad = workers[2].name().to_owned();
    let c = cluster_with(workers, SPREAD).await;
    for i in 0..200 {
        let r = post(&c.url, chat_body(&[], &format!("question {i}"), false)).await;
        let status = r.status();
        let text = r.text().await.unwrap();
        assert_eq!(status, 200, "request {i}: {text}");
    }
    let m = metrics_text(&c.url).await;
    assert!(c.sims[2].stats().errors_injected > 0, "the bad worker did fail");
    assert!(sample(&m, "mmrouter_upstream_retries_total", &["reason=\"server_error\""]) >= 1.0, "{m}");
    assert_eq!(sample(&m, "mmrouter_worker_ejections_total", &[&worker_label(&bad)]), 1.0, "{m}");
    assert_eq!(sample(&m, "mmrouter_worker_state", &[&worker_label(&bad), "state=\"ejected\""]), 1.0);
    for good in [c.sims[0].name(), c.sims[1].name()] {
        assert_eq!(sample(&m, "mmrouter_worker_state", &[&worker_label(good), "state=\"healthy\""]), 1.0);
        assert_eq!(sample(&m, "mmrouter_worker_ejections_total", &[&worker_label(good)]), 0.0);
    }
    assert_eq!(sample(&m, "mmrouter_requests_total", &["status=\"500\""]), 0.0);
    assert_eq!(sample(&m, "mmrouter_requests_total", &["status=\"200\""]), 200.0);
    crate::metrics_format::promtool_accepts(&m);
    // Ejected means no traffic: the bad worker got nothing after its ejection.
    let before = c.sims[2].stats().requests;
    for i in 0..12 {
        assert_eq!(post(&c.url, chat_body(&[], &format!("after {i}"), false)).await.status(), 200);
    }
    assert_eq!(c.sims[2].stats().requests, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_everywhere_returns_the_workers_error_within_the_budget() {
    let workers = sims(3, |o| {
        fast(o);
        o.error_rate = 1.0;
    })
    .await;
    let toml = format!("{SPREAD}\n[retries]\nbudget_ratio = 0.2\nbudget_min_per_sec = 0.0\n");
    let c = cluster_with(workers, &toml).await;
    let n = 50;
    for i in 0..n {
        let r = post(&c.url, chat_body(&[], &format!("q {i}"), false)).await;
        assert_eq!(r.status(), 500);
        let v: serde_json::Value = r.json().await.unwrap();
        // The worker's own answer, not one of ours.
        assert_eq!(v["error"]["code"], "injected_error", "{v}");
    }
    let sent: u64 = c.sims.iter().map(|s| s.stats().requests).sum();
    assert!(sent <= n + n / 5, "retries amplified the outage: {sent} upstream requests for {n}");
    let m = metrics_text(&c.url).await;
    assert!(sample(&m, "mmrouter_retry_budget_exhausted_total", &[]) >= 1.0, "{m}");
    let retries = sample(&m, "mmrouter_upstream_retries_total", &[]);
    assert!(retries >= 1.0 && retries <= (n / 5) as f64, "{retries}");
    assert_eq!(sample(&m, "mmrouter_requests_total", &["status=\"500\""]), n as f64);
    // The pool's ejection cap (50 % of 3, so one worker) keeps the others serving their errors.
    assert_eq!(sample(&m, "mmrouter_worker_state", &["state=\"ejected\""]), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_moves_on_to_the_next_worker_or_reaches_the_client_with_retry_after() {
    let limited = |o: &mut mmrouter_sim::SimOptions| {
        fast(o);
        o.error_rate = 1.0;
        o.error_status = 429;
        o.error_retry_after_secs = Some(7);
    };
    let mut workers = sims(1, limited).await;
    workers.extend(sims(1, fast).await);
    let c = cluster_with(workers, SPREAD).await;
    for i in 0..6 {
        let r = post(&c.url, chat_body(&[], &format!("q {i}"), false)).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-mmrouter-worker"), c.sims[1].name());
    }
    let m = metrics_text(&c.url).await;
    assert!(sample(&m, "mmrouter_upstream_retries_total", &["reason=\"rate_limited\""]) >= 1.0, "{m}");
    // Busy is not broken: a 429 never ejects.
    let name = worker_label(c.sims[0].name());
    assert_eq!(sample(&m, "mmrouter_worker_ejections_total", &[&name]), 0.0);
    assert_eq!(sample(&m, "mmrouter_worker_state", &[&name, "state=\"healthy\""]), 1.0);

    let alone = cluster_with(sims(1, limited).await, "").await;
    let r = post(&alone.url, chat_body(&[], "hello", false)).await;
    assert_eq!(r.status(), 429);
    assert_eq!(header(&r, "retry-after"), "7");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_worker_comes_back_through_a_half_open_probe() {
    let mut workers = sims(1, fast).await;
    workers.extend(
        sims(1, |o| {
            fast(o);
            o.error_rate = 1.0;
        })
        .await,
    );
    let bad = workers[1].name().to_owned();
    // No active checks: only the probe can bring the worker back.
    let toml = format!(
        "[server]\nhealth_interval_ms = 0\n{SPREAD}\n[routing.ejection]\nconsecutive_failures = 2\nbase_ejection_ms = 200\n"
    );
    let c = cluster_with(workers, &toml).await;
    let mut i = 0;
    let ejected = eventually(async || {
        i += 1;
        assert_eq!(post(&c.url, chat_body(&[], &format!("q {i}"), false)).await.status(), 200);
        sample(&metrics_text(&c.url).await, "mmrouter_worker_ejections_total", &[&worker_label(&bad)]) >= 1.0
    })
    .await;
    assert!(ejected);
    c.sims[1].set_error_rate(0.0);
    let probed = eventually(async || {
        i += 1;
        let r = post(&c.url, chat_body(&[], &format!("q {i}"), false)).await;
        assert_eq!(r.status(), 200);
        header(&r, "x-mmrouter-worker") == bad
    })
    .await;
    assert!(probed, "the recovered worker was never probed");
    let m = metrics_text(&c.url).await;
    assert_eq!(sample(&m, "mmrouter_worker_state", &[&worker_label(&bad), "state=\"healthy\""]), 1.0, "{m}");
    // Full traffic again: round robin reaches it within two requests.
    let mut served = Vec::new();
    for j in 0..4 {
        let r = post(&c.url, chat_body(&[], &format!("after {j}"), false)).await;
        served.push(header(&r, "x-mmrouter-worker").to_owned());
    }
    assert!(served.iter().filter(|w| **w == bad).count() >= 2, "{served:?}");
}

/// Reads a streamed body to its end; `Err` if the connection broke instead of ending cleanly.
async fn read_all(mut r: reqwest::Response) -> Result<String, String> {
    let mut out = Vec::new();
    loop {
        match r.chunk().await {
            Ok(Some(b)) => out.extend_from_slice(&b),
            Ok(None) => return Ok(String::from_utf8_lossy(&out).into_owned()),
            Err(e) => return Err(format!("{e} after {:?}", String::from_utf8_lossy(&out))),
        }
    }
}

/// The SSE events of a body, `data: ` stripped.
fn events(text: &str) -> Vec<&str> {
    text.split_terminator("\n\n").filter_map(|e| e.trim_start_matches('\n').strip_prefix("data: ")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_by_the_worker_ends_with_an_error_event_and_counts_as_an_error() {
    let c = cluster_with(
        sims(1, |o| {
            fast(o);
            o.drop_mid_stream_rate = 1.0;
            // Tokens spaced out, so the head and the first tokens leave before the cut (an instant
            // cut is a failed attempt, retried or answered 502, not a cut stream).
            o.decode_ms_per_token = 20;
        })
        .await,
        "",
    )
    .await;
    let r = post(&c.url, chat_body(&[], "tell me more", true)).await;
    assert_eq!(r.status(), 200);
    let text = read_all(r).await.expect("the stream ends cleanly, with the error event");
    let ev = events(&text);
    assert!(ev.len() >= 3, "{text}");
    assert_eq!(ev[ev.len() - 1], "[DONE]", "{text}");
    let err: serde_json::Value = serde_json::from_str(ev[ev.len() - 2]).unwrap();
    assert_eq!(err["error"]["code"], "upstream_stream_cut", "{err}");
    assert_eq!(err["error"]["type"], "server_error");
    assert!(err["error"]["message"].is_string());
    // Tokens before the cut were relayed untouched.
    assert!(serde_json::from_str::<serde_json::Value>(ev[0]).unwrap()["choices"].is_array());
    let m = metrics_text(&c.url).await;
    assert_eq!(sample(&m, "mmrouter_requests_total", &["status=\"stream_error\""]), 1.0, "{m}");
    assert_eq!(sample(&m, "mmrouter_requests_total", &["status=\"200\""]), 0.0, "{m}");
    assert_eq!(sample(&m, "mmrouter_stream_errors_total", &["reason=\"upstream_error\""]), 1.0);
    assert_eq!(c.state.pools()[0].router.loads()[0].inflight.requests, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_is_cut_at_the_idle_timeout() {
    let c = cluster_with(
        sims(1, |o| {
            fast(o);
            o.stall_after_tokens = Some(2);
        })
        .await,
        "[server]\nupstream_idle_timeout_ms = 300",
    )
    .await;
    let r = post(&c.url, chat_body(&[], "tell me more", true)).await;
    assert_eq!(r.status(), 200);
    let text = read_all(r).await.expect("the stream ends cleanly, with the error event");
    let ev = events(&text);
    assert_eq!(ev[ev.len() - 1], "[DONE]", "{text}");
    let err: serde_json::Value = serde_json::from_str(ev[ev.len() - 2]).unwrap();
    assert_eq!(err["error"]["code"], "upstream_idle_timeout", "{err}");
    let m = metrics_text(&c.url).await;
    assert_eq!(sample(&m, "mmrouter_stream_errors_total", &["reason=\"idle_timeout\""]), 1.0, "{m}");
    assert_eq!(sample(&m, "mmrouter_requests_total", &["status=\"stream_error\""]), 1.0);
    // The stalled upstream request was dropped: the worker sees its client go away.
    assert!(eventually(async || c.sims[0].stats().cancelled == 1).await, "{:?}", c.sims[0].stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_listed_headers_are_dropped_both_ways() {
    use axum::http::HeaderMap;
    let seen: Arc<Mutex<Vec<HeaderMap>>> = Arc::default();
    let log = seen.clone();
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move |headers: HeaderMap| {
            let log = log.clone();
            async move {
                log.lock().unwrap().push(headers);
                (
                    [("connection", "x-hop-resp"), ("x-hop-resp", "secret"), ("x-kept-resp", "1")],
                    axum::Json(serde_json::json!({"object": "chat.completion", "choices": []})),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let toml = format!("[server]\nhealth_interval_ms = 0\n[[workers]]\nname = \"fake\"\nurl = \"http://{addr}\"\n");
    let c = proxy(Vec::new(), &toml).await;
    let r = client()
        .post(format!("{}/v1/chat/completions", c.url))
        .header("content-type", "application/json")
        .header("connection", "keep-alive, X-Hop-Req")
        .header("x-hop-req", "secret")
        .header("x-kept-req", "1")
        .body(chat_body(&[], "hi", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-kept-resp"), "1");
    assert!(r.headers().get("x-hop-resp").is_none(), "{:?}", r.headers());
    let seen = seen.lock().unwrap();
    let h = &seen[0];
    assert_eq!(h.get("x-kept-req").map(|v| v.as_bytes()), Some(&b"1"[..]));
    assert!(h.get("x-hop-req").is_none(), "{h:?}");
    assert!(!h.get_all("connection").iter().any(|v| v.to_str().unwrap_or("").contains("X-Hop-Req")), "{h:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_to_the_first_byte_is_retried_on_the_next_worker() {
    let mut workers = sims(1, |o| {
        fast(o);
        o.extra_delay_ms = 5_000;
    })
    .await;
    workers.extend(sims(1, fast).await);
    let toml = format!("[server]\nfirst_byte_timeout_ms = 300\n{SPREAD}");
    let c = cluster_with(workers, &toml).await;
    for i in 0..4 {
        let r = post(&c.url, chat_body(&[], &format!("q {i}"), false)).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-mmrouter-worker"), c.sims[1].name());
    }
    let m = metrics_text(&c.url).await;
    assert!(sample(&m, "mmrouter_upstream_retries_total", &["reason=\"timeout\""]) >= 1.0, "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_body_cut_mid_way_closes_the_connection_and_counts_as_an_error() {
    use futures_util::{stream, StreamExt};
    // A worker that sends its head and part of a JSON body, then fails.
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(|| async {
            let parts =
                stream::iter([Ok(bytes::Bytes::from_static(b"{\"id\":\"x\",")), Err(std::io::Error::other("boom"))])
                    .then(|item| async move {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        item
                    });
            axum::response::Response::builder()
                .header("content-type", "application/json")
                .body(axum::body::Body::from_stream(parts))
                .unwrap()
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let toml = format!("[server]\nhealth_interval_ms = 0\n[[workers]]\nname = \"cutter\"\nurl = \"http://{addr}\"\n");
    let c = proxy(Vec::new(), &toml).await;
    let r = post(&c.url, chat_body(&[], "hi", false)).await;
    assert_eq!(r.status(), 200, "the status was sent before the cut");
    assert!(read_all(r).await.is_err(), "the client must see the body fail, not end");
    let m = metrics_text(&c.url).await;
    assert_eq!(sample(&m, "mmrouter_requests_total", &["status=\"stream_error\""]), 1.0, "{m}");
    assert_eq!(sample(&m, "mmrouter_requests_total", &["status=\"200\""]), 0.0);
    assert_eq!(sample(&m, "mmrouter_stream_errors_total", &["reason=\"upstream_error\""]), 1.0);
}
