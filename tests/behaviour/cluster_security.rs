//! The replicas' NATS channel under attack (issue 45), against a real `nats-server` on 127.0.0.1:
//! each authentication method (token, user and password, NKey, TLS with client certificates) lets
//! the replica in and keeps a stranger out; a rogue client that *is* authenticated cannot move a
//! cached prompt with forged bookings or an index flood; a flood of 1 MiB messages stays bounded in
//! memory.

use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use serde_json::Value;

use crate::cluster::{free_port, metrics_of, nats_server_with, until_metric, until_ready};
use crate::harness::*;

struct Replica {
    child: Child,
    url: String,
    log: std::sync::mpsc::Receiver<String>,
    _dir: tempfile::TempDir,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `nats-server`, stopped when dropped.
struct Nats(Child);

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A replica whose `[cluster]` section ends with `nats` (the URL and its authentication keys).
fn replica(nats: &str, workers: &str) -> Replica {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mmrouter.toml");
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nhealth_interval_ms = 0\n\
         [cluster]\nreplica_id = \"good\"\nheartbeat_ms = 250\nbooking_ttl_ms = 1500\n{nats}\n{workers}"
    );
    std::fs::write(&path, toml).unwrap();
    let (child, addr, log) = spawn_serve(&path);
    Replica { child, url: format!("http://{addr}"), log, _dir: dir }
}

async fn connected(r: &Replica) {
    until_ready(&r.url).await;
    let end = std::time::Instant::now() + Duration::from_secs(15);
    while metric(&metrics_of(&r.url).await, "mmrouter_cluster_nats_connected", "") != 1.0 {
        let log: Vec<String> = r.log.try_iter().collect();
        assert!(std::time::Instant::now() < end, "{}: never connected to NATS; its log:\n{}", r.url, log.join("\n"));
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A client with `opts` does not get a connection.
async fn kept_out(url: &str, opts: async_nats::ConnectOptions, what: &str) {
    let attempt =
        tokio::time::timeout(Duration::from_secs(5), opts.connection_timeout(Duration::from_secs(2)).connect(url));
    if let Ok(Ok(_)) = attempt.await {
        panic!("{what}: a stranger connected to {url}");
    }
}

fn sh(dir: &Path, script: &str) {
    let ok = Command::new("sh").arg("-c").arg(script).current_dir(dir).status().is_ok_and(|s| s.success());
    assert!(ok, "{script}");
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, made with `openssl`.
fn certificates(dir: &Path) {
    let key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    sh(dir, &format!("openssl req -x509 {key} -keyout ca.key -out ca.pem -days 1 -subj /CN=test-ca -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign 2>/dev/null"));
    for (name, ext) in [
        ("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth"),
        ("client", "extendedKeyUsage=clientAuth"),
    ] {
        std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
        sh(dir, &format!("openssl req {key} -keyout {name}.key -out {name}.csr -subj /CN={name} 2>/dev/null"));
        sh(dir, &format!("openssl x509 -req -in {name}.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out {name}.pem -days 1 -extfile {name}.ext 2>/dev/null"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_nats_authentication_lets_the_replica_in_and_keeps_strangers_out() {
    let sims = sims(1, fast).await;
    let workers = format!("[[workers]]\nname = {:?}\nurl = {:?}\n", sims[0].name(), sims[0].url());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();

    // Token: also from a file, the way a Secret is mounted.
    let port = free_port();
    let nats = Nats(nats_server_with(port, &["-a", "127.0.0.1", "-p", &port.to_string(), "--auth", "s3cret-token"]));
    std::fs::write(dir.path().join("token"), "s3cret-token\n").unwrap();
    let r = replica(&format!("nats_url = \"nats://127.0.0.1:{port}\"\nnats_token_file = \"{d}/token\""), &workers);
    connected(&r).await;
    let url = format!("nats://127.0.0.1:{port}");
    kept_out(&url, async_nats::ConnectOptions::new(), "no token").await;
    kept_out(&url, async_nats::ConnectOptions::new().token("guess".into()), "wrong token").await;
    drop(r);
    drop(nats);

    // User and password, written in the URL (honoured, not dropped).
    let port = free_port();
    let nats = Nats(nats_server_with(
        port,
        &["-a", "127.0.0.1", "-p", &port.to_string(), "--user", "router", "--pass", "pw1"],
    ));
    let r = replica(&format!("nats_url = \"nats://router:pw1@127.0.0.1:{port}\""), &workers);
    connected(&r).await;
    let url = format!("nats://127.0.0.1:{port}");
    kept_out(&url, async_nats::ConnectOptions::new(), "no password").await;
    kept_out(
        &url,
        async_nats::ConnectOptions::new().user_and_password("router".into(), "pw2".into()),
        "wrong password",
    )
    .await;
    drop(r);
    drop(nats);

    // NKey: the server knows only the public key; the seed comes from the environment.
    let user = nkeys::KeyPair::new_user();
    let port = free_port();
    let conf = dir.path().join("nkey.conf");
    let users = format!("authorization {{ users = [ {{ nkey: \"{}\" }} ] }}", user.public_key());
    std::fs::write(&conf, format!("listen: 127.0.0.1:{port}\n{users}\n")).unwrap();
    let nats = Nats(nats_server_with(port, &["-c", &conf.to_string_lossy()]));
    std::env::set_var("MMROUTER_TEST_NKEY_SEED", user.seed().unwrap());
    let r = replica(
        &format!("nats_url = \"nats://127.0.0.1:{port}\"\nnats_nkey_seed_env = \"MMROUTER_TEST_NKEY_SEED\""),
        &workers,
    );
    connected(&r).await;
    let url = format!("nats://127.0.0.1:{port}");
    kept_out(&url, async_nats::ConnectOptions::new(), "no nkey").await;
    let other = nkeys::KeyPair::new_user().seed().unwrap();
    kept_out(&url, async_nats::ConnectOptions::new().nkey(other), "another nkey").await;
    drop(r);
    drop(nats);

    // TLS with client certificates (mTLS): the server verifies the replica, the replica the server.
    certificates(dir.path());
    let port = free_port();
    let conf = dir.path().join("tls.conf");
    let tls = format!(
        "tls {{ cert_file: \"{d}/server.pem\", key_file: \"{d}/server.key\", ca_file: \"{d}/ca.pem\", verify: true }}"
    );
    std::fs::write(&conf, format!("listen: 127.0.0.1:{port}\n{tls}\n")).unwrap();
    let nats = Nats(nats_server_with(port, &["-c", &conf.to_string_lossy()]));
    let keys = format!(
        "nats_url = \"tls://127.0.0.1:{port}\"\nnats_tls_ca_file = \"{d}/ca.pem\"\n\
         nats_tls_cert_file = \"{d}/client.pem\"\nnats_tls_key_file = \"{d}/client.key\""
    );
    let r = replica(&keys, &workers);
    connected(&r).await;
    let url = format!("tls://127.0.0.1:{port}");
    kept_out(&format!("nats://127.0.0.1:{port}"), async_nats::ConnectOptions::new(), "no TLS").await;
    let ca_only = async_nats::ConnectOptions::new().add_root_certificates(dir.path().join("ca.pem"));
    kept_out(&url, ca_only, "TLS without a client certificate").await;
    drop(r);
    drop(nats);
}

/// An authenticated client that publishes what a compromised replica could.
async fn rogue(port: u16) -> async_nats::Client {
    async_nats::ConnectOptions::new()
        .token("team-token".into())
        .connect(format!("nats://127.0.0.1:{port}"))
        .await
        .expect("the rogue holds the token")
}

async fn debug(url: &str, body: &[u8]) -> Value {
    debug_route(url, "", body, None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_authenticated_rogue_moves_no_cached_prompt_and_a_flood_stays_bounded() {
    let port = free_port();
    let nats = Nats(nats_server_with(port, &["-a", "127.0.0.1", "-p", &port.to_string(), "--auth", "team-token"]));
    let sims = sims(3, fast).await;
    let workers: String =
        sims.iter().map(|s| format!("[[workers]]\nname = {:?}\nurl = {:?}\n", s.name(), s.url())).collect();
    let r = replica(&format!("nats_url = \"nats://127.0.0.1:{port}\"\nnats_token = \"team-token\""), &workers);
    connected(&r).await;

    // A cached 6 400-token prompt.
    let body = chat_body(&[], &format!("{} {}", unique("cached"), "a long shared question ".repeat(1_600)), false);
    let resp = post(&r.url, body.clone()).await;
    assert!(resp.status().is_success());
    resp.bytes().await.unwrap();
    let before = debug(&r.url, &body).await;
    let (pool, cached) = (before["pool"].as_str().unwrap().to_owned(), before["candidates"][0].clone());
    let cached_name = cached.as_str().unwrap().to_owned();
    let other = sims.iter().map(|s| s.name().to_owned()).find(|n| *n != cached_name).unwrap();

    // Forged bookings: ten with the attack's 4·10⁹ tokens, ten with the most a booking may claim,
    // on the cached worker and another, kept alive by heartbeats; then the index flood.
    let client = rogue(port).await;
    let subject = "mmrouter.replicas".to_owned();
    let send = |v: Value| {
        let (client, subject) = (client.clone(), subject.clone());
        async move { client.publish(subject, serde_json::to_vec(&v).unwrap().into()).await.unwrap() }
    };
    for id in 0..20u64 {
        let w = if id % 2 == 0 { &cached_name } else { &other };
        let p: u64 = if id < 10 { 4_000_000_000 } else { (1 << 24) - 1 };
        send(serde_json::json!({"k":"book","r":"rogue","id":id,"pool":pool,"w":w,"p":p,"d":p,"i":0})).await;
    }
    send(serde_json::json!({"k":"beat","r":"rogue","live":(0..20).collect::<Vec<u64>>()})).await;
    for n in 0..24u64 {
        for len in [51_412u64, 8_192] {
            let b: Vec<u64> = (n * 100_000..n * 100_000 + len).collect();
            send(serde_json::json!({"k":"dispatch","r":"rogue","pool":pool,"w":other,"src":2,"b":b})).await;
        }
    }
    client.flush().await.unwrap();
    let refused = |reason: &'static str| {
        let url = r.url.clone();
        async move {
            until_metric(
                &url,
                "mmrouter_cluster_messages_refused_total",
                &format!("reason=\"{reason}\""),
                reason,
                |v| v > 0.0,
            )
            .await
        }
    };
    refused("implausible_load").await;
    refused("too_many").await;
    refused("quota_keys").await;
    send(serde_json::json!({"k":"beat","r":"rogue","live":(0..20).collect::<Vec<u64>>()})).await;
    let after = debug(&r.url, &body).await;
    assert_eq!(after["candidates"][0], cached, "the rogue moved the cached prompt: {after}");
    assert_eq!(after["overlap_blocks"], before["overlap_blocks"], "the flood evicted the prompt: {after}");

    // 1 500 messages of ~1 MB (record-tagged, so they reach the records queue): memory stays bounded.
    let pid = r.child.id();
    let rss_before = status_kb(pid, "VmRSS:");
    let pad = " ".repeat(1_000_000 - 100);
    let big =
        format!("{{\"k\":\"dispatch\",\"r\":\"rogue\",\"pool\":{pool:?},\"w\":{other:?},\"src\":2,\"b\":[1]{pad}}}");
    let big = bytes::Bytes::from(big);
    for _ in 0..1_500 {
        client.publish(subject.clone(), big.clone()).await.unwrap();
    }
    client.flush().await.unwrap();
    refused("quota_queue").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let peak = status_kb(pid, "VmHWM:");
    let grown_mb = peak.saturating_sub(rss_before) / 1024;
    eprintln!("flood: RSS {} MB before, peak {} MB after", rss_before / 1024, peak / 1024);
    // The bound docs/operations.md documents ("Securing the replicas' channel"): the client's 128-message
    // buffer and the 64 MiB records queue.
    assert!(grown_mb < 256, "a flood of 1 500 x 1 MB grew the replica by {grown_mb} MB");
    let (status, _) = until_ready(&r.url).await;
    assert!(status["status"].is_string());
    let m = metrics_of(&r.url).await;
    assert!(metric(&m, "mmrouter_cluster_messages_refused_total", "reason=\"quota_queue\"") > 0.0);
    drop(nats);
}

/// A field of /proc/<pid>/status, in kB.
fn status_kb(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = text.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}
