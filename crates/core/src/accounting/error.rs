//! Why an image could not be counted exactly.
//!
//! One variant per failure class; [`AccountingError::label`] is the stable snake_case value used as
//! the `reason` label of the fallback counter, so renaming a label is a dashboard change.

/// Everything that can stop an exact image-token count.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccountingError {
    /// Every reference divides by a side.
    #[error("image {width}x{height} has a zero side")]
    ZeroSize { width: u32, height: u32 },
    /// Qwen/GLM: `max(h, w) / min(h, w)` must not exceed the limit.
    #[error("image {width}x{height}: aspect ratio exceeds {limit} (the processor rejects it)")]
    AspectRatio { width: u32, height: u32, limit: u32 },
    /// The reference resizes a side to 0 px and fails (Phi-3-V HD transform, odd pixel budgets).
    #[error("image {width}x{height}: {detail}")]
    TooSmall { width: u32, height: u32, detail: &'static str },
    /// Kimi-VL: the padded patch grid reaches the position-embedding size.
    #[error("image {width}x{height}: patch grid {grid_h}x{grid_w} reaches the position-embedding limit {limit}")]
    PositionEmbeddingExceeded { width: u32, height: u32, grid_h: u64, grid_w: u64, limit: u64 },
    /// The size is outside what the reference computes exactly (e.g. a product beyond 2^53).
    #[error("image {width}x{height}: {detail}")]
    UnsupportedGeometry { width: u32, height: u32, detail: &'static str },
    /// The model is not one we can count, or the family cannot be detected.
    #[error("unsupported model: {detail}")]
    UnsupportedModel { detail: String },
    /// A model directory file could not be read or parsed.
    #[error("{file}: {detail}")]
    ConfigFile { file: String, detail: String },
    /// A required field is absent; never replaced by a processor-class default.
    #[error("{file}: missing required field `{field}`")]
    ConfigMissingField { file: &'static str, field: String },
    /// A field is present but has a value the counter cannot use.
    #[error("{file}: field `{field}` {detail}")]
    ConfigInvalidField { file: &'static str, field: String, detail: String },
    /// A server or request processor kwarg the counter does not model (or an invalid value for one).
    #[error("{source_name} `{key}`: {detail}")]
    ProcessorKwargs { source_name: &'static str, key: String, detail: String },
    /// Video for a family whose video processing the router does not model (or no video processor).
    #[error("video: {detail}")]
    VideoUnsupported { detail: String },
    /// A clip the engine refuses for having too few frames (vLLM 0.32: Qwen2.5-VL divides by zero on one
    /// frame, Qwen3-VL's resize needs two).
    #[error("a video of {frames} frame(s): the engine refuses it")]
    VideoTooShort { frames: u64 },
    /// A video setting of the engines' `--media-io-kwargs` (or a trusted request's `media_io_kwargs`) the
    /// router does not model.
    #[error("media_io_kwargs `{key}`: {detail}")]
    MediaIoKwargs { key: String, detail: String },
    /// Per-request `media_io_kwargs` / `mm_processor_kwargs` on a pool whose engines do not trust them:
    /// vLLM refuses the request (`--trust-request-mm-kwargs` off), whichever worker gets it.
    #[error(
        "request {key}: the pool's engines refuse per-request media kwargs (model.trust_request_mm_kwargs = false)"
    )]
    RequestMmKwargs { key: &'static str },
    /// Checked arithmetic overflowed.
    #[error("arithmetic overflow computing {what}")]
    Overflow { what: &'static str },
    /// The family budgets across the request and the context field is missing.
    #[error("{family} needs `{field}` of the request context")]
    NeedsRequestContext { family: &'static str, field: &'static str },
    /// Nemotron: `max_model_len - text_tokens - 4` is negative.
    #[error("no token budget left for images: max_model_len {max_model_len}, text tokens {text_tokens}")]
    BudgetUnderflow { max_model_len: u32, text_tokens: u32 },
    /// Mistral tokenizer mode: mistral_common sizes the image as stored, vLLM's processor as its EXIF
    /// orientation shows it, and the two runs differ: the worker fails the request.
    #[error("image {width}x{height}: its EXIF orientation transposes it and the two sizes give different runs")]
    ExifTransposed { width: u32, height: u32 },
    /// Nemotron: the request-wide budget did not settle within the reference's iteration limit.
    #[error("request-wide image budget did not converge in {iterations} iterations")]
    NoConvergence { iterations: u32 },
}

impl AccountingError {
    /// Stable snake_case reason label (`mmrouter_mm_fallback_total{reason}`).
    pub fn label(&self) -> &'static str {
        match self {
            AccountingError::ZeroSize { .. } => "zero_size",
            AccountingError::AspectRatio { .. } => "aspect_ratio",
            AccountingError::TooSmall { .. } => "too_small",
            AccountingError::PositionEmbeddingExceeded { .. } => "position_embedding_exceeded",
            AccountingError::UnsupportedGeometry { .. } => "unsupported_geometry",
            AccountingError::UnsupportedModel { .. } => "unsupported_model",
            AccountingError::ConfigFile { .. } => "config_file",
            AccountingError::ConfigMissingField { .. } => "config_missing_field",
            AccountingError::ConfigInvalidField { .. } => "config_invalid_field",
            AccountingError::ProcessorKwargs { .. } => "processor_kwargs",
            AccountingError::VideoUnsupported { .. } => "video_unsupported",
            AccountingError::VideoTooShort { .. } => "video_too_short",
            AccountingError::MediaIoKwargs { .. } => "media_io_kwargs",
            AccountingError::RequestMmKwargs { .. } => "request_mm_kwargs",
            AccountingError::Overflow { .. } => "overflow",
            AccountingError::NeedsRequestContext { .. } => "needs_request_context",
            AccountingError::BudgetUnderflow { .. } => "budget_underflow",
            AccountingError::NoConvergence { .. } => "no_convergence",
            AccountingError::ExifTransposed { .. } => "exif_transposed",
        }
    }
}
