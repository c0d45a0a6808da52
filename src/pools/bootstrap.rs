//! Whether this replica's view of the workers' caches is complete yet: a replica of a cluster starts
//! `Pending` (its feeds hold their live batches while it grafts a peer's snapshot, or replays the
//! engines' rings), and `/health` says not ready until it is `Complete` — or `Incomplete`, when the
//! bounded wait ran out and it serves with what it has. A lone router is `Off` and always ready.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Instant, SystemTime};

/// Where the bootstrap stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootstrapState {
    /// Not a cluster member: nothing to bootstrap.
    Off = 0,
    Pending = 1,
    Complete = 2,
    /// The wait (`cluster.bootstrap_timeout_ms`) ran out: serving with a partial view.
    Incomplete = 3,
}

impl BootstrapState {
    pub fn label(self) -> &'static str {
        match self {
            BootstrapState::Off => "off",
            BootstrapState::Pending => "pending",
            BootstrapState::Complete => "complete",
            BootstrapState::Incomplete => "incomplete",
        }
    }

    /// Whether the replica may report ready.
    pub fn ready(self) -> bool {
        self != BootstrapState::Pending
    }
}

/// The bootstrap's state, where it came from, and since when.
#[derive(Debug)]
pub struct Bootstrap {
    state: AtomicU8,
    detail: Mutex<Detail>,
}

#[derive(Debug, Clone)]
struct Detail {
    /// Where the state came from: a peer's base URL, or `"engines"` (their replay rings).
    source: Option<String>,
    /// When the grafted snapshot was taken (the peer's clock).
    snapshot_taken: Option<SystemTime>,
    started: Instant,
    finished: Option<Instant>,
}

impl Default for Bootstrap {
    fn default() -> Self {
        Bootstrap {
            state: AtomicU8::new(BootstrapState::Off as u8),
            detail: Mutex::new(Detail { source: None, snapshot_taken: None, started: Instant::now(), finished: None }),
        }
    }
}

impl Bootstrap {
    pub fn state(&self) -> BootstrapState {
        match self.state.load(Ordering::Acquire) {
            1 => BootstrapState::Pending,
            2 => BootstrapState::Complete,
            3 => BootstrapState::Incomplete,
            _ => BootstrapState::Off,
        }
    }

    /// A cluster member starts pending (before its feeds start, so they hold).
    pub fn begin(&self) {
        self.detail().started = Instant::now();
        self.state.store(BootstrapState::Pending as u8, Ordering::Release);
    }

    /// The graft came from `source`, a snapshot taken at `taken` (`None`: the engines' rings).
    pub fn grafted(&self, source: &str, taken: Option<SystemTime>) {
        let mut d = self.detail();
        (d.source, d.snapshot_taken) = (Some(source.to_owned()), taken);
    }

    /// The sync is over (`complete`), or the wait ran out.
    pub fn finish(&self, complete: bool) {
        self.detail().finished = Some(Instant::now());
        let state = if complete { BootstrapState::Complete } else { BootstrapState::Incomplete };
        self.state.store(state as u8, Ordering::Release);
    }

    /// Where the state came from, if it was grafted or replayed.
    pub fn source(&self) -> Option<String> {
        self.detail().source.clone()
    }

    /// Seconds the state lagged the engines when the bootstrap ended: from the snapshot's taking to
    /// the end of the replay that caught up (0 from the engines' rings; `None` before the end).
    pub fn state_age_secs(&self) -> Option<f64> {
        let d = self.detail();
        let finished = d.finished?;
        let taken = d.snapshot_taken.and_then(|t| SystemTime::now().duration_since(t).ok());
        let since_finish = finished.elapsed();
        Some(taken.map_or(0.0, |t| t.saturating_sub(since_finish).as_secs_f64()))
    }

    /// Seconds from the start of the bootstrap to its end (or to now while pending).
    pub fn duration_secs(&self) -> f64 {
        let d = self.detail();
        d.finished.unwrap_or_else(Instant::now).duration_since(d.started).as_secs_f64()
    }

    fn detail(&self) -> std::sync::MutexGuard<'_, Detail> {
        self.detail.lock().unwrap_or_else(|e| e.into_inner())
    }
}
