//! `mmrouter demo`: simulated workers and the proxy in one process, on the bundled model profile.

use crate::config::Config;
use crate::sim::SimOptions;

pub async fn run(
    port: u16,
    workers: usize,
    model: &str,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    if workers == 0 {
        anyhow::bail!("--workers must be at least 1");
    }
    let mut sims = Vec::new();
    for i in 0..workers {
        let opts = SimOptions {
            name: format!("sim-{i}"),
            model_dir: Some(model.to_owned()),
            seed: i as u64,
            ..SimOptions::default()
        };
        sims.push(crate::sim_prompter::spawn_sim(opts).await?);
    }
    let mut toml = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\n[model]\ndir = {model:?}\n[media]\nallow_cidrs = [\"127.0.0.0/8\"]\n"
    );
    for s in &sims {
        toml.push_str(&format!("[[workers]]\nname = {:?}\nurl = {:?}\n", s.name(), s.url()));
    }
    let cfg = Config::parse(&toml)?;
    let listener = tokio::net::TcpListener::bind(&cfg.server.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on 127.0.0.1:{port}: {e} (pick another with --port)"))?;
    let addr = listener.local_addr()?;
    println!("mmrouter demo: proxy on http://{addr} with {workers} simulated workers ({model})");
    for s in &sims {
        println!("  worker {} at {}", s.name(), s.url());
    }
    println!("try:\n  curl -s http://{addr}/v1/chat/completions -H 'content-type: application/json' \\\n    -d '{{\"model\":\"Qwen/Qwen3-VL-8B-Instruct\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}]}}'");
    println!("metrics: curl -s http://{addr}/metrics   (Ctrl-C to stop)");
    crate::server::serve(cfg, listener, shutdown).await?;
    for s in sims {
        s.shutdown().await;
    }
    Ok(())
}
