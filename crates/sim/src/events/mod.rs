//! KV-cache events, published as a vLLM (or SGLang) worker publishes them (`--kv-events`).
//!
//! Every admission that changes the cache becomes one batch (vLLM publishes one per engine step that
//! has events): a `BlockRemoved` per evicted block that had been announced, then a `BlockStored` per
//! run of newly cached blocks ([`blocks`]), encoded in the chosen format ([`wire`]). The batch gets the
//! next seq and enters the replay ring ([`ring`]) *while the cache lock is held*, so seq order is the order in
//! which the cache changed; sending it is left to the publisher task ([`sockets`]) through a bounded
//! queue, so request handling never waits on a subscriber. A full queue drops the batch (counted); it
//! stays in the ring, so subscribers see a gap and replay it, as after a real PUB's high-water mark.
//!
//! Faults: `--kv-events-drop-rate` skips the send of some batches (seq used, batch in the ring),
//! `--kv-events-delay-ms` sends late, and [`Publisher::restart`] resets the seq to 0 and empties the
//! ring without any `AllBlocksCleared`, as a restarted vLLM process does.

mod blocks;
mod ring;
mod sockets;
mod wire;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::cache::Admission;
use crate::options::{KvEventsFormat, SimOptions};
use crate::prompt::SimPrompt;
use crate::timing::Dice;

pub(crate) use sockets::Sockets;

use blocks::PromptBlocks;
use ring::{lock, Counters, Log, Outgoing};
use wire::Event;

/// Batches waiting for the publisher task; beyond this they are dropped (and replayable).
const QUEUE_CAPACITY: usize = 16_384;
/// Keeps the drop dice apart from the request fault dice, so turning events on changes no other fault.
const DICE_SALT: u64 = 0x6b76_2d65_7665_6e74;

/// The request side of the event publisher: turns admissions into batches.
pub(crate) struct Publisher {
    format: KvEventsFormat,
    block_size: usize,
    log: Arc<Mutex<Log>>,
    queue: mpsc::Sender<Outgoing>,
    /// `f64` bits of the current drop rate (changeable while running).
    drop_rate: AtomicU64,
    dice: Dice,
    pub counters: Arc<Counters>,
}

/// Binds the PUB (and the replay ROUTER) and starts their tasks.
pub(crate) async fn start(endpoint: &str, opts: &SimOptions) -> anyhow::Result<(Publisher, Sockets)> {
    let log = Arc::new(Mutex::new(Log::new(opts.kv_events_buffer)));
    let counters = Arc::new(Counters::default());
    let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
    let sockets = Sockets::bind(endpoint, opts, log.clone(), counters.clone(), rx).await?;
    let publisher = Publisher {
        format: opts.kv_events_format,
        block_size: opts.block_size,
        log,
        queue: tx,
        drop_rate: AtomicU64::new(opts.kv_events_drop_rate.to_bits()),
        dice: Dice::new(opts.seed ^ DICE_SALT),
        counters,
    };
    Ok((publisher, sockets))
}

impl Publisher {
    /// Publishes what `admission` changed. Call it with the cache lock held, right after the admission.
    pub fn admitted(&self, prompt: &SimPrompt, admission: &Admission) {
        let blocks = PromptBlocks::new(prompt, self.block_size);
        let mut log = lock(&self.log);
        let mut events: Vec<Event> =
            admission.evicted.iter().filter_map(|key| log.forget(key)).map(|h| Event::Removed(vec![h])).collect();
        if let Some(blocks) = &blocks {
            for run in blocks.new_runs(&admission.stored) {
                for i in run.clone() {
                    log.announce(blocks.key(i), blocks.hashes[i]);
                }
                events.push(Event::Stored(blocks.stored(run, self.format)));
            }
        }
        if events.is_empty() {
            return;
        }
        let payload = Bytes::from(wire::encode_batch(self.format, unix_time(), &events));
        let seq = log.push(payload.clone());
        drop(log);
        self.send(seq, payload);
    }

    /// A restarted engine: seq back to 0, an empty ring, nothing announced. Call it with the cache lock
    /// held, as the cache is cleared.
    pub fn restart(&self) {
        lock(&self.log).restart();
    }

    pub fn set_drop_rate(&self, rate: f64) {
        self.drop_rate.store(rate.clamp(0.0, 1.0).to_bits(), Relaxed);
    }

    fn send(&self, seq: u64, payload: Bytes) {
        self.counters.batches.fetch_add(1, Relaxed);
        if self.dice.roll(f64::from_bits(self.drop_rate.load(Relaxed))) {
            self.counters.dropped.fetch_add(1, Relaxed);
            return;
        }
        let outgoing = Outgoing { seq, payload, created: tokio::time::Instant::now() };
        if self.queue.try_send(outgoing).is_err() {
            self.counters.overflowed.fetch_add(1, Relaxed);
        }
    }
}

fn unix_time() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}
