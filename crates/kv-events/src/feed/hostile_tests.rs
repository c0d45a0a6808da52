//! Hostile publishers on 127.0.0.1 (issue 20): raw TCP servers that speak just enough ZMTP, then
//! misbehave once and behave afterwards. Each case checks that the feed survives, counts the refusal
//! under its label, drops the connection, and receives batches again from the well-behaved peer. The
//! bytes the decoder may hold under the same inputs are asserted in `zmtp::tests`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Mutex};

use super::socket_tests::{expect_batch, expect_reset, payload, wait_until, WAIT};
use super::*;
use crate::zmtp::codec::{self, Decoder, Item};
use crate::zmtp::Limits;

/// What the server does with one connection.
#[derive(Clone, Copy, Debug)]
enum Behaviour {
    /// Handshake, then a long-frame header claiming 2^62 bytes.
    HugeHeader,
    /// Handshake, then a header claiming 512 MiB and a little of its body.
    HalfGibFrame,
    /// Handshake, then MORE frames forever.
    EndlessMessage,
    /// Handshake, then 20 MB of empty MORE frames.
    EmptyFrames,
    /// Not ZMTP at all.
    GarbageGreeting,
    /// Accepts and never answers.
    SilentHandshake,
    /// A proper PUB (or ROUTER) peer.
    Good,
}

/// A raw server: the queued behaviours for the first connections, then [`Behaviour::Good`].
struct RawServer {
    endpoint: String,
    /// Connections that ended with the client closing them.
    dropped: Arc<AtomicU64>,
    publish: mpsc::UnboundedSender<u64>,
}

impl RawServer {
    async fn start(socket_type: &'static str, plan: Vec<Behaviour>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("tcp://{}", listener.local_addr().unwrap());
        let dropped = Arc::new(AtomicU64::new(0));
        let (publish, seqs) = mpsc::unbounded_channel();
        let seqs = Arc::new(Mutex::new(seqs));
        let (d, mut plan) = (dropped.clone(), VecDeque::from(plan));
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let behaviour = plan.pop_front().unwrap_or(Behaviour::Good);
                tokio::spawn(serve(stream, socket_type, behaviour, seqs.clone(), d.clone()));
            }
        });
        RawServer { endpoint, dropped, publish }
    }
}

/// Writes our hello and reads the client's greeting, READY and first message (subscription or request).
async fn hello(stream: &mut TcpStream, socket_type: &str) -> Option<Vec<Bytes>> {
    let mut out = codec::greeting().to_vec();
    codec::encode_command(&mut out, b"READY", &codec::ready_body(&[("Socket-Type", socket_type.as_bytes())]));
    stream.write_all(&out).await.ok()?;
    read_message(stream, &mut Decoder::new(Limits::default())).await
}

async fn read_message(stream: &mut TcpStream, dec: &mut Decoder) -> Option<Vec<Bytes>> {
    loop {
        while let Some(item) = dec.next_item().ok()? {
            if let Item::Message(frames) = item {
                return Some(frames);
            }
        }
        let n = stream.read(dec.read_buf()).await.ok()?;
        if n == 0 {
            return None;
        }
        dec.filled(n);
    }
}

async fn serve(
    mut stream: TcpStream,
    socket_type: &str,
    behaviour: Behaviour,
    seqs: Arc<Mutex<mpsc::UnboundedReceiver<u64>>>,
    dropped: Arc<AtomicU64>,
) {
    if matches!(behaviour, Behaviour::Good) {
        return good(stream, socket_type, seqs).await;
    }
    let attack: Vec<u8> = match behaviour {
        Behaviour::GarbageGreeting => b"HTTP/1.1 400 Bad Request\r\n\r\n".repeat(8),
        Behaviour::SilentHandshake => Vec::new(),
        _ if hello(&mut stream, socket_type).await.is_none() => return,
        Behaviour::HugeHeader => vec![0x02, 0x40, 0, 0, 0, 0, 0, 0, 0],
        Behaviour::HalfGibFrame => [&[0x02, 0, 0, 0, 0, 0x20, 0, 0, 0][..], &[0xAB; 64 * 1024]].concat(),
        Behaviour::EmptyFrames => [0x01, 0x00].repeat(10 << 20),
        Behaviour::EndlessMessage => loop {
            if stream.write_all(&[0x01, 0x04, 1, 2, 3, 4].repeat(1000)).await.is_err() {
                break Vec::new();
            }
        },
        Behaviour::Good => unreachable!(),
    };
    let _ = stream.write_all(&attack).await;
    // The client must hang up (the handshake-timeout case only after its deadline).
    let mut sink = vec![0; 4096];
    let closed = tokio::time::timeout(WAIT, async { while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {} });
    if closed.await.is_ok() {
        dropped.fetch_add(1, Ordering::Relaxed);
    }
}

/// A PUB publishing the seqs it is told; a ROUTER answering replay requests from the same seqs' payloads.
async fn good(mut stream: TcpStream, socket_type: &str, seqs: Arc<Mutex<mpsc::UnboundedReceiver<u64>>>) {
    let Some(first) = hello(&mut stream, socket_type).await else { return };
    if socket_type == "ROUTER" {
        let start = u64::from_be_bytes(first[1].as_ref().try_into().unwrap());
        let end = seqs.lock().await.recv().await.unwrap(); // the replay serves start..=end
        let mut out = Vec::new();
        for seq in start..=end {
            codec::encode_message(&mut out, &[b"", &seq.to_be_bytes(), &payload(seq)]);
        }
        codec::encode_message(&mut out, &[b"", &u64::MAX.to_be_bytes(), b""]);
        let _ = stream.write_all(&out).await;
        return;
    }
    while let Some(seq) = seqs.lock().await.recv().await {
        let mut out = Vec::new();
        codec::encode_message(&mut out, &[b"", &seq.to_be_bytes(), &payload(seq)]);
        if stream.write_all(&out).await.is_err() {
            return;
        }
    }
}

fn quick(mut cfg: FeedConfig) -> FeedConfig {
    cfg.connect_timeout = Duration::from_millis(300);
    cfg.reconnect_interval_max = Duration::from_millis(200);
    cfg
}

fn count(stats: &FeedStats, label: &str) -> u64 {
    stats.protocol_violations_by_reason.iter().find(|(l, _)| *l == label).map_or(0, |(_, n)| *n)
}

async fn live_case(behaviour: Behaviour, label: &str) {
    let server = RawServer::start("PUB", vec![behaviour]).await;
    let (handle, mut rx) = spawn_feed(quick(FeedConfig::new(&server.endpoint))).unwrap();
    wait_until(label, || count(&handle.stats(), label) >= 1).await;
    wait_until("the hostile connection dropped", || server.dropped.load(Ordering::Relaxed) >= 1).await;
    assert!(!handle.is_finished(), "the feed task must survive");
    server.publish.send(0).unwrap();
    server.publish.send(1).unwrap();
    expect_batch(&mut rx, 0, false).await;
    expect_batch(&mut rx, 1, false).await;
    let stats = handle.stats();
    assert_eq!(stats.protocol_violations, 1, "{stats:?}");
    assert!(stats.connected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_header_claiming_2_pow_62_bytes() {
    live_case(Behaviour::HugeHeader, "frame_too_large").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_frame_of_512_mib() {
    live_case(Behaviour::HalfGibFrame, "frame_too_large").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_never_ending_multipart_message() {
    live_case(Behaviour::EndlessMessage, "too_many_frames").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_20_mb_of_empty_frames() {
    live_case(Behaviour::EmptyFrames, "too_many_frames").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_garbage_greeting() {
    live_case(Behaviour::GarbageGreeting, "bad_greeting").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_handshake_that_never_completes() {
    live_case(Behaviour::SilentHandshake, "handshake_timeout").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_header_claiming_2_pow_62_bytes() {
    let live = RawServer::start("PUB", vec![]).await;
    let replay = RawServer::start("ROUTER", vec![Behaviour::HugeHeader]).await;
    let cfg = quick(FeedConfig::new(&live.endpoint).with_replay_endpoint(&replay.endpoint));
    let (handle, mut rx) = spawn_feed(cfg).unwrap();
    for seq in [0, 2] {
        live.publish.send(seq).unwrap(); // 1 is lost: the hostile replay endpoint is asked for it
    }
    expect_batch(&mut rx, 0, false).await;
    expect_reset(&mut rx, ResetReason::Resync).await;
    expect_batch(&mut rx, 2, false).await;
    let stats = handle.stats();
    assert_eq!((count(&stats, "frame_too_large"), stats.replay_failures), (1, 1), "{stats:?}");
    wait_until("the hostile replay connection dropped", || replay.dropped.load(Ordering::Relaxed) >= 1).await;

    // The replay endpoint behaves now: the next gap is filled.
    live.publish.send(3).unwrap();
    expect_batch(&mut rx, 3, false).await;
    replay.publish.send(5).unwrap(); // the replay serves 4..=5
    live.publish.send(5).unwrap(); // 4 is lost
    expect_batch(&mut rx, 4, true).await;
    expect_batch(&mut rx, 5, true).await;
    let stats = handle.stats();
    assert_eq!((stats.replays, stats.replay_failures, stats.resyncs, stats.protocol_violations), (2, 1, 1, 1));
    assert!(!handle.is_finished());
}
