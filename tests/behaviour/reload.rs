//! Reloading the config file while serving: worker changes applied, anything else refused, an
//! invalid file refused with the running config kept; the file watch applies changes by itself.

use std::path::Path;
use std::time::Duration;

use crate::harness::*;

fn config(extra: &str, workers: &[&mmrouter_sim::SimHandle]) -> String {
    let mut toml = format!("{extra}\n[routing]\npolicy = \"round_robin\"\n\n");
    for s in workers {
        toml.push_str(&format!("[[workers]]\nname = {:?}\nurl = {:?}\n\n", s.name(), s.url()));
    }
    toml
}

/// A router served from the config file at `path`, as `mmrouter serve --config` runs it.
async fn serve_file(path: &Path) -> String {
    let cfg = mmrouter::config::Settings::load(path).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let path = path.to_owned();
    tokio::spawn(async move { mmrouter::server::serve_file(cfg, path, listener, std::future::pending()).await });
    url
}

async fn workers(url: &str) -> Vec<String> {
    let list: serde_json::Value =
        client().get(format!("{url}/admin/workers")).send().await.unwrap().json().await.unwrap();
    let mut names: Vec<String> = list["pools"][0]["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["draining"] == false)
        .map(|w| w["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    names
}

async fn reload(url: &str) -> (u16, serde_json::Value) {
    let r = client().post(format!("{url}/admin/reload")).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

fn sorted(names: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_applies_worker_changes_and_refuses_the_rest() {
    let s = sims(3, fast).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mmrouter.toml");
    std::fs::write(&path, config("", &[&s[0], &s[1]])).unwrap();
    let url = serve_file(&path).await;
    assert_eq!(post(&url, chat_body(&[], "hi", false)).await.status(), 200);

    // Workers: sim1 out, sim2 in.
    std::fs::write(&path, config("", &[&s[0], &s[2]])).unwrap();
    let (status, body) = reload(&url).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["applied"]["added"], serde_json::json!([s[2].name()]));
    assert_eq!(body["applied"]["removed"], serde_json::json!([s[1].name()]));
    assert_eq!(workers(&url).await, sorted(&[s[0].name(), s[2].name()]));
    let before = s[1].stats().requests;
    for _ in 0..6 {
        assert_eq!(post(&url, chat_body(&[], "hello again", false)).await.status(), 200);
    }
    assert!(s[2].stats().requests > 0, "the added worker got nothing");
    assert_eq!(s[1].stats().requests, before, "the removed worker still got requests");

    // An invalid file, or a change a reload cannot apply: refused, the running config stays.
    for (text, needle) in [
        ("[[workers]\nname = ".to_owned(), "config"),
        (config("[server]\nmax_body_bytes = 1000\n", &[&s[0]]), "restart"),
        (config("[tracing]\notlp_endpoint = \"http://127.0.0.1:4318\"\n", &[&s[0]]), "[tracing] changed"),
        (config("[model]\ndir = \"/nonexistent/model\"\n", &[&s[0]]), "model.dir"),
    ] {
        std::fs::write(&path, &text).unwrap();
        let (status, body) = reload(&url).await;
        assert_eq!(status, 400, "{text}");
        assert_eq!(body["error"]["code"], "config_rejected");
        assert!(body["error"]["message"].as_str().unwrap().contains(needle), "{body}");
        assert_eq!(workers(&url).await, sorted(&[s[0].name(), s[2].name()]));
    }

    // A new model version: the pool is rebuilt (fresh pipeline and index) and serves at once.
    std::fs::write(&path, config("[model]\ndir = \"qwen2.5-vl\"\n", &[&s[0], &s[2]])).unwrap();
    let (status, body) = reload(&url).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["applied"]["pools_added"], serde_json::json!(["qwen2.5-vl"]), "{body}");
    assert_eq!(body["applied"]["pools_removed"], serde_json::json!(["qwen3-vl"]), "{body}");
    let r = post(&url, chat_body(&[], "and now?", false)).await;
    assert_eq!(r.status(), 200);
    let d: serde_json::Value = client()
        .post(format!("{url}/debug/route"))
        .body(chat_body(&[], "hi", false))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(d["pool"], "qwen2.5-vl", "{d}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_adds_and_removes_pools() {
    let s = sims(2, fast).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mmrouter.toml");
    let pool = |name: &str, model: &str, sim: &mmrouter_sim::SimHandle| {
        format!(
            "[[pools]]\nname = \"{name}\"\nmodels = [\"{model}\"]\nworkers = [{{ name = \"{}\", url = \"{}\" }}]\n",
            sim.name(),
            sim.url()
        )
    };
    std::fs::write(&path, pool("a", "model-a", &s[0])).unwrap();
    let url = serve_file(&path).await;
    let chat = |model: &str| {
        serde_json::to_vec(&serde_json::json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}))
            .unwrap()
    };
    assert_eq!(post(&url, chat("model-b")).await.status(), 404);
    std::fs::write(&path, format!("{}{}", pool("a", "model-a", &s[0]), pool("b", "model-b", &s[1]))).unwrap();
    let (status, body) = reload(&url).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["applied"]["pools_added"], serde_json::json!(["b"]));
    assert_eq!(post(&url, chat("model-b")).await.status(), 200);
    assert_eq!(s[1].stats().requests, 1);
    std::fs::write(&path, pool("b", "model-b", &s[1])).unwrap();
    let (status, body) = reload(&url).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["applied"]["pools_removed"], serde_json::json!(["a"]));
    assert_eq!(post(&url, chat("model-a")).await.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_watch_applies_a_written_worker_list() {
    let s = sims(2, fast).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mmrouter.toml");
    let watch = "[server]\nwatch_config_ms = 50\n";
    std::fs::write(&path, config(watch, &[&s[0]])).unwrap();
    let url = serve_file(&path).await;
    assert_eq!(workers(&url).await, sorted(&[s[0].name()]));
    // A deployment tool rewrites the file (a ConfigMap update, a sidecar): no signal, no call.
    tokio::time::sleep(Duration::from_millis(20)).await; // a distinct modification time
    std::fs::write(&path, config(watch, &[&s[0], &s[1]])).unwrap();
    for _ in 0..200 {
        if workers(&url).await.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(workers(&url).await, sorted(&[s[0].name(), s[1].name()]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_makes_the_binary_reread_its_config() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mmrouter.toml");
    let file = |workers: &[&str]| {
        let mut toml = "[server]\nlisten = \"127.0.0.1:0\"\nhealth_interval_ms = 0\n\n".to_owned();
        for w in workers {
            toml.push_str(&format!("[[workers]]\nname = \"{w}\"\nurl = \"http://127.0.0.1:9\"\n\n"));
        }
        toml
    };
    std::fs::write(&path, file(&["w1"])).unwrap();
    let (mut child, addr, _log) = spawn_serve(&path);
    let url = format!("http://{addr}");
    assert_eq!(workers(&url).await, ["w1"]);
    std::fs::write(&path, file(&["w1", "w2"])).unwrap();
    let hup = std::process::Command::new("kill").args(["-HUP", &child.id().to_string()]).status().unwrap();
    assert!(hup.success());
    for _ in 0..200 {
        if workers(&url).await.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let seen = workers(&url).await;
    let _ = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let _ = child.wait();
    assert_eq!(seen, ["w1", "w2"]);
}

/// Issue 20: removals were applied before additions, so a failed addition left the removed worker
/// gone, and writing the old file back applied nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_whose_addition_fails_changes_nothing() {
    let s = sims(3, fast).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mmrouter.toml");
    let old = config("[server]\nhealth_interval_ms = 0\n", &[&s[0], &s[1]]);
    std::fs::write(&path, &old).unwrap();
    let url = serve_file(&path).await;
    // A worker added through the admin API holds the name the new file adds.
    let list: serde_json::Value =
        client().get(format!("{url}/admin/workers")).send().await.unwrap().json().await.unwrap();
    let pool = list["pools"][0]["name"].as_str().unwrap().to_owned();
    let r = client()
        .post(format!("{url}/admin/pools/{pool}/workers"))
        .json(&serde_json::json!({"name": s[2].name(), "url": s[2].url()}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let all = sorted(&[s[0].name(), s[1].name(), s[2].name()]);
    assert_eq!(workers(&url).await, all);

    // Remove sim1, add sim2 (taken): refused whole.
    std::fs::write(&path, config("[server]\nhealth_interval_ms = 0\n", &[&s[0], &s[2]])).unwrap();
    let (status, body) = reload(&url).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "config_rejected");
    assert!(body["error"]["message"].as_str().unwrap().contains(s[2].name()), "{body}");
    assert_eq!(workers(&url).await, all, "the removed worker is still there, in rotation");
    let before = s[1].stats().requests;
    for _ in 0..6 {
        assert_eq!(post(&url, chat_body(&[], "still serving?", false)).await.status(), 200);
    }
    assert!(s[1].stats().requests > before, "the worker the refused file removed still serves");

    // The old file back: nothing to apply, success.
    std::fs::write(&path, &old).unwrap();
    let (status, body) = reload(&url).await;
    assert_eq!(status, 200, "{body}");
    for key in ["added", "removed", "replaced", "pools_added", "pools_removed", "pools_rebuilt"] {
        assert_eq!(body["applied"][key], serde_json::json!([]), "{key}: {body}");
    }
    assert_eq!(workers(&url).await, all);
}

/// Reload cycles (remove a worker, add it back: 2 000 reloads) reuse slots and leave `/metrics` at its
/// size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_cycles_reuse_slots_and_release_metric_series() {
    let s = sims(2, fast).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mmrouter.toml");
    let extra = "[server]\nhealth_interval_ms = 0\n";
    let one = config(extra, &[&s[0]]);
    let two = config(extra, &[&s[0], &s[1]]);
    std::fs::write(&path, &one).unwrap();
    let url = serve_file(&path).await;
    let start = metrics_text(&url).await;
    let lines = |t: &str| t.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).count();
    const CYCLES: usize = 1_000;
    let t = std::time::Instant::now();
    for i in 0..CYCLES {
        for text in [&two, &one] {
            std::fs::write(&path, text).unwrap();
            let (status, body) = reload(&url).await;
            assert_eq!(status, 200, "cycle {i}: {body}");
        }
        if i % 250 == 0 {
            let _ = metrics_text(&url).await;
        }
    }
    eprintln!("{CYCLES} reload cycles at {:.0}/s", CYCLES as f64 / t.elapsed().as_secs_f64());
    for _ in 0..200 {
        if lines(&metrics_text(&url).await) == lines(&start) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let end = metrics_text(&url).await;
    assert_eq!(lines(&end), lines(&start), "series before/after {CYCLES} reload cycles");
    assert!(!end.contains(&format!("worker=\"{}\"", s[1].name())), "the removed worker's series survived");
    assert_eq!(workers(&url).await, sorted(&[s[0].name()]));
}

/// Issue 47: a worker's role is fixed for its life, so a reload that changes it replaces the worker
/// (the old one drained, a new one added under the same name), like a URL change; a reload whose pool
/// would no longer serve every leg — with the workers the admin API added — is refused whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_change_is_a_replace_and_the_pools_legs_are_kept() {
    let s = sims(3, fast).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mmrouter.toml");
    let file = |roles: &[&str], extra: &str| {
        let mut toml = "[server]\nhealth_interval_ms = 0\n".to_owned();
        for (sim, role) in s.iter().zip(roles) {
            toml.push_str(&format!(
                "[[workers]]\nname = {:?}\nurl = {:?}\nrole = \"{role}\"\n{extra}",
                sim.name(),
                sim.url()
            ));
        }
        toml
    };
    std::fs::write(&path, file(&["both", "both"], "")).unwrap();
    let url = serve_file(&path).await;
    let roles = || async {
        let list: serde_json::Value =
            client().get(format!("{url}/admin/workers")).send().await.unwrap().json().await.unwrap();
        let mut v: Vec<(String, String)> = list["pools"][0]["workers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|w| w["draining"] == false)
            .map(|w| (w["name"].as_str().unwrap().to_owned(), w["role"].as_str().unwrap().to_owned()))
            .collect();
        v.sort();
        v
    };
    let want = |r: [&str; 2]| {
        let mut v: Vec<(String, String)> =
            s[..2].iter().zip(r).map(|(s, r)| (s.name().to_owned(), r.to_owned())).collect();
        v.sort();
        v
    };

    std::fs::write(&path, file(&["prefill", "decode"], "")).unwrap();
    let (status, body) = reload(&url).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["applied"]["replaced"], serde_json::json!([s[0].name(), s[1].name()]), "{body}");
    assert_eq!(body["applied"]["added"], serde_json::json!([]), "{body}");
    assert_eq!(roles().await, want(["prefill", "decode"]));
    // Once the old worker is removed, its info series goes with it: one role per worker name.
    let old = format!("worker=\"{}\",pool=\"qwen3-vl\",engine=\"vllm\",role=\"both\"", s[0].name());
    let new = old.replace("both", "prefill");
    let mut m = metrics_text(&url).await;
    for _ in 0..100 {
        if !m.contains(&old) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        m = metrics_text(&url).await;
    }
    assert!(!m.contains(&old) && m.contains(&new), "{m}");

    // An encode worker added through the admin API stays beside the file's workers: a file whose
    // engines it cannot hand its embeddings to (SGLang) is refused whole, the pool as it was.
    let add = serde_json::json!({"name": "enc", "url": s[2].url(), "role": "encode"});
    let r = client().post(format!("{url}/admin/pools/qwen3-vl/workers")).json(&add).send().await.unwrap();
    assert_eq!(r.status(), 201);
    std::fs::write(
        &path,
        file(&["prefill", "decode"], "engine = \"sglang\"\n")
            .replace("role = \"prefill\"\n", "role = \"prefill\"\nbootstrap_port = 8998\n"),
    )
    .unwrap();
    let (status, body) = reload(&url).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("SGLang E/PD is not supported"), "{body}");
    assert_eq!(roles().await.len(), 3);
    assert!(roles().await.contains(&(s[0].name().to_owned(), "prefill".to_owned())));

    // Back to aggregated: both replaced again; the encode worker now serves the both workers.
    std::fs::write(&path, file(&["both", "both"], "")).unwrap();
    let (status, body) = reload(&url).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["applied"]["replaced"], serde_json::json!([s[0].name(), s[1].name()]), "{body}");
    assert!(roles().await.contains(&("enc".to_owned(), "encode".to_owned())));
    assert_eq!(post(&url, chat_body(&[], "hi", false)).await.status(), 200);
}
