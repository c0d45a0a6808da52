//! The block index: which worker (probably) holds which chained KV block key.
//!
//! Keys are *chained* (each key encodes its whole prefix), so a worker's overlap with a prompt is the
//! number of leading blocks it holds: [`BlockIndex::probe`] walks the prompt's blocks in order,
//! intersecting the set of workers still matching, and stops when that set is empty or a block is
//! missing. A gap therefore ends the count even if later blocks are present.
//!
//! Source of entries (approximate mode): this router's own decisions, via [`BlockIndex::record`] after
//! a request is dispatched. Choices, documented because they shape behaviour:
//! - **Workers:** at most [`MAX_WORKERS`] (64), so a worker set is one `u64` bitset; more is rejected
//!   when the router is built.
//! - **TTL per (key, worker):** every worker bit of a key carries its own last-touched stamp (whole
//!   seconds since the index was created). A record by worker A does not keep worker B's claim alive.
//!   A bit older than the TTL never counts as overlap; it is dropped lazily when its key is touched, or
//!   with its key once every bit of the key is stale.
//! - **Global budget, LRU per key:** the index holds at most `max_blocks` keys across all workers (never a
//!   per-worker budget). Only [`BlockIndex::record`] refreshes a key's LRU position; probes do not (a probe
//!   does not mean a worker used the block). Evicting a key drops it for every worker.
//! - **Prefix-friendly recency:** a record touches its blocks last-to-first, so the first block of a
//!   prompt is the most recent and the tail of a prefix is evicted before its head (a lost head block
//!   would make every later block useless).
//!
//! Cost: a probe or a record is O(blocks) hash look-ups (plus O(workers holding the key) per block)
//! under one `Mutex`; `benches/index.rs` measures it (a 400-block probe is a few microseconds), which
//! keeps the critical section far below the time it takes to proxy a request, so no sharding.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

/// Most workers one index (and therefore one router) can track: a worker set is a `u64` bitset.
pub const MAX_WORKERS: usize = 64;

/// Sentinel for "no slot" in the intrusive LRU list.
const NIL: u32 = u32::MAX;

/// Thread-safe index of chained block keys → workers, bounded by a global LRU budget and a TTL.
pub struct BlockIndex {
    core: Mutex<Core>,
    /// Stamps are whole seconds since this instant.
    epoch: Instant,
    ttl_secs: u32,
    workers: usize,
}

impl BlockIndex {
    /// `workers` must be at most [`MAX_WORKERS`] and `max_blocks` at least 1 and below `u32::MAX`
    /// (both checked by `RoutingConfig::validate` / `Router::new`; out-of-range values are clamped here
    /// so this constructor cannot panic).
    pub fn new(workers: usize, max_blocks: usize, ttl_secs: u64) -> BlockIndex {
        let max_blocks = max_blocks.clamp(1, (NIL - 1) as usize);
        BlockIndex {
            core: Mutex::new(Core::new(max_blocks)),
            epoch: Instant::now(),
            ttl_secs: u32::try_from(ttl_secs).unwrap_or(u32::MAX),
            workers: workers.min(MAX_WORKERS),
        }
    }

    /// Number of workers this index tracks (the length of every probe result).
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Keys currently held (never more than the budget).
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Per worker, the number of leading `blocks` it holds (index = worker).
    pub fn probe(&self, blocks: &[u64]) -> Vec<u32> {
        self.probe_at(blocks, Instant::now())
    }

    /// [`probe`](Self::probe) at an explicit time (the injectable clock for tests).
    pub fn probe_at(&self, blocks: &[u64], now: Instant) -> Vec<u32> {
        let mut overlap = vec![0u32; self.workers];
        let mut alive = all_workers(self.workers);
        if alive == 0 || blocks.is_empty() {
            return overlap;
        }
        let now = self.stamp(now);
        let core = self.lock();
        let mut held: u32 = 0;
        for key in blocks {
            let still = match core.map.get(key) {
                Some(&slot) => core.node(slot).fresh_workers(alive, now, self.ttl_secs),
                None => 0,
            };
            // Workers dropping out here held exactly the blocks before this one.
            for w in Bits(alive & !still) {
                overlap[w] = held;
            }
            alive = still;
            if alive == 0 {
                return overlap;
            }
            held = held.saturating_add(1);
        }
        for w in Bits(alive) {
            overlap[w] = held;
        }
        overlap
    }

    /// Remember that `worker` now caches `blocks` (installs new keys, refreshes existing ones).
    /// An out-of-range `worker` is ignored.
    pub fn record(&self, worker: usize, blocks: &[u64]) {
        self.record_at(worker, blocks, Instant::now());
    }

    /// [`record`](Self::record) at an explicit time (the injectable clock for tests).
    pub fn record_at(&self, worker: usize, blocks: &[u64], now: Instant) {
        if worker >= self.workers {
            return;
        }
        let now = self.stamp(now);
        let mut core = self.lock();
        // Last to first: the head of the prefix ends up most recent (see the module docs).
        for &key in blocks.iter().rev() {
            core.touch(key, worker, now, self.ttl_secs);
        }
        core.drop_expired_tail(now, self.ttl_secs);
    }

    /// Forget everything `worker` holds (a dead or removed worker). O(keys held).
    pub fn remove_worker(&self, worker: usize) {
        if worker >= self.workers {
            return;
        }
        let mut core = self.lock();
        core.remove_worker(worker);
    }

    fn stamp(&self, now: Instant) -> u32 {
        u32::try_from(now.saturating_duration_since(self.epoch).as_secs()).unwrap_or(u32::MAX)
    }

    fn lock(&self) -> MutexGuard<'_, Core> {
        // Core updates cannot panic half-way, so a poisoned lock still guards a consistent index.
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn all_workers(n: usize) -> u64 {
    match n {
        0 => 0,
        n if n >= 64 => u64::MAX,
        n => (1u64 << n) - 1,
    }
}

fn is_fresh(stamp: u32, now: u32, ttl: u32) -> bool {
    now.saturating_sub(stamp) <= ttl
}

/// Iterates the set bits of a worker set, lowest first.
struct Bits(u64);

impl Iterator for Bits {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        if self.0 == 0 {
            return None;
        }
        let w = self.0.trailing_zeros() as usize;
        self.0 &= self.0 - 1;
        Some(w)
    }
}

/// Position of worker `w`'s stamp among the set bits of `set` (its rank).
fn rank(set: u64, w: usize) -> usize {
    (set & ((1u64 << w) - 1)).count_ones() as usize
}

/// One key: its worker set, one stamp per set bit (in bit order), and LRU links.
struct Node {
    key: u64,
    workers: u64,
    /// Stamp of the lowest worker; `rest` holds the others, so one-worker keys need no allocation.
    first: u32,
    rest: Vec<u32>,
    /// Newest stamp of any worker: the LRU order, and "all stale" when older than the TTL.
    touched: u32,
    prev: u32,
    next: u32,
}

impl Node {
    fn stamp(&self, rank: usize) -> u32 {
        match rank {
            0 => self.first,
            r => self.rest.get(r - 1).copied().unwrap_or(0),
        }
    }

    /// The workers of `among` holding this key with a stamp within the TTL.
    fn fresh_workers(&self, among: u64, now: u32, ttl: u32) -> u64 {
        let candidates = self.workers & among;
        if candidates == 0 {
            return 0;
        }
        if is_fresh(self.oldest(), now, ttl) {
            return candidates; // every stamp is fresh: skip the per-worker check
        }
        let mut fresh = 0u64;
        for w in Bits(candidates) {
            if is_fresh(self.stamp(rank(self.workers, w)), now, ttl) {
                fresh |= 1u64 << w;
            }
        }
        fresh
    }

    fn oldest(&self) -> u32 {
        self.rest.iter().copied().fold(self.first, u32::min)
    }

    /// Sets worker `w`'s stamp, adding the worker if absent.
    fn set(&mut self, w: usize, now: u32) {
        let bit = 1u64 << w;
        let r = rank(self.workers, w);
        if self.workers & bit != 0 {
            match r {
                0 => self.first = now,
                r => {
                    if let Some(s) = self.rest.get_mut(r - 1) {
                        *s = now;
                    }
                }
            }
        } else {
            if self.workers == 0 {
                self.first = now;
            } else if r == 0 {
                self.rest.insert(0, self.first);
                self.first = now;
            } else {
                self.rest.insert(r - 1, now);
            }
            self.workers |= bit;
        }
        self.touched = self.touched.max(now);
    }

    /// Removes worker `w` (no-op if absent).
    fn unset(&mut self, w: usize) {
        let bit = 1u64 << w;
        if self.workers & bit == 0 {
            return;
        }
        let r = rank(self.workers, w);
        if r == 0 {
            if !self.rest.is_empty() {
                self.first = self.rest.remove(0);
            }
        } else if r - 1 < self.rest.len() {
            self.rest.remove(r - 1);
        }
        self.workers &= !bit;
    }

    /// Drops the workers whose stamps are older than the TTL.
    fn prune(&mut self, now: u32, ttl: u32) {
        for w in Bits(self.workers) {
            if !is_fresh(self.stamp(rank(self.workers, w)), now, ttl) {
                self.unset(w);
            }
        }
    }
}

/// The unsynchronised index: a key → slot map plus a slab of nodes linked most- to least-recent.
struct Core {
    map: HashMap<u64, u32>,
    slots: Vec<Node>,
    free: Vec<u32>,
    head: u32,
    tail: u32,
    max_blocks: usize,
}

impl Core {
    fn new(max_blocks: usize) -> Core {
        Core { map: HashMap::new(), slots: Vec::new(), free: Vec::new(), head: NIL, tail: NIL, max_blocks }
    }

    fn node(&self, slot: u32) -> &Node {
        &self.slots[slot as usize]
    }

    fn node_mut(&mut self, slot: u32) -> &mut Node {
        &mut self.slots[slot as usize]
    }

    fn touch(&mut self, key: u64, worker: usize, now: u32, ttl: u32) {
        if let Some(&slot) = self.map.get(&key) {
            let node = self.node_mut(slot);
            node.prune(now, ttl);
            node.set(worker, now);
            self.unlink(slot);
            self.push_front(slot);
            return;
        }
        if self.map.len() >= self.max_blocks {
            self.evict_tail();
        }
        let node =
            Node { key, workers: 1u64 << worker, first: now, rest: Vec::new(), touched: now, prev: NIL, next: NIL };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = node;
                slot
            }
            None => {
                // The budget is below u32::MAX (clamped in `BlockIndex::new`), so this fits.
                let slot = self.slots.len() as u32;
                self.slots.push(node);
                slot
            }
        };
        self.map.insert(key, slot);
        self.push_front(slot);
    }

    /// Removes least-recent keys whose every worker stamp is older than the TTL.
    fn drop_expired_tail(&mut self, now: u32, ttl: u32) {
        while self.tail != NIL && !is_fresh(self.node(self.tail).touched, now, ttl) {
            self.evict_tail();
        }
    }

    fn evict_tail(&mut self) {
        let slot = self.tail;
        if slot != NIL {
            self.remove_slot(slot);
        }
    }

    fn remove_worker(&mut self, worker: usize) {
        let mut slot = self.head;
        while slot != NIL {
            let next = self.node(slot).next;
            let node = self.node_mut(slot);
            node.unset(worker);
            if node.workers == 0 {
                self.remove_slot(slot);
            }
            slot = next;
        }
    }

    fn remove_slot(&mut self, slot: u32) {
        self.unlink(slot);
        let node = self.node_mut(slot);
        let key = node.key;
        node.rest = Vec::new(); // release the heap part now, not when the slot is reused
        node.workers = 0;
        self.map.remove(&key);
        self.free.push(slot);
    }

    fn unlink(&mut self, slot: u32) {
        let (prev, next) = {
            let n = self.node(slot);
            (n.prev, n.next)
        };
        match prev {
            NIL => self.head = next,
            p => self.node_mut(p).next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.node_mut(n).prev = prev,
        }
        let n = self.node_mut(slot);
        n.prev = NIL;
        n.next = NIL;
    }

    fn push_front(&mut self, slot: u32) {
        let old = self.head;
        {
            let n = self.node_mut(slot);
            n.prev = NIL;
            n.next = old;
        }
        match old {
            NIL => self.tail = slot,
            o => self.node_mut(o).prev = slot,
        }
        self.head = slot;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn keys(range: std::ops::Range<u64>) -> Vec<u64> {
        range.map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect()
    }

    #[test]
    fn overlap_counts_leading_blocks_only() {
        let idx = BlockIndex::new(3, 1000, 600);
        let b = keys(0..10);
        idx.record(0, &b[..6]);
        // Worker 1 holds blocks 0..3 and 5..10: the missing block 3 ends its count at 3.
        idx.record(1, &b[..3]);
        idx.record(1, &b[5..]);
        // Worker 2 holds only later blocks: no leading block, no overlap.
        idx.record(2, &b[4..]);
        assert_eq!(idx.probe(&b), vec![6, 3, 0]);
        // A prompt that diverges after block 2 stops everyone at 2.
        let mut other = b[..2].to_vec();
        other.push(12345);
        other.extend_from_slice(&b[3..]);
        assert_eq!(idx.probe(&other), vec![2, 2, 0]);
        assert_eq!(idx.probe(&[]), vec![0, 0, 0]);
    }

    #[test]
    fn overlap_of_a_fully_held_prompt_is_its_length() {
        let idx = BlockIndex::new(2, 1000, 600);
        let b = keys(0..400);
        idx.record(1, &b);
        assert_eq!(idx.probe(&b), vec![0, 400]);
        assert_eq!(idx.len(), 400);
    }

    #[test]
    fn entries_expire_per_worker_after_the_ttl() {
        let idx = BlockIndex::new(2, 1000, 600);
        let t0 = Instant::now();
        let b = keys(0..4);
        idx.record_at(0, &b, t0);
        idx.record_at(1, &b, t0 + Duration::from_secs(300));
        // Exactly at the TTL both are still alive (stamps are whole seconds: 600 - 0 <= 600).
        assert_eq!(idx.probe_at(&b, t0 + Duration::from_secs(600)), vec![4, 4]);
        // One second later worker 0's claim is stale; worker 1 (touched later) still counts.
        assert_eq!(idx.probe_at(&b, t0 + Duration::from_secs(601)), vec![0, 4]);
        // Worker 1 stale too: nothing counts, although the keys are still stored.
        assert_eq!(idx.probe_at(&b, t0 + Duration::from_secs(901)), vec![0, 0]);
        assert_eq!(idx.len(), 4);
        // The next record sweeps keys whose every worker is stale.
        idx.record_at(0, &keys(100..101), t0 + Duration::from_secs(901));
        assert_eq!(idx.len(), 1);
    }

    #[test]
    fn re_recording_refreshes_the_stamp() {
        let idx = BlockIndex::new(1, 1000, 10);
        let t0 = Instant::now();
        let b = keys(0..3);
        idx.record_at(0, &b, t0);
        idx.record_at(0, &b[..1], t0 + Duration::from_secs(8));
        // Block 0 was refreshed, blocks 1..3 were not: the overlap stops after block 0.
        assert_eq!(idx.probe_at(&b, t0 + Duration::from_secs(15)), vec![1]);
    }

    #[test]
    fn global_budget_evicts_least_recently_recorded() {
        let idx = BlockIndex::new(4, 10, 600);
        let a = keys(0..4);
        let b = keys(100..104);
        let c = keys(200..204);
        idx.record(0, &a);
        idx.record(1, &b);
        assert_eq!(idx.len(), 8);
        idx.record(2, &a); // refresh `a`: now `b` is the least recently recorded
        idx.record(3, &c); // needs 2 more slots than the budget: the tail of `b` goes first
        assert_eq!(idx.len(), 10);
        assert_eq!(idx.probe(&a), vec![4, 0, 4, 0]);
        assert_eq!(idx.probe(&b), vec![0, 2, 0, 0], "the head of b survives, its tail is evicted");
        assert_eq!(idx.probe(&c), vec![0, 0, 0, 4]);
        for i in 0..50u64 {
            idx.record((i % 4) as usize, &keys(1000 + i * 7..1000 + i * 7 + 7));
            assert!(idx.len() <= 10);
        }
        assert_eq!(idx.len(), 10);
    }

    #[test]
    fn a_record_larger_than_the_budget_keeps_the_prefix_head() {
        let idx = BlockIndex::new(1, 5, 600);
        let b = keys(0..12);
        idx.record(0, &b);
        assert_eq!(idx.len(), 5);
        assert_eq!(idx.probe(&b), vec![5]);
    }

    #[test]
    fn remove_worker_forgets_only_that_worker() {
        let idx = BlockIndex::new(3, 100, 600);
        let b = keys(0..5);
        let only1 = keys(50..53);
        idx.record(0, &b);
        idx.record(1, &b);
        idx.record(2, &b[..2]);
        idx.record(1, &only1);
        idx.remove_worker(1);
        assert_eq!(idx.probe(&b), vec![5, 0, 2]);
        assert_eq!(idx.probe(&only1), vec![0, 0, 0]);
        assert_eq!(idx.len(), 5, "keys held only by worker 1 are gone");
        idx.remove_worker(0);
        idx.remove_worker(2);
        assert_eq!(idx.len(), 0);
        // Freed slots are reused correctly.
        idx.record(2, &b);
        assert_eq!(idx.probe(&b), vec![0, 0, 5]);
    }

    #[test]
    fn sixty_four_workers_use_every_bit() {
        let idx = BlockIndex::new(64, 1000, 600);
        let b = keys(0..3);
        for w in (0..64).rev() {
            idx.record(w, &b[..(w % 3) + 1]);
        }
        let overlap = idx.probe(&b);
        for (w, &o) in overlap.iter().enumerate() {
            assert_eq!(o as usize, (w % 3) + 1, "worker {w}");
        }
        idx.remove_worker(63);
        assert_eq!(idx.probe(&b)[63], 0);
        assert_eq!(idx.probe(&b)[62], 3);
        // Out-of-range workers are ignored rather than panicking.
        idx.record(64, &b);
        idx.remove_worker(99);
        assert_eq!(idx.probe(&b).len(), 64);
    }

    #[test]
    fn stamps_follow_their_workers_when_bits_are_inserted_below() {
        let idx = BlockIndex::new(3, 100, 10);
        let t0 = Instant::now();
        let b = keys(0..1);
        idx.record_at(2, &b, t0);
        idx.record_at(0, &b, t0 + Duration::from_secs(5)); // inserted below worker 2's bit
        idx.record_at(1, &b, t0 + Duration::from_secs(8)); // and between them
        let at = |s| idx.probe_at(&b, t0 + Duration::from_secs(s));
        assert_eq!(at(10), vec![1, 1, 1]);
        assert_eq!(at(11), vec![1, 1, 0]);
        assert_eq!(at(16), vec![0, 1, 0]);
        assert_eq!(at(19), vec![0, 0, 0]);
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// The index agrees with a naive model (no TTL/eviction pressure): overlap is the length of
            /// the longest leading run of blocks the worker recorded.
            #[test]
            fn matches_a_naive_model(
                records in proptest::collection::vec((0usize..4, 0u64..12, 1usize..8), 0..30),
                probe_len in 0usize..20,
            ) {
                let idx = BlockIndex::new(4, 10_000, 600);
                let mut held = vec![std::collections::HashSet::new(); 4];
                for (w, start, len) in records {
                    let b: Vec<u64> = (start..start + len as u64).collect();
                    idx.record(w, &b);
                    held[w].extend(b);
                }
                let probe: Vec<u64> = (0..probe_len as u64).collect();
                let got = idx.probe(&probe);
                for w in 0..4 {
                    let want = probe.iter().take_while(|k| held[w].contains(k)).count() as u32;
                    prop_assert_eq!(got[w], want);
                }
            }
        }
    }
}
