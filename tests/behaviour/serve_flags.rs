//! `mmrouter serve` without a file: one pool from `--model-dir` and `--worker`; `--print-config` shows
//! the file the flags amount to; with `--config` the flags override the file's keys; a bad flag is an
//! error naming it. And `mmrouter --version`.

use std::process::{Command, Output};

use mmrouter::config::Settings;

use crate::harness::*;

fn mmrouter(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mmrouter")).args(args).env_remove("MMROUTER_CONFIG").output().unwrap()
}

fn stdout(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_from_flags_alone_serves_a_chat() {
    let sim = sims(1, fast).await.remove(0);
    let (mut child, addr, _log) =
        spawn_serve_args(&["--model-dir", "qwen3-vl", "--worker", &sim.url(), "--listen", "127.0.0.1:0"]);
    let url = format!("http://{addr}");
    let r = post(&url, chat_body(&[data_url("rocket.jpg")], "What is this?", false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-mmrouter-worker"), "worker-0");
    assert_eq!(header(&r, "x-mmrouter-route"), "exact");
    // No file to re-read: SIGHUP is ignored instead of ending the process, and the admin reload says so.
    let hup = Command::new("kill").args(["-HUP", &child.id().to_string()]).status().unwrap();
    assert!(hup.success());
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(child.try_wait().unwrap(), None, "SIGHUP ended the router");
    assert_eq!(post_to(&url, "/admin/reload", Vec::new()).await.status(), 409);
    assert_eq!(post(&url, chat_body(&[], "Hello!", false)).await.status(), 200);
    child.kill().unwrap();
    child.wait().unwrap();
}

/// What `--print-config` prints is a config file: served with `--config`, the same settings.
#[test]
fn print_config_shows_a_file_that_serves_the_same_router() {
    let flags = [
        "serve",
        "--model-dir",
        "qwen3-vl",
        "--worker",
        "http://127.0.0.1:9",
        "--worker",
        "http://127.0.0.1:10",
        "--kv-events",
        "discover",
        "--engine",
        "sglang",
        "--block-size",
        "32",
        "--listen",
        "127.0.0.1:0",
    ];
    let printed = stdout(&mmrouter(&[&flags[..], &["--print-config"]].concat()));
    let from_flags = Settings::parse(&printed).expect("the printed config parses");
    let pool = &from_flags.pools[0];
    assert_eq!((pool.pipeline.model.name.as_str(), pool.pipeline.model.block_size), ("qwen3-vl", 32));
    let workers: Vec<_> = pool.workers.iter().map(|w| (w.spec.name.as_str(), w.spec.url.as_str())).collect();
    assert_eq!(workers, [("worker-0", "http://127.0.0.1:9"), ("worker-1", "http://127.0.0.1:10")]);
    assert!(pool.workers.iter().all(|w| w.events == Some(mmrouter::config::EventSource::Discover)));
    assert!(pool.workers.iter().all(|w| w.spec.engine == mmrouter_core::routing::Engine::Sglang));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("from-flags.toml");
    std::fs::write(&file, &printed).unwrap();
    assert_eq!(Settings::load(&file).unwrap(), from_flags);
    let again = stdout(&mmrouter(&["serve", "--config", file.to_str().unwrap(), "--print-config"]));
    assert_eq!(again, printed, "the printed file prints itself");
    // A file alone prints as itself too: same settings (comments and layout aside).
    for example in ["config/mmrouter.toml", "config/compose/mmrouter.toml"] {
        let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(example);
        let printed = stdout(&mmrouter(&["serve", "--config", example.to_str().unwrap(), "--print-config"]));
        assert_eq!(Settings::parse(&printed).unwrap(), Settings::load(&example).unwrap(), "{}", example.display());
    }
}

/// The rule: each flag replaces its key (`--worker`: the whole worker list); the file's other keys stay.
#[test]
fn flags_override_the_files_keys() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("base.toml");
    std::fs::write(
        &file,
        "[server]\nlisten = \"127.0.0.1:7000\"\nmax_connections = 7\n\n[model]\ndir = \"qwen2.5-vl\"\nblock_size = 32\n\n\
         [[workers]]\nname = \"a\"\nurl = \"http://127.0.0.1:1\"\n\n[[workers]]\nname = \"b\"\nurl = \"http://127.0.0.1:2\"\n",
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let printed = stdout(&mmrouter(&["serve", "--config", path, "--worker", "http://127.0.0.1:3", "--print-config"]));
    let s = Settings::parse(&printed).unwrap();
    assert_eq!((s.pools[0].pipeline.model.name.as_str(), s.pools[0].pipeline.model.block_size), ("qwen2.5-vl", 32));
    let urls: Vec<_> = s.pools[0].workers.iter().map(|w| w.spec.url.as_str()).collect();
    assert_eq!(urls, ["http://127.0.0.1:3"]);
    assert_eq!((s.server.listen.port(), s.server.conn.max_connections), (7000, Some(7)));
    let printed = stdout(&mmrouter(&["serve", "--config", path, "--listen", "127.0.0.1:7001", "--print-config"]));
    let s = Settings::parse(&printed).unwrap();
    assert_eq!((s.server.listen.port(), s.pools[0].workers.len()), (7001, 2));
}

#[test]
fn a_bad_flag_is_an_error_naming_it() {
    let w = "http://127.0.0.1:9";
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let watched = write("watched.toml", "[server]\nwatch_config_ms = 1000\n");
    let pools = write(
        "pools.toml",
        "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\nworkers = [{ name = \"a\", url = \"http://127.0.0.1:1\" }]\n",
    );
    let cases: &[(&[&str], &str)] = &[
        (&["--worker", w], "--model-dir"),
        (&["--model-dir", "qwen3-vl"], "--worker"),
        (&["--model-dir", "/nonexistent/model", "--worker", w], "--model-dir"),
        (&["--model-dir", "qwen3-vl", "--worker", "ftp://x"], "--worker"),
        (&["--model-dir", "qwen3-vl", "--worker", w, "--listen", "nope"], "--listen"),
        (&["--model-dir", "qwen3-vl", "--worker", w, "--block-size", "0"], "--block-size"),
        (
            &["--model-dir", "qwen3-vl", "--worker", w, "--worker", w, "--kv-events", "tcp://127.0.0.1:5557"],
            "--kv-events",
        ),
        (&["--model-dir", "qwen3-vl", "--worker", w, "--kv-events", "udp://x"], "--kv-events"),
        (&["--model-dir", "qwen3-vl", "--kv-events", "discover"], "--worker"),
        (&["--model-dir", "qwen3-vl", "--worker", w, "--engine", "tgi"], "--engine"),
        (&["--config", &watched, "--model-dir", "qwen3-vl", "--worker", w], "server.watch_config_ms"),
        (&["--config", &pools, "--model-dir", "qwen3-vl"], "[[pools]]"),
    ];
    for (args, name) in cases {
        let out = mmrouter(&[&["serve"], *args].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(name), "{args:?} should name {name}: {stderr}");
    }
}

#[test]
fn version_names_the_crate_version_and_the_commit() {
    let printed = stdout(&mmrouter(&["--version"]));
    assert_eq!(printed, format!("mmrouter {}\n", env!("MMROUTER_VERSION")));
    assert!(printed.starts_with(concat!("mmrouter ", env!("CARGO_PKG_VERSION"))), "{printed}");
    let git = |args: &[&str]| {
        let out = Command::new("git").arg("-C").arg(env!("CARGO_MANIFEST_DIR")).args(args).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    if std::env::var_os("MMROUTER_GIT_COMMIT").is_none() {
        if let Some(head) = git(&["rev-parse", "--short=12", "HEAD"]) {
            assert!(printed.contains(&format!("(commit {head})")), "{printed} should name {head}");
        }
    }
}

/// Issue 47: `--prefill`, `--decode` and `--encode` are workers in those roles, named by their flag
/// (`prefill-0`, …) beside `--worker`'s `worker-0`; `--print-config` shows the roles and serves again.
#[test]
fn role_flags_print_workers_in_their_roles() {
    let flags = [
        "serve",
        "--model-dir",
        "qwen3-vl",
        "--prefill",
        "http://127.0.0.1:9",
        "--decode",
        "http://127.0.0.1:10",
        "--decode",
        "http://127.0.0.1:11",
        "--encode",
        "http://127.0.0.1:12",
        "--print-config",
    ];
    let printed = stdout(&mmrouter(&flags));
    assert!(printed.contains("role = \"prefill\"") && printed.contains("role = \"encode\""), "{printed}");
    let pool = &Settings::parse(&printed).expect("the printed config parses").pools[0];
    let workers: Vec<_> = pool.workers.iter().map(|w| (w.spec.name.as_str(), w.spec.role.label())).collect();
    assert_eq!(
        workers,
        [("prefill-0", "prefill"), ("decode-0", "decode"), ("decode-1", "decode"), ("encode-0", "encode")]
    );

    // SGLang P/D: the bootstrap port goes to the prefill workers.
    let sglang = ["serve", "--model-dir", "qwen3-vl", "--engine", "sglang", "--bootstrap-port", "8998"];
    let pd = ["--prefill", "http://127.0.0.1:9", "--decode", "http://127.0.0.1:10", "--print-config"];
    let pool = &Settings::parse(&stdout(&mmrouter(&[&sglang[..], &pd[..]].concat()))).unwrap().pools[0];
    assert_eq!(pool.workers[0].spec.bootstrap_port, Some(8998));
    assert_eq!(pool.workers[1].spec.bootstrap_port, None);

    // A pool the role rules refuse is an error naming the rule; a flag without its workers, the flag.
    for (args, needle) in [
        (&["--prefill", "http://127.0.0.1:9"][..], "has prefill workers but no decode worker"),
        (&["--worker", "http://127.0.0.1:9", "--encode", "ftp://x"][..], "--encode"),
        (&["--worker", "http://127.0.0.1:9", "--bootstrap-port", "8998"][..], "--prefill"),
        (
            &["--engine", "sglang", "--prefill", "http://127.0.0.1:9", "--decode", "http://127.0.0.1:10"][..],
            "bootstrap_port is required",
        ),
    ] {
        let out = mmrouter(&[&["serve", "--model-dir", "qwen3-vl"][..], args, &["--print-config"]].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(needle), "{args:?}: {err}");
    }
}
