//! The publisher task's side: turns each queued [`Change`] into a batch — engine hashes, announced
//! blocks, the next seq, the encoded payload in the replay ring — in queue order, which is cache order.
//! This is the work vLLM's publisher thread does; doing it here keeps it off the request's path.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use super::blocks::PromptBlocks;
use super::ring::{lock, Change, Counters, Log, Outgoing};
use super::wire::{self, Event};
use crate::options::{KvEventsFormat, SimOptions};

pub(crate) struct Batcher {
    format: KvEventsFormat,
    block_size: usize,
    log: Arc<Mutex<Log>>,
    pub counters: Arc<Counters>,
}

impl Batcher {
    pub fn new(opts: &SimOptions, log: Arc<Mutex<Log>>, counters: Arc<Counters>) -> Batcher {
        Batcher { format: opts.kv_events_format, block_size: opts.block_size, log, counters }
    }

    /// The batch `change` makes, buffered for replay, if it is to be sent: `None` when it announces
    /// nothing, belongs to an engine since restarted, or the drop dice said so (seq used, batch kept).
    pub fn batch(&self, change: &Change) -> Option<Outgoing> {
        // Hash before taking the log, which the replay task reads.
        let blocks = PromptBlocks::new(&change.prompt, self.block_size);
        let runs = blocks.as_ref().map(|b| b.new_runs(&change.stored)).unwrap_or_default();
        let (mut events, seq) = {
            let mut log = lock(&self.log);
            if log.generation != change.generation {
                return None;
            }
            let removed: Vec<Event> =
                change.evicted.iter().filter_map(|key| log.forget(key)).map(|h| Event::Removed(vec![h])).collect();
            if removed.is_empty() && runs.is_empty() {
                return None;
            }
            if let Some(blocks) = &blocks {
                runs.iter().flat_map(Clone::clone).for_each(|i| log.announce(blocks.key(i), blocks.hashes[i]));
            }
            (removed, log.take_seq(self.counters.lost.swap(0, Relaxed)))
        };
        if let Some(blocks) = &blocks {
            events.extend(runs.into_iter().map(|run| Event::Stored(blocks.stored(run, self.format))));
        }
        let payload = Bytes::from(wire::encode_batch(self.format, unix_time(), &events));
        {
            let mut log = lock(&self.log);
            if log.generation != change.generation {
                return None; // restarted while encoding
            }
            log.push(seq, payload.clone());
        }
        self.counters.batches.fetch_add(1, Relaxed);
        if change.drop {
            self.counters.dropped.fetch_add(1, Relaxed);
            return None;
        }
        Some(Outgoing { seq, payload, created: change.created })
    }
}

fn unix_time() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prompt::SimPrompt;

    const BS: usize = 4;

    fn batcher() -> Batcher {
        let opts = SimOptions { block_size: BS, ..SimOptions::default() };
        Batcher::new(&opts, Arc::new(Mutex::new(Log::new(8))), Arc::new(Counters::default()))
    }

    /// A change storing the blocks of an 8-token prompt whose block keys are `keys`.
    fn change(generation: u64, keys: [u64; 2], evicted: Vec<u64>) -> Change {
        let prompt = SimPrompt {
            prompt_tokens: 8,
            block_keys: keys.to_vec(),
            token_ids: (1..=8).collect(),
            ..SimPrompt::default()
        };
        Change {
            generation,
            prompt: Arc::new(prompt),
            evicted,
            stored: keys.to_vec(),
            drop: false,
            created: tokio::time::Instant::now(),
        }
    }

    #[test]
    fn batches_take_seqs_in_queue_order_and_land_in_the_ring() {
        let b = batcher();
        assert_eq!(b.batch(&change(0, [1, 2], Vec::new())).map(|o| o.seq), Some(0));
        // Evicting an announced block is a batch; evicting one never announced, alone, is none.
        assert_eq!(b.batch(&change(0, [3, 4], vec![1])).map(|o| o.seq), Some(1));
        assert!(b.batch(&Change { stored: Vec::new(), ..change(0, [5, 6], vec![99]) }).is_none());
        let dropped = b.batch(&Change { drop: true, ..change(0, [7, 8], Vec::new()) });
        assert!(dropped.is_none(), "a dropped batch is not sent");
        let ring: Vec<u64> = lock(&b.log).since(0).iter().map(|(seq, _)| *seq).collect();
        assert_eq!(ring, vec![0, 1, 2], "but it is kept for replay");
        assert_eq!((b.counters.batches.load(Relaxed), b.counters.dropped.load(Relaxed)), (3, 1));
    }

    #[test]
    fn lost_changes_leave_a_gap_and_a_restart_drops_what_was_queued_before_it() {
        let b = batcher();
        b.counters.lost.store(2, Relaxed);
        assert_eq!(b.batch(&change(0, [1, 2], Vec::new())).map(|o| o.seq), Some(2));
        lock(&b.log).restart(1);
        assert!(b.batch(&change(0, [3, 4], Vec::new())).is_none(), "queued before the restart");
        assert_eq!(b.batch(&change(1, [1, 2], Vec::new())).map(|o| o.seq), Some(0));
        assert_eq!(lock(&b.log).since(0).len(), 1);
    }
}
