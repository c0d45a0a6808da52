//! Feed tests against real sockets on 127.0.0.1: a Rust `zeromq` XPUB + ROUTER emulate a vLLM publisher
//! and its replay endpoint (both reply formats). XPUB is wire-identical to PUB for the subscriber; it is
//! used so the test can wait for the subscription deterministically instead of sleeping.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rmpv::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use zeromq::{RouterSocket, Socket, SocketRecv, SocketSend, XPubSocket, ZmqMessage};

use super::*;
use crate::decode::KvEvent;

pub(super) const WAIT: Duration = Duration::from_secs(5);

/// Reply layout of the fake replay ROUTER.
#[derive(Clone, Copy, Debug, PartialEq)]
enum ReplayFormat {
    /// `[b"", seq, payload]` (vLLM ≤ 0.25, SGLang ≤ 0.5.21).
    ThreeFrames,
    /// `[b"", topic, seq, payload]` (vLLM ≥ 0.27, SGLang ≥ 0.5.22).
    FourFrames,
    /// Never answers (to exercise the replay timeout).
    Silent,
}

type Ring = Arc<Mutex<VecDeque<(u64, Bytes)>>>;

/// A fake engine: PUB (as XPUB) + replay ROUTER with a bounded ring, like vLLM's ZmqEventPublisher.
struct FakeEngine {
    xpub: Option<XPubSocket>,
    pub_endpoint: String,
    replay_endpoint: String,
    ring: Ring,
    ring_size: usize,
    topic: String,
    next_seq: u64,
    replay_stop: Option<oneshot::Sender<()>>,
    replay_task: Option<JoinHandle<()>>,
}

async fn bind_with_retry<S: Socket>(socket: &mut S, endpoint: &str) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        match socket.bind(endpoint).await {
            Ok(ep) => return ep.to_string(),
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("bind {endpoint}: {e}"),
        }
    }
}

impl FakeEngine {
    async fn start(format: ReplayFormat, ring_size: usize) -> Self {
        Self::start_on("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", format, ring_size, "").await
    }

    async fn start_on(pub_ep: &str, replay_ep: &str, format: ReplayFormat, ring_size: usize, topic: &str) -> Self {
        let mut xpub = XPubSocket::new();
        let pub_endpoint = bind_with_retry(&mut xpub, pub_ep).await;
        let mut router = RouterSocket::new();
        let replay_endpoint = bind_with_retry(&mut router, replay_ep).await;
        let ring: Ring = Arc::default();
        let (stop_tx, stop_rx) = oneshot::channel();
        let task = tokio::spawn(serve_replay(router, ring.clone(), format, Bytes::from(topic.to_owned()), stop_rx));
        FakeEngine {
            xpub: Some(xpub),
            pub_endpoint,
            replay_endpoint,
            ring,
            ring_size,
            topic: topic.to_owned(),
            next_seq: 0,
            replay_stop: Some(stop_tx),
            replay_task: Some(task),
        }
    }

    fn feed_config(&self) -> FeedConfig {
        let mut cfg = FeedConfig::new(&self.pub_endpoint).with_replay_endpoint(&self.replay_endpoint);
        cfg.replay_timeout = Duration::from_secs(2);
        cfg
    }

    /// Waits until a subscriber's subscription reached the XPUB (after that, sends are not dropped).
    async fn wait_subscribed(&mut self) {
        let xpub = self.xpub.as_mut().unwrap();
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let msg = tokio::time::timeout_at(deadline, xpub.recv()).await.expect("no subscription").unwrap();
            if msg.get(0).is_some_and(|f| f.first() == Some(&1)) {
                return;
            }
        }
    }

    /// Stores the next batch in the replay ring without publishing it (a message lost to the HWM or to a
    /// slow join).
    fn record(&mut self, payload: Bytes) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        let mut ring = self.ring.lock().unwrap();
        ring.push_back((seq, payload));
        while ring.len() > self.ring_size {
            ring.pop_front();
        }
        seq
    }

    /// Records and publishes the next batch.
    async fn publish(&mut self, payload: Bytes) -> u64 {
        let seq = self.record(payload.clone());
        self.send_frames(vec![Bytes::from(self.topic.clone()), Bytes::copy_from_slice(&seq.to_be_bytes()), payload])
            .await;
        seq
    }

    async fn send_frames(&mut self, frames: Vec<Bytes>) {
        self.xpub.as_mut().unwrap().send(ZmqMessage::try_from(frames).unwrap()).await.unwrap();
    }

    /// Simulates a process restart of the publisher's counter (same sockets).
    fn restart_counter(&mut self) {
        self.next_seq = 0;
        self.ring.lock().unwrap().clear();
    }

    /// Closes both sockets and waits until the ports are released.
    async fn shutdown(mut self) {
        if let Some(xpub) = self.xpub.take() {
            let _ = xpub.close().await;
        }
        if let Some(stop) = self.replay_stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.replay_task.take() {
            let _ = task.await;
        }
    }
}

async fn serve_replay(
    mut router: RouterSocket,
    ring: Ring,
    format: ReplayFormat,
    topic: Bytes,
    mut stop: oneshot::Receiver<()>,
) {
    loop {
        let msg = tokio::select! {
            _ = &mut stop => break,
            msg = router.recv() => match msg { Ok(m) => m, Err(_) => continue },
        };
        let frames = msg.into_vec();
        // [identity, b"", start_seq]
        assert_eq!(frames.len(), 3, "replay request must be [identity, empty, start]");
        assert!(frames[1].is_empty(), "missing empty delimiter");
        let identity = frames[0].clone();
        let start = u64::from_be_bytes(frames[2].as_ref().try_into().unwrap());
        if format == ReplayFormat::Silent {
            continue;
        }
        let entries: Vec<_> = ring.lock().unwrap().iter().filter(|(s, _)| *s >= start).cloned().collect();
        let reply = |seq: u64, payload: Bytes| {
            let mut f = vec![identity.clone(), Bytes::new()];
            if format == ReplayFormat::FourFrames {
                f.push(if seq == u64::MAX { Bytes::new() } else { topic.clone() });
            }
            f.push(Bytes::copy_from_slice(&seq.to_be_bytes()));
            f.push(payload);
            ZmqMessage::try_from(f).unwrap()
        };
        for (seq, payload) in entries {
            router.send(reply(seq, payload)).await.unwrap();
        }
        router.send(reply(u64::MAX, Bytes::new())).await.unwrap();
    }
    let _ = router.close().await;
}

/// A vLLM 0.23-style batch whose ts and block hash identify `n`.
pub(super) fn payload(n: u64) -> Bytes {
    let ev = Value::Array(vec![
        Value::from("BlockStored"),
        Value::Array(vec![Value::from(n)]),
        Value::Nil,
        Value::Array(vec![Value::from(1), Value::from(2)]),
        Value::from(2),
        Value::Nil,
        Value::from("GPU"),
    ]);
    let batch = Value::Array(vec![Value::F64(n as f64), Value::Array(vec![ev]), Value::from(0)]);
    let mut buf = Vec::new();
    rmpv::encode::write_value(&mut buf, &batch).unwrap();
    Bytes::from(buf)
}

pub(super) async fn next(rx: &mut mpsc::Receiver<FeedEvent>) -> FeedEvent {
    tokio::time::timeout(WAIT, rx.recv()).await.expect("timed out waiting for a feed event").expect("feed ended")
}

/// Expects a batch with the given seq (and `payload(seq)` content).
pub(super) async fn expect_batch(rx: &mut mpsc::Receiver<FeedEvent>, seq: u64, replayed: bool) {
    match next(rx).await {
        FeedEvent::Batch { seq: s, batch, replayed: r } => {
            assert_eq!((s, r), (seq, replayed), "unexpected batch");
            assert_eq!(batch.ts, seq as f64);
            let [KvEvent::BlockStored(st)] = batch.events.as_slice() else { panic!("bad events") };
            assert_eq!(st.block_hashes[0].id(), seq);
        }
        other => panic!("expected batch {seq}, got {other:?}"),
    }
}

pub(super) async fn expect_reset(rx: &mut mpsc::Receiver<FeedEvent>, reason: ResetReason) {
    match next(rx).await {
        FeedEvent::Reset { reason: r } => assert_eq!(r, reason),
        other => panic!("expected reset {reason:?}, got {other:?}"),
    }
}

pub(super) async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn assert_idle(rx: &mut mpsc::Receiver<FeedEvent>) {
    if let Ok(ev) = rx.try_recv() {
        panic!("unexpected extra event {ev:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_order_delivery() {
    let mut engine = FakeEngine::start(ReplayFormat::ThreeFrames, 100).await;
    let (handle, mut rx) = spawn_feed(engine.feed_config()).unwrap();
    engine.wait_subscribed().await;
    for n in 0..5 {
        engine.publish(payload(n)).await;
    }
    for n in 0..5 {
        expect_batch(&mut rx, n, false).await;
    }
    let stats = handle.stats();
    assert_eq!((stats.messages, stats.batches, stats.events), (5, 5, 5));
    assert_eq!((stats.gaps, stats.replays, stats.malformed, stats.resyncs), (0, 0, 0, 0));
    assert_eq!(stats.last_seq, Some(4));
    assert!(stats.connected && stats.history_complete);
    assert_idle(&mut rx);
    engine.shutdown().await;
}

async fn gap_is_filled(format: ReplayFormat) {
    let mut engine = FakeEngine::start(format, 100).await;
    let (handle, mut rx) = spawn_feed(engine.feed_config()).unwrap();
    engine.wait_subscribed().await;
    engine.publish(payload(0)).await;
    engine.publish(payload(1)).await;
    engine.record(payload(2)); // lost
    engine.publish(payload(3)).await;
    expect_batch(&mut rx, 0, false).await;
    expect_batch(&mut rx, 1, false).await;
    expect_batch(&mut rx, 2, true).await;
    expect_batch(&mut rx, 3, true).await;
    engine.publish(payload(4)).await;
    expect_batch(&mut rx, 4, false).await;
    let stats = handle.stats();
    assert_eq!((stats.gaps, stats.replays, stats.replay_failures, stats.resyncs), (1, 1, 0, 0));
    assert_eq!(stats.duplicates, 1, "live seq 3 duplicated the replayed one");
    assert!(stats.history_complete);
    assert_idle(&mut rx);
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_seq_is_replayed_three_frame_replies() {
    gap_is_filled(ReplayFormat::ThreeFrames).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_seq_is_replayed_four_frame_replies() {
    gap_is_filled(ReplayFormat::FourFrames).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_joiner_replays_from_zero() {
    let mut engine = FakeEngine::start(ReplayFormat::FourFrames, 100).await;
    for n in 0..3 {
        engine.record(payload(n)); // published before anyone subscribed
    }
    let (handle, mut rx) = spawn_feed(engine.feed_config()).unwrap();
    engine.wait_subscribed().await;
    engine.publish(payload(3)).await;
    for n in 0..=3 {
        expect_batch(&mut rx, n, true).await;
    }
    engine.publish(payload(4)).await;
    expect_batch(&mut rx, 4, false).await;
    let stats = handle.stats();
    assert_eq!((stats.replays, stats.gaps, stats.resyncs, stats.replayed_messages), (1, 0, 0, 4));
    assert!(stats.history_complete);
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seq_back_to_zero_is_a_restart() {
    let mut engine = FakeEngine::start(ReplayFormat::ThreeFrames, 100).await;
    let (handle, mut rx) = spawn_feed(engine.feed_config()).unwrap();
    engine.wait_subscribed().await;
    for n in 0..3 {
        engine.publish(payload(n)).await;
        expect_batch(&mut rx, n, false).await;
    }
    engine.restart_counter();
    engine.publish(payload(0)).await;
    expect_reset(&mut rx, ResetReason::Restart).await;
    expect_batch(&mut rx, 0, false).await;
    assert_eq!(handle.stats().restarts, 1);
    assert_eq!(handle.stats().last_seq, Some(0));
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gap_older_than_ring_resyncs() {
    let mut engine = FakeEngine::start(ReplayFormat::ThreeFrames, 3).await;
    let (handle, mut rx) = spawn_feed(engine.feed_config()).unwrap();
    engine.wait_subscribed().await;
    engine.publish(payload(0)).await;
    expect_batch(&mut rx, 0, false).await;
    for n in 1..=6 {
        engine.record(payload(n));
    }
    engine.publish(payload(7)).await; // ring now holds 5, 6, 7
    expect_reset(&mut rx, ResetReason::Resync).await;
    for n in 5..=7 {
        expect_batch(&mut rx, n, true).await;
    }
    engine.publish(payload(8)).await;
    expect_batch(&mut rx, 8, false).await;
    let stats = handle.stats();
    assert_eq!((stats.gaps, stats.replays, stats.resyncs), (1, 1, 1));
    assert!(!stats.history_complete);
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gap_without_replay_endpoint_resyncs() {
    let (mut engine, handle, mut rx) = subscribed_without_replay(false).await;
    engine.publish(payload(0)).await;
    engine.record(payload(1));
    engine.publish(payload(2)).await;
    expect_batch(&mut rx, 0, false).await;
    expect_reset(&mut rx, ResetReason::Resync).await;
    expect_batch(&mut rx, 2, false).await;
    assert_eq!((handle.stats().gaps, handle.stats().replays, handle.stats().resyncs), (1, 0, 1));
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_timeout_resyncs_and_keeps_live_messages() {
    let mut engine = FakeEngine::start(ReplayFormat::Silent, 100).await;
    let mut cfg = engine.feed_config();
    cfg.replay_timeout = Duration::from_millis(200);
    let (handle, mut rx) = spawn_feed(cfg).unwrap();
    engine.wait_subscribed().await;
    engine.publish(payload(0)).await;
    expect_batch(&mut rx, 0, false).await;
    engine.record(payload(1));
    engine.publish(payload(2)).await;
    engine.publish(payload(3)).await;
    let started = Instant::now();
    expect_reset(&mut rx, ResetReason::Resync).await;
    assert!(started.elapsed() < Duration::from_secs(2));
    expect_batch(&mut rx, 2, false).await;
    expect_batch(&mut rx, 3, false).await;
    let stats = handle.stats();
    assert_eq!((stats.replays, stats.replay_failures, stats.resyncs), (1, 1, 1));
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_messages_are_counted_and_skipped() {
    let mut engine = FakeEngine::start(ReplayFormat::ThreeFrames, 100).await;
    let (handle, mut rx) = spawn_feed(engine.feed_config()).unwrap();
    engine.wait_subscribed().await;
    engine.publish(payload(0)).await;
    engine.publish(Bytes::from_static(b"\x93\xcb\x00")).await; // seq 1: truncated
    engine.send_frames(vec![Bytes::new(), Bytes::from_static(b"only two frames")]).await;
    engine.send_frames(vec![Bytes::new(), Bytes::from_static(b"\x00\x01"), payload(9)]).await;
    engine.publish(payload(2)).await;
    expect_batch(&mut rx, 0, false).await;
    match next(&mut rx).await {
        FeedEvent::Malformed { seq: Some(1), error } => assert_eq!(error.label(), "not_msgpack"),
        other => panic!("{other:?}"),
    }
    match next(&mut rx).await {
        FeedEvent::Malformed { seq: None, error } => assert_eq!(error.label(), "bad_frames"),
        other => panic!("{other:?}"),
    }
    match next(&mut rx).await {
        FeedEvent::Malformed { seq: None, error } => assert_eq!(error.label(), "bad_seq"),
        other => panic!("{other:?}"),
    }
    expect_batch(&mut rx, 2, false).await;
    let stats = handle.stats();
    assert_eq!((stats.messages, stats.malformed, stats.batches), (5, 3, 2));
    assert_eq!((stats.gaps, stats.resyncs, stats.restarts), (0, 0, 0), "a bad payload still advances the seq");
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publisher_restart_on_same_port_is_picked_up() {
    let mut engine = FakeEngine::start(ReplayFormat::ThreeFrames, 100).await;
    let (pub_ep, replay_ep) = (engine.pub_endpoint.clone(), engine.replay_endpoint.clone());
    let (handle, mut rx) = spawn_feed(engine.feed_config()).unwrap();
    engine.wait_subscribed().await;
    for n in 0..3 {
        engine.publish(payload(n)).await;
        expect_batch(&mut rx, n, false).await;
    }
    engine.shutdown().await;
    wait_until("disconnect", || handle.stats().disconnects >= 1).await;
    assert!(!handle.stats().connected);

    let started = Instant::now();
    let mut engine = FakeEngine::start_on(&pub_ep, &replay_ep, ReplayFormat::ThreeFrames, 100, "").await;
    engine.wait_subscribed().await; // the SUB reconnected and re-sent its subscription
    engine.publish(payload(0)).await;
    expect_reset(&mut rx, ResetReason::Restart).await;
    expect_batch(&mut rx, 0, false).await;
    engine.publish(payload(1)).await;
    expect_batch(&mut rx, 1, false).await;
    let stats = handle.stats();
    assert!(stats.connected);
    assert_eq!(stats.restarts, 1);
    eprintln!("reconnected after {:?} (socket recreations: {})", started.elapsed(), stats.socket_recreations);
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_without_seq_drop_still_resets() {
    // A new publisher process on the same port that already published seq 0..=4 before the SUB got back.
    let mut engine = FakeEngine::start(ReplayFormat::ThreeFrames, 100).await;
    let (pub_ep, replay_ep) = (engine.pub_endpoint.clone(), engine.replay_endpoint.clone());
    let mut cfg = engine.feed_config();
    cfg.replay_endpoint = None;
    let (handle, mut rx) = spawn_feed(cfg).unwrap();
    engine.wait_subscribed().await;
    engine.publish(payload(0)).await;
    expect_batch(&mut rx, 0, false).await;
    engine.shutdown().await;
    wait_until("disconnect", || handle.stats().disconnects >= 1).await;
    let mut engine = FakeEngine::start_on(&pub_ep, &replay_ep, ReplayFormat::ThreeFrames, 100, "").await;
    engine.wait_subscribed().await;
    for n in 0..5 {
        engine.record(payload(n));
    }
    engine.publish(payload(5)).await;
    expect_reset(&mut rx, ResetReason::Reconnect).await;
    expect_batch(&mut rx, 5, false).await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connects_to_a_publisher_that_starts_later() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let pub_ep = format!("tcp://127.0.0.1:{port}");
    let mut cfg = FeedConfig::new(&pub_ep);
    cfg.connect_timeout = Duration::from_millis(300);
    cfg.reconnect_interval_max = Duration::from_millis(200);
    let (handle, mut rx) = spawn_feed(cfg).unwrap();
    wait_until("a failed connect", || handle.stats().connect_failures >= 1).await;
    let mut engine = FakeEngine::start_on(&pub_ep, "tcp://127.0.0.1:0", ReplayFormat::ThreeFrames, 10, "").await;
    engine.wait_subscribed().await;
    engine.publish(payload(0)).await;
    expect_batch(&mut rx, 0, false).await;
    assert!(handle.stats().connected);
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_prefix_filters() {
    let mut engine =
        FakeEngine::start_on("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", ReplayFormat::FourFrames, 10, "kv@a").await;
    let cfg = engine.feed_config().with_topic("kv@a");
    let (_handle, mut rx) = spawn_feed(cfg).unwrap();
    engine.wait_subscribed().await;
    engine
        .send_frames(vec![Bytes::from_static(b"kv@b"), Bytes::copy_from_slice(&7u64.to_be_bytes()), payload(7)])
        .await;
    engine.publish(payload(0)).await;
    expect_batch(&mut rx, 0, false).await;
    assert_idle(&mut rx);
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_handle_stops_the_feed() {
    let mut engine = FakeEngine::start(ReplayFormat::ThreeFrames, 10).await;
    let (handle, mut rx) = spawn_feed(engine.feed_config()).unwrap();
    engine.wait_subscribed().await;
    drop(handle);
    let end = tokio::time::timeout(WAIT, rx.recv()).await.expect("channel not closed");
    assert!(end.is_none());
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_receiver_ends_the_task() {
    let engine = FakeEngine::start(ReplayFormat::ThreeFrames, 10).await;
    let (handle, rx) = spawn_feed(engine.feed_config()).unwrap();
    drop(rx);
    wait_until("task end", || handle.is_finished()).await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_outage_recreates_the_socket() {
    let mut engine = FakeEngine::start(ReplayFormat::ThreeFrames, 100).await;
    let (pub_ep, replay_ep) = (engine.pub_endpoint.clone(), engine.replay_endpoint.clone());
    let mut cfg = engine.feed_config();
    cfg.connect_timeout = Duration::from_millis(200);
    cfg.reconnect_interval_max = Duration::from_millis(250);
    let (handle, mut rx) = spawn_feed(cfg).unwrap();
    engine.wait_subscribed().await;
    engine.publish(payload(0)).await;
    expect_batch(&mut rx, 0, false).await;
    engine.shutdown().await;
    // Stay down until the feed gave up on the crate's own reconnect and recreated its socket.
    wait_until("socket recreation", || handle.stats().socket_recreations >= 1).await;
    let mut engine = FakeEngine::start_on(&pub_ep, &replay_ep, ReplayFormat::ThreeFrames, 100, "").await;
    engine.wait_subscribed().await;
    engine.publish(payload(0)).await;
    expect_reset(&mut rx, ResetReason::Restart).await;
    expect_batch(&mut rx, 0, false).await;
    assert!(handle.stats().connected);
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_gaps_under_load_are_all_filled() {
    const N: u64 = 600;
    let mut engine = FakeEngine::start(ReplayFormat::FourFrames, 10_000).await;
    let (handle, mut rx) = spawn_feed(engine.feed_config()).unwrap();
    engine.wait_subscribed().await;
    let publisher = tokio::spawn(async move {
        for n in 0..N {
            if n % 37 == 5 || n % 101 == 50 {
                engine.record(payload(n)); // dropped on the way
            } else {
                engine.publish(payload(n)).await;
            }
            if n % 50 == 0 {
                tokio::task::yield_now().await;
            }
        }
        engine
    });
    for n in 0..N - 1 {
        match next(&mut rx).await {
            FeedEvent::Batch { seq, batch, .. } => {
                assert_eq!(seq, n);
                assert_eq!(batch.ts, n as f64);
            }
            other => panic!("at {n}: {other:?}"),
        }
    }
    let mut engine = publisher.await.unwrap();
    // The last seq may itself have been dropped; one more live message reveals the gap.
    engine.publish(payload(N)).await;
    for n in [N - 1, N] {
        // Live or replayed, depending on how far the last replay ran ahead.
        assert!(matches!(next(&mut rx).await, FeedEvent::Batch { seq, .. } if seq == n));
    }
    let stats = handle.stats();
    assert_eq!((stats.resyncs, stats.restarts, stats.replay_failures), (0, 0, 0), "{stats:?}");
    assert!(stats.gaps >= 1 && stats.replays >= 1, "{stats:?}");
    assert!(stats.history_complete);
    engine.shutdown().await;
}

/// A replica's held feed (it grafts a peer's state first) on an engine without a replay ring: once
/// resumed it delivers what it held and then follows live, as an unheld feed would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_feed_without_replay_delivers_once_resumed() {
    let (mut engine, handle, mut rx) = subscribed_without_replay(true).await;
    engine.publish(payload(0)).await;
    engine.publish(payload(1)).await;
    wait_until("both held", || handle.stats().messages == 2).await;
    assert_idle(&mut rx);
    handle.resume(None);
    expect_batch(&mut rx, 0, false).await;
    expect_batch(&mut rx, 1, false).await;
    assert!(matches!(next(&mut rx).await, FeedEvent::Synced));
    engine.publish(payload(2)).await;
    expect_batch(&mut rx, 2, false).await;
    engine.shutdown().await;
}

/// Resumed before anything arrived (the usual start: no peer, nothing published yet).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_feed_without_replay_resumed_early_follows_live() {
    let (mut engine, handle, mut rx) = subscribed_without_replay(true).await;
    handle.resume(None);
    assert!(matches!(next(&mut rx).await, FeedEvent::Synced));
    engine.publish(payload(0)).await;
    expect_batch(&mut rx, 0, false).await;
    engine.publish(payload(1)).await;
    expect_batch(&mut rx, 1, false).await;
    engine.shutdown().await;
}

/// A peer replica's snapshot said this engine is at seq 2^64−1. The engine's ring shows it is not:
/// the point is refused (counted), the whole ring is replayed, and the feed follows live afterwards
/// instead of taking every later batch for a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_point_ahead_of_the_engine_is_refused_and_the_ring_replayed() {
    let mut engine = FakeEngine::start(ReplayFormat::FourFrames, 100).await;
    let mut cfg = engine.feed_config();
    cfg.hold_until_resumed = true;
    let (handle, mut rx) = spawn_feed(cfg).unwrap();
    engine.wait_subscribed().await;
    for n in 0..3 {
        engine.publish(payload(n)).await;
    }
    wait_until("held", || handle.stats().messages == 3).await;
    handle.resume(Some(u64::MAX));
    expect_reset(&mut rx, ResetReason::ResumeAhead).await;
    for n in 0..3 {
        expect_batch(&mut rx, n, true).await;
    }
    assert!(matches!(next(&mut rx).await, FeedEvent::Synced));
    engine.publish(payload(3)).await;
    expect_batch(&mut rx, 3, false).await;
    let stats = handle.stats();
    assert_eq!((stats.resume_ahead, stats.resume_unreachable, stats.resyncs), (1, 0, 0), "{stats:?}");
    assert!(stats.history_complete);
    engine.shutdown().await;
}

/// The snapshot's point is older than the engine's ring reaches: refused as unreachable, and the
/// ring is taken from its start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_point_the_ring_no_longer_holds_is_refused() {
    let mut engine = FakeEngine::start(ReplayFormat::ThreeFrames, 4).await;
    let mut cfg = engine.feed_config();
    cfg.hold_until_resumed = true;
    let (handle, mut rx) = spawn_feed(cfg).unwrap();
    engine.wait_subscribed().await;
    for n in 0..10 {
        engine.publish(payload(n)).await;
    }
    wait_until("held", || handle.stats().messages == 10).await;
    handle.resume(Some(2)); // the ring holds 6..=9
    expect_reset(&mut rx, ResetReason::ResumeUnreachable).await;
    for n in 6..10 {
        expect_batch(&mut rx, n, true).await;
    }
    assert!(matches!(next(&mut rx).await, FeedEvent::Synced));
    assert_eq!(handle.stats().resume_unreachable, 1);
    engine.shutdown().await;
}

/// An engine without a replay socket and a feed subscribed to it (`hold`: held until resumed).
async fn subscribed_without_replay(hold: bool) -> (FakeEngine, FeedHandle, mpsc::Receiver<FeedEvent>) {
    let mut engine = FakeEngine::start(ReplayFormat::ThreeFrames, 100).await;
    let mut cfg = engine.feed_config();
    cfg.replay_endpoint = None;
    cfg.hold_until_resumed = hold;
    let (handle, rx) = spawn_feed(cfg).unwrap();
    engine.wait_subscribed().await;
    (engine, handle, rx)
}
