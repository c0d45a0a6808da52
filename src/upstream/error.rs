//! What can go wrong sending a request to a worker, with the retry reason each failure carries and the
//! OpenAI-shaped error the client gets when no retry follows.

use std::time::Duration;

use axum::http::StatusCode;

use super::retry::RetryReason;
use crate::error::ApiError;

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("cannot connect to worker: {0}")]
    Connect(String),
    #[error("worker sent no response within {0:?}")]
    FirstByteTimeout(Duration),
    #[error("worker request failed: {0}")]
    Other(String),
}
impl UpstreamError {
    pub fn label(&self) -> &'static str {
        match self {
            UpstreamError::Connect(_) => "connect_error",
            UpstreamError::FirstByteTimeout(_) => "timeout",
            UpstreamError::Other(_) => "error",
        }
    }

    pub fn to_api(&self, worker: &str) -> ApiError {
        match self {
            UpstreamError::Connect(e) => ApiError::new(
                StatusCode::BAD_GATEWAY,
                "server_error",
                "upstream_unavailable",
                format!("worker '{worker}' is unreachable: {e}"),
            ),
            UpstreamError::FirstByteTimeout(d) => ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                "server_error",
                "upstream_timeout",
                format!(
                    "worker '{worker}' sent no response within {} ms (server.first_byte_timeout_ms)",
                    d.as_millis()
                ),
            ),
            UpstreamError::Other(e) => ApiError::new(
                StatusCode::BAD_GATEWAY,
                "server_error",
                "upstream_error",
                format!("worker '{worker}' failed: {e}"),
            ),
        }
    }

    /// Why the next candidate is tried after this failure.
    pub fn retry_reason(&self) -> RetryReason {
        match self {
            UpstreamError::Connect(_) => RetryReason::ConnectError,
            UpstreamError::FirstByteTimeout(_) => RetryReason::Timeout,
            UpstreamError::Other(_) => RetryReason::TransportError,
        }
    }
}

/// An error and its sources, one line (hyper's and reqwest's errors say little at the top level).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}
