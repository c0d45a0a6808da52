//! The workers' own KV-cache events, turning the router's guess about each worker's cache into
//! knowledge: one ZMQ subscription per worker and data-parallel rank (`mmrouter-kv-events` follows the
//! publisher: sequence numbers, replay of gaps, restarts, reconnects), each batch turned into router
//! keys by `mmrouter_core::routing::events::WorkerEvents` and applied to the pool's index. A restart or
//! an unrecoverable gap clears what the index believed of that worker. Endpoints come from
//! [`super::discovery`].
//!
//! Everything a worker sends here is untrusted input: the feeds enforce `[kv_events]`'s message and
//! replay bounds before allocating, and what is refused is counted by reason ([`WorkerFeeds::refused`]).
//! Feeds, decoding and index updates run on a runtime of their own ([`runtime`]), so none of it costs a
//! request or `/health` latency. A feed holds its pool's router weakly and records into the observer:
//! it knows nothing else of the router's state.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

use mmrouter_core::routing::events::{EventCounts, RankMap, WorkerEvents};
use mmrouter_core::routing::{Router, Worker};
use mmrouter_kv_events::{spawn_feed, FeedEvent, FeedHandle, FeedStats, ResetReason};

use super::discovery::{resolve, Refusals};
use crate::config::{KvEventsSection, WorkerSettings};
use crate::observe::{FeedSample, Observer, CLUSTER_RESUME_FALLBACKS_TOTAL};

/// Most engine block hashes one worker's event state tracks (a GPU holds far fewer blocks); beyond it
/// the worker's state is reset rather than grow. Never more than the worker's share of its pool's index
/// (`routing.index_worker_share`): [`tracked_blocks`] takes the smaller.
const MAX_TRACKED_BLOCKS: usize = 4_000_000;
/// A batch older than this (a day) carries a wrong clock, not a lag worth a histogram sample.
const MAX_PLAUSIBLE_LAG_SECS: f64 = 86_400.0;

/// What every feed is given: the observer it records lag into and the bounds on what a publisher may send.
#[derive(Clone)]
pub struct FeedEnv {
    pub observe: Arc<Observer>,
    pub limits: KvEventsSection,
}

/// The blocks one worker's event state may track in a pool routed by `router`.
pub fn tracked_blocks(router: &Router) -> usize {
    MAX_TRACKED_BLOCKS.min(router.worker_share())
}

/// One worker's feeds and event state. Lives with its worker (its pool keeps it by worker id from
/// the worker's addition to its removal); [`WorkerFeeds::stop`] ends its tasks.
pub struct WorkerFeeds {
    /// The worker's pool's router (weak: the pool owns its feeds; a reload may replace it), and the
    /// worker's id there.
    router: Weak<Router>,
    worker: usize,
    /// The worker itself: while a feed task may still write for `worker`, that id cannot be given to
    /// another worker (see `mmrouter_core::routing::Router`).
    held: Arc<Worker>,
    /// The event state and, per rank, the last seq applied to it and to the index (a snapshot reads
    /// both at once: the seq a peer resumes from is exactly what the state reflects).
    ingest: Arc<Mutex<Ingest>>,
    /// Where a bootstrapping replica's feeds stand (see [`WorkerFeeds::resume`]).
    sync: Mutex<SyncState>,
    /// `None` once stopped: a resolution finishing later starts nothing.
    handles: Mutex<Option<Vec<FeedHandle>>>,
    /// The task resolving the endpoints (discovery retries until the worker answers).
    resolver: Mutex<Option<tokio::task::AbortHandle>>,
    /// Discovery documents refused, by reason (the feeds count what they refuse themselves).
    discovery_refused: Arc<Refusals>,
}

/// One worker's event state and the seq per rank it reflects.
struct Ingest {
    events: WorkerEvents,
    applied: BTreeMap<u32, u64>,
}

/// A bootstrapping replica's feeds: held until [`WorkerFeeds::resume`] gives each rank its seq, then
/// synced rank by rank.
#[derive(Default)]
struct SyncState {
    /// Feeds are started holding their live batches (a graft is coming).
    hold: bool,
    /// The resume points, once known (`None` per rank: replay from 0).
    resume: Option<BTreeMap<u32, u64>>,
    synced: BTreeSet<u32>,
}

/// What a snapshot carries of one worker's event state: per rank, the seq it reflects and its engine
/// hash → router key map.
pub struct EventExport {
    pub seqs: Vec<(u32, u64)>,
    pub ranks: Vec<(u32, RankMap)>,
}

impl WorkerFeeds {
    /// The worker's event state as a peer replica needs it (a copy, taken under the state's lock).
    pub fn export(&self) -> EventExport {
        let ingest = self.ingest.lock().unwrap_or_else(|e| e.into_inner());
        EventExport { seqs: ingest.applied.iter().map(|(&r, &s)| (r, s)).collect(), ranks: ingest.events.export() }
    }

    /// Adds a peer's event state of `rank` (before [`WorkerFeeds::resume`]).
    pub fn graft(&self, rank: u32, entries: &[(u64, Option<u64>)]) {
        self.ingest.lock().unwrap_or_else(|e| e.into_inner()).events.graft(rank, entries);
    }

    /// Forgets a graft that could not be completed (the next peer's, or the engines' replay, follows).
    pub fn forget_graft(&self) {
        let mut ingest = self.ingest.lock().unwrap_or_else(|e| e.into_inner());
        ingest.events.reset();
        ingest.applied.clear();
    }

    /// The grafted state reflects each rank's events up to `seqs[rank]` (a rank missing: nothing, so it
    /// replays from 0): the held feeds replay from there and follow live; feeds resolved later start
    /// there. Each seq is a peer's word: the feed checks it against the engine, and one the engine
    /// refutes arrives as a `Reset` (`resume_ahead`, `resume_unreachable`), which drops the worker's
    /// grafted state and is counted. Only the first call counts.
    pub fn resume(&self, seqs: BTreeMap<u32, u64>) {
        {
            let mut sync = self.sync.lock().unwrap_or_else(|e| e.into_inner());
            if sync.resume.is_some() {
                return;
            }
            sync.resume = Some(seqs.clone());
        }
        {
            let mut ingest = self.ingest.lock().unwrap_or_else(|e| e.into_inner());
            ingest.applied = seqs.clone();
        }
        let handles = self.handles.lock().unwrap_or_else(|e| e.into_inner());
        for h in handles.iter().flatten() {
            h.resume(seqs.get(&h.config().dp_rank).copied());
        }
    }

    /// Every rank that can sync has: its resumed replay is over, or (once `grace_over`) its publisher
    /// is not connected (a worker that is down holds up nobody); `false` until the endpoints are
    /// resolved.
    pub fn settled(&self, grace_over: bool) -> bool {
        let handles = self.handles.lock().unwrap_or_else(|e| e.into_inner());
        let Some(handles) = handles.as_ref() else { return true }; // stopped
        let resolving =
            self.resolver.lock().unwrap_or_else(|e| e.into_inner()).as_ref().is_some_and(|t| !t.is_finished());
        if handles.is_empty() {
            return !resolving;
        }
        let sync = self.sync.lock().unwrap_or_else(|e| e.into_inner());
        handles.iter().all(|h| sync.synced.contains(&h.config().dp_rank) || (grace_over && !h.stats().connected))
    }

    /// Every rank's counters.
    fn stats(&self) -> Vec<FeedStats> {
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
    fn counts(&self) -> EventCounts {
        self.ingest.lock().unwrap_or_else(|e| e.into_inner()).events.counts()
    }

    /// What a scrape shows of these feeds.
    pub fn sample(&self) -> FeedSample {
        FeedSample { worker: self.held.clone(), counts: self.counts(), stats: self.stats(), refused: self.refused() }
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

/// Starts the feeds of worker `worker` of `router` if its settings name an event source (`None`
/// otherwise): one subscription per rank once the endpoints are resolved, each applied to the index by
/// its own task. `ingest` is the worker's event state (the pool's model, block size and vocabulary).
/// The caller keeps the returned feeds with the worker and stops them when the worker is removed.
/// With `hold`, the feeds hold their live batches until [`WorkerFeeds::resume`] (a bootstrapping
/// replica grafts a peer's state first).
pub fn start(
    env: &FeedEnv,
    (router, worker): (&Arc<Router>, usize),
    (ingest, hold): (WorkerEvents, bool),
    settings: &WorkerSettings,
) -> Option<Arc<WorkerFeeds>> {
    let source = settings.events.clone()?;
    let held = router.worker(worker);
    held.set_publishes_events(true);
    let feeds = Arc::new(WorkerFeeds {
        router: Arc::downgrade(router),
        worker,
        held,
        ingest: Arc::new(Mutex::new(Ingest { events: ingest, applied: BTreeMap::new() })),
        sync: Mutex::new(SyncState { hold, ..SyncState::default() }),
        handles: Mutex::new(Some(Vec::new())),
        resolver: Mutex::new(None),
        discovery_refused: Arc::default(),
    });
    let (env, refused) = (env.clone(), feeds.discovery_refused.clone());
    let (weak, settings) = (Arc::downgrade(&feeds), settings.clone());
    // On the feeds' own runtime: what `follow` and the feeds spawn from here runs there too.
    let task = runtime().spawn(async move {
        let Some(configs) = resolve(&settings, source, &env.limits, &refused).await else { return };
        // Stopped (or dropped) meanwhile: start nothing.
        let Some(feeds) = weak.upgrade() else { return };
        let mut handles = feeds.handles.lock().unwrap_or_else(|e| e.into_inner());
        let Some(handles) = handles.as_mut() else { return };
        let (hold, resume) = {
            let sync = feeds.sync.lock().unwrap_or_else(|e| e.into_inner());
            (sync.hold, sync.resume.clone())
        };
        for mut cfg in configs {
            cfg.hold_until_resumed = hold;
            let rank = cfg.dp_rank;
            match spawn_feed(cfg) {
                Ok((handle, rx)) => {
                    // Resumed before this rank was resolved: it starts where the graft stands.
                    if let Some(seqs) = &resume {
                        handle.resume(seqs.get(&rank).copied());
                    }
                    handles.push(handle);
                    tokio::spawn(follow(env.observe.clone(), feeds.clone(), (rank, rx)));
                }
                Err(e) => tracing::error!(worker = %settings.spec.name, "kv events: {e}"),
            }
        }
    });
    *feeds.resolver.lock().unwrap_or_else(|e| e.into_inner()) = Some(task.abort_handle());
    Some(feeds)
}

/// Applies one rank's events to the index until the feed or its pool goes away.
async fn follow(
    observe: Arc<Observer>,
    feeds: Arc<WorkerFeeds>,
    (rank, mut rx): (u32, tokio::sync::mpsc::Receiver<FeedEvent>),
) {
    while let Some(event) = rx.recv().await {
        let Some(router) = feeds.router.upgrade() else { return };
        if feeds.held.is_removed() {
            return; // stopped: what was still queued must not enter the index
        }
        let w = feeds.worker;
        match event {
            FeedEvent::Batch { batch, seq, .. } => {
                if let Some(lag) = lag(batch.ts) {
                    observe.event_lag(feeds.held.name(), lag);
                }
                // The index is written under the state's lock, so a snapshot's seq matches both.
                let mut ingest = feeds.ingest.lock().unwrap_or_else(|e| e.into_inner());
                let ops = ingest.events.apply(&batch);
                ingest.applied.insert(rank, seq);
                if ops.cleared {
                    router.clear_worker(w);
                }
                router.remove_events(w, &ops.removed);
                router.store_events(w, &ops.stored);
                // An engine removes blocks only to make room: the cache is full at `held`.
                let held = ingest.events.held() as u64;
                router.worker(w).report_cache(held, !ops.removed.is_empty() && !ops.cleared);
            }
            // Logged (rate-limited) by the feed itself.
            FeedEvent::Reset { reason } => {
                if matches!(reason, ResetReason::ResumeAhead | ResetReason::ResumeUnreachable) {
                    // A peer's snapshot said where this rank stood and its engine disagrees: the
                    // grafted state goes with the reset below, and the engine's ring follows.
                    observe.cluster_count(CLUSTER_RESUME_FALLBACKS_TOTAL, ("reason", reason.label()), 1);
                    tracing::warn!(worker = %feeds.held.name(), rank, reason = reason.label(),
                        "cluster: the engine refuted a snapshot's resume point; its grafted state is dropped");
                }
                let mut ingest = feeds.ingest.lock().unwrap_or_else(|e| e.into_inner());
                ingest.events.reset();
                ingest.applied.clear();
                router.clear_worker(w);
                router.worker(w).report_cache(0, false);
            }
            FeedEvent::Synced => {
                feeds.sync.lock().unwrap_or_else(|e| e.into_inner()).synced.insert(rank);
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
fn runtime() -> &'static tokio::runtime::Handle {
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
