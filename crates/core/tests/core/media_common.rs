//! Shared helpers for the media behaviour tests: the fixture images with their Pillow sizes, and a
//! tiny HTTP/1.1 server on 127.0.0.1:0 whose misbehaviours (ignoring `Range`, stalling, redirecting,
//! lying about `Content-Length`, streaming forever) are scripted per path.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// (file, mime, stored width, stored height) as Pillow reports them (assets README).
pub const FIXTURES: &[(&str, &str, u32, u32)] = &[
    ("rocket.jpg", "image/jpeg", 640, 427),
    ("grace_hopper.jpg", "image/jpeg", 512, 600),
    ("chelsea.png", "image/png", 451, 300),
    ("coffee.png", "image/png", 600, 400),
    ("horse.png", "image/png", 400, 328),
    ("no_time_for_that_tiny.gif", "image/gif", 14, 25),
    ("alien1.gif", "image/gif", 80, 71),
    ("red.jpg", "image/jpeg", 32, 32),
    ("rocket_lossless.webp", "image/webp", 640, 427),
    ("rocket_lossy_alpha.webp", "image/webp", 640, 427),
    ("rocket_exif_rot6.jpg", "image/jpeg", 640, 427),
];

pub fn fixture(name: &str) -> Vec<u8> {
    let path: PathBuf = crate::fixtures().join("images").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn data_url(mime: &str, bytes: &[u8]) -> String {
    format!("data:{mime};base64,{}", base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// A PNG signature + IHDR claiming `w`×`h` (no pixel data).
pub fn png_header(w: u32, h: u32) -> Vec<u8> {
    let mut v = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
    v.extend_from_slice(&w.to_be_bytes());
    v.extend_from_slice(&h.to_be_bytes());
    v.extend_from_slice(&[8, 6, 0, 0, 0, 0x1f, 0x15, 0xc4, 0x89]);
    v
}

/// A GIF89a logical screen descriptor claiming `w`×`h` (u16 sides).
pub fn gif_header(w: u16, h: u16) -> Vec<u8> {
    let mut v = b"GIF89a".to_vec();
    v.extend_from_slice(&w.to_le_bytes());
    v.extend_from_slice(&h.to_le_bytes());
    v.extend_from_slice(&[0xf7, 0, 0]);
    v
}

/// Issue 45's BMP bomb: an RLE8 file of 1 080 bytes declaring `side` × `side`. `filled`: its stream
/// fills the image with deltas (Pillow loads it); else it ends at once (Pillow refuses to load it).
pub fn rle8_bomb(side: u32, filled: bool) -> Vec<u8> {
    let mut stream = Vec::new();
    if filled {
        let deltas = u64::from(side).div_ceil(255) as usize;
        stream.extend(std::iter::repeat_n([0u8, 2, 0, 255], deltas).flatten());
    }
    stream.extend_from_slice(&[0, 1]);
    let offset = 54 + 1024u32;
    let mut v = b"BM".to_vec();
    for n in [offset + stream.len() as u32, 0, offset, 40, side, side] {
        v.extend_from_slice(&n.to_le_bytes());
    }
    v.extend_from_slice(&[1, 0, 8, 0]); // planes, bits per pixel
    for n in [1u32, stream.len() as u32, 2835, 2835, 0, 0] {
        v.extend_from_slice(&n.to_le_bytes()); // compression 1: RLE8
    }
    v.extend((0..1024u32).map(|i| (i * 7 % 251) as u8)); // 256 colours, none grey
    v.extend_from_slice(&stream);
    v
}

/// What the server does for one path.
#[derive(Clone)]
pub enum Reply {
    /// 200 with the body, or 206 for a `Range` request when `honor_range`.
    Body { body: Vec<u8>, honor_range: bool },
    /// Sends the headers and `head` bytes of the body, then stalls for `stall`.
    Stall { body: Vec<u8>, head: usize, stall: Duration },
    /// 302 to `location` (absolute, or a path on this server when it starts with '/').
    Redirect(String),
    /// No Content-Length, close-delimited: a PNG header then zeros, up to `total` bytes.
    Endless { total: usize },
    /// Claims `claimed` in Content-Length, sends `body`, then closes.
    LyingLength { claimed: usize, body: Vec<u8> },
    /// An empty response with this status.
    Status(u16),
}

#[derive(Default)]
pub struct Stats {
    hits: Mutex<HashMap<String, usize>>,
    ranges: Mutex<Vec<Option<String>>>,
    /// Set when an `Endless` reply wrote every byte (it should not: the client stops reading).
    pub endless_completed: AtomicBool,
    /// Bytes an `Endless` reply managed to write before the client went away.
    pub endless_written: AtomicUsize,
}

impl Stats {
    pub fn hits(&self, path: &str) -> usize {
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }
    pub fn ranges(&self) -> Vec<Option<String>> {
        self.ranges.lock().unwrap().clone()
    }
}

pub struct TestServer {
    pub addr: SocketAddr,
    pub stats: Arc<Stats>,
}

impl TestServer {
    /// `http://127.0.0.1:<port><path>`
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub async fn start(routes: Vec<(&str, Reply)>) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let routes: Arc<HashMap<String, Reply>> =
            Arc::new(routes.into_iter().map(|(p, r)| (p.to_string(), r)).collect());
        let stats = Arc::new(Stats::default());
        let st = Arc::clone(&stats);
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let routes = Arc::clone(&routes);
                let stats = Arc::clone(&st);
                tokio::spawn(async move {
                    let _ = serve(sock, &routes, &stats).await;
                });
            }
        });
        TestServer { addr, stats }
    }
}

async fn serve(mut sock: TcpStream, routes: &HashMap<String, Reply>, stats: &Stats) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = sock.read(&mut buf).await?;
        if n == 0 || head.len() > 16 * 1024 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if !head.starts_with(b"GET ") && head.len() >= 4 {
            return Ok(()); // not plain HTTP (e.g. a TLS ClientHello): hang up
        }
    }
    let text = String::from_utf8_lossy(&head).to_string();
    let path = text.split_whitespace().nth(1).unwrap_or("/").to_string();
    let range = text
        .lines()
        .find_map(|l| l.strip_prefix("range: ").or_else(|| l.strip_prefix("Range: ")))
        .map(|s| s.trim().to_string());
    *stats.hits.lock().unwrap().entry(path.clone()).or_default() += 1;
    stats.ranges.lock().unwrap().push(range.clone());

    let Some(reply) = routes.get(&path) else {
        return respond(&mut sock, "404 Not Found", &[], b"").await;
    };
    match reply {
        Reply::Body { body, honor_range } => {
            let end = range.as_deref().and_then(|r| r.strip_prefix("bytes=0-")).and_then(|e| e.parse::<usize>().ok());
            match end {
                Some(end) if *honor_range && !body.is_empty() => {
                    let last = end.min(body.len() - 1);
                    let cr = format!("bytes 0-{last}/{}", body.len());
                    respond(&mut sock, "206 Partial Content", &[("Content-Range", &cr)], &body[..=last]).await
                }
                _ => respond(&mut sock, "200 OK", &[], body).await,
            }
        }
        Reply::Stall { body, head, stall } => {
            let hdr = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
            sock.write_all(hdr.as_bytes()).await?;
            sock.write_all(&body[..*head]).await?;
            sock.flush().await?;
            tokio::time::sleep(*stall).await;
            sock.write_all(&body[*head..]).await
        }
        Reply::Redirect(location) => {
            let location = if location.starts_with('/') {
                format!("http://{}{location}", sock.local_addr()?)
            } else {
                location.clone()
            };
            respond(&mut sock, "302 Found", &[("Location", &location)], b"").await
        }
        Reply::Endless { total } => {
            sock.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nConnection: close\r\n\r\n").await?;
            let mut first = png_header(64, 64);
            first.resize(64 * 1024, 0);
            let zeros = vec![0u8; 64 * 1024];
            let mut written = 0usize;
            while written < *total {
                let chunk = if written == 0 { &first } else { &zeros };
                if sock.write_all(chunk).await.is_err() {
                    return Ok(());
                }
                written += chunk.len();
                stats.endless_written.store(written, Ordering::SeqCst);
            }
            stats.endless_completed.store(true, Ordering::SeqCst);
            Ok(())
        }
        Reply::LyingLength { claimed, body } => {
            let hdr = format!("HTTP/1.1 200 OK\r\nContent-Length: {claimed}\r\nConnection: close\r\n\r\n");
            sock.write_all(hdr.as_bytes()).await?;
            let _ = sock.write_all(body).await;
            let _ = sock.shutdown().await;
            Ok(())
        }
        Reply::Status(code) => respond(&mut sock, &format!("{code} Status"), &[], b"").await,
    }
}

async fn respond(sock: &mut TcpStream, status: &str, headers: &[(&str, &str)], body: &[u8]) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    sock.write_all(head.as_bytes()).await?;
    sock.write_all(body).await?;
    sock.shutdown().await
}
