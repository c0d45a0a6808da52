//! One worker of the pool and the state it owns: its name and URL, its health, its in-flight load, and
//! whether it publishes KV-cache events (which decides how the router records a dispatch to it).
//!
//! A request's load is held by a [`LoadGuard`]: [`super::Router::begin`] adds the load to its worker
//! and returns the guard, which is the only way to release it. [`LoadGuard::first_byte`] releases the
//! prefill part (the worker has finished the prompt), and `Drop` releases whatever is still held. The
//! proxy moves the guard into the response body, so the load is released on every path — stream end,
//! upstream error, timeout, client disconnect (the body is dropped) — and never twice (peers leaked
//! load on some of these paths).
//!
//! Availability is one state machine ([`super::outlier`]) fed through the router by both the active
//! health checks ([`super::Router::mark_down`] / [`super::Router::mark_up`]) and request outcomes
//! ([`super::Router::succeeded`] / [`super::Router::failed`]); selection admits only what it allows.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::outlier::{Availability, Outlier};

use super::adapters::ActiveAdapters;
use super::link::Link;
use super::load::{InFlight, Load, LoadCounters};
use super::residency::{Held, ImageBudgets, ImageUse, Residency};

/// What the configuration says about a worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSpec {
    /// Unique within the pool; the `worker` label of every per-worker metric.
    pub name: String,
    /// Base URL, e.g. `http://10.0.0.7:8000` (no trailing `/v1`).
    pub url: String,
    pub engine: Engine,
    /// What the worker does for a request: all of it (`both`), or one leg of disaggregated serving.
    pub role: Role,
    /// SGLang prefill workers: the port of the engine's bootstrap server (`--disaggregation-bootstrap-port`),
    /// which both legs of a request name so the decode engine finds the prefill's KV cache.
    pub bootstrap_port: Option<u16>,
}

impl WorkerSpec {
    /// A vLLM worker serving whole requests.
    pub fn new(name: impl Into<String>, url: impl Into<String>) -> WorkerSpec {
        WorkerSpec { name: name.into(), url: url.into(), engine: Engine::Vllm, role: Role::Both, bootstrap_port: None }
    }

    /// The same worker in `role`.
    pub fn with_role(mut self, role: Role) -> WorkerSpec {
        self.role = role;
        self
    }
}

/// A worker's part in serving a request. A pool with prefill and decode workers serves disaggregated
/// (prefill on one engine, its KV cache pulled by a decode engine), with an encoder stage when it also
/// has encode workers (images encoded on an encoder-only engine, the embeddings loaded by prefill).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Serves whole requests (aggregated, as without disaggregation).
    #[default]
    Both,
    Prefill,
    Decode,
    Encode,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Both, Role::Prefill, Role::Decode, Role::Encode];

    /// The config value and metric label.
    pub fn label(self) -> &'static str {
        match self {
            Role::Both => "both",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Encode => "encode",
        }
    }

    /// The role named `s` (a config value or a flag).
    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.label() == s)
    }
}

/// The inference engine behind a worker: what it accepts (vLLM takes an image part's `uuid` as the
/// image's name) and how it publishes KV events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    #[default]
    Vllm,
    Sglang,
}

/// A worker and its live state. Shared (`Arc`) between the router, in-flight requests (their load
/// guards) and the health checker.
///
/// `repr(C)`, cache-line aligned, with what selection reads of every worker on every request first
/// (availability flags, both load counters, the cache's room: 104 bytes): a select over a large pool
/// then touches two cache lines per worker instead of three spread over the struct.
#[derive(Debug)]
#[repr(C, align(64))]
pub struct Worker {
    /// Mirrors "the state machine says plain Healthy", so selection skips the lock in the common case.
    healthy: AtomicBool,
    /// Draining: takes no new request, keeps those in flight (an operator is taking it out).
    draining: AtomicBool,
    /// Removed from its pool: never selected again; its id is reused only once nothing refers to it
    /// (see [`super::Router`]).
    removed: AtomicBool,
    publishes_events: AtomicBool,
    pub(crate) load: LoadCounters,
    /// Other replicas' bookings on this worker (see `super::link`).
    remote: LoadCounters,
    cache: CacheRoom,
    spec: WorkerSpec,
    outlier: Mutex<Outlier>,
    /// Event blocks the index refused: the worker already held its share of the index.
    index_refused: AtomicU64,
    /// The images its engine likely still holds in its processor and encoder caches.
    images: parking_lot::Mutex<Residency>,
    /// The engine's own processor-cache counters, as last read from its `/metrics`.
    engine_mm_cache: parking_lot::Mutex<Option<EngineMmCache>>,
    /// The engine's KV-transfer counters (a decode engine's pulls), as last read from its `/metrics`.
    engine_kv_transfer: parking_lot::Mutex<Option<EngineKvTransfer>>,
    /// What the engine's `/v1/models` last listed (base models and LoRA adapters); `None` until read.
    served: parking_lot::RwLock<Option<Arc<ServedModels>>>,
    /// The LoRA adapters likely in its engine's slots (`adapters.rs`).
    active_adapters: parking_lot::Mutex<ActiveAdapters>,
}

/// The models a worker's engine serves, as its `/v1/models` lists them: base models (no `parent`) and
/// LoRA adapters (whose `parent` is a base model).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServedModels {
    pub base: Vec<String>,
    pub adapters: Vec<String>,
}

/// A disaggregated engine's KV-transfer counters: prompt tokens it received from another engine
/// (`vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}`) and its NIXL transfers
/// (`vllm:nixl_xfer_time_seconds` count and sum, in microseconds), summed over its engine ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineKvTransfer {
    pub tokens: u64,
    pub transfers: u64,
    pub micros: u64,
}

/// An engine's `vllm:mm_cache_queries` / `vllm:mm_cache_hits` (images looked up in its processor
/// cache / found there), summed over its engine ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineMmCache {
    pub queries: u64,
    pub hits: u64,
}

/// What the worker's own events say about its KV cache's fill: blocks held now, and the capacity, known
/// once the worker has evicted (an engine evicts only when full, so the most it ever held is then its
/// capacity). Both 0 until the worker's events say otherwise.
#[derive(Debug, Default)]
struct CacheRoom {
    held: AtomicU64,
    capacity: AtomicU64,
}

impl Worker {
    /// A worker starts healthy: the first failed check or connect takes it out. Its image caches
    /// are modelled with vLLM's default budgets.
    pub fn new(spec: WorkerSpec) -> Worker {
        Worker::with_image_budgets(spec, ImageBudgets::VLLM_DEFAULT)
    }

    pub fn with_image_budgets(spec: WorkerSpec, budgets: ImageBudgets) -> Worker {
        Worker {
            spec,
            outlier: Mutex::new(Outlier::new()),
            healthy: AtomicBool::new(true),
            publishes_events: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            removed: AtomicBool::new(false),
            index_refused: AtomicU64::new(0),
            load: LoadCounters::default(),
            remote: LoadCounters::default(),
            cache: CacheRoom::default(),
            images: parking_lot::Mutex::new(Residency::new(budgets)),
            engine_mm_cache: parking_lot::Mutex::new(None),
            engine_kv_transfer: parking_lot::Mutex::new(None),
            served: parking_lot::RwLock::new(None),
            active_adapters: parking_lot::Mutex::new(ActiveAdapters::default()),
        }
    }

    /// The engine's processor-cache counters, if its `/metrics` was read and carried them.
    pub fn engine_mm_cache(&self) -> Option<EngineMmCache> {
        *self.engine_mm_cache.lock()
    }

    pub fn set_engine_mm_cache(&self, counters: EngineMmCache) {
        *self.engine_mm_cache.lock() = Some(counters);
    }

    /// What the engine's `/v1/models` last listed; `None` until it was read.
    pub fn served_models(&self) -> Option<Arc<ServedModels>> {
        self.served.read().clone()
    }

    /// Replaces what the engine serves; true when it changed.
    pub fn set_served_models(&self, served: ServedModels) -> bool {
        let mut slot = self.served.write();
        if slot.as_deref() == Some(&served) {
            return false;
        }
        *slot = Some(Arc::new(served));
        true
    }

    /// Whether the engine serves LoRA adapter `name`; `None` while its listing is unknown.
    pub fn serves_adapter(&self, name: &str) -> Option<bool> {
        self.served.read().as_ref().map(|s| s.adapters.iter().any(|a| a == name))
    }

    /// Marks LoRA adapter `name` as served (loaded at run time by the router): listed until the next
    /// `/v1/models` reading replaces the listing. An unknown listing becomes this one adapter's.
    pub fn add_served_adapter(&self, name: &str) {
        let mut slot = self.served.write();
        let mut served = slot.as_deref().cloned().unwrap_or_default();
        if !served.adapters.iter().any(|a| a == name) {
            served.adapters.push(name.to_owned());
            served.adapters.sort();
        }
        *slot = Some(Arc::new(served));
    }

    /// The LoRA adapters its engine ran or queued at its last `/metrics` reading
    /// (`vllm:lora_requests_info`; bounded).
    pub fn set_engine_active_adapters(&self, names: Vec<String>) {
        self.active_adapters.lock().set_engine(names);
    }

    /// This router sent the worker a request for LoRA adapter `name`.
    pub fn adapter_sent(&self, name: &str) {
        self.active_adapters.lock().sent(name, Instant::now());
    }

    /// Whether LoRA adapter `name` is likely in one of its engine's slots (no swap needed).
    pub fn adapter_active(&self, name: &str) -> bool {
        self.active_adapters.lock().is_active(name, Instant::now())
    }

    /// The LoRA adapters likely in its engine's slots now, sorted.
    pub fn active_adapters(&self) -> Vec<String> {
        self.active_adapters.lock().names(Instant::now())
    }

    /// The engine's KV-transfer counters, if its `/metrics` was read and carried them.
    pub fn engine_kv_transfer(&self) -> Option<EngineKvTransfer> {
        *self.engine_kv_transfer.lock()
    }

    pub fn set_engine_kv_transfer(&self, counters: EngineKvTransfer) {
        *self.engine_kv_transfer.lock() = Some(counters);
    }

    /// The worker's engine was sent these images on the exact route.
    pub fn images_sent(&self, images: &[ImageUse]) {
        self.images.lock().sent(images);
    }

    /// How likely the worker's engine still holds each image, per cache.
    pub fn images_held(&self, images: &[ImageUse]) -> Vec<Held> {
        let r = self.images.lock();
        images.iter().map(|i| r.held(i.key)).collect()
    }

    /// Images its modelled caches hold.
    pub fn images_resident(&self) -> usize {
        self.images.lock().len()
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    pub fn url(&self) -> &str {
        &self.spec.url
    }

    pub fn engine(&self) -> Engine {
        self.spec.engine
    }

    pub fn role(&self) -> Role {
        self.spec.role
    }

    /// SGLang prefill workers: the bootstrap server's port.
    pub fn bootstrap_port(&self) -> Option<u16> {
        self.spec.bootstrap_port
    }

    /// Plainly healthy: full traffic (not ejected, half-open or down).
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Where the worker is in its state machine now.
    pub fn availability(&self) -> Availability {
        self.with_outlier(|o| o.availability(Instant::now()))
    }

    /// May selection rank this worker now (healthy, or half-open with no probe out)?
    pub fn selectable(&self, now: Instant) -> bool {
        self.in_rotation() && (self.is_healthy() || self.with_outlier(|o| o.selectable(now)))
    }

    /// Neither draining nor removed: it may take new requests (if its state allows).
    pub fn in_rotation(&self) -> bool {
        !self.draining.load(Ordering::Relaxed) && !self.removed.load(Ordering::Relaxed)
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    pub fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Relaxed)
    }

    pub(crate) fn set_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    pub(crate) fn set_removed(&self) {
        self.draining.store(true, Ordering::Relaxed);
        self.removed.store(true, Ordering::Relaxed);
    }

    /// Runs `f` on the state machine and refreshes the lock-free mirror.
    pub(crate) fn with_outlier<R>(&self, f: impl FnOnce(&mut Outlier) -> R) -> R {
        let mut o = self.outlier.lock().unwrap_or_else(|e| e.into_inner());
        let r = f(&mut o);
        self.healthy.store(o.is_healthy(), Ordering::Relaxed);
        r
    }

    /// True while the router follows this worker's KV-cache events: a dispatch is then recorded as
    /// `Pending` (confirmed by the worker's events) rather than `Approximate`. Starts false.
    pub fn publishes_events(&self) -> bool {
        self.publishes_events.load(Ordering::Relaxed)
    }

    /// Set by whoever follows the worker's event feed (true once subscribed, false when the feed is lost).
    pub fn set_publishes_events(&self, on: bool) {
        self.publishes_events.store(on, Ordering::Relaxed);
    }

    /// The worker's events say it now holds `held` blocks; `evicted`: the batch removed blocks to make
    /// room, so the cache is full and `held` is (at least) its capacity.
    pub fn report_cache(&self, held: u64, evicted: bool) {
        self.cache.held.store(held, Ordering::Relaxed);
        if evicted || (self.cache_capacity().is_some_and(|c| held > c)) {
            self.cache.capacity.fetch_max(held, Ordering::Relaxed);
        }
    }

    /// What another replica learnt of this worker's cache (a snapshot being grafted): its fill, and
    /// its capacity when known.
    pub fn restore_cache(&self, held: u64, capacity: Option<u64>) {
        self.cache.held.store(held, Ordering::Relaxed);
        if let Some(c) = capacity {
            self.cache.capacity.fetch_max(c, Ordering::Relaxed);
        }
    }

    /// Blocks the worker's cache holds now, as its events say.
    pub fn cache_held(&self) -> u64 {
        self.cache.held.load(Ordering::Relaxed)
    }

    /// Blocks the worker's cache holds beyond which it must evict; `None` until it has evicted once.
    pub fn cache_capacity(&self) -> Option<u64> {
        Some(self.cache.capacity.load(Ordering::Relaxed)).filter(|&c| c > 0)
    }

    /// Free blocks in the worker's cache (saturating), if its capacity is known.
    pub fn cache_room(&self) -> Option<u64> {
        self.cache_capacity().map(|c| c.saturating_sub(self.cache.held.load(Ordering::Relaxed)))
    }

    /// Event blocks of this worker the index refused because it held its share (a counter).
    pub fn index_refused(&self) -> u64 {
        self.index_refused.load(Ordering::Relaxed)
    }

    pub(crate) fn count_index_refused(&self, n: u64) {
        self.index_refused.fetch_add(n, Ordering::Relaxed);
    }

    /// The load this replica's requests hold on this worker.
    pub fn inflight(&self) -> InFlight {
        self.load.snapshot()
    }

    /// The load other replicas' bookings hold on this worker (0 without a cluster).
    pub fn remote_inflight(&self) -> InFlight {
        self.remote.snapshot()
    }

    /// The prefill and decode tokens in flight here, this replica's and the other replicas' (what the
    /// `kv` cost weighs; four loads where [`total_inflight`](Self::total_inflight) takes eight).
    pub(crate) fn queued_tokens(&self) -> (u64, u64) {
        let (l, r) = (&self.load, &self.remote);
        let prefill = l.prefill.load(Ordering::Relaxed) + r.prefill.load(Ordering::Relaxed);
        (prefill, l.decode.load(Ordering::Relaxed) + r.decode.load(Ordering::Relaxed))
    }

    /// What selection weighs: this replica's load and the other replicas'.
    pub fn total_inflight(&self) -> InFlight {
        let (l, r) = (self.inflight(), self.remote_inflight());
        InFlight {
            requests: l.requests + r.requests,
            prefill_tokens: l.prefill_tokens + r.prefill_tokens,
            decode_tokens: l.decode_tokens + r.decode_tokens,
            image_tokens: l.image_tokens + r.image_tokens,
        }
    }

    /// Another replica booked one request with `load` here.
    pub fn add_remote(&self, load: Load) {
        let c = &self.remote;
        c.requests.fetch_add(1, Ordering::Relaxed);
        c.prefill.fetch_add(u64::from(load.prefill_tokens), Ordering::Relaxed);
        c.decode.fetch_add(u64::from(load.decode_tokens), Ordering::Relaxed);
        c.image.fetch_add(u64::from(load.image_tokens), Ordering::Relaxed);
    }

    /// Releases `load` and `requests` of another replica's bookings (its first byte: the prefill
    /// only; its end or expiry: the rest). Saturating: a message lost or doubled never wraps.
    pub fn release_remote(&self, load: Load, requests: u64) {
        let c = &self.remote;
        release_saturating(&c.requests, requests);
        release_saturating(&c.prefill, u64::from(load.prefill_tokens));
        release_saturating(&c.decode, u64::from(load.decode_tokens));
        release_saturating(&c.image, u64::from(load.image_tokens));
    }

    /// True once an exact-routed request with images was dispatched here (the image-token gauge is
    /// exported from then on, so a text-only or fallback worker never shows one).
    pub fn has_carried_images(&self) -> bool {
        self.load.has_carried_images()
    }
}

/// The right to send one request to a worker ([`super::Router::admit`]). For a half-open worker it is
/// the probe: dropping it before the outcome was reported gives the probe back (the client went away),
/// so the worker is not left waiting for an answer that never comes.
#[must_use = "dropping the admission gives a probe back"]
#[derive(Debug)]
pub struct Admission {
    worker: Arc<Worker>,
    probe: bool,
}

impl Admission {
    pub(crate) fn new(worker: Arc<Worker>, probe: bool) -> Admission {
        Admission { worker, probe }
    }

    /// This request is the half-open worker's probe.
    pub fn is_probe(&self) -> bool {
        self.probe
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        if self.probe {
            // A no-op once the outcome moved the worker out of "half-open, probing".
            self.worker.with_outlier(Outlier::release_probe);
        }
    }
}

/// Holds one request's load on its worker; see the module docs.
#[must_use = "dropping the guard releases the load immediately"]
pub struct LoadGuard {
    worker: Arc<Worker>,
    /// What this guard still holds (0 once released).
    prefill: u64,
    decode: u64,
    image: u64,
    released: bool,
    /// The cluster link this request was booked on, and its booking id.
    booking: Option<(Arc<dyn Link>, u64)>,
}

impl std::fmt::Debug for LoadGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadGuard")
            .field("worker", &self.worker.name())
            .field("prefill", &self.prefill)
            .field("decode", &self.decode)
            .field("image", &self.image)
            .finish()
    }
}

/// Subtracts what a guard added. The guard never subtracts more than it added, so this cannot
/// underflow; saturating anyway keeps a counter at 0 rather than wrapping if that were ever broken.
fn release(counter: &AtomicU64, amount: u64) {
    if amount == 0 {
        return;
    }
    let prev = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some(v.saturating_sub(amount)));
    debug_assert!(prev.is_ok_and(|v| v >= amount), "load released more than it held");
}

/// Subtracts what another replica said it released; unlike [`release`] it may be told more than is
/// held (a lost or doubled message), so it saturates by design.
fn release_saturating(counter: &AtomicU64, amount: u64) {
    if amount > 0 {
        let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some(v.saturating_sub(amount)));
    }
}

impl LoadGuard {
    /// Adds `load` (and one request) to `worker` until the guard drops.
    pub(crate) fn hold(worker: Arc<Worker>, load: Load) -> LoadGuard {
        let (prefill, decode, image) =
            (u64::from(load.prefill_tokens), u64::from(load.decode_tokens), u64::from(load.image_tokens));
        let c = &worker.load;
        c.requests.fetch_add(1, Ordering::Relaxed);
        c.prefill.fetch_add(prefill, Ordering::Relaxed);
        c.decode.fetch_add(decode, Ordering::Relaxed);
        if image > 0 {
            c.image.fetch_add(image, Ordering::Relaxed);
            c.carried_images.store(true, Ordering::Relaxed);
        }
        LoadGuard { worker, prefill, decode, image, released: false, booking: None }
    }

    /// Tells `link` this guard's first byte and end (the guard was booked there as `booking`).
    pub(crate) fn booked(mut self, link: Arc<dyn Link>, booking: u64) -> LoadGuard {
        self.booking = Some((link, booking));
        self
    }

    /// The worker this guard holds load on.
    pub fn worker(&self) -> &Arc<Worker> {
        &self.worker
    }

    /// The first response byte arrived: the prompt is computed, release the prefill tokens. Idempotent.
    pub fn first_byte(&mut self) {
        if self.prefill > 0 {
            if let Some((link, id)) = &self.booking {
                link.first_byte(*id);
            }
        }
        release(&self.worker.load.prefill, self.prefill);
        self.prefill = 0;
    }
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        if std::mem::replace(&mut self.released, true) {
            return;
        }
        self.first_byte();
        let c = &self.worker.load;
        release(&c.requests, 1);
        release(&c.decode, self.decode);
        release(&c.image, self.image);
        if let Some((link, id)) = self.booking.take() {
            link.finish(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(name: &str) -> Arc<Worker> {
        Arc::new(Worker::new(WorkerSpec::new(name, "http://127.0.0.1:1")))
    }

    const LOAD: Load = Load { prefill_tokens: 100, decode_tokens: 20, image_tokens: 64 };

    #[test]
    fn what_selection_reads_fits_two_cache_lines() {
        use std::mem::{align_of, offset_of, size_of};
        assert_eq!(align_of::<Worker>(), 64);
        let hot = [
            offset_of!(Worker, healthy),
            offset_of!(Worker, draining),
            offset_of!(Worker, removed),
            offset_of!(Worker, load) + size_of::<LoadCounters>() - 1,
            offset_of!(Worker, remote) + size_of::<LoadCounters>() - 1,
            offset_of!(Worker, cache) + size_of::<CacheRoom>() - 1,
        ];
        assert!(hot.iter().all(|&byte| byte < 128), "selection's fields end at {hot:?}");
    }

    #[test]
    fn first_byte_releases_only_prefill_and_drop_the_rest() {
        let (idle, w) = (worker("w0"), worker("w1"));
        let mut g = LoadGuard::hold(w.clone(), LOAD);
        let held = InFlight { requests: 1, prefill_tokens: 100, decode_tokens: 20, image_tokens: 64 };
        assert_eq!((idle.inflight(), w.inflight()), (InFlight::default(), held));
        g.first_byte();
        assert_eq!(w.inflight(), InFlight { prefill_tokens: 0, ..held });
        g.first_byte(); // idempotent: no underflow, no double release
        assert_eq!(w.inflight(), InFlight { prefill_tokens: 0, ..held });
        drop(g);
        assert_eq!(w.inflight(), InFlight::default());
    }

    #[test]
    fn drop_without_first_byte_releases_everything() {
        let w = worker("w0");
        let a = LoadGuard::hold(w.clone(), LOAD);
        let b = LoadGuard::hold(w.clone(), Load { prefill_tokens: 7, decode_tokens: 0, image_tokens: 0 });
        assert_eq!(w.inflight(), InFlight { requests: 2, prefill_tokens: 107, decode_tokens: 20, image_tokens: 64 });
        drop(a); // e.g. upstream error before any byte
        assert_eq!(w.inflight(), InFlight { requests: 1, prefill_tokens: 7, decode_tokens: 0, image_tokens: 0 });
        drop(b);
        assert_eq!(w.inflight(), InFlight::default());
    }

    #[test]
    fn only_image_carrying_requests_mark_the_worker() {
        let w = worker("w0");
        drop(LoadGuard::hold(w.clone(), Load { prefill_tokens: 30, decode_tokens: 5, image_tokens: 0 }));
        // A text-only (or fallback) request never touches the image gauge.
        assert!(!w.has_carried_images());
        drop(LoadGuard::hold(w.clone(), LOAD));
        assert!(w.has_carried_images());
        assert_eq!(w.inflight(), InFlight::default());
    }

    #[test]
    fn concurrent_hold_and_drop_end_at_zero() {
        let workers: Vec<Arc<Worker>> = (0..3).map(|i| worker(&format!("w{i}"))).collect();
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let workers = workers.clone();
                std::thread::spawn(move || {
                    let mut held = Vec::new();
                    for j in 0..2000u32 {
                        let load = Load { prefill_tokens: j % 97, decode_tokens: j % 13, image_tokens: j % 3 };
                        let mut g = LoadGuard::hold(workers[(i + j as usize) % 3].clone(), load);
                        if j % 2 == 0 {
                            g.first_byte();
                        }
                        held.push(g);
                        if held.len() > 16 {
                            held.drain(..8);
                        }
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().expect("worker thread panicked");
        }
        assert!(workers.iter().all(|w| w.inflight() == InFlight::default()));
    }
}
