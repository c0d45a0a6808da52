//! Issue 45's image bomb replayed against the real binary: ~1 KB RLE8 BMPs declaring 11 000 × 11 000
//! (363 MB each once decoded), sixteen per request, four requests at a time, as data URLs and over
//! http from a server on 127.0.0.1. The router's resident memory is read from `/proc/<pid>/status`
//! of its own process, so other tests of this binary do not pollute it.

use std::time::Duration;

use base64::Engine;

use crate::harness::{chat_body, client, fast, metric, sims, spawn_serve};

const SIDE: u32 = 11_000;
const PER_REQUEST: usize = 16;
const AT_ONCE: usize = 4;
const MIB: u64 = 1 << 20;

/// An RLE8 BMP of 1 080 bytes (or a few more) declaring SIDE × SIDE; `variant` changes a palette
/// byte (distinct images), `filled`: deltas fill the image (Pillow loads it), else it ends at once.
fn bomb(variant: u8, filled: bool) -> Vec<u8> {
    let mut stream = Vec::new();
    if filled {
        let deltas = SIDE.div_ceil(255) as usize;
        stream.extend(std::iter::repeat_n([0u8, 2, 0, 255], deltas).flatten());
    }
    stream.extend_from_slice(&[0, 1]);
    let offset = 54 + 1024u32;
    let mut v = b"BM".to_vec();
    for n in [offset + stream.len() as u32, 0, offset, 40, SIDE, SIDE] {
        v.extend_from_slice(&n.to_le_bytes());
    }
    v.extend_from_slice(&[1, 0, 8, 0]);
    for n in [1u32, stream.len() as u32, 2835, 2835, 0, 0] {
        v.extend_from_slice(&n.to_le_bytes());
    }
    v.extend((0..1024u32).map(|i| (i * 7 % 251) as u8));
    v[54] = variant;
    v.extend_from_slice(&stream);
    v
}

fn bomb_url(variant: u8, filled: bool) -> String {
    format!("data:image/bmp;base64,{}", base64::engine::general_purpose::STANDARD.encode(bomb(variant, filled)))
}

/// The router's process, killed however the test ends.
struct Router(std::process::Child);

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `kB` field of `/proc/<pid>/status`, in bytes.
fn status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("no {field}"));
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// Resets the process's peak RSS (VmHWM) to its current RSS; false where the kernel refuses.
fn reset_peak(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// Samples VmRSS until `stop`, returning the most seen (for kernels that refuse the reset).
fn sample_rss(pid: u32, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut most = 0;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            most = most.max(status_bytes(pid, "VmRSS:"));
            std::thread::sleep(Duration::from_millis(2));
        }
        most
    })
}

/// Serves `bytes` as image/bmp at every path, on 127.0.0.1.
async fn bomb_server(bytes: Vec<u8>) -> String {
    let app = axum::Router::new().fallback(move || {
        let body = bytes.clone();
        async move { ([(axum::http::header::CONTENT_TYPE, "image/bmp")], body) }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

/// Sends AT_ONCE requests of these images concurrently; each answer's status, route and body.
async fn round(url: &str, requests: Vec<Vec<String>>) -> Vec<(u16, String, String)> {
    let sends = requests.into_iter().map(|images| {
        let body = chat_body(&images, "What is in these pictures?", false);
        async move {
            let r = client()
                .post(format!("{url}/v1/chat/completions"))
                .header("content-type", "application/json")
                .body(body)
                .timeout(Duration::from_secs(60))
                .send()
                .await
                .expect("every request gets an answer");
            let route = r.headers().get("x-mmrouter-route").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
            (r.status().as_u16(), route, r.text().await.unwrap())
        }
    });
    futures_util::future::join_all(sends).await
}

async fn fallbacks(url: &str) -> f64 {
    let text = client().get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap();
    metric(&text, "mmrouter_mm_fallback_total", "reason=\"unsupported_format\"")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_bmp_bombs_per_request_four_at_a_time_stay_within_256_mb() {
    let sims = sims(1, fast).await;
    let images = bomb_server(bomb(0, false)).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mmrouter.toml");
    let cfg = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nhealth_interval_ms = 0\n[media]\nallow_cidrs = [\"127.0.0.0/8\"]\n\
         [[workers]]\nname = \"w\"\nurl = {:?}\n",
        sims[0].url()
    );
    std::fs::write(&path, cfg).unwrap();
    let (child, addr, _log) = spawn_serve(&path);
    let router = Router(child);
    let (pid, url) = (router.0.id(), format!("http://{addr}"));

    // Idle: after one request of each kind has warmed the paths the attack takes.
    let small = crate::harness::png_data_url(64, 48, 1);
    for warm in [vec![small], vec![format!("{images}/warm.bmp")]] {
        round(&url, vec![warm]).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let idle = status_bytes(pid, "VmRSS:");
    let reset = reset_peak(pid);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = sample_rss(pid, stop.clone());
    let before = fallbacks(&url).await;

    // The attack as filed (stream ends at once: Pillow cannot load it), by data URL, then over http.
    let by_data: Vec<Vec<String>> = (0..AT_ONCE)
        .map(|r| (0..PER_REQUEST).map(|i| bomb_url((r * PER_REQUEST + i) as u8, false)).collect())
        .collect();
    let by_http: Vec<Vec<String>> =
        (0..AT_ONCE).map(|r| (0..PER_REQUEST).map(|i| format!("{images}/r{r}-{i}.bmp")).collect()).collect();
    for requests in [by_data, by_http] {
        for (status, route, body) in round(&url, requests).await {
            // A counted fallback: routed on the text, and the worker's processor refuses it as vLLM's does.
            assert_eq!(route, "text_prefix", "{status} {body}");
            assert_eq!(status, 400, "{body}");
            assert!(body.contains("unsupported_format"), "{body}");
        }
    }
    // Bombs whose stream does fill the image: Pillow loads them, so they are counted, still undecoded.
    let filled: Vec<Vec<String>> =
        (0..AT_ONCE).map(|r| (0..PER_REQUEST).map(|i| bomb_url((r * PER_REQUEST + i) as u8, true)).collect()).collect();
    for (status, route, body) in round(&url, filled).await {
        // Planned exactly and served, or a prompt too long for the model: a clear answer either way.
        assert!(status == 200 && route == "exact" || status == 400, "{status} {route} {body}");
    }

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sampled = sampler.join().unwrap();
    let peak = if reset { status_bytes(pid, "VmHWM:").max(sampled) } else { sampled };
    assert_eq!(fallbacks(&url).await - before, (2 * AT_ONCE) as f64, "each bomb request is a counted fallback");
    drop(router);
    let grew = peak.saturating_sub(idle);
    eprintln!("image bombs: idle {} MiB, peak {} MiB (+{} MiB)", idle / MIB, peak / MIB, grew / MIB);
    assert!(grew < 256 * MIB, "peak RSS grew by {} MiB over idle ({} MiB)", grew / MIB, idle / MIB);
}
