//! Every metric name mmrouter exports (a dashboard contract: see the design's table), with its help
//! text and, for histograms, its buckets: the one list.

use metrics::{KeyName, Level, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusRecorder};

/// Counter `{route, status}`: every proxied request, counted when its response ends; `status` is the
/// HTTP status sent, or `stream_error` for a body cut after the status was sent.
pub const REQUESTS_TOTAL: &str = "mmrouter_requests_total";
/// Counter `{reason}`: a request refused before routing, by its error code (`prompt_too_long`,
/// `image_url_blocked`, `invalid_json`, …); also counted in [`REQUESTS_TOTAL`] as `route="rejected"`.
pub const REJECTED_TOTAL: &str = "mmrouter_rejected_total";
/// Counter `{pool}`: requests routed to each pool (by their `model`). Pools are few and named in the
/// config, so the label stays bounded; join per-worker series to pools with [`WORKER_INFO`].
pub const POOL_REQUESTS_TOTAL: &str = "mmrouter_pool_requests_total";
/// Gauge `{worker, pool, engine, role}` = 1: which pool each worker serves, on what engine and in which
/// role (`both`, `prefill`, `decode`, `encode`; docs/disaggregated.md), for joins in dashboards.
pub const WORKER_INFO: &str = "mmrouter_worker_info";
/// Counter `{reason}`: a request with media fell back to text-prefix routing.
pub const MM_FALLBACK_TOTAL: &str = "mmrouter_mm_fallback_total";
/// Counter `{reason}`: a chat without media whose prompt the router could not render exactly (its
/// template, tokenizer or request): routed by load, on no ids.
pub const PROMPT_UNRENDERED_TOTAL: &str = "mmrouter_prompt_unrendered_total";
/// Histogram: image tokens of an exact-routed request.
pub const IMAGE_TOKENS_PER_REQUEST: &str = "mmrouter_image_tokens_per_request";
/// Histogram: images of an exact-routed request.
pub const IMAGES_PER_REQUEST: &str = "mmrouter_images_per_request";
/// Gauge `{worker}`: image tokens in flight (exact route only).
pub const WORKER_INFLIGHT_IMAGE_TOKENS: &str = "mmrouter_worker_inflight_image_tokens";
/// Gauge `{worker}`: requests in flight.
pub const WORKER_INFLIGHT_REQUESTS: &str = "mmrouter_worker_inflight_requests";
/// Gauge `{worker}`: prompt tokens dispatched and not yet answered with a first byte.
pub const WORKER_INFLIGHT_PREFILL_TOKENS: &str = "mmrouter_worker_inflight_prefill_tokens";
/// Gauge `{worker}`: images the router's residency model says the worker's engine still holds in its
/// processor or encoder cache (learnt from the router's own exact dispatches).
pub const WORKER_IMAGES_RESIDENT: &str = "mmrouter_worker_images_resident";
/// Counter `{worker}`: the engine's own `vllm:mm_cache_queries` (images looked up in its processor
/// cache), mirrored from its `/metrics` at each health check.
pub const WORKER_ENGINE_MM_CACHE_QUERIES: &str = "mmrouter_worker_engine_mm_cache_queries_total";
/// Counter `{worker}`: the engine's own `vllm:mm_cache_hits` (of those, found there).
pub const WORKER_ENGINE_MM_CACHE_HITS: &str = "mmrouter_worker_engine_mm_cache_hits_total";
/// Counter `{worker, reason}`: a reading of those two refused as absurd and not mirrored (`not_a_number`,
/// `not_finite`, `negative`, `implausible`: over 2^53, `hits_over_queries`, `backwards`: hits fell while
/// queries did not, which no engine restart explains).
pub const WORKER_ENGINE_COUNTERS_REFUSED: &str = "mmrouter_worker_engine_counters_refused_total";
/// Counter `{worker, outcome}`: runtime LoRA loads (`[model] load_lora_adapters`): `loaded`,
/// `already_loaded` (the engine had it: another replica was first), `refused` (the engine's error
/// answer), `unreachable`, `timeout`.
pub const ADAPTER_LOADS_TOTAL: &str = "mmrouter_adapter_loads_total";
/// Counter `{adapter}`: requests naming a LoRA adapter their pool knows, by adapter: the first
/// [`MAX_ADAPTER_LABELS`] adapters seen by name, every later one as `other` (bounded).
pub const ADAPTER_REQUESTS_TOTAL: &str = "mmrouter_adapter_requests_total";
/// Most adapter names `mmrouter_adapter_requests_total` labels.
pub const MAX_ADAPTER_LABELS: usize = 32;
/// Gauge `{worker, state}`: LoRA adapters a worker's engine lists (`served`) and those likely in its
/// LoRA slots now (`active`: its engine's running and waiting adapters, and this router's sends in
/// the last minute).
pub const WORKER_ADAPTERS: &str = "mmrouter_worker_adapters";
/// Histogram `{route}`: prompt tokens the chosen worker already held (predicted).
pub const KV_OVERLAP_TOKENS: &str = "mmrouter_kv_overlap_tokens";
/// Histogram `{stage}`: seconds spent per pipeline stage.
pub const STAGE_DURATION_SECONDS: &str = "mmrouter_stage_duration_seconds";
/// Histogram `{source}`: seconds to fetch/decode and probe one image.
pub const IMAGE_PROBE_DURATION_SECONDS: &str = "mmrouter_image_probe_duration_seconds";
/// Histogram: actual (worker usage) minus predicted prompt tokens.
pub const PROMPT_TOKENS_DRIFT: &str = "mmrouter_prompt_tokens_drift";
/// Gauge: block keys held by the routing index.
pub const INDEX_BLOCKS: &str = "mmrouter_index_blocks";
/// Counter `{worker, status}`: every upstream attempt.
pub const UPSTREAM_REQUESTS_TOTAL: &str = "mmrouter_upstream_requests_total";

/// Counter `{outcome}`: a Responses request (`previous_response_id`, `GET`/`DELETE
/// /v1/responses/{id}`, cancel) pinned to the worker that stored the response: `known`, `recovered`
/// (found by asking the pool's workers), or refused: `response_not_found`, `response_worker_gone`,
/// `response_worker_unavailable`.
pub const RESPONSES_PINNED_TOTAL: &str = "mmrouter_responses_pinned_total";
/// Counter `{source}`: response ids learnt and where from (`worker`: an answer relayed here, `peer`:
/// another replica; `refused`: a peer's record refused).
pub const RESPONSES_LEARNT_TOTAL: &str = "mmrouter_responses_learnt_total";

/// Counter `{reason}`: an upstream attempt tried again on the next candidate (`connect_error`,
/// `timeout`, `transport_error`, `server_error`, `rate_limited`).
pub const UPSTREAM_RETRIES_TOTAL: &str = "mmrouter_upstream_retries_total";
/// Counter: a retry refused because the retry budget was used up (the failure went to the client).
pub const RETRY_BUDGET_EXHAUSTED_TOTAL: &str = "mmrouter_retry_budget_exhausted_total";
/// Counter: spans the OTLP exporter delivered (the collector answered 2xx) (docs/tracing.md).
pub const TRACE_SPANS_EXPORTED_TOTAL: &str = "mmrouter_trace_spans_exported_total";
/// Counter `{reason}`: spans not delivered: `queue_full` (dropped at the observation point, never
/// waited for), `export_failed` (the collector refused the batch, or it failed or timed out).
pub const TRACE_SPANS_DROPPED_TOTAL: &str = "mmrouter_trace_spans_dropped_total";
/// Counter `{worker}`: passive ejections (failures in a row, failure rate, refused connections).
pub const WORKER_EJECTIONS_TOTAL: &str = "mmrouter_worker_ejections_total";
/// Gauge `{worker, state}`: 1 for the worker's current state (`healthy`, `ejected`, `half_open`,
/// `down`), 0 for the others.
pub const WORKER_STATE: &str = "mmrouter_worker_state";
/// Counter `{route, reason}`: a response body cut after its status was sent (`upstream_error`,
/// `idle_timeout`, `total_timeout`); the request is counted as `status="stream_error"`.
pub const STREAM_ERRORS_TOTAL: &str = "mmrouter_stream_errors_total";

/// Gauge `{source}`: (block, worker) index entries by where they came from (`events`, `pending`,
/// `approximate`).
pub const INDEX_BLOCKS_BY_SOURCE: &str = "mmrouter_index_blocks_by_source";
/// Counter `{worker, kind}`: blocks of a worker's KV events, by what became of them (`stored`, `removed`,
/// `cleared`, `ignored`, `orphan`, `unmatchable`, `block_size_mismatch`, `unknown`).
pub const KV_EVENTS_TOTAL: &str = "mmrouter_kv_events_total";
/// Counter `{worker}`: event batches received.
pub const KV_EVENT_BATCHES_TOTAL: &str = "mmrouter_kv_event_batches_total";
/// Counter `{worker}`: frames that could not be decoded (skipped).
pub const KV_EVENT_MALFORMED_TOTAL: &str = "mmrouter_kv_event_malformed_total";
/// Counter `{worker, kind}`: sequence problems (`gap`, `replay`, `replay_failure`, `resync`, `restart`).
pub const KV_EVENT_SEQUENCE_TOTAL: &str = "mmrouter_kv_event_sequence_total";
/// Counter `{worker, reason}`: input refused from a worker's event publisher or discovery document:
/// protocol violations (`frame_too_large`, `message_too_large`, `too_many_frames`, `bad_greeting`, …),
/// malformed messages (their decode label), `inconsistent_event`, `state_overflow`, `index_share` (event blocks beyond the worker's
/// `routing.index_worker_share` of the index), and
/// `discovery_<reason>` (`too_large`, `too_many_ranks`, `foreign_host`, `not_json`, `bad_shape`, …).
pub const KV_EVENT_REFUSED_TOTAL: &str = "mmrouter_kv_event_refused_total";
/// Gauge `{worker}`: 1 while every rank's subscription is connected.
pub const KV_EVENT_CONNECTED: &str = "mmrouter_kv_event_connected";
/// Histogram `{worker}`: now minus the batch's engine timestamp, seconds.
pub const KV_EVENT_LAG_SECONDS: &str = "mmrouter_kv_event_lag_seconds";

/// Gauge: client connections open.
pub const CONNECTIONS_OPEN: &str = "mmrouter_connections_open";
/// Gauge: client requests in flight (what `server.max_inflight_requests` caps).
pub const INFLIGHT_REQUESTS: &str = "mmrouter_inflight_requests";
/// Counter `{reason}`: connections or requests refused with a 503 (`connections`, `inflight`).
pub const SHED_TOTAL: &str = "mmrouter_shed_total";
/// Counter `{outcome}`: the endpoint picker's decisions (docs/gateway.md): `picked`, `unavailable`
/// (503: no worker), `shed` (429: at capacity), `rejected` (the request refused, 4xx).
pub const PICKER_DECISIONS_TOTAL: &str = "mmrouter_picker_decisions_total";
/// Counter `{kind}`: client connections cut by a timeout (`header`, `body`, `idle`, `drain`).
pub const CLIENT_TIMEOUTS_TOTAL: &str = "mmrouter_client_timeouts_total";
/// Counter `{scope}`: requests refused for a missing or wrong key (`client`, `admin`).
pub const AUTH_FAILURES_TOTAL: &str = "mmrouter_auth_failures_total";

/// Counter `{leg, outcome}`: the legs of disaggregated requests (`leg`: `encode`, `prefill`,
/// `decode`; `outcome`: `served`, `failed`, `skipped`).
pub const DISAGG_LEGS_TOTAL: &str = "mmrouter_disagg_legs_total";
/// Counter `{leg, reason}`: a leg that failed or was skipped, so the request took a smaller path (a
/// failed encode leg: prefill encodes locally; a failed prefill leg: another prefill worker, then
/// served whole by a decode worker). `reason`: `connect_error`, `timeout`, `server_error`, `busy`,
/// `refused`, `kv_transfer_params_shape`, …, and for skips `cached_prefix` (every image already
/// inside the prefill worker's cached prefix), `no_encode_worker`, `no_prefill_worker`.
pub const DISAGG_FALLBACK_TOTAL: &str = "mmrouter_disagg_fallback_total";
/// Histogram `{leg}`: time of each leg as the router saw it (`encode` and `prefill`: the whole leg;
/// `decode`: to the decode worker's response head).
pub const DISAGG_LEG_DURATION_SECONDS: &str = "mmrouter_disagg_leg_duration_seconds";
/// Counter `{worker}`: prompt tokens the worker's engine received from another engine over its KV
/// connector, as its own `vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}` says.
pub const WORKER_ENGINE_KV_TRANSFER_TOKENS: &str = "mmrouter_worker_engine_kv_transfer_tokens_total";
/// Counter `{worker}`: the engine's NIXL transfers (`vllm:nixl_xfer_time_seconds_count`).
pub const WORKER_ENGINE_KV_TRANSFERS: &str = "mmrouter_worker_engine_kv_transfers_total";
/// Gauge `{worker}`: seconds the engine's NIXL transfers took in all (`vllm:nixl_xfer_time_seconds_sum`,
/// mirrored: a gauge because the recorder's counters are whole numbers, and whole seconds would lose
/// every transfer; it only grows, but for an engine restart).
pub const WORKER_ENGINE_KV_TRANSFER_SECONDS: &str = "mmrouter_worker_engine_kv_transfer_seconds";
/// Counter `{worker, leg}`: legs sent to each worker.
pub const WORKER_LEGS_TOTAL: &str = "mmrouter_worker_legs_total";

/// `stage` label values of [`STAGE_DURATION_SECONDS`], in pipeline order.
pub mod stage {
    pub const INTAKE: &str = "intake";
    pub const ACCOUNT: &str = "account";
    pub const PLAN: &str = "plan";
    pub const SELECT: &str = "select";
    pub const FORWARD_TTFB: &str = "forward_ttfb";
}

pub(super) static METADATA: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// Gauge: other replicas heard from within `cluster.booking_ttl_ms`.
pub const CLUSTER_PEERS: &str = "mmrouter_cluster_peers";
/// Gauge: 1 while this replica's NATS connection is up.
pub const CLUSTER_NATS_CONNECTED: &str = "mmrouter_cluster_nats_connected";
/// Counter `{event}`: NATS connection events (`connected`, `disconnected`).
pub const CLUSTER_NATS_EVENTS_TOTAL: &str = "mmrouter_cluster_nats_events_total";
/// Counter `{event}`: bookings `sent` (this replica's), `applied` (another's, as remote load),
/// `expired` (its replica went silent), `reconciled` (missing from its replica's heartbeat).
pub const CLUSTER_BOOKINGS_TOTAL: &str = "mmrouter_cluster_bookings_total";
/// Gauge: other replicas' bookings held as remote load now.
pub const CLUSTER_REMOTE_BOOKINGS: &str = "mmrouter_cluster_remote_bookings";
/// Counter `{direction}`: dispatch records (pending/approximate blocks) `sent` and `applied`.
pub const CLUSTER_DISPATCHES_TOTAL: &str = "mmrouter_cluster_dispatches_total";
/// Counter `{reason}`: cluster messages not sent or not applied (`queue_full`, `malformed`,
/// `unknown_pool`, `unknown_worker`).
pub const CLUSTER_MESSAGES_DROPPED_TOTAL: &str = "mmrouter_cluster_messages_dropped_total";
/// Counter `{reason}`: other replicas' messages refused by their checks (`oversized`, `malformed`,
/// `bad_name`, `implausible_load`, `too_many`, `quota_peers`, `quota_bookings`, `quota_load`,
/// `quota_keys`, `quota_queue`).
pub const CLUSTER_MESSAGES_REFUSED_TOTAL: &str = "mmrouter_cluster_messages_refused_total";
/// Gauge `{state}`: 1 for the bootstrap's state: `pending`, `complete` or `incomplete`.
pub const CLUSTER_BOOTSTRAP: &str = "mmrouter_cluster_bootstrap";
/// Receive time of another replica's booking minus its send time, as the two hosts' clocks say.
pub const CLUSTER_BOOKING_DELAY_SECONDS: &str = "mmrouter_cluster_booking_delay_seconds";
/// Gauge: how far behind the engines the bootstrapped state was when it became ready (seconds).
pub const CLUSTER_BOOTSTRAP_STATE_AGE_SECONDS: &str = "mmrouter_cluster_bootstrap_state_age_seconds";
/// Gauge: seconds from start to the end of the bootstrap.
pub const CLUSTER_BOOTSTRAP_DURATION_SECONDS: &str = "mmrouter_cluster_bootstrap_duration_seconds";
/// Counter `{direction}`: snapshot bytes `sent` to peers and `received` from them.
pub const CLUSTER_SNAPSHOT_BYTES_TOTAL: &str = "mmrouter_cluster_snapshot_bytes_total";
/// Counter `{reason}`: snapshot fetches that failed (`unreachable`, `status`, `timeout`, or the
/// stream's refusal: `frame_too_large`, `malformed`, `truncated`, …).
pub const CLUSTER_SNAPSHOT_FAILURES_TOTAL: &str = "mmrouter_cluster_snapshot_failures_total";
/// Counter `{reason}`: a grafted snapshot's resume point the worker's engine refuted, so that rank
/// fell back to the engine's ring and the worker's grafted state was dropped (`resume_ahead`: past
/// anything the engine published; `resume_unreachable`: older than its ring reaches).
pub const CLUSTER_RESUME_FALLBACKS_TOTAL: &str = "mmrouter_cluster_resume_fallbacks_total";
/// Counter `{entry, outcome}`: resolutions of a DNS worker entry (`entry`: `pool/name`, from the
/// config): `ok`, `truncated` (more addresses than `discovery.max_addresses`), `empty` (no records:
/// drained once the next answer agrees), `failed` (no answer: the workers kept), `refused` (an
/// address the pool refused to add, e.g. its name taken).
pub const DNS_RESOLUTIONS_TOTAL: &str = "mmrouter_dns_resolutions_total";
/// Gauge `{entry}`: the workers a DNS worker entry has added and not retired.
pub const DNS_WORKERS: &str = "mmrouter_dns_workers";

/// A recorder with every family described and every histogram's buckets set.
pub(super) fn recorder() -> PrometheusRecorder {
    let r = builder().build_recorder();
    describe(&r);
    r
}

fn builder() -> PrometheusBuilder {
    const SECONDS: [f64; 19] = [
        0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
        10.0, 30.0, 60.0,
    ];
    const TOKENS: [f64; 13] =
        [16.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0, 65536.0, 131072.0];
    const COUNTS: [f64; 10] = [0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0];
    const DRIFT: [f64; 14] =
        [-1024.0, -256.0, -64.0, -16.0, -4.0, -1.0, -0.5, 0.5, 1.0, 4.0, 16.0, 64.0, 256.0, 1024.0];
    let layouts: [(&'static str, &'static [f64]); 7] = [
        (STAGE_DURATION_SECONDS, &SECONDS),
        (DISAGG_LEG_DURATION_SECONDS, &SECONDS),
        (IMAGE_PROBE_DURATION_SECONDS, &SECONDS),
        (IMAGE_TOKENS_PER_REQUEST, &TOKENS),
        (KV_OVERLAP_TOKENS, &TOKENS),
        (IMAGES_PER_REQUEST, &COUNTS),
        (PROMPT_TOKENS_DRIFT, &DRIFT),
    ];
    layouts
        .into_iter()
        .try_fold(PrometheusBuilder::new(), |b, (name, buckets)| {
            b.set_buckets_for_metric(Matcher::Full(name.into()), buckets)
        })
        .expect("static bucket lists are non-empty")
}

fn describe(r: &PrometheusRecorder) {
    let counter = |n: &'static str, d: &'static str| r.describe_counter(KeyName::from(n), None, SharedString::from(d));
    let gauge = |n: &'static str, d: &'static str| r.describe_gauge(KeyName::from(n), None, SharedString::from(d));
    let histogram = |n: &'static str, u: Option<Unit>, d: &'static str| {
        r.describe_histogram(KeyName::from(n), u, SharedString::from(d))
    };
    counter(REQUESTS_TOTAL, "Proxied requests by route and HTTP status (stream_error: body cut after the status).");
    counter(REJECTED_TOTAL, "Requests refused before routing, by error code.");
    counter(POOL_REQUESTS_TOTAL, "Requests routed to each pool by their model.");
    gauge(WORKER_INFO, "1 per worker: the pool it serves, its engine and its role.");
    counter(MM_FALLBACK_TOTAL, "Requests with media that fell back to text-prefix routing, by reason.");
    counter(DISAGG_LEGS_TOTAL, "Legs of disaggregated requests, by leg and outcome (served, failed, skipped).");
    counter(
        DISAGG_FALLBACK_TOTAL,
        "Disaggregated legs failed or skipped (the request took a smaller path), by reason.",
    );
    histogram(DISAGG_LEG_DURATION_SECONDS, Some(Unit::Seconds), "Time of each disaggregated leg as the router saw it.");
    counter(WORKER_LEGS_TOTAL, "Disaggregated legs sent to each worker, by leg.");
    counter(
        WORKER_ENGINE_KV_TRANSFER_TOKENS,
        "Prompt tokens the engine received over its KV connector (its own count), per worker.",
    );
    counter(WORKER_ENGINE_KV_TRANSFERS, "The engine's NIXL transfers (its own count), per worker.");
    gauge(
        WORKER_ENGINE_KV_TRANSFER_SECONDS,
        "Seconds the engine's NIXL transfers took in all (its own sum), per worker.",
    );
    counter(PROMPT_UNRENDERED_TOTAL, "Chats without media the router could not render, routed by load, by reason.");
    histogram(IMAGE_TOKENS_PER_REQUEST, None, "Image tokens of exact-routed requests.");
    histogram(IMAGES_PER_REQUEST, None, "Images of exact-routed requests.");
    gauge(WORKER_INFLIGHT_IMAGE_TOKENS, "Image tokens in flight per worker (exact route only).");
    gauge(WORKER_INFLIGHT_REQUESTS, "Requests in flight per worker.");
    gauge(WORKER_INFLIGHT_PREFILL_TOKENS, "Uncached prompt tokens dispatched and not yet answered, per worker.");
    gauge(WORKER_IMAGES_RESIDENT, "Images the router's model says a worker's engine still holds outside its KV cache.");
    counter(
        WORKER_ENGINE_MM_CACHE_QUERIES,
        "The engine's processor-cache lookups (vllm:mm_cache_queries), per worker.",
    );
    counter(WORKER_ENGINE_MM_CACHE_HITS, "The engine's processor-cache hits (vllm:mm_cache_hits), per worker.");
    counter(
        WORKER_ENGINE_COUNTERS_REFUSED,
        "Readings of the engine's processor-cache counters refused as absurd, per worker and reason.",
    );
    counter(ADAPTER_LOADS_TOTAL, "Runtime LoRA adapter loads per worker, by outcome.");
    counter(ADAPTER_REQUESTS_TOTAL, "Requests naming a LoRA adapter, by adapter (the first 32 seen; then other).");
    gauge(WORKER_ADAPTERS, "LoRA adapters per worker: listed by its engine (served) or likely in its slots (active).");
    histogram(KV_OVERLAP_TOKENS, None, "Prompt tokens the chosen worker was predicted to hold.");
    histogram(STAGE_DURATION_SECONDS, Some(Unit::Seconds), "Time spent per pipeline stage.");
    histogram(IMAGE_PROBE_DURATION_SECONDS, Some(Unit::Seconds), "Time to read and probe one image.");
    histogram(PROMPT_TOKENS_DRIFT, None, "Worker-reported minus predicted prompt tokens.");
    gauge(INDEX_BLOCKS, "Block keys held by the routing index.");
    counter(UPSTREAM_REQUESTS_TOTAL, "Upstream attempts by worker and status.");
    counter(RESPONSES_PINNED_TOTAL, "Responses requests pinned to the worker that stored the response, by outcome.");
    counter(RESPONSES_LEARNT_TOTAL, "Stored response ids learnt, by source: worker, peer.");
    counter(UPSTREAM_RETRIES_TOTAL, "Upstream attempts tried again on the next candidate, by reason.");
    counter(RETRY_BUDGET_EXHAUSTED_TOTAL, "Retries refused because the retry budget was used up.");
    counter(TRACE_SPANS_EXPORTED_TOTAL, "Trace spans delivered to the OTLP collector.");
    counter(TRACE_SPANS_DROPPED_TOTAL, "Trace spans not delivered, by reason: queue_full, export_failed.");
    counter(WORKER_EJECTIONS_TOTAL, "Passive ejections of a worker after failures.");
    gauge(WORKER_STATE, "1 for the worker's current state: healthy, ejected, half_open or down.");
    counter(STREAM_ERRORS_TOTAL, "Response bodies cut after the status was sent, by route and reason.");
    gauge(INDEX_BLOCKS_BY_SOURCE, "(block, worker) index entries by source: events, pending, approximate.");
    counter(KV_EVENTS_TOTAL, "Blocks in a worker's KV events, by what the router made of them.");
    counter(KV_EVENT_BATCHES_TOTAL, "KV-event batches received per worker.");
    counter(KV_EVENT_MALFORMED_TOTAL, "KV-event frames that could not be decoded and were skipped.");
    counter(
        KV_EVENT_REFUSED_TOTAL,
        "Input refused from a worker's KV-event publisher, events or discovery document, by reason.",
    );
    counter(
        KV_EVENT_SEQUENCE_TOTAL,
        "KV-event sequence problems per worker: gap, replay, replay_failure, resync, restart.",
    );
    gauge(KV_EVENT_CONNECTED, "1 while every rank of a worker's KV-event subscription is connected.");
    histogram(KV_EVENT_LAG_SECONDS, Some(Unit::Seconds), "Receive time minus the engine's batch timestamp.");
    gauge(CONNECTIONS_OPEN, "Client connections open.");
    gauge(INFLIGHT_REQUESTS, "Client requests in flight (server.max_inflight_requests caps them).");
    counter(PICKER_DECISIONS_TOTAL, "Endpoint-picker decisions, by outcome: picked, unavailable, shed, rejected.");
    counter(SHED_TOTAL, "Connections or requests refused with a 503 for load, by reason: connections, inflight.");
    counter(CLIENT_TIMEOUTS_TOTAL, "Client connections cut by a timeout, by kind: header, body, idle, drain.");
    counter(AUTH_FAILURES_TOTAL, "Requests refused for a missing or wrong key, by scope: client, admin.");
    gauge(CLUSTER_PEERS, "Other router replicas heard from within cluster.booking_ttl_ms.");
    gauge(CLUSTER_NATS_CONNECTED, "1 while this replica's NATS connection is up.");
    counter(CLUSTER_NATS_EVENTS_TOTAL, "NATS connection events: connected, disconnected.");
    counter(CLUSTER_BOOKINGS_TOTAL, "Cluster bookings by event: sent, applied, expired, reconciled.");
    gauge(CLUSTER_REMOTE_BOOKINGS, "Other replicas' bookings held as remote load now.");
    counter(CLUSTER_DISPATCHES_TOTAL, "Dispatch records (pending or approximate blocks) sent and applied.");
    counter(CLUSTER_MESSAGES_DROPPED_TOTAL, "Cluster messages not sent or not applied, by reason.");
    counter(CLUSTER_MESSAGES_REFUSED_TOTAL, "Other replicas' messages refused by their checks or quotas, by reason.");
    gauge(CLUSTER_BOOTSTRAP, "1 for the bootstrap's state: pending, complete, incomplete.");
    histogram(
        CLUSTER_BOOKING_DELAY_SECONDS,
        Some(Unit::Seconds),
        "Another replica's booking: applied here minus sent there (the race window; host clocks).",
    );
    gauge(CLUSTER_BOOTSTRAP_STATE_AGE_SECONDS, "How far behind the engines the bootstrapped state was at ready.");
    gauge(CLUSTER_BOOTSTRAP_DURATION_SECONDS, "Seconds from start to the end of the bootstrap.");
    counter(CLUSTER_SNAPSHOT_BYTES_TOTAL, "Index snapshot bytes sent to and received from peer replicas.");
    counter(CLUSTER_SNAPSHOT_FAILURES_TOTAL, "Snapshot fetches from a peer that failed, by reason.");
    counter(CLUSTER_RESUME_FALLBACKS_TOTAL, "Grafted resume points the engine refuted, by reason.");
    counter(DNS_RESOLUTIONS_TOTAL, "Resolutions of each DNS worker entry, by outcome.");
    gauge(DNS_WORKERS, "Workers each DNS worker entry has in its pool.");
}
