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
use mmrouter_core::routing::{Engine, Worker};
use mmrouter_kv_events::discovery::{parse_sglang_server_info, parse_vllm_kv_event_sources};
use mmrouter_kv_events::{spawn_feed, FeedConfig, FeedEvent, FeedHandle, FeedStats};

use crate::config::{EventSource, WorkerSettings};
use crate::state::{AppState, Pool};

/// Most engine block hashes one worker's event state tracks (a GPU holds far fewer blocks); beyond it
/// the worker's state is reset rather than grow. Never more than the worker's share of its pool's index
/// (`routing.index_worker_share`): [`start`] takes the smaller.
const MAX_TRACKED_BLOCKS: usize = 4_000_000;
/// Between discovery attempts while a worker does not answer yet.
const DISCOVERY_RETRY: Duration = Duration::from_secs(2);

/// One worker's feeds and event state. Lives with its worker (its pool keeps it by worker id from
/// the worker's addition to its removal); [`WorkerFeeds::stop`] ends its tasks.
pub struct WorkerFeeds {
    /// The worker's pool (weak: the pool owns its feeds; a reload may replace it), and its index there.
    pub pool: std::sync::Weak<Pool>,
    pub worker: usize,
    /// The worker itself: while a feed task may still write for `worker`, that id cannot be given to
    /// another worker (see `mmrouter_core::routing::Router`).
    held: Arc<Worker>,
    ingest: Arc<Mutex<WorkerEvents>>,
    /// `None` once stopped: a resolution finishing later starts nothing.
    handles: Mutex<Option<Vec<FeedHandle>>>,
    /// The task resolving the endpoints (discovery retries until the worker answers).
    resolver: Mutex<Option<tokio::task::AbortHandle>>,
}

impl WorkerFeeds {
    /// Every rank's counters (for `/metrics`).
    pub fn stats(&self) -> Vec<FeedStats> {
        let handles = self.handles.lock().unwrap_or_else(|e| e.into_inner());
        handles.iter().flatten().map(FeedHandle::stats).collect()
    }

    /// What the event state counted (stores, removals, orphans, …).
    pub fn counts(&self) -> mmrouter_core::routing::events::EventCounts {
        self.ingest.lock().unwrap_or_else(|e| e.into_inner()).counts()
    }

    /// The worker these feeds follow.
    pub fn worker_ref(&self) -> &Arc<Worker> {
        &self.held
    }

    /// Stops every feed: the resolution is aborted and the subscriptions dropped (dropping a
    /// `FeedHandle` ends its task, so each rank's channel closes and its applying task ends once it
    /// has drained what was already received). Idempotent.
    pub fn stop(&self) {
        if let Some(task) = self.resolver.lock().unwrap_or_else(|e| e.into_inner()).take() {
            task.abort();
        }
        let handles = self.handles.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(handles);
        self.held.set_publishes_events(false);
    }
}

/// Starts the feeds of worker `worker` of `pool` if its settings name an event source (`None`
/// otherwise): one subscription per rank once the endpoints are resolved, each applied to the pool's
/// index by its own task. The caller keeps the returned feeds with the worker and stops them when
/// the worker is removed.
pub fn start(
    st: &Arc<AppState>,
    pool: &Arc<Pool>,
    worker: usize,
    settings: &WorkerSettings,
) -> Option<Arc<WorkerFeeds>> {
    let source = settings.events.clone()?;
    let pipeline = &pool.pipeline;
    let bound = MAX_TRACKED_BLOCKS.min(pool.router.worker_share());
    let ingest =
        WorkerEvents::new(pipeline.model_name(), pipeline.block_size(), bound).with_vocab(pipeline.vocab_size());
    let held = pool.router.worker(worker);
    held.set_publishes_events(true);
    let feeds = Arc::new(WorkerFeeds {
        pool: Arc::downgrade(pool),
        worker,
        held,
        ingest: Arc::new(Mutex::new(ingest)),
        handles: Mutex::new(Some(Vec::new())),
        resolver: Mutex::new(None),
    });
    let (st, weak, settings) = (Arc::downgrade(st), Arc::downgrade(&feeds), settings.clone());
    let task = tokio::spawn(async move {
        let Some(configs) = resolve(&settings, source).await else { return };
        // Stopped (or dropped) meanwhile: start nothing.
        let Some(feeds) = weak.upgrade() else { return };
        let mut handles = feeds.handles.lock().unwrap_or_else(|e| e.into_inner());
        let Some(handles) = handles.as_mut() else { return };
        for cfg in configs {
            match spawn_feed(cfg) {
                Ok((handle, rx)) => {
                    handles.push(handle);
                    tokio::spawn(follow(st.clone(), feeds.clone(), rx));
                }
                Err(e) => tracing::error!(worker = %settings.spec.name, "kv events: {e}"),
            }
        }
    });
    *feeds.resolver.lock().unwrap_or_else(|e| e.into_inner()) = Some(task.abort_handle());
    Some(feeds)
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
