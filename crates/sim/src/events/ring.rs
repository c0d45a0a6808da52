//! What the request side of the publisher and the socket tasks share: a cache change on its way to the
//! publisher task ([`Change`]), the replay ring with the blocks announced so far ([`Log`], behind one
//! mutex), a batch on its way to the PUB ([`Outgoing`]), and the send counters.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;

use crate::prompt::SimPrompt;

/// What one admission changed in the cache, queued in cache order for the publisher task, which turns
/// it into a batch (engine hashes, seq, encoding) off the request's path, as vLLM's publisher thread does.
#[derive(Debug)]
pub(crate) struct Change {
    /// The engine's life the change belongs to: a change queued before a restart is never published.
    pub generation: u64,
    pub prompt: Arc<SimPrompt>,
    /// Router keys of the evicted blocks.
    pub evicted: Vec<u64>,
    /// Router keys of the newly stored blocks, in prompt order.
    pub stored: Vec<u64>,
    /// The drop dice's verdict, rolled at admission (`--kv-events-drop-rate`).
    pub drop: bool,
    pub created: tokio::time::Instant,
}

/// The replay ring and what the subscribers were told, shared with the replay task.
#[derive(Debug, Default)]
pub(crate) struct Log {
    /// Bumped by every restart; see [`Change::generation`].
    pub generation: u64,
    next_seq: u64,
    capacity: usize,
    /// `(seq, payload)`, oldest first.
    ring: VecDeque<(u64, Bytes)>,
    /// Engine hash of every announced block still cached, by router key: removals name these.
    announced: HashMap<u64, u64>,
}

impl Log {
    pub fn new(capacity: usize) -> Log {
        Log { capacity, ..Log::default() }
    }

    /// Remembers that the block `key` was announced under engine hash `hash`.
    pub fn announce(&mut self, key: u64, hash: u64) {
        self.announced.insert(key, hash);
    }

    /// The engine hash `key` was announced under, forgotten (its removal is being announced).
    pub fn forget(&mut self, key: &u64) -> Option<u64> {
        self.announced.remove(key)
    }

    /// A restarted engine (now in `generation`): seq back to 0, an empty ring, nothing announced.
    pub fn restart(&mut self, generation: u64) {
        self.generation = generation;
        self.next_seq = 0;
        self.ring.clear();
        self.announced.clear();
    }

    /// The next batch's seq, after skipping `lost` (changes the full queue lost: subscribers see their
    /// gap, and replay finds nothing for them).
    pub fn take_seq(&mut self, lost: u64) -> u64 {
        let seq = self.next_seq + lost;
        self.next_seq = seq + 1;
        seq
    }

    /// Buffers batch `seq`; batches arrive in seq order (one publisher task takes them).
    pub fn push(&mut self, seq: u64, payload: Bytes) {
        self.ring.push_back((seq, payload));
        while self.ring.len() > self.capacity {
            self.ring.pop_front();
        }
    }

    /// Buffered batches with seq ≥ `start`, oldest first.
    pub fn since(&self, start: u64) -> Vec<(u64, Bytes)> {
        self.ring.iter().filter(|(seq, _)| *seq >= start).cloned().collect()
    }
}

/// A batch handed to the publisher task.
#[derive(Debug)]
pub(crate) struct Outgoing {
    pub seq: u64,
    pub payload: Bytes,
    pub created: tokio::time::Instant,
}

/// Counters shared with the publisher task.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub batches: AtomicU64,
    pub dropped: AtomicU64,
    pub overflowed: AtomicU64,
    /// Changes the full queue lost and the publisher task has not yet skipped a seq for.
    pub lost: AtomicU64,
}

pub(crate) fn lock(log: &Mutex<Log>) -> MutexGuard<'_, Log> {
    // The log is consistent between statements, so a panic elsewhere does not poison it.
    log.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_last_batches() {
        let mut log = Log { capacity: 2, ..Log::default() };
        for i in 0..4u8 {
            let seq = log.take_seq(0);
            assert_eq!(seq, u64::from(i));
            log.push(seq, Bytes::from(vec![i]));
        }
        let seqs: Vec<u64> = log.since(0).iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs, vec![2, 3]);
        assert_eq!(log.since(3).len(), 1);
        assert!(log.since(4).is_empty());
        assert_eq!(log.take_seq(2), 6, "two lost changes leave a gap of two");
        log.restart(1);
        assert_eq!((log.take_seq(0), log.generation), (0, 1));
        assert!(log.since(0).is_empty());
    }
}
