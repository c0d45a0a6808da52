//! Body helpers of the client side: a response body that holds something (a permit, a log line, a
//! connection's in-flight mark) until the response has been sent or abandoned.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use http_body_util::BodyExt;
use hyper::body::{Frame, SizeHint};

/// `inner`, with `guard` dropped when the body is dropped: hyper drops a response body once it is
/// fully written or the client went away, so a guard here lives as long as the response, streams
/// included.
pub struct Guarded<G> {
    inner: Body,
    _guard: G,
}

impl<G: Send + Unpin + 'static> Guarded<G> {
    /// The response `resp` with its body wrapped.
    pub fn wrap(resp: axum::response::Response, guard: G) -> axum::response::Response {
        resp.map(|inner| Body::new(Guarded { inner, _guard: guard }))
    }
}

impl<G: Unpin> hyper::body::Body for Guarded<G> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Why a request body could not be read.
#[derive(Debug)]
pub enum ReadError {
    TooLarge,
    TimedOut,
    Failed(String),
}

/// Reads a whole request body, at most `limit` bytes, within `timeout` (a slow sender is cut).
pub async fn read_within(body: Body, limit: usize, timeout: std::time::Duration) -> Result<Bytes, ReadError> {
    let collect = http_body_util::Limited::new(body, limit).collect();
    match tokio::time::timeout(timeout, collect).await {
        Err(_) => Err(ReadError::TimedOut),
        Ok(Ok(c)) => Ok(c.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(ReadError::TooLarge),
        Ok(Err(e)) => Err(ReadError::Failed(e.to_string())),
    }
}
