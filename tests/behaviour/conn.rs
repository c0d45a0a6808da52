//! The client side through real sockets: hostile and slow clients on loopback, the connection and
//! in-flight caps, drain on shutdown (library and binary), API keys, request ids and the headers a
//! worker receives. Timeouts are configured short (200 ms) and waits are generous: the tests assert
//! what happens, not how fast.

use std::sync::Arc;
use std::time::Duration;

use mmrouter::config::Settings;
use mmrouter::server::AppState;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::harness::*;

/// Long enough for anything that should happen "soon" on a loaded 2-core machine.
const PATIENCE: Duration = Duration::from_secs(15);

fn addr_of(url: &str) -> String {
    url.trim_start_matches("http://").to_owned()
}

/// Reads until the server closes the connection; panics if it stays open past [`PATIENCE`].
async fn read_until_closed(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let read = async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(PATIENCE, read).await.expect("the server should have closed the connection");
    String::from_utf8_lossy(&out).into_owned()
}

async fn raw(url: &str, bytes: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr_of(url)).await.unwrap();
    s.write_all(bytes.as_bytes()).await.unwrap();
    s
}

/// A request head and part of its body: the body never completes.
fn half_sent_post(path: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{{\"model\":"
    )
}

fn page(c: &Cluster) -> String {
    mmrouter::server::metrics_text(&c.state)
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let t0 = std::time::Instant::now();
    while !check() {
        assert!(t0.elapsed() < PATIENCE, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_request_head_is_cut() {
    let c = cluster_with(sims(1, fast).await, "[server]\nheader_read_timeout_ms = 200").await;
    let mut s = raw(&c.url, "GET /health HTTP/1.1\r\nhost: x\r\n").await;
    read_until_closed(&mut s).await;
    eventually("header timeout counted", || {
        metric(&page(&c), "mmrouter_client_timeouts_total", "kind=\"header\"") >= 1.0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_request_body_gets_408_and_the_connection_closes() {
    let c = cluster_with(sims(1, fast).await, "[server]\nbody_read_timeout_ms = 200").await;
    let mut s = raw(&c.url, &half_sent_post("/v1/chat/completions")).await;
    let answer = read_until_closed(&mut s).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"code\":\"body_read_timeout\""), "{answer}");
    assert!(answer.to_ascii_lowercase().contains("connection: close"), "{answer}");
    let p = page(&c);
    assert_eq!(metric(&p, "mmrouter_client_timeouts_total", "kind=\"body\""), 1.0);
    assert_eq!(metric(&p, "mmrouter_requests_total", "route=\"rejected\",status=\"408\""), 1.0);
    assert_eq!(metric(&p, "mmrouter_rejected_total", "reason=\"body_read_timeout\""), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_connection_is_closed() {
    // The idle timer, not hyper's header timer (30 s by default), closes it.
    let c = cluster_with(sims(1, fast).await, "[server]\nidle_timeout_ms = 200").await;
    let mut s = raw(&c.url, "GET /health HTTP/1.1\r\nhost: x\r\n\r\n").await;
    let answer = read_until_closed(&mut s).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    eventually("idle close counted", || metric(&page(&c), "mmrouter_client_timeouts_total", "kind=\"idle\"") >= 1.0)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_closed() {
    // Never sends a byte: hyper has not even seen a request yet; the idle timer closes it.
    let c = cluster_with(sims(1, fast).await, "[server]\nidle_timeout_ms = 200").await;
    let mut s = TcpStream::connect(addr_of(&c.url)).await.unwrap();
    assert_eq!(read_until_closed(&mut s).await, "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_cap_answers_503_with_retry_after() {
    let c = cluster_with(sims(1, fast).await, "[server]\nmax_connections = 2\nshed_retry_after_secs = 3").await;
    let holders =
        [TcpStream::connect(addr_of(&c.url)).await.unwrap(), TcpStream::connect(addr_of(&c.url)).await.unwrap()];
    eventually("two connections open", || metric(&page(&c), "mmrouter_connections_open", "") == 2.0).await;
    let mut third = raw(&c.url, "GET /health HTTP/1.1\r\nhost: x\r\n\r\n").await;
    let answer = read_until_closed(&mut third).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("retry-after: 3"), "{answer}");
    assert!(answer.contains("\"code\":\"overloaded\""), "{answer}");
    assert_eq!(metric(&page(&c), "mmrouter_shed_total", "reason=\"connections\""), 1.0);
    // A freed slot serves again.
    drop(holders);
    let t0 = std::time::Instant::now();
    loop {
        let r = client().get(format!("{}/health", c.url)).send().await;
        if r.is_ok_and(|r| r.status() == 200) {
            break;
        }
        assert!(t0.elapsed() < PATIENCE, "a freed connection slot was never reused");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inflight_cap_sheds_with_503_while_health_and_metrics_answer() {
    let c = cluster_with(sims(1, fast).await, "[server]\nmax_inflight_requests = 1").await;
    // A request whose body never completes holds the only slot.
    let _holder = raw(&c.url, &half_sent_post("/v1/chat/completions")).await;
    eventually("the slow request is in flight", || metric(&page(&c), "mmrouter_inflight_requests", "") == 1.0).await;
    let r = client()
        .post(format!("{}/v1/chat/completions", c.url))
        .header("content-type", "application/json")
        .body(chat_body(&[], "hello", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "overloaded");
    assert_eq!(v["error"]["type"], "server_error");
    let health = client().get(format!("{}/health", c.url)).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let metrics = metrics_text(&c.url).await;
    assert_eq!(metric(&metrics, "mmrouter_shed_total", "reason=\"inflight\""), 1.0);
    assert_eq!(metric(&metrics, "mmrouter_rejected_total", "reason=\"overloaded\""), 1.0);
}

/// A proxy served through the library's serve-with-shutdown future; returns its URL, the trigger and
/// the serve task.
async fn drainable(
    extra: &str,
) -> (String, Arc<AppState>, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let sims = sims(1, fast).await;
    let mut toml = format!("{extra}\n");
    for s in &sims {
        toml.push_str(&format!("[[workers]]\nname = {:?}\nurl = {:?}\n", s.name(), s.url()));
    }
    let cfg = Settings::parse(&toml).unwrap();
    let state = AppState::new(&cfg).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let st = state.clone();
    let task = tokio::spawn(async move {
        let _sims = sims;
        mmrouter::server::serve_state(&cfg, st, listener, async move {
            let _ = rx.await;
        })
        .await;
    });
    (url, state, tx, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_a_half_sent_request_ends_by_the_drain_deadline() {
    let (url, state, stop, task) = drainable("[server]\ndrain_timeout_ms = 300").await;
    let mut half = raw(&url, &half_sent_post("/v1/chat/completions")).await;
    let page = || mmrouter::server::metrics_text(&state);
    eventually("the half-sent request is in flight", || metric(&page(), "mmrouter_inflight_requests", "") == 1.0).await;
    stop.send(()).unwrap();
    tokio::time::timeout(PATIENCE, task).await.expect("serve returns after the drain deadline").unwrap();
    read_until_closed(&mut half).await;
    assert_eq!(metric(&page(), "mmrouter_client_timeouts_total", "kind=\"drain\""), 1.0);
    assert!(TcpStream::connect(addr_of(&url)).await.is_err(), "the listener is closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_says_draining_and_requests_in_flight_finish() {
    let (url, _state, stop, task) = drainable("[server]\ndrain_delay_ms = 4000\ndrain_timeout_ms = 5000").await;
    let health = client().get(format!("{url}/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    // A keep-alive connection that is idle when the drain starts.
    let mut idle = raw(&url, "GET /health HTTP/1.1\r\nhost: x\r\n\r\n").await;
    let mut first = vec![0u8; 4096];
    let mut n = 0;
    while !String::from_utf8_lossy(&first[..n]).ends_with('}') {
        n += tokio::time::timeout(PATIENCE, idle.read(&mut first[n..])).await.unwrap().unwrap();
    }
    assert!(first.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&first[..n]));
    stop.send(()).unwrap();
    // Within the drain delay new connections are still served, and /health says draining.
    let t0 = std::time::Instant::now();
    let health = loop {
        let h = client().get(format!("{url}/health")).send().await.unwrap();
        if h.status() == 503 || t0.elapsed() > PATIENCE {
            break h;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(health.status(), 503);
    assert_eq!(health.headers()["connection"], "close");
    let v: serde_json::Value = health.json().await.unwrap();
    assert_eq!(v["status"], "draining");
    let chat = client()
        .post(format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(chat_body(&[], "still serving?", false))
        .send()
        .await
        .unwrap();
    assert_eq!(chat.status(), 200);
    // The idle connection is closed once the listener closes; the server then ends well before the
    // drain timeout, nothing being in flight.
    assert_eq!(read_until_closed(&mut idle).await, "");
    tokio::time::timeout(PATIENCE, task).await.expect("serve returns once drained").unwrap();
}

/// `mmrouter serve` on an ephemeral port with `server_extra` in `[server]`; its address, and its
/// stderr lines as they come.
fn start_binary(server_extra: &str) -> (std::process::Child, String, std::sync::mpsc::Receiver<String>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mmrouter.toml");
    let cfg = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nhealth_interval_ms = 0\n{server_extra}\n\
         [[workers]]\nname = \"w\"\nurl = \"http://127.0.0.1:9\"\n"
    );
    std::fs::write(&path, cfg).unwrap();
    spawn_serve(&path)
}

/// Sends SIGTERM and waits for the exit (at most [`PATIENCE`]).
fn terminate(mut child: std::process::Child) -> std::process::ExitStatus {
    let killed = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(killed.success());
    let t0 = std::time::Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if t0.elapsed() > PATIENCE {
            let _ = child.kill();
            panic!("mmrouter still running {PATIENCE:?} after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigterm_stops_the_binary_by_the_drain_deadline() {
    use std::io::Write;
    let (child, addr, _lines) = start_binary("drain_timeout_ms = 300");
    let mut half = std::net::TcpStream::connect(&addr).unwrap();
    half.write_all(half_sent_post("/v1/chat/completions").as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let status = terminate(child);
    assert!(status.success(), "{status:?}");
}

#[test]
fn json_access_log_has_one_line_per_request() {
    use std::io::{Read, Write};
    let (child, addr, lines) = start_binary("log_format = \"json\"");
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nx-request-id: log-me-1\r\nconnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.contains("x-request-id: log-me-1"), "{answer}");
    assert!(terminate(child).success());
    let logged: Vec<serde_json::Value> = lines.try_iter().map(|l| serde_json::from_str(&l).unwrap()).collect();
    let access: Vec<_> = logged.iter().filter(|v| v["target"] == "mmrouter::access").collect();
    assert_eq!(access.len(), 1, "{logged:?}");
    let line = access[0];
    assert_eq!(line["request_id"], "log-me-1");
    assert_eq!(line["method"], "GET");
    assert_eq!(line["path"], "/health");
    assert_eq!(line["status"], 200, "workers start healthy without active checks: {line}");
    assert!(line["duration_ms"].is_number() && line["head_ms"].is_number(), "{line}");
    assert!(line["ts"].is_string() && line["level"] == "INFO", "{line}");
}

async fn get_with_key(url: &str, path: &str, key: Option<&str>) -> reqwest::Response {
    let mut r = client().get(format!("{url}{path}"));
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    r.send().await.unwrap()
}

async fn assert_401(r: reqwest::Response) {
    assert_eq!(r.status(), 401);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "invalid_api_key");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(v["error"]["message"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_keys_from_config_env_and_file_all_open_v1() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys");
    std::fs::write(&file, "# rotated in on Monday\nkey-from-file\n").unwrap();
    let var = format!("MMROUTER_TEST_KEYS_{}", std::process::id());
    // Only this test reads this variable.
    std::env::set_var(&var, "key-env-1, key-env-2");
    let extra =
        format!("[auth]\napi_keys = [\"key-old\", \"key-new\"]\napi_keys_env = {var:?}\napi_keys_file = {file:?}");
    let c = cluster_with(sims(1, fast).await, &extra).await;
    for key in ["key-old", "key-new", "key-env-1", "key-env-2", "key-from-file"] {
        assert_eq!(get_with_key(&c.url, "/v1/models", Some(key)).await.status(), 200, "{key}");
    }
    assert_401(get_with_key(&c.url, "/v1/models", None).await).await;
    for wrong in ["key-ol", "key-oldx", "KEY-OLD", "key-env-1, key-env-2", ""] {
        assert_401(get_with_key(&c.url, "/v1/models", Some(wrong)).await).await;
    }
    let chat = client().post(format!("{}/v1/chat/completions", c.url)).body(chat_body(&[], "hi", false));
    assert_401(chat.send().await.unwrap()).await;
    // Without admin keys, /debug needs a client key; /health and /metrics stay open.
    let debug = client().post(format!("{}/debug/route", c.url)).body(chat_body(&[], "hi", false));
    assert_401(debug.send().await.unwrap()).await;
    assert_eq!(get_with_key(&c.url, "/health", None).await.status(), 200);
    let metrics = get_with_key(&c.url, "/metrics", None).await.text().await.unwrap();
    assert_eq!(metric(&metrics, "mmrouter_auth_failures_total", "scope=\"client\""), 8.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_key_guards_metrics_and_debug() {
    let extra = "[auth]\napi_keys = [\"client-key\"]\nadmin_keys = [\"admin-key\"]";
    let c = cluster_with(sims(1, fast).await, extra).await;
    assert_401(get_with_key(&c.url, "/metrics", None).await).await;
    assert_401(get_with_key(&c.url, "/metrics", Some("client-key")).await).await;
    assert_eq!(get_with_key(&c.url, "/metrics", Some("admin-key")).await.status(), 200);
    assert_401(get_with_key(&c.url, "/v1/models", Some("admin-key")).await).await;
    let debug = |key: &'static str| {
        client().post(format!("{}/debug/route", c.url)).bearer_auth(key).body(chat_body(&[], "hi", false)).send()
    };
    assert_401(debug("client-key").await.unwrap()).await;
    assert_eq!(debug("admin-key").await.unwrap().status(), 200);
    assert_eq!(get_with_key(&c.url, "/health", None).await.status(), 200);
}

#[test]
fn auth_config_errors_name_their_key() {
    let min = "[[workers]]\nname = \"a\"\nurl = \"http://127.0.0.1:1\"\n";
    for (extra, key) in [
        ("[auth]\napi_keys = [\"has space\"]\n", "auth.api_keys"),
        ("[auth]\napi_keys = [\"\"]\n", "auth.api_keys"),
        ("[auth]\napi_keys_env = \"MMROUTER_TEST_SURELY_UNSET\"\n", "auth.api_keys_env"),
        ("[auth]\nadmin_keys_file = \"/nonexistent/keys\"\n", "auth.admin_keys_file"),
        ("[auth]\nupstream_authorization = \"replace\"\n", "auth.upstream_authorization"),
        ("[auth]\nupstream_authorization = \"drop\"\n", "auth.upstream_authorization"),
        ("[auth]\nupstream_key = \"k\"\n", "auth.upstream_key"),
        ("[server]\nheader_read_timeout_ms = 0\n", "server.header_read_timeout_ms"),
        ("[server]\ndrain_timeout_ms = 0\n", "server.drain_timeout_ms"),
        ("[server]\nlog_format = \"xml\"\n", "server.log_format"),
    ] {
        let err = Settings::parse(&format!("{extra}{min}")).unwrap_err().to_string();
        assert!(err.contains(key), "error for {extra:?} should name {key}: {err}");
    }
    let defaults = Settings::parse(min).unwrap();
    assert_eq!(defaults.server.conn.header_read_timeout, Duration::from_secs(30));
    assert_eq!(defaults.server.conn.drain_timeout, Duration::from_secs(30));
    assert!(defaults.auth.api_keys.is_empty() && defaults.auth.admin_keys.is_empty());
}

/// A worker that answers every request with the headers it received, as JSON.
async fn echo_worker() -> String {
    use axum::http::HeaderMap;
    async fn echo(headers: HeaderMap) -> axum::Json<serde_json::Value> {
        let map: serde_json::Map<String, serde_json::Value> =
            headers.iter().map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").into())).collect();
        axum::Json(serde_json::Value::Object(map))
    }
    let app = axum::Router::new().fallback(echo);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

async fn echo_cluster(auth: &str) -> Cluster {
    let worker = echo_worker().await;
    proxy(Vec::new(), &format!("{auth}\n[[workers]]\nname = \"echo\"\nurl = {worker:?}\n")).await
}

/// What the worker received for a GET of `/v1/models` with `headers`, and the response's request id.
async fn seen_by_worker(c: &Cluster, headers: &[(&str, &str)]) -> (serde_json::Value, String) {
    let mut r = client().get(format!("{}/v1/models", c.url));
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let r = r.send().await.unwrap();
    assert_eq!(r.status(), 200);
    let id = r.headers().get("x-request-id").expect("x-request-id returned").to_str().unwrap().to_owned();
    (r.json().await.unwrap(), id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_and_traceparent_reach_the_worker_and_come_back() {
    let c = echo_cluster("").await;
    let (seen, id) = seen_by_worker(&c, &[]).await;
    assert_eq!(id.len(), 32, "{id}");
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    assert_eq!(seen["x-request-id"], id.as_str());
    let (_, other) = seen_by_worker(&c, &[]).await;
    assert_ne!(id, other, "each request gets its own id");
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let (seen, id) = seen_by_worker(&c, &[("x-request-id", "client-id-42"), ("traceparent", tp)]).await;
    assert_eq!(id, "client-id-42");
    assert_eq!(seen["x-request-id"], "client-id-42");
    assert_eq!(seen["traceparent"], tp);
    // An unreasonable id is replaced.
    let long = "x".repeat(200);
    let (seen, id) = seen_by_worker(&c, &[("x-request-id", long.as_str())]).await;
    assert_eq!(id.len(), 32);
    assert_eq!(seen["x-request-id"], id.as_str());
    // Errors the proxy makes itself carry the id too.
    let r = client().post(format!("{}/v1/chat/completions", c.url)).body("not json").send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.headers().contains_key("x-request-id"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workers_authorization_is_forwarded_stripped_or_replaced() {
    let bearer = [("authorization", "Bearer client-key")];
    let forward = echo_cluster("[auth]\napi_keys = [\"client-key\"]").await;
    assert_eq!(seen_by_worker(&forward, &bearer).await.0["authorization"], "Bearer client-key");
    let strip = echo_cluster("[auth]\napi_keys = [\"client-key\"]\nupstream_authorization = \"strip\"").await;
    assert!(seen_by_worker(&strip, &bearer).await.0.get("authorization").is_none());
    let replace = echo_cluster("[auth]\nupstream_authorization = \"replace\"\nupstream_key = \"worker-key\"").await;
    assert_eq!(seen_by_worker(&replace, &bearer).await.0["authorization"], "Bearer worker-key");
    assert_eq!(seen_by_worker(&replace, &[]).await.0["authorization"], "Bearer worker-key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_prior_knowledge_is_still_served() {
    let c = cluster_with(sims(1, fast).await, "").await;
    let h2 = mmrouter_core::http_client_builder().no_proxy().http2_prior_knowledge().build().unwrap();
    let r = h2
        .post(format!("{}/v1/chat/completions", c.url))
        .header("content-type", "application/json")
        .body(chat_body(&[], "over h2", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.version(), reqwest::Version::HTTP_2);
    assert_eq!(r.status(), 200);
    assert!(r.headers().contains_key("x-request-id"));
}
