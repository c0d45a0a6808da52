//! The binary's contract for bad configuration: exit non-zero, name the key.

use std::process::Command;

fn serve_with(config: &str) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, config).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mmrouter")).args(["serve", "--config"]).arg(&path).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn invalid_config_values_exit_non_zero_naming_the_key() {
    let worker = "[[workers]]\nname = \"a\"\nurl = \"http://127.0.0.1:9\"\n";
    for (extra, key) in [
        ("[routing]\npolicy = \"fastest\"\n", "policy"),
        ("[routing]\ntemperature = -1.0\n", "routing.temperature"),
        ("[media]\nallow_cidrs = [\"10.0.0.0/33\"]\n", "allow_cidrs"),
        ("[model]\ndir = \"/nonexistent/model\"\n", "model.dir"),
        ("[server]\nlisten = \"localhost\"\n", "server.listen"),
    ] {
        let (code, stderr) = serve_with(&format!("{extra}{worker}"));
        assert_ne!(code, 0, "{extra}");
        assert!(stderr.contains(key), "stderr for {extra:?} should name {key}: {stderr}");
    }
    let (code, stderr) = serve_with("");
    assert_ne!(code, 0);
    assert!(stderr.contains("workers"), "{stderr}");
}

#[test]
fn missing_config_file_is_named() {
    let out = Command::new(env!("CARGO_BIN_EXE_mmrouter"))
        .args(["serve", "--config", "/nonexistent/mmrouter.toml"])
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/mmrouter.toml"));
}

/// `mmrouter render` prints the ids a vLLM worker computes for the request (the parity fixture's
/// expected ids, from `vllm launch render`), so operators can diff against their deployment; a chat it
/// cannot render says why instead of printing ids.
#[test]
fn render_prints_the_workers_token_ids() {
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/parity");
    let corpus: serde_json::Value =
        serde_json::from_slice(&std::fs::read(format!("{fixtures}/chats.json")).unwrap()).unwrap();
    let expected: serde_json::Value =
        serde_json::from_slice(&std::fs::read(format!("{fixtures}/expected/vllm/qwen3_vl.json")).unwrap()).unwrap();
    let render = |request: &serde_json::Value| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("request.json");
        std::fs::write(&path, request.to_string()).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_mmrouter"))
            .args(["render", "--model-dir", "qwen3-vl"])
            .arg(&path)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    for name in ["tools_text", "tool_calls_empty_content"] {
        let request = corpus["chats"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap();
        let want = expected["chats"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap();
        let got = render(&request["request"]);
        assert_eq!(got["route"], "no_media", "{name}");
        assert_eq!(got["prompt_tokens_exact"], true, "{name}");
        assert_eq!(got["reason"], serde_json::Value::Null, "{name}");
        assert_eq!(got["token_ids"], want["ids"], "{name}");
    }
    // vLLM refuses `null` user content (400): no ids, and the reason.
    let got = render(&serde_json::json!({"messages": [{"role": "user", "content": null}]}));
    assert_eq!(got["route"], "no_media");
    assert_eq!(got["reason"], "invalid_request");
    assert_eq!(got["prompt_tokens"], 0);
    assert_eq!(got["prompt_tokens_exact"], false);
}
