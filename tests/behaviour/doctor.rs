//! `mmrouter doctor` against simulated workers: a healthy pool passes every line; a worker with
//! another block size, a kv_events address nothing listens on, or another chat template fails the
//! right line with a fix hint. (The same failures against a real vLLM: `tests/engine/`.)

use std::time::Duration;

use mmrouter::cli::doctor::{diagnose, Line, Status};
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
