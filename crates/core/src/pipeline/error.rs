//! What can go wrong around planning, each with its snake_case label: the refusals the proxy answers
//! with a client error ([`Rejection`]), the start-up failures ([`LoadError`]), and the fallback reason a
//! stage hands the gate when a request with images cannot be exact.

use crate::media::MediaError;
use crate::plan::PlanError;
use crate::prompt::PromptError;

/// Why a request with images is not exact: the fallback reason label.
pub(super) type Fallback = &'static str;

/// A request the pipeline refuses to route (the proxy answers it with a client error).
#[derive(Debug, thiserror::Error)]
pub enum Rejection {
    /// `media.reject_blocked_urls` is on and an image URL is blocked by the SSRF guard.
    #[error("{0}")]
    BlockedImageUrl(MediaError),
    /// An image part names its own `uuid` where the router cannot replace it with a content hash (the
    /// request falls back, or the part has no image at all), and `media.trust_client_uuids` is off:
    /// vLLM would trust that name verbatim across every tenant of the worker.
    #[error("image part uuid is not accepted: {0} (media.trust_client_uuids is off)")]
    ClientUuid(String),
    /// The prompt is over `model.max_prompt_bytes` (checked before tokenizing) or
    /// `model.max_prompt_tokens`: bounded work per request.
    #[error("{0}")]
    PromptTooLong(PlanError),
}

impl Rejection {
    pub fn label(&self) -> &'static str {
        match self {
            Rejection::BlockedImageUrl(_) => "image_url_blocked",
            Rejection::ClientUuid(_) => "client_uuid_untrusted",
            Rejection::PromptTooLong(_) => "prompt_too_long",
        }
    }
}

/// Why a pipeline could not be built (at start-up, not per request).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("model '{model}': {source}")]
    Prompt { model: String, source: PromptError },
    #[error("{0}")]
    Media(String),
}
