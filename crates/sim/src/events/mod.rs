//! KV-cache events, published as a vLLM (or SGLang) worker publishes them (`--kv-events`).
//!
//! Every admission that changes the cache becomes one batch (vLLM publishes one per engine step that
//! has events): a `BlockRemoved` per evicted block that had been announced, then a `BlockStored` per
//! run of newly cached blocks ([`blocks`]), encoded in the chosen format ([`wire`]). The request side
//! only queues what changed ([`ring::Change`], cheap, *while the cache lock is held*, so queue order is
//! the order in which the cache changed); the publisher task ([`sockets`], [`batcher`]) hashes, assigns
//! the next seq, encodes, keeps the batch in the replay ring and sends it — off the request's path, as
//! vLLM's publisher thread does, so turning events on costs a request no more than a queue push. A full
//! queue loses the change (counted) and its seq is skipped, so subscribers see a gap.
//!
//! Faults: `--kv-events-drop-rate` skips the send of some batches (seq used, batch in the ring),
//! `--kv-events-delay-ms` sends late, and [`Publisher::restart`] resets the seq to 0 and empties the
//! ring without any `AllBlocksCleared`, as a restarted vLLM process does.

mod batcher;
mod blocks;
mod ring;
mod sockets;
mod wire;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use crate::cache::Admission;
use crate::options::SimOptions;
use crate::prompt::SimPrompt;
use crate::timing::Dice;

pub(crate) use sockets::Sockets;

use batcher::Batcher;
use ring::{lock, Change, Counters, Log};

/// Changes waiting for the publisher task; beyond this they are lost (and their seqs skipped).
const QUEUE_CAPACITY: usize = 16_384;
/// Keeps the drop dice apart from the request fault dice, so turning events on changes no other fault.
const DICE_SALT: u64 = 0x6b76_2d65_7665_6e74;

/// The request side of the event publisher: queues what admissions changed.
pub(crate) struct Publisher {
    log: Arc<Mutex<Log>>,
    queue: mpsc::Sender<Change>,
    /// The engine's life, bumped by [`Publisher::restart`]; read and bumped under the cache lock.
    generation: AtomicU64,
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
    let batcher = Batcher::new(opts, log.clone(), counters.clone());
    let sockets = Sockets::bind(endpoint, opts, log.clone(), batcher, rx).await?;
    let publisher = Publisher {
        log,
        queue: tx,
        generation: AtomicU64::new(0),
        drop_rate: AtomicU64::new(opts.kv_events_drop_rate.to_bits()),
        dice: Dice::new(opts.seed ^ DICE_SALT),
        counters,
    };
    Ok((publisher, sockets))
}

impl Publisher {
    /// Queues what `admission` changed for the publisher task. Call it with the cache lock held, right
    /// after the admission.
    pub fn admitted(&self, prompt: &Arc<SimPrompt>, admission: &Admission) {
        if admission.evicted.is_empty() && admission.stored.is_empty() {
            return;
        }
        let change = Change {
            generation: self.generation.load(Relaxed),
            prompt: prompt.clone(),
            evicted: admission.evicted.clone(),
            stored: admission.stored.clone(),
            drop: self.dice.roll(f64::from_bits(self.drop_rate.load(Relaxed))),
            created: tokio::time::Instant::now(),
        };
        if self.queue.try_send(change).is_err() {
            self.counters.overflowed.fetch_add(1, Relaxed);
            self.counters.lost.fetch_add(1, Relaxed);
        }
    }

    /// A restarted engine: seq back to 0, an empty ring, nothing announced, and nothing still queued
    /// published. Call it with the cache lock held, as the cache is cleared.
    pub fn restart(&self) {
        let generation = self.generation.fetch_add(1, Relaxed) + 1;
        self.counters.lost.store(0, Relaxed);
        lock(&self.log).restart(generation);
    }

    pub fn set_drop_rate(&self, rate: f64) {
        self.drop_rate.store(rate.clamp(0.0, 1.0).to_bits(), Relaxed);
    }
}
