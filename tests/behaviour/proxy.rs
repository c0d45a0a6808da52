//! The proxy through real sockets: byte-identical forwarding, streaming, errors, cancellation, metrics.

use std::time::{Duration, Instant};

use crate::harness::*;
use futures_util::StreamExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_and_image_chats_reach_the_worker_byte_identical() {
    let c = cluster_with(sims(2, fast).await, "[media]\nallow_cidrs = [\"127.0.0.0/8\"]").await;
    let img = data_url("rocket.jpg");
    let cases = [
        (chat_body(&[], "Hello there, how are you?", false), "no_media", false),
        (chat_body(&[], "Hello there, streaming now", true), "no_media", true),
        (chat_body(std::slice::from_ref(&img), "What is in this picture?", false), "exact", false),
        (chat_body(std::slice::from_ref(&img), "Describe it, streaming.", true), "exact", true),
    ];
    for (body, route, stream) in cases {
        // Odd but valid formatting must survive: the worker sees the client's exact bytes (on the
        // exact route to vLLM, plus each image's uuid).
        let mut bytes = b"  \n".to_vec();
        bytes.extend_from_slice(&body);
        let expected = if route == "exact" { with_uuids(&bytes) } else { bytes.clone() };
        let r = post(&c.url, bytes).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-sim-body-sha256"), sha256_hex(&expected), "worker saw different bytes");
        // A spliced body goes out in pieces, still with its exact length (not chunked).
        assert_eq!(header(&r, "x-sim-body-framing"), "length");
        assert_eq!(header(&r, "x-mmrouter-route"), route);
        let worker = header(&r, "x-mmrouter-worker").to_owned();
        assert!(c.sims.iter().any(|s| s.name() == worker), "unknown worker {worker}");
        let ctype = header(&r, "content-type").to_owned();
        let text = r.text().await.unwrap();
        if stream {
            assert!(ctype.starts_with("text/event-stream"), "{ctype}");
            assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
            assert!(text.contains("\"usage\""), "include_usage chunk missing: {text}");
        } else {
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["object"], "chat.completion");
            assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
        }
    }
    // Every load taken was released.
    for l in c.state.pools()[0].router.loads() {
        assert_eq!(l.inflight.requests, 0, "{l:?}");
        assert_eq!(l.inflight.prefill_tokens, 0, "{l:?}");
        assert_eq!(l.inflight.image_tokens, 0, "{l:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_are_relayed_as_they_arrive() {
    // 20 tokens at 100 ms each: a buffering proxy would deliver nothing for ~2 s.
    let c = cluster_with(
        sims(1, |o| {
            fast(o);
            o.decode_ms_per_token = 100;
        })
        .await,
        "",
    )
    .await;
    let mut body: serde_json::Value = serde_json::from_slice(&chat_body(&[], "count slowly", true)).unwrap();
    body["max_tokens"] = 20.into();
    let t0 = Instant::now();
    let r = post(&c.url, serde_json::to_vec(&body).unwrap()).await;
    let mut stream = r.bytes_stream();
    let mut chunks_before_end = 0;
    let mut first_at = None;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.unwrap();
        if String::from_utf8_lossy(&chunk).contains("\"content\"") {
            first_at.get_or_insert(t0.elapsed());
            chunks_before_end += 1;
        }
    }
    let total = t0.elapsed();
    let first = first_at.expect("content chunks arrive");
    assert!(chunks_before_end >= 5, "chunks were coalesced: {chunks_before_end}");
    // Ordering, not absolute speed: the first token arrives well before the stream ends.
    assert!(first * 3 < total, "first content after {first:?} of {total:?}: buffered?");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_cancels_the_upstream_request() {
    let c = cluster_with(
        sims(1, |o| {
            fast(o);
            o.decode_ms_per_token = 50;
        })
        .await,
        "",
    )
    .await;
    let mut body: serde_json::Value = serde_json::from_slice(&chat_body(&[], "a long story", true)).unwrap();
    body["max_tokens"] = 1000.into();
    let r = post(&c.url, serde_json::to_vec(&body).unwrap()).await;
    let mut stream = r.bytes_stream();
    let _ = stream.next().await.expect("first chunk").unwrap();
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.sims[0].stats().cancelled == 0 {
        assert!(Instant::now() < deadline, "the worker never saw the cancellation");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // And the router released the request's load.
    let deadline = Instant::now() + Duration::from_secs(5);
    while c.state.pools()[0].router.loads()[0].inflight.requests != 0 {
        assert!(Instant::now() < deadline, "load not released after disconnect");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(c.sims[0].stats().in_flight, 0);
}

fn assert_openai_error(v: &serde_json::Value) {
    let e = &v["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e["type"].is_string(), "{v}");
    assert!(e["code"].is_string(), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bodies_get_openai_errors_and_nothing_is_forwarded() {
    let c = cluster_with(sims(1, fast).await, "[server]\nmax_body_bytes = 4096").await;
    for (body, status) in
        [(b"{\"model\": \"m\", \"messages\": [".to_vec(), 400), (b"[1, 2, 3]".to_vec(), 400), (vec![b' '; 5000], 413)]
    {
        let r = post(&c.url, body).await;
        assert_eq!(r.status(), status);
        let v: serde_json::Value = r.json().await.unwrap();
        assert_openai_error(&v);
    }
    assert_eq!(c.sims[0].stats().requests, 0, "a rejected body reached the worker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_worker_is_a_502_within_the_connect_timeout() {
    // A port that was bound and released: connections are refused.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let toml = format!(
        "[server]\nconnect_timeout_ms = 500\nhealth_interval_ms = 0\n[[workers]]\nname = \"dead\"\nurl = \"http://{dead}\"\n"
    );
    let c = proxy(Vec::new(), &toml).await;
    let t0 = Instant::now();
    let r = post(&c.url, chat_body(&[], "hi", false)).await;
    assert_eq!(r.status(), 502);
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_openai_error(&r.json().await.unwrap());
    // Now marked unhealthy: the next request is refused at once with 503.
    let r = post(&c.url, chat_body(&[], "hi", false)).await;
    assert_eq!(r.status(), 503);
    assert_openai_error(&r.json().await.unwrap());
    assert_eq!(c.state.pools()[0].router.loads()[0].inflight.requests, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_failure_is_retried_on_another_worker() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let live = sims(1, fast).await;
    let toml = format!(
        "[server]\nhealth_interval_ms = 0\n[routing]\npolicy = \"round_robin\"\n[[workers]]\nname = \"dead\"\nurl = \"http://{dead}\"\n[[workers]]\nname = {:?}\nurl = {:?}\n",
        live[0].name(),
        live[0].url()
    );
    let c = proxy(live, &toml).await;
    for _ in 0..3 {
        let r = post(&c.url, chat_body(&[], "hi", false)).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-mmrouter-worker"), c.sims[0].name());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_worker_is_a_504_at_the_first_byte_timeout() {
    let c = cluster_with(
        sims(1, |o| {
            fast(o);
            o.extra_delay_ms = 3000;
        })
        .await,
        "[server]\nfirst_byte_timeout_ms = 300\ntotal_timeout_ms = 10000",
    )
    .await;
    let t0 = Instant::now();
    let r = post(&c.url, chat_body(&[], "hi", false)).await;
    assert_eq!(r.status(), 504);
    assert!(t0.elapsed() < Duration::from_millis(2500), "{:?}", t0.elapsed());
    assert_openai_error(&r.json().await.unwrap());
    assert_eq!(c.state.pools()[0].router.loads()[0].inflight.requests, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_health_passthrough_and_metrics() {
    let c = cluster_with(sims(2, fast).await, "").await;
    let r = client().get(format!("{}/v1/models", c.url)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["object"], "list");
    assert!(v["data"][0]["id"].is_string());

    let r = client().get(format!("{}/health", c.url)).send().await.unwrap();
    assert_eq!(r.status(), 200);

    let r = client()
        .post(format!("{}/v1/completions", c.url))
        .header("content-type", "application/json")
        .body(r#"{"model":"m","prompt":"Once upon a time","max_tokens":4}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-mmrouter-route"), "no_media");
    let _ = r.text().await;
    let _ = post(&c.url, chat_body(&[], "hello", false)).await.text().await;

    let text = metrics_text(&c.url).await;
    for name in [
        mmrouter::observe::REQUESTS_TOTAL,
        mmrouter::observe::UPSTREAM_REQUESTS_TOTAL,
        mmrouter::observe::WORKER_INFLIGHT_REQUESTS,
        mmrouter::observe::STAGE_DURATION_SECONDS,
    ] {
        assert!(text.contains(name), "{name} missing from /metrics");
    }
    assert!(text.contains("stage=\"forward_ttfb\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_image_urls_are_refused_unless_configured_to_fall_back() {
    let blocked = "http://2130706434:9/cat.png".to_owned();
    let body = chat_body(std::slice::from_ref(&blocked), "what is this?", false);
    // Default: a 400 OpenAI error naming the policy, nothing forwarded (the worker would fetch it).
    let c = cluster_with(sims(1, fast).await, "").await;
    let r = post(&c.url, body.clone()).await;
    assert_eq!(r.status(), 400);
    let err = r.json::<serde_json::Value>().await.unwrap();
    assert_openai_error(&err);
    assert_eq!(err["error"]["code"], "image_url_blocked");
    assert_eq!(c.sims[0].stats().requests, 0);

    // reject_blocked_urls = false: the request still reaches a worker unchanged, on its text prefix.
    let c = cluster_with(sims(1, fast).await, "[media]\nreject_blocked_urls = false").await;
    let r = post(&c.url, body.clone()).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-mmrouter-route"), "text_prefix");
    assert_eq!(header(&r, "x-sim-body-sha256"), sha256_hex(&body));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_urls_are_refused_even_when_the_request_falls_back_for_another_reason() {
    let blocked = "http://[::ffff:127.0.0.1]:9/x.png".to_owned();
    let too_wide = png_data_url(6000, 20, 1); // Qwen refuses aspect ratios above 200
    let with_audio = br#"{"model":"m","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}},{"type":"image_url","image_url":{"url":"http://[::ffff:127.0.0.1]:9/x.png"}}]}]}"#;
    let cases: Vec<(&str, &str, Vec<u8>)> = vec![
        ("an image that cannot be accounted comes first", "", chat_body(&[too_wide, blocked.clone()], "hi", false)),
        ("an unsupported media part", "", with_audio.to_vec()),
        (
            "exact accounting off (nothing is fetched)",
            "[model]\nexact_accounting = false",
            chat_body(std::slice::from_ref(&blocked), "hi", false),
        ),
        ("a file: URL", "", chat_body(&["file:///etc/passwd".to_owned()], "hi", false)),
        ("a gopher: URL", "", chat_body(&["gopher://127.0.0.1:70/_x".to_owned()], "hi", false)),
    ];
    for (name, extra, body) in cases {
        let c = cluster_with(sims(1, fast).await, extra).await;
        let r = post(&c.url, body).await;
        assert_eq!(r.status(), 400, "{name}");
        let err = r.json::<serde_json::Value>().await.unwrap();
        assert_eq!(err["error"]["code"], "image_url_blocked", "{name}: {err}");
        assert_eq!(c.sims[0].stats().requests, 0, "{name}: forwarded");
    }
}

/// A chat body whose image part carries its own `uuid` (placed before `image_url`, as a client may).
fn body_with_client_uuid(image_url: &str, uuid: &str) -> Vec<u8> {
    format!(
        r#"{{"model":"m","max_tokens":4,"messages":[{{"role":"user","content":[{{"type":"image_url","uuid":"{uuid}","image_url":{image_url}}},{{"type":"text","text":"what is this?"}}]}}]}}"#
    )
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_uuids_are_replaced_or_refused_unless_trusted() {
    let img = data_url("rocket.jpg");
    let c = cluster_with(sims(1, fast).await, "").await;
    // Exact route: the client's uuid is overwritten with the image's content hash.
    let body = body_with_client_uuid(&format!(r#"{{"url":"{img}"}}"#), "someone-elses-image");
    let r = post(&c.url, body.clone()).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-mmrouter-route"), "exact");
    let digest = {
        use base64::Engine;
        let raw = base64::engine::general_purpose::STANDARD.decode(img.split_once("base64,").unwrap().1).unwrap();
        blake3::hash(&raw).to_hex().to_string()
    };
    let expected = String::from_utf8(body).unwrap().replace("someone-elses-image", &digest);
    assert_eq!(header(&r, "x-sim-body-sha256"), sha256_hex(expected.as_bytes()));

    // A fallback cannot replace it, and `image_url: null` names cached features: both refused, nothing sent.
    let wide = png_data_url(5000, 20, 3);
    for body in [
        body_with_client_uuid(&format!(r#"{{"url":"{wide}"}}"#), "x"),
        body_with_client_uuid("null", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"),
    ] {
        let before = c.sims[0].stats().requests;
        let r = post(&c.url, body).await;
        assert_eq!(r.status(), 400);
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "client_uuid_untrusted", "{v}");
        assert_eq!(c.sims[0].stats().requests, before);
    }

    // trust_client_uuids: the client's uuid stays, on every route; the body is forwarded as sent. The
    // fallback here comes from a router limit (the worker serves the image; it would refuse the strip).
    let trusting = cluster_with(sims(1, fast).await, "[media]\ntrust_client_uuids = true\nmax_pixels = 1000000").await;
    let large = png_data_url(1200, 1000, 3);
    for (body, route) in [
        (body_with_client_uuid(&format!(r#"{{"url":"{img}"}}"#), "client-id"), "exact"),
        (body_with_client_uuid(&format!(r#"{{"url":"{large}"}}"#), "client-id"), "text_prefix"),
    ] {
        let r = post(&trusting.url, body.clone()).await;
        assert_eq!(r.status(), 200, "{route}");
        assert_eq!(header(&r, "x-mmrouter-route"), route);
        assert_eq!(header(&r, "x-sim-body-sha256"), sha256_hex(&body));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_workers_get_the_body_unchanged() {
    let sims = sims(1, fast).await;
    let toml = format!("[[workers]]\nname = {:?}\nurl = {:?}\nengine = \"sglang\"\n", sims[0].name(), sims[0].url());
    let c = proxy(sims, &toml).await;
    let body = chat_body(&[data_url("red.jpg")], "what colour?", false);
    let r = post(&c.url, body.clone()).await;
    assert_eq!(header(&r, "x-mmrouter-route"), "exact");
    assert_eq!(header(&r, "x-sim-body-sha256"), sha256_hex(&body), "no uuid for SGLang");
}
