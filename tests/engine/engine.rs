//! Real vLLM engines for the suite: started from the cached venv (`tests/engine/install.sh`) on a tiny
//! checkpoint (`tests/engine/checkpoint.py`), on 127.0.0.1 only, each in its own process group so a
//! stop takes its children with it. Logs go to `target/engine-logs/NAME.log`; a start that fails
//! prints the log's tail.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How the engine's KV-event PUB endpoint is spelled. vLLM binds only endpoints containing `*` or
/// `::`; `[::ffff:127.0.0.1]` binds loopback only. Any other spelling makes it connect out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Events {
    Loopback,
    ConnectOut,
    /// No `--kv-events-config` (an encoder-only engine has no KV cache to publish).
    Off,
}

#[derive(Clone, Debug)]
pub struct EngineOpts {
    pub name: &'static str,
    /// A checkpoint directory name under `MMROUTER_ENGINE_CHECKPOINTS` (`qwen2.5-vl`, `qwen3-vl`).
    pub checkpoint: &'static str,
    pub block_size: u32,
    pub events: Events,
    /// More `vllm serve` flags (`--no-enable-prefix-caching` replaces the suite's `--enable-prefix-caching`).
    pub extra: Vec<String>,
    /// More environment (over the suite's CPU settings).
    pub env: Vec<(String, String)>,
}

pub struct Engine {
    pub opts: EngineOpts,
    pub port: u16,
    pub events_port: u16,
    pub replay_port: u16,
    child: Option<Child>,
    started: Instant,
}

/// Startup takes 70–110 s alone on two cores, longer with two engines starting at once; three at once
/// (the E/PD test) took 466 s on a machine busy with builds.
const READY_WITHIN: Duration = Duration::from_secs(900);

/// A port for an engine to bind later: a new one per call, bindable now, and below the kernel's
/// ephemeral range. A port from `bind(:0)` is free only until the next `bind(:0)` is handed it, and
/// an engine binds several of its own that way (a CI run lost an engine's start to one of them:
/// "Address already in use"); no `bind(:0)` ever gets a port below the range.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static CURSOR: AtomicU32 = AtomicU32::new(0);
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let low = range.split_whitespace().next().and_then(|p| p.parse::<u32>().ok()).unwrap_or(32_768);
    let (first, span) = (10_000, low.saturating_sub(10_000));
    if span < 1_000 {
        return std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    }
    // Spread by process, so two suites on one machine start apart.
    let start = std::process::id() * 97;
    for _ in 0..span {
        let port = (first + (start + CURSOR.fetch_add(1, Ordering::Relaxed)) % span) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {first}..{low}");
}

fn env_path(name: &str) -> PathBuf {
    PathBuf::from(std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run tests/engine/run.sh")))
}

fn log_path(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/engine-logs");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{name}.log"))
}

impl Engine {
    /// Starts the engine (without waiting for it: see [`Engine::ready`]).
    pub fn spawn(opts: EngineOpts) -> Engine {
        let mut engine = Engine {
            opts,
            port: free_port(),
            events_port: free_port(),
            replay_port: free_port(),
            child: None,
            started: Instant::now(),
        };
        engine.start();
        engine
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The endpoint a subscriber connects to.
    pub fn events_endpoint(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.events_port)
    }

    fn kv_events_config(&self) -> Option<String> {
        let (endpoint, replay) = match self.opts.events {
            Events::Off => return None,
            Events::Loopback => (
                format!("tcp://[::ffff:127.0.0.1]:{}", self.events_port),
                Some(format!("tcp://[::ffff:127.0.0.1]:{}", self.replay_port)),
            ),
            Events::ConnectOut => (format!("tcp://127.0.0.1:{}", self.events_port), None),
        };
        Some(
            serde_json::json!({ "enable_kv_cache_events": true, "publisher": "zmq", "endpoint": endpoint,
                                "replay_endpoint": replay, "topic": "" })
            .to_string(),
        )
    }

    fn start(&mut self) {
        use std::os::unix::process::CommandExt as _;
        let checkpoint = env_path("MMROUTER_ENGINE_CHECKPOINTS").join(self.opts.checkpoint);
        let cli = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/engine/vllm_cli.py");
        let log = std::fs::File::create(log_path(self.opts.name)).unwrap();
        let mut cmd = Command::new(env_path("MMROUTER_VLLM_PYTHON"));
        cmd.arg(cli).arg("serve").arg(&checkpoint);
        cmd.args([
            "--served-model-name",
            self.opts.checkpoint,
            "--host",
            "127.0.0.1",
            "--port",
            &self.port.to_string(),
        ]);
        cmd.args(["--max-model-len", "4096", "--block-size", &self.opts.block_size.to_string(), "--dtype", "float32"]);
        if !self.opts.extra.iter().any(|a| a == "--no-enable-prefix-caching") {
            cmd.arg("--enable-prefix-caching");
        }
        cmd.args(["--enable-prompt-tokens-details", "--enable-scale-out", "--enforce-eager"]);
        cmd.args(["--max-num-seqs", "8", "--limit-mm-per-prompt", r#"{"image":8,"video":0}"#]);
        if let Some(config) = self.kv_events_config() {
            cmd.args(["--kv-events-config", &config]);
        }
        cmd.args(&self.opts.extra);
        for (k, v) in ENGINE_ENV {
            cmd.env(k, v);
        }
        for (k, v) in &self.opts.env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null()).stdout(log.try_clone().unwrap()).stderr(log).process_group(0);
        self.child = Some(cmd.spawn().expect("vllm starts"));
        self.started = Instant::now();
    }

    /// Waits until `/health` answers 200.
    pub async fn ready(&mut self) {
        let client = mmrouter_core::http_client_builder().build().unwrap();
        while self.started.elapsed() < READY_WITHIN {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("engine {} exited ({status}) while starting:\n{}", self.opts.name, self.log_tail());
            }
            let health = client.get(format!("{}/health", self.url())).timeout(Duration::from_secs(2)).send().await;
            if health.is_ok_and(|r| r.status().is_success()) {
                eprintln!(
                    "engine {} ready {:.0} s after its start",
                    self.opts.name,
                    self.started.elapsed().as_secs_f64()
                );
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        panic!("engine {} not ready within {READY_WITHIN:?}:\n{}", self.opts.name, self.log_tail());
    }

    /// Everything the engine wrote to stdout and stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(log_path(self.opts.name)).unwrap_or_default()
    }

    /// The resident memory of the engine's process group (its API server and engine core), in MiB.
    pub fn rss_mib(&self) -> u64 {
        let Some(group) = self.child.as_ref().map(|c| c.id().to_string()) else { return 0 };
        let mut kib = 0;
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
            // Fields after the command's closing parenthesis: state, ppid, pgrp, ...
            let Some(rest) = stat.rsplit_once(") ").map(|(_, r)| r) else { continue };
            if rest.split(' ').nth(2) != Some(group.as_str()) {
                continue;
            }
            let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
            kib += status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .unwrap_or(0);
        }
        kib / 1024
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(log_path(self.opts.name)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// SIGTERM to the engine's process group (its API server stops its children), then SIGKILL.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        let group = format!("-{}", child.id());
        let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if child.try_wait().ok().flatten().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = child.wait();
    }

    /// SIGKILL to the engine's process group, as a crash: no request in flight is finished.
    pub fn kill(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", child.id())]).status();
        let _ = child.wait();
    }

    /// Stops and starts the engine on the same ports (its cache is gone, its event sequence restarts).
    pub async fn restart(&mut self) {
        self.stop();
        self.start();
        self.ready().await;
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop();
    }
}

/// CPU engine settings (`shared/reference/vllm-cpu.md`): a 1 GiB KV cache, no thread pinning, internal
/// queues on loopback, and nothing loaded from or reported to any hub.
const ENGINE_ENV: &[(&str, &str)] = &[
    ("VLLM_TARGET_DEVICE", "cpu"),
    ("VLLM_CPU_KVCACHE_SPACE", "1"),
    ("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
    ("OMP_NUM_THREADS", "2"),
    ("VLLM_HOST_IP", "127.0.0.1"),
    ("HF_HUB_OFFLINE", "1"),
    ("TRANSFORMERS_OFFLINE", "1"),
    ("VLLM_NO_USAGE_STATS", "1"),
    ("DO_NOT_TRACK", "1"),
];
