//! `mmrouter demo`: simulated workers and the proxy in one process, on a bundled model profile.

use mmrouter_core::model::{ModelSource, ModelSpec};
use mmrouter_core::routing::WorkerSpec;
use mmrouter_sim::SimOptions;

use crate::config::Settings;

pub async fn run(
    port: u16,
    workers: usize,
    model: &str,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    if workers == 0 {
        anyhow::bail!("--workers must be at least 1");
    }
    let source = ModelSource::parse(model).map_err(|e| anyhow::anyhow!("--model: {e}"))?;
    let mut sims = Vec::new();
    for i in 0..workers {
        let opts = SimOptions {
            name: format!("sim-{i}"),
            model_dir: Some(model.to_owned()),
            seed: i as u64,
            ..SimOptions::default()
        };
        sims.push(mmrouter_sim::spawn_exact(opts).await?);
    }
    let specs = sims.iter().map(|s| WorkerSpec::new(s.name().to_owned(), s.url())).collect();
    let mut cfg = Settings::new(ModelSpec::new(source), specs);
    cfg.server.listen.set_port(port);
    // The demo's own clients may send images from a local web server.
    cfg.pipeline.media.allow_cidrs = vec!["127.0.0.0/8".to_owned()];
    let listener = tokio::net::TcpListener::bind(cfg.server.listen)
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
