//! The counters one simulated worker keeps since it started, as a plain snapshot for tests and tools.

/// Counters of one simulated worker since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Completion requests received (any outcome).
    pub requests: u64,
    /// Prompt tokens of requests admitted to the cache (vLLM's prefix-cache queries).
    pub prompt_tokens: u64,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u64,
    /// Output tokens produced.
    pub generation_tokens: u64,
    /// Completion requests accepted and not yet finished (waiting or running).
    pub in_flight: u64,
    /// Requests whose client went away before the answer ended.
    pub cancelled: u64,
    /// Requests answered 500 by `--error-rate`.
    pub errors_injected: u64,
    /// Streams cut by `--drop-mid-stream-rate`.
    pub streams_dropped: u64,
    /// Images looked up in the processor cache (`vllm:mm_cache_queries`; none while it is disabled).
    pub mm_cache_queries: u64,
    /// Of those, hits (`vllm:mm_cache_hits`).
    pub mm_cache_hits: u64,
    /// Images looked up in the encoder cache (those not inside the cached prefix).
    pub encoder_cache_queries: u64,
    /// Of those, hits.
    pub encoder_cache_hits: u64,
    /// Image tokens preprocessed (processor-cache misses).
    pub image_preprocessed_tokens: u64,
    /// Encoder tokens the simulated vision encoder computed.
    pub image_encoded_tokens: u64,
    /// Prompt tokens a decode leg pulled from its prefill engine (`external_kv_transfer`).
    pub external_kv_tokens: u64,
    /// Decode legs that pulled KV.
    pub kv_transfers: u64,
    /// Images whose encoder output was loaded from `--ec-shared-storage` instead of encoded.
    pub ec_loads: u64,
    /// Files an encode sim wrote to `--ec-shared-storage`.
    pub ec_stores: u64,
    /// KV-event batches given a seq (published, dropped on purpose or not).
    pub kv_batches: u64,
    /// Of those, batches not published by `--kv-events-drop-rate`.
    pub kv_batches_dropped: u64,
    /// Of those, batches not published because the publisher fell behind (its queue was full).
    pub kv_batches_overflowed: u64,
}
