//! Admission: the cap on requests in flight (load shedding) and the request-body deadline.
//!
//! Beyond `server.max_inflight_requests` a request gets a fast OpenAI-shaped 503 with `retry-after`
//! instead of queueing behind the others; `/health` and `/metrics` are never shed. A request holds
//! its slot until its response has been sent (streams included). The body is read here, whole and
//! within `server.body_read_timeout_ms`, so a client trickling its body is cut with a 408 and the
//! connection closed rather than holding a slot; the handlers then read a body already in memory.

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{CONNECTION, RETRY_AFTER};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::sync::OwnedSemaphorePermit;

use crate::bodies::{read_within, ReadError};
use crate::error::ApiError;
use crate::front::{is_operational, Front};

/// Takes the request's place among those in flight (or sheds it) and reads its body.
pub async fn admit(front: &Front, req: Request) -> Result<(Request, Option<Slot>), Response> {
    let slot = if is_operational(req.uri().path()) {
        None
    } else {
        match take_slot(front) {
            Some(slot) => Some(slot),
            None => return Err(shed(front)),
        }
    };
    Ok((read_body(front, req).await?, slot))
}

/// While draining, asks the client to close the connection after this response.
pub fn mark_draining(front: &Front, resp: &mut Response) {
    if front.is_draining() {
        // HTTP/1: the client reconnects (elsewhere) for its next request.
        resp.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
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

fn take_slot(front: &Front) -> Option<Slot> {
    let permit = match &front.inflight {
        Some(sem) => Some(sem.clone().try_acquire_owned().ok()?),
        None => None,
    };
    let gauge = front.state.observe.inflight_requests();
    gauge.increment(1.0);
    Some(Slot { _permit: permit, gauge })
}

/// The 503 of a shed request.
fn shed(front: &Front) -> Response {
    let obs = &front.state.observe;
    obs.shed("inflight");
    obs.rejected(503, "overloaded");
    let err = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        "overloaded",
        "the router has too many requests in flight (server.max_inflight_requests); retry later",
    );
    with_retry_after(err.into_response(), front.conn.shed_retry_after_secs)
}

pub fn with_retry_after(mut resp: Response, secs: u64) -> Response {
    resp.headers_mut().insert(RETRY_AFTER, HeaderValue::from(secs));
    resp
}

/// The request with its body read into memory, or the error response.
async fn read_body(front: &Front, req: Request) -> Result<Request, Response> {
    if hyper::body::Body::is_end_stream(req.body()) {
        return Ok(req);
    }
    let (parts, body) = req.into_parts();
    let limit = front.state.max_body_bytes;
    let err = match read_within(body, limit, front.conn.body_read_timeout).await {
        Ok(bytes) => return Ok(Request::from_parts(parts, Body::from(bytes))),
        Err(ReadError::TimedOut) => {
            front.state.observe.client_timeout("body");
            let ms = front.conn.body_read_timeout.as_millis();
            let msg = format!("the request body did not arrive within {ms} ms (server.body_read_timeout_ms)");
            ApiError::new(StatusCode::REQUEST_TIMEOUT, "invalid_request_error", "body_read_timeout", msg)
        }
        Err(ReadError::TooLarge) => ApiError::too_large(limit),
        Err(ReadError::Failed(e)) => {
            ApiError::bad_request("body_read_failed", format!("could not read the request body: {e}"))
        }
    };
    front.state.observe.rejected(err.status.as_u16(), err.code);
    let mut resp = err.into_response();
    // The rest of the body is still on the wire: this connection cannot carry another request.
    resp.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
    Err(resp)
}
