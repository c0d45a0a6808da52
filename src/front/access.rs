//! Request ids and the access log.
//!
//! Each request carries an `x-request-id`: the client's (if it is 1–128 printable ASCII characters)
//! or a new random one. It is set on the request before the handler, so the forward path passes it to
//! the worker with the other headers, and returned on the response. Other tracing headers (W3C
//! `traceparent`, `tracestate`) are not touched: the forward path passes them through as received.
//!
//! One log line per request (target `mmrouter::access`), written when the response has been sent or
//! abandoned: request id, method, path, status, route and worker (from the proxy's `x-mmrouter-*`
//! response headers, when it chose one), time to the response head and in total.

use std::time::Instant;

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method};
use axum::response::Response;

pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// A request's id and, when the access log is on, its log line in the making.
pub struct Access {
    id: HeaderValue,
    line: Option<Line>,
}

impl Access {
    /// Tags `req` with its id (so the worker gets it) and starts its log line (`server.access_log`).
    pub fn begin(log: bool, req: &mut Request) -> Access {
        let id = client_id(req.headers()).unwrap_or_else(new_id);
        req.headers_mut().insert(REQUEST_ID, id.clone());
        // Nothing to collect when the log filter drops the line anyway.
        let on = log && tracing::enabled!(target: "mmrouter::access", tracing::Level::INFO);
        let line = on.then(|| Line {
            start: Instant::now(),
            method: req.method().clone(),
            path: req.uri().path().to_owned(),
            id: id.clone(),
            status: 0,
            route: None,
            worker: None,
            head_ms: 0.0,
        });
        Access { id, line }
    }

    /// Returns the id on `resp`; the log line, filled in, is written when it is dropped with the
    /// response body.
    pub fn finish(self, resp: &mut Response) -> Option<impl Send + Unpin + 'static> {
        resp.headers_mut().insert(REQUEST_ID, self.id);
        let mut line = self.line?;
        line.status = resp.status().as_u16();
        line.route = header(resp.headers(), "x-mmrouter-route");
        line.worker = header(resp.headers(), "x-mmrouter-worker");
        line.head_ms = ms(line.start);
        Some(line)
    }
}

/// The client's id, if it is a reasonable one (ids end up in logs and worker headers).
fn client_id(headers: &HeaderMap) -> Option<HeaderValue> {
    let v = headers.get(REQUEST_ID)?;
    let ok = (1..=128).contains(&v.len()) && v.as_bytes().iter().all(u8::is_ascii_graphic);
    ok.then(|| v.clone())
}

/// 128 random bits, hex (written by hand: one per request, the formatter costs more).
fn new_id() -> HeaderValue {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bits = rand::random::<u128>();
    let mut hex = [0u8; 32];
    for (i, digit) in hex.iter_mut().enumerate() {
        *digit = HEX[((bits >> (124 - 4 * i)) & 0xf) as usize];
    }
    HeaderValue::from_bytes(&hex).expect("hex is a valid header value")
}

fn header(h: &HeaderMap, name: &str) -> Option<String> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

fn ms(since: Instant) -> f64 {
    (since.elapsed().as_secs_f64() * 1e6).round() / 1e3
}

/// One request's log line, written when dropped with the response body.
struct Line {
    start: Instant,
    method: Method,
    path: String,
    id: HeaderValue,
    status: u16,
    route: Option<String>,
    worker: Option<String>,
    head_ms: f64,
}

impl Drop for Line {
    fn drop(&mut self) {
        tracing::info!(
            target: "mmrouter::access",
            request_id = %self.id.to_str().unwrap_or(""),
            method = %self.method,
            path = %self.path,
            status = self.status,
            route = %self.route.as_deref().unwrap_or("-"),
            worker = %self.worker.as_deref().unwrap_or("-"),
            head_ms = self.head_ms,
            duration_ms = ms(self.start),
            "request"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_ids_are_32_lowercase_hex_digits_and_differ() {
        let (a, b) = (new_id(), new_id());
        for id in [&a, &b] {
            assert_eq!(id.len(), 32);
            assert!(id.as_bytes().iter().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c)), "{id:?}");
        }
        assert_ne!(a, b);
        // Every nibble lands: the digits spell the number.
        let n = u128::from_str_radix(a.to_str().unwrap(), 16).unwrap();
        assert_eq!(format!("{n:032x}"), a.to_str().unwrap());
    }
}
