//! `mmrouter doctor` against simulated workers: a healthy pool passes every line; a worker with
//! another block size, a kv_events address nothing listens on, or another chat template fails the
//! right line with a fix hint. (The same failures against a real vLLM: `tests/engine/`.) Hostile
//! answers: 62 MiB of JSON is refused at its cap with the doctor's memory small, a dripping answer
//! costs its request's timeout, and a run ends by its deadline with what it found.

use std::time::Duration;

use mmrouter::cli::doctor::{diagnose, Limits, Line, Status};
use mmrouter::config::Settings;
use mmrouter_sim::{SimHandle, SimOptions};

use crate::harness::*;

async fn sim_with(tweak: impl Fn(&mut SimOptions)) -> SimHandle {
    sims(1, |o| {
        fast(o);
        o.kv_events = Some("tcp://127.0.0.1:0".into());
        tweak(o);
    })
    .await
    .remove(0)
}

async fn doctor(toml: &str) -> Vec<Line> {
    let settings = Settings::parse(toml).expect("valid test config");
    diagnose(&settings, Duration::from_secs(20)).await.expect("the doctor runs")
}

fn pool(model: &str, workers: &[(&SimHandle, &str)]) -> String {
    let mut toml = format!("[model]\ndir = {model:?}\n");
    for (sim, events) in workers {
        toml.push_str(&format!(
            "[[workers]]\nname = {:?}\nurl = {:?}\nkv_events = {events:?}\n",
            sim.name(),
            sim.url()
        ));
    }
    toml
}

fn status<'a>(lines: &'a [Line], worker: &str, check: &str) -> &'a Line {
    lines
        .iter()
        .find(|l| l.worker == worker && l.check == check)
        .unwrap_or_else(|| panic!("no {check} line for {worker}: {lines:#?}"))
}

fn failed(lines: &[Line]) -> Vec<&str> {
    lines.iter().filter(|l| l.status == Status::Fail).map(|l| l.check).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_pool_passes_every_line() {
    let (a, b) = (sim_with(|_| {}).await, sim_with(|_| {}).await);
    let lines = doctor(&pool("qwen3-vl", &[(&a, "discover"), (&b, "discover")])).await;
    assert!(failed(&lines).is_empty(), "{lines:#?}");
    assert!(lines.iter().all(|l| l.check != "role" && l.check != "same_model"), "an aggregated pool: {lines:#?}");
    for w in [a.name(), b.name()] {
        for check in ["reachable", "engine", "block_size", "kv_events_bound", "kv_events_flowing", "uuid_in_events"] {
            assert_eq!(status(&lines, w, check).status, Status::Ok, "{check}: {lines:#?}");
        }
        for check in ["prompt_tokens_text", "prompt_tokens_image", "prompt_tokens_tools", "cached_tokens"] {
            assert_eq!(status(&lines, w, check).status, Status::Ok, "{check}: {lines:#?}");
        }
        // The simulator has no render endpoint: that line cannot pass or fail there.
        assert_eq!(status(&lines, w, "render_text").status, Status::Skip, "{lines:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_block_size_fails_the_block_size_line() {
    let sim = sim_with(|o| o.block_size = 32).await;
    let lines = doctor(&pool("qwen3-vl", &[(&sim, "discover")])).await;
    let line = status(&lines, sim.name(), "block_size");
    assert_eq!(line.status, Status::Fail, "{lines:#?}");
    assert_eq!(line.detail, "worker 32, pool 16");
    assert!(line.hint.as_deref().unwrap().contains("--block-size 16"), "{line:?}");
    // The events say so too, and the repeat reuses another share than predicted.
    assert_eq!(status(&lines, sim.name(), "kv_events_flowing").status, Status::Fail, "{lines:#?}");
    assert_eq!(status(&lines, sim.name(), "cached_tokens").status, Status::Fail, "{lines:#?}");
    assert_eq!(status(&lines, sim.name(), "prompt_tokens_image").status, Status::Ok, "{lines:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_where_nothing_listens_fail_the_bound_line() {
    let sim = sim_with(|_| {}).await;
    let nothing = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("tcp://{}", l.local_addr().unwrap())
    };
    let lines = doctor(&pool("qwen3-vl", &[(&sim, &nothing)])).await;
    let line = status(&lines, sim.name(), "kv_events_bound");
    assert_eq!(line.status, Status::Fail, "{lines:#?}");
    assert!(line.hint.as_deref().unwrap().contains("binds its PUB socket only when"), "{line:?}");
    assert_eq!(failed(&lines), ["kv_events_bound"], "only that line: {lines:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_chat_template_fails_the_token_lines() {
    // The worker renders Qwen2.5-VL's template (a default system prompt); the pool expects Qwen3-VL's.
    let sim = sim_with(|o| o.model_dir = Some("qwen2.5-vl".into())).await;
    let lines = doctor(&pool("qwen3-vl", &[(&sim, "discover")])).await;
    for check in ["prompt_tokens_text", "prompt_tokens_image", "prompt_tokens_tools"] {
        let line = status(&lines, sim.name(), check);
        assert_eq!(line.status, Status::Fail, "{check}: {lines:#?}");
        assert!(line.hint.is_some());
    }
    assert_eq!(status(&lines, sim.name(), "block_size").status, Status::Ok, "{lines:#?}");
}

#[test]
fn the_command_prints_json_and_exits_1_on_a_failure() {
    // Nothing listens on the worker's URL: reachable fails, the command says so and exits 1.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mmrouter"))
        .args(["doctor", "--model-dir", "qwen3-vl", "--worker", &format!("http://127.0.0.1:{port}"), "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["checks"][0]["check"], "reachable");
    assert_eq!(v["checks"][0]["status"], "fail");
    assert!(v["checks"][0]["hint"].as_str().unwrap().contains("start the worker"), "{v}");
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_mmrouter")).args(["doctor"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--config FILE, or --model-dir"), "{bad:?}");
}

/// A fake worker: `/health` answers, `/v1/models` lists `m` unless `models` is false, and every other
/// path answers what `rest` makes of it.
async fn fake_worker(models: bool, rest: fn(&str) -> axum::response::Response) -> String {
    use axum::response::IntoResponse;
    let app = axum::Router::new().route("/health", axum::routing::get(|| async { "ok" })).fallback(
        move |uri: axum::http::Uri| async move {
            if models && uri.path() == "/v1/models" {
                return axum::Json(serde_json::json!({ "object": "list", "data": [{ "id": "m" }] })).into_response();
            }
            rest(uri.path())
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

/// 62 MiB of JSON that is tiny nodes (`{}`), the costliest shape to parse into a tree.
fn huge_json() -> bytes::Bytes {
    static BODY: std::sync::OnceLock<bytes::Bytes> = std::sync::OnceLock::new();
    BODY.get_or_init(|| {
        let n = (62 << 20) / 3;
        let mut body = Vec::with_capacity(n * 3 + 16);
        body.extend_from_slice(b"{\"data\":[");
        for _ in 0..n {
            body.extend_from_slice(b"{},");
        }
        body.extend_from_slice(b"{}]}");
        bytes::Bytes::from(body)
    })
    .clone()
}

/// `/version` declares its length; every other path sends 62 MiB in 1 MiB chunks, without a length.
fn huge_answer(path: &str) -> axum::response::Response {
    use axum::response::IntoResponse;
    let body = huge_json();
    if path == "/version" {
        return ([("content-type", "application/json")], body).into_response();
    }
    let chunks = (0..body.len())
        .step_by(1 << 20)
        .map(move |at| Ok::<_, std::convert::Infallible>(body.slice(at..(at + (1 << 20)).min(body.len()))));
    axum::body::Body::from_stream(futures_util::stream::iter(chunks)).into_response()
}

/// One byte a second, for ever.
fn dripping(_: &str) -> axum::response::Response {
    let drip = futures_util::stream::unfold((), |()| async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        Some((Ok::<_, std::convert::Infallible>(bytes::Bytes::from_static(b" ")), ()))
    });
    axum::response::Response::new(axum::body::Body::from_stream(drip))
}

/// What `mmrouter doctor` printed and how it ended, with its peak resident memory (`VmHWM`, read while
/// it ran) and its wall time; killed, and so failing, after 60 s.
struct Run {
    code: Option<i32>,
    json: serde_json::Value,
    peak_rss_kib: u64,
    took: std::time::Duration,
}

fn run_doctor(args: Vec<String>) -> Run {
    use std::io::Read as _;
    let started = std::time::Instant::now();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_mmrouter"))
        .arg("doctor")
        .args(args)
        // Freed memory back to the system at once: the peak is then what the doctor holds, not how
        // late mimalloc's delayed purge (10 ms, later on a loaded machine) ran (a loaded run measured 66
        // MiB over the floor with the default, 19-36 idle).
        .env("MIMALLOC_PURGE_DELAY", "0")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        out.read_to_end(&mut text).unwrap();
        text
    });
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak_rss_kib = 0;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        let hwm = std::fs::read_to_string(&status_file).ok().and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmHWM:"))?.to_owned();
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        });
        peak_rss_kib = peak_rss_kib.max(hwm.unwrap_or(0));
        if started.elapsed() > Duration::from_secs(60) {
            child.kill().unwrap();
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let took = started.elapsed();
    let text = reader.join().unwrap();
    let json = serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&text)));
    Run { code: status.code(), json, peak_rss_kib, took }
}

fn line<'a>(json: &'a serde_json::Value, check: &str) -> &'a serde_json::Value {
    let checks = json["checks"].as_array().unwrap();
    checks.iter().find(|l| l["check"] == check).unwrap_or_else(|| panic!("no {check} line: {json:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_62_mib_answer_is_refused_at_its_cap_and_the_doctor_stays_small() {
    let url = fake_worker(true, huge_answer).await;
    let args = ["--model-dir", "qwen3-vl", "--worker", &url, "--json", "--timeout-secs", "20", "--deadline-secs", "40"];
    let args = args.map(str::to_owned).to_vec();
    let run = tokio::task::spawn_blocking(move || run_doctor(args)).await.unwrap();
    assert_eq!(run.code, Some(1), "{:#}", run.json);
    let (fail, skip) = (serde_json::json!("fail"), serde_json::json!("skip"));
    for (check, status, says) in [
        ("engine", &fail, "/version: answer larger than 1 MiB"),
        ("block_size", &skip, "/metrics: answer larger than 4 MiB"),
        ("render_text", &fail, "answer larger than 16 MiB"),
        ("prompt_tokens_image", &fail, "answer larger than 1 MiB"),
        ("cached_tokens", &fail, "answer larger than 1 MiB"),
    ] {
        let l = line(&run.json, check);
        assert_eq!(&l["status"], status, "{l}");
        assert!(l["detail"].as_str().unwrap().contains(says), "{l}");
    }
    assert_eq!(line(&run.json, "served_model")["status"], "ok", "{:#}", run.json);
    // The same run against a worker whose answers are small: the model's tokenizers and templates,
    // loaded once a worker reaches the probes, are the doctor's floor (~200 MiB in a debug build).
    let small = fake_worker(true, |_| axum::response::IntoResponse::into_response("{}")).await;
    let args = vec!["--model-dir".into(), "qwen3-vl".into(), "--worker".into(), small, "--json".into()];
    let floor = tokio::task::spawn_blocking(move || run_doctor(args)).await.unwrap();
    let (peak, floor) = (run.peak_rss_kib / 1024, floor.peak_rss_kib / 1024);
    eprintln!("doctor's peak RSS: {peak} MiB on 62 MiB answers, {floor} MiB on small ones");
    assert!(floor > 0, "VmHWM was read");
    // Reading every answer whole and parsing it as a tree took gigabytes; at most a cap's worth now.
    assert!(peak < floor + 48, "doctor's peak RSS {peak} MiB on 62 MiB answers, {floor} MiB on small ones");

    // A worker whose every answer, `/v1/models` included, is 62 MiB: it never reaches the probes, so
    // the model is never loaded and the doctor stays small (issue 45: under 200 MB).
    let url = fake_worker(false, huge_answer).await;
    let args = ["--model-dir", "qwen3-vl", "--worker", &url, "--json", "--timeout-secs", "20"];
    let args = args.map(str::to_owned).to_vec();
    let run = tokio::task::spawn_blocking(move || run_doctor(args)).await.unwrap();
    assert_eq!(run.code, Some(1), "{:#}", run.json);
    let peak_mb = run.peak_rss_kib * 1024 / 1_000_000;
    eprintln!("doctor's peak RSS without the probes: {peak_mb} MB");
    assert!(peak_mb < 200, "doctor's peak RSS {peak_mb} MB on a worker of 62 MiB answers: {:#}", run.json);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dripping_answer_costs_its_request_timeout() {
    let url = fake_worker(false, dripping).await;
    let settings = Settings::parse(&format!("[model]\ndir = \"qwen3-vl\"\n[[workers]]\nname = \"w\"\nurl = {url:?}\n"))
        .expect("valid test config");
    let limits = Limits { timeout: Duration::from_secs(1), deadline: Duration::from_secs(30) };
    let started = std::time::Instant::now();
    let lines = diagnose(&settings, limits).await.expect("the doctor runs");
    // Three requests (version, models, metrics), a second each; the probes need a model.
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    let engine = status(&lines, "w", "engine");
    assert_eq!((engine.status, engine.detail.as_str()), (Status::Fail, "/version: no whole answer within 1s"));
    assert_eq!(status(&lines, "w", "served_model").status, Status::Fail, "{lines:#?}");
    assert!(status(&lines, "w", "block_size").detail.contains("no whole answer within 1s"), "{lines:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_ends_by_its_deadline_with_what_it_found() {
    let url = fake_worker(false, dripping).await;
    let args = ["--model-dir", "qwen3-vl", "--worker", &url, "--json", "--timeout-secs", "60", "--deadline-secs", "3"];
    let args = args.map(str::to_owned).to_vec();
    let run = tokio::task::spawn_blocking(move || run_doctor(args)).await.unwrap();
    assert_eq!(run.code, Some(1), "{:#}", run.json);
    // The deadline, plus starting the process and loading the model.
    assert!(run.took < Duration::from_secs(10), "took {:?}", run.took);
    assert_eq!(line(&run.json, "reachable")["status"], "ok", "{:#}", run.json);
    let deadline = line(&run.json, "deadline");
    assert_eq!(deadline["status"], "fail");
    assert!(deadline["detail"].as_str().unwrap().contains("passed during these checks"), "{deadline}");
    assert!(deadline["hint"].as_str().unwrap().contains("--deadline-secs"), "{deadline}");
}

#[test]
fn a_closed_pipe_ends_the_doctor_quietly() {
    // Nothing listens: the report is printed into a pipe whose reader has gone.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_mmrouter"))
        .args(["doctor", "--model-dir", "qwen3-vl", "--worker", &format!("http://127.0.0.1:{port}"), "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{stderr}");
}

/// Issue 47: in a pool with roles each worker's role is a line, and its prefill, decode and encode
/// workers must serve the same model as its first prefill worker: a decode worker serving another
/// fails `same_model` with a hint; an encode worker's prefix caching is not asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disaggregated_pools_legs_serve_one_model() {
    use mmrouter_sim::Role as SimRole;
    let (p, d) = (sim_with(|o| o.role = SimRole::Prefill).await, sim_with(|o| o.role = SimRole::Decode).await);
    let other = sim_with(|o| {
        o.role = SimRole::Decode;
        o.model = "another-model".into();
    })
    .await;
    let e = sim_with(|o| o.role = SimRole::Encode).await;
    let worker = |sim: &SimHandle, role: &str| {
        format!("[[workers]]\nname = {:?}\nurl = {:?}\nrole = \"{role}\"\n", sim.name(), sim.url())
    };
    let toml = [worker(&p, "prefill"), worker(&d, "decode"), worker(&other, "decode"), worker(&e, "encode")].concat();
    let lines = doctor(&toml).await;
    for (sim, role) in [(&p, "prefill"), (&d, "decode"), (&other, "decode"), (&e, "encode")] {
        assert_eq!(
            (status(&lines, sim.name(), "role").status, status(&lines, sim.name(), "role").detail.as_str()),
            (Status::Ok, role)
        );
    }
    for sim in [&p, &d, &e] {
        assert_eq!(status(&lines, sim.name(), "same_model").status, Status::Ok, "{lines:#?}");
    }
    let line = status(&lines, other.name(), "same_model");
    assert_eq!(line.status, Status::Fail, "{lines:#?}");
    assert!(line.detail.contains("another-model") && line.detail.contains(p.name()), "{line:?}");
    assert!(line.hint.as_deref().unwrap().contains("same model"), "{line:?}");
    assert_eq!(status(&lines, e.name(), "cached_tokens").status, Status::Skip, "{lines:#?}");
    // The path end to end, reported on the first decode worker.
    let line = status(&lines, d.name(), "pd_path");
    assert_eq!(line.status, Status::Ok, "{lines:#?}");
    assert!(line.detail.contains(&format!("prefill '{}' then decode '{}'", p.name(), d.name())), "{line:?}");

    // A "prefill" worker that hands over no KV cache (here an encoder): the path fails, saying where.
    let toml = [worker(&e, "prefill"), worker(&d, "decode")].concat();
    let lines = doctor(&toml).await;
    let line = status(&lines, d.name(), "pd_path");
    assert_eq!(line.status, Status::Fail, "{lines:#?}");
    assert!(line.detail.contains("prefill"), "{line:?}");
    assert!(line.hint.as_deref().unwrap().contains("--kv-transfer-config"), "{line:?}");
}
