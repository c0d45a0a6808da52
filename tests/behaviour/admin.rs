//! The admin API: workers added, drained and removed while requests flow, none of them failing.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::harness::*;

fn chat(i: u64) -> Vec<u8> {
    let text = format!("Request {i}: summarise the history of the printing press in three sentences.");
    serde_json::to_vec(
        &serde_json::json!({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": text}]}),
    )
    .unwrap()
}

async fn admin(method: reqwest::Method, url: String, body: Option<serde_json::Value>) -> (u16, serde_json::Value) {
    let mut req = client().request(method, url);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or_default())
}

fn names(list: &serde_json::Value) -> Vec<String> {
    list["pools"][0]["workers"].as_array().unwrap().iter().map(|w| w["name"].as_str().unwrap().to_owned()).collect()
}

/// Closed-loop clients until `stop`; counts answers that are not 200.
fn load(
    url: &str,
    stop: &Arc<AtomicBool>,
    sent: &Arc<AtomicU64>,
    failed: &Arc<AtomicU64>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..4)
        .map(|_| {
            let (url, stop, sent, failed) = (url.to_owned(), stop.clone(), sent.clone(), failed.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let i = sent.fetch_add(1, Ordering::Relaxed);
                    let r = post(&url, chat(i)).await;
                    if r.status() != 200 || r.bytes().await.is_err() {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect()
}

async fn until(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..400 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_are_added_drained_and_removed_under_load_without_a_failed_request() {
    let mut all = sims(3, fast).await;
    let extra = all.pop().unwrap();
    let c = cluster_with(all, "[routing]\npolicy = \"round_robin\"").await;
    let (stop, sent, failed) =
        (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let clients = load(&c.url, &stop, &sent, &failed);
    until("traffic", || sent.load(Ordering::Relaxed) > 20).await;

    // Add: the new worker takes traffic.
    let body = serde_json::json!({"name": extra.name(), "url": extra.url()});
    let (status, _) =
        admin(reqwest::Method::POST, format!("{}/admin/pools/{}/workers", c.url, c.state.pools()[0].name), Some(body))
            .await;
    assert_eq!(status, 201);
    until("the added worker to serve", || extra.stats().requests > 5).await;

    // Drain: no new request reaches it (at most those in flight when it was drained).
    let drained = c.sims[0].name().to_owned();
    let (status, _) = admin(reqwest::Method::POST, format!("{}/admin/workers/{drained}/drain", c.url), None).await;
    assert_eq!(status, 202);
    let at_drain = c.sims[0].stats().requests;
    let before = sent.load(Ordering::Relaxed);
    until("more traffic", || sent.load(Ordering::Relaxed) > before + 40).await;
    assert!(c.sims[0].stats().requests <= at_drain + 4, "a drained worker got new requests");

    // Remove: it leaves the list once idle, and takes nothing more.
    let removed = c.sims[1].name().to_owned();
    let (status, _) = admin(reqwest::Method::DELETE, format!("{}/admin/workers/{removed}", c.url), None).await;
    assert_eq!(status, 202);
    let state = c.state.clone();
    until("the removal", || state.pools()[0].router.find(&removed).is_none()).await;
    let at_removal = c.sims[1].stats().requests;
    let before = sent.load(Ordering::Relaxed);
    until("more traffic", || sent.load(Ordering::Relaxed) > before + 40).await;
    assert_eq!(c.sims[1].stats().requests, at_removal, "a removed worker got requests");

    stop.store(true, Ordering::Relaxed);
    for h in clients {
        h.await.unwrap();
    }
    assert_eq!(failed.load(Ordering::Relaxed), 0, "of {} requests", sent.load(Ordering::Relaxed));
    let (_, list) = admin(reqwest::Method::GET, format!("{}/admin/workers", c.url), None).await;
    let listed = names(&list);
    assert!(
        listed.contains(&extra.name().to_owned()) && listed.contains(&drained) && !listed.contains(&removed),
        "{list}"
    );
    let w0 = list["pools"][0]["workers"].as_array().unwrap().iter().find(|w| w["name"] == drained.as_str()).unwrap();
    assert_eq!(w0["draining"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_mistakes_get_clear_errors_and_admin_keys_guard_it() {
    let c = cluster_with(sims(1, fast).await, "[auth]\nadmin_keys = [\"sekrit\"]").await;
    let list = format!("{}/admin/workers", c.url);
    assert_eq!(client().get(&list).send().await.unwrap().status(), 401);
    let with_key = |req: reqwest::RequestBuilder| req.bearer_auth("sekrit");
    assert_eq!(with_key(client().get(&list)).send().await.unwrap().status(), 200);
    let pool = &c.state.pools()[0].name;
    for (url, body, status) in [
        (
            format!("{}/admin/pools/nope/workers", c.url),
            serde_json::json!({"name": "x", "url": "http://127.0.0.1:9"}),
            404,
        ),
        (
            format!("{}/admin/pools/{pool}/workers", c.url),
            serde_json::json!({"name": c.sims[0].name(), "url": "http://127.0.0.1:9"}),
            409,
        ),
        (
            format!("{}/admin/pools/{pool}/workers", c.url),
            serde_json::json!({"name": "x", "url": "ftp://nowhere"}),
            400,
        ),
    ] {
        let r = with_key(client().post(&url)).json(&body).send().await.unwrap();
        assert_eq!(r.status().as_u16(), status, "{url} {body}");
        let err: serde_json::Value = r.json().await.unwrap();
        assert!(err["error"]["message"].is_string(), "{err}");
    }
    let r = with_key(client().post(format!("{}/admin/workers/nope/drain", c.url))).send().await.unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_workers_are_validated_like_the_config_file() {
    let c = cluster_with(sims(1, fast).await, "").await;
    let add = format!("{}/admin/pools/{}/workers", c.url, c.state.pools()[0].name);
    let long = "w".repeat(129);
    for (body, key) in [
        (serde_json::json!({"name": "", "url": "http://127.0.0.1:9"}), "worker.name"),
        (serde_json::json!({"name": "  ", "url": "http://127.0.0.1:9"}), "worker.name"),
        (serde_json::json!({"name": long, "url": "http://127.0.0.1:9"}), "worker.name"),
        (serde_json::json!({"name": "a\u{1}b", "url": "http://127.0.0.1:9"}), "worker.name"),
        (serde_json::json!({"name": "x", "url": "not a url"}), "worker.url"),
        (serde_json::json!({"name": "x", "url": "http://127.0.0.1:9", "kv_events": "http://x"}), "worker.kv_events"),
        (serde_json::json!({"name": "x", "url": "http://127.0.0.1:9", "bogus": 1}), "bogus"),
        (serde_json::json!({"url": "http://127.0.0.1:9"}), "name"),
    ] {
        let (status, err) = admin(reqwest::Method::POST, add.clone(), Some(body.clone())).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(err["error"]["code"], "invalid_worker", "{err}");
        assert!(err["error"]["message"].as_str().unwrap().contains(key), "{body}: {err}");
    }
    let (_, list) = admin(reqwest::Method::GET, format!("{}/admin/workers", c.url), None).await;
    assert_eq!(names(&list), [c.sims[0].name()], "nothing was added");
}

/// Issue 20: slots and metric series of removed workers were kept forever (1 022 cycles exhausted the
/// 1024 slots). 10 000 add/remove cycles over HTTP, four clients at once (each its own connection):
/// adds keep working, the pool lists its two workers, and `/metrics` returns to its size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_remove_cycles_reuse_slots_and_release_metric_series() {
    let c = cluster_with(sims(2, fast).await, "[server]\nhealth_interval_ms = 0").await;
    assert_eq!(post(&c.url, chat(0)).await.status(), 200);
    let start = metrics_text(&c.url).await;
    let add = format!("{}/admin/pools/{}/workers", c.url, c.state.pools()[0].name);
    let t = std::time::Instant::now();
    const CYCLES: usize = 10_000;
    const LANES: usize = 4;
    let lanes = (0..LANES).map(|lane| {
        let (add, url) = (add.clone(), c.url.clone());
        tokio::spawn(async move {
            let http = client();
            for i in (lane..CYCLES).step_by(LANES) {
                let name = format!("cycle-{i}");
                let new = serde_json::json!({"name": name, "url": "http://127.0.0.1:9"});
                let r = http.post(&add).json(&new).send().await.unwrap();
                assert_eq!(r.status(), 201, "cycle {i}: {}", r.text().await.unwrap());
                if i % 1000 == 0 {
                    // Series appear for the live worker, and go with it.
                    assert!(metrics_text(&url).await.contains(&format!("worker=\"{name}\"")));
                }
                let r = http.delete(format!("{url}/admin/workers/{name}")).send().await.unwrap();
                assert_eq!(r.status(), 202, "cycle {i}");
            }
        })
    });
    for lane in lanes.collect::<Vec<_>>() {
        lane.await.unwrap();
    }
    let per_sec = CYCLES as f64 / t.elapsed().as_secs_f64();
    let router = &c.state.pools()[0].router;
    until("the removals", || router.live_workers().len() == 2).await;
    assert!(router.workers().len() < 64, "{} slots for 2 live workers", router.workers().len());
    let end = metrics_text(&c.url).await;
    assert!(!end.contains("worker=\"cycle-"), "a removed worker's series survived");
    let lines = |t: &str| t.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).count();
    // The admin calls' own requests add no series; a removed worker leaves nothing behind.
    assert_eq!(lines(&end), lines(&start), "series before/after {CYCLES} cycles");
    eprintln!(
        "{CYCLES} admin cycles at {per_sec:.0}/s; /metrics {} -> {} bytes, {} slots",
        start.len(),
        end.len(),
        router.workers().len()
    );
    assert_eq!(post(&c.url, chat(1)).await.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_not_ok_when_no_worker_can_take_a_request() {
    let c = cluster_with(sims(2, fast).await, "[server]\nhealth_interval_ms = 0").await;
    let health = || async {
        let r = client().get(format!("{}/health", c.url)).send().await.unwrap();
        (r.status().as_u16(), r.json::<serde_json::Value>().await.unwrap())
    };
    let (status, body) = health().await;
    assert_eq!((status, body["status"].as_str()), (200, Some("ok")), "{body}");
    for s in &c.sims {
        let (status, _) =
            admin(reqwest::Method::POST, format!("{}/admin/workers/{}/drain", c.url, s.name()), None).await;
        assert_eq!(status, 202);
    }
    let (status, body) = health().await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["status"], "unavailable");
    assert_eq!(body["pools"][0]["status"], "unavailable");
    assert_eq!(body["pools"][0]["draining"], 2);
    assert_eq!(body["healthy_workers"], serde_json::json!([]));
    let r = post(&c.url, chat(0)).await;
    assert_eq!(r.status(), 503, "chats agree with /health");
}

fn message(err: &serde_json::Value) -> &str {
    err["error"]["message"].as_str().unwrap_or_default()
}

/// Issue 47: workers have roles. The list shows them; a worker added with a role is checked by the
/// file's rules; a change that would leave a disaggregated pool without one of its legs is refused
/// (409, naming the pool) unless forced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_are_listed_and_a_disaggregated_pool_keeps_both_legs() {
    let s = sims(3, fast).await;
    let worker =
        |name: &str, url: &str, role: &str| format!("[[workers]]\nname = {name:?}\nurl = {url:?}\nrole = \"{role}\"\n");
    let toml = format!(
        "[server]\nhealth_interval_ms = 0\n{}{}",
        worker("p0", &s[0].url(), "prefill"),
        worker("d0", &s[1].url(), "decode")
    );
    let spare = s[2].url();
    let c = proxy(s, &toml).await;
    let pool = c.state.pools()[0].name.clone();
    let (add, at) = (format!("{}/admin/pools/{pool}/workers", c.url), |w: &str| format!("{}/admin/workers/{w}", c.url));
    let roles = || async {
        let (_, list) = admin(reqwest::Method::GET, format!("{}/admin/workers", c.url), None).await;
        let workers = list["pools"][0]["workers"].as_array().unwrap().clone();
        workers
            .iter()
            .map(|w| (w["name"].as_str().unwrap().to_owned(), w["role"].as_str().unwrap().to_owned()))
            .collect::<Vec<_>>()
    };
    let pairs = |v: &[(&str, &str)]| v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect::<Vec<_>>();
    assert_eq!(roles().await, pairs(&[("p0", "prefill"), ("d0", "decode")]));

    // The last decode worker can be neither drained nor removed; the pool is untouched.
    for (method, url) in [(reqwest::Method::POST, format!("{}/drain", at("d0"))), (reqwest::Method::DELETE, at("d0"))] {
        let (status, err) = admin(method, url.clone(), None).await;
        assert_eq!(status, 409, "{url}: {err}");
        assert!(message(&err).contains(&format!("pool '{pool}' has prefill workers but no decode worker")), "{err}");
    }
    let (status, err) = admin(reqwest::Method::POST, format!("{}/drain", at("p0")), None).await;
    assert_eq!(status, 409);
    assert!(message(&err).contains("has decode workers but no prefill worker"), "{err}");
    assert_eq!(roles().await, pairs(&[("p0", "prefill"), ("d0", "decode")]));

    // Per-worker rules (400, naming the key) and pool rules (409) for added workers.
    for (body, status, needle) in [
        (serde_json::json!({"name": "x", "url": spare, "role": "prefil"}), 400, "role: 'prefil' is not"),
        (
            serde_json::json!({"name": "x", "url": spare, "role": "prefill", "engine": "sglang"}),
            400,
            "worker.bootstrap_port is required",
        ),
        (
            serde_json::json!({"name": "x", "url": spare, "role": "decode", "bootstrap_port": 8998}),
            400,
            "worker.bootstrap_port is only for",
        ),
        (
            serde_json::json!({"name": "x", "url": spare, "role": "encode", "engine": "sglang"}),
            400,
            "SGLang E/PD is not supported",
        ),
        (serde_json::json!({"name": "x", "url": spare, "role": "decode", "engine": "sglang"}), 409, "mixes engines"),
    ] {
        let (got, err) = admin(reqwest::Method::POST, add.clone(), Some(body.clone())).await;
        assert_eq!(got, status, "{body}: {err}");
        assert!(message(&err).contains(needle), "{body}: {err}");
    }

    // A second decode worker: now the first may go, and the new one is listed with its role.
    let (status, added) = admin(
        reqwest::Method::POST,
        add.clone(),
        Some(serde_json::json!({"name": "d1", "url": spare, "role": "decode"})),
    )
    .await;
    assert_eq!(status, 201, "{added}");
    assert!(added["workers"].as_array().unwrap().iter().any(|w| w["name"] == "d1" && w["role"] == "decode"), "{added}");
    assert_eq!(admin(reqwest::Method::DELETE, at("d0"), None).await.0, 202);
    let state = c.state.clone();
    until("d0's removal", || state.pools()[0].router.find("d0").is_none()).await;
    assert_eq!(roles().await, pairs(&[("p0", "prefill"), ("d1", "decode")]));

    // Forced: the operator takes the pool's last decode worker out on purpose.
    assert_eq!(admin(reqwest::Method::POST, format!("{}/drain?force=true", at("d1")), None).await.0, 202);
    assert!(state.pools()[0].router.lookup("d1").is_some_and(|(_, w)| w.is_draining()));
}
