//! The workers' own KV-cache events, turning the router's guess about each worker's cache into
//! knowledge: one ZMQ subscription per worker and data-parallel rank (`mmrouter-kv-events` follows the
//! publisher: sequence numbers, replay of gaps, restarts, reconnects), each batch turned into router
//! keys by `mmrouter_core::routing::events::WorkerEvents` and applied to the pool's index. A restart or
//! an unrecoverable gap clears what the index believed of that worker.
//!
//! Endpoints come from `[[workers]] kv_events` or, with `kv_events = "discover"`, from the worker
//! itself (vLLM `GET /kv_event_sources`, SGLang `GET /server_info`), retried until it answers.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mmrouter_core::routing::events::WorkerEvents;
use mmrouter_core::routing::Engine;
use mmrouter_kv_events::discovery::{parse_sglang_server_info, parse_vllm_kv_event_sources};
use mmrouter_kv_events::{spawn_feed, FeedConfig, FeedEvent, FeedHandle, FeedStats};

use crate::config::{EventSource, WorkerSettings};
use crate::state::{AppState, Pool};

/// Most engine block hashes one worker's event state tracks (a GPU holds far fewer blocks); beyond it
/// the worker's state is reset rather than grow.
const MAX_TRACKED_BLOCKS: usize = 4_000_000;
/// Between discovery attempts while a worker does not answer yet.
const DISCOVERY_RETRY: Duration = Duration::from_secs(2);

/// One worker's feeds and event state.
pub struct WorkerFeeds {
    /// The worker's pool (weak: the pool owns its feeds; a reload may replace it), and its index there.
    pub pool: std::sync::Weak<Pool>,
    pub worker: usize,
    ingest: Arc<Mutex<WorkerEvents>>,
    handles: Mutex<Vec<FeedHandle>>,
}

impl WorkerFeeds {
    /// Every rank's counters (for `/metrics`).
    pub fn stats(&self) -> Vec<FeedStats> {
        self.handles.lock().unwrap_or_else(|e| e.into_inner()).iter().map(FeedHandle::stats).collect()
    }

    /// What the event state counted (stores, removals, orphans, …).
    pub fn counts(&self) -> mmrouter_core::routing::events::EventCounts {
        self.ingest.lock().unwrap_or_else(|e| e.into_inner()).counts()
    }
}

/// Starts the feeds of every worker that publishes events; the returned list lives in the state.
pub fn start(st: &Arc<AppState>, pool: &Arc<Pool>, workers: &[WorkerSettings]) -> Vec<Arc<WorkerFeeds>> {
    let pipeline = &pool.pipeline;
    let model = pipeline.model_name().to_owned();
    let block_size = pipeline.block_size();
    let vocab = pipeline.vocab_size();
    let mut out = Vec::new();
    for (w, settings) in workers.iter().enumerate() {
        let Some(source) = settings.events.clone() else { continue };
        pool.router.worker(w).set_publishes_events(true);
        let feeds = Arc::new(WorkerFeeds {
            pool: Arc::downgrade(pool),
            worker: w,
            ingest: Arc::new(Mutex::new(WorkerEvents::new(&model, block_size, MAX_TRACKED_BLOCKS).with_vocab(vocab))),
            handles: Mutex::new(Vec::new()),
        });
        let (st, feeds2, settings) = (Arc::downgrade(st), feeds.clone(), settings.clone());
        tokio::spawn(async move {
            let Some(configs) = resolve(&settings, source).await else { return };
            for cfg in configs {
                match spawn_feed(cfg) {
                    Ok((handle, rx)) => {
                        feeds2.handles.lock().unwrap_or_else(|e| e.into_inner()).push(handle);
                        tokio::spawn(follow(st.clone(), feeds2.clone(), rx));
                    }
                    Err(e) => tracing::error!(worker = %settings.spec.name, "kv events: {e}"),
                }
            }
        });
        out.push(feeds);
    }
    out
}

/// The publishers of one worker: configured (one per data-parallel rank) or discovered.
async fn resolve(settings: &WorkerSettings, source: EventSource) -> Option<Vec<FeedConfig>> {
    match source {
        EventSource::Endpoints { endpoint, replay, topic, data_parallel_size } => {
            let mut base = FeedConfig::new(endpoint).with_topic(topic);
            if let Some(replay) = replay {
                base = base.with_replay_endpoint(replay);
            }
            match base.expand_data_parallel(data_parallel_size) {
                Ok(configs) => Some(configs),
                Err(e) => {
                    tracing::error!(worker = %settings.spec.name, "kv events: {e}");
                    None
                }
            }
        }
        EventSource::Discover => Some(discover(settings).await),
    }
}

/// Asks the worker where it publishes, until it answers.
async fn discover(settings: &WorkerSettings) -> Vec<FeedConfig> {
    let spec = &settings.spec;
    let host = url::Url::parse(&spec.url).ok().and_then(|u| u.host_str().map(str::to_owned)).unwrap_or_default();
    let base = spec.url.trim_end_matches('/');
    let client = mmrouter_core::http_client_builder().timeout(Duration::from_secs(5)).build();
    loop {
        let answer = match &client {
            Ok(c) => match spec.engine {
                Engine::Vllm => get(c, &format!("{base}/kv_event_sources"))
                    .await
                    .and_then(|b| parse_vllm_kv_event_sources(&b, &host).map_err(|e| e.to_string())),
                Engine::Sglang => get(c, &format!("{base}/server_info")).await.and_then(|b| {
                    parse_sglang_server_info(&b, &host)
                        .map_err(|e| e.to_string())
                        .and_then(|k| k.map(|k| k.feeds).ok_or_else(|| "no kv_events in /server_info".into()))
                }),
            },
            Err(e) => Err(e.to_string()),
        };
        match answer {
            Ok(configs) if !configs.is_empty() => return configs,
            Ok(_) => tracing::warn!(worker = %spec.name, "kv events discovery: no publisher; retrying"),
            Err(e) => tracing::warn!(worker = %spec.name, "kv events discovery failed ({e}); retrying"),
        }
        tokio::time::sleep(DISCOVERY_RETRY).await;
    }
}

async fn get(client: &reqwest::Client, url: &str) -> Result<Vec<u8>, String> {
    let resp = client.get(url).send().await.map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("HTTP {}", resp.status()));
    }
    resp.bytes().await.map(|b| b.to_vec()).map_err(|e| e.to_string())
}

/// Applies one rank's events to the index until the feed or the proxy goes away.
async fn follow(
    st: std::sync::Weak<AppState>,
    feeds: Arc<WorkerFeeds>,
    mut rx: tokio::sync::mpsc::Receiver<FeedEvent>,
) {
    while let Some(event) = rx.recv().await {
        let (Some(st), Some(pool)) = (st.upgrade(), feeds.pool.upgrade()) else { return };
        let (router, w) = (&pool.router, feeds.worker);
        match event {
            FeedEvent::Batch { batch, .. } => {
                st.observe.event_lag(router.worker(w).name(), lag(batch.ts));
                let (ops, held) = {
                    let mut ingest = feeds.ingest.lock().unwrap_or_else(|e| e.into_inner());
                    let ops = ingest.apply(&batch);
                    (ops, ingest.held())
                };
                if ops.cleared {
                    router.clear_worker(w);
                }
                router.remove_events(w, &ops.removed);
                router.store_events(w, &ops.stored);
                // An engine removes blocks only to make room: the cache is full at `held`.
                router.worker(w).report_cache(held as u64, !ops.removed.is_empty() && !ops.cleared);
            }
            FeedEvent::Reset { reason } => {
                tracing::warn!(worker = %router.worker(w).name(), reason = reason.label(), "kv events: state reset");
                feeds.ingest.lock().unwrap_or_else(|e| e.into_inner()).reset();
                router.clear_worker(w);
                router.worker(w).report_cache(0, false);
            }
            FeedEvent::Malformed { error, .. } => {
                tracing::debug!(worker = %router.worker(w).name(), "kv events: malformed frame skipped ({})", error.label());
            }
        }
    }
}

/// Seconds from the batch's engine timestamp to now (clock skew can make it negative: clamped).
fn lag(ts: f64) -> f64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    (now - ts).max(0.0)
}
