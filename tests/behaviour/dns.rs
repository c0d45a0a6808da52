//! Workers from DNS against a real `dnsmasq` on 127.0.0.1 (installed from Debian's `dnsmasq-base` when
//! missing): records added become workers that take traffic, with their KV-event discovery; removed
//! records drain their workers (requests in flight finish) and remove them; a nameserver that stops
//! answering changes nothing.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use mmrouter_sim::SimHandle;

use crate::harness::*;

/// `dnsmasq` serving only the records of `conf` on 127.0.0.1:`port`.
struct Dnsmasq {
    child: Option<Child>,
    port: u16,
    conf: PathBuf,
}

impl Dnsmasq {
    fn start(dir: &Path, records: &str) -> Dnsmasq {
        let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut d = Dnsmasq { child: None, port, conf: dir.join("dnsmasq.conf") };
        d.restart(records);
        d
    }

    /// Serves `records` (dnsmasq reads SRV records only at start: a restart on the same port).
    fn restart(&mut self, records: &str) {
        self.stop();
        // `local=/test/`: names under .test are answered from these records alone (NXDOMAIN otherwise).
        std::fs::write(&self.conf, format!("local=/test/\n{records}")).unwrap();
        let args = [
            "--no-daemon",
            "--no-resolv",
            "--no-hosts",
            "--bind-interfaces",
            "--listen-address=127.0.0.1",
            "--pid-file=",
            "--user=root",
            &format!("--port={}", self.port),
            &format!("--conf-file={}", self.conf.display()),
        ];
        let child = Command::new(dnsmasq()).args(args).stdout(Stdio::null()).stderr(Stdio::null()).spawn();
        self.child = Some(child.expect("dnsmasq starts"));
        // It answers within milliseconds; the router retries failed resolutions each interval anyway.
        std::thread::sleep(Duration::from_millis(200));
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        self.stop();
    }
}

fn dnsmasq() -> String {
    let found = ["dnsmasq", "/usr/sbin/dnsmasq"]
        .into_iter()
        .find(|b| Command::new(b).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok());
    if let Some(b) = found {
        return b.to_owned();
    }
    let ok = Command::new("sh")
        .args([
            "-c",
            "apt-get install -y -qq dnsmasq-base >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq dnsmasq-base)",
        ])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "dnsmasq is not installed and `apt-get install dnsmasq-base` failed");
    "/usr/sbin/dnsmasq".into()
}

fn port_of(sim: &SimHandle) -> u16 {
    sim.url().rsplit(':').next().unwrap().trim_end_matches('/').parse().unwrap()
}

/// SRV records of `_http._tcp.sims.test`, one per sim, all on host `sims-host.test` (127.0.0.1).
fn srv_records(sims: &[&SimHandle]) -> String {
    let mut out = String::from("host-record=sims-host.test,127.0.0.1\n");
    for s in sims {
        out.push_str(&format!("srv-host=_http._tcp.sims.test,sims-host.test,{}\n", port_of(s)));
    }
    out
}

fn worker_name(entry: &str, sim: &SimHandle) -> String {
    format!("{entry}@127.0.0.1:{}", port_of(sim))
}

/// The pool's workers in rotation, by name, sorted.
fn in_rotation(c: &Cluster) -> Vec<String> {
    let pool = c.state.pools()[0].clone();
    let mut names: Vec<String> =
        pool.router.live_workers().iter().filter(|(_, w)| w.in_rotation()).map(|(_, w)| w.name().to_owned()).collect();
    names.sort();
    names
}

async fn until(what: &str, secs: u64, cond: impl Fn() -> bool) {
    let end = std::time::Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(std::time::Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn chat(text: &str, max_tokens: u32) -> Vec<u8> {
    let body =
        serde_json::json!({"model": "m", "max_tokens": max_tokens, "messages": [{"role": "user", "content": text}]});
    serde_json::to_vec(&body).unwrap()
}

fn config(port: u16, entry: &str) -> String {
    format!(
        "[server]\nhealth_interval_ms = 0\n[routing]\npolicy = \"round_robin\"\n\
         [discovery]\ninterval_ms = 150\ntimeout_ms = 1000\nnameserver = \"127.0.0.1:{port}\"\n{entry}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn srv_records_added_become_workers_and_removed_ones_drain() {
    let dir = tempfile::tempdir().unwrap();
    let sims = sims(3, |o| {
        fast(o);
        o.decode_ms_per_token = 20;
        o.kv_events = Some("tcp://127.0.0.1:0".into());
    })
    .await;
    let mut dns = Dnsmasq::start(dir.path(), &srv_records(&[&sims[0], &sims[1]]));
    let entry = "[[workers]]\nname = \"sims\"\ndns_srv = \"_http._tcp.sims.test\"\nkv_events = \"discover\"\n";
    let c = proxy(Vec::new(), &config(dns.port, entry)).await;
    let names = |s: &[&SimHandle]| {
        let mut n: Vec<String> = s.iter().map(|s| worker_name("sims", s)).collect();
        n.sort();
        n
    };

    // The records' sims are the workers, and take traffic; each one's KV events were discovered.
    let want = names(&[&sims[0], &sims[1]]);
    until("the first two workers", 10, || in_rotation(&c) == want).await;
    for i in 0..4 {
        assert_eq!(post(&c.url, chat(&format!("first {i}"), 2)).await.status(), 200);
    }
    assert!(sims[0].stats().requests > 0 && sims[1].stats().requests > 0);
    until("event subscriptions", 10, || sims[..2].iter().all(|s| s.kv_event_subscriptions() >= 1)).await;

    // A record added: a third worker.
    dns.restart(&srv_records(&[&sims[0], &sims[1], &sims[2]]));
    let want = names(&[&sims[0], &sims[1], &sims[2]]);
    until("the third worker", 10, || in_rotation(&c) == want).await;
    for i in 0..6 {
        assert_eq!(post(&c.url, chat(&format!("second {i}"), 2)).await.status(), 200);
    }
    assert!(sims[2].stats().requests > 0, "the added worker took no traffic");

    // A record removed while its worker answers: that request finishes, then the worker goes.
    let long: Vec<_> = (0..3)
        .map(|i| {
            let url = c.url.clone();
            tokio::spawn(async move {
                let r = post(&url, chat(&format!("long {i}"), 60)).await;
                (r.status().as_u16(), r.bytes().await.is_ok())
            })
        })
        .collect();
    until("a long request on sim 0", 10, || sims[0].stats().in_flight > 0).await;
    dns.restart(&srv_records(&[&sims[1], &sims[2]]));
    let gone = worker_name("sims", &sims[0]);
    let pool = c.state.pools()[0].clone();
    until("sim 0's worker to drain", 10, || pool.router.lookup(&gone).is_some_and(|(_, w)| w.is_draining())).await;
    assert!(sims[0].stats().in_flight > 0, "the drain waited for nothing: the request ended first");
    for h in long {
        assert_eq!(h.await.unwrap(), (200, true), "a request in flight on a drained worker was cut");
    }
    until("sim 0's worker to be removed", 10, || pool.router.lookup(&gone).is_none()).await;
    let at_removal = sims[0].stats().requests;
    for i in 0..4 {
        assert_eq!(post(&c.url, chat(&format!("third {i}"), 2)).await.status(), 200);
    }
    assert_eq!(sims[0].stats().requests, at_removal, "a removed worker got requests");

    // The nameserver stops answering: the workers stay.
    let want = names(&[&sims[1], &sims[2]]);
    assert_eq!(in_rotation(&c), want);
    dns.stop();
    let page = format!("{}/metrics", c.url);
    let failed = || async {
        metric(
            &client().get(&page).send().await.unwrap().text().await.unwrap(),
            "mmrouter_dns_resolutions_total",
            "entry=\"qwen3-vl/sims\",outcome=\"failed\"",
        )
    };
    let before = failed().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(failed().await > before, "no failed resolution counted while dnsmasq was down");
    assert_eq!(in_rotation(&c), want, "a resolver outage changed the workers");
    let text = client().get(&page).send().await.unwrap().text().await.unwrap();
    assert_eq!(metric(&text, "mmrouter_dns_workers", "entry=\"qwen3-vl/sims\""), 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_a_record_is_a_worker_on_the_entry_port_until_the_name_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let sims = sims(1, fast).await;
    let mut dns = Dnsmasq::start(dir.path(), "host-record=one.test,127.0.0.1\n");
    let entry = format!("[[workers]]\nname = \"one\"\ndns = \"one.test\"\nport = {}\n", port_of(&sims[0]));
    let c = proxy(Vec::new(), &config(dns.port, &entry)).await;
    let name = worker_name("one", &sims[0]);
    until("the worker", 10, || in_rotation(&c) == [name.clone()]).await;
    assert_eq!(post(&c.url, chat("hello", 2)).await.status(), 200);
    assert_eq!(sims[0].stats().requests, 1);
    // The admin API lists it like any worker.
    let list: serde_json::Value =
        client().get(format!("{}/admin/workers", c.url)).send().await.unwrap().json().await.unwrap();
    assert_eq!(list["pools"][0]["workers"][0]["url"], sims[0].url().trim_end_matches('/'));

    // NXDOMAIN (an authoritative answer): drained once a second resolution agrees, then removed.
    dns.restart("");
    let pool = c.state.pools()[0].clone();
    until("the worker's removal", 10, || pool.router.lookup(&name).is_none()).await;
    let text = client().get(format!("{}/metrics", c.url)).send().await.unwrap().text().await.unwrap();
    assert!(metric(&text, "mmrouter_dns_resolutions_total", "entry=\"qwen3-vl/one\",outcome=\"empty\"") >= 2.0);
    assert_eq!(metric(&text, "mmrouter_dns_workers", "entry=\"qwen3-vl/one\""), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_discovered_workers_and_one_without_the_entry_retires_them() {
    let dir = tempfile::tempdir().unwrap();
    let sims = sims(2, fast).await;
    let dns = Dnsmasq::start(dir.path(), "host-record=one.test,127.0.0.1\n");
    let entry = format!("[[workers]]\nname = \"one\"\ndns = \"one.test\"\nport = {}\n", port_of(&sims[0]));
    let fixed = format!("[[workers]]\nname = \"fixed\"\nurl = {:?}\n", sims[1].url());
    let c = proxy(Vec::new(), &config(dns.port, &format!("{entry}{fixed}"))).await;
    let discovered = worker_name("one", &sims[0]);
    until("both workers", 10, || in_rotation(&c) == ["fixed".to_owned(), discovered.clone()]).await;
    let path = dir.path().join("mmrouter.toml");
    let _ = c.state.pools.config_path.set(path.clone());
    let reload = |text: String| {
        std::fs::write(&path, text).unwrap();
        let url = format!("{}/admin/reload", c.url);
        async move {
            let r = client().post(url).send().await.unwrap();
            (r.status().as_u16(), r.json::<serde_json::Value>().await.unwrap())
        }
    };

    // The same file again: the discovered worker is in no file's worker list, so nothing changes.
    let (status, answer) = reload(config(dns.port, &format!("{entry}{fixed}"))).await;
    assert_eq!(status, 200, "{answer}");
    let applied = &answer["applied"];
    assert!(applied["removed"] == serde_json::json!([]) && applied["added"] == serde_json::json!([]), "{answer}");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(in_rotation(&c), ["fixed".to_owned(), discovered.clone()]);

    // [discovery] is built once: a change is refused, naming it.
    let slower = config(dns.port, &format!("{entry}{fixed}")).replace("interval_ms = 150", "interval_ms = 300");
    let (status, answer) = reload(slower).await;
    assert!(status == 400 && answer.to_string().contains("[discovery] changed"), "{answer}");

    // A file without the entry: its worker is drained and removed at the next resolution.
    assert_eq!(reload(config(dns.port, &fixed)).await.0, 200);
    let pool = c.state.pools()[0].clone();
    until("the discovered worker's removal", 10, || pool.router.lookup(&discovered).is_none()).await;
    assert_eq!(in_rotation(&c), ["fixed".to_owned()]);
}
