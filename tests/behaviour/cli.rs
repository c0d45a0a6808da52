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
