//! The workers' own KV-cache events, turning the router's guess about each worker's cache into
//! knowledge: one ZMQ subscription per worker and data-parallel rank (`mmrouter-kv-events` follows the
//! publisher: sequence numbers, replay of gaps, restarts, reconnects), each batch turned into router
//! keys by `mmrouter_core::routing::events::WorkerEvents` and applied to the pool's index. A restart or
//! an unrecoverable gap clears what the index believed of that worker.
//!
//! Endpoints come from `[[workers]] kv_events` or, with `kv_events = "discover"`, from the worker
//! itself (vLLM `GET /kv_event_sources`, SGLang `GET /server_info`), retried until it answers.
//!
//! Everything a worker sends here is untrusted input (issue 20): the feeds enforce `[kv_events]`'s
//! message and replay bounds before allocating, a discovery document is read up to
//! `discovery_max_bytes` without redirects and must name few ranks on the worker's own host, and what
//! is refused is counted by reason ([`WorkerFeeds::refused`]). Feeds, decoding and index updates run on
//! a runtime of their own ([`runtime`]), so none of it costs a request or `/health` latency.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mmrouter_core::routing::events::WorkerEvents;
use mmrouter_core::routing::{Engine, Worker};
use mmrouter_kv_events::discovery::{parse_sglang_server_info, parse_vllm_kv_event_sources, DiscoveryError};
use mmrouter_kv_events::{spawn_feed, FeedConfig, FeedEvent, FeedHandle, FeedStats};

use crate::config::{EventSource, KvEventsSection, WorkerSettings};
use crate::state::{AppState, Pool};

/// Most engine block hashes one worker's event state tracks (a GPU holds far fewer blocks); beyond it
/// the worker's state is reset rather than grow. Never more than the worker's share of its pool's index
/// (`routing.index_worker_share`): [`start`] takes the smaller.
const MAX_TRACKED_BLOCKS: usize = 4_000_000;
/// Between discovery attempts while a worker does not answer yet, doubling up to the max.
const DISCOVERY_RETRY: Duration = Duration::from_secs(2);
const DISCOVERY_RETRY_MAX: Duration = Duration::from_secs(60);
/// One discovery request, whole.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(5);
/// A batch older than this (a day) carries a wrong clock, not a lag worth a histogram sample.
const MAX_PLAUSIBLE_LAG_SECS: f64 = 86_400.0;

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
    /// Discovery documents refused, by reason (the feeds count what they refuse themselves).
    discovery_refused: Arc<Refusals>,
}

impl WorkerFeeds {
    /// Every rank's counters (for `/metrics`).
    pub fn stats(&self) -> Vec<FeedStats> {
        let handles = self.handles.lock().unwrap_or_else(|e| e.into_inner());
        handles.iter().flatten().map(FeedHandle::stats).collect()
    }

    /// What was refused from this worker, by reason, all ranks together: protocol violations and
    /// malformed messages (the feeds' counts), inconsistent events and state overflows (the event
    /// state's), discovery documents (`discovery_<reason>`).
    pub fn refused(&self) -> Vec<(String, u64)> {
        let mut out: std::collections::BTreeMap<String, u64> = Default::default();
        for stats in self.stats() {
            for (reason, n) in stats.protocol_violations_by_reason.iter().chain(&stats.malformed_by_reason) {
                *out.entry((*reason).to_owned()).or_default() += n;
            }
        }
        let counts = self.counts();
        for (reason, n) in [("inconsistent_event", counts.malformed), ("state_overflow", counts.overflows)] {
            *out.entry(reason.to_owned()).or_default() += n;
        }
        for (reason, n) in self.discovery_refused.snapshot() {
            *out.entry(format!("discovery_{reason}")).or_default() += n;
        }
        out.into_iter().filter(|(_, n)| *n > 0).collect()
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
        discovery_refused: Arc::default(),
    });
    let limits = st.kv_events.clone();
    let refused = feeds.discovery_refused.clone();
    let (st, weak, settings) = (Arc::downgrade(st), Arc::downgrade(&feeds), settings.clone());
    // On the feeds' own runtime: what `follow` and the feeds spawn from here runs there too.
    let task = runtime().spawn(async move {
        let Some(configs) = resolve(&settings, source, &limits, &refused).await else { return };
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
async fn resolve(
    settings: &WorkerSettings,
    source: EventSource,
    limits: &KvEventsSection,
    refused: &Refusals,
) -> Option<Vec<FeedConfig>> {
    let configs = match source {
        EventSource::Endpoints { endpoint, replay, topic, data_parallel_size } => {
            let mut base = FeedConfig::new(endpoint).with_topic(topic);
            if let Some(replay) = replay {
                base = base.with_replay_endpoint(replay);
            }
            match base.expand_data_parallel(data_parallel_size) {
                Ok(configs) => configs,
                Err(e) => {
                    tracing::error!(worker = %settings.spec.name, "kv events: {e}");
                    return None;
                }
            }
        }
        EventSource::Discover => discover(settings, limits, refused).await,
    };
    Some(configs.into_iter().map(|cfg| bounded(cfg, limits)).collect())
}

/// A feed configuration with the operator's bounds on what a publisher may send.
fn bounded(mut cfg: FeedConfig, limits: &KvEventsSection) -> FeedConfig {
    cfg.max_message_bytes = limits.max_message_bytes;
    cfg.max_replay_buffer_bytes = limits.max_replay_buffer_bytes;
    cfg
}

/// Asks the worker where it publishes, until it answers with a usable document. A refused document
/// (too large, too many ranks, a foreign host, not the documented shape) is counted and retried with a
/// growing delay: the worker may be starting, or hostile, and is not asked more often than that.
async fn discover(settings: &WorkerSettings, limits: &KvEventsSection, refused: &Refusals) -> Vec<FeedConfig> {
    let spec = &settings.spec;
    let host = url::Url::parse(&spec.url).ok().and_then(|u| u.host_str().map(str::to_owned)).unwrap_or_default();
    let base = spec.url.trim_end_matches('/');
    // No redirects: a worker's answer must come from the worker.
    let client = mmrouter_core::http_client_builder()
        .timeout(DISCOVERY_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build();
    let mut delay = DISCOVERY_RETRY;
    loop {
        let answer = match &client {
            Ok(c) => discover_once(c, spec.engine, base, &host, limits).await,
            Err(e) => Err(DiscoveryFailure::Fetch(e.to_string())),
        };
        match answer {
            Ok(configs) if !configs.is_empty() => return configs,
            Ok(_) => tracing::warn!(worker = %spec.name, "kv events discovery: no publisher; retrying"),
            Err(e) => {
                refused.count(e.label());
                tracing::warn!(worker = %spec.name, reason = e.label(), "kv events discovery failed ({e}); retrying in {delay:?}")
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(DISCOVERY_RETRY_MAX);
    }
}

/// Counts of refused input by reason.
#[derive(Debug, Default)]
struct Refusals(Mutex<std::collections::BTreeMap<&'static str, u64>>);

impl Refusals {
    fn count(&self, reason: &'static str) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()).entry(reason).or_default() += 1;
    }

    fn snapshot(&self) -> Vec<(&'static str, u64)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(k, v)| (*k, *v)).collect()
    }
}

/// Why one discovery attempt gave nothing usable.
#[derive(Debug, thiserror::Error)]
enum DiscoveryFailure {
    #[error("{0}")]
    Fetch(String),
    #[error("document over {0} bytes")]
    TooLarge(usize),
    #[error(transparent)]
    Refused(#[from] DiscoveryError),
    #[error("no kv_events in /server_info")]
    NotPublishing,
}

impl DiscoveryFailure {
    fn label(&self) -> &'static str {
        match self {
            DiscoveryFailure::Fetch(_) => "fetch",
            DiscoveryFailure::TooLarge(_) => "too_large",
            DiscoveryFailure::Refused(e) => e.label(),
            DiscoveryFailure::NotPublishing => "not_publishing",
        }
    }
}

async fn discover_once(
    client: &reqwest::Client,
    engine: Engine,
    base: &str,
    host: &str,
    limits: &KvEventsSection,
) -> Result<Vec<FeedConfig>, DiscoveryFailure> {
    let allow = &limits.discovery_allow_hosts;
    let max = limits.discovery_max_bytes;
    match engine {
        Engine::Vllm => {
            let body = get_bounded(client, &format!("{base}/kv_event_sources"), max).await?;
            Ok(parse_vllm_kv_event_sources(&body, host, allow)?)
        }
        Engine::Sglang => {
            let body = get_bounded(client, &format!("{base}/server_info"), max).await?;
            let found = parse_sglang_server_info(&body, host, allow)?;
            found.map(|k| k.feeds).ok_or(DiscoveryFailure::NotPublishing)
        }
    }
}

/// A GET whose body is read only up to `max` bytes: a worker's document is untrusted input.
async fn get_bounded(client: &reqwest::Client, url: &str, max: usize) -> Result<Vec<u8>, DiscoveryFailure> {
    let fetch = |e: reqwest::Error| DiscoveryFailure::Fetch(e.to_string());
    let mut resp = client.get(url).send().await.map_err(fetch)?;
    if !resp.status().is_success() {
        return Err(DiscoveryFailure::Fetch(format!("HTTP {}", resp.status())));
    }
    if resp.content_length().is_some_and(|n| n > max as u64) {
        return Err(DiscoveryFailure::TooLarge(max));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(fetch)? {
        if body.len() + chunk.len() > max {
            return Err(DiscoveryFailure::TooLarge(max));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Applies one rank's events to the index until the feed or the proxy goes away.
async fn follow(
    st: std::sync::Weak<AppState>,
    feeds: Arc<WorkerFeeds>,
    mut rx: tokio::sync::mpsc::Receiver<FeedEvent>,
) {
    while let Some(event) = rx.recv().await {
        let (Some(st), Some(pool)) = (st.upgrade(), feeds.pool.upgrade()) else { return };
        if feeds.worker_ref().is_removed() {
            return; // stopped: what was still queued must not enter the index
        }
        let (router, w) = (&pool.router, feeds.worker);
        match event {
            FeedEvent::Batch { batch, .. } => {
                if let Some(lag) = lag(batch.ts) {
                    st.observe.event_lag(router.worker(w).name(), lag);
                }
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
            // Logged (rate-limited) by the feed itself.
            FeedEvent::Reset { .. } => {
                feeds.ingest.lock().unwrap_or_else(|e| e.into_inner()).reset();
                router.clear_worker(w);
                router.worker(w).report_cache(0, false);
            }
            // Counted and logged (rate-limited) by the feed itself.
            FeedEvent::Malformed { .. } => {}
        }
    }
}

/// Seconds from the batch's engine timestamp to now, when the timestamp is a usable one: clock skew can
/// make it negative (clamped); a timestamp that is not finite or far from now says nothing.
fn lag(ts: f64) -> Option<f64> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?.as_secs_f64();
    let lag = (now - ts).max(0.0);
    (ts.is_finite() && lag <= MAX_PLAUSIBLE_LAG_SECS).then_some(lag)
}

/// The runtime every feed runs on: their sockets, the decoding of batches and the index updates stay
/// off the request runtime, so a large or hostile batch costs `/health` and chats no latency. One
/// worker thread: feeds are I/O-bound and few; a burst waits there, not in front of requests.
pub(crate) fn runtime() -> &'static tokio::runtime::Handle {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("kv-events")
            .enable_all()
            .build()
            .expect("the kv-events runtime starts")
    })
    .handle()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_only_from_usable_timestamps() {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
        assert!(lag(now - 0.5).is_some_and(|l| (0.4..2.0).contains(&l)));
        assert_eq!(lag(now + 10.0), Some(0.0), "clock skew clamps to 0");
        for ts in [f64::NEG_INFINITY, f64::INFINITY, f64::NAN, 0.0, -1e300] {
            assert_eq!(lag(ts), None, "{ts}");
        }
    }
}
