//! HTTP side of the simulated worker: routes, the body-hash layer, and the generation of answers.
//!
//! A completion request goes: body hashed and buffered (layer) → extra delay (fault) → parsed and
//! prompted → maybe failed on purpose → waits for a slot (`--max-running`) → takes its prefix hit and
//! pins its blocks → asks the image caches (`mm_cache`) → waits the time to first token → emits its
//! tokens. Non-streamed answers are sent whole at the end; streamed answers send headers at once (as
//! vLLM does) and do the waiting inside the body stream, so a client that goes away drops the stream
//! and is counted as cancelled.
//!
//! Disaggregated serving (`--role`, [`crate::disagg`]) changes three steps: a decode leg pulls its
//! uncached tokens instead of computing them (and waits for its SGLang prefill's room first), a vLLM
//! prefill leg answers one token and the `kv_transfer_params` of its blocks, and an encode sim only
//! runs the vision encoder. `GET /sim/role` names the role.
//!
//! Admin: `POST /sim/restart` simulates an engine restart — the cache is emptied and the KV-event seq
//! starts again from 0, without an `AllBlocksCleared` (a restarted vLLM sends none).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt as _;
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use crate::answer::{Answer, Budget, Shape};
use crate::bootstrap::{self, Rooms};
use crate::cache::PrefixCache;
use crate::disagg::{self, Bootstrap, Handoff, Leg};
use crate::ec_storage;
use crate::error::SimError;
use crate::events::Publisher;
use crate::exposition::{self, Snapshot};
use crate::mm_cache::ImageCaches;
use crate::options::SimOptions;
use crate::params::{Flavour, Params};
use crate::prompt::{Prompter, SimPrompt};
use crate::stats::SimStats;
use crate::timing::{decode_delay, ttft_alone, ttft_pulled, ttft_queued, Dice, ImageWork};

const BODY_SHA256: HeaderName = HeaderName::from_static("x-sim-body-sha256");
const WORKER: HeaderName = HeaderName::from_static("x-sim-worker");
const BODY_FRAMING: HeaderName = HeaderName::from_static("x-sim-body-framing");
/// The W3C `traceparent` the request arrived with, echoed (tests check what a proxy propagated).
const TRACEPARENT_SEEN: HeaderName = HeaderName::from_static("x-sim-traceparent");

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    prompt_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    in_flight: AtomicU64,
    running: AtomicU64,
    waiting: AtomicU64,
    cancelled: AtomicU64,
    errors_injected: AtomicU64,
    streams_dropped: AtomicU64,
    /// Prompt tokens whose KV a decode leg pulled from its prefill engine.
    external_tokens: AtomicU64,
    /// Decode legs that pulled KV.
    kv_transfers: AtomicU64,
    /// Files an encode sim wrote to `--ec-shared-storage`.
    ec_stores: AtomicU64,
}

pub(crate) struct AppState {
    pub opts: SimOptions,
    prompter: Arc<dyn Prompter>,
    cache: Mutex<PrefixCache>,
    /// The processor and encoder caches (never held with `cache`).
    images: Mutex<ImageCaches>,
    /// KV-event publisher (`--kv-events`); fed under the cache lock so seq order is cache order.
    events: Option<Publisher>,
    /// `GET /kv_event_sources`, shaped as vLLM 0.32–0.34 answer it.
    event_sources: Value,
    slots: Arc<Semaphore>,
    dice: Dice,
    /// `--error-rate` as f64 bits; changeable while running.
    error_rate: AtomicU64,
    counters: Counters,
    next_id: AtomicU64,
    /// The engine id a vLLM prefill leg reports (`remote_engine_id`): one per sim, a uuid as vLLM's.
    engine_id: String,
    /// Next block id a vLLM prefill leg reports (the sim keeps no block table: ids are opaque).
    next_block: AtomicU64,
    /// SGLang prefill: the rooms whose prefill is over (served on `--bootstrap-port`).
    pub rooms: Arc<Rooms>,
    /// The bound `--bootstrap-port`.
    bootstrap_port: Option<u16>,
    /// When the worker's prefill compute is next free (prefill contention).
    prefill_free_at: Mutex<tokio::time::Instant>,
    /// Set when the server should stop accepting (graceful phase).
    stop: watch::Sender<bool>,
    /// Set when in-flight answers must end now.
    cut: watch::Sender<bool>,
    /// Adapters loaded at run time (`lora.rs`).
    pub(crate) lora: crate::lora_loaded::Loaded,
    /// Stored Responses-API answers (`--responses-store`, `responses/store.rs`).
    pub(crate) responses: crate::responses::store::Store,
}

impl AppState {
    pub fn new(
        opts: SimOptions,
        prompter: Arc<dyn Prompter>,
        events: Option<Publisher>,
        bound: Option<&Bound>,
        bootstrap_port: Option<u16>,
    ) -> Self {
        Self {
            engine_id: engine_id(),
            next_block: AtomicU64::new(0),
            rooms: Arc::new(Rooms::default()),
            bootstrap_port,
            prompter,
            event_sources: event_sources(&opts, bound),
            cache: Mutex::new(PrefixCache::new(opts.block_size, opts.kv_blocks)),
            images: Mutex::new(ImageCaches::new(opts.mm_processor_cache_bytes(), opts.encoder_cache_tokens)),
            events,
            slots: Arc::new(Semaphore::new(opts.max_running.min(Semaphore::MAX_PERMITS))),
            dice: Dice::new(opts.seed),
            error_rate: AtomicU64::new(opts.error_rate.to_bits()),
            counters: Counters::default(),
            next_id: AtomicU64::new(0),
            prefill_free_at: Mutex::new(tokio::time::Instant::now()),
            stop: watch::Sender::new(false),
            cut: watch::Sender::new(false),
            lora: Default::default(),
            responses: crate::responses::store::Store::new(opts.responses_store),
            opts,
        }
    }

    pub fn begin_stop(&self) {
        self.stop.send_replace(true);
    }

    pub fn cut_streams(&self) {
        self.cut.send_replace(true);
    }

    /// Resolves once a stop was requested (axum's graceful-shutdown signal).
    pub fn stopping(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.stop.subscribe();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    }

    pub fn stats(&self) -> SimStats {
        let c = &self.counters;
        let images = self.images().counts();
        SimStats {
            requests: c.requests.load(Relaxed),
            prompt_tokens: c.prompt_tokens.load(Relaxed),
            cached_tokens: c.cached_tokens.load(Relaxed),
            generation_tokens: c.generation_tokens.load(Relaxed),
            in_flight: c.in_flight.load(Relaxed),
            cancelled: c.cancelled.load(Relaxed),
            errors_injected: c.errors_injected.load(Relaxed),
            streams_dropped: c.streams_dropped.load(Relaxed),
            mm_cache_queries: images.processor_queries,
            mm_cache_hits: images.processor_hits,
            encoder_cache_queries: images.encoder_queries,
            encoder_cache_hits: images.encoder_hits,
            image_preprocessed_tokens: images.preprocessed_tokens,
            image_encoded_tokens: images.encoded_tokens,
            external_kv_tokens: c.external_tokens.load(Relaxed),
            kv_transfers: c.kv_transfers.load(Relaxed),
            ec_loads: images.ec_loads,
            ec_stores: c.ec_stores.load(Relaxed),
            kv_batches: self.events.as_ref().map_or(0, |e| e.counters.batches.load(Relaxed)),
            kv_batches_dropped: self.events.as_ref().map_or(0, |e| e.counters.dropped.load(Relaxed)),
            kv_batches_overflowed: self.events.as_ref().map_or(0, |e| e.counters.overflowed.load(Relaxed)),
        }
    }

    pub fn set_error_rate(&self, rate: f64) {
        self.error_rate.store(rate.clamp(0.0, 1.0).to_bits(), Relaxed);
    }

    fn error_rate(&self) -> f64 {
        f64::from_bits(self.error_rate.load(Relaxed))
    }

    pub fn set_kv_events_drop_rate(&self, rate: f64) {
        if let Some(events) = &self.events {
            events.set_drop_rate(rate);
        }
    }

    /// An engine restart: empty caches and the event seq from 0, announced by nothing but the seq.
    fn restart(&self) {
        {
            let mut cache = self.cache();
            cache.clear();
            if let Some(events) = &self.events {
                events.restart();
            }
        }
        self.images().clear();
    }

    fn cache(&self) -> MutexGuard<'_, PrefixCache> {
        // The cache stays consistent between statements, so a panic elsewhere does not poison it.
        self.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn images(&self) -> MutexGuard<'_, ImageCaches> {
        // Like the prefix cache, consistent between statements.
        self.images.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Time to first token for a request admitted now: its own preprocessing and GPU work, the latter
    /// queued behind the GPU work already admitted when contention is modelled.
    fn ttft_now(&self, uncached_tokens: u32, work: ImageWork) -> Duration {
        if !self.opts.prefill_contention {
            return ttft_alone(uncached_tokens, work, &self.opts);
        }
        let now = tokio::time::Instant::now();
        let mut free_at = self.prefill_free_at.lock().unwrap_or_else(|e| e.into_inner());
        let busy = free_at.saturating_duration_since(now);
        let (ttft, busy) = ttft_queued(busy, uncached_tokens, work, &self.opts);
        *free_at = now + busy;
        ttft
    }

    /// Sleeps `d`, unless in-flight answers are being cut.
    async fn pause(&self, d: Duration) -> Result<(), SimError> {
        let mut cut = self.cut.subscribe();
        if *cut.borrow_and_update() {
            return Err(SimError::ShuttingDown);
        }
        if d.is_zero() {
            return Ok(());
        }
        tokio::select! {
            () = tokio::time::sleep(d) => Ok(()),
            _ = cut.wait_for(|cut| *cut) => Err(SimError::ShuttingDown),
        }
    }

    /// Waits for a generation slot (`--max-running`), counted as waiting, then as running.
    async fn slot(self: &Arc<Self>) -> Result<(OwnedSemaphorePermit, Gauge), SimError> {
        let waiting = Gauge::up(self, |c| &c.waiting);
        let mut cut = self.cut.subscribe();
        let permit = tokio::select! {
            permit = self.slots.clone().acquire_owned() => permit.map_err(|_| SimError::ShuttingDown)?,
            _ = cut.wait_for(|cut| *cut) => return Err(SimError::ShuttingDown),
        };
        drop(waiting);
        Ok((permit, Gauge::up(self, |c| &c.running)))
    }

    /// Waits for a generation slot, then takes the prefix hit and pins the prompt's blocks; a decode
    /// leg's blocks are pulled, and join the cache (and its events) as computed ones would.
    async fn admit(self: &Arc<Self>, prompt: &Arc<SimPrompt>, leg: &Leg) -> Result<Admitted, SimError> {
        let (permit, running) = self.slot().await?;
        let (admission, epoch) = {
            let mut cache = self.cache();
            let admission = cache.admit(prompt.prompt_tokens, &prompt.block_keys);
            if let Some(events) = &self.events {
                events.admitted(prompt, &admission);
            }
            (admission, cache.epoch())
        };
        let cached = admission.cached_tokens;
        let uncached = prompt.prompt_tokens.saturating_sub(cached);
        let pulled = leg.pulls_kv().then_some(uncached);
        // Pulled KV holds the images' tokens: vLLM runs no encoder for inputs inside computed tokens.
        let image_prefix = if pulled.is_some() { prompt.prompt_tokens } else { cached };
        let shared = ec_storage::present(self.opts.ec_shared_storage.as_deref(), &prompt.images);
        let image_work = self.images().admit(&prompt.images, image_prefix, &shared);
        self.counters.prompt_tokens.fetch_add(u64::from(prompt.prompt_tokens), Relaxed);
        self.counters.cached_tokens.fetch_add(u64::from(cached), Relaxed);
        if let Some(pulled) = pulled {
            self.counters.external_tokens.fetch_add(u64::from(pulled), Relaxed);
            self.counters.kv_transfers.fetch_add(1, Relaxed);
        }
        Ok(Admitted {
            cached_tokens: cached,
            uncached_tokens: uncached,
            pulled,
            image_work,
            _lease: CacheLease { state: self.clone(), pinned: admission.pinned, epoch },
            _running: running,
            _slot: permit,
        })
    }

    /// Time to first token of an admitted request: its prefill queued on the compute, or its pull.
    fn first_token(&self, admitted: &Admitted) -> Duration {
        match admitted.pulled {
            Some(pulled) => ttft_pulled(pulled, admitted.image_work, &self.opts),
            None => self.ttft_now(admitted.uncached_tokens, admitted.image_work),
        }
    }

    /// The prompt of `leg` is prefilled: an SGLang prefill's room is done for its decode leg.
    fn prefilled(&self, leg: &Leg) {
        if let Leg::SglangPrefill { room } = leg {
            self.rooms.finish(*room);
        }
    }

    /// SGLang decode: waits until the prefill's bootstrap says the room is done (or a shutdown).
    async fn wait_for_prefill(&self, b: &Bootstrap) -> Result<(), SimError> {
        let mut cut = self.cut.subscribe();
        if *cut.borrow_and_update() {
            return Err(SimError::ShuttingDown);
        }
        tokio::select! {
            done = bootstrap::wait(b, Duration::from_millis(self.opts.bootstrap_timeout_ms)) => done,
            _ = cut.wait_for(|cut| *cut) => Err(SimError::ShuttingDown),
        }
    }

    /// A vLLM prefill leg's `kv_transfer_params`: fresh opaque block ids for every prompt block, the
    /// partial last one included (vLLM hands over all of them).
    fn handoff(&self, job: &Job, cached_tokens: u32) -> Value {
        let blocks = u64::from(job.prompt.prompt_tokens).div_ceil(self.opts.block_size as u64);
        let first = self.next_block.fetch_add(blocks, Relaxed);
        let capacity = (self.opts.kv_blocks as u64).max(1);
        let block_ids = (first..first + blocks).map(|b| b % capacity).collect();
        Handoff {
            engine_id: &self.engine_id,
            request_id: &job.id,
            block_ids,
            prompt_tokens: job.prompt.prompt_tokens,
            cached_tokens,
        }
        .json()
    }

    fn snapshot(&self) -> Snapshot {
        let c = &self.counters;
        let prompt_tokens = c.prompt_tokens.load(Relaxed);
        let (images, processor_cache_bytes, encoder_cache_tokens) = {
            let caches = self.images();
            (caches.counts(), caches.processor_bytes(), caches.encoder_tokens())
        };
        Snapshot {
            model: self.opts.model.clone(),
            block_size: self.opts.block_size,
            kv_blocks: self.opts.kv_blocks,
            running: c.running.load(Relaxed),
            waiting: c.waiting.load(Relaxed),
            kv_usage: self.cache().usage(),
            // vLLM counts every prompt token as queried and the cached ones as hits.
            queries: prompt_tokens,
            hits: c.cached_tokens.load(Relaxed),
            prompt_tokens,
            generation_tokens: c.generation_tokens.load(Relaxed),
            cancelled: c.cancelled.load(Relaxed),
            role: self.opts.role.as_str(),
            external_tokens: c.external_tokens.load(Relaxed),
            kv_transfers: c.kv_transfers.load(Relaxed),
            ec_stores: c.ec_stores.load(Relaxed),
            images,
            processor_cache_bytes,
            encoder_cache_tokens,
        }
    }
}

/// A gauge counter held up while this value lives.
struct Gauge {
    state: Arc<AppState>,
    field: fn(&Counters) -> &AtomicU64,
}

impl Gauge {
    fn up(state: &Arc<AppState>, field: fn(&Counters) -> &AtomicU64) -> Self {
        field(&state.counters).fetch_add(1, Relaxed);
        Self { state: state.clone(), field }
    }
}

impl Drop for Gauge {
    fn drop(&mut self) {
        (self.field)(&self.state.counters).fetch_sub(1, Relaxed);
    }
}

/// One accepted completion request; dropped before [`Tracker::finish`] means the client went away.
struct Tracker {
    in_flight: Gauge,
    finished: bool,
}

impl Tracker {
    fn new(state: &Arc<AppState>) -> Self {
        Self { in_flight: Gauge::up(state, |c| &c.in_flight), finished: false }
    }

    fn finish(&mut self) {
        self.finished = true;
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        if !self.finished {
            self.in_flight.state.counters.cancelled.fetch_add(1, Relaxed);
        }
    }
}

/// Blocks pinned by a running request, unpinned on drop — unless the cache was cleared meanwhile (a
/// simulated restart): the same keys may have been stored again since, pinned by someone else.
struct CacheLease {
    state: Arc<AppState>,
    pinned: Vec<u64>,
    epoch: u64,
}

impl Drop for CacheLease {
    fn drop(&mut self) {
        let mut cache = self.state.cache();
        if cache.epoch() == self.epoch {
            cache.release(&self.pinned);
        }
    }
}

/// A request that holds a slot and its cache blocks.
struct Admitted {
    cached_tokens: u32,
    uncached_tokens: u32,
    /// A decode leg: the uncached tokens, pulled rather than computed.
    pulled: Option<u32>,
    image_work: ImageWork,
    _lease: CacheLease,
    _running: Gauge,
    _slot: OwnedSemaphorePermit,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Endpoint {
    Chat,
    Completion,
}

impl Endpoint {
    fn path(self) -> &'static str {
        match self {
            Self::Chat => "/v1/chat/completions",
            Self::Completion => "/v1/completions",
        }
    }

    fn flavour(self) -> Flavour {
        match self {
            Self::Chat => Flavour::Chat,
            Self::Completion => Flavour::Completion,
        }
    }

    fn shape(self) -> Shape {
        match self {
            Self::Chat => Shape::Chat,
            Self::Completion => Shape::Completion,
        }
    }
}

/// A parsed completion request.
struct Job {
    endpoint: Endpoint,
    id: String,
    created: u64,
    model: String,
    /// Shared with the event publisher task, which hashes and encodes it after the admission.
    prompt: Arc<SimPrompt>,
    /// What every choice says, token by token.
    answer: Answer,
    stream: bool,
    include_usage: bool,
    /// Stream only: cut the connection before this token (`--drop-mid-stream-rate`).
    drop_at: Option<u32>,
    /// The disaggregated-serving leg this request is.
    leg: Leg,
}

/// The exact request body bytes, buffered once by [`hash_body`].
#[derive(Clone)]
struct RawBody(Bytes);

/// The sim's routes, `more` (the Responses API and the tokenizer's, composed by `handle.rs` so that
/// this file names none of the modules that import it) among them.
pub(crate) fn router(state: Arc<AppState>, more: Router<Arc<AppState>>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completion))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/version", get(version))
        .route("/kv_event_sources", get(kv_event_sources))
        .route("/sim/restart", post(restart))
        .route("/sim/role", get(role))
        .merge(more)
        .fallback(not_found)
        .layer(from_fn_with_state(state.clone(), hash_body))
        .with_state(state)
}

/// Buffers the body once, hashing every byte received, and stamps the hash and the worker name on
/// every response (errors and 404s included).
async fn hash_body(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let (mut parts, body) = req.into_parts();
    let framing = if parts.headers.contains_key(axum::http::header::CONTENT_LENGTH) { "length" } else { "chunked" };
    let traceparent = parts.headers.get("traceparent").cloned();
    let (digest, read) = read_body(body, state.opts.max_body_bytes).await;
    let mut response = match read {
        Ok(bytes) => {
            parts.extensions.insert(RawBody(bytes.clone()));
            next.run(Request::from_parts(parts, Body::from(bytes))).await
        }
        Err(e) => e.into_response(),
    };
    let headers = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&digest) {
        headers.insert(BODY_SHA256, v);
    }
    if let Ok(v) = HeaderValue::from_str(&state.opts.name) {
        headers.insert(WORKER, v);
    }
    headers.insert(BODY_FRAMING, HeaderValue::from_static(framing));
    if let Some(v) = traceparent {
        headers.insert(TRACEPARENT_SEEN, v);
    }
    response
}

/// Reads the whole body: the hex SHA-256 of every byte received, and the bytes if within `limit`.
async fn read_body(mut body: Body, limit: usize) -> (String, Result<Bytes, SimError>) {
    let mut hasher = Sha256::new();
    let mut buf = BytesMut::new();
    let mut too_large = false;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) => return (hex(&hasher.finalize()), Err(SimError::BodyRead(e.to_string()))),
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        hasher.update(&data);
        // Keep hashing past the limit so the header still names the bytes received.
        if !too_large && buf.len().saturating_add(data.len()) > limit {
            too_large = true;
            buf = BytesMut::new();
        }
        if !too_large {
            buf.extend_from_slice(&data);
        }
    }
    let digest = hex(&hasher.finalize());
    if too_large {
        return (digest, Err(SimError::BodyTooLarge { limit }));
    }
    (digest, Ok(buf.freeze()))
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    bytes.iter().flat_map(|b| [DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 0xf)]]).map(char::from).collect()
}

impl IntoResponse for SimError {
    fn into_response(self) -> Response {
        if let Some(param) = self.vllm_param() {
            return vllm_bad_request(&self.to_string(), param);
        }
        if let Some((status, kind, param)) = self.vllm_error() {
            return vllm_error(status, kind, &self.to_string(), Some(param));
        }
        let (status, kind) = match &self {
            Self::InvalidJson(_)
            | Self::InvalidField { .. }
            | Self::BadRequest { .. }
            | Self::Prompt(_)
            | Self::BodyRead(_) => (StatusCode::BAD_REQUEST, "invalid_request_error"),
            Self::BodyTooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error"),
            Self::NotFound { .. } => (StatusCode::NOT_FOUND, "not_found_error"),
            Self::ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, "server_error"),
            Self::BootstrapHostRefused { .. } => (StatusCode::BAD_REQUEST, "invalid_request_error"),
            Self::BootstrapTimeout { .. } | Self::EcStorage(_) => (StatusCode::INTERNAL_SERVER_ERROR, "server_error"),
            Self::RateLimited => (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error"),
            Self::ModelNotFound { .. } | Self::ResponseNotFound { .. } => (StatusCode::NOT_FOUND, "not_found_error"),
            Self::CannotCancel => (StatusCode::BAD_REQUEST, "invalid_request_error"),
            Self::Unsupported(_) => (StatusCode::NOT_IMPLEMENTED, "server_error"),
            Self::InjectedError | Self::StreamDropped | Self::InvalidOption { .. } => {
                (StatusCode::INTERNAL_SERVER_ERROR, "server_error")
            }
        };
        let body = json!({"error": {"message": self.to_string(), "type": kind, "code": self.label()}});
        (status, Json(body)).into_response()
    }
}

impl SimError {
    /// `Some(param)` for the refusals vLLM's validators make, answered in vLLM's shape.
    fn vllm_param(&self) -> Option<Option<&'static str>> {
        match self {
            Self::BadRequest { param, .. } => Some(*param),
            Self::InvalidField { field, .. } => Some(Some(*field)),
            Self::InvalidJson(_) => Some(None),
            _ => None,
        }
    }
}

impl SimError {
    /// Status, `type` and `param` of the other refusals answered in vLLM's `ErrorResponse` shape.
    fn vllm_error(&self) -> Option<(StatusCode, &'static str, &'static str)> {
        match self {
            Self::ModelNotFound { .. } => Some((StatusCode::NOT_FOUND, "NotFoundError", "model")),
            Self::ResponseNotFound { .. } => Some((StatusCode::NOT_FOUND, "invalid_request_error", "response_id")),
            Self::CannotCancel => Some((StatusCode::BAD_REQUEST, "invalid_request_error", "response_id")),
            _ => None,
        }
    }
}

/// vLLM's `ErrorResponse`: `{"error": {message, type, param, code}}`, `code` the HTTP status.
fn vllm_error(status: StatusCode, kind: &str, message: &str, param: Option<&str>) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "param": param, "code": status.as_u16()}});
    (status, Json(body)).into_response()
}

/// vLLM's `ErrorResponse` for a request it refuses: 400, type `BadRequestError`, `code` the status.
fn vllm_bad_request(message: &str, param: Option<&str>) -> Response {
    vllm_error(StatusCode::BAD_REQUEST, "BadRequestError", message, param)
}

async fn not_found(method: Method, uri: Uri) -> Response {
    SimError::NotFound { method: method.to_string(), path: uri.path().to_owned() }.into_response()
}

async fn health() -> StatusCode {
    StatusCode::OK
}

async fn restart(State(state): State<Arc<AppState>>) -> Json<Value> {
    state.restart();
    tracing::info!(name = %state.opts.name, "sim: simulated engine restart (cache cleared, kv event seq reset)");
    Json(json!({"restarted": true}))
}

/// The sim's role, and what a disaggregated leg needs to reach it.
async fn role(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({
        "role": state.opts.role.as_str(),
        "engine_id": state.engine_id,
        "bootstrap_port": state.bootstrap_port,
        "ec_shared_storage": state.opts.ec_shared_storage,
    }))
}

/// A uuid4-shaped engine id, as vLLM's `engine_id`.
fn engine_id() -> String {
    let mut b = rand::random::<u128>().to_be_bytes();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex(&b);
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

async fn models(State(state): State<Arc<AppState>>) -> Json<Value> {
    let model = &state.opts.model;
    let base = json!({"id": model, "object": "model", "created": unix_now(), "owned_by": "mmrouter-sim", "root": model, "parent": null});
    let loaded = state.lora.names();
    let adapters = state.opts.lora_modules.iter().chain(&loaded).map(|a| {
        json!({"id": a, "object": "model", "created": unix_now(), "owned_by": "mmrouter-sim", "root": a, "parent": model})
    });
    let data: Vec<Value> = std::iter::once(base).chain(adapters).collect();
    Json(json!({"object": "list", "data": data}))
}

/// What vLLM answers for `GET /version`; the sim names itself so a doctor can tell.
async fn version() -> Json<Value> {
    Json(json!({ "version": concat!("mmrouter-sim-", env!("CARGO_PKG_VERSION")) }))
}

async fn kv_event_sources(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(state.event_sources.clone())
}

/// The bound event endpoints, resolved (port 0 replaced by the real port).
pub(crate) struct Bound<'a> {
    pub endpoint: &'a str,
    pub replay_endpoint: Option<&'a str>,
}

/// vLLM 0.32–0.34's `/kv_event_sources`: a map keyed by data-parallel rank, one entry per rank with
/// the publisher's settings (the sim is rank 0); `{}` when events are off.
fn event_sources(opts: &SimOptions, bound: Option<&Bound>) -> Value {
    let Some(bound) = bound else { return json!({}) };
    json!({ "0": {
        "enable_kv_cache_events": true,
        "publisher": "zmq",
        "endpoint": bound.endpoint,
        "replay_endpoint": bound.replay_endpoint,
        "buffer_steps": opts.kv_events_buffer,
        "hwm": 100_000,
        "max_queue_size": 100_000,
        "topic": opts.kv_events_topic,
    }})
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let text = exposition::render(&state.snapshot());
    ([(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

async fn chat(State(state): State<Arc<AppState>>, Extension(raw): Extension<RawBody>) -> Response {
    complete(state, Endpoint::Chat, raw.0).await
}

async fn completion(State(state): State<Arc<AppState>>, Extension(raw): Extension<RawBody>) -> Response {
    complete(state, Endpoint::Completion, raw.0).await
}

async fn complete(state: Arc<AppState>, endpoint: Endpoint, raw: Bytes) -> Response {
    state.counters.requests.fetch_add(1, Relaxed);
    if let Err(e) = state.pause(Duration::from_millis(state.opts.extra_delay_ms)).await {
        return e.into_response();
    }
    let job = match prepare(&state, endpoint, &raw) {
        Ok(job) => job,
        Err(e) => return e.into_response(),
    };
    if state.dice.roll(state.error_rate()) {
        state.counters.errors_injected.fetch_add(1, Relaxed);
        return injected_error(&state.opts);
    }
    let mut tracker = Tracker::new(&state);
    if let Leg::SglangDecode(b) = &job.leg {
        if let Err(e) = state.wait_for_prefill(b).await {
            // Answered, not abandoned by the client.
            tracker.finish();
            return e.into_response();
        }
    }
    if job.leg == Leg::Encode {
        return match answer_encode(&state, &job, tracker).await {
            Ok(body) => Json(body).into_response(),
            Err(e) => e.into_response(),
        };
    }
    if job.stream {
        return stream_response(state, job, tracker);
    }
    match answer_whole(&state, &job, tracker).await {
        Ok(body) => Json(body).into_response(),
        Err(e) => e.into_response(),
    }
}

/// One generation driven by another answer shape (the Responses API, `crate::responses`): the same
/// admission, prefix cache, timing, counters and faults as a completion's, through a narrow API.
pub(crate) struct Turn {
    state: Arc<AppState>,
    tracker: Tracker,
    admitted: Option<Admitted>,
}

impl AppState {
    /// A request arrives: counted, then delayed by `--extra-delay-ms`.
    pub(crate) async fn arrive(&self) -> Result<(), SimError> {
        self.counters.requests.fetch_add(1, Relaxed);
        self.pause(Duration::from_millis(self.opts.extra_delay_ms)).await
    }

    /// `--error-rate`'s dice: the answer of a request failed on purpose.
    pub(crate) fn injected(&self) -> Option<Response> {
        if !self.dice.roll(self.error_rate()) {
            return None;
        }
        self.counters.errors_injected.fetch_add(1, Relaxed);
        Some(injected_error(&self.opts))
    }

    /// `--drop-mid-stream-rate`'s dice for a stream of `tokens`: the token it is cut before.
    pub(crate) fn drop_at(&self, tokens: u32) -> Option<u32> {
        self.dice.roll(self.opts.drop_mid_stream_rate).then_some(tokens / 2)
    }

    pub(crate) fn prompter(&self) -> &dyn Prompter {
        self.prompter.as_ref()
    }
}

impl Turn {
    pub(crate) fn new(state: &Arc<AppState>) -> Turn {
        Turn { state: state.clone(), tracker: Tracker::new(state), admitted: None }
    }

    /// Admits the prompt (slot, prefix hit, pinned blocks, image caches) and waits for its first
    /// token; the prompt's cached tokens.
    pub(crate) async fn prefill(&mut self, prompt: &Arc<SimPrompt>) -> Result<u32, SimError> {
        let admitted = self.state.admit(prompt, &Leg::Whole).await?;
        self.state.pause(self.state.first_token(&admitted)).await?;
        let cached = admitted.cached_tokens;
        self.admitted = Some(admitted);
        Ok(cached)
    }

    /// Output token `i` of a stream: the faults (`drop_at`, `--stall-after-tokens`), then its decode.
    pub(crate) async fn token(&mut self, i: u32, drop_at: Option<u32>) -> Result<(), SimError> {
        if drop_at == Some(i) {
            self.state.counters.streams_dropped.fetch_add(1, Relaxed);
            // Not the client's doing: not counted as cancelled.
            self.tracker.finish();
            return Err(SimError::StreamDropped);
        }
        if self.state.opts.stall_after_tokens == Some(i) {
            self.state.pause(Duration::MAX).await?;
        }
        if i > 0 {
            self.state.pause(decode_delay(&self.state.opts)).await?;
        }
        self.state.counters.generation_tokens.fetch_add(1, Relaxed);
        Ok(())
    }

    /// A whole answer's `tokens` after the first: decoded at once, counted.
    pub(crate) async fn decode_all(&mut self, tokens: u32) -> Result<(), SimError> {
        self.state.pause(decode_delay(&self.state.opts).saturating_mul(tokens.saturating_sub(1))).await?;
        self.state.counters.generation_tokens.fetch_add(u64::from(tokens), Relaxed);
        Ok(())
    }

    /// The answer is complete: the request is no longer in flight, its blocks are unpinned.
    pub(crate) fn finish(&mut self) {
        self.tracker.finish();
        self.admitted = None;
    }
}

/// An `--error-rate` answer: `--error-status`, with `retry-after` when asked for.
fn injected_error(opts: &SimOptions) -> Response {
    let err = if opts.error_status == 429 { SimError::RateLimited } else { SimError::InjectedError };
    let mut resp = err.into_response();
    *resp.status_mut() = StatusCode::from_u16(opts.error_status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Some(secs) = opts.error_retry_after_secs {
        resp.headers_mut().insert("retry-after", HeaderValue::from(secs));
    }
    resp
}

fn prepare(state: &AppState, endpoint: Endpoint, raw: &[u8]) -> Result<Job, SimError> {
    let body: Value = serde_json::from_slice(raw).map_err(|e| SimError::InvalidJson(e.to_string()))?;
    if !body.is_object() {
        return Err(SimError::InvalidJson("the body must be a JSON object".to_owned()));
    }
    let opts = &state.opts;
    // vLLM validates the request before it renders the prompt.
    let params = Params::read(endpoint.flavour(), &body)?;
    let leg = disagg::leg(opts.role, &body)?;
    let (output_tokens, finish_reason) = output_tokens(endpoint, &body, opts)?;
    let cap = if finish_reason == "length" { output_tokens } else { opts.max_output_tokens };
    let mut budget = Budget { text: output_tokens, text_finish: finish_reason, cap };
    let mut stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(SimError::InvalidField { field: "stream", reason: "must be a boolean".to_owned() }),
    };
    // A vLLM prefill leg ends after its first token and answers whole; so does an encoder.
    if matches!(leg, Leg::VllmPrefill | Leg::Encode) {
        budget = Budget { text: 1, text_finish: "length", cap: 1 };
        stream = false;
    }
    let answer = Answer::new(&params, budget, endpoint.shape());
    let include_usage =
        stream && body.pointer("/stream_options/include_usage").and_then(Value::as_bool).unwrap_or(false);
    let model = body.get("model").and_then(Value::as_str).unwrap_or(&opts.model).to_owned();
    let prompt = state.prompter.prompt(endpoint.path(), &body, raw, opts.block_size).map_err(SimError::Prompt)?;
    let drop_at = (stream && state.dice.roll(opts.drop_mid_stream_rate)).then_some(answer.longest() / 2);
    let seq = state.next_id.fetch_add(1, Relaxed);
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completion => "cmpl",
    };
    Ok(Job {
        endpoint,
        id: format!("{prefix}-{}-{seq}", opts.name),
        created: unix_now(),
        model,
        prompt: Arc::new(prompt),
        answer,
        stream,
        include_usage,
        drop_at,
        leg,
    })
}

/// Output length and finish reason: the request's `max_completion_tokens`/`max_tokens` (capped at
/// `--max-output-tokens`) ends with "length"; without one the simulated model "stops" after
/// `--default-output-tokens`.
fn output_tokens(endpoint: Endpoint, body: &Value, opts: &SimOptions) -> Result<(u32, &'static str), SimError> {
    let fields: &[&'static str] = match endpoint {
        Endpoint::Chat => &["max_completion_tokens", "max_tokens"],
        Endpoint::Completion => &["max_tokens"],
    };
    for &field in fields {
        match body.get(field) {
            None | Some(Value::Null) => continue,
            Some(v) => {
                let n = v.as_u64().filter(|n| *n >= 1).ok_or_else(|| SimError::InvalidField {
                    field,
                    reason: "must be an integer of at least 1".to_owned(),
                })?;
                let n = u32::try_from(n).unwrap_or(u32::MAX).min(opts.max_output_tokens);
                return Ok((n, "length"));
            }
        }
    }
    Ok((opts.default_output_tokens.min(opts.max_output_tokens), "stop"))
}

async fn answer_whole(state: &Arc<AppState>, job: &Job, mut tracker: Tracker) -> Result<Value, SimError> {
    let admitted = state.admit(&job.prompt, &job.leg).await?;
    state.pause(state.first_token(&admitted)).await?;
    state.prefilled(&job.leg);
    // The choices decode side by side: the longest sets the time.
    let decodes = job.answer.longest().saturating_sub(1);
    state.pause(decode_delay(&state.opts).saturating_mul(decodes)).await?;
    state.counters.generation_tokens.fetch_add(u64::from(job.answer.tokens()), Relaxed);
    tracker.finish();
    let usage = usage(job, admitted.cached_tokens, job.answer.tokens(), state.opts.usage_drift);
    let mut body = whole_body(job, job.answer.whole(), usage);
    if job.leg == Leg::VllmPrefill {
        body["kv_transfer_params"] = state.handoff(job, admitted.cached_tokens);
    }
    Ok(body)
}

fn whole_body(job: &Job, choices: Vec<Value>, usage: Value) -> Value {
    json!({
        "id": job.id,
        "object": match job.endpoint { Endpoint::Chat => "chat.completion", Endpoint::Completion => "text_completion" },
        "created": job.created,
        "model": job.model,
        "choices": choices,
        "usage": usage,
    })
}

/// An encoder's answer (vLLM E/PD): the images preprocessed and encoded unless its own caches hold
/// them, nothing prefilled nor cached, written to the shared storage; empty content and the images'
/// `ec_transfer_params`.
async fn answer_encode(state: &Arc<AppState>, job: &Job, mut tracker: Tracker) -> Result<Value, SimError> {
    let (_slot, _running) = state.slot().await?;
    let images = &job.prompt.images;
    let work = state.images().admit(images, 0, &[]);
    state.pause(state.ttft_now(0, work)).await?;
    if let Some(dir) = state.opts.ec_shared_storage.clone() {
        let images = images.clone();
        let stored = tokio::task::spawn_blocking(move || ec_storage::store(&dir, &images))
            .await
            .map_err(|e| SimError::EcStorage(e.to_string()))?
            .map_err(|e| SimError::EcStorage(e.to_string()))?;
        state.counters.ec_stores.fetch_add(stored, Relaxed);
    }
    tracker.finish();
    let index = |s: &crate::answer::Script| s.index;
    let choices = job.answer.choices.iter().map(|s| match job.endpoint {
        Endpoint::Chat => json!({"index": index(s), "message": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": "length"}),
        Endpoint::Completion => json!({"index": index(s), "text": "", "logprobs": null, "finish_reason": "length"}),
    });
    let mut body = whole_body(job, choices.collect(), usage(job, 0, 0, state.opts.usage_drift));
    body["ec_transfer_params"] = disagg::ec_transfer_params(images);
    Ok(body)
}

/// OpenAI usage; `usage_drift` skews the reported prompt tokens (never below zero).
fn usage(job: &Job, cached_tokens: u32, completion_tokens: u32, usage_drift: i64) -> Value {
    let prompt = i64::from(job.prompt.prompt_tokens).saturating_add(usage_drift).max(0);
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt.saturating_add(i64::from(completion_tokens)),
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    })
}

fn stream_response(state: Arc<AppState>, job: Job, tracker: Tracker) -> Response {
    let generation = Generation { state, job, tracker, admitted: None, step: Step::Admit };
    let stream = futures_util::stream::unfold(generation, |mut g| async move {
        let item = g.next().await?;
        Some((item, g))
    });
    ([(CONTENT_TYPE, "text/event-stream"), (CACHE_CONTROL, "no-cache")], Body::from_stream(stream)).into_response()
}

#[derive(Clone, Copy, Debug)]
enum Step {
    Admit,
    Token(u32),
    Usage,
    Done,
    Finished,
}

/// The state of one streamed answer; dropping it (client gone) releases everything it holds.
struct Generation {
    state: Arc<AppState>,
    job: Job,
    tracker: Tracker,
    admitted: Option<Admitted>,
    step: Step,
}

impl Generation {
    async fn next(&mut self) -> Option<Result<Bytes, SimError>> {
        let result = self.advance().await;
        if result.as_ref().is_some_and(Result::is_err) {
            self.step = Step::Finished;
        }
        result
    }

    async fn advance(&mut self) -> Option<Result<Bytes, SimError>> {
        let opts = &self.state.opts;
        loop {
            match self.step {
                Step::Admit => {
                    let admitted = match self.state.admit(&self.job.prompt, &self.job.leg).await {
                        Ok(a) => a,
                        Err(e) => return Some(Err(e)),
                    };
                    if let Err(e) = self.state.pause(self.state.first_token(&admitted)).await {
                        return Some(Err(e));
                    }
                    self.state.prefilled(&self.job.leg);
                    self.admitted = Some(admitted);
                    self.step = Step::Token(0);
                    // vLLM opens a chat stream with the assistant role, one chunk per choice; completions
                    // go on to the first token.
                    if self.job.endpoint == Endpoint::Chat {
                        return Some(Ok(self.chunks(self.job.answer.openings())));
                    }
                }
                Step::Token(i) => {
                    if self.job.drop_at == Some(i) {
                        self.state.counters.streams_dropped.fetch_add(1, Relaxed);
                        // Not the client's doing: do not count it as cancelled.
                        self.tracker.finish();
                        return Some(Err(SimError::StreamDropped));
                    }
                    if opts.stall_after_tokens == Some(i) {
                        // Stalls until the sim is told to cut its streams (shutdown).
                        if let Err(e) = self.state.pause(Duration::MAX).await {
                            return Some(Err(e));
                        }
                    }
                    if i > 0 {
                        if let Err(e) = self.state.pause(decode_delay(opts)).await {
                            return Some(Err(e));
                        }
                    }
                    let choices = self.job.answer.step(i);
                    self.state.counters.generation_tokens.fetch_add(choices.len() as u64, Relaxed);
                    let last = i.saturating_add(1) >= self.job.answer.longest();
                    self.step = match (last, self.job.include_usage) {
                        (false, _) => Step::Token(i.saturating_add(1)),
                        (true, true) => Step::Usage,
                        (true, false) => Step::Done,
                    };
                    return Some(Ok(self.chunks(choices)));
                }
                Step::Usage => {
                    self.step = Step::Done;
                    let cached = self.admitted.as_ref().map_or(0, |a| a.cached_tokens);
                    let usage = usage(&self.job, cached, self.job.answer.tokens(), opts.usage_drift);
                    let object = self.object();
                    let chunk = json!({
                        "id": self.job.id, "object": object, "created": self.job.created, "model": self.job.model,
                        "choices": [], "usage": usage,
                    });
                    return Some(Ok(sse(&chunk)));
                }
                Step::Done => {
                    self.tracker.finish();
                    self.admitted = None;
                    self.step = Step::Finished;
                    return Some(Ok(Bytes::from_static(b"data: [DONE]\n\n")));
                }
                Step::Finished => return None,
            }
        }
    }

    fn object(&self) -> &'static str {
        match self.job.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completion => "text_completion",
        }
    }

    /// One SSE event per choice entry, each chunk holding one choice as vLLM sends them.
    fn chunks(&self, choices: Vec<Value>) -> Bytes {
        let mut out = BytesMut::new();
        for choice in choices {
            let chunk = json!({
                "id": self.job.id, "object": self.object(), "created": self.job.created, "model": self.job.model,
                "choices": [choice],
            });
            out.extend_from_slice(&sse(&chunk));
        }
        out.freeze()
    }
}

fn sse(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_lowercase_and_padded() {
        assert_eq!(hex(&[0x00, 0x0f, 0xab, 0xff]), "000fabff");
        assert_eq!(hex(&Sha256::digest(b"")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }

    #[test]
    fn output_tokens_rules() {
        let opts = SimOptions { max_output_tokens: 100, default_output_tokens: 7, ..SimOptions::default() };
        let chat = |v: Value| output_tokens(Endpoint::Chat, &v, &opts);
        assert_eq!(chat(json!({})).expect("default"), (7, "stop"));
        assert_eq!(chat(json!({"max_tokens": 5})).expect("max_tokens"), (5, "length"));
        assert_eq!(chat(json!({"max_tokens": 5, "max_completion_tokens": 9})).expect("both"), (9, "length"));
        assert_eq!(chat(json!({"max_tokens": 5000})).expect("capped"), (100, "length"));
        assert_eq!(chat(json!({"max_tokens": null})).expect("null"), (7, "stop"));
        assert_eq!(chat(json!({"max_tokens": 0})).expect_err("zero").label(), "invalid_field");
        assert_eq!(chat(json!({"max_tokens": "3"})).expect_err("string").label(), "invalid_field");
        let comp = output_tokens(Endpoint::Completion, &json!({"max_completion_tokens": 9}), &opts);
        assert_eq!(comp.expect("ignored on completions"), (7, "stop"));
    }

    #[test]
    fn engine_ids_are_uuid4() {
        let id = engine_id();
        let parts: Vec<usize> = id.split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12], "{id}");
        assert_eq!(id.as_bytes()[14], b'4', "{id}");
        assert!(matches!(id.as_bytes()[19], b'8' | b'9' | b'a' | b'b'), "{id}");
        assert_ne!(id, engine_id());
    }

    #[test]
    fn token_text_is_deterministic() {
        let text: String = (0..3).map(|i| crate::answer::word(0, i)).collect();
        assert_eq!(text, "The quick brown");
    }
}
