//! Header rules of the forward path: hop-by-hop headers (RFC 9110 §7.6.1) are about one connection and
//! never cross the proxy, either way; the worker's `Host` and `Content-Length` are ours to set.

use axum::http::header::CONNECTION;
use axum::http::{HeaderMap, HeaderName, HeaderValue};

/// Hop-by-hop headers (RFC 9110 §7.6.1) are about one connection, never forwarded.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(&name.as_str())
}

/// The end-to-end headers of `headers`: hop-by-hop ones dropped, and so are the headers the message's
/// own `Connection` header names (RFC 9110 §7.6.1: they are about this connection only).
pub fn end_to_end(headers: &HeaderMap) -> impl Iterator<Item = (&HeaderName, &HeaderValue)> {
    let listed: Vec<String> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect();
    headers.iter().filter(move |(name, _)| !is_hop_by_hop(name) && !listed.iter().any(|l| l == name.as_str()))
}

/// The headers a worker receives: the client's end-to-end ones, without `Host` and `Content-Length`
/// (they describe the client's hop; the client sets ours from the URL and the bytes).
pub fn outgoing(headers: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in end_to_end(headers) {
        if name == "host" || name == "content-length" {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

/// Sets the W3C trace context a worker receives (`traceparent`, `tracestate`), replacing any before;
/// `None` removes it.
pub fn set_trace_context(headers: &mut HeaderMap, parent: Option<HeaderValue>, state: Option<HeaderValue>) {
    for (name, value) in [("traceparent", parent), ("tracestate", state)] {
        match value {
            Some(v) => headers.insert(name, v),
            None => headers.remove(name),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_listed_headers_are_not_end_to_end() {
        let mut h = HeaderMap::new();
        h.append(CONNECTION, HeaderValue::from_static("keep-alive, X-Secret"));
        h.append(CONNECTION, HeaderValue::from_static("x-other"));
        for name in ["x-secret", "x-other", "keep-alive", "content-type", "x-public"] {
            h.insert(HeaderName::from_static(name), HeaderValue::from_static("1"));
        }
        let kept: Vec<&str> = end_to_end(&h).map(|(n, _)| n.as_str()).collect();
        assert_eq!(kept, vec!["content-type", "x-public"]);
    }

    #[test]
    fn hop_by_hop_headers_are_recognised() {
        assert!(is_hop_by_hop(&HeaderName::from_static("transfer-encoding")));
        assert!(!is_hop_by_hop(&HeaderName::from_static("content-type")));
    }
}
