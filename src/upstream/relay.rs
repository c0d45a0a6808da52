//! Stage **relay**: stream the worker's answer back unchanged, chunk by chunk as it arrives.
//!
//! The relay stream owns the request's [`LoadGuard`], so the worker's load is released exactly when the
//! response ends — completed, failed, timed out, or dropped because the client went away (dropping the
//! stream also drops the upstream connection, which cancels the request on the worker).
//!
//! A body the worker cuts (transport error) or that stalls longer than `server.upstream_idle_timeout_ms`
//! between chunks ends honestly: an SSE stream gets an error event and `data: [DONE]` (what vLLM sends
//! when its generator fails mid-stream), any other body ends with an error, which closes the client's
//! connection (the status is already sent). Either way the outcome is reported as a failure.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::http::StatusCode;
use bytes::Bytes;
use futures_util::Stream;
use mmrouter_core::routing::LoadGuard;
use tokio::time::{Instant, Sleep};

use super::error::error_chain;
use super::usage::UsageWatch;
use crate::error::ApiError;

/// How a relayed response ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Complete,
    /// The worker's body failed (connection reset, truncated).
    UpstreamError,
    /// `server.total_timeout_ms` passed.
    Timeout,
    /// The worker sent nothing for `server.upstream_idle_timeout_ms`.
    IdleTimeout,
    /// The client stopped reading (disconnect): the upstream request was dropped with it.
    Cancelled,
}

impl Outcome {
    /// The `reason` label of a body cut on the worker's side or by a timeout; `None` for a complete or
    /// client-cancelled response.
    pub fn cut_reason(self) -> Option<&'static str> {
        match self {
            Outcome::UpstreamError => Some("upstream_error"),
            Outcome::Timeout => Some("total_timeout"),
            Outcome::IdleTimeout => Some("idle_timeout"),
            Outcome::Complete | Outcome::Cancelled => None,
        }
    }

    /// What the client is told in the SSE error event.
    fn api_error(self) -> ApiError {
        let (status, code, message) = match self {
            Outcome::Timeout => (
                StatusCode::GATEWAY_TIMEOUT,
                "upstream_timeout",
                "the worker's response exceeded server.total_timeout_ms",
            ),
            Outcome::IdleTimeout => (
                StatusCode::GATEWAY_TIMEOUT,
                "upstream_idle_timeout",
                "the worker sent nothing for server.upstream_idle_timeout_ms",
            ),
            _ => (StatusCode::BAD_GATEWAY, "upstream_stream_cut", "the worker's response was cut before its end"),
        };
        ApiError::new(status, "server_error", code, message)
    }
}

/// What the relay reports when the response is over.
#[derive(Debug)]
pub struct EndReport {
    pub outcome: Outcome,
    /// `usage.prompt_tokens` (or a Responses answer's `usage.input_tokens`) seen in the response
    /// (non-stream JSON, or a streamed usage chunk); complete responses only.
    pub usage_prompt_tokens: Option<u64>,
    /// `usage`'s cached prompt tokens (`prompt_tokens_details.cached_tokens`), complete responses only.
    pub usage_cached_tokens: Option<u64>,
    /// The answer's id, when [`RelayBody::watch_id`] asked for it (whatever the outcome: a stream
    /// names it in its first event).
    pub response_id: Option<String>,
}

type OnEnd = Box<dyn FnOnce(EndReport) + Send>;

/// The time limits of one relayed body.
#[derive(Clone, Copy, Debug)]
pub struct RelayLimits {
    /// The whole response ends by then (`server.total_timeout_ms` after dispatch).
    pub deadline: Instant,
    /// Longest silence between chunks (`server.upstream_idle_timeout_ms`).
    pub idle: Duration,
}

/// What the relay is told about one body: its time limits and its framing.
#[derive(Clone, Copy, Debug)]
pub struct RelayBody {
    pub limits: RelayLimits,
    /// An SSE stream (`text/event-stream`): a cut ends with an error event.
    pub sse: bool,
    /// The response's Content-Length, when it has one.
    pub content_length: Option<u64>,
    /// Keep the answer's id (a Responses answer the worker stored).
    pub watch_id: bool,
}

/// Streams the worker's body through unchanged while watching it for `usage`, holding the load
/// guard and enforcing the total deadline.
pub struct Relay<S> {
    inner: S,
    deadline: Pin<Box<Sleep>>,
    /// Re-armed at every chunk.
    idle: Pin<Box<Sleep>>,
    idle_len: Duration,
    sse: bool,
    /// The last two bytes relayed (to end a partial SSE event before the error event).
    tail: [u8; 2],
    guard: Option<LoadGuard>,
    usage: UsageWatch,
    on_end: Option<OnEnd>,
    got_first: bool,
    /// Content-Length of the response, when given: hyper may stop polling once it has that many
    /// bytes, so reaching it is the end (not a cancellation).
    remaining: Option<u64>,
    /// Timed out or failed: nothing more is relayed.
    stopped: bool,
}

impl<S> Relay<S> {
    pub fn new(inner: S, body: RelayBody, guard: LoadGuard, on_end: OnEnd) -> Self {
        let RelayBody { limits, sse, content_length, watch_id } = body;
        Relay {
            inner,
            deadline: Box::pin(tokio::time::sleep_until(limits.deadline)),
            idle: Box::pin(tokio::time::sleep(limits.idle)),
            idle_len: limits.idle,
            sse,
            tail: *b"\n\n",
            guard: Some(guard),
            usage: UsageWatch::new(sse, watch_id),
            on_end: Some(on_end),
            got_first: false,
            remaining: content_length,
            stopped: false,
        }
    }

    /// Ends a body cut by the worker or a timeout: an SSE stream gets an error event then `[DONE]`,
    /// any other body an error (the connection closes: the status is already sent).
    fn cut(&mut self, outcome: Outcome) -> Poll<Option<Result<Bytes, std::io::Error>>> {
        self.stopped = true;
        self.finish(outcome);
        let err = outcome.api_error();
        if !self.sse {
            return Poll::Ready(Some(Err(std::io::Error::other(err.message))));
        }
        let mut event = Vec::new();
        // A partial event must be ended first, or the error would be glued to its last line.
        if self.tail != *b"\n\n" {
            event.extend_from_slice(if self.tail[1] == b'\n' { b"\n" } else { b"\n\n" });
        }
        event.extend_from_slice(format!("data: {}\n\ndata: [DONE]\n\n", err.body_json()).as_bytes());
        Poll::Ready(Some(Ok(Bytes::from(event))))
    }

    fn finish(&mut self, outcome: Outcome) {
        if let Some(f) = self.on_end.take() {
            let seen = self.usage.finish();
            let complete = |_: &u64| outcome == Outcome::Complete;
            let (usage_prompt_tokens, usage_cached_tokens) =
                (seen.prompt_tokens.filter(complete), seen.cached_tokens.filter(complete));
            f(EndReport { outcome, usage_prompt_tokens, usage_cached_tokens, response_id: seen.response_id });
        }
        // Released after the report so gauges never show the request gone before it is accounted.
        self.guard.take();
    }
}

impl<S, E> Stream for Relay<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::error::Error,
{
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.stopped {
            return Poll::Ready(None);
        }
        if this.on_end.is_none() {
            // Complete by Content-Length: pass through whatever end-of-body the worker still sends.
            return Pin::new(&mut this.inner)
                .poll_next(cx)
                .map(|o| o.map(|r| r.map_err(|e| std::io::Error::other(error_chain(&e)))));
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            return this.cut(Outcome::Timeout);
        }
        match Pin::new(&mut this.inner).poll_next(cx) {
            Poll::Pending => {
                if this.idle.as_mut().poll(cx).is_ready() {
                    return this.cut(Outcome::IdleTimeout);
                }
                Poll::Pending
            }
            Poll::Ready(Some(Ok(chunk))) => {
                let len = this.idle_len;
                this.idle.as_mut().reset(Instant::now() + len);
                match chunk.len() {
                    0 => {}
                    1 => this.tail = [this.tail[1], chunk[0]],
                    n => this.tail = [chunk[n - 2], chunk[n - 1]],
                }
                if !this.got_first {
                    this.got_first = true;
                    if let Some(g) = this.guard.as_mut() {
                        g.first_byte();
                    }
                }
                this.usage.feed(&chunk);
                if let Some(left) = this.remaining.as_mut() {
                    *left = left.saturating_sub(chunk.len() as u64);
                    if *left == 0 {
                        this.finish(Outcome::Complete);
                    }
                }
                Poll::Ready(Some(Ok(chunk)))
            }
            Poll::Ready(Some(Err(e))) => {
                tracing::warn!("worker body failed: {}", error_chain(&e));
                this.cut(Outcome::UpstreamError)
            }
            Poll::Ready(None) => {
                this.stopped = true;
                this.finish(Outcome::Complete);
                Poll::Ready(None)
            }
        }
    }
}

impl<S> Drop for Relay<S> {
    fn drop(&mut self) {
        // Dropped before the end: the client went away (or the server is shutting down).
        self.finish(Outcome::Cancelled);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Relays `first` then a silence, with a short idle timeout; returns the relayed items and the outcome.
    async fn stall_after(first: &'static [u8], sse: bool) -> (Vec<Result<Bytes, std::io::Error>>, Option<Outcome>) {
        use futures_util::StreamExt;
        use mmrouter_core::routing::{Load, Router, RoutingConfig, WorkerSpec};
        use std::sync::{Arc, Mutex};
        let router = Router::new(RoutingConfig::default(), vec![WorkerSpec::new("w", "http://127.0.0.1:1")]).unwrap();
        let guard = router.begin(0, Load { prefill_tokens: 5, decode_tokens: 5, image_tokens: 0 });
        let ended = Arc::new(Mutex::new(None));
        let seen = ended.clone();
        let body = futures_util::stream::iter([Ok::<_, reqwest::Error>(Bytes::from_static(first))])
            .chain(futures_util::stream::pending());
        let limits =
            RelayLimits { deadline: Instant::now() + Duration::from_secs(60), idle: Duration::from_millis(20) };
        let on_end = Box::new(move |e: EndReport| *seen.lock().unwrap() = Some(e.outcome));
        let spec = RelayBody { limits, sse, content_length: None, watch_id: false };
        let items: Vec<_> = Relay::new(body, spec, guard, on_end).collect().await;
        assert_eq!(router.loads()[0].inflight.requests, 0, "the load is released");
        let outcome = *ended.lock().unwrap();
        (items, outcome)
    }

    #[tokio::test]
    async fn a_stalled_sse_stream_ends_with_a_whole_error_event_then_done() {
        let (items, outcome) = stall_after(b"data: {\"partial\":", true).await;
        assert_eq!(outcome, Some(Outcome::IdleTimeout));
        let text: String = items.iter().map(|i| String::from_utf8_lossy(i.as_ref().unwrap()).into_owned()).collect();
        // The partial event is closed first, so the error event is parsed on its own.
        let events: Vec<&str> = text.split_terminator("\n\n").collect();
        assert_eq!(events.len(), 3, "{text:?}");
        assert_eq!(events[0], "data: {\"partial\":");
        let err: serde_json::Value = serde_json::from_str(events[1].strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(err["error"]["code"], "upstream_idle_timeout");
        assert_eq!(err["error"]["type"], "server_error");
        assert_eq!(events[2], "data: [DONE]");
        assert!(text.ends_with("\n\n"));
        // A stream cut right after a whole event needs no separator.
        let (items, _) = stall_after(b"data: {}\n\n", true).await;
        let text: String = items.iter().map(|i| String::from_utf8_lossy(i.as_ref().unwrap()).into_owned()).collect();
        assert!(text.starts_with("data: {}\n\ndata: {\"error\""), "{text:?}");
    }

    #[tokio::test]
    async fn a_stalled_plain_body_ends_with_an_error() {
        let (items, outcome) = stall_after(b"{\"id\":", false).await;
        assert_eq!(outcome, Some(Outcome::IdleTimeout));
        assert_eq!(items.len(), 2);
        assert!(items[1].is_err(), "the client's connection must break, not end cleanly");
    }
}
