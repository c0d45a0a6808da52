//! Several replicas that route as one (`[cluster]`): a replica started after traffic grafts a peer's
//! snapshot (or replays the engines' rings) before it reports ready, and sees what the running one
//! sees; bookings and dispatch records travel over a real `nats-server` on 127.0.0.1 (installed by
//! [`nats_server`] when missing); a killed replica's bookings expire; a NATS restart fails nothing.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::*;
use mmrouter::config::Settings;

const ADMIN: &str = "cluster-admin-key";

/// Sims that publish KV events with a replay ring (as vLLM with `replay_endpoint`).
async fn event_sims(n: usize) -> Vec<mmrouter_sim::SimHandle> {
    sims(n, |o| {
        fast(o);
        o.kv_events = Some("tcp://127.0.0.1:0".into());
        o.kv_events_replay = Some("tcp://127.0.0.1:0".into());
    })
    .await
}

/// `[[workers]]` for `sims`, with their event endpoints.
fn workers_toml(sims: &[mmrouter_sim::SimHandle]) -> String {
    let mut out = String::new();
    for s in sims {
        out.push_str(&format!("[[workers]]\nname = {:?}\nurl = {:?}\n", s.name(), s.url()));
        if let Some(ep) = s.kv_events_endpoint() {
            let replay = s.kv_events_replay_endpoint().unwrap();
            out.push_str(&format!("kv_events = {ep:?}\nkv_events_replay = {replay:?}\n"));
        }
    }
    out
}

fn base_toml(cluster: &str) -> String {
    format!("[server]\nhealth_interval_ms = 0\n[auth]\nadmin_keys = [{ADMIN:?}]\n{cluster}\n")
}

async fn debug_with_key(url: &str, body: &[u8]) -> Value {
    debug_route(url, "", body, Some(ADMIN)).await
}

async fn health(url: &str) -> (u16, Value) {
    let resp = client().get(format!("{url}/health")).send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

/// Polls `/health` until 200; returns the body and when it turned ready.
pub(crate) async fn until_ready(url: &str) -> (Value, Instant) {
    let end = Instant::now() + Duration::from_secs(30);
    while Instant::now() < end {
        let (status, body) = health(url).await;
        if status == 200 {
            return (body, Instant::now());
        }
        assert_eq!(body["status"], "bootstrapping", "{body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{url} never became ready: {:?}", health(url).await);
}

async fn chat_ok(url: &str, body: &[u8]) {
    let resp = post(url, body.to_vec()).await;
    let status = resp.status();
    assert!(status.is_success(), "{status} {}", resp.text().await.unwrap());
    resp.bytes().await.unwrap();
}

fn overlaps(v: &Value) -> Vec<u64> {
    v["overlap_blocks"].as_array().unwrap_or(&Vec::new()).iter().map(|b| b.as_u64().unwrap()).collect()
}

/// Chats of the run: long shared system prompt + distinct questions, some with images.
fn run_chats() -> Vec<Vec<u8>> {
    (0..6)
        .map(|i| {
            let text = format!("{} question {i}: {}", unique("conversation"), "tell me more about it ".repeat(20));
            let images = if i % 2 == 0 { vec![png_data_url(224, 224, i as u8)] } else { vec![] };
            chat_body(&images, &text, false)
        })
        .collect()
}

/// Waits until replica `url` sees every chat on its worker through the events (the events are async).
async fn until_learnt(url: &str, chats: &[Vec<u8>]) {
    for chat in chats {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let v = debug_with_key(url, chat).await;
            let events: u64 =
                v["overlap_sources"].as_array().unwrap().iter().map(|o| o["events"].as_u64().unwrap()).sum();
            if events >= 4 {
                break;
            }
            assert!(Instant::now() < end, "never learnt the chat from events: {v}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The mechanism matters: after a run through replica `a`, a replica started with `peers = [a]`
/// reports ready only once it holds what `a` holds — the same per-worker overlap for every chat of
/// the run, within 2 s of ready — while a lone router started at the same time sees none of it. Live
/// events after the graft are followed (the feeds resumed at the snapshot's seqs).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_started_after_traffic_sees_what_its_peer_sees() {
    let sims = event_sims(3).await;
    let workers = workers_toml(&sims);
    let a = proxy(vec![], &format!("{}{workers}", base_toml("[cluster]\nreplica_id = \"a\"\n"))).await;
    until_ready(&a.url).await;
    let chats = run_chats();
    for chat in &chats {
        chat_ok(&a.url, chat).await;
    }
    until_learnt(&a.url, &chats).await;

    let peers = format!("[cluster]\nreplica_id = \"b\"\npeers = [{:?}]\n", a.url);
    let b = proxy(vec![], &format!("{}{workers}", base_toml(&peers))).await;
    let lone = proxy(vec![], &format!("{}{workers}", base_toml(""))).await;
    let (body, ready) = until_ready(&b.url).await;
    assert_eq!(body["bootstrap"]["state"], "complete", "{body}");
    assert_eq!(body["bootstrap"]["source"], a.url.as_str(), "{body}");
    let mut lone_total = 0;
    for chat in &chats {
        let (va, vb) = (debug_with_key(&a.url, chat).await, debug_with_key(&b.url, chat).await);
        assert_eq!(overlaps(&vb), overlaps(&va), "b: {vb}\na: {va}");
        assert_eq!(vb["overlap_sources"], va["overlap_sources"], "sources too");
        lone_total += overlaps(&debug_with_key(&lone.url, chat).await).iter().sum::<u64>();
    }
    assert!(ready.elapsed() < Duration::from_secs(2), "compared within 2 s of ready");
    let a_total: u64 = {
        let mut t = 0;
        for chat in &chats {
            t += overlaps(&debug_with_key(&a.url, chat).await).iter().sum::<u64>();
        }
        t
    };
    assert!(a_total > 0 && lone_total < a_total, "the cold lone router sees less: {lone_total} vs {a_total}");
    let m = metrics_with_key(&b.url).await;
    assert!(metric(&m, "mmrouter_cluster_snapshot_bytes_total", "direction=\"received\"") > 0.0, "{m}");
    assert_eq!(metric(&m, "mmrouter_cluster_bootstrap", "state=\"complete\""), 1.0);

    // After the graft b follows the engines live: a new chat through a shows up on b by events.
    let later = chat_body(&[], &format!("{} {}", unique("later"), "and one more thing ".repeat(20)), false);
    chat_ok(&a.url, &later).await;
    until_learnt(&b.url, std::slice::from_ref(&later)).await;
    assert_eq!(overlaps(&debug_with_key(&b.url, &later).await), overlaps(&debug_with_key(&a.url, &later).await));
}

async fn metrics_with_key(url: &str) -> String {
    client().get(format!("{url}/metrics")).bearer_auth(ADMIN).send().await.unwrap().text().await.unwrap()
}

/// The first replica (or all restarted at once): no peer answers, so it replays each engine's ring
/// from seq 0 before it reports ready — and sees the traffic a lone router sent before it started.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_no_peer_to_ask_a_replica_replays_the_engines_rings() {
    let sims = event_sims(2).await;
    let workers = workers_toml(&sims);
    let first = proxy(vec![], &format!("{}{workers}", base_toml(""))).await;
    let chats = run_chats();
    for chat in &chats {
        chat_ok(&first.url, chat).await;
    }
    until_learnt(&first.url, &chats).await;
    // Its peer is down (a closed port): it does not wait for it.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let cfg = format!("[cluster]\nreplica_id = \"c\"\npeers = [\"http://{closed}\"]\n");
    let started = Instant::now();
    let c = proxy(vec![], &format!("{}{workers}", base_toml(&cfg))).await;
    let (body, _) = until_ready(&c.url).await;
    assert!(started.elapsed() < Duration::from_secs(10), "gave up on the absent peer: {:?}", started.elapsed());
    assert_eq!(
        (body["bootstrap"]["state"].as_str(), body["bootstrap"]["source"].as_str()),
        (Some("complete"), Some("engines"))
    );
    for chat in &chats {
        let (vf, vc) = (debug_with_key(&first.url, chat).await, debug_with_key(&c.url, chat).await);
        assert_eq!(overlaps(&vc), overlaps(&vf), "replayed: {vc}\nlive: {vf}");
    }
}

/// The usual first replica: `[cluster]` without `peers` (NATS only, or nothing yet), in front of
/// engines without a replay ring (vLLM's default). With nobody to ask it reports ready at once, and its
/// held feeds must still be resumed: it follows the engines' events like a lone router (a bootstrap
/// that ran before the feeds existed once left every batch held, so the index never saw an event).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_without_peers_follows_its_engines_events() {
    let sims = sims(2, |o| {
        fast(o);
        o.kv_events = Some("tcp://127.0.0.1:0".into());
    })
    .await;
    let mut workers = String::new();
    for s in &sims {
        let ep = s.kv_events_endpoint().unwrap();
        workers.push_str(&format!("[[workers]]\nname = {:?}\nurl = {:?}\nkv_events = {ep:?}\n", s.name(), s.url()));
    }
    let cfg = Settings::parse(&format!("{}{workers}", base_toml("[cluster]\nreplica_id = \"solo\"\n"))).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    // Served from this task, as `mmrouter serve` serves from its main task: what it spawns goes to
    // idle runtime threads at once (from a worker thread it would wait for the spawner to yield).
    let server = mmrouter::server::serve(cfg, listener, std::future::pending());
    let check = async {
        let (body, _) = until_ready(&url).await;
        assert_eq!(body["bootstrap"]["state"].as_str(), Some("complete"), "{body}");
        let chats = run_chats();
        for chat in &chats {
            chat_ok(&url, chat).await;
        }
        until_learnt(&url, &chats).await;
    };
    tokio::select! {
        res = server => panic!("the server stopped: {res:?}"),
        () = check => {}
    }
}

/// The snapshot is admin data: refused without the admin key when keys are set, streamed with it;
/// a router without `[cluster]` serves none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_snapshot_endpoint_needs_the_admin_key() {
    let sims = event_sims(1).await;
    let workers = workers_toml(&sims);
    let r = proxy(vec![], &format!("{}{workers}", base_toml("[cluster]\nreplica_id = \"s\"\n"))).await;
    until_ready(&r.url).await;
    let url = format!("{}/admin/cluster/snapshot", r.url);
    let resp = client().get(&url).send().await.unwrap();
    assert_eq!(resp.status(), 401);
    let resp = client().get(&url).bearer_auth("wrong").send().await.unwrap();
    assert_eq!(resp.status(), 401);
    let resp = client().get(&url).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "content-type"), "application/x-mmrouter-snapshot");
    let bytes = resp.bytes().await.unwrap();
    assert!(bytes.len() > 5 && bytes[4] == 1, "starts with the head frame");
    let lone = proxy(vec![], &format!("{}{workers}", base_toml(""))).await;
    let resp = client().get(format!("{}/admin/cluster/snapshot", lone.url)).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(resp.status(), 404);
}

// ---------------------------------------------------------------------------------------------
// Over a real NATS, replicas as processes (kill -9 needs one).

/// `nats-server` on 127.0.0.1:`port` (installed from Debian's package when missing).
fn nats_server(port: u16) -> Child {
    nats_server_with(port, &["-a", "127.0.0.1", "-p", &port.to_string()])
}

/// `nats-server` with these arguments, once it listens on `port`.
pub(crate) fn nats_server_with(port: u16, args: &[&str]) -> Child {
    let bin = ["nats-server", "/usr/bin/nats-server", "/usr/sbin/nats-server"]
        .into_iter()
        .find(|b| Command::new(b).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok())
        .map(str::to_owned)
        .unwrap_or_else(install_nats_server);
    let child =
        Command::new(bin).args(args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("nats-server starts");
    let end = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < end, "nats-server never listened on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

fn install_nats_server() -> String {
    let ok = Command::new("sh")
        .args(["-c", "apt-get install -y -qq nats-server >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq nats-server)"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "nats-server is not installed and `apt-get install nats-server` failed");
    "nats-server".into()
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A replica process; its config in a temp dir kept alive with it.
struct Replica {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn replica(id: &str, nats_port: u16, workers: &str) -> Replica {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mmrouter.toml");
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nhealth_interval_ms = 0\n\
         [cluster]\nreplica_id = {id:?}\nnats_url = \"nats://127.0.0.1:{nats_port}\"\nheartbeat_ms = 250\nbooking_ttl_ms = 1500\n\
         {workers}"
    );
    std::fs::write(&path, toml).unwrap();
    let (child, addr, _log) = spawn_serve(&path);
    Replica { child, url: format!("http://{addr}"), _dir: dir }
}

pub(crate) async fn metrics_of(url: &str) -> String {
    client().get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap()
}

pub(crate) async fn until_metric(url: &str, name: &str, labels: &str, what: &str, f: impl Fn(f64) -> bool) -> Duration {
    let start = Instant::now();
    loop {
        let v = metric(&metrics_of(url).await, name, labels);
        if f(v) {
            return start.elapsed();
        }
        assert!(start.elapsed() < Duration::from_secs(15), "{url}: never {what} ({name}{{{labels}}} = {v})");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Workers without KV events (approximate mode): what one replica dispatched is in the other's index
/// as it would be in its own, and its in-flight requests are the other's remote load until they end.
/// A replica killed with requests in flight fails only those; its bookings expire from the other's
/// load within `booking_ttl_ms`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_share_dispatches_and_load_and_a_killed_ones_bookings_expire() {
    let port = free_port();
    let mut nats = nats_server(port);
    let sims = sims(2, |o| {
        fast(o);
        o.ttft_base_ms = 1500; // requests stay in flight long enough to be seen
    })
    .await;
    let workers = workers_toml(&sims);
    let r1 = replica("r1", port, &workers);
    let r2 = replica("r2", port, &workers);
    for r in [&r1, &r2] {
        until_ready(&r.url).await;
        until_metric(&r.url, "mmrouter_cluster_nats_connected", "", "connected to NATS", |v| v == 1.0).await;
    }
    // A prompt r1 routed: r2 predicts it on the same worker, from r1's approximate entries.
    let body = chat_body(&[], &format!("{} {}", unique("shared"), "a long shared question ".repeat(30)), false);
    chat_ok(&r1.url, &body).await;
    let chosen = sims.iter().position(|s| s.stats().requests > 0).expect("one sim served it");
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let v = kv_debug(&r2.url, &body).await;
        if v["overlap_sources"][chosen]["approximate"].as_u64().unwrap_or(0) >= 4 {
            assert_eq!(v["candidates"][0], sims[chosen].name(), "{v}");
            break;
        }
        assert!(Instant::now() < end, "r2 never learnt r1's dispatch: {v}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    // Four slow requests through r1: r2 holds them as remote load, then lets them go.
    let flights: Vec<_> = (0..4).map(|i| tokio::spawn(post_quiet(r1.url.clone(), format!("slow {i}")))).collect();
    until_metric(&r2.url, "mmrouter_cluster_remote_bookings", "", "saw r1's 4 bookings", |v| v == 4.0).await;
    let v = kv_debug(&r2.url, &body).await;
    let remote: u64 = v["inflight"].as_array().unwrap().iter().map(|w| w["remote"]["requests"].as_u64().unwrap()).sum();
    let local: u64 = v["inflight"].as_array().unwrap().iter().map(|w| w["local"]["requests"].as_u64().unwrap()).sum();
    assert_eq!((remote, local), (4, 0), "r2 weighs r1's requests as remote load: {v}");
    // Each booking's delay from r1's send to r2's apply is measured (one host, one clock).
    let text = metrics_of(&r2.url).await;
    let (delays, total) = (
        metric(&text, "mmrouter_cluster_booking_delay_seconds_count", ""),
        metric(&text, "mmrouter_cluster_booking_delay_seconds_sum", ""),
    );
    assert!(delays >= 4.0 && total < delays, "booking delays: {delays} measured, {total} s in all");
    for f in flights {
        assert!(f.await.unwrap(), "a slow request succeeded");
    }
    until_metric(&r2.url, "mmrouter_cluster_remote_bookings", "", "released them", |v| v == 0.0).await;

    // kill -9 of r1 with four requests in flight: those fail, r2's bookings of r1 expire.
    let flights: Vec<_> = (0..4).map(|i| tokio::spawn(post_quiet(r1.url.clone(), format!("doomed {i}")))).collect();
    until_metric(&r2.url, "mmrouter_cluster_remote_bookings", "", "saw the doomed bookings", |v| v == 4.0).await;
    let mut r1 = r1;
    r1.child.kill().unwrap(); // SIGKILL
    let took =
        until_metric(&r2.url, "mmrouter_cluster_remote_bookings", "", "expired r1's bookings", |v| v == 0.0).await;
    assert!(took < Duration::from_millis(1500 + 1000), "expired within booking_ttl_ms + a heartbeat: {took:?}");
    assert!(metric(&metrics_of(&r2.url).await, "mmrouter_cluster_bookings_total", "event=\"expired\"") >= 4.0);
    for f in flights {
        assert!(!f.await.unwrap(), "a request in flight on the killed replica fails");
    }
    chat_ok(&r2.url, &chat_body(&[], "still serving", false)).await;
    let _ = nats.kill();
    let _ = nats.wait();
}

/// `true` when the request succeeded.
async fn post_quiet(url: String, text: String) -> bool {
    match client()
        .post(format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(chat_body(&[], &text, false))
        .send()
        .await
    {
        Ok(r) => r.status().is_success() && r.bytes().await.is_ok(),
        Err(_) => false,
    }
}

async fn kv_debug(url: &str, body: &[u8]) -> Value {
    debug_route(url, "", body, None).await
}

/// NATS killed and restarted while both replicas serve: not one request fails; each replica counts
/// the disconnection and reconnects; bookings flow again afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_nats_restart_under_load_fails_no_request() {
    let port = free_port();
    let mut nats = nats_server(port);
    let sims = sims(2, |o| {
        fast(o);
        o.ttft_base_ms = 20;
    })
    .await;
    let workers = workers_toml(&sims);
    let (r1, r2) = (replica("n1", port, &workers), replica("n2", port, &workers));
    for r in [&r1, &r2] {
        until_ready(&r.url).await;
        until_metric(&r.url, "mmrouter_cluster_nats_connected", "", "connected", |v| v == 1.0).await;
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load: Vec<_> = [r1.url.clone(), r2.url.clone()]
        .into_iter()
        .map(|url| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let (mut ok, mut failed) = (0u32, 0u32);
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    i += 1;
                    if post_quiet(url.clone(), format!("load {i}")).await {
                        ok += 1
                    } else {
                        failed += 1
                    }
                }
                (ok, failed)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = nats.kill();
    let _ = nats.wait();
    for r in [&r1, &r2] {
        until_metric(&r.url, "mmrouter_cluster_nats_connected", "", "noticed NATS down", |v| v == 0.0).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut nats = nats_server(port);
    for r in [&r1, &r2] {
        until_metric(&r.url, "mmrouter_cluster_nats_connected", "", "reconnected", |v| v == 1.0).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for l in load {
        let (ok, failed) = l.await.unwrap();
        assert!(ok > 10, "load ran: {ok}");
        assert_eq!(failed, 0, "no request failed across the NATS restart");
    }
    for r in [&r1, &r2] {
        let m = metrics_of(&r.url).await;
        assert!(metric(&m, "mmrouter_cluster_nats_events_total", "event=\"disconnected\"") >= 1.0, "{m}");
        assert!(metric(&m, "mmrouter_cluster_nats_events_total", "event=\"connected\"") >= 2.0, "{m}");
    }
    // Bookings flow again: a slow request through r1 is r2's remote load.
    let applied = metric(&metrics_of(&r2.url).await, "mmrouter_cluster_bookings_total", "event=\"applied\"");
    chat_ok(&r1.url, &chat_body(&[], "after the restart", false)).await;
    until_metric(&r2.url, "mmrouter_cluster_bookings_total", "event=\"applied\"", "applied a new booking", |v| {
        v > applied
    })
    .await;
    let _ = nats.kill();
    let _ = nats.wait();
}
