//! The official `openai` Python SDK against a real proxy and simulated workers: a plain chat, a
//! streamed chat with usage, an image chat (data URL) and the proxy's own errors, as the SDK parses
//! them.
//!
//! The SDK is installed by the test into a venv under the target directory (kept across runs). Without
//! Python the test skips with a message; a failed `pip install` fails it (CI has the registry) unless
//! `MMROUTER_SKIP_PY_SDK=1`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{json, Value};

use crate::harness;

const MODEL: &str = "Qwen/Qwen3-VL-8B-Instruct";
/// Proxy body limit for this test: the image chat (~150 KB) fits, `TOO_LARGE` does not.
const MAX_BODY: usize = 1 << 20;
const TOO_LARGE: usize = 2 << 20;

#[test]
fn openai_python_sdk_round_trips_through_the_proxy() {
    let Some(python) = find_python() else {
        eprintln!("skipping: python3 not found (set MMROUTER_PYTHON to use another interpreter)");
        return;
    };
    let Some(venv_python) = venv_with_openai(&python) else {
        eprintln!("skipping: MMROUTER_SKIP_PY_SDK=1 and the openai package could not be installed");
        return;
    };

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let sims = harness::sims(2, |o| {
            o.ttft_base_ms = 0;
            o.prefill_us_per_token = 0;
            o.decode_ms_per_token = 0;
            o.responses_store = true;
        })
        .await;
        let cluster = harness::cluster_with(sims, &format!("[server]\nmax_body_bytes = {MAX_BODY}\n")).await;

        let text_messages = json!([
            {"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": format!("Say hello to {}.", harness::unique("sdk"))}
        ]);
        let image_messages = json!([
            {"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": harness::data_url("rocket.jpg")}},
                {"type": "text", "text": format!("What is in this picture? {}", harness::unique("sdk"))}
            ]}
        ]);
        let job = json!({
            "base_url": cluster.url,
            "model": MODEL,
            "text_messages": text_messages,
            "image_messages": image_messages,
            "too_large_bytes": TOO_LARGE,
        });
        let py = venv_python.clone();
        let out = tokio::task::spawn_blocking(move || run_script(&py, &job)).await.unwrap();
        eprintln!("SDK summary: {out}");

        // What the proxy predicted for the same messages: the SDK's usage must agree exactly.
        let text_plan = debug_route(&cluster.url, &text_messages).await;
        let image_plan = debug_route(&cluster.url, &image_messages).await;
        assert_eq!(text_plan["route"], "no_media", "{text_plan}");
        assert_eq!(image_plan["route"], "exact", "{image_plan}");

        let t = &out["text"];
        assert_eq!(t["status"], 200, "{t}");
        assert_eq!(t["route"], "no_media", "{t}");
        assert_eq!(t["object"], "chat.completion", "{t}");
        assert!(t["content"].as_str().is_some_and(|c| !c.is_empty()), "empty content: {t}");
        assert!(t["worker"].as_str().is_some_and(|w| cluster.sims.iter().any(|s| s.name() == w)), "{t}");
        assert!(t["prompt_tokens"].as_u64().is_some_and(|n| n > 0), "{t}");
        assert_eq!(t["prompt_tokens"], text_plan["prompt_tokens"], "SDK usage vs proxy plan: {t} {text_plan}");
        assert!(t["completion_tokens"].as_u64().is_some_and(|n| (1..=8).contains(&n)), "{t}");

        let s = &out["stream"];
        assert_eq!(s["status"], 200, "{s}");
        assert_eq!(s["route"], "no_media", "{s}");
        assert!(s["content_type"].as_str().is_some_and(|c| c.starts_with("text/event-stream")), "{s}");
        assert!(s["content_chunks"].as_u64().is_some_and(|n| n >= 1), "no content delta: {s}");
        assert!(s["content"].as_str().is_some_and(|c| !c.is_empty()), "{s}");
        assert!(s["finish_reason"].is_string(), "no finish_reason: {s}");
        assert_eq!(s["usage_chunks"], 1, "exactly one usage chunk expected: {s}");
        assert_eq!(s["prompt_tokens"], t["prompt_tokens"], "same messages, same prompt: {s} {t}");
        assert!(s["completion_tokens"].as_u64().is_some_and(|n| (1..=8).contains(&n)), "{s}");

        let i = &out["image"];
        assert_eq!(i["status"], 200, "{i}");
        assert_eq!(i["route"], "exact", "{i}");
        assert!(i["content"].as_str().is_some_and(|c| !c.is_empty()), "{i}");
        assert_eq!(image_plan["prompt_tokens_exact"], true, "{image_plan}");
        assert_eq!(i["prompt_tokens"], image_plan["prompt_tokens"], "SDK usage vs exact accounting: {i} {image_plan}");
        let image_tokens: u64 = image_plan["image_tokens"].as_array().unwrap().iter().filter_map(Value::as_u64).sum();
        assert!(image_tokens > 0, "{image_plan}");
        assert!(i["prompt_tokens"].as_u64().unwrap_or(0) > image_tokens, "{i} {image_plan}");

        let b = &out["bad_request"];
        assert_eq!(b["exception"], "BadRequestError", "{b}");
        assert_eq!(b["status"], 400, "{b}");
        assert_eq!(b["code"], "invalid_json", "{b}");
        assert_eq!(b["type"], "invalid_request_error", "{b}");
        assert_eq!(b["error_header"], "invalid_json", "{b}");

        let l = &out["too_large"];
        assert_eq!(l["exception"], "APIStatusError", "{l}");
        assert_eq!(l["status"], 413, "{l}");
        assert_eq!(l["code"], "body_too_large", "{l}");
        assert!(l["message"].as_str().is_some_and(|m| m.contains("max_body_bytes")), "{l}");

        // The SDK's models.retrieve: the model the workers list, and OpenAI's 404 for another.
        assert_eq!(out["retrieve"]["id"], MODEL, "{out}");
        assert_eq!(out["retrieve"]["object"], "model", "{out}");
        let u = &out["retrieve_unknown"];
        assert_eq!((u["exception"].clone(), u["status"].clone()), ("NotFoundError".into(), 404.into()), "{u}");
        assert_eq!(u["code"], "model_not_found", "{u}");

        // client.responses: a first turn, follow-ups by previous_response_id (whole and streamed) on the
        // worker that stored it, responses.retrieve, and OpenAI's 404 for an id no worker has.
        let r = &out["responses"];
        let first = &r["first"];
        assert_eq!((first["status"].clone(), first["object"].clone()), (200.into(), "response".into()), "{r}");
        assert!(first["text"].as_str().is_some_and(|t| !t.is_empty()), "{r}");
        assert!(first["input_tokens"].as_u64().is_some_and(|n| n > 0), "{r}");
        let home = first["worker"].clone();
        for turn in [&r["follow_up"], &r["stream"]] {
            assert_eq!(turn["status"], 200, "{r}");
            assert_eq!(turn["worker"], home, "a follow-up left the worker holding its response: {r}");
            assert_eq!(turn["pinned"], "known", "{r}");
        }
        assert_eq!(r["follow_up"]["previous_response_id"], first["id"], "{r}");
        assert_eq!(r["stream"]["first_event"], "response.created", "{r}");
        assert_eq!(r["stream"]["previous_response_id"], r["follow_up"]["id"], "{r}");
        assert_eq!(r["retrieve"]["id"], first["id"], "{r}");
        let u = &r["unknown"];
        assert_eq!((u["exception"].clone(), u["status"].clone()), ("NotFoundError".into(), 404.into()), "{u}");
        assert_eq!(u["code"], "response_not_found", "{u}");
    });
}

/// `MMROUTER_PYTHON` or `python3`, if it runs.
fn find_python() -> Option<String> {
    let python = std::env::var("MMROUTER_PYTHON").unwrap_or_else(|_| "python3".into());
    match Command::new(&python).arg("--version").output() {
        Ok(o) if o.status.success() => Some(python),
        Ok(o) => {
            eprintln!("{python} --version failed: {}", String::from_utf8_lossy(&o.stderr));
            None
        }
        Err(_) => None,
    }
}

fn venv_python_in(dir: &Path) -> PathBuf {
    if cfg!(windows) {
        dir.join("Scripts").join("python.exe")
    } else {
        dir.join("bin").join("python")
    }
}

fn imports_openai(python: &Path) -> bool {
    Command::new(python).args(["-c", "import openai"]).output().is_ok_and(|o| o.status.success())
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn check(what: &str, o: &Output) -> bool {
    if !o.status.success() {
        eprintln!(
            "{what} failed ({}):\n{}\n{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    o.status.success()
}

/// The venv's interpreter with `openai` importable, creating the venv on first use. It is built under
/// a per-process name and renamed into place, so concurrent test processes never share a half-built
/// venv (the venv interpreter locates its environment from its own path, so the move is safe).
fn venv_with_openai(python: &str) -> Option<PathBuf> {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let base = tmp.parent().unwrap_or(tmp);
    let venv = base.join("py-venv-openai");
    let venv_python = venv_python_in(&venv);
    if imports_openai(&venv_python) {
        return Some(venv_python);
    }

    let building = base.join(format!("py-venv-openai.building-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&building);
    let o = run(Command::new(python).arg("-m").arg("venv").arg(&building));
    assert!(check("python3 -m venv", &o), "could not create a venv with {python}");
    let building_python = venv_python_in(&building);
    let o = run(Command::new(&building_python).args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "openai",
    ]));
    if !check("pip install openai", &o) || !imports_openai(&building_python) {
        let _ = std::fs::remove_dir_all(&building);
        if std::env::var("MMROUTER_SKIP_PY_SDK").is_ok_and(|v| v == "1") {
            return None;
        }
        panic!(
            "pip install openai failed (set MMROUTER_SKIP_PY_SDK=1 to skip without the registry):\n{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    if !imports_openai(&venv_python) {
        // A broken leftover (or nothing) is in the way; another process may have just finished instead.
        let _ = std::fs::remove_dir_all(&venv);
        if std::fs::rename(&building, &venv).is_ok() {
            return Some(venv_python);
        }
    }
    let _ = std::fs::remove_dir_all(&building);
    assert!(imports_openai(&venv_python), "venv {} does not import openai", venv.display());
    Some(venv_python)
}

fn run_script(python: &Path, job: &Value) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/openai_sdk_client.py");
    let mut child = Command::new(python)
        .arg(script)
        // The proxy and sims are on 127.0.0.1; a proxy setting in the environment must not intercept.
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    let input = serde_json::to_vec(job).unwrap();
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let o = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "SDK script failed ({}):\n{stdout}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("SDK script printed no JSON ({e}): {stdout}"))
}

async fn debug_route(url: &str, messages: &Value) -> Value {
    let body = json!({"model": MODEL, "max_tokens": 8, "messages": messages});
    let resp = harness::client().post(format!("{url}/debug/route")).json(&body).send().await.unwrap();
    assert!(resp.status().is_success(), "debug/route: {}", resp.status());
    resp.json().await.unwrap()
}
