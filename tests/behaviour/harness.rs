//! Shared test harness: real sims and a real proxy on 127.0.0.1 ephemeral ports. Every proxy has
//! its own metrics, so tests read `/metrics` of their own cluster without any global lock.

use std::sync::Arc;

use mmrouter::config::Settings;
use mmrouter::server::AppState;
use mmrouter_sim::{SimHandle, SimOptions};

pub struct Cluster {
    pub sims: Vec<SimHandle>,
    pub url: String,
    pub state: Arc<AppState>,
}

pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    format!("{prefix}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// Sim timing all zero: tests assert behaviour, not speed.
pub fn fast(o: &mut SimOptions) {
    o.ttft_base_ms = 0;
    o.prefill_us_per_token = 0;
    o.decode_ms_per_token = 0;
    o.image_preprocess_us_per_token = 0;
    o.image_encode_us_per_token = 0;
}

pub async fn sims(n: usize, tweak: impl Fn(&mut SimOptions)) -> Vec<SimHandle> {
    let mut out = Vec::new();
    for _ in 0..n {
        let mut o = SimOptions { name: unique("sim"), ..SimOptions::default() };
        tweak(&mut o);
        out.push(mmrouter_sim::spawn_exact(o).await.expect("sim starts"));
    }
    out
}

/// A proxy in front of `sims`; `extra` is TOML inserted before the workers (sections allowed).
pub async fn cluster_with(sims: Vec<SimHandle>, extra: &str) -> Cluster {
    let mut toml = format!("{extra}\n");
    for s in &sims {
        toml.push_str(&format!("[[workers]]\nname = {:?}\nurl = {:?}\n", s.name(), s.url()));
    }
    proxy(sims, &toml).await
}

pub async fn proxy(sims: Vec<SimHandle>, toml: &str) -> Cluster {
    let cfg = Settings::parse(toml).expect("valid test config");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (addr, state) = mmrouter::server::spawn(cfg, listener).await.expect("proxy starts");
    Cluster { sims, url: format!("http://{addr}"), state }
}

pub fn client() -> reqwest::Client {
    mmrouter_core::http_client_builder().no_proxy().build().unwrap()
}

pub fn sha256_hex(b: &[u8]) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(b);
    d.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

pub fn data_url(name: &str) -> String {
    use base64::Engine;
    let bytes = fixture(&format!("images/{name}"));
    let mime = match name.rsplit('.').next() {
        Some("jpg") | Some("jpeg") => "image/jpeg",
        Some("png") => "image/png",
        Some("gif") => "image/gif",
        Some("webp") => "image/webp",
        _ => "application/octet-stream",
    };
    format!("data:{mime};base64,{}", base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// A chat body with the given image URLs followed by a text part.
pub fn chat_body(images: &[String], text: &str, stream: bool) -> Vec<u8> {
    let mut parts: Vec<serde_json::Value> =
        images.iter().map(|u| serde_json::json!({"type": "image_url", "image_url": {"url": u}})).collect();
    parts.push(serde_json::json!({"type": "text", "text": text}));
    let mut body = serde_json::json!({
        "model": "Qwen/Qwen3-VL-8B-Instruct",
        "max_tokens": 8,
        "messages": [
            {"role": "system", "content": "You are a careful assistant that describes images in detail."},
            {"role": "user", "content": parts}
        ]
    });
    if stream {
        body["stream"] = true.into();
        body["stream_options"] = serde_json::json!({"include_usage": true});
    }
    serde_json::to_vec(&body).unwrap()
}

/// Value of a metric sample line `name{labels} value` in Prometheus text, 0 when absent.
/// `labels` must match the rendered label set exactly (e.g. `reason="aspect_ratio"`), or be "" for none.
pub fn metric(text: &str, name: &str, labels: &str) -> f64 {
    let key = if labels.is_empty() { name.to_owned() } else { format!("{name}{{{labels}}}") };
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            (k == key).then(|| v.parse::<f64>().ok()).flatten()
        })
        .unwrap_or(0.0)
}

pub async fn metrics_text(url: &str) -> String {
    client().get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap()
}

/// A solid-colour PNG of the given size as a data URL (distinct shades give distinct content hashes).
pub fn png_data_url(w: u32, h: u32, shade: u8) -> String {
    use base64::Engine;
    let img = image::RgbImage::from_pixel(w, h, image::Rgb([shade, 100, 200]));
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(out.into_inner()))
}

/// What a vLLM worker receives for `body` on the exact route: the same bytes, with each data-URL image
/// part's `uuid` (hex BLAKE3 of the image) written right after its `image_url` object. Built by text
/// insertion here, independently of the router's splicing.
pub fn with_uuids(body: &[u8]) -> Vec<u8> {
    use base64::Engine;
    let mut text = String::from_utf8(body.to_vec()).unwrap();
    let mut at = 0;
    while let Some(found) = text[at..].find(r#"{"url":"data:"#) {
        let start = at + found;
        let end = start + text[start..].find("\"}").unwrap() + 2;
        let url = &text[start + 8..end - 2];
        let payload = url.split_once("base64,").unwrap().1;
        let bytes = base64::engine::general_purpose::STANDARD.decode(payload).unwrap();
        let uuid = format!(r#","uuid":"{}""#, blake3::hash(&bytes).to_hex());
        text.insert_str(end, &uuid);
        at = end + uuid.len();
    }
    text.into_bytes()
}

/// `POST /debug/route` (with `?query` when not empty) for `body`, with an admin key when given.
pub async fn debug_route(url: &str, query: &str, body: &[u8], admin_key: Option<&str>) -> serde_json::Value {
    let sep = if query.is_empty() { "" } else { "?" };
    let mut req = client().post(format!("{url}/debug/route{sep}{query}")).header("content-type", "application/json");
    if let Some(key) = admin_key {
        req = req.bearer_auth(key);
    }
    req.body(body.to_vec()).send().await.unwrap().json().await.unwrap()
}

/// POSTs a JSON `body` to `{url}/v1/chat/completions`.
pub async fn post(url: &str, body: Vec<u8>) -> reqwest::Response {
    post_to(url, "/v1/chat/completions", body).await
}

/// POSTs a JSON `body` to `{url}{path}`.
pub async fn post_to(url: &str, path: &str, body: Vec<u8>) -> reqwest::Response {
    client().post(format!("{url}{path}")).header("content-type", "application/json").body(body).send().await.unwrap()
}

/// A response header as text ("" when absent).
pub fn header<'a>(r: &'a reqwest::Response, name: &str) -> &'a str {
    r.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

/// Runs `mmrouter serve --config path` (info logs on stderr); returns the child, the address it
/// listens on (from its log) and the rest of its log lines. The log is read continuously so the child
/// never blocks on a full pipe.
pub fn spawn_serve(path: &std::path::Path) -> (std::process::Child, String, std::sync::mpsc::Receiver<String>) {
    spawn_serve_args(&["--config".as_ref(), path.as_os_str()])
}

/// [`spawn_serve`] with any `serve` arguments (flags instead of a file).
pub fn spawn_serve_args<S: AsRef<std::ffi::OsStr>>(
    args: &[S],
) -> (std::process::Child, String, std::sync::mpsc::Receiver<String>) {
    use std::io::{BufRead, BufReader};
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_mmrouter"))
        .arg("serve")
        .args(args)
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let addr = rx
        .iter()
        .find_map(|l| {
            let rest = l.split("listening on http://").nth(1)?;
            Some(rest.chars().take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':').collect::<String>())
        })
        .expect("the binary logs its address");
    (child, addr, rx)
}
