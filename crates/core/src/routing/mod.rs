//! Pipeline step 4, **select**: choose the worker for a request from the block index (who holds how
//! much of the prompt) and the in-flight load (who is busy), under the configured policy.
//!
//! The proxy uses the [`Router`] facade only: [`Router::select`] ranks the selectable workers (a
//! [`Decision`] whose `candidates` a retry walks in order) → [`Router::admit`] (the worker's state still
//! allows a request: not ejected since, or the half-open probe is free) → [`Router::begin`] (hold the
//! load until the response ends) → [`Router::record`] (remember what the chosen worker now caches:
//! `Pending` until its events confirm it if the worker publishes KV events, `Approximate` otherwise) →
//! [`Router::succeeded`] / [`Router::failed`] (the outcome, which may eject or recover the worker). A
//! worker's event feed reports through [`Router::store_events`], [`Router::remove_events`] and
//! [`Router::clear_worker`]. Parts: [`worker`] (a worker owns its availability, load and event-feed
//! flag), [`outlier`] (the availability state machine: healthy / ejected / half-open / down), [`index`] (chained block keys →
//! (worker, source) entries, TTLs + global LRU budget), [`load`] (in-flight counters and the RAII guard),
//! and one file per policy behind the `Policy` trait (`policy.rs`).
//!
//! Every policy reports the per-worker overlap from the index, not just `kv`: a probe is a few
//! microseconds (see `benches/index.rs`), and it keeps `mmrouter_kv_overlap_tokens` meaning the same
//! whatever the policy, so policies can be compared on it.

mod adapters;
mod encode;
pub mod events;
pub mod index;
mod kv;
mod least_loaded;
mod link;
mod load;
mod outlier;
mod policy;
pub mod residency;
mod round_robin;
pub mod unseen;
mod worker;

use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

pub use index::{BlockIndex, BySource, Overlap, Source, MAX_WORKERS};
pub use link::Link;
pub use load::{InFlight, Load, WorkerLoad};
pub use outlier::{Availability, EjectionConfig, EjectionError, Failure, Transition};
pub use worker::{
    Admission, Engine, EngineKvTransfer, EngineMmCache, LoadGuard, Role, ServedModels, Worker, WorkerSpec,
};

pub use encode::{EncodePolicy, EncodeRequest};
pub use policy::SelectRequest;
pub use residency::{Held, ImageBudgets, ImageUse};
pub use unseen::Unseen;

use policy::{Candidates, Policy};

/// Which selection strategy the router uses (`[routing] policy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    /// Cache- and load-aware cost (the default).
    #[default]
    Kv,
    RoundRobin,
    LeastLoaded,
}

/// `[routing]` section of the configuration.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RoutingConfig {
    pub policy: PolicyKind,
    /// Weight of (uncached prompt + in-flight prefill) tokens in the `kv` cost.
    pub prefill_weight: f64,
    /// Weight of in-flight decode tokens in the `kv` cost.
    pub decode_weight: f64,
    /// Weight, relative to the request's own uncached tokens, of the prefill tokens already in flight
    /// on a worker (its queue) in the `kv` cost. Below 1 because the tokens a miss computes delay every
    /// request queued behind them on that worker and store a second copy of a prefix another worker
    /// holds, while the queue delays this request alone (and is counted whole until each request's
    /// first byte, although part of it is already computed). See `kv.rs` and docs/benchmarks.md.
    pub queue_weight: f64,
    /// Weight, relative to `prefill_weight`, of the cached tokens a worker would have to evict to store
    /// the request's new blocks (known only for workers whose KV events show a full cache): what the
    /// cache's earlier users may recompute. Below 1 because an engine evicts its least recently used
    /// blocks, which are the least likely to be asked for again (docs/benchmarks.md, "Eviction
    /// weight"). 0 ignores cache room.
    pub eviction_weight: f64,
    /// 0 = lowest cost wins; > 0 = softmax sampling over normalised costs (higher = more spread).
    pub temperature: f64,
    /// Global budget of block keys in the index (all workers together), LRU-evicted.
    pub index_max_blocks: usize,
    /// Largest fraction of `index_max_blocks` one worker's KV events may hold as `Event` entries;
    /// beyond it that worker's new event blocks are refused (counted), so one worker publishing more
    /// than any cache holds cannot evict the other workers' routing state. In (0, 1].
    pub index_worker_share: f64,
    /// Seconds a dispatch to a worker without KV events counts as cached there (`Approximate` entries).
    pub index_ttl_secs: u64,
    /// Seconds a dispatch to a worker that publishes KV events counts as cached there until its own
    /// event confirms it (`Pending` entries); unconfirmed, it expires.
    pub pending_ttl_secs: u64,
    /// Prefill tokens one image token's vision-encoder pass costs (the `kv` cost credits a worker
    /// whose encoder cache likely holds a request's image with this × its tokens). 0 turns it off.
    pub image_encoder_weight: f64,
    /// Prefill tokens one image token's decode + preprocessing costs (credited where the processor
    /// cache likely holds the image). 0 turns it off.
    pub image_preprocess_weight: f64,
    /// The workers' encoder-cache budget in encoder tokens (vLLM: max(max_num_batched_tokens, the
    /// model's largest image), 16384 for the Qwen-VL profiles).
    pub encoder_cache_tokens: u64,
    /// The workers' processor cache in GiB (vLLM's `--mm-processor-cache-gb`, default 4; 0 = off).
    pub processor_cache_gb: f64,
    /// Weight, relative to an image's own encoder work, of the encoder tokens already in flight on an
    /// encode worker (its queue) when the encoder stage picks one (`encode.rs`): 1 weighs a queued
    /// token as one to compute, so an image leaves the encoder that holds it once that encoder's queue
    /// costs more than encoding the image again elsewhere.
    pub encode_queue_weight: f64,
    /// How the encoder stage picks an encode worker: `residency` (default), or `round_robin` /
    /// `hash_ring` as peers do (for comparison).
    pub encode_policy: EncodePolicy,
    /// Prefill tokens a request for a LoRA adapter costs a worker that does not have the adapter
    /// active (not in its engine's running or waiting adapters, not sent there by this router in the
    /// last minute): its engine must swap the adapter into a LoRA slot (`max_loras`), evicting
    /// another when all are taken. Small beside a long cached prefix, so a large KV overlap still
    /// wins (`kv.rs`). 0 turns it off.
    pub adapter_swap_tokens: f64,
    /// `[routing.ejection]`: passive outlier detection (see [`outlier`]).
    pub ejection: EjectionConfig,
}

impl Default for RoutingConfig {
    fn default() -> Self {
        RoutingConfig {
            policy: PolicyKind::Kv,
            prefill_weight: 1.0,
            decode_weight: 1.0,
            queue_weight: 0.25,
            eviction_weight: 0.25,
            temperature: 0.0,
            index_max_blocks: 1_000_000,
            index_worker_share: 0.5,
            index_ttl_secs: 600,
            pending_ttl_secs: 30,
            image_encoder_weight: 0.35,
            image_preprocess_weight: 0.25,
            encoder_cache_tokens: ImageBudgets::VLLM_DEFAULT.encoder_tokens,
            processor_cache_gb: (ImageBudgets::VLLM_DEFAULT.processor_bytes >> 30) as f64,
            encode_queue_weight: 1.0,
            encode_policy: EncodePolicy::Residency,
            adapter_swap_tokens: 256.0,
            ejection: EjectionConfig::default(),
        }
    }
}

/// Largest `index_max_blocks` (the index's key table addresses at most 2^32 entries at load ≤ 3/4).
const MAX_INDEX_BLOCKS: usize = index::MAX_BLOCKS;

/// Why a routing configuration or router could not be built. Messages name the key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RoutingError {
    #[error("{key} must be a finite number >= 0 (got {value})")]
    InvalidNumber { key: &'static str, value: f64 },
    #[error("{key} must be a number in (0, 1] (got {value})")]
    NotAFraction { key: &'static str, value: f64 },
    #[error("{key} must be between {min} and {max} (got {value})")]
    OutOfRange { key: &'static str, min: u64, max: u64, value: u64 },
    #[error("routing supports at most {max} workers, [[workers]] lists {got}")]
    TooManyWorkers { got: usize, max: usize },
    #[error("worker name {name:?} appears more than once in [[workers]]")]
    DuplicateWorker { name: String },
    #[error("every worker slot is held by a removed worker still finishing its requests; retry shortly")]
    NoFreeSlot,
    #[error("worker id {0} is not a live worker of this pool")]
    UnknownWorker(usize),
    #[error("routing.{0}")]
    Ejection(#[from] EjectionError),
}

impl RoutingError {
    /// Stable snake_case label (for logs and metric labels).
    pub fn label(&self) -> &'static str {
        match self {
            RoutingError::InvalidNumber { .. } => "invalid_number",
            RoutingError::NotAFraction { .. } => "not_a_fraction",
            RoutingError::OutOfRange { .. } => "out_of_range",
            RoutingError::TooManyWorkers { .. } => "too_many_workers",
            RoutingError::DuplicateWorker { .. } => "duplicate_worker",
            RoutingError::NoFreeSlot => "no_free_slot",
            RoutingError::UnknownWorker(_) => "unknown_worker",
            RoutingError::Ejection(e) => e.label(),
        }
    }
}

impl RoutingConfig {
    /// Checks every key; the error names the first bad one.
    pub fn validate(&self) -> Result<(), RoutingError> {
        for (key, value) in [
            ("routing.prefill_weight", self.prefill_weight),
            ("routing.decode_weight", self.decode_weight),
            ("routing.queue_weight", self.queue_weight),
            ("routing.eviction_weight", self.eviction_weight),
            ("routing.temperature", self.temperature),
            ("routing.image_encoder_weight", self.image_encoder_weight),
            ("routing.image_preprocess_weight", self.image_preprocess_weight),
            ("routing.processor_cache_gb", self.processor_cache_gb),
            ("routing.encode_queue_weight", self.encode_queue_weight),
            ("routing.adapter_swap_tokens", self.adapter_swap_tokens),
        ] {
            if !value.is_finite() || value < 0.0 {
                return Err(RoutingError::InvalidNumber { key, value });
            }
        }
        let share = self.index_worker_share;
        if !share.is_finite() || share <= 0.0 || share > 1.0 {
            return Err(RoutingError::NotAFraction { key: "routing.index_worker_share", value: share });
        }
        let blocks = self.index_max_blocks as u64;
        if !(1..=MAX_INDEX_BLOCKS as u64).contains(&blocks) {
            let max = MAX_INDEX_BLOCKS as u64;
            return Err(RoutingError::OutOfRange { key: "routing.index_max_blocks", min: 1, max, value: blocks });
        }
        // Stamps are whole seconds in a u32.
        for (key, value) in
            [("routing.index_ttl_secs", self.index_ttl_secs), ("routing.pending_ttl_secs", self.pending_ttl_secs)]
        {
            if !(1..=u64::from(u32::MAX)).contains(&value) {
                return Err(RoutingError::OutOfRange { key, min: 1, max: u64::from(u32::MAX), value });
            }
        }
        self.ejection.validate()?;
        Ok(())
    }

    /// The workers' image-cache budgets (`residency`).
    pub fn image_budgets(&self) -> ImageBudgets {
        let bytes = (self.processor_cache_gb * (1u64 << 30) as f64) as u64;
        ImageBudgets { encoder_tokens: self.encoder_cache_tokens, processor_bytes: bytes }
    }

    /// Most `Event` entries one worker may hold in the index (at least 1).
    pub fn worker_share_blocks(&self) -> usize {
        ((self.index_max_blocks as f64 * self.index_worker_share) as usize).max(1)
    }
}

/// How a pool with roles serves (see [`Router::shape`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolShape {
    /// Prefill and decode workers: P/D.
    pub pd: bool,
    /// Encode workers: an encoder stage before prefill (or before the whole request).
    pub encode: bool,
    /// The role that serves a whole request: `both` when the pool has such workers, else `decode`.
    pub whole: Role,
}

/// The ranking behind one choice (answered by `/debug/route`). The router never stores it: the caller
/// holds it for the request's life and walks `candidates` on retries.
#[derive(Clone, Debug, Serialize)]
pub struct Decision {
    /// Healthy workers, best first: the policy's pick, then the others by ascending cost (ties in
    /// rotation order after the pick).
    pub candidates: Vec<usize>,
    /// Leading blocks of the prompt each worker holds (index = worker).
    pub overlap_blocks: Vec<u32>,
    /// The same overlap split by where the index learnt it (events, pending dispatches, approximate
    /// dispatches), index = worker.
    pub overlap_sources: Vec<Overlap>,
    /// Each worker's score under the policy, lower is better (kv: the cost; least_loaded: in-flight
    /// requests; round_robin: 0). NaN (`null` in JSON) for unhealthy workers.
    pub costs: Vec<f64>,
    /// Prefill-token equivalents each worker saves through the request's images its engine likely
    /// still holds outside the KV cache (the `kv` cost subtracts it; see `residency`).
    pub image_credit: Vec<f64>,
    /// Tokens the engines counted inside the prompt that a text-prefix plan could not (learnt from
    /// earlier answers, see `unseen`): per worker within its overlap, and the prompt's own.
    pub unseen: Unseen,
    pub policy: &'static str,
    /// The worker list the decision was made from (one `Arc` for all): while the decision lives, no
    /// candidate's id can be given to another worker (see [`Router`]).
    #[serde(skip)]
    _held: Arc<Vec<Arc<Worker>>>,
}

impl Decision {
    /// The policy's pick.
    pub fn worker(&self) -> usize {
        self.candidates[0]
    }

    /// Prompt tokens `worker` is predicted to hold, by its overlapping blocks.
    pub fn overlap_tokens(&self, worker: usize, block_size: u32) -> u32 {
        self.overlap_blocks.get(worker).copied().unwrap_or(0).saturating_mul(block_size)
    }

    /// Prefill tokens the request puts on `worker`: its planned tokens plus what the engines were
    /// seen to count beyond them, less what the worker holds.
    pub fn prefill_tokens(&self, worker: usize, prompt_tokens: u32, block_size: u32) -> u32 {
        let held = self.overlap_tokens(worker, block_size).min(prompt_tokens);
        (prompt_tokens - held).saturating_add(self.unseen.outside(worker))
    }
}

/// Worker selection for one pool: its workers, the block index, the policy. `Send + Sync`.
///
/// **Worker ids are slots, reused only when provably unreferenced.** A worker's id is its position in
/// `workers`; the index, a [`Decision`], an [`Admission`], a [`LoadGuard`] and the server's event
/// feeds name workers by it. A removed worker keeps its slot until (1) the router holds the only
/// `Arc` to it — every holder of an id that may still act on it (an admission, a load guard, an event
/// feed, an admin call) holds the worker's `Arc` too, and a decision the worker list it was made from,
/// which the router copies before it looks for a free slot — and (2) the
/// index holds none of its entries. Only then may [`Router::add_worker`] or a [`Router::change`] give the
/// slot to a new worker, so an id in flight or in the index never names another worker, and add/remove
/// cycles run forever within [`MAX_WORKERS`] slots.
pub struct Router {
    /// Slots, grown at run time up to [`MAX_WORKERS`]; a removed worker's slot is reused as above.
    /// Shared with the decisions made from it (a selection takes one `Arc`, not one per worker) and
    /// copied on write by a [`Change`].
    workers: parking_lot::RwLock<Arc<Vec<Arc<Worker>>>>,
    index: BlockIndex,
    policy: Box<dyn Policy>,
    ejection: EjectionConfig,
    /// Most `Event` entries one worker may hold (`RoutingConfig::worker_share_blocks`).
    share: usize,
    /// The cluster this router's decisions are shared with (none for a lone replica).
    link: parking_lot::RwLock<Option<Arc<dyn Link>>>,
    images: ImageAffinity,
    unseen: unseen::UnseenTokens,
}

/// How the router weighs the images its workers likely still hold (`[routing] image_*`).
#[derive(Debug)]
struct ImageAffinity {
    budgets: ImageBudgets,
    encoder_weight: f64,
    preprocess_weight: f64,
    encode_queue_weight: f64,
    encode_policy: EncodePolicy,
    /// The round-robin encode policy's turn.
    encode_turn: std::sync::atomic::AtomicUsize,
}

impl ImageAffinity {
    /// Prefill-token equivalents `worker` saves on the request's images. vLLM's processor runs in
    /// its front end on every request, so a processor-cache hit counts for every image; its encoder
    /// skips images inside the cached prefix (`overlap_tokens`) anyway, so the encoder cache counts
    /// only for the others.
    fn credit(&self, worker: &Worker, images: &[ImageUse], overlap_tokens: u64) -> f64 {
        if self.encoder_weight == 0.0 && self.preprocess_weight == 0.0 {
            return 0.0;
        }
        let held = worker.images_held(images);
        let per_image = images.iter().zip(held).map(|(i, h)| {
            let encoder = if i.end > overlap_tokens { self.encoder_weight * h.encoder } else { 0.0 };
            f64::from(i.tokens) * (encoder + self.preprocess_weight * h.processor)
        });
        per_image.sum()
    }
}

/// A validated set of worker changes for one router, holding its worker list locked until it is
/// committed or dropped (dropping changes nothing). See [`Router::change`].
#[must_use = "a prepared change does nothing until committed"]
pub struct Change<'a> {
    workers: parking_lot::RwLockWriteGuard<'a, Arc<Vec<Arc<Worker>>>>,
    retire: Vec<usize>,
    /// (slot, spec) per added worker, in the order given.
    add: Vec<(usize, WorkerSpec)>,
    budgets: ImageBudgets,
}

impl Change<'_> {
    /// Applies the change: the retired workers are drained (out of rotation; the caller removes them
    /// once idle) and the added ones take their slots, healthy with an empty index. Cannot fail.
    /// Returns the added workers' ids, in the order given.
    pub fn commit(mut self) -> Vec<usize> {
        for &id in &self.retire {
            self.workers[id].set_draining();
        }
        let mut ids = Vec::with_capacity(self.add.len());
        // Unshared by `Router::change`, so this copies nothing.
        let workers = Arc::make_mut(&mut self.workers);
        for (slot, spec) in std::mem::take(&mut self.add) {
            let worker = Arc::new(Worker::with_image_budgets(spec, self.budgets));
            match workers.get_mut(slot) {
                Some(old) => *old = worker,
                None => workers.push(worker),
            }
            ids.push(slot);
        }
        ids
    }
}

impl Router {
    /// Builds a router over `workers` (their position is the worker id everywhere). At most
    /// [`MAX_WORKERS`], names unique.
    pub fn new(cfg: RoutingConfig, workers: Vec<WorkerSpec>) -> Result<Router, RoutingError> {
        cfg.validate()?;
        if workers.len() > MAX_WORKERS {
            return Err(RoutingError::TooManyWorkers { got: workers.len(), max: MAX_WORKERS });
        }
        for (i, w) in workers.iter().enumerate() {
            if workers[..i].iter().any(|o| o.name == w.name) {
                // Gauges are labelled by name: two workers with one name would share a series.
                return Err(RoutingError::DuplicateWorker { name: w.name.clone() });
            }
        }
        let policy: Box<dyn Policy> = match cfg.policy {
            PolicyKind::Kv => Box::new(kv::Kv {
                prefill_weight: cfg.prefill_weight,
                decode_weight: cfg.decode_weight,
                queue_weight: cfg.queue_weight,
                eviction_weight: cfg.eviction_weight,
                temperature: cfg.temperature,
                adapter_swap_tokens: cfg.adapter_swap_tokens,
            }),
            PolicyKind::RoundRobin => Box::new(round_robin::RoundRobin::new()),
            PolicyKind::LeastLoaded => Box::new(least_loaded::LeastLoaded),
        };
        let index = BlockIndex::new(cfg.index_max_blocks, cfg.index_ttl_secs, cfg.pending_ttl_secs)
            .with_worker_share(cfg.worker_share_blocks());
        let budgets = cfg.image_budgets();
        let workers = workers.into_iter().map(|w| Arc::new(Worker::with_image_budgets(w, budgets))).collect();
        Ok(Router {
            index,
            workers: parking_lot::RwLock::new(Arc::new(workers)),
            images: ImageAffinity {
                budgets,
                encoder_weight: cfg.image_encoder_weight,
                preprocess_weight: cfg.image_preprocess_weight,
                encode_queue_weight: cfg.encode_queue_weight,
                encode_policy: cfg.encode_policy,
                encode_turn: std::sync::atomic::AtomicUsize::new(0),
            },
            policy,
            share: cfg.worker_share_blocks(),
            ejection: cfg.ejection,
            link: parking_lot::RwLock::new(None),
            unseen: unseen::UnseenTokens::new(unseen::DEFAULT_CAPACITY),
        })
    }

    /// Shares this router's bookings and dispatch records through `link` from now on.
    pub fn set_link(&self, link: Arc<dyn Link>) {
        *self.link.write() = Some(link);
    }

    /// Whether [`Router::set_link`] was called.
    pub fn has_link(&self) -> bool {
        self.link.read().is_some()
    }

    /// Another replica recorded `blocks` for `worker` at dispatch (see [`Router::record_prompt`]).
    pub fn apply_remote_dispatch(&self, worker: usize, blocks: &[u64], source: Source) {
        if source != Source::Event {
            self.index.record(worker, blocks, source);
        }
    }

    /// The index, for a snapshot or a graft (`index::BlockIndex::export_chunk`, `graft`).
    pub fn index(&self) -> &BlockIndex {
        &self.index
    }

    /// Most `Event` entries one worker may hold in the index: a worker's event state never needs to
    /// track more blocks than this.
    pub fn worker_share(&self) -> usize {
        self.share
    }

    /// Every slot's worker, removed ones included until their slot is reused (see
    /// [`Worker::is_removed`]). While the result is held, no removed slot is reusable (a slot is free only
    /// when the router holds its worker's last `Arc`): listings want [`Router::live_workers`].
    pub fn workers(&self) -> Vec<Arc<Worker>> {
        self.workers.read().to_vec()
    }

    /// The workers not removed, with their ids.
    pub fn live_workers(&self) -> Vec<(usize, Arc<Worker>)> {
        let workers = self.workers.read();
        workers.iter().enumerate().filter(|(_, w)| !w.is_removed()).map(|(i, w)| (i, w.clone())).collect()
    }

    /// Worker `id` (as found in a [`Decision`]).
    pub fn worker(&self, id: usize) -> Arc<Worker> {
        self.workers.read()[id].clone()
    }

    /// The id of the worker named `name`: the one in rotation, else one still draining (not removed).
    pub fn find(&self, name: &str) -> Option<usize> {
        self.lookup(name).map(|(id, _)| id)
    }

    /// [`find`](Self::find), with the worker: holding its `Arc` keeps the id from naming another worker
    /// while the caller acts on it.
    pub fn lookup(&self, name: &str) -> Option<(usize, Arc<Worker>)> {
        let workers = self.workers.read();
        let named = |keep: fn(&Worker) -> bool| workers.iter().position(|w| w.name() == name && keep(w));
        let id = named(Worker::in_rotation).or_else(|| named(|w| !w.is_removed()))?;
        Some((id, workers[id].clone()))
    }

    /// Adds a worker at run time; it starts healthy with an empty index. Its id is a free slot (see
    /// [`Router`]).
    pub fn add_worker(&self, spec: WorkerSpec) -> Result<usize, RoutingError> {
        Ok(self.change(&[], vec![spec])?.commit()[0])
    }

    /// Prepares, all or nothing, retiring the workers `retire` (ids of workers not removed) and adding
    /// `add`: names unique among the workers staying in rotation, at most [`MAX_WORKERS`] workers not
    /// removed, a free slot for each addition. Nothing changes until [`Change::commit`]; the worker list
    /// stays locked meanwhile, so the checks still hold then (a caller changing several routers
    /// prepares them all, then commits them all).
    pub fn change(&self, retire: &[usize], add: Vec<WorkerSpec>) -> Result<Change<'_>, RoutingError> {
        let workers = self.unshared_workers();
        for &id in retire {
            if workers.get(id).is_none_or(|w| w.is_removed()) {
                return Err(RoutingError::UnknownWorker(id));
            }
        }
        let stays = |i: usize, w: &Worker| w.in_rotation() && !retire.contains(&i);
        for (k, spec) in add.iter().enumerate() {
            // A draining worker of that name is on its way out (a reload replacing its URL).
            let taken = workers.iter().enumerate().any(|(i, w)| w.name() == spec.name && stays(i, w));
            if taken || add[..k].iter().any(|o| o.name == spec.name) {
                return Err(RoutingError::DuplicateWorker { name: spec.name.clone() });
            }
        }
        let live = workers.iter().filter(|w| !w.is_removed()).count();
        if live + add.len() > MAX_WORKERS {
            return Err(RoutingError::TooManyWorkers { got: live + add.len(), max: MAX_WORKERS });
        }
        let slots = self.free_slots(&workers, add.len()).ok_or(RoutingError::NoFreeSlot)?;
        let add = slots.into_iter().zip(add).collect();
        Ok(Change { workers, retire: retire.to_vec(), add, budgets: self.images.budgets })
    }

    /// The worker list, write-locked and held by the router alone: a list a decision still holds is
    /// copied first, so each of its workers counts that holder in its own `Arc` (which `reusable` and
    /// `forget_removed` read).
    fn unshared_workers(&self) -> parking_lot::RwLockWriteGuard<'_, Arc<Vec<Arc<Worker>>>> {
        let mut workers = self.workers.write();
        Arc::make_mut(&mut workers);
        workers
    }

    /// `n` slots for new workers: reusable ones first (the list stays as short as the pool, which keeps
    /// probes and decisions small), then new ones up to [`MAX_WORKERS`].
    fn free_slots(&self, workers: &[Arc<Worker>], n: usize) -> Option<Vec<usize>> {
        let reusable = workers.iter().enumerate().filter(|(i, w)| self.reusable(*i, w)).map(|(i, _)| i);
        let fresh = workers.len()..MAX_WORKERS;
        let slots: Vec<usize> = reusable.chain(fresh).take(n).collect();
        (slots.len() == n).then_some(slots)
    }

    /// A removed worker's slot may take a new worker: nothing but the router holds the worker (the
    /// caller holds the list's write lock, so no new holder can appear) and the index holds none of
    /// its entries.
    fn reusable(&self, id: usize, w: &Arc<Worker>) -> bool {
        w.is_removed() && Arc::strong_count(w) == 1 && self.index.held_by(id) == 0
    }

    /// Takes `worker` out of rotation: no new request goes to it; those in flight finish.
    pub fn drain(&self, worker: usize) {
        self.worker(worker).set_draining();
    }

    /// Removes a worker (call once it is drained and idle): never selected again, its blocks forgotten.
    /// Its slot is reused once nothing references it (see [`Router`]); entries written for it after
    /// this (an event batch already under way) are dropped by [`Router::forget_removed`].
    pub fn remove(&self, worker: usize) {
        self.worker(worker).set_removed();
        self.clear_worker(worker);
    }

    /// For a removed `worker` whose only other holder is the caller's `held` (its event feeds have
    /// stopped, no decision names it): drops whatever was written for it since its removal, so its
    /// slot can be reused. Returns false, doing nothing, while anyone else still holds it.
    pub fn forget_removed(&self, worker: usize, held: &Arc<Worker>) -> bool {
        let current = self.unshared_workers().get(worker).is_some_and(|w| Arc::ptr_eq(w, held));
        // The router's `Arc` and the caller's: nobody else can still write for this id.
        if !current || !held.is_removed() || Arc::strong_count(held) > 2 {
            return false;
        }
        self.clear_worker(worker);
        true
    }

    /// Ranks the selectable workers (healthy, or half-open with no probe out) that serve whole
    /// requests (role `both`); `None` if there is none.
    pub fn select(&self, req: &SelectRequest<'_>) -> Option<Decision> {
        self.select_for(req, Role::Both)
    }

    /// The LoRA adapters the workers in rotation list, each once, sorted.
    pub fn adapters(&self) -> Vec<String> {
        let workers = self.workers.read();
        let mut names: Vec<String> = workers
            .iter()
            .filter(|w| w.in_rotation())
            .filter_map(|w| w.served_models())
            .flat_map(|s| s.adapters.clone())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// Whether some worker in rotation lists LoRA adapter `name`.
    pub fn serves_adapter(&self, name: &str) -> bool {
        self.workers.read().iter().any(|w| w.in_rotation() && w.serves_adapter(name) == Some(true))
    }

    /// How the pool serves now, from its workers' roles; `None` for a plain aggregated pool.
    /// Read on every request: one pass over the workers, no allocation.
    pub fn shape(&self) -> Option<PoolShape> {
        let bit = |r: Role| 1u8 << r as u8;
        let roles = self.workers.read().iter().filter(|w| w.in_rotation()).fold(0u8, |m, w| m | bit(w.role()));
        let has = |r: Role| roles & bit(r) != 0;
        if !has(Role::Prefill) && !has(Role::Decode) && !has(Role::Encode) {
            return None;
        }
        let whole = if has(Role::Both) || !has(Role::Decode) { Role::Both } else { Role::Decode };
        Some(PoolShape { pd: has(Role::Prefill) && has(Role::Decode), encode: has(Role::Encode), whole })
    }

    /// [`select`](Self::select) among the workers of `role`: a prefill leg by its KV overlap and
    /// prefill load, a decode leg by its own cached prefix (what it need not pull) and load, under the
    /// pool's policy.
    pub fn select_for(&self, req: &SelectRequest<'_>, role: Role) -> Option<Decision> {
        self.select_model(req, role, None)
    }

    /// [`select_for`](Self::select_for) a request for LoRA `adapter`: workers whose engine's listing
    /// lacks it are not ranked (a worker whose listing is not known yet — not read so far, or an engine
    /// the router does not ask — is).
    pub fn select_model(&self, req: &SelectRequest<'_>, role: Role, adapter: Option<&str>) -> Option<Decision> {
        let now = Instant::now();
        let workers = self.workers.read().clone();
        let serves = |w: &Worker| adapter.is_none_or(|a| w.serves_adapter(a) != Some(false));
        let eligible: Vec<bool> = workers.iter().map(|w| w.role() == role && w.selectable(now) && serves(w)).collect();
        if !eligible.contains(&true) {
            return None;
        }
        let overlap_sources = self.index.probe_detail(req.blocks, workers.len());
        let overlap_blocks: Vec<u32> = overlap_sources.iter().map(|o| o.blocks).collect();
        let image_credit = self.image_credit(&workers, req, &overlap_blocks);
        let unseen = match req.unseen {
            true => Unseen::weigh(&self.unseen.along(req.blocks), &overlap_blocks),
            false => Unseen::default(),
        };
        let adapter_cold = adapter_cold(&workers, &eligible, adapter);
        let candidates = Candidates {
            req,
            workers: &workers,
            eligible: &eligible,
            overlap_blocks: &overlap_blocks,
            image_credit: &image_credit,
            unseen: &unseen,
            adapter_cold: &adapter_cold,
        };
        let pick = self.policy.pick(&candidates, &mut rand::rng())?;
        let candidates = rank(pick.worker, &pick.costs, &eligible);
        let _held = workers;
        let policy = self.policy.name();
        let costs = pick.costs;
        Some(Decision { candidates, overlap_blocks, overlap_sources, costs, image_credit, unseen, policy, _held })
    }

    /// Ranks the encode workers for a request's images (see `encode.rs`): the decision's `costs` are
    /// the encode costs, its `image_credit` the encoder tokens each likely holds; no overlap. `None`
    /// when no encode worker is selectable.
    pub fn select_encoder(&self, req: &EncodeRequest<'_>) -> Option<Decision> {
        let workers = self.workers.read().clone();
        let weights = encode::EncodeWeights {
            encoder: self.images.encoder_weight.max(f64::MIN_POSITIVE),
            preprocess: self.images.preprocess_weight,
            queue: self.images.encode_queue_weight,
        };
        let (costs, image_credit) = encode::costs(&workers, req, weights);
        let policy = self.images.encode_policy;
        let pick = encode::pick(policy, &workers, req, &costs, &self.images.encode_turn)?;
        let eligible: Vec<bool> = costs.iter().map(|c| !c.is_nan()).collect();
        let candidates = rank(pick, &costs, &eligible);
        let n = workers.len();
        Some(Decision {
            candidates,
            overlap_blocks: vec![0; n],
            overlap_sources: vec![Overlap::default(); n],
            costs,
            image_credit,
            unseen: Unseen::default(),
            policy: policy.label(),
            _held: workers,
        })
    }

    /// Per worker, the image credit of the request (all 0 without images).
    fn image_credit(&self, workers: &[Arc<Worker>], req: &SelectRequest<'_>, overlap: &[u32]) -> Vec<f64> {
        if req.images.is_empty() {
            return vec![0.0; workers.len()];
        }
        let bs = u64::from(req.block_size);
        workers.iter().zip(overlap).map(|(w, &o)| self.images.credit(w, &req.images, u64::from(o) * bs)).collect()
    }

    /// Holds the request's load on `worker` until the guard drops (see [`LoadGuard`]).
    pub fn begin(&self, worker: usize, load: Load) -> LoadGuard {
        let w = self.worker(worker);
        let link = self.link.read().clone();
        // Booked before the guard exists, so the booking leaves before the request is dispatched.
        let booking = link.as_ref().map(|l| l.book(w.name(), load));
        let guard = LoadGuard::hold(w, load);
        match (link, booking) {
            (Some(link), Some(id)) => guard.booked(link, id),
            _ => guard,
        }
    }

    /// Remembers that `worker` was sent a prompt with `blocks` (call at dispatch): `Pending` if the
    /// worker publishes KV events (its events will confirm the blocks), `Approximate` otherwise.
    pub fn record(&self, worker: usize, blocks: &[u64]) {
        self.record_prompt(worker, blocks, blocks.len(), true);
    }

    /// [`record`](Self::record) for a prompt with images. `image_from` is the first block holding image
    /// tokens (`blocks.len()` without images); `uuid_named` says the worker's engine names the images
    /// by the uuid the router gave them. Blocks from `image_from` on that the worker's events cannot
    /// confirm are recorded `Approximate` (so they do not vanish when pending entries expire): on
    /// SGLang, whose events name image tokens by pad values the router cannot compute, and on vLLM
    /// when the request's kwargs make it rehash the uuids.
    pub fn record_prompt(&self, worker: usize, blocks: &[u64], image_from: usize, uuid_named: bool) {
        let Some(w) = self.workers.read().get(worker).cloned() else { return };
        let confirmable = match (w.publishes_events(), w.engine()) {
            (false, _) => 0,
            (true, Engine::Vllm) if uuid_named => blocks.len(),
            (true, _) => image_from.min(blocks.len()),
        };
        let (confirmed, guessed) = blocks.split_at(confirmable);
        self.index.record(worker, confirmed, Source::Pending);
        self.index.record(worker, guessed, Source::Approximate);
        if let Some(link) = self.link.read().as_ref() {
            for (part, source) in [(confirmed, Source::Pending), (guessed, Source::Approximate)] {
                if !part.is_empty() {
                    link.dispatched(w.name(), part, source);
                }
            }
        }
    }

    /// A text-prefix plan's prompt ending at block `key` cost its engine `tokens` more than the router
    /// counted (its answer's `usage.prompt_tokens` less the plan's tokens): see `unseen`.
    pub fn learn_unseen(&self, key: u64, tokens: u32) {
        if tokens > 0 {
            self.unseen.learn(key, tokens);
            if let Some(link) = self.link.read().as_ref() {
                link.unseen_learnt(key, tokens);
            }
        }
    }

    /// Another replica learnt a fallback prefix's unseen tokens ([`Link::unseen_learnt`]); not passed
    /// on again.
    pub fn apply_remote_unseen(&self, key: u64, tokens: u32) {
        if tokens > 0 {
            self.unseen.learn(key, tokens);
        }
    }

    /// Remembers that `worker`'s engine was sent these images (call at dispatch, exact route only: a
    /// fallback names no image).
    pub fn images_sent(&self, worker: usize, images: &[ImageUse]) {
        if images.is_empty() {
            return;
        }
        let Some(w) = self.workers.read().get(worker).cloned() else { return };
        w.images_sent(images);
        if let Some(link) = self.link.read().as_ref() {
            link.images_sent(w.name(), images);
        }
    }

    /// Another replica sent `images` to `worker` (its [`Link::images_sent`]); not passed on again.
    pub fn apply_remote_images(&self, worker: usize, images: &[ImageUse]) {
        if let Some(w) = self.workers.read().get(worker) {
            w.images_sent(images);
        }
    }

    /// `worker`'s event feed announced `keys` (one `BlockStored`, in chain order). Keys beyond the
    /// worker's share of the index (`routing.index_worker_share`) are refused and counted on the
    /// worker ([`Worker::index_refused`]).
    pub fn store_events(&self, worker: usize, keys: &[u64]) {
        let refused = self.index.store_events(worker, keys);
        if refused > 0 {
            if let Some(w) = self.workers.read().get(worker) {
                w.count_index_refused(refused as u64);
            }
        }
    }

    /// `Event` entries `worker` holds in the index.
    pub fn events_held_by(&self, worker: usize) -> usize {
        self.index.events_held_by(worker)
    }

    /// Entries of every source `worker` holds in the index.
    pub fn held_by(&self, worker: usize) -> usize {
        self.index.held_by(worker)
    }

    /// `worker`'s event feed announced that `keys` were evicted.
    pub fn remove_events(&self, worker: usize, keys: &[u64]) {
        self.index.remove_events(worker, keys);
    }

    /// Forgets every block `worker` holds, whatever the source: it went down, restarted, cleared its
    /// cache, or its event feed is resyncing. Chunked, so probes keep running meanwhile.
    pub fn clear_worker(&self, worker: usize) {
        self.index.remove_worker(worker);
    }

    /// The active health check failed: `worker` is down and its blocks are forgotten (it died, or
    /// stopped answering: it may come back with an empty cache). Returns true if it was up until now.
    pub fn mark_down(&self, worker: usize) -> bool {
        let changed = self.worker(worker).with_outlier(|o| o.checked(false, Instant::now()));
        if changed {
            self.clear_worker(worker);
        }
        changed
    }

    /// The active health check passed: a down or half-open worker is healthy again (an ejected one
    /// serves its back-off first). Returns true if that changed its state.
    pub fn mark_up(&self, worker: usize) -> bool {
        self.worker(worker).with_outlier(|o| o.checked(true, Instant::now()))
    }

    /// Claims the right to send one request to `worker` now; `None` if its state refuses (ejected,
    /// down, or half-open with its probe already out).
    pub fn admit(&self, worker: usize) -> Option<Admission> {
        let w = self.worker(worker);
        if !w.in_rotation() {
            return None; // drained or removed since the ranking
        }
        let probe = w.with_outlier(|o| o.admit(Instant::now()))?;
        Some(Admission::new(w, probe))
    }

    /// A request to `worker` got a good answer; `probe` (see [`Admission::is_probe`]): the half-open
    /// worker's probe, which makes it healthy again.
    pub fn succeeded(&self, worker: usize, probe: bool) -> Option<Transition> {
        self.worker(worker).with_outlier(|o| o.succeeded(probe))
    }

    /// A request to `worker` failed; may eject it (within the pool's ejection cap), or eject it again
    /// for longer if it was the `probe`. An ejection for refused connections forgets the worker's
    /// blocks; any other keeps them for its return.
    pub fn failed(&self, worker: usize, failure: Failure, probe: bool) -> Option<Transition> {
        let now = Instant::now();
        let workers = self.workers.read().clone();
        let live = workers.iter().filter(|w| !w.is_removed());
        let out = live
            .clone()
            .filter(|w| !w.is_healthy() && matches!(w.availability(), Availability::Ejected | Availability::HalfOpen))
            .count();
        let may_eject = out < self.ejection.max_ejected(live.count());
        let t = workers[worker].with_outlier(|o| o.failed(failure, &self.ejection, may_eject, probe, now));
        if let Some(Transition::Ejected { clear_index: true, .. }) = t {
            self.clear_worker(worker);
        }
        t
    }

    /// Block keys the index holds.
    pub fn index_blocks(&self) -> usize {
        self.index.len()
    }

    /// (block, worker) entries the index holds, per source (for a gauge).
    pub fn index_entries(&self) -> BySource {
        self.index.counts()
    }

    /// In-flight load per worker (for `/debug` and tests).
    pub fn loads(&self) -> Vec<WorkerLoad> {
        self.workers.read().iter().map(|w| WorkerLoad { worker: w.name().to_owned(), inflight: w.inflight() }).collect()
    }
}

/// Per worker, whether a request for `adapter` would make its engine swap the adapter into a LoRA slot
/// (it is eligible and the adapter is not active there); empty without an adapter.
fn adapter_cold(workers: &[Arc<Worker>], eligible: &[bool], adapter: Option<&str>) -> Vec<bool> {
    let Some(a) = adapter else { return Vec::new() };
    workers.iter().zip(eligible).map(|(w, &e)| e && !w.adapter_active(a)).collect()
}

/// The pick first, then the other eligible workers by ascending cost; equal costs in rotation order
/// after the pick, so retries spread instead of always trying worker 0 next. The list is built in
/// rotation order and sorted stably by cost alone, so ties keep that order without a rotation key in
/// the comparison, and the common case (most workers tie) is one sorted run: a linear merge.
fn rank(pick: usize, costs: &[f64], eligible: &[bool]) -> Vec<usize> {
    let n = eligible.len();
    let mut order = Vec::with_capacity(n);
    order.push(pick);
    // Rotation order after the pick, as two ranges: a modulo per worker was a third of a 1024-worker
    // select's own time.
    order.extend((pick + 1..n).chain(0..pick).filter(|&i| eligible[i]));
    order[1..].sort_by(|&a, &b| costs[a].total_cmp(&costs[b]));
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_documented_values() {
        let c = RoutingConfig::default();
        assert_eq!(c.policy, PolicyKind::Kv);
        assert_eq!((c.prefill_weight, c.decode_weight, c.temperature), (1.0, 1.0, 0.0));
        assert_eq!((c.index_max_blocks, c.index_ttl_secs, c.pending_ttl_secs), (1_000_000, 600, 30));
        assert_eq!((c.queue_weight, c.eviction_weight), (0.25, 0.25));
        assert_eq!((c.image_encoder_weight, c.image_preprocess_weight), (0.35, 0.25));
        assert_eq!((c.encoder_cache_tokens, c.processor_cache_gb), (16_384, 4.0));
        assert_eq!(c.adapter_swap_tokens, 256.0);
        assert_eq!(c.image_budgets().processor_bytes, 4 << 30);
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn validate_names_the_key() {
        let bad = |f: fn(&mut RoutingConfig)| {
            let mut c = RoutingConfig::default();
            f(&mut c);
            c.validate().expect_err("must be rejected")
        };
        let e = bad(|c| c.temperature = -1.0);
        assert_eq!(e.label(), "invalid_number");
        assert!(e.to_string().starts_with("routing.temperature must be a finite number >= 0"), "{e}");
        assert!(bad(|c| c.prefill_weight = f64::NAN).to_string().contains("routing.prefill_weight"));
        assert!(bad(|c| c.decode_weight = f64::INFINITY).to_string().contains("routing.decode_weight"));
        let e = bad(|c| c.index_max_blocks = 0);
        assert_eq!(e.label(), "out_of_range");
        assert!(e.to_string().contains("routing.index_max_blocks"), "{e}");
        assert!(bad(|c| c.index_ttl_secs = 0).to_string().contains("routing.index_ttl_secs"));
        let e = bad(|c| c.pending_ttl_secs = 0);
        assert_eq!(e.label(), "out_of_range");
        assert!(e.to_string().starts_with("routing.pending_ttl_secs must be between 1 and 4294967295"), "{e}");
        assert!(bad(|c| c.pending_ttl_secs = 1 << 40).to_string().contains("routing.pending_ttl_secs"));
        assert!(bad(|c| c.index_max_blocks = MAX_INDEX_BLOCKS + 1).to_string().contains("routing.index_max_blocks"));
    }

    fn specs(names: &[&str]) -> Vec<WorkerSpec> {
        names.iter().map(|n| WorkerSpec::new(*n, "http://127.0.0.1:1")).collect()
    }

    /// Records what a router tells its cluster.
    #[derive(Default)]
    struct Recorder(std::sync::Mutex<Vec<String>>);

    impl Link for Recorder {
        fn book(&self, worker: &str, load: Load) -> u64 {
            let mut log = self.0.lock().unwrap();
            log.push(format!("book {worker} {}", load.prefill_tokens));
            log.len() as u64
        }
        fn first_byte(&self, booking: u64) {
            self.0.lock().unwrap().push(format!("first_byte {booking}"));
        }
        fn finish(&self, booking: u64) {
            self.0.lock().unwrap().push(format!("finish {booking}"));
        }
        fn dispatched(&self, worker: &str, blocks: &[u64], source: Source) {
            self.0.lock().unwrap().push(format!("dispatched {worker} {} {source:?}", blocks.len()));
        }
    }

    #[test]
    fn a_linked_router_books_before_it_holds_and_shares_its_dispatch_records() {
        let r = Router::new(RoutingConfig::default(), specs(&["a", "b"])).unwrap();
        let link = Arc::new(Recorder::default());
        r.set_link(link.clone());
        let mut g = r.begin(1, Load { prefill_tokens: 40, decode_tokens: 8, image_tokens: 0 });
        r.record(1, &[1, 2, 3]);
        g.first_byte();
        g.first_byte();
        drop(g);
        let log = link.0.lock().unwrap().clone();
        assert_eq!(log, ["book b 40", "dispatched b 3 Approximate", "first_byte 1", "finish 1"]);
    }

    #[test]
    fn other_replicas_bookings_weigh_in_selection_and_their_records_enter_the_index() {
        let r = Router::new(RoutingConfig::default(), specs(&["a", "b"])).unwrap();
        let blocks = [11u64, 12, 13, 14];
        let req = SelectRequest {
            prompt_tokens: 64,
            block_size: 16,
            blocks: &blocks,
            decode_tokens: 0,
            images: Vec::new(),
            unseen: false,
        };
        // Another replica sent this prompt to b: b now holds it here too.
        r.apply_remote_dispatch(1, &blocks, Source::Approximate);
        assert_eq!(r.select(&req).unwrap().worker(), 1);
        // ...but b is busy with that replica's requests: a wins despite the miss.
        let heavy = Load { prefill_tokens: 5000, decode_tokens: 0, image_tokens: 0 };
        r.worker(1).add_remote(heavy);
        assert_eq!(r.worker(1).inflight(), InFlight::default(), "remote load is not this replica's own");
        assert_eq!(r.select(&req).unwrap().worker(), 0);
        r.worker(1).release_remote(heavy, 1);
        r.worker(1).release_remote(heavy, 1); // a doubled release saturates
        assert_eq!(r.worker(1).remote_inflight(), InFlight::default());
        assert_eq!(r.select(&req).unwrap().worker(), 1);
    }

    #[test]
    fn router_rejects_too_many_or_duplicate_workers() {
        let names = |n: usize| (0..n).map(|i| format!("w{i}")).collect::<Vec<_>>();
        let n = |k| specs(&names(k).iter().map(String::as_str).collect::<Vec<_>>());
        assert!(Router::new(RoutingConfig::default(), n(1024)).is_ok());
        let e = Router::new(RoutingConfig::default(), n(1025)).err().expect("1025 workers rejected");
        assert_eq!(e, RoutingError::TooManyWorkers { got: 1025, max: 1024 });
        assert_eq!(e.label(), "too_many_workers");
        let e = Router::new(RoutingConfig::default(), specs(&["a", "b", "a"])).err();
        assert_eq!(e.map(|e| e.label()), Some("duplicate_worker"));
        let bad = RoutingConfig { temperature: -0.5, ..RoutingConfig::default() };
        assert!(Router::new(bad, n(2)).is_err());
    }

    #[test]
    fn candidates_are_the_healthy_workers_best_first() {
        let r = Router::new(RoutingConfig::default(), specs(&["a", "b", "c", "d"])).unwrap();
        let req = SelectRequest {
            blocks: &[],
            block_size: 16,
            prompt_tokens: 100,
            decode_tokens: 0,
            images: Vec::new(),
            unseen: false,
        };
        let busy = r.begin(2, Load { prefill_tokens: 500, decode_tokens: 0, image_tokens: 0 });
        let d = r.select(&req).unwrap();
        assert_eq!(d.candidates.len(), 4);
        assert_eq!(*d.candidates.last().unwrap(), 2, "the loaded worker is the last resort");
        assert_eq!(d.worker(), d.candidates[0]);
        assert!(r.mark_down(1));
        assert!(!r.mark_down(1), "already down");
        let d = r.select(&req).unwrap();
        assert!(!d.candidates.contains(&1));
        assert!(d.costs[1].is_nan());
        assert!(r.mark_up(1));
        drop(busy);
        for w in 0..4 {
            r.mark_down(w);
        }
        assert!(r.select(&req).is_none());
    }

    #[test]
    fn rank_orders_by_cost_then_rotation_after_the_pick() {
        let costs = [1.0, 5.0, 1.0, f64::NAN, 1.0];
        let eligible = [true, true, true, false, true];
        assert_eq!(rank(2, &costs, &eligible), vec![2, 4, 0, 1]);
        assert_eq!(rank(0, &[0.0; 3], &[true; 3]), vec![0, 1, 2]);
        assert_eq!(rank(1, &[0.0; 3], &[true; 3]), vec![1, 2, 0]);
    }

    #[test]
    fn ejection_keeps_the_index_a_refused_connection_clears_it_and_the_pool_cap_holds() {
        let ejection = EjectionConfig { consecutive_failures: 2, base_ejection_ms: 60_000, ..Default::default() };
        let cfg = RoutingConfig { ejection, ..RoutingConfig::default() };
        let r = Router::new(cfg, specs(&["a", "b", "c", "d"])).unwrap();
        let blocks = [11, 12, 13];
        let req = SelectRequest {
            blocks: &blocks,
            block_size: 16,
            prompt_tokens: 48,
            decode_tokens: 0,
            images: Vec::new(),
            unseen: false,
        };
        for w in 0..4 {
            r.record(w, &blocks);
        }
        assert_eq!(r.failed(0, Failure::Error, false), None);
        assert!(matches!(r.failed(0, Failure::Error, false), Some(Transition::Ejected { clear_index: false, .. })));
        let d = r.select(&req).unwrap();
        assert!(!d.candidates.contains(&0), "an ejected worker is not ranked");
        assert!(r.admit(0).is_none());
        assert_eq!(r.worker(0).availability(), Availability::Ejected);
        r.mark_up(0); // a passing health check does not cut the back-off short
        assert_eq!(r.worker(0).availability(), Availability::Ejected);
        // Its cache is remembered for its return.
        assert_eq!(d.overlap_blocks[0], 3);
        // 50 % of 4: a second ejection is allowed, a third is not (unless connections are refused).
        r.failed(1, Failure::Error, false);
        assert!(r.failed(1, Failure::Error, false).is_some());
        r.failed(2, Failure::Error, false);
        assert_eq!(r.failed(2, Failure::Error, false), None, "the pool cap holds");
        assert!(matches!(r.failed(2, Failure::Connect, false), Some(Transition::Ejected { clear_index: true, .. })));
        assert_eq!(r.select(&req).unwrap().candidates, vec![3]);
        assert_eq!(r.select(&req).unwrap().overlap_blocks[2], 0, "a refused connection forgets the worker's cache");
        // A failed health check takes the last one down.
        assert!(r.mark_down(3));
        assert!(r.select(&req).is_none());
    }

    #[test]
    fn a_half_open_worker_takes_one_probe_at_a_time() {
        let ejection = EjectionConfig { consecutive_failures: 1, base_ejection_ms: 30, ..Default::default() };
        let r = Router::new(RoutingConfig { ejection, ..RoutingConfig::default() }, specs(&["a", "b"])).unwrap();
        let req = SelectRequest {
            blocks: &[],
            block_size: 16,
            prompt_tokens: 10,
            decode_tokens: 0,
            images: Vec::new(),
            unseen: false,
        };
        assert!(r.failed(0, Failure::Error, false).is_some());
        while r.worker(0).availability() == Availability::Ejected {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(r.select(&req).unwrap().candidates.contains(&0));
        let probe = r.admit(0).expect("the probe");
        assert!(probe.is_probe());
        assert!(!r.select(&req).unwrap().candidates.contains(&0), "its probe is out");
        assert!(r.admit(0).is_none());
        drop(probe); // the client went away: the next request probes
        let probe = r.admit(0).expect("the probe again");
        assert_eq!(r.succeeded(0, false), None, "only the probe's answer recovers it");
        assert_eq!(r.succeeded(0, probe.is_probe()), Some(Transition::Recovered));
        drop(probe);
        assert!(r.worker(0).is_healthy());
        assert!(!r.admit(0).expect("full traffic").is_probe());
    }

    #[test]
    fn removed_slots_are_reused_only_once_unreferenced_and_cycles_run_forever() {
        let r = Router::new(RoutingConfig::default(), specs(&["a", "b"])).unwrap();
        for i in 0..10_000 {
            let id = r.add_worker(WorkerSpec::new(format!("c{i}"), "http://127.0.0.1:1")).expect("add keeps working");
            r.record(id, &[i as u64 + 1_000_000]);
            r.remove(id);
        }
        assert!(r.workers().len() <= 3, "slots reused: {} slots", r.workers().len());
        assert_eq!(r.live_workers().len(), 2);
        assert_eq!(r.index_entries().total(), 0, "removed workers leave nothing in the index");

        // A slot named by a live decision, guard or holder is not reused.
        let req = SelectRequest {
            blocks: &[],
            block_size: 16,
            prompt_tokens: 1,
            decode_tokens: 0,
            images: Vec::new(),
            unseen: false,
        };
        let id = r.add_worker(WorkerSpec::new("held", "http://127.0.0.1:1")).unwrap();
        let decision = r.select(&req).unwrap();
        assert!(decision.candidates.contains(&id));
        r.remove(id);
        let other = r.add_worker(WorkerSpec::new("next", "http://127.0.0.1:1")).unwrap();
        assert_ne!(other, id, "a decision still names the removed worker");
        drop(decision);
        r.remove(other);
        let guard = r.begin(other, Load::default());
        let again = r.add_worker(WorkerSpec::new("again", "http://127.0.0.1:1")).unwrap();
        assert_eq!(again, id, "the slot no decision names any more is reused");
        assert_ne!(again, other, "a load guard still holds the other one");
        drop(guard);

        // Entries written after the removal (a late event batch) keep the slot until forgotten.
        let (late, held) = r.lookup("again").unwrap();
        r.remove(late);
        r.store_events(late, &[42]);
        assert!(r.forget_removed(late, &held));
        assert_eq!(r.held_by(late), 0);
        drop(held);
        assert_eq!(r.add_worker(WorkerSpec::new("x", "http://127.0.0.1:1")).unwrap(), late);
    }

    #[test]
    fn the_cap_counts_live_workers_and_a_change_is_all_or_nothing() {
        let names: Vec<String> = (0..MAX_WORKERS).map(|i| format!("w{i}")).collect();
        let r = Router::new(RoutingConfig::default(), specs(&names.iter().map(String::as_str).collect::<Vec<_>>()))
            .unwrap();
        let e = r.add_worker(WorkerSpec::new("one-more", "http://127.0.0.1:1")).unwrap_err();
        assert_eq!(e.label(), "too_many_workers");
        r.remove(5);
        assert_eq!(r.add_worker(WorkerSpec::new("one-more", "http://127.0.0.1:1")).unwrap(), 5);
        // Retire w0 and add two, one a duplicate of a worker staying: refused, nothing changed.
        let bad = vec![WorkerSpec::new("fresh", "http://127.0.0.1:1"), WorkerSpec::new("w1", "http://127.0.0.1:1")];
        assert_eq!(r.change(&[0], bad).err().map(|e| e.label()), Some("duplicate_worker"));
        assert!(r.worker(0).in_rotation());
        assert!(r.find("fresh").is_none());
        // Replacing a worker by one of the same name is allowed: the old one drains.
        let replaced = vec![WorkerSpec::new("w0", "http://127.0.0.1:2")];
        r.remove(7);
        let ids = r.change(&[0], replaced).unwrap().commit();
        assert_eq!(ids, vec![7]);
        assert!(r.worker(0).is_draining());
        assert_eq!(r.find("w0"), Some(7), "the one in rotation is found first");
        assert_eq!(r.change(&[9999], vec![]).err().map(|e| e.label()), Some("unknown_worker"));
    }

    #[test]
    fn one_workers_events_cannot_evict_the_others() {
        let cfg = RoutingConfig { index_max_blocks: 20_000, ..RoutingConfig::default() };
        assert_eq!(cfg.worker_share_blocks(), 10_000);
        let r = Router::new(cfg, specs(&["a", "b"])).unwrap();
        let a: Vec<u64> = (0..3_000).collect();
        r.store_events(0, &a);
        let flood: Vec<u64> = (1_000_000..1_100_000).collect();
        for chunk in flood.chunks(4096) {
            r.store_events(1, chunk);
        }
        assert_eq!(r.events_held_by(0), 3_000, "worker a keeps its entries");
        assert_eq!(r.events_held_by(1), 10_000, "worker b holds its share, no more");
        assert_eq!(r.worker(1).index_refused(), 90_000);
        assert_eq!(r.worker(0).index_refused(), 0);
        // Within its share b is as before: refreshing what it holds is never refused.
        r.store_events(1, &flood[..10]);
        assert_eq!(r.worker(1).index_refused(), 90_000);
        let e = RoutingConfig { index_worker_share: 0.0, ..RoutingConfig::default() }.validate().unwrap_err();
        assert!(e.to_string().contains("routing.index_worker_share"), "{e}");
    }

    #[test]
    fn an_adapters_request_prefers_a_worker_with_it_active_unless_another_caches_much_more() {
        let r = Router::new(RoutingConfig::default(), specs(&["a", "b", "c"])).unwrap();
        let served = |adapters: &[&str]| ServedModels {
            base: vec!["base".into()],
            adapters: adapters.iter().map(|a| a.to_string()).collect(),
        };
        r.worker(0).set_served_models(served(&["sql"]));
        r.worker(1).set_served_models(served(&["sql"]));
        r.worker(2).set_served_models(served(&[]));
        let blocks: Vec<u64> = (1..=32).collect();
        let req = SelectRequest {
            prompt_tokens: 512,
            block_size: 16,
            blocks: &blocks,
            decode_tokens: 0,
            images: Vec::new(),
            unseen: false,
        };
        // Neither has it active: a tie, both picked; never c, which does not serve it.
        let mut seen = [0u32; 3];
        for _ in 0..200 {
            seen[r.select_model(&req, Role::Both, Some("sql")).unwrap().worker()] += 1;
        }
        assert!(seen[0] > 40 && seen[1] > 40 && seen[2] == 0, "{seen:?}");
        // b's engine reports it running: b wins every time, by exactly the swap price.
        r.worker(1).set_engine_active_adapters(vec!["sql".into()]);
        for _ in 0..50 {
            let d = r.select_model(&req, Role::Both, Some("sql")).unwrap();
            assert_eq!(d.worker(), 1);
            assert_eq!(d.costs[0] - d.costs[1], 256.0);
        }
        // The base model's requests pay no swap: a tie again.
        let d = r.select_model(&req, Role::Both, None).unwrap();
        assert_eq!(d.costs[0], d.costs[1]);
        // a caches 20 of the 32 blocks (320 tokens > 256): a large overlap outweighs the swap.
        r.record(0, &blocks[..20]);
        assert_eq!(r.select_model(&req, Role::Both, Some("sql")).unwrap().worker(), 0);
        // A small one (4 blocks, 64 tokens) does not.
        r.clear_worker(0);
        r.record(0, &blocks[..4]);
        assert_eq!(r.select_model(&req, Role::Both, Some("sql")).unwrap().worker(), 1);
        // This router's own recent send counts as active too; a price of 0 turns the term off.
        r.worker(0).adapter_sent("sql");
        let d = r.select_model(&req, Role::Both, Some("sql")).unwrap();
        assert_eq!(d.worker(), 0);
        let off = Router::new(RoutingConfig { adapter_swap_tokens: 0.0, ..RoutingConfig::default() }, specs(&["a"]));
        let off = off.unwrap();
        assert_eq!(off.select_model(&req, Role::Both, Some("sql")).unwrap().costs[0], 512.0);
        let bad = RoutingConfig { adapter_swap_tokens: -1.0, ..RoutingConfig::default() }.validate().unwrap_err();
        assert!(bad.to_string().contains("routing.adapter_swap_tokens"), "{bad}");
    }

    #[test]
    fn router_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Router>();
        assert_send_sync::<LoadGuard>();
    }
}
