//! The block index: which worker holds which chained KV block key, and how the router knows it.
//!
//! Keys are *chained* (each key encodes its whole prefix), so a worker's overlap with a prompt is the
//! number of leading blocks it holds: [`BlockIndex::probe`] walks the prompt's blocks in order,
//! narrowing the set of workers still matching, and stops when that set is empty. A gap ends a worker's
//! count even if later blocks are present.
//!
//! **Sources.** Every (key, worker) entry has one [`Source`]:
//! - `Event`: the worker announced the block in its KV-cache events ([`BlockIndex::store_events`]). Held
//!   until the worker removes it ([`BlockIndex::remove_events`]) or is cleared; no TTL.
//! - `Pending`: the router dispatched a prompt to a worker that publishes events. It counts as held at
//!   once (two requests with the same new prefix a millisecond apart still meet) for `pending_ttl`,
//!   until the worker's own event upgrades it to `Event`; never confirmed, it expires.
//! - `Approximate`: a dispatch to a worker without events (the router's guess), held for `approx_ttl`.
//!
//! A dispatch record never downgrades an `Event` entry (it only refreshes the key's LRU position); an
//! event upgrades any entry; a removal deletes the entry whatever its source. Stamps are whole seconds
//! since the index's epoch (one TTL, at most a day, before its creation); an entry is fresh while `now − stamp ≤ ttl`.
//!
//! **Memory is bounded by one global budget of keys** (`max_blocks`, LRU over keys, never per worker):
//! inserting a key beyond it evicts the least recently written key for every worker. **One worker's
//! events hold at most its share** ([`BlockIndex::with_worker_share`]): a new `Event` entry for a
//! worker already holding that many is refused (counted by the caller), so a worker publishing far more
//! blocks than any cache holds cannot push the other workers' entries out of the LRU. Writes touch a
//! prompt's blocks last-to-first, so its head is the most recent and the tail of a prefix is evicted
//! before its head (a lost head block makes every later block useless). Probes do not refresh
//! recency. A key costs a 32-byte node (two holders inline) and an 8-byte table entry at a load factor
//! between 3/8 and 3/4 (~11–21 bytes per key); a key with 3–4 holders adds one 24-byte allocation, one
//! with more a list of 8 bytes per holder (its event holders move to a 128-byte bitset once there are
//! more than 32). `benches/index.rs` measures ~51 bytes per block at 10 M blocks, 1.86 holders each.
//! The holders of a key are at most one per worker, and per-worker state is a fixed
//! [`MAX_WORKERS`]-entry counter table, so nothing grows beyond the budget.
//!
//! **Locking.** One `Mutex` (parking_lot's, for its fair unlock). A probe holds it for O(blocks + holders met), looking keys up
//! [`LOOKAHEAD`] at a time so their cache misses overlap (`benches/index.rs` measures it at 10 M keys
//! and 1024 workers). Writes are applied in chunks of at most [`WRITE_CHUNK`] keys per lock hold and
//! [`BlockIndex::remove_worker`] scans [`SCAN_CHUNK`] slots per hold; between two chunks the writer
//! hands the lock to a waiting probe (a fair unlock: with a plain one the writer takes the lock
//! straight back, and probes were measured waiting for whole 4096-key batches). A probe that finds the
//! lock taken spins for it ([`PROBE_SPIN`]) and says so: a write then ends its hold after
//! [`MIN_CHUNK`] keys and lets the spinning probes in before its next chunk ([`WRITER_DEFERS`]), so a
//! probe waits ~2 µs for a writer rather than a chunk and a futex wake-up (at 10 M keys and 1024
//! workers, a probe's p99 while 4096-key batches are ingested went from 119 to 35 µs). A write is therefore not
//! atomic: a probe may see part of it (the tail first, as keys are applied last-to-first, so a partial
//! write shows up as a shorter overlap, never a longer one).

mod holders;
mod limits;
mod set;
mod source;
mod store;
mod table;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use parking_lot::{Mutex, MutexGuard};
use serde::Serialize;

use self::set::Matching;
use self::store::{Store, Ttls, Write, NIL};

use self::limits::{LOOKAHEAD, MIN_CHUNK, PROBE_SPIN, WRITER_DEFERS, WRITE_CHUNK};
pub use self::limits::{MAX_WORKERS, SCAN_CHUNK};
pub use self::source::{BySource, Source};

/// Most keys the budget may name (the table's addressing limit).
pub(crate) const MAX_BLOCKS: usize = table::MAX_KEYS;

/// How many leading blocks of a prompt a worker holds, and from which source each came.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Overlap {
    /// `events + pending + approximate`.
    pub blocks: u32,
    pub events: u32,
    pub pending: u32,
    pub approximate: u32,
}

/// One (key, worker) entry as a snapshot carries it to another router replica: where it came from and
/// how old it is (whole seconds; an `Event` entry's age is not used).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub key: u64,
    pub worker: u16,
    pub source: Source,
    pub age_secs: u32,
}

/// Thread-safe index of chained block keys → workers; see the module docs.
pub struct BlockIndex {
    store: Mutex<Store>,
    /// Probes spinning for the lock; a writer between two chunks lets them take it first.
    probing: AtomicU32,
    epoch: Instant,
    ttls: Ttls,
    /// Called after every chunk of a write, with the lock released (tests interleave probes there).
    #[cfg(test)]
    after_chunk: std::sync::Mutex<Option<Box<dyn FnMut() + Send>>>,
}

impl BlockIndex {
    /// An index of at most `max_blocks` keys (clamped to 1..=[`MAX_BLOCKS`]; `RoutingConfig::validate`
    /// rejects values outside it) whose approximate entries live `approx_ttl_secs` and unconfirmed
    /// pending ones `pending_ttl_secs` (both capped at `u32::MAX`). The key table for the whole budget is
    /// allocated here, zeroed (8 bytes × up to 4/3 × 2 × `max_blocks`; the OS commits pages as keys arrive).
    pub fn new(max_blocks: usize, approx_ttl_secs: u64, pending_ttl_secs: u64) -> BlockIndex {
        let secs = |s: u64| u32::try_from(s).unwrap_or(u32::MAX);
        // Stamps count from a TTL before creation (at most a day), so a grafted entry's age fits even
        // in a new index (see `graft`).
        let back = std::time::Duration::from_secs(approx_ttl_secs.max(pending_ttl_secs).min(86_400));
        BlockIndex {
            store: Mutex::new(Store::new(max_blocks.clamp(1, MAX_BLOCKS), MAX_BLOCKS, rand::random())),
            probing: AtomicU32::new(0),
            epoch: Instant::now().checked_sub(back).unwrap_or_else(Instant::now),
            ttls: Ttls { pending: secs(pending_ttl_secs), approximate: secs(approx_ttl_secs) },
            #[cfg(test)]
            after_chunk: std::sync::Mutex::new(None),
        }
    }

    /// At most `share` `Event` entries per worker (default: the whole budget; clamped to 1..=budget).
    pub fn with_worker_share(self, share: usize) -> BlockIndex {
        self.lock().set_share(share);
        self
    }

    /// Entries `worker` holds, of every source (0 for an out-of-range id).
    pub fn held_by(&self, worker: usize) -> usize {
        worker_id(worker).map_or(0, |w| self.lock().held_by(w) as usize)
    }

    /// `Event` entries `worker` holds (what its share bounds).
    pub fn events_held_by(&self, worker: usize) -> usize {
        worker_id(worker).map_or(0, |w| self.lock().events_held_by(w) as usize)
    }

    /// Keys currently held (never more than the budget).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Entries per source, for a gauge.
    pub fn counts(&self) -> BySource {
        self.lock().counts()
    }

    /// Per worker `0..workers`, the number of leading `blocks` it holds (fresh entries of any source).
    pub fn probe(&self, blocks: &[u64], workers: usize) -> Vec<u32> {
        self.probe_at(blocks, workers, Instant::now())
    }

    /// [`probe`](Self::probe) at an explicit time (the injectable clock for tests).
    pub fn probe_at(&self, blocks: &[u64], workers: usize, now: Instant) -> Vec<u32> {
        self.probe_detail_at(blocks, workers, now).into_iter().map(|o| o.blocks).collect()
    }

    /// Per worker `0..workers`, its leading blocks and how many of them each source contributed.
    pub fn probe_detail(&self, blocks: &[u64], workers: usize) -> Vec<Overlap> {
        self.probe_detail_at(blocks, workers, Instant::now())
    }

    /// [`probe_detail`](Self::probe_detail) at an explicit time.
    pub fn probe_detail_at(&self, blocks: &[u64], workers: usize, now: Instant) -> Vec<Overlap> {
        let workers = workers.min(MAX_WORKERS);
        let mut out = vec![Overlap::default(); workers];
        if workers > 0 && !blocks.is_empty() {
            self.walk(&self.lock_probe(), blocks, self.stamp(now), &mut Matching::new(workers), &mut out);
        }
        // Each matched block came from exactly one source per worker; only the timed ones were counted.
        for o in &mut out {
            o.events = o.blocks - o.pending - o.approximate;
        }
        out
    }

    /// The probe proper, under the lock: `out[w].blocks` for every worker, and its timed matches.
    fn walk(&self, store: &Store, blocks: &[u64], now: u32, m: &mut Matching, out: &mut [Overlap]) {
        let mut slots = [NIL; LOOKAHEAD];
        let mut held = 0u32;
        for batch in blocks.chunks(LOOKAHEAD) {
            store.find_all(batch, &mut slots);
            for &slot in &slots[..batch.len()] {
                if slot != NIL {
                    let fresh = |h| self.ttls.fresh(h, now);
                    store.holders_at(slot).mark_fresh(m, fresh, |w, source| count_source(&mut out[w], source));
                }
                // Workers dropping out here held exactly the blocks before this one.
                if !m.advance(|w| out[w].blocks = held) {
                    return;
                }
                held = held.saturating_add(1);
            }
        }
        m.for_each_alive(|w| out[w].blocks = held);
    }

    /// A dispatch: `worker` was sent a prompt with `blocks` (`Source::Pending` if it publishes events,
    /// `Source::Approximate` if not; `Source::Event` is the same as [`store_events`](Self::store_events)).
    /// Out-of-range workers are ignored.
    pub fn record(&self, worker: usize, blocks: &[u64], source: Source) {
        self.record_at(worker, blocks, source, Instant::now());
    }

    /// [`record`](Self::record) at an explicit time.
    pub fn record_at(&self, worker: usize, blocks: &[u64], source: Source, now: Instant) {
        self.write(Write::Put(source), worker, blocks, now);
    }

    /// `worker` announced it now caches `keys` (a `BlockStored` event, keys in chain order). Returns
    /// how many were refused because the worker holds its share of events.
    pub fn store_events(&self, worker: usize, keys: &[u64]) -> usize {
        self.store_events_at(worker, keys, Instant::now())
    }

    /// [`store_events`](Self::store_events) at an explicit time.
    pub fn store_events_at(&self, worker: usize, keys: &[u64], now: Instant) -> usize {
        self.write(Write::Put(Source::Event), worker, keys, now)
    }

    /// `worker` evicted `keys` (a `BlockRemoved` event): its entries go, whatever their source.
    pub fn remove_events(&self, worker: usize, keys: &[u64]) {
        self.remove_events_at(worker, keys, Instant::now());
    }

    /// [`remove_events`](Self::remove_events) at an explicit time (the clean-up after each chunk uses it).
    pub fn remove_events_at(&self, worker: usize, keys: &[u64], now: Instant) {
        self.write(Write::Remove, worker, keys, now);
    }

    /// Forgets everything `worker` holds, whatever the source (it died, restarted, or its event feed is
    /// resyncing). O(slots) in chunks of [`SCAN_CHUNK`]; stops as soon as the worker holds nothing.
    pub fn remove_worker(&self, worker: usize) {
        let Some(worker) = worker_id(worker) else {
            return;
        };
        let mut start = 0;
        loop {
            let mut store = self.lock_chunk();
            if store.held_by(worker) == 0 || start >= store.slots() {
                return;
            }
            store.clear_worker_in(worker, start..start + SCAN_CHUNK);
            MutexGuard::unlock_fair(store);
            self.chunk_done();
            start += SCAN_CHUNK;
        }
    }

    /// The fresh entries of up to [`SCAN_CHUNK`] slots from `start` (one lock hold), appended to `out`;
    /// the next `start`, or `None` once every slot was read. A snapshot streams the index this way, so
    /// probes wait for one chunk at most; entries written meanwhile may or may not be in it.
    pub fn export_chunk(&self, start: usize, out: &mut Vec<Entry>) -> Option<usize> {
        let store = self.lock();
        let now = self.stamp(Instant::now());
        let mut held = Vec::new();
        store.export_in(start..start + SCAN_CHUNK, now, self.ttls, &mut held);
        let more = start + SCAN_CHUNK < store.slots();
        drop(store);
        out.extend(held.into_iter().map(|(key, h)| Entry {
            key,
            worker: h.worker,
            source: h.source,
            age_secs: now.saturating_sub(h.stamp),
        }));
        more.then_some(start + SCAN_CHUNK)
    }

    /// Writes a peer's entries (a snapshot being grafted), each with its source and its age kept,
    /// [`WRITE_CHUNK`] per lock hold;
    /// returns how many were refused (a worker's share of events, see [`BlockIndex::store_events`]).
    /// Out-of-range workers are ignored.
    pub fn graft(&self, entries: &[Entry]) -> usize {
        let now = self.stamp(Instant::now());
        let mut refused = 0;
        for chunk in entries.chunks(WRITE_CHUNK) {
            let mut store = self.lock_chunk();
            for e in chunk.iter().filter(|e| usize::from(e.worker) < MAX_WORKERS) {
                let stamp = now.saturating_sub(e.age_secs);
                refused += usize::from(!store.write(Write::Put(e.source), e.key, e.worker, stamp));
            }
            store.sweep(now, self.ttls, chunk.len());
            MutexGuard::unlock_fair(store);
            self.chunk_done();
        }
        refused
    }

    /// Applies `op` to `keys` last-to-first, [`WRITE_CHUNK`] keys per lock hold, a hold ending early
    /// (after [`MIN_CHUNK`] keys) when a probe is spinning for the lock; returns how many writes were refused (see
    /// `Store::write`).
    fn write(&self, op: Write, worker: usize, keys: &[u64], now: Instant) -> usize {
        let Some(worker) = worker_id(worker) else {
            return 0;
        };
        let now = self.stamp(now);
        let mut refused = 0;
        let mut rest = keys;
        while !rest.is_empty() {
            let chunk = &rest[rest.len().saturating_sub(WRITE_CHUNK)..];
            let mut store = self.lock_chunk();
            std::hint::black_box(store.warm(chunk));
            let mut done = 0;
            for &key in chunk.iter().rev() {
                refused += usize::from(!store.write(op, key, worker, now));
                done += 1;
                if done >= MIN_CHUNK && self.probing.load(Ordering::Relaxed) > 0 {
                    break;
                }
            }
            store.sweep(now, self.ttls, done);
            // A waiting probe goes before the next chunk (see the module docs).
            MutexGuard::unlock_fair(store);
            self.chunk_done();
            rest = &rest[..rest.len() - done];
        }
        refused
    }

    #[cfg(not(test))]
    fn chunk_done(&self) {}

    #[cfg(test)]
    fn chunk_done(&self) {
        if let Some(hook) = self.after_chunk.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            hook();
        }
    }

    fn stamp(&self, now: Instant) -> u32 {
        u32::try_from(now.saturating_duration_since(self.epoch).as_secs()).unwrap_or(u32::MAX)
    }

    fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock()
    }

    /// The lock for a probe: spin for it (announced, so writers step aside between chunks) rather
    /// than park at once; see [`PROBE_SPIN`].
    fn lock_probe(&self) -> MutexGuard<'_, Store> {
        if let Some(store) = self.store.try_lock() {
            return store;
        }
        self.probing.fetch_add(1, Ordering::AcqRel);
        let store = spin_until(PROBE_SPIN, || self.store.try_lock()).unwrap_or_else(|| self.store.lock());
        self.probing.fetch_sub(1, Ordering::AcqRel);
        store
    }

    /// The lock for one chunk of a write. While probes spin for it the writer steps aside, and then
    /// spins for it itself (a parked writer would cost the probe's unlock a wake-up), for at most
    /// [`WRITER_DEFERS`]; otherwise, or after that, it queues like everyone else.
    fn lock_chunk(&self) -> MutexGuard<'_, Store> {
        if self.probing.load(Ordering::Acquire) > 0 {
            let after_probes = || (self.probing.load(Ordering::Acquire) == 0).then(|| self.store.try_lock()).flatten();
            if let Some(store) = spin_until(WRITER_DEFERS, after_probes) {
                return store;
            }
        }
        self.lock()
    }
}

/// Polls `ready` until it gives a value or `limit` has passed (the clock read every 64 polls: reading
/// it costs more than a poll).
fn spin_until<T>(limit: std::time::Duration, mut ready: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        for _ in 0..64 {
            if let Some(v) = ready() {
                return Some(v);
            }
            std::hint::spin_loop();
        }
        if start.elapsed() >= limit {
            return None;
        }
    }
}

fn worker_id(worker: usize) -> Option<u16> {
    if worker < MAX_WORKERS {
        u16::try_from(worker).ok()
    } else {
        None
    }
}

/// Counts one matched block of `source` (the probe passes timed sources only and derives events).
fn count_source(o: &mut Overlap, source: Source) {
    match source {
        Source::Event => o.events += 1,
        Source::Pending => o.pending += 1,
        Source::Approximate => o.approximate += 1,
    }
}
