//! Video reads are bounded (issue 48): a 500 MB video URL is cut at `[media] max_video_bytes`, however
//! the server frames it (no length, an honest `Content-Length`, a `206` whose `Content-Range` gives the
//! whole size), in bounded time and without reading past the limit (the server counts what it wrote
//! before the client hung up); and a header declaring 10⁹ frames in a few KB is refused by arithmetic.
//! Both reach the pipeline as text-prefix fallbacks with their reason (`too_large`, `video_invalid`).
//! The server listens on 127.0.0.1, allowed past the SSRF guard by `allow_cidrs`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use mmrouter_core::media::{Intake, MediaConfig, MediaError};
use mmrouter_core::model::{ModelSource, ModelSpec};
use mmrouter_core::pipeline::{Pipeline, PipelineConfig, Route};
use mmrouter_core::request::{Endpoint, Request};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

/// What the server says it is sending: 500 MB.
const SERVED: usize = 500 * 1000 * 1000;
/// `media.max_video_bytes` in these tests.
const LIMIT: usize = 4 * 1024 * 1024;
/// Bytes the server may write past the limit before it sees the client gone: what the two kernels'
/// socket buffers hold (the server's send buffer is set to 64 KiB; the client's receive buffer is the
/// kernel's) and the chunk in hand. Measured 0.2-1.2 MiB past the limit on an idle loopback.
const SLACK: usize = 4 * 1024 * 1024;

#[derive(Clone, Copy, Debug)]
enum Framing {
    /// `200`, no length: the body ends when the connection closes.
    Unframed,
    /// `200` with `Content-Length: 500000000`.
    Declared,
    /// `206` with `Content-Range: bytes 0-<asked>/500000000` (the server honours the client's `Range`).
    Ranged,
}

#[derive(Default)]
struct Served {
    written: AtomicUsize,
    completed: AtomicBool,
    /// Set when a write failed: the client went away.
    hung_up: AtomicBool,
}

/// An HTTP server on 127.0.0.1 that answers every request with a 500 MB video: the committed MP4's
/// bytes, then zeros. One connection at a time is enough here.
async fn big_video_server(framing: Framing) -> (String, Arc<Served>) {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_send_buffer_size(64 * 1024).unwrap(); // inherited by accepted sockets
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(16).unwrap();
    let addr = listener.local_addr().unwrap();
    let served = Arc::new(Served::default());
    let st = Arc::clone(&served);
    let start = std::fs::read(crate::fixtures().join("video/clips/v01_64x48_10fps_20f.mp4")).unwrap();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match sock.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
            let asked = text
                .lines()
                .find_map(|l| l.strip_prefix("range: bytes=0-"))
                .and_then(|e| e.trim().parse::<usize>().ok())
                .unwrap_or(SERVED - 1);
            let (status, length) = match framing {
                Framing::Unframed => ("200 OK".to_owned(), None),
                Framing::Declared => ("200 OK".to_owned(), Some(SERVED)),
                Framing::Ranged => (format!("206 Partial Content\r\nContent-Range: bytes 0-{asked}/{SERVED}"), None),
            };
            let mut hdr = format!("HTTP/1.1 {status}\r\nContent-Type: video/mp4\r\nConnection: close\r\n");
            if let Some(n) = length {
                hdr.push_str(&format!("Content-Length: {n}\r\n"));
            }
            hdr.push_str("\r\n");
            if sock.write_all(hdr.as_bytes()).await.is_err() {
                continue;
            }
            let mut first = start.clone();
            first.resize(64 * 1024, 0);
            let zeros = vec![0u8; 64 * 1024];
            let mut written = 0;
            while written < SERVED {
                let chunk = if written == 0 { &first } else { &zeros };
                if sock.write_all(chunk).await.is_err() {
                    st.hung_up.store(true, Ordering::SeqCst);
                    break;
                }
                written += chunk.len();
                st.written.store(written, Ordering::SeqCst);
            }
            st.completed.store(written >= SERVED, Ordering::SeqCst);
        }
    });
    (format!("http://{addr}/big.mp4"), served)
}

fn cfg() -> MediaConfig {
    MediaConfig { allow_cidrs: vec!["127.0.0.1/32".into()], max_video_bytes: LIMIT, ..MediaConfig::default() }
}

fn chat(url: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What happens in this clip?"},
        {"type": "video_url", "video_url": {"url": url}}
    ]}]}))
    .unwrap()
}

fn pipeline(media: MediaConfig) -> Pipeline {
    let model = ModelSpec::new(ModelSource::Bundled("qwen3-vl"));
    Pipeline::new(&PipelineConfig { model, media }).unwrap()
}

/// Waits (a little) for the server to notice the client hung up, then checks what it wrote.
async fn wrote_at_most_the_limit(served: &Served, what: &str) -> usize {
    for _ in 0..100 {
        if served.hung_up.load(Ordering::SeqCst) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let written = served.written.load(Ordering::SeqCst);
    assert!(served.hung_up.load(Ordering::SeqCst), "{what}: the client never hung up ({written} bytes written)");
    assert!(!served.completed.load(Ordering::SeqCst), "{what}: all 500 MB were read");
    assert!(written <= LIMIT + SLACK, "{what}: {written} bytes served, over {LIMIT} + {SLACK}");
    written
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_500_mb_video_url_is_cut_at_max_video_bytes_in_bounded_time() {
    for framing in [Framing::Unframed, Framing::Declared, Framing::Ranged] {
        let what = format!("{framing:?}");
        // The intake: a typed refusal naming the limit.
        let (url, served) = big_video_server(framing).await;
        let intake = Intake::new(cfg()).unwrap();
        let started = Instant::now();
        let report = intake.process_media(&[], &[&url]).await;
        let elapsed = started.elapsed();
        let err = report.media.map(|_| ()).unwrap_err();
        assert!(matches!(err, MediaError::VideoTooLarge { limit: LIMIT, .. }), "{what}: {err:?}");
        assert_eq!(err.label(), "too_large", "{what}");
        assert!(elapsed < Duration::from_secs(5), "{what}: {elapsed:?}");
        let written = wrote_at_most_the_limit(&served, &what).await;

        // The pipeline: the request falls back whole, with the reason.
        let (url, served) = big_video_server(framing).await;
        let p = pipeline(cfg());
        let body = chat(&url);
        let req = Request::parse(Endpoint::Chat, &body).unwrap();
        let started = Instant::now();
        let planned = p.plan_with(&req, false).await.unwrap();
        assert_eq!(planned.plan.route, Route::TextPrefix { reason: "too_large" }, "{what}");
        assert!(planned.plan.images.is_empty(), "{what}");
        assert!(started.elapsed() < Duration::from_secs(5), "{what}: {:?}", started.elapsed());
        wrote_at_most_the_limit(&served, &what).await;
        eprintln!("{what}: refused in {elapsed:?}, {written} of {SERVED} bytes served (limit {LIMIT})");
    }
}

/// The committed 20-frame MP4 with its `stts` and `stsz` declaring 10⁹ samples (4,261 bytes in all).
fn billion_frames() -> Vec<u8> {
    let mut bytes = std::fs::read(crate::fixtures().join("video/clips/v01_64x48_10fps_20f.mp4")).unwrap();
    for (kind, at) in [(b"stts", 12), (b"stsz", 12)] {
        let i = bytes.windows(4).position(|w| w == kind).unwrap();
        assert_eq!(&bytes[i + at..i + at + 4], &20u32.to_be_bytes(), "{}", String::from_utf8_lossy(kind));
        bytes[i + at..i + at + 4].copy_from_slice(&1_000_000_000u32.to_be_bytes());
    }
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_declaring_a_billion_frames_is_a_video_invalid_fallback() {
    let bytes = billion_frames();
    let url = format!("data:video/mp4;base64,{}", base64::engine::general_purpose::STANDARD.encode(&bytes));
    let intake = Intake::new(MediaConfig::default()).unwrap();
    let started = Instant::now();
    let err = intake.process_media(&[], &[&url]).await.media.map(|_| ()).unwrap_err();
    assert_eq!(err.label(), "video_invalid", "{err}");
    assert!(err.to_string().contains("1000000000 samples"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());

    let p = pipeline(MediaConfig::default());
    let body = chat(&url);
    let planned = p.plan_with(&Request::parse(Endpoint::Chat, &body).unwrap(), false).await.unwrap();
    assert_eq!(planned.plan.route, Route::TextPrefix { reason: "video_invalid" });
    assert!(planned.plan.images.is_empty() && planned.plan.spans.is_empty());
    // The unpatched clip is exact: it was the declared count that failed it.
    let clip = std::fs::read(crate::fixtures().join("video/clips/v01_64x48_10fps_20f.mp4")).unwrap();
    let ok = chat(&format!("data:video/mp4;base64,{}", base64::engine::general_purpose::STANDARD.encode(&clip)));
    let planned = p.plan_with(&Request::parse(Endpoint::Chat, &ok).unwrap(), false).await.unwrap();
    assert_eq!(planned.plan.route, Route::Exact);
}
