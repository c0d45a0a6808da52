//! Admission: the cap on requests in flight (load shedding) and the request-body deadline.
//!
//! Beyond `server.max_inflight_requests` a request gets a fast OpenAI-shaped 503 with `retry-after`
//! instead of queueing behind the others; `/health` and `/metrics` are never shed. A request holds
//! its slot until its response has been sent (streams included). The body is read here, whole and
//! within `server.body_read_timeout_ms` and `server.max_body_bytes`, so a client trickling its body is
//! cut with a 408 and the connection closed rather than holding a slot. The bytes travel on as the
//! request's [`ReceivedBody`] extension: the handlers never read the body again.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{CONNECTION, RETRY_AFTER};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::bodies::{read_within, ReadError};
use crate::config::Settings;
use crate::error::ApiError;
use crate::observe::Observer;

/// The request body as received, read whole by admission (empty for a request without one).
#[derive(Clone, Debug, Default)]
pub struct ReceivedBody(pub Bytes);

/// Admission's own settings.
pub struct Admission {
    /// `None`: no cap on requests in flight.
    inflight: Option<Arc<Semaphore>>,
    max_body_bytes: usize,
    body_read_timeout: Duration,
    retry_after_secs: u64,
}

/// `/health` and `/metrics` stay answerable under load: they are never shed.
pub fn is_operational(path: &str) -> bool {
    path == "/health" || path == "/metrics"
}

impl Admission {
    pub fn new(cfg: &Settings) -> Admission {
        let conn = &cfg.server.conn;
        Admission {
            inflight: conn.max_inflight_requests.map(|n| Arc::new(Semaphore::new(n))),
            max_body_bytes: cfg.server.max_body_bytes,
            body_read_timeout: conn.body_read_timeout,
            retry_after_secs: conn.shed_retry_after_secs,
        }
    }

    /// Takes the request's place among those in flight (or sheds it) and reads its body.
    pub async fn admit(&self, req: Request, observe: &Observer) -> Result<(Request, Option<Slot>), Response> {
        let slot = if is_operational(req.uri().path()) {
            None
        } else {
            match self.take_slot(observe) {
                Some(slot) => Some(slot),
                None => return Err(self.shed(observe)),
            }
        };
        Ok((self.read_body(req, observe).await?, slot))
    }

    fn take_slot(&self, observe: &Observer) -> Option<Slot> {
        let permit = match &self.inflight {
            Some(sem) => Some(sem.clone().try_acquire_owned().ok()?),
            None => None,
        };
        let gauge = observe.inflight_requests();
        gauge.increment(1.0);
        Some(Slot { _permit: permit, gauge })
    }

    /// The 503 of a shed request.
    fn shed(&self, observe: &Observer) -> Response {
        observe.shed("inflight");
        observe.rejected(503, "overloaded");
        let err = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "overloaded",
            "the router has too many requests in flight (server.max_inflight_requests); retry later",
        );
        with_retry_after(err.into_response(), self.retry_after_secs)
    }

    /// The request with its body read into memory (as [`ReceivedBody`]), or the error response.
    async fn read_body(&self, req: Request, observe: &Observer) -> Result<Request, Response> {
        let (mut parts, body) = req.into_parts();
        if hyper::body::Body::is_end_stream(&body) {
            parts.extensions.insert(ReceivedBody::default());
            return Ok(Request::from_parts(parts, Body::empty()));
        }
        let limit = self.max_body_bytes;
        let err = match read_within(body, limit, self.body_read_timeout).await {
            Ok(bytes) => {
                parts.extensions.insert(ReceivedBody(bytes));
                return Ok(Request::from_parts(parts, Body::empty()));
            }
            Err(ReadError::TimedOut) => {
                observe.client_timeout("body");
                let ms = self.body_read_timeout.as_millis();
                let msg = format!("the request body did not arrive within {ms} ms (server.body_read_timeout_ms)");
                ApiError::new(StatusCode::REQUEST_TIMEOUT, "invalid_request_error", "body_read_timeout", msg)
            }
            Err(ReadError::TooLarge) => ApiError::too_large(limit),
            Err(ReadError::Failed(e)) => {
                ApiError::bad_request("body_read_failed", format!("could not read the request body: {e}"))
            }
        };
        observe.rejected(err.status.as_u16(), err.code);
        let mut resp = err.into_response();
        // The rest of the body is still on the wire: this connection cannot carry another request.
        resp.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
        Err(resp)
    }
}

/// A request's place among those in flight: counted in the gauge, and a permit when capped.
pub struct Slot {
    _permit: Option<OwnedSemaphorePermit>,
    gauge: metrics::Gauge,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.gauge.decrement(1.0);
    }
}

fn with_retry_after(mut resp: Response, secs: u64) -> Response {
    resp.headers_mut().insert(RETRY_AFTER, HeaderValue::from(secs));
    resp
}
