//! What a starting replica takes from a peer's snapshot, against a hostile peer: a tiny HTTP server on
//! 127.0.0.1 serving crafted frames at `GET /admin/cluster/snapshot` (no NATS needed).
//!
//! * A resume point the engine never reached (rank 0 at seq 2^64−1) is refuted by the engine's ring
//!   (or, without one, its live stream): the worker's grafted state is dropped, its ring replayed, the
//!   fallback counted, and the worker's KV events are followed afterwards (they were ignored for good
//!   before).
//! * A snapshot still streaming when `bootstrap_timeout_ms` runs out leaves nothing behind: the
//!   replica says `incomplete`, holds none of the peer's entries, and follows its engines from seq 0.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::*;
use mmrouter::config::Settings;

const ADMIN: &str = "trust-admin-key";
const HEAD: u8 = 1;
const INDEX: u8 = 3;
const END: u8 = 4;

/// A sim that publishes KV events with a replay ring (vLLM with `replay_endpoint`).
async fn event_sim() -> mmrouter_sim::SimHandle {
    sim_with(true).await
}

/// A sim that publishes KV events, with a replay ring or without one (vLLM's default).
async fn sim_with(replay: bool) -> mmrouter_sim::SimHandle {
    let mut sims = sims(1, |o| {
        fast(o);
        o.kv_events = Some("tcp://127.0.0.1:0".into());
        o.kv_events_replay = replay.then(|| "tcp://127.0.0.1:0".into());
    })
    .await;
    sims.remove(0)
}

/// A router's config over `sim`, with `cluster` (a `[cluster]` section, or nothing).
fn config(sim: &mmrouter_sim::SimHandle, cluster: &str) -> String {
    let ep = sim.kv_events_endpoint().unwrap();
    let replay = sim.kv_events_replay_endpoint().map(|r| format!("kv_events_replay = {r:?}\n")).unwrap_or_default();
    format!(
        "[server]\nhealth_interval_ms = 0\n[auth]\nadmin_keys = [{ADMIN:?}]\n{cluster}\n[[workers]]\nname = {:?}\n\
         url = {:?}\nkv_events = {ep:?}\n{replay}",
        sim.name(),
        sim.url()
    )
}

/// One snapshot frame: `len · kind · payload · xxh3-64 check`, as `src/cluster/snapshot.rs` writes it.
fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = ((1 + payload.len() + 8) as u32).to_le_bytes().to_vec();
    out.push(kind);
    out.extend_from_slice(payload);
    let check = xxhash_rust::xxh3::xxh3_64(&out);
    out.extend_from_slice(&check.to_le_bytes());
    out
}

/// A head naming `worker` of `pool` in snapshot slot 0, its rank 0 at `seq`.
fn head(pool: &str, worker: &str, seq: u64) -> Vec<u8> {
    let head = json!({
        "format": 2, "replica_id": "hostile", "taken_unix_ms": 0,
        "pools": [{"name": pool, "workers": [{"slot": 0, "name": worker, "held": 0, "capacity": null, "seqs": [[0, seq]]}]}],
    });
    frame(HEAD, &serde_json::to_vec(&head).unwrap())
}

/// `n` `Event` entries for slot 0 of pool 0, keys from `first` on.
fn index(first: u64, n: u32) -> Vec<u8> {
    let mut p = 0u16.to_le_bytes().to_vec();
    p.extend_from_slice(&n.to_le_bytes());
    for key in first..first + u64::from(n) {
        p.extend_from_slice(&key.to_le_bytes());
        p.extend_from_slice(&0u16.to_le_bytes()); // slot
        p.push(0); // source: event
        p.extend_from_slice(&0u32.to_le_bytes()); // age
    }
    frame(INDEX, &p)
}

fn end(maps: u64, index: u64) -> Vec<u8> {
    frame(END, &[maps.to_le_bytes(), index.to_le_bytes()].concat())
}

/// What the hostile peer does once it has sent its bytes.
#[derive(Clone, Copy)]
enum Then {
    /// Closes the stream: the snapshot is whole.
    Close,
    /// Keeps the stream alive with one byte of a frame that never completes every 100 ms (well within
    /// `peer_timeout_ms`), so only the bootstrap's own deadline ends it.
    Trickle,
}

/// A peer at `http://127.0.0.1:…` that answers every request with `body` (then `then`). Aborted when
/// dropped.
struct HostilePeer {
    url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HostilePeer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn hostile_peer(body: Vec<u8>, then: Then) -> HostilePeer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 16 << 10 {
                    let Ok(n @ 1..) = conn.read(&mut buf).await else { return };
                    req.extend_from_slice(&buf[..n]);
                }
                assert!(req.starts_with(b"GET /admin/cluster/snapshot "), "{}", String::from_utf8_lossy(&req));
                let head =
                    "HTTP/1.1 200 OK\r\ncontent-type: application/x-mmrouter-snapshot\r\nconnection: close\r\n\r\n";
                if conn.write_all(head.as_bytes()).await.is_err() || conn.write_all(&body).await.is_err() {
                    return;
                }
                if let Then::Trickle = then {
                    // A frame of 1 MiB announced, then its bytes one at a time.
                    let _ = conn.write_all(&(1u32 << 20).to_le_bytes()).await;
                    while conn.write_all(&[0]).await.is_ok() {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            });
        }
    });
    HostilePeer { url, task }
}

async fn health(url: &str) -> (u16, Value) {
    let resp = client().get(format!("{url}/health")).send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

async fn until_ready(url: &str) -> Value {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = health(url).await;
        if status == 200 {
            return body;
        }
        assert!(Instant::now() < end, "{url} never became ready: {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn metrics(url: &str) -> String {
    client().get(format!("{url}/metrics")).bearer_auth(ADMIN).send().await.unwrap().text().await.unwrap()
}

async fn chat_ok(url: &str, body: &[u8]) {
    let resp = post(url, body.to_vec()).await;
    let status = resp.status();
    assert!(status.is_success(), "{status} {}", resp.text().await.unwrap());
    resp.bytes().await.unwrap();
}

fn chats(n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let text = format!("{} question {i}: {}", unique("trust"), "tell me more about it ".repeat(20));
            chat_body(&[], &text, false)
        })
        .collect()
}

/// Blocks of `chat` that replica `url` knows from the worker's own events.
async fn event_blocks(url: &str, chat: &[u8]) -> u64 {
    let v = debug_route(url, "", chat, Some(ADMIN)).await;
    v["overlap_sources"].as_array().unwrap().iter().map(|o| o["events"].as_u64().unwrap()).sum()
}

/// Waits until replica `url` knows every chat's blocks from the worker's events.
async fn until_learnt(url: &str, chats: &[Vec<u8>]) {
    for chat in chats {
        let end = Instant::now() + Duration::from_secs(10);
        while event_blocks(url, chat).await < 4 {
            assert!(Instant::now() < end, "never learnt a chat from the worker's events");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Blocks stored by the worker's events, as replica `url` counted them.
async fn stored(url: &str, worker: &str) -> f64 {
    metric(&metrics(url).await, "mmrouter_kv_events_total", &format!("worker=\"{worker}\",kind=\"stored\""))
}

/// The attack of issue 45: a peer whose snapshot says rank 0 is at seq 2^64−1 once made the new
/// replica take every later batch of that worker for a duplicate (0 blocks stored after 16 s of
/// traffic). Now the engine's ring refutes the point: counted, the peer's `Event` entries for the
/// worker dropped, the ring replayed, and the traffic after it learnt like a lone router learns it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_snapshot_resume_point_the_engine_never_reached_is_refuted_and_replayed() {
    let sim = event_sim().await;
    let (worker, lone_cfg) = (sim.name().to_owned(), config(&sim, ""));
    let pool = Settings::parse(&lone_cfg).unwrap().pools[0].name.clone();
    // The control: a lone router on the same engine, which saw traffic before the replica started.
    let lone = proxy(vec![], &lone_cfg).await;
    let chats = chats(6);
    for chat in &chats[..3] {
        chat_ok(&lone.url, chat).await;
    }
    until_learnt(&lone.url, &chats[..3]).await;

    const PLANTED: u32 = 1000;
    let body = [head(&pool, &worker, u64::MAX), index(1 << 40, PLANTED), end(0, u64::from(PLANTED))].concat();
    let peer = hostile_peer(body, Then::Close).await;
    let cluster = format!("[cluster]\nreplica_id = \"b\"\npeers = [{:?}]\n", peer.url);
    let b = proxy(vec![], &config(&sim, &cluster)).await;
    let health = until_ready(&b.url).await;
    assert_eq!(health["bootstrap"]["state"], "complete", "{health}");
    assert_eq!(health["bootstrap"]["source"], peer.url.as_str(), "the snapshot was grafted: {health}");

    let (mb, ml) = (metrics(&b.url).await, metrics(&lone.url).await);
    let fallbacks = metric(&mb, "mmrouter_cluster_resume_fallbacks_total", "reason=\"resume_ahead\"");
    assert_eq!(fallbacks, 1.0, "the refuted point is counted");
    // The planted entries went with the point; what the ring replayed is what the lone router holds.
    let events = |m: &str| metric(m, "mmrouter_index_blocks_by_source", "source=\"events\"");
    assert_eq!(events(&mb), events(&ml), "b holds the engine's blocks, none of the peer's");
    assert!(events(&mb) > 0.0 && events(&mb) < f64::from(PLANTED));
    for chat in &chats[..3] {
        assert_eq!(event_blocks(&b.url, chat).await, event_blocks(&lone.url, chat).await, "replayed from the ring");
    }

    // Traffic after the graft: b stores the worker's blocks from its events, as the lone router does.
    for chat in &chats[3..] {
        chat_ok(&b.url, chat).await;
    }
    until_learnt(&b.url, &chats).await;
    until_learnt(&lone.url, &chats).await;
    let (attacked, control) = (stored(&b.url, &worker).await, stored(&lone.url, &worker).await);
    eprintln!("blocks stored by events after the seq attack: {attacked} (lone router: {control})");
    assert!(attacked > 0.0 && attacked == control, "attacked {attacked}, control {control}");
}

/// Issue 45: a bootstrap that ran out of time kept the partial graft (262 144 hostile entries while
/// `/health` said `incomplete`). The peer here streams four frames of 65 536 `Event` entries, then
/// keeps the stream alive without ever finishing it: at the deadline the graft is undone, and the
/// feeds replay their engines from seq 0 instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bootstrap_that_runs_out_of_time_keeps_nothing_of_a_partial_graft() {
    let sim = event_sim().await;
    let (worker, lone_cfg) = (sim.name().to_owned(), config(&sim, ""));
    let pool = Settings::parse(&lone_cfg).unwrap().pools[0].name.clone();
    let lone = proxy(vec![], &lone_cfg).await;
    let chats = chats(4);
    for chat in &chats[..2] {
        chat_ok(&lone.url, chat).await;
    }
    until_learnt(&lone.url, &chats[..2]).await;

    let mut body = head(&pool, &worker, 0);
    for i in 0..4 {
        body.extend(index((1 << 40) + i * 65_536, 65_536));
    }
    let peer = hostile_peer(body, Then::Trickle).await;
    let cluster = format!("[cluster]\nreplica_id = \"t\"\npeers = [{:?}]\nbootstrap_timeout_ms = 2000\n", peer.url);
    let started = Instant::now();
    let t = proxy(vec![], &config(&sim, &cluster)).await;
    let health = until_ready(&t.url).await;
    assert!(started.elapsed() >= Duration::from_millis(1900), "ready only at the deadline");
    // The peer's stream used the whole wait, so the engines' rings are replayed from 0 after it: the
    // state is `incomplete`, or `complete` when the feeds had already settled at the deadline's check
    // (a small ring replays in milliseconds; which one is a race with that check). Never the peer's.
    assert_eq!(health["bootstrap"]["source"].as_str(), Some("engines"), "{health}");
    let state = health["bootstrap"]["state"].as_str();
    assert!(matches!(state, Some("incomplete" | "complete")), "{health}");
    // Nothing of the peer's stays; the engine's ring (replayed from 0) gives what the lone router has.
    let end = Instant::now() + Duration::from_secs(10);
    let events = |m: &str| metric(m, "mmrouter_index_blocks_by_source", "source=\"events\"");
    loop {
        let (mt, ml) = (metrics(&t.url).await, metrics(&lone.url).await);
        assert!(events(&mt) < 65_536.0, "the partial graft is still there: {} entries", events(&mt));
        if events(&mt) == events(&ml) && events(&mt) > 0.0 {
            break;
        }
        assert!(Instant::now() < end, "t: {} events entries, lone: {}", events(&mt), events(&ml));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for chat in &chats[2..] {
        chat_ok(&t.url, chat).await;
    }
    until_learnt(&t.url, &chats).await;
}

/// The same attack on an engine without a replay ring: nothing to replay, so the live stream is the
/// engine's word. The first batch after the resume is short of 2^64−1: the point is refuted (counted)
/// and the worker's events are followed from there, as a lone router follows them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_replay_ring_the_live_stream_refutes_the_resume_point() {
    let sim = sim_with(false).await;
    let (worker, lone_cfg) = (sim.name().to_owned(), config(&sim, ""));
    let pool = Settings::parse(&lone_cfg).unwrap().pools[0].name.clone();
    let lone = proxy(vec![], &lone_cfg).await;
    let body = [head(&pool, &worker, u64::MAX), end(0, 0)].concat();
    let peer = hostile_peer(body, Then::Close).await;
    let cluster = format!("[cluster]\nreplica_id = \"n\"\npeers = [{:?}]\n", peer.url);
    let b = proxy(vec![], &config(&sim, &cluster)).await;
    let health = until_ready(&b.url).await;
    assert_eq!(health["bootstrap"]["source"], peer.url.as_str(), "the snapshot was grafted: {health}");
    // No ring to replay: both routers must be subscribed before the chats, or what the engine says
    // before then is lost to them (a loaded machine once sent the chats before the lone one joined).
    let end = Instant::now() + Duration::from_secs(10);
    while sim.kv_event_subscriptions() < 2 {
        assert!(Instant::now() < end, "the routers never both subscribed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let chats = chats(4);
    for chat in &chats {
        chat_ok(&b.url, chat).await;
    }
    until_learnt(&b.url, &chats).await;
    until_learnt(&lone.url, &chats).await;
    let fallbacks =
        metric(&metrics(&b.url).await, "mmrouter_cluster_resume_fallbacks_total", "reason=\"resume_ahead\"");
    assert_eq!(fallbacks, 1.0);
    let (attacked, control) = (stored(&b.url, &worker).await, stored(&lone.url, &worker).await);
    assert!(attacked > 0.0 && attacked == control, "attacked {attacked}, control {control}");
}
