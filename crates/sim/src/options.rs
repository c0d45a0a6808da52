//! The options of one simulated worker (`mmrouter sim …`): the clap arguments, their defaults (equal to
//! [`SimOptions::default`]) and the check that refuses options the simulator cannot honour.

use crate::error::SimError;

/// Default served model name.
pub const DEFAULT_MODEL: &str = "Qwen/Qwen3-VL-8B-Instruct";
const DEFAULT_HOST: &str = "127.0.0.1";
const DEFAULT_NAME: &str = "sim-0";
const DEFAULT_BLOCK_SIZE: usize = 16;
const DEFAULT_KV_BLOCKS: usize = 4096;
const DEFAULT_MAX_RUNNING: usize = 256;
const DEFAULT_TTFT_BASE_MS: u64 = 5;
const DEFAULT_PREFILL_US_PER_TOKEN: u64 = 20;
const DEFAULT_DECODE_MS_PER_TOKEN: u64 = 2;
const DEFAULT_OUTPUT_TOKENS: u32 = 16;
const DEFAULT_MAX_OUTPUT_TOKENS: u32 = 4096;
const DEFAULT_MAX_BODY_BYTES: usize = 64 * 1024 * 1024;
/// vLLM's and SGLang's default replay ring (`buffer_steps`).
const DEFAULT_KV_EVENTS_BUFFER: usize = 10_000;
/// vLLM's `--mm-processor-cache-gb` default.
const DEFAULT_MM_PROCESSOR_CACHE_GB: f64 = 4.0;
/// Largest `--mm-processor-cache-gb` accepted: far beyond any host, small enough to count in bytes.
const MAX_MM_PROCESSOR_CACHE_GB: f64 = 1024.0;
/// vLLM sizes its encoder cache max(max_num_batched_tokens, the largest item); 16384 is Qwen3-VL's
/// largest image and at least the usual batch budget.
const DEFAULT_ENCODER_CACHE_TOKENS: u32 = 16_384;
/// Assumed per-token cost of vLLM's processor (decode, resize, normalise, patchify: CPU work). HF's
/// fast (torchvision) Qwen-VL processor handles a ~1 MP photo (≈1000 tokens) in a few milliseconds;
/// the slow PIL one several times that. An assumption to tune, not a measurement.
const DEFAULT_IMAGE_PREPROCESS_US_PER_TOKEN: u64 = 5;
/// Assumed per-token cost of the vision encoder: a 7–8B VLM's ViT (≈0.6B parameters, 4 patches per
/// output token) costs roughly a third to a half of the LLM's prefill per token, so half of the
/// default `--prefill-us-per-token` (20). An assumption to tune, not a measurement.
const DEFAULT_IMAGE_ENCODE_US_PER_TOKEN: u64 = 10;
/// Assumed cost of pulling one prompt token's KV from a prefill engine (NIXL over RDMA). A 7–8B model
/// holds ~128 KiB of KV per token (bf16, GQA); at the ~50 GB/s of one 400 Gb/s NIC that is ~2.5 µs, so
/// a tenth of the 20 µs/token prefill default. An assumption to tune, not a measurement.
const DEFAULT_TRANSFER_US_PER_TOKEN: u64 = 2;
/// SGLang's decode waits this long for its prefill's bootstrap before it fails the request.
const DEFAULT_BOOTSTRAP_TIMEOUT_MS: u64 = 30_000;
/// vLLM's `max_model_len` for the default model: Qwen3-VL's `max_position_embeddings`.
const DEFAULT_MAX_MODEL_LEN: u32 = 262_144;

/// Wire shape of the published KV events.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvEventsFormat {
    /// vLLM 0.23: positional arrays (12-element `BlockStored`, 4-element `BlockRemoved`).
    VllmArray,
    /// vLLM ≥ 0.24: tagged maps (`"type"`), default-valued fields omitted.
    #[default]
    VllmMap,
    /// SGLang 0.5.19: positional arrays, i64 hashes, images as pad token ids, no extra keys.
    Sglang,
}

/// What a simulated engine does with a request (disaggregated serving, docs/disaggregated.md).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Role {
    /// Whole requests (aggregated serving).
    #[default]
    Both,
    /// Prefills and hands its KV over: vLLM's `do_remote_decode` leg, SGLang's prefill leg.
    Prefill,
    /// Pulls the prefill's KV, then decodes: vLLM's `do_remote_prefill` leg, SGLang's decode leg.
    Decode,
    /// Runs the vision encoder only (vLLM E/PD's encoder, ECExampleConnector producer).
    Encode,
}

impl Role {
    /// The role's name, as `--role` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Both => "both",
            Self::Prefill => "prefill",
            Self::Decode => "decode",
            Self::Encode => "encode",
        }
    }
}

/// Options of one simulated worker (`mmrouter sim …`). [`Default`] equals the CLI defaults.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct SimOptions {
    /// Port to listen on (0 = ephemeral).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Address to listen on.
    #[arg(long, default_value = DEFAULT_HOST)]
    pub host: String,
    /// Worker name, sent back in `x-sim-worker`.
    #[arg(long, default_value = DEFAULT_NAME)]
    pub name: String,
    /// Served model name (`/v1/models`, metrics label).
    #[arg(long, default_value = DEFAULT_MODEL)]
    pub model: String,
    /// LoRA adapters served beside the model (repeatable), as vLLM's `--lora-modules NAME=PATH` names
    /// them: listed in `/v1/models` with the model as `parent`, and a request naming one is keyed
    /// with the adapter's name, as vLLM keys it.
    #[arg(long = "lora-modules", value_name = "NAME")]
    pub lora_modules: Vec<String>,
    /// KV block size in tokens.
    #[arg(long, default_value_t = DEFAULT_BLOCK_SIZE)]
    pub block_size: usize,
    /// KV cache capacity in blocks (0 disables prefix caching).
    #[arg(long, default_value_t = DEFAULT_KV_BLOCKS)]
    pub kv_blocks: usize,
    /// Requests generating at once; more wait (`vllm:num_requests_waiting`).
    #[arg(long, default_value_t = DEFAULT_MAX_RUNNING)]
    pub max_running: usize,
    /// Fixed part of the time to first token, in milliseconds.
    #[arg(long, default_value_t = DEFAULT_TTFT_BASE_MS)]
    pub ttft_base_ms: u64,
    /// Prefill cost per uncached prompt token, in microseconds.
    #[arg(long, default_value_t = DEFAULT_PREFILL_US_PER_TOKEN)]
    pub prefill_us_per_token: u64,
    /// Delay between output tokens, in milliseconds.
    #[arg(long, default_value_t = DEFAULT_DECODE_MS_PER_TOKEN)]
    pub decode_ms_per_token: u64,
    /// Concurrent prefills share one compute budget, as on a GPU: a prompt's prefill (and its image
    /// encoding) starts after the work admitted before it (`false`: every prefill runs as if alone).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub prefill_contention: bool,
    /// Image preprocessing (decode, resize, patchify: CPU) per image token, in microseconds; skipped
    /// on a processor-cache hit. Not queued on the GPU. 0: free.
    #[arg(long, default_value_t = DEFAULT_IMAGE_PREPROCESS_US_PER_TOKEN)]
    pub image_preprocess_us_per_token: u64,
    /// Vision-encoder cost per image token, in microseconds (GPU: queued with prefills); skipped on an
    /// encoder-cache hit and for an image inside the cached prefix. 0: free.
    #[arg(long, default_value_t = DEFAULT_IMAGE_ENCODE_US_PER_TOKEN)]
    pub image_encode_us_per_token: u64,
    /// vLLM's processor cache, in GiB: an LRU of processed images by identity (uuid or content hash),
    /// each sized as its pixel tensor (0 disables it, as in vLLM).
    #[arg(long, default_value_t = DEFAULT_MM_PROCESSOR_CACHE_GB)]
    pub mm_processor_cache_gb: f64,
    /// vLLM's encoder cache, in encoder tokens: an LRU of image encoder outputs by identity (0: none
    /// kept; an image larger than the cache is encoded and not kept).
    #[arg(long, default_value_t = DEFAULT_ENCODER_CACHE_TOKENS)]
    pub encoder_cache_tokens: u32,
    /// Output tokens when the request sets no `max_tokens` (finish_reason "stop").
    #[arg(long, default_value_t = DEFAULT_OUTPUT_TOKENS)]
    pub default_output_tokens: u32,
    /// Cap on output tokens per request.
    #[arg(long, default_value_t = DEFAULT_MAX_OUTPUT_TOKENS)]
    pub max_output_tokens: u32,
    /// Disaggregated-serving role: `both` (whole requests), `prefill`, `decode` or `encode`.
    #[arg(long, value_enum, default_value_t = Role::Both)]
    pub role: Role,
    /// Cost of pulling one prompt token's KV from a prefill engine (decode role), in microseconds.
    #[arg(long, default_value_t = DEFAULT_TRANSFER_US_PER_TOKEN)]
    pub transfer_us_per_token: u64,
    /// ECExampleConnector's shared storage: an encode sim writes one file per image there; any other
    /// role skips the vision encoder for an image whose file exists.
    #[arg(long)]
    pub ec_shared_storage: Option<std::path::PathBuf>,
    /// SGLang prefill: serve the bootstrap endpoint on this port (0 = ephemeral). Prefill role only.
    #[arg(long)]
    pub bootstrap_port: Option<u16>,
    /// SGLang decode: how long to wait for the prefill's bootstrap before answering 500.
    #[arg(long, default_value_t = DEFAULT_BOOTSTRAP_TIMEOUT_MS)]
    pub bootstrap_timeout_ms: u64,
    /// Keep Responses-API answers (vLLM's `VLLM_ENABLE_RESPONSES_API_STORE=1`): `store` is honoured,
    /// `previous_response_id` and `GET /v1/responses/{id}` find them (the newest 10 000 within 256 MiB).
    /// Off, as in vLLM: `store` is ignored and every `previous_response_id` is 404.
    #[arg(long)]
    pub responses_store: bool,
    /// The context length the worker reports (`/tokenize`'s `max_model_len`) and enforces on the
    /// Responses API (vLLM's `--max-model-len`; the default is Qwen3-VL's).
    #[arg(long, default_value_t = DEFAULT_MAX_MODEL_LEN)]
    pub max_model_len: u32,
    /// Fault: fraction (0..1) of completion requests answered with `--error-status` (500 by default).
    #[arg(long, default_value_t = 0.0)]
    pub error_rate: f64,
    /// Fault: the HTTP status of `--error-rate` answers (5xx, or 429 to simulate rate limiting).
    #[arg(long, default_value_t = 500)]
    pub error_status: u16,
    /// Fault: a `retry-after` header (seconds) on `--error-rate` answers.
    #[arg(long)]
    pub error_retry_after_secs: Option<u64>,
    /// Fault: streamed answers send this many tokens, then stall (send nothing, keep the connection
    /// open) until the client goes away or the sim shuts down.
    #[arg(long)]
    pub stall_after_tokens: Option<u32>,
    /// Fault: milliseconds added before the first byte of every completion response.
    #[arg(long, default_value_t = 0)]
    pub extra_delay_ms: u64,
    /// Fault: fraction (0..1) of streams cut after half their tokens.
    #[arg(long, default_value_t = 0.0)]
    pub drop_mid_stream_rate: f64,
    /// Fault: added to the reported `usage.prompt_tokens` (may be negative).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub usage_drift: i64,
    /// Seed of the fault dice.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Bundled profile name or HF model directory of the exact prompter (default: qwen3-vl).
    #[arg(long)]
    pub model_dir: Option<String>,
    /// Largest request body accepted, in bytes.
    #[arg(long, default_value_t = DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Address ranges the simulator may fetch image URLs from (repeatable). Loopback only by default,
    /// so nothing a test forwards to a sim can make it contact another machine.
    #[arg(long = "fetch-allow-cidr", default_values_t = default_fetch_cidrs())]
    pub fetch_allow_cidrs: Vec<String>,
    /// Host names the simulator may fetch image URLs from whatever they resolve to (repeatable).
    #[arg(long = "fetch-allow-host", default_values_t = default_fetch_hosts())]
    pub fetch_allow_hosts: Vec<String>,
    /// Publish KV-cache events on a ZMQ PUB bound here, e.g. `tcp://127.0.0.1:5557` (port 0 =
    /// ephemeral). Absent: no events.
    #[arg(long)]
    pub kv_events: Option<String>,
    /// Bind the replay ROUTER here (answers `[b"", start seq]` with the buffered batches). Needs
    /// `--kv-events`.
    #[arg(long)]
    pub kv_events_replay: Option<String>,
    /// Batches the replay ring keeps.
    #[arg(long, default_value_t = DEFAULT_KV_EVENTS_BUFFER)]
    pub kv_events_buffer: usize,
    /// First frame of every event message.
    #[arg(long, default_value = "")]
    pub kv_events_topic: String,
    /// Wire shape of the events.
    #[arg(long, value_enum, default_value_t = KvEventsFormat::VllmMap)]
    pub kv_events_format: KvEventsFormat,
    /// Fault: fraction (0..1) of event batches whose seq is used but that are never published (they
    /// stay in the replay ring, as batches a real PUB dropped at its high-water mark).
    #[arg(long, default_value_t = 0.0)]
    pub kv_events_drop_rate: f64,
    /// Fault: milliseconds every event batch is published late.
    #[arg(long, default_value_t = 0)]
    pub kv_events_delay_ms: u64,
}

/// The simulator fetches image URLs from loopback only unless told otherwise.
pub fn default_fetch_cidrs() -> Vec<String> {
    vec!["127.0.0.0/8".to_owned(), "::1/128".to_owned()]
}

/// `localhost` names loopback image servers in test workloads.
pub fn default_fetch_hosts() -> Vec<String> {
    vec!["localhost".to_owned()]
}

impl Default for SimOptions {
    fn default() -> Self {
        Self {
            port: 0,
            host: DEFAULT_HOST.to_owned(),
            name: DEFAULT_NAME.to_owned(),
            model: DEFAULT_MODEL.to_owned(),
            lora_modules: Vec::new(),
            block_size: DEFAULT_BLOCK_SIZE,
            kv_blocks: DEFAULT_KV_BLOCKS,
            max_running: DEFAULT_MAX_RUNNING,
            ttft_base_ms: DEFAULT_TTFT_BASE_MS,
            prefill_us_per_token: DEFAULT_PREFILL_US_PER_TOKEN,
            decode_ms_per_token: DEFAULT_DECODE_MS_PER_TOKEN,
            prefill_contention: true,
            image_preprocess_us_per_token: DEFAULT_IMAGE_PREPROCESS_US_PER_TOKEN,
            image_encode_us_per_token: DEFAULT_IMAGE_ENCODE_US_PER_TOKEN,
            mm_processor_cache_gb: DEFAULT_MM_PROCESSOR_CACHE_GB,
            encoder_cache_tokens: DEFAULT_ENCODER_CACHE_TOKENS,
            default_output_tokens: DEFAULT_OUTPUT_TOKENS,
            max_output_tokens: DEFAULT_MAX_OUTPUT_TOKENS,
            role: Role::Both,
            transfer_us_per_token: DEFAULT_TRANSFER_US_PER_TOKEN,
            ec_shared_storage: None,
            bootstrap_port: None,
            bootstrap_timeout_ms: DEFAULT_BOOTSTRAP_TIMEOUT_MS,
            responses_store: false,
            max_model_len: DEFAULT_MAX_MODEL_LEN,
            error_rate: 0.0,
            error_status: 500,
            error_retry_after_secs: None,
            stall_after_tokens: None,
            extra_delay_ms: 0,
            drop_mid_stream_rate: 0.0,
            usage_drift: 0,
            seed: 0,
            model_dir: None,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            fetch_allow_cidrs: default_fetch_cidrs(),
            fetch_allow_hosts: default_fetch_hosts(),
            kv_events: None,
            kv_events_replay: None,
            kv_events_buffer: DEFAULT_KV_EVENTS_BUFFER,
            kv_events_topic: String::new(),
            kv_events_format: KvEventsFormat::VllmMap,
            kv_events_drop_rate: 0.0,
            kv_events_delay_ms: 0,
        }
    }
}

impl SimOptions {
    /// Rejects options the simulator cannot honour, naming the flag.
    pub fn validate(&self) -> Result<(), SimError> {
        let invalid = |flag: &'static str, reason: &str| SimError::InvalidOption { flag, reason: reason.to_owned() };
        if self.block_size == 0 {
            return Err(invalid("block-size", "must be at least 1"));
        }
        if self.max_running == 0 {
            return Err(invalid("max-running", "must be at least 1"));
        }
        if self.max_output_tokens == 0 {
            return Err(invalid("max-output-tokens", "must be at least 1"));
        }
        if self.default_output_tokens == 0 {
            return Err(invalid("default-output-tokens", "must be at least 1"));
        }
        let rates = [
            ("error-rate", self.error_rate),
            ("drop-mid-stream-rate", self.drop_mid_stream_rate),
            ("kv-events-drop-rate", self.kv_events_drop_rate),
        ];
        for (flag, rate) in rates {
            if !(0.0..=1.0).contains(&rate) {
                return Err(invalid(flag, "must be a fraction between 0 and 1"));
            }
        }
        if !(self.error_status == 429 || (500..=599).contains(&self.error_status)) {
            return Err(invalid("error-status", "must be 429 or a 5xx status"));
        }
        if axum::http::HeaderValue::from_str(&self.name).is_err() {
            return Err(invalid("name", "must be usable as an HTTP header value"));
        }
        if self.kv_events_replay.is_some() && self.kv_events.is_none() {
            return Err(invalid("kv-events-replay", "needs --kv-events"));
        }
        if self.kv_events_buffer == 0 {
            return Err(invalid("kv-events-buffer", "must be at least 1"));
        }
        if !(0.0..=MAX_MM_PROCESSOR_CACHE_GB).contains(&self.mm_processor_cache_gb) {
            return Err(invalid("mm-processor-cache-gb", "must be a number of GiB between 0 and 1024"));
        }
        if self.bootstrap_port.is_some() && self.role != Role::Prefill {
            return Err(invalid("bootstrap-port", "needs --role prefill"));
        }
        if self.max_model_len == 0 {
            return Err(invalid("max-model-len", "must be at least 1"));
        }
        if self.bootstrap_timeout_ms == 0 {
            return Err(invalid("bootstrap-timeout-ms", "must be at least 1"));
        }
        Ok(())
    }

    /// `--mm-processor-cache-gb` in bytes (GiB, as vLLM reads it).
    pub fn mm_processor_cache_bytes(&self) -> u64 {
        // Validated finite and within 0..=1024 GiB, so the product fits a u64.
        (self.mm_processor_cache_gb * f64::from(1u32 << 30)) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimOptions,
    }

    #[test]
    fn default_equals_cli_defaults() {
        let parsed = Cli::try_parse_from(["sim"]).expect("defaults parse");
        assert_eq!(parsed.sim, SimOptions::default());
    }

    #[test]
    fn cli_accepts_negative_drift_and_rates() {
        let parsed = Cli::try_parse_from(["sim", "--usage-drift", "-3", "--error-rate", "0.5", "--kv-blocks", "8"])
            .expect("parse");
        assert_eq!(parsed.sim.usage_drift, -3);
        assert_eq!(parsed.sim.error_rate, 0.5);
        assert_eq!(parsed.sim.kv_blocks, 8);
    }

    #[test]
    fn validate_names_the_flag() {
        let opts = SimOptions { error_rate: 1.5, ..SimOptions::default() };
        let err = opts.validate().expect_err("rate above 1");
        assert_eq!(err.label(), "invalid_option");
        assert!(err.to_string().contains("--error-rate"), "{err}");
        let opts = SimOptions { block_size: 0, ..SimOptions::default() };
        assert!(opts.validate().expect_err("zero block").to_string().contains("--block-size"));
        let opts = SimOptions { name: "bad\nname".into(), ..SimOptions::default() };
        assert!(opts.validate().expect_err("bad name").to_string().contains("--name"));
        assert!(SimOptions::default().validate().is_ok());
        let opts = SimOptions { kv_events_replay: Some("tcp://127.0.0.1:0".into()), ..SimOptions::default() };
        assert!(opts.validate().expect_err("replay alone").to_string().contains("--kv-events-replay"));
        let opts = SimOptions { kv_events_drop_rate: -0.1, ..SimOptions::default() };
        assert!(opts.validate().expect_err("negative rate").to_string().contains("--kv-events-drop-rate"));
        for gb in [-1.0, f64::NAN, f64::INFINITY, 2048.0] {
            let opts = SimOptions { mm_processor_cache_gb: gb, ..SimOptions::default() };
            assert!(opts.validate().expect_err("bad size").to_string().contains("--mm-processor-cache-gb"), "{gb}");
        }
    }

    #[test]
    fn cli_parses_image_cache_options() {
        let parsed = Cli::try_parse_from([
            "sim",
            "--mm-processor-cache-gb",
            "0.5",
            "--encoder-cache-tokens",
            "4096",
            "--image-preprocess-us-per-token",
            "0",
            "--image-encode-us-per-token",
            "7",
        ])
        .expect("parse");
        let sim = parsed.sim;
        assert_eq!((sim.mm_processor_cache_gb, sim.mm_processor_cache_bytes()), (0.5, 512 << 20));
        assert_eq!(
            (sim.encoder_cache_tokens, sim.image_preprocess_us_per_token, sim.image_encode_us_per_token),
            (4096, 0, 7)
        );
        assert_eq!(SimOptions::default().mm_processor_cache_bytes(), 4 << 30, "vLLM's default: 4 GiB");
        assert!(SimOptions { mm_processor_cache_gb: 0.0, ..SimOptions::default() }.validate().is_ok(), "0 disables it");
    }

    #[test]
    fn cli_parses_kv_event_options() {
        let parsed = Cli::try_parse_from([
            "sim",
            "--kv-events",
            "tcp://127.0.0.1:0",
            "--kv-events-replay",
            "tcp://127.0.0.1:0",
            "--kv-events-format",
            "sglang",
            "--kv-events-buffer",
            "5",
            "--kv-events-topic",
            "kv@sim",
            "--kv-events-drop-rate",
            "0.25",
            "--kv-events-delay-ms",
            "7",
            "--fetch-allow-host",
            "images.test",
        ])
        .expect("parse");
        let sim = parsed.sim;
        assert_eq!(sim.kv_events.as_deref(), Some("tcp://127.0.0.1:0"));
        assert_eq!(sim.kv_events_format, KvEventsFormat::Sglang);
        assert_eq!((sim.kv_events_buffer, sim.kv_events_topic.as_str()), (5, "kv@sim"));
        assert_eq!((sim.kv_events_drop_rate, sim.kv_events_delay_ms), (0.25, 7));
        assert_eq!(sim.fetch_allow_hosts, vec!["images.test".to_owned()]);
        let vllm = Cli::try_parse_from(["sim", "--kv-events-format", "vllm-array"]).expect("parse");
        assert_eq!(vllm.sim.kv_events_format, KvEventsFormat::VllmArray);
    }

    #[test]
    fn cli_parses_role_options() {
        let parsed = Cli::try_parse_from([
            "sim",
            "--role",
            "prefill",
            "--bootstrap-port",
            "0",
            "--transfer-us-per-token",
            "3",
            "--ec-shared-storage",
            "/tmp/ec",
            "--bootstrap-timeout-ms",
            "50",
        ])
        .expect("parse");
        let sim = parsed.sim;
        assert_eq!((sim.role, sim.bootstrap_port, sim.transfer_us_per_token), (Role::Prefill, Some(0), 3));
        assert_eq!((sim.ec_shared_storage.as_deref(), sim.bootstrap_timeout_ms), (Some("/tmp/ec".as_ref()), 50));
        assert!(sim.validate().is_ok());
        for role in ["both", "decode", "encode"] {
            let parsed = Cli::try_parse_from(["sim", "--role", role]).expect("parse");
            assert_eq!(parsed.sim.role.as_str(), role);
        }
        assert!(Cli::try_parse_from(["sim", "--role", "router"]).is_err());
        let opts = SimOptions { role: Role::Decode, bootstrap_port: Some(0), ..SimOptions::default() };
        assert!(opts.validate().expect_err("decode bootstrap").to_string().contains("--bootstrap-port"));
        let opts = SimOptions { bootstrap_timeout_ms: 0, ..SimOptions::default() };
        assert!(opts.validate().expect_err("zero timeout").to_string().contains("--bootstrap-timeout-ms"));
    }
}
