//! The seam between the gate and image-token accounting: [`ImageCounter`] is what the gate needs to
//! know, [`Counter`] the real implementation, and tests inject counters that fail on chosen images.

use crate::accounting::{AccountingError, Counter, ImageTokens, RequestContext};

/// What the gate needs from accounting. [`Counter`] implements it; tests inject counters that fail on
/// chosen images to exercise the gate independently of any model family.
pub trait ImageCounter: Send + Sync {
    /// Literal text of the one token the chat template emits per image.
    fn placeholder(&self) -> &str;
    /// The placeholder vLLM writes into string-format content for the n-th image (1-based), if any.
    fn prompt_placeholder(&self, _n: usize) -> Option<String> {
        None
    }
    /// Tokens for every image of one request (in order), or the first failure.
    fn count_request(
        &self,
        sizes: &[(u32, u32)],
        ctx: &RequestContext,
        request_kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<Vec<ImageTokens>, AccountingError>;
}

impl ImageCounter for Counter {
    fn placeholder(&self) -> &str {
        Counter::placeholder(self)
    }

    fn prompt_placeholder(&self, n: usize) -> Option<String> {
        Counter::prompt_placeholder(self, n)
    }

    fn count_request(
        &self,
        sizes: &[(u32, u32)],
        ctx: &RequestContext,
        request_kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<Vec<ImageTokens>, AccountingError> {
        match request_kwargs {
            Some(kw) if !kw.is_empty() => self.with_request_kwargs(kw)?.count_all(sizes, ctx),
            _ => self.count_all(sizes, ctx),
        }
    }
}
