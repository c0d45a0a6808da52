//! The simulator's own `/metrics`: vLLM's metric names and label (`model_name`, plus `engine="0"` as
//! vLLM ≥ 0.11 adds) in Prometheus text format, written by hand because these are vLLM's names, not
//! mmrouter's (the router's own metric names live in its `observe` module and must not carry them).
//!
//! The names are declared here once; they would move to a shared place if the router ever scrapes
//! workers.

use std::fmt::Write as _;

use crate::mm_cache::ImageCounts;

/// Gauge: requests generating.
pub const VLLM_NUM_REQUESTS_RUNNING: &str = "vllm:num_requests_running";
/// Gauge: requests queued behind `--max-running`.
pub const VLLM_NUM_REQUESTS_WAITING: &str = "vllm:num_requests_waiting";
/// Gauge 0..1: KV blocks pinned by running requests / capacity.
pub const VLLM_KV_CACHE_USAGE_PERC: &str = "vllm:kv_cache_usage_perc";
/// Counter (tokens): prompt tokens looked up in the prefix cache.
pub const VLLM_PREFIX_CACHE_QUERIES_TOTAL: &str = "vllm:prefix_cache_queries_total";
/// Counter (tokens): prompt tokens found in the prefix cache.
pub const VLLM_PREFIX_CACHE_HITS_TOTAL: &str = "vllm:prefix_cache_hits_total";
/// Counter: prompt tokens processed.
pub const VLLM_PROMPT_TOKENS_TOTAL: &str = "vllm:prompt_tokens_total";
/// Counter: output tokens produced.
pub const VLLM_GENERATION_TOKENS_TOTAL: &str = "vllm:generation_tokens_total";
/// Info gauge (value 1): cache configuration as labels, like vLLM's.
pub const VLLM_CACHE_CONFIG_INFO: &str = "vllm:cache_config_info";
/// Counter (items): images looked up in the processor cache (vLLM's `vllm:mm_cache_queries`).
pub const VLLM_MM_CACHE_QUERIES_TOTAL: &str = "vllm:mm_cache_queries_total";
/// Counter (items): images found in the processor cache (vLLM's `vllm:mm_cache_hits`).
pub const VLLM_MM_CACHE_HITS_TOTAL: &str = "vllm:mm_cache_hits_total";
/// Counter: requests whose client went away before the answer ended (simulator only).
pub const SIM_REQUESTS_CANCELLED_TOTAL: &str = "sim_requests_cancelled_total";
/// Counter (items): images looked up in the encoder cache (simulator only; vLLM exports none).
pub const SIM_ENCODER_CACHE_QUERIES_TOTAL: &str = "sim_encoder_cache_queries_total";
/// Counter (items): images found in the encoder cache (simulator only).
pub const SIM_ENCODER_CACHE_HITS_TOTAL: &str = "sim_encoder_cache_hits_total";
/// Counter (tokens): image tokens preprocessed, i.e. processor-cache misses (simulator only).
pub const SIM_IMAGE_PREPROCESSED_TOKENS_TOTAL: &str = "sim_image_preprocessed_tokens_total";
/// Counter (tokens): encoder tokens the vision encoder computed (simulator only).
pub const SIM_IMAGE_ENCODED_TOKENS_TOTAL: &str = "sim_image_encoded_tokens_total";
/// Gauge (bytes): processed images held by the processor cache (simulator only).
pub const SIM_MM_PROCESSOR_CACHE_BYTES: &str = "sim_mm_processor_cache_bytes";
/// Gauge (tokens): encoder outputs held by the encoder cache (simulator only).
pub const SIM_ENCODER_CACHE_TOKENS: &str = "sim_encoder_cache_tokens";
/// Counter (tokens) by `source`: vLLM ≥ 0.11's split of prompt tokens into `local_compute`,
/// `local_cache_hit` and `external_kv_transfer` (pulled from a prefill engine by a KV connector).
pub const VLLM_PROMPT_TOKENS_BY_SOURCE_TOTAL: &str = "vllm:prompt_tokens_by_source_total";
/// Counter: decode legs that pulled their prompt's KV from a prefill engine (simulator only).
pub const SIM_KV_TRANSFERS_TOTAL: &str = "sim_kv_transfers_total";
/// Counter (items): encoder outputs loaded from `--ec-shared-storage` instead of encoded (simulator only).
pub const SIM_EC_LOADS_TOTAL: &str = "sim_ec_loads_total";
/// Counter (items): encoder outputs an encode sim wrote to `--ec-shared-storage` (simulator only).
pub const SIM_EC_STORES_TOTAL: &str = "sim_ec_stores_total";
/// Info gauge (value 1): the sim's `--role` as a label (simulator only).
pub const SIM_ROLE_INFO: &str = "sim_role_info";

/// Everything `/metrics` shows, read once per scrape.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Snapshot {
    pub model: String,
    pub block_size: usize,
    pub kv_blocks: usize,
    pub running: u64,
    pub waiting: u64,
    pub kv_usage: f64,
    pub queries: u64,
    pub hits: u64,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub cancelled: u64,
    /// `--role`.
    pub role: &'static str,
    /// Prompt tokens pulled from prefill engines.
    pub external_tokens: u64,
    pub kv_transfers: u64,
    pub ec_stores: u64,
    pub images: ImageCounts,
    pub processor_cache_bytes: u64,
    pub encoder_cache_tokens: u64,
}

/// Renders the snapshot in Prometheus text format 0.0.4.
pub(crate) fn render(s: &Snapshot) -> String {
    let labels = format!("model_name=\"{}\",engine=\"0\"", escape(&s.model));
    let mut out = String::with_capacity(2048);
    let mut metric = |name: &str, kind: &str, help: &str, labels: &str, value: String| {
        // Writing to a String cannot fail.
        let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{labels}}} {value}\n");
    };
    metric(
        VLLM_NUM_REQUESTS_RUNNING,
        "gauge",
        "Number of requests in model execution batches.",
        &labels,
        s.running.to_string(),
    );
    metric(
        VLLM_NUM_REQUESTS_WAITING,
        "gauge",
        "Number of requests waiting to be processed.",
        &labels,
        s.waiting.to_string(),
    );
    metric(VLLM_KV_CACHE_USAGE_PERC, "gauge", "KV-cache usage. 1 means 100 percent usage.", &labels, float(s.kv_usage));
    metric(
        VLLM_PREFIX_CACHE_QUERIES_TOTAL,
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
        &labels,
        s.queries.to_string(),
    );
    metric(
        VLLM_PREFIX_CACHE_HITS_TOTAL,
        "counter",
        "Prefix cache hits, in terms of number of cached tokens.",
        &labels,
        s.hits.to_string(),
    );
    metric(
        VLLM_PROMPT_TOKENS_TOTAL,
        "counter",
        "Number of prefill tokens processed.",
        &labels,
        s.prompt_tokens.to_string(),
    );
    metric(
        VLLM_GENERATION_TOKENS_TOTAL,
        "counter",
        "Number of generation tokens processed.",
        &labels,
        s.generation_tokens.to_string(),
    );
    let info = format!(
        "{labels},block_size=\"{}\",num_gpu_blocks=\"{}\",enable_prefix_caching=\"True\"",
        s.block_size, s.kv_blocks
    );
    metric(VLLM_CACHE_CONFIG_INFO, "gauge", "Information of the KV cache configuration.", &info, "1".to_owned());
    let mm = &s.images;
    metric(
        VLLM_MM_CACHE_QUERIES_TOTAL,
        "counter",
        "Multi-modal cache queries, in terms of number of queried items.",
        &labels,
        mm.processor_queries.to_string(),
    );
    metric(
        VLLM_MM_CACHE_HITS_TOTAL,
        "counter",
        "Multi-modal cache hits, in terms of number of cached items.",
        &labels,
        mm.processor_hits.to_string(),
    );
    metric(
        SIM_REQUESTS_CANCELLED_TOTAL,
        "counter",
        "Requests whose client disconnected before the answer ended.",
        &labels,
        s.cancelled.to_string(),
    );
    render_sim_images(s, &labels, &mut metric);
    render_disaggregated(s, &labels, &mut out);
    out
}

/// The prompt tokens by source (one family, three series) and the disaggregated legs' counters.
fn render_disaggregated(s: &Snapshot, labels: &str, out: &mut String) {
    let local_compute = s.prompt_tokens.saturating_sub(s.hits).saturating_sub(s.external_tokens);
    let name = VLLM_PROMPT_TOKENS_BY_SOURCE_TOTAL;
    let _ = write!(out, "# HELP {name} Number of prompt tokens by source.\n# TYPE {name} counter\n");
    for (source, value) in
        [("local_compute", local_compute), ("local_cache_hit", s.hits), ("external_kv_transfer", s.external_tokens)]
    {
        let _ = writeln!(out, "{name}{{{labels},source=\"{source}\"}} {value}");
    }
    let series: [(&str, &str, u64); 3] = [
        (
            SIM_KV_TRANSFERS_TOTAL,
            "Decode requests that pulled their prompt's KV from a prefill engine.",
            s.kv_transfers,
        ),
        (
            SIM_EC_LOADS_TOTAL,
            "Encoder outputs loaded from the EC shared storage instead of encoded.",
            s.images.ec_loads,
        ),
        (SIM_EC_STORES_TOTAL, "Encoder outputs written to the EC shared storage.", s.ec_stores),
    ];
    for (name, help, value) in series {
        let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{labels}}} {value}\n");
    }
    let name = SIM_ROLE_INFO;
    let _ = write!(
        out,
        "# HELP {name} The simulated engine's disaggregated-serving role.\n# TYPE {name} gauge\n{name}{{{labels},role=\"{}\"}} 1\n",
        s.role
    );
}

/// The simulator's own image-cache series (vLLM exports no encoder-cache metric).
fn render_sim_images(s: &Snapshot, labels: &str, metric: &mut impl FnMut(&str, &str, &str, &str, String)) {
    let mm = &s.images;
    let series: [(&str, &str, &str, u64); 6] = [
        (SIM_ENCODER_CACHE_QUERIES_TOTAL, "counter", "Encoder cache queries, in images.", mm.encoder_queries),
        (SIM_ENCODER_CACHE_HITS_TOTAL, "counter", "Encoder cache hits, in images.", mm.encoder_hits),
        (
            SIM_IMAGE_PREPROCESSED_TOKENS_TOTAL,
            "counter",
            "Image tokens preprocessed (processor cache misses).",
            mm.preprocessed_tokens,
        ),
        (
            SIM_IMAGE_ENCODED_TOKENS_TOTAL,
            "counter",
            "Encoder tokens computed by the vision encoder.",
            mm.encoded_tokens,
        ),
        (SIM_MM_PROCESSOR_CACHE_BYTES, "gauge", "Bytes held by the processor cache.", s.processor_cache_bytes),
        (SIM_ENCODER_CACHE_TOKENS, "gauge", "Encoder tokens held by the encoder cache.", s.encoder_cache_tokens),
    ];
    for (name, kind, help, value) in series {
        metric(name, kind, help, labels, value.to_string());
    }
}

fn float(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        "NaN".to_owned()
    }
}

/// Label-value escaping of the text format: backslash, double quote, newline.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sample_follows_help_and_type_and_escapes_labels() {
        let text = render(&Snapshot { model: "a\"b\\c".into(), kv_usage: 0.25, hits: 32, ..Default::default() });
        let lines: Vec<&str> = text.lines().collect();
        let families: Vec<&[&str]> = lines.split_inclusive(|l| !l.starts_with('#')).collect();
        let mut families = families.into_iter().peekable();
        while let Some(chunk) = families.next() {
            assert_eq!(chunk.len(), 3, "HELP, TYPE, a sample: {chunk:?}");
            let name = chunk[0].strip_prefix("# HELP ").and_then(|r| r.split(' ').next()).expect("help");
            assert!(chunk[1].starts_with(&format!("# TYPE {name} ")), "{chunk:?}");
            assert!(chunk[2].starts_with(&format!("{name}{{")), "{chunk:?}");
            // Further samples of the same family follow one per line.
            while families.peek().is_some_and(|next| next.len() == 1) {
                let sample = families.next().expect("peeked")[0];
                assert!(sample.starts_with(&format!("{name}{{")), "{sample} after {name}");
            }
        }
        assert!(text.contains("vllm:kv_cache_usage_perc{model_name=\"a\\\"b\\\\c\",engine=\"0\"} 0.25\n"), "{text}");
        assert!(text.contains("vllm:prefix_cache_hits_total{model_name=\"a\\\"b\\\\c\",engine=\"0\"} 32\n"));
    }

    #[test]
    fn prompt_tokens_split_by_source() {
        let s = Snapshot {
            model: "m".into(),
            prompt_tokens: 100,
            hits: 32,
            external_tokens: 60,
            role: "decode",
            ..Default::default()
        };
        let text = render(&s);
        for (source, value) in [("local_compute", 8), ("local_cache_hit", 32), ("external_kv_transfer", 60)] {
            let line = format!(
                "vllm:prompt_tokens_by_source_total{{model_name=\"m\",engine=\"0\",source=\"{source}\"}} {value}\n"
            );
            assert!(text.contains(&line), "{line} in {text}");
        }
        assert!(text.contains("sim_role_info{model_name=\"m\",engine=\"0\",role=\"decode\"} 1\n"), "{text}");
    }
}
