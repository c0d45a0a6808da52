//! Why a prompt could not be rendered or tokenized. `label()` values are Prometheus `reason` labels.

/// Errors of the prompt stage (template, tokenizer, model files).
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    #[error("chat template failed: {0}")]
    TemplateFailed(String),
    #[error("tokenizer failed: {0}")]
    TokenizeFailed(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("cannot load model {source_name}: {detail}")]
    ModelLoadFailed { source_name: String, detail: String },
}

impl PromptError {
    pub fn label(&self) -> &'static str {
        match self {
            PromptError::TemplateFailed(_) => "template_failed",
            PromptError::TokenizeFailed(_) => "tokenize_failed",
            PromptError::InvalidRequest(_) => "invalid_request",
            PromptError::ModelLoadFailed { .. } => "model_load_failed",
        }
    }
}
