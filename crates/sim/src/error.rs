//! Why the simulator refused or broke off a request (or refused its options), each reason with the
//! stable snake_case label that is also the `code` of its OpenAI error body.

/// Why the simulator refused or broke off a request (or refused its options).
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("request body is not valid JSON: {0}")]
    InvalidJson(String),
    #[error("invalid request field `{field}`: {reason}")]
    InvalidField { field: &'static str, reason: String },
    /// A request vLLM's OpenAI server refuses (its validators' message and `param`).
    #[error("{message}")]
    BadRequest { message: String, param: Option<&'static str> },
    #[error("could not build the prompt: {0}")]
    Prompt(String),
    #[error("request body exceeds the limit of {limit} bytes (--max-body-bytes)")]
    BodyTooLarge { limit: usize },
    #[error("request body could not be read: {0}")]
    BodyRead(String),
    #[error("no route for {method} {path}")]
    NotFound { method: String, path: String },
    #[error("simulated worker failure (--error-rate)")]
    InjectedError,
    #[error("simulated rate limit (--error-rate with --error-status 429)")]
    RateLimited,
    #[error("simulated connection drop mid-stream (--drop-mid-stream-rate)")]
    StreamDropped,
    #[error("the simulated worker is shutting down")]
    ShuttingDown,
    /// SGLang's decode leg named a bootstrap host off this machine: the sim contacts loopback only.
    #[error("bootstrap_host `{host}` is not a loopback address: the simulator contacts only this machine")]
    BootstrapHostRefused { host: String },
    /// SGLang's decode leg waited past `--bootstrap-timeout-ms` for its prefill.
    #[error("bootstrap room {room} was not completed by its prefill within {waited_ms} ms")]
    BootstrapTimeout { room: u64, waited_ms: u64 },
    /// The encode role could not write an image's entry to `--ec-shared-storage`.
    #[error("could not write the encoder cache to the shared storage: {0}")]
    EcStorage(String),
    /// A request names a model the worker does not serve (vLLM's `_check_model`: 404 `NotFoundError`).
    #[error("The model `{model}` does not exist. Valid aliases: {served}.")]
    ModelNotFound { model: String, served: String },
    /// A `previous_response_id` or a path names no stored response (vLLM's `_make_not_found_error`).
    #[error("Response with id '{id}' not found.")]
    ResponseNotFound { id: String },
    /// Only a queued or running (background) response can be cancelled.
    #[error("Cannot cancel a synchronous response.")]
    CannotCancel,
    /// What the simulator cannot do for this model or prompter (e.g. detokenize without a tokenizer).
    #[error("{0}")]
    Unsupported(String),
    #[error("invalid option --{flag}: {reason}")]
    InvalidOption { flag: &'static str, reason: String },
}

impl SimError {
    /// Stable snake_case label (also the `code` of the OpenAI error body).
    pub fn label(&self) -> &'static str {
        match self {
            Self::InvalidJson(_) => "invalid_json",
            Self::InvalidField { .. } => "invalid_field",
            Self::BadRequest { .. } => "bad_request",
            Self::Prompt(_) => "prompt_failed",
            Self::BodyTooLarge { .. } => "too_large",
            Self::BodyRead(_) => "body_read_failed",
            Self::NotFound { .. } => "not_found",
            Self::InjectedError => "injected_error",
            Self::RateLimited => "rate_limited",
            Self::StreamDropped => "stream_dropped",
            Self::ShuttingDown => "shutting_down",
            Self::BootstrapHostRefused { .. } => "bootstrap_host_refused",
            Self::BootstrapTimeout { .. } => "bootstrap_timeout",
            Self::EcStorage(_) => "ec_storage_failed",
            Self::ModelNotFound { .. } => "model_not_found",
            Self::ResponseNotFound { .. } => "response_not_found",
            Self::CannotCancel => "cannot_cancel",
            Self::Unsupported(_) => "unsupported",
            Self::InvalidOption { .. } => "invalid_option",
        }
    }
}
