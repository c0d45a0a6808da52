//! Active health checks, one worker independent of another: a worker whose `/health` never answers
//! costs its own check's timeout and does not delay marking another worker down.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mmrouter_core::routing::Availability;
use tokio::sync::Notify;

use crate::harness::*;

/// A fake worker whose `/health` answers 200 while `healthy` holds (503 after), and says when it was
/// asked; everything else is 404.
async fn victim(healthy: Arc<AtomicBool>, asked: Arc<Notify>) -> String {
    let app = axum::Router::new().route(
        "/health",
        axum::routing::get(move || {
            let (healthy, asked) = (healthy.clone(), asked.clone());
            async move {
                let status = if healthy.load(Ordering::SeqCst) { 200 } else { 503 };
                asked.notify_one();
                axum::http::StatusCode::from_u16(status).unwrap()
            }
        }),
    );
    serve(app).await
}

/// A fake worker whose `/health` never answers.
async fn hanging() -> String {
    let app = axum::Router::new().route("/health", axum::routing::get(std::future::pending::<()>));
    serve(app).await
}

async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_worker_does_not_delay_marking_another_down() {
    let (healthy, asked) = (Arc::new(AtomicBool::new(true)), Arc::new(Notify::new()));
    let (slow, good) = (hanging().await, victim(healthy.clone(), asked.clone()).await);
    // Every second; each check may take that long (the hanging worker's always does).
    let toml = format!(
        "[server]\nhealth_interval_ms = 1000\n\
         [[workers]]\nname = \"hanging\"\nurl = {slow:?}\n[[workers]]\nname = \"victim\"\nurl = {good:?}\n"
    );
    let c = proxy(Vec::new(), &toml).await;
    let pool = c.state.pools.list()[0].clone();
    let id = pool.router.find("victim").expect("the victim is a worker");
    // Past the first round, and just after one of the victim's checks: the next is a round away.
    for _ in 0..2 {
        tokio::time::timeout(Duration::from_secs(5), asked.notified()).await.expect("the victim is checked");
    }
    healthy.store(false, Ordering::SeqCst);
    let failed_at = Instant::now();
    while pool.router.worker(id).availability() != Availability::Down {
        assert!(failed_at.elapsed() < Duration::from_secs(10), "the victim was never marked down");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Its next check comes a round (1 s) later and answers at once. Waiting on the hanging worker's
    // check as well would add that check's timeout (another second).
    let took = failed_at.elapsed();
    eprintln!("the victim was marked down {took:?} after it failed");
    assert!(took < Duration::from_millis(1600), "marked down {took:?} after it failed");
    let hung = pool.router.find("hanging").expect("a worker");
    assert_eq!(pool.router.worker(hung).availability(), Availability::Down, "its checks time out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_engine_counters_are_refused_and_counted_not_mirrored() {
    // A vLLM worker whose page says it looked up 1.8·10^19 images.
    let page = "vllm:mm_cache_queries_total{engine=\"0\"} 1.8e19\nvllm:mm_cache_hits_total{engine=\"0\"} 3.0\n";
    let app = axum::Router::new()
        .route("/health", axum::routing::get(|| async { "ok" }))
        .route("/metrics", axum::routing::get(move || async move { page }));
    let url = serve(app).await;
    let toml = format!("[server]\nhealth_interval_ms = 200\n[[workers]]\nname = \"liar\"\nurl = {url:?}\n");
    let c = proxy(Vec::new(), &toml).await;
    let refused = "worker=\"liar\",reason=\"implausible\"";
    let started = Instant::now();
    let text = loop {
        let text = metrics_text(&c.url).await;
        if metric(&text, "mmrouter_worker_engine_counters_refused_total", refused) > 0.0 {
            break text;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "never refused:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(!text.contains("mmrouter_worker_engine_mm_cache_queries_total{"), "mirrored:\n{text}");
    assert!(!text.contains("mmrouter_worker_engine_mm_cache_hits_total{"), "mirrored:\n{text}");
}
