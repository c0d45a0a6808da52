//! Hostile KV-event publishers and discovery documents against the real binary (issue 20): a worker's
//! event endpoint, its replay endpoint and its discovery document are untrusted input. Every publisher
//! here is a raw TCP server on 127.0.0.1 that speaks just enough ZMTP 3.0 to pass the handshake and then
//! misbehaves; the discovery servers answer raw HTTP. The router must keep running, stay within a memory
//! bound over idle, answer `/health` fast, keep the other workers' routing state, and count what it
//! refused under `mmrouter_kv_event_refused_total{reason}`.
//!
//! The router runs as a child process so that its resident memory can be read from `/proc`.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use zeromq::{Socket, SocketSend};

use crate::harness::*;
use crate::kv_events::{batch, batch_at, debug, stored};

/// What an attack may add to the router's resident memory over idle (docs/routing.md, "What a publisher
/// may send": one message is bounded by `kv_events.max_message_bytes`, held replay batches by
/// `max_replay_buffer_bytes`).
const RSS_BOUND_BYTES: u64 = 64 * 1024 * 1024;
/// `/health` must stay this fast while the feeds are under attack (feeds run on their own runtime).
/// A feed that blocked the serving runtime would stall it for the attack's seconds; the margin over a
/// few ms is for the rest of the suite sharing two cores with this test (81 ms seen in one run).
const HEALTH_BOUND: Duration = Duration::from_millis(300);

/// The 64-byte ZMTP 3.0 greeting with the NULL mechanism.
fn greeting() -> [u8; 64] {
    let mut g = [0u8; 64];
    g[0] = 0xFF;
    g[9] = 0x7F;
    g[10] = 3;
    g[12..16].copy_from_slice(b"NULL");
    g
}

/// A READY command naming `socket_type`, as a short command frame.
fn ready(socket_type: &str) -> Vec<u8> {
    let mut body = vec![5u8];
    body.extend_from_slice(b"READY");
    body.push(11);
    body.extend_from_slice(b"Socket-Type");
    body.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
    body.extend_from_slice(socket_type.as_bytes());
    let mut frame = vec![0x04, body.len() as u8];
    frame.extend_from_slice(&body);
    frame
}

/// Greeting and READY both ways; what the peer sends after its READY is left unread.
async fn handshake(sock: &mut TcpStream, socket_type: &str) -> std::io::Result<()> {
    sock.write_all(&greeting()).await?;
    let mut peer = [0u8; 64];
    sock.read_exact(&mut peer).await?;
    sock.write_all(&ready(socket_type)).await?;
    let mut head = [0u8; 2];
    sock.read_exact(&mut head).await?;
    let mut body = vec![0u8; head[1] as usize];
    sock.read_exact(&mut body).await?;
    Ok(())
}

/// A long-frame header (flags `more`/`long` as given) claiming `len` bytes.
fn long_header(len: u64, more: bool) -> Vec<u8> {
    let mut h = vec![0x02 | u8::from(more)];
    h.extend_from_slice(&len.to_be_bytes());
    h
}

/// One frame, short or long form.
fn frame(body: &[u8], more: bool) -> Vec<u8> {
    let mut f =
        if body.len() < 256 { vec![u8::from(more), body.len() as u8] } else { long_header(body.len() as u64, more) };
    f.extend_from_slice(body);
    f
}

/// The ways a live publisher misbehaves after its handshake (one hostile worker each), and the reason the
/// router counts for it.
#[derive(Clone, Copy, Debug)]
enum Attack {
    /// Nine bytes: a frame claiming 2^62 bytes.
    HugeHeader,
    /// A frame claiming 512 MiB, then a trickle of its body.
    Claims512MiB,
    /// A multi-part message that never ends (3 MiB frames, each with `more`).
    EndlessMultipart,
    /// 20 MB of empty frames, each with `more`.
    EmptyFrames,
    /// A greeting that is not ZMTP.
    BadGreeting,
    /// A well-formed message of 33 MB (above `kv_events.max_message_bytes`).
    OversizedBatch,
}

const ATTACKS: [(Attack, &str, &str); 6] = [
    (Attack::HugeHeader, "huge-header", "frame_too_large"),
    (Attack::Claims512MiB, "claims-512mib", "frame_too_large"),
    (Attack::EndlessMultipart, "endless", "message_too_large"),
    (Attack::EmptyFrames, "empty-frames", "too_many_frames"),
    (Attack::BadGreeting, "bad-greeting", "bad_greeting"),
    (Attack::OversizedBatch, "oversized", "frame_too_large"),
];

/// The attacks' bytes, built before the attack so that the test's runtime only writes them.
struct Payloads {
    endless: Vec<u8>,
    empty_frames: Vec<u8>,
    oversized: Vec<u8>,
}

static PAYLOADS: std::sync::OnceLock<Payloads> = std::sync::OnceLock::new();
/// Released when the attack begins: until then every hostile publisher sits idle after its handshake.
static GO: tokio::sync::Notify = tokio::sync::Notify::const_new();
static STARTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn prepare_attacks() {
    PAYLOADS.get_or_init(|| {
        let mut oversized = frame(b"", true);
        oversized.extend(frame(&1u64.to_be_bytes(), true));
        oversized.extend(frame(&vec![0x90u8; 33 << 20], false));
        Payloads {
            endless: frame(&vec![7u8; 3 << 20], true),
            empty_frames: [0x01u8, 0x00].repeat(512 * 1024),
            oversized,
        }
    });
}

fn start_attacks() {
    STARTED.store(true, std::sync::atomic::Ordering::SeqCst);
    GO.notify_waiters();
}

async fn attack(mut sock: TcpStream, how: Attack) -> std::io::Result<()> {
    let p = PAYLOADS.get().expect("prepare_attacks ran");
    if !matches!(how, Attack::BadGreeting) {
        handshake(&mut sock, "PUB").await?;
    }
    let go = GO.notified();
    if !STARTED.load(std::sync::atomic::Ordering::SeqCst) {
        go.await;
    }
    match how {
        Attack::BadGreeting => {
            sock.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await?;
            sock.write_all(&[0u8; 4096]).await?;
        }
        Attack::HugeHeader => sock.write_all(&long_header(1 << 62, false)).await?,
        Attack::Claims512MiB => {
            sock.write_all(&long_header(512 << 20, false)).await?;
            for _ in 0..64 {
                sock.write_all(&[0u8; 64 * 1024]).await?;
            }
        }
        Attack::EndlessMultipart => {
            for _ in 0..64 {
                sock.write_all(&p.endless).await?;
            }
        }
        Attack::EmptyFrames => {
            for _ in 0..20 {
                sock.write_all(&p.empty_frames).await?;
            }
        }
        Attack::OversizedBatch => sock.write_all(&p.oversized).await?,
    }
    sock.flush().await
}

/// A live publisher that attacks every connection the same way.
async fn hostile_publisher(how: Attack) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("tcp://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else { return };
            tokio::spawn(attack(sock, how));
        }
    });
    endpoint
}

/// A replay ROUTER that answers every replay request with a frame claiming 2^62 bytes.
async fn hostile_replay() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("tcp://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                handshake(&mut sock, "ROUTER").await?;
                let mut request = [0u8; 64];
                let _ = tokio::time::timeout(Duration::from_secs(1), sock.read(&mut request)).await;
                sock.write_all(&long_header(1 << 62, false)).await
            });
        }
    });
    endpoint
}

/// A well-behaved publisher for the replay worker's live stream: seq 5 first (the slow-joiner replay
/// from 0 goes to the hostile ROUTER), then one empty batch per 100 ms.
async fn replay_trigger(mut publisher: zeromq::PubSocket) {
    for seq in 5u64.. {
        let frames = vec![bytes::Bytes::new(), bytes::Bytes::from(seq.to_be_bytes().to_vec()), batch(vec![]).into()];
        if publisher.send(zeromq::ZmqMessage::try_from(frames).unwrap()).await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An HTTP server whose every answer to `GET <any>/kv_event_sources` is chosen by the path's first
/// segment: `ranks` (1 000 ranks, in a document under the size cap), `huge` (an endless body), `foreign`
/// (a publisher on another host).
async fn hostile_discovery() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else { return };
            tokio::spawn(answer_discovery(sock));
        }
    });
    base
}

async fn answer_discovery(mut sock: TcpStream) -> std::io::Result<()> {
    let mut head = vec![0u8; 4096];
    let n = sock.read(&mut head).await?;
    let line = String::from_utf8_lossy(&head[..n]).lines().next().unwrap_or_default().to_owned();
    let ok = |body: &str| {
        format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len())
    };
    if line.contains("/ranks/") {
        let entries: Vec<String> = (0..1_000)
            .map(|r| {
                format!(r#"{{"data_parallel_rank":{r},"endpoint":"tcp://127.0.0.1:{}","topic":""}}"#, 20_000 + r % 1000)
            })
            .collect();
        sock.write_all(ok(&format!("[{}]", entries.join(","))).as_bytes()).await?;
    } else if line.contains("/huge/") {
        sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n[").await?;
        let filler = vec![b' '; 64 * 1024];
        for _ in 0..(400 * 16) {
            sock.write_all(&filler).await?;
        }
    } else {
        // 127.0.0.2 is loopback: even a router that wrongly followed it would contact nothing outside.
        sock.write_all(ok(r#"[{"data_parallel_rank":0,"endpoint":"tcp://127.0.0.2:5557","topic":""}]"#).as_bytes())
            .await?;
    }
    sock.flush().await
}

fn message(seq: u64, payload: Vec<u8>) -> zeromq::ZmqMessage {
    let frames = vec![bytes::Bytes::new(), bytes::Bytes::from(seq.to_be_bytes().to_vec()), bytes::Bytes::from(payload)];
    zeromq::ZmqMessage::try_from(frames).unwrap()
}

/// Watches the router from a thread of its own (the test's runtime is busy writing the attacks): the
/// slowest `/health` round trip over a plain TCP connection, the peak resident memory, and whether the
/// process exited.
fn watch(addr: &str, pid: u32, how_long: Duration) -> (Duration, u64, bool) {
    use std::io::{Read, Write};
    let (mut worst, mut peak) = (Duration::ZERO, 0);
    let until = Instant::now() + how_long;
    while Instant::now() < until {
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return (worst, peak, true) };
        if status.contains("State:\tZ") {
            return (worst, peak, true);
        }
        peak = peak.max(rss(pid));
        let t = Instant::now();
        let mut sock = std::net::TcpStream::connect(addr).unwrap();
        sock.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").unwrap();
        let mut answer = Vec::new();
        sock.read_to_end(&mut answer).unwrap();
        worst = worst.max(t.elapsed());
        assert!(answer.starts_with(b"HTTP/1.1 200") || answer.starts_with(b"HTTP/1.1 503"), "{answer:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    (worst, peak, false)
}

/// Resident set size of `pid`, bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS in /proc status");
    kb * 1024
}

/// Event-sourced overlap of worker `w` for `body`.
async fn event_overlap(url: &str, body: &[u8], w: usize) -> u64 {
    debug(url, body).await["overlap_sources"][w]["events"].as_u64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_publishers_and_documents_leave_the_router_running_bounded_and_routing() {
    let mut good = zeromq::PubSocket::new();
    let good_endpoint = good.bind("tcp://127.0.0.1:0").await.unwrap().to_string();
    let mut trigger = zeromq::PubSocket::new();
    let trigger_endpoint = trigger.bind("tcp://127.0.0.1:0").await.unwrap().to_string();
    let mut hostile = String::new();
    for (how, name, _) in ATTACKS {
        let endpoint = hostile_publisher(how).await;
        hostile.push_str(&format!(
            "[[workers]]\nname = {name:?}\nurl = \"http://127.0.0.1:9\"\nkv_events = {endpoint:?}\n"
        ));
    }
    let replay = hostile_replay().await;
    let disco = hostile_discovery().await;
    let sims = sims(1, fast).await;
    // Chats are never sent here (`/debug/route` plans and ranks without forwarding), so the hostile
    // workers' URLs need to answer nothing but discovery.
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nhealth_interval_ms = 0\n\
         [[workers]]\nname = \"good\"\nurl = {:?}\nkv_events = {good_endpoint:?}\n\
         {hostile}\
         [[workers]]\nname = \"replayer\"\nurl = \"http://127.0.0.1:9\"\nkv_events = {trigger_endpoint:?}\nkv_events_replay = {replay:?}\n\
         [[workers]]\nname = \"ranks\"\nurl = \"{disco}/ranks\"\nkv_events = \"discover\"\n\
         [[workers]]\nname = \"huge\"\nurl = \"{disco}/huge\"\nkv_events = \"discover\"\n\
         [[workers]]\nname = \"foreign\"\nurl = \"{disco}/foreign\"\nkv_events = \"discover\"\n",
        sims[0].url()
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mmrouter.toml");
    std::fs::write(&path, toml).unwrap();
    let (child, addr, _log) = spawn_serve(&path);
    let mut child = KillOnDrop(child);
    let child = &mut child.0;
    let url = format!("http://{addr}");
    let pid = child.id();
    prepare_attacks();

    // The good worker announces a prompt's blocks; the router's view of it must survive everything below.
    let body = chat_body(&[], &"Tell me a long story about routers and caches. ".repeat(8), false);
    let ids: Vec<u64> = serde_json::from_value(debug(&url, &body).await["token_ids"].clone()).unwrap();
    let blocks = ids.len() / 16;
    let hashes: Vec<u64> = (0..blocks as u64).map(|i| 0xE000 + i).collect();
    let announce = batch(vec![stored(&hashes, &ids[..blocks * 16], 16)]);
    let mut learnt = false;
    for _ in 0..200 {
        good.send(message(0, announce.clone())).await.unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        if event_overlap(&url, &body, 0).await == blocks as u64 {
            learnt = true;
            break;
        }
    }
    assert!(learnt, "the good worker's events reached the index");
    // A timestamp of -inf is refused by the decoder, never a sample of the lag histogram.
    good.send(message(1, batch_at(f64::NEG_INFINITY, vec![]))).await.unwrap();
    // A large batch within the bounds (~5 MB, 960 000 token ids, of another block size so that it
    // changes nothing in the index): decoded and applied on the feeds' runtime, never in front of /health.
    let big = batch(
        (0..60u64)
            .map(|e| {
                let tokens: Vec<u64> = (0..16_000).map(|t| 100_000 + (e * 16_000 + t) % 50_000).collect();
                let hashes: Vec<u64> = (0..500).map(|h| 0xB000_0000 + e * 1000 + h).collect();
                stored(&hashes, &tokens, 32)
            })
            .collect(),
    );
    assert!(big.len() > 4 << 20 && big.len() < 8 << 20, "{}", big.len());
    let idle = rss(pid);

    // The attack: every hostile connection in turn for a while, /health and memory watched meanwhile.
    let trigger_task = tokio::spawn(replay_trigger(trigger));
    start_attacks();
    good.send(message(2, big)).await.unwrap();
    let watch = std::thread::spawn(move || watch(&addr, pid, Duration::from_secs(12)));
    let (worst_health, peak, exited) = tokio::task::spawn_blocking(move || watch.join().unwrap()).await.unwrap();
    assert!(!exited, "the router exited during the attack");
    eprintln!(
        "hostile feeds: /health slowest {worst_health:?}; resident memory idle {} MB, peak {} MB (+{} MB)",
        idle >> 20,
        peak >> 20,
        peak.saturating_sub(idle) >> 20
    );
    trigger_task.abort();

    assert!(child.try_wait().unwrap().is_none(), "the router is still running");
    assert!(
        peak.saturating_sub(idle) < RSS_BOUND_BYTES,
        "resident memory grew by {} MB (idle {} MB, peak {} MB)",
        peak.saturating_sub(idle) >> 20,
        idle >> 20,
        peak >> 20
    );
    assert!(worst_health < HEALTH_BOUND, "/health took {worst_health:?} during the attack");
    assert_eq!(event_overlap(&url, &body, 0).await, blocks as u64, "the good worker's routing state is intact");

    let page = metrics_text(&url).await;
    let refused = |worker: &str, reason: &str| {
        metric(&page, "mmrouter_kv_event_refused_total", &format!("worker=\"{worker}\",reason=\"{reason}\""))
    };
    for (how, name, reason) in ATTACKS {
        assert!(refused(name, reason) >= 1.0, "{how:?}: {reason} not counted:\n{page}");
    }
    assert!(refused("replayer", "frame_too_large") >= 1.0, "the replay socket's huge frame:\n{page}");
    assert!(refused("good", "bad_timestamp") >= 1.0, "the -inf timestamp:\n{page}");
    assert!(refused("ranks", "discovery_too_many_ranks") >= 1.0, "{page}");
    assert!(refused("huge", "discovery_too_large") >= 1.0, "{page}");
    assert!(refused("foreign", "discovery_foreign_host") >= 1.0, "{page}");
    let mismatched = metric(&page, "mmrouter_kv_events_total", "worker=\"good\",kind=\"block_size_mismatch\"");
    assert!(mismatched >= 60.0, "the large batch was decoded and applied: {mismatched}");
    let lag_sum = metric(&page, "mmrouter_kv_event_lag_seconds_sum", "worker=\"good\"");
    assert!(lag_sum.is_finite(), "lag histogram sum {lag_sum}");
    crate::metrics_format::promtool_accepts(&page);
}

/// The router child dies with the test, passed or failed.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
