//! The unsynchronised index behind [`super::BlockIndex`]'s lock: a slab of nodes (one per key), the
//! key → slot [`Table`], an intrusive LRU list over the nodes, and running counts.
//!
//! A node is 32 bytes, aligned to 32 so it never straddles a cache line: the key, its two LRU links
//! and its [`Holders`] (two inline). Freed slots are threaded through their `next` link and reused
//! before the slab grows, and the slab's capacity grows by doubling but never past `max_blocks` nodes.
//! Expired entries are dropped lazily — when their key is written, when the key reaches the LRU tail,
//! or when the sweep hand passes its slot — so nothing here needs a timer.

use super::holders::{Holder, Holders};
use super::limits::{MAX_WORKERS, WRITE_CHUNK};
use super::source::{BySource, Source};
use super::table::Table;

/// Sentinel for "no slot" in the LRU and free lists.
pub(super) const NIL: u32 = u32::MAX;

/// Entry lifetimes in whole seconds (stamps are whole seconds since the index's epoch).
#[derive(Clone, Copy, Debug)]
pub(super) struct Ttls {
    pub pending: u32,
    pub approximate: u32,
}

impl Ttls {
    /// An event entry is held until removed; the others for their TTL after their stamp.
    pub(super) fn fresh(&self, h: Holder, now: u32) -> bool {
        let age = now.saturating_sub(h.stamp);
        match h.source {
            Source::Event => true,
            Source::Pending => age <= self.pending,
            Source::Approximate => age <= self.approximate,
        }
    }
}

#[repr(align(32))]
pub(super) struct Node {
    key: u64,
    prev: u32,
    next: u32,
    holders: Holders,
}

const _: () = assert!(std::mem::size_of::<Node>() == 32);

/// What one write does to one (key, worker) entry.
#[derive(Clone, Copy, Debug)]
pub(super) enum Write {
    /// A dispatch record or an event: install or refresh (never downgrading an event), LRU to the front.
    Put(Source),
    /// The worker dropped the block: remove its entry whatever its source (the LRU order is unchanged).
    Remove,
}

pub(super) struct Store {
    table: Table,
    nodes: Vec<Node>,
    /// First free slot (linked through `next`), or NIL.
    free: u32,
    /// LRU list, most recent first.
    head: u32,
    tail: u32,
    len: usize,
    max_blocks: usize,
    counts: BySource,
    /// Entries per worker: lets `clear_worker` stop as soon as the worker's last entry is gone.
    per_worker: Vec<u32>,
    /// `Event` entries per worker, held to `share` (see [`Store::write`]).
    per_worker_events: Vec<u32>,
    /// Most `Event` entries one worker may hold: its share of the budget.
    share: u32,
    /// Next slot the sweep looks at.
    hand: usize,
}

impl Store {
    pub(super) fn new(max_blocks: usize, share: usize, seed: u64) -> Store {
        Store {
            table: Table::new(max_blocks, seed),
            nodes: Vec::new(),
            free: NIL,
            head: NIL,
            tail: NIL,
            len: 0,
            max_blocks,
            counts: BySource::default(),
            per_worker: vec![0; MAX_WORKERS],
            per_worker_events: vec![0; MAX_WORKERS],
            share: u32::try_from(share.clamp(1, max_blocks)).unwrap_or(u32::MAX),
            hand: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn counts(&self) -> BySource {
        self.counts
    }

    /// Slots the slab has (live or free): the range `clear_worker` scans.
    pub(super) fn slots(&self) -> usize {
        self.nodes.len()
    }

    pub(super) fn held_by(&self, worker: u16) -> u32 {
        self.per_worker[usize::from(worker)]
    }

    /// Sets the most `Event` entries one worker may hold (clamped to 1..=`max_blocks`).
    pub(super) fn set_share(&mut self, share: usize) {
        self.share = u32::try_from(share.clamp(1, self.max_blocks)).unwrap_or(u32::MAX);
    }

    pub(super) fn events_held_by(&self, worker: u16) -> u32 {
        self.per_worker_events[usize::from(worker)]
    }

    /// The slot of each of `keys` (NIL where absent). Looking several keys up in one loop lets their
    /// cache misses (table entry, then node) overlap instead of following one another.
    pub(super) fn find_all(&self, keys: &[u64], slots: &mut [u32]) {
        for (slot, &key) in slots.iter_mut().zip(keys) {
            *slot = self.find(key).unwrap_or(NIL);
        }
    }

    /// Looks up every key a write of `keys` (one chunk, at most [`WRITE_CHUNK`]) will look up, and
    /// returns a value made from the results (pass it to `black_box`, so the reads are not optimised
    /// away). The index is far larger than the CPU's caches, so each lookup is a cache miss; inside the
    /// write loop each waited for the one before (and for the writes between), while these lookups are
    /// independent and their misses overlap. The write loop then finds them cached: a 500-key record
    /// of new keys at the default budget costs ~10-15 % less (`benches/index.rs`, `index_1m_*`). Making
    /// room for the new keys in the same way, before the loop, was measured too: 30 % slower. A full
    /// store evicts its least recent key for each new one, and removing a key waits for its table
    /// slot: the keys next in line are looked up here as well (a walk from the LRU tail, as many as
    /// the chunk could evict), so those misses overlap too.
    pub(super) fn warm(&self, keys: &[u64]) -> u64 {
        let n = keys.len().min(WRITE_CHUNK);
        let mut found = [NIL; WRITE_CHUNK];
        self.find_all(&keys[..n], &mut found[..n]);
        let mut victims = [0u64; WRITE_CHUNK];
        let mut v = 0;
        let mut slot = self.tail;
        while v < (self.len + n).saturating_sub(self.max_blocks).min(n) && slot != NIL {
            victims[v] = self.nodes[slot as usize].key;
            slot = self.nodes[slot as usize].prev;
            v += 1;
        }
        let mut evicted = [NIL; WRITE_CHUNK];
        self.find_all(&victims[..v], &mut evicted[..v]);
        found[..n].iter().chain(&evicted[..v]).fold(0, |acc, &s| acc ^ u64::from(s))
    }

    /// The holders at a live `slot` (from [`Store::find_all`]).
    pub(super) fn holders_at(&self, slot: u32) -> &Holders {
        &self.nodes[slot as usize].holders
    }

    /// Applies one write for (`key`, `worker`) at stamp `now`. Expired entries of the key are left to
    /// the sweep: a probe never counts them, and checking them on every write doubled its cost.
    /// Returns false when the write was refused: a new `Event` entry for a worker that already holds
    /// its share of the budget in events (so one worker's events can never push every other worker's
    /// entries out of the global LRU). Refreshing an event entry it holds is never refused.
    pub(super) fn write(&mut self, op: Write, key: u64, worker: u16, now: u32) -> bool {
        let slot = self.find(key);
        if matches!(op, Write::Put(Source::Event)) && self.over_share(slot, worker) {
            return false;
        }
        match (op, slot) {
            (Write::Put(source), Some(slot)) => self.put_existing(slot, worker, source, now),
            (Write::Put(source), None) => self.insert(key, Holder { worker, source, stamp: now }),
            (Write::Remove, Some(slot)) => self.remove_holder(slot, worker),
            (Write::Remove, None) => {}
        }
        true
    }

    /// `worker` holds its share of events and an event at `slot` would be a new one for it.
    fn over_share(&self, slot: Option<u32>, worker: u16) -> bool {
        // A share of the whole budget is no limit: the global LRU alone applies, as it always did.
        if self.per_worker_events[usize::from(worker)] < self.share || self.share as usize >= self.max_blocks {
            return false; // the common case: no holder walk
        }
        let holds_event =
            |slot: u32| self.nodes[slot as usize].holders.any(|h| h.worker == worker && h.source == Source::Event);
        !slot.is_some_and(holds_event)
    }

    /// Every fresh entry of the live keys in `slots`, as (key, holder), into `out`.
    pub(super) fn export_in(&self, slots: std::ops::Range<usize>, now: u32, ttls: Ttls, out: &mut Vec<(u64, Holder)>) {
        for node in &self.nodes[slots.start.min(self.nodes.len())..slots.end.min(self.nodes.len())] {
            node.holders.for_each(|h| {
                if ttls.fresh(h, now) {
                    out.push((node.key, h));
                }
            });
        }
    }

    /// Removes `worker` from the live keys in `slots`.
    pub(super) fn clear_worker_in(&mut self, worker: u16, slots: std::ops::Range<usize>) {
        for slot in slots.start..slots.end.min(self.nodes.len()) {
            if !self.nodes[slot].holders.is_empty() {
                self.remove_holder(slot as u32, worker);
            }
        }
    }

    /// Bounded clean-up after a write of `written` keys: up to [`WRITE_CHUNK`] keys from the LRU tail
    /// that no fresh entry holds, and `written` slots of the sweep hand (expired entries dropped,
    /// emptied keys freed). The slab grows by at most one slot per key written and not at all once the
    /// budget is reached or freed slots are reused, so from then on the hand passes every slot again
    /// and again: expired entries in the middle of the LRU list go too, at a cost proportional to the
    /// writes.
    pub(super) fn sweep(&mut self, now: u32, ttls: Ttls, written: usize) {
        for _ in 0..WRITE_CHUNK {
            let tail = self.tail;
            if tail == NIL || self.has_fresh(tail, now, ttls) {
                break;
            }
            self.remove_key(tail);
        }
        for _ in 0..written.min(self.nodes.len()) {
            if self.hand >= self.nodes.len() {
                self.hand = 0;
            }
            let slot = self.hand as u32;
            self.hand += 1;
            if !self.nodes[slot as usize].holders.is_empty() {
                self.prune(slot, now, ttls);
            }
        }
    }

    fn find(&self, key: u64) -> Option<u32> {
        let nodes = &self.nodes;
        self.table.get(key, |slot| nodes[slot as usize].key)
    }

    fn put_existing(&mut self, slot: u32, worker: u16, source: Source, now: u32) {
        let holders = &mut self.nodes[slot as usize].holders;
        let mut new = Holder { worker, source, stamp: now };
        let old = holders.set(new);
        if old.is_some_and(|old| old.source == Source::Event) && source != Source::Event {
            // A dispatch never downgrades what the worker itself announced (rare: put it back).
            new.source = Source::Event;
            holders.set(new);
        }
        if let Some(old) = old {
            self.count_sub(old);
        }
        self.count_add(new);
        self.unlink(slot);
        self.push_front(slot);
    }

    fn insert(&mut self, key: u64, h: Holder) {
        if self.len >= self.max_blocks {
            // The global budget: the least recently written key goes, for every worker.
            self.remove_key(self.tail);
        }
        let mut holders = Holders::NONE;
        holders.set(h);
        let node = Node { key, prev: NIL, next: NIL, holders };
        let slot = match self.free {
            NIL => {
                // No free slot, so nodes.len() == len < max_blocks ≤ table::MAX_KEYS < u32::MAX.
                if self.nodes.len() == self.nodes.capacity() {
                    let room = self.nodes.capacity().max(1024).min(self.max_blocks - self.nodes.len());
                    self.nodes.reserve_exact(room);
                }
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
            slot => {
                self.free = self.nodes[slot as usize].next;
                self.nodes[slot as usize] = node;
                slot
            }
        };
        self.table.insert(key, slot);
        self.len += 1;
        self.count_add(h);
        self.push_front(slot);
    }

    fn remove_holder(&mut self, slot: u32, worker: u16) {
        if let Some(old) = self.nodes[slot as usize].holders.remove(worker) {
            self.count_sub(old);
        }
        if self.nodes[slot as usize].holders.is_empty() {
            self.remove_key(slot);
        }
    }

    /// Drops `slot`'s expired entries, and the key if none is left.
    fn prune(&mut self, slot: u32, now: u32, ttls: Ttls) {
        // Read first: usually nothing has expired, and rewriting the holders costs more than reading.
        if !self.nodes[slot as usize].holders.any(|h| !ttls.fresh(h, now)) {
            return;
        }
        let Store { nodes, counts, per_worker, per_worker_events, .. } = self;
        nodes[slot as usize].holders.retain(|h| {
            let keep = ttls.fresh(h, now);
            if !keep {
                uncount(counts, per_worker, per_worker_events, h);
            }
            keep
        });
        if self.nodes[slot as usize].holders.is_empty() {
            self.remove_key(slot);
        }
    }

    fn has_fresh(&self, slot: u32, now: u32, ttls: Ttls) -> bool {
        self.nodes[slot as usize].holders.any(|h| ttls.fresh(h, now))
    }

    /// Frees `slot`'s key for every worker. A NIL slot (empty list) is ignored.
    fn remove_key(&mut self, slot: u32) {
        if slot == NIL {
            return;
        }
        self.unlink(slot);
        let Store { nodes, counts, per_worker, per_worker_events, table, .. } = self;
        let key = nodes[slot as usize].key;
        table.remove(key, |s| nodes[s as usize].key);
        let node = &mut nodes[slot as usize];
        node.holders.for_each(|h| uncount(counts, per_worker, per_worker_events, h));
        node.holders = Holders::NONE; // releases a heap list now, not when the slot is reused
        node.next = self.free;
        self.free = slot;
        self.len -= 1;
    }

    fn count_add(&mut self, h: Holder) {
        self.counts.add(h.source);
        self.per_worker[usize::from(h.worker)] += 1;
        if h.source == Source::Event {
            self.per_worker_events[usize::from(h.worker)] += 1;
        }
    }

    fn count_sub(&mut self, h: Holder) {
        uncount(&mut self.counts, &mut self.per_worker, &mut self.per_worker_events, h);
    }

    fn unlink(&mut self, slot: u32) {
        let (prev, next) = {
            let n = &self.nodes[slot as usize];
            (n.prev, n.next)
        };
        match prev {
            NIL => self.head = next,
            p => self.nodes[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.nodes[n as usize].prev = prev,
        }
        let n = &mut self.nodes[slot as usize];
        n.prev = NIL;
        n.next = NIL;
    }

    fn push_front(&mut self, slot: u32) {
        let old = self.head;
        let n = &mut self.nodes[slot as usize];
        n.prev = NIL;
        n.next = old;
        match old {
            NIL => self.tail = slot,
            o => self.nodes[o as usize].prev = slot,
        }
        self.head = slot;
    }
}

/// Takes one entry out of the running counts (split from [`Store`] so callers can borrow its nodes).
fn uncount(counts: &mut BySource, per_worker: &mut [u32], per_worker_events: &mut [u32], h: Holder) {
    counts.sub(h.source);
    per_worker[usize::from(h.worker)] -= 1;
    if h.source == Source::Event {
        per_worker_events[usize::from(h.worker)] -= 1;
    }
}
