//! Every metric name mmrouter exports, in one place (a dashboard contract: see the design's table),
//! plus the recorder set-up and the `/metrics` renderer.
//!
//! Other modules record through the `metrics` facade using these constants only, so a rename is
//! one edit here and a grep shows every use.

/// Counter `{route, status}`: every proxied request.
pub const REQUESTS_TOTAL: &str = "mmrouter_requests_total";
/// Counter `{reason}`: a request with media fell back to text-prefix routing.
pub const MM_FALLBACK_TOTAL: &str = "mmrouter_mm_fallback_total";
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

/// `stage` label values of [`STAGE_DURATION_SECONDS`], in pipeline order.
pub mod stage {
    pub const INTAKE: &str = "intake";
    pub const ACCOUNT: &str = "account";
    pub const PLAN: &str = "plan";
    pub const SELECT: &str = "select";
    pub const FORWARD_TTFB: &str = "forward_ttfb";
}

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Installs the process-wide Prometheus recorder once and returns its handle (embedded proxies in
/// tests and the demo share it).
pub fn install() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let seconds = [
                0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                2.5, 5.0, 10.0, 30.0, 60.0,
            ];
            let tokens =
                [16.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0, 65536.0, 131072.0];
            let counts = [0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0];
            let drift = [-1024.0, -256.0, -64.0, -16.0, -4.0, -1.0, -0.5, 0.5, 1.0, 4.0, 16.0, 64.0, 256.0, 1024.0];
            let builder = PrometheusBuilder::new();
            let builder = [STAGE_DURATION_SECONDS, IMAGE_PROBE_DURATION_SECONDS]
                .into_iter()
                .try_fold(builder, |b, n| b.set_buckets_for_metric(Matcher::Full(n.into()), &seconds))
                .and_then(|b| {
                    [IMAGE_TOKENS_PER_REQUEST, KV_OVERLAP_TOKENS]
                        .into_iter()
                        .try_fold(b, |b, n| b.set_buckets_for_metric(Matcher::Full(n.into()), &tokens))
                })
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full(IMAGES_PER_REQUEST.into()), &counts))
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full(PROMPT_TOKENS_DRIFT.into()), &drift))
                .expect("static bucket lists are non-empty");
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            // Another recorder may already be installed (e.g. a test harness); ours still renders.
            let _ = metrics::set_global_recorder(recorder);
            describe();
            handle
        })
        .clone()
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(REQUESTS_TOTAL, "Proxied requests by route and HTTP status.");
    describe_counter!(MM_FALLBACK_TOTAL, "Requests with media that fell back to text-prefix routing, by reason.");
    describe_histogram!(IMAGE_TOKENS_PER_REQUEST, "Image tokens of exact-routed requests.");
    describe_histogram!(IMAGES_PER_REQUEST, "Images of exact-routed requests.");
    describe_gauge!(WORKER_INFLIGHT_IMAGE_TOKENS, "Image tokens in flight per worker (exact route only).");
    describe_gauge!(WORKER_INFLIGHT_REQUESTS, "Requests in flight per worker.");
    describe_gauge!(
        WORKER_INFLIGHT_PREFILL_TOKENS,
        "Uncached prompt tokens dispatched and not yet answered, per worker."
    );
    describe_histogram!(KV_OVERLAP_TOKENS, "Prompt tokens the chosen worker was predicted to hold.");
    describe_histogram!(STAGE_DURATION_SECONDS, Unit::Seconds, "Time spent per pipeline stage.");
    describe_histogram!(IMAGE_PROBE_DURATION_SECONDS, Unit::Seconds, "Time to read and probe one image.");
    describe_histogram!(PROMPT_TOKENS_DRIFT, "Worker-reported minus predicted prompt tokens.");
    describe_gauge!(INDEX_BLOCKS, "Block keys held by the routing index.");
    describe_counter!(UPSTREAM_REQUESTS_TOTAL, "Upstream attempts by worker and status.");
}

/// Records one stage's duration.
pub fn stage(name: &'static str, d: Duration) {
    metrics::histogram!(STAGE_DURATION_SECONDS, "stage" => name).record(d.as_secs_f64());
}
