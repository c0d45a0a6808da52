//! The upstream room: everything about talking to one worker, and nothing about why — it knows
//! nothing of the proxy, the pools or the metrics (what happened is reported to the caller):
//!
//! * [`client`]: the pooled clients (hyper for plain http, reqwest for TLS and credentials) and the
//!   first-byte timeout;
//! * [`error`]: what can fail, with each failure's retry reason and client-facing error;
//! * [`retry`]: which answers are retried, and the proxy-wide retry budget;
//! * [`relay`]: the answer streamed back under the total and idle deadlines, holding the load guard;
//! * [`usage`]: the prompt tokens of the answer's `usage` (and a Responses answer's id) read as it passes;
//! * [`headers`]: hop-by-hop rules;
//! * [`legs`]: the bodies of disaggregated serving's legs, and the prefill's transfer parameters checked.

mod client;
mod error;
mod headers;
pub mod legs;
mod pieces;
mod relay;
mod retry;
mod usage;

pub use client::{Outgoing, Upstream, UpstreamResponse};
pub use error::{error_chain, UpstreamError};
pub use headers::{end_to_end, set_trace_context};
pub use pieces::Pieces;
pub use relay::{EndReport, Outcome, Relay, RelayBody, RelayLimits};
pub use retry::{RetryBudget, RetryReason};
pub use usage::UsageWatch;
