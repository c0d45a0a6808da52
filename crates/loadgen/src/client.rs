//! One request of a run: send the body, time the first byte and the end, read `usage` and the
//! router's headers from the (streamed or plain JSON) answer.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::Value;

use super::error::RequestError;

/// Response header naming the route mmrouter took (`exact`, `text_prefix`, `no_media`).
pub(crate) const ROUTE_HEADER: &str = "x-mmrouter-route";
/// Response header naming the worker mmrouter chose.
pub(crate) const WORKER_HEADER: &str = "x-mmrouter-worker";

/// Prompt-token usage reported by the worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

/// What a successful request returned.
#[derive(Debug, Default)]
pub(crate) struct Answer {
    pub usage: Option<Usage>,
    pub route: Option<String>,
    pub worker: Option<String>,
}

/// The measured result of one request.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub latency: Duration,
    /// Time to the first non-empty body chunk (the first token of a stream).
    pub ttfb: Option<Duration>,
    pub result: Result<Answer, RequestError>,
}

/// Sends `body` to `url` and reads the whole answer.
pub(crate) async fn execute(client: &reqwest::Client, url: &str, headers: &[(String, String)], body: Bytes) -> Outcome {
    let start = Instant::now();
    let mut ttfb = None;
    let result = send(client, url, headers, body, start, &mut ttfb).await;
    Outcome { latency: start.elapsed(), ttfb, result }
}

async fn send(
    client: &reqwest::Client,
    url: &str,
    headers: &[(String, String)],
    body: Bytes,
    start: Instant,
    ttfb: &mut Option<Duration>,
) -> Result<Answer, RequestError> {
    let mut req = client.post(url).header("content-type", "application/json").body(body);
    for (k, v) in headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let resp = req.send().await.map_err(|e| RequestError::from_reqwest(&e))?;
    let status = resp.status();
    let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let route = header(ROUTE_HEADER);
    let worker = header(WORKER_HEADER);
    let mut stream = resp.bytes_stream();
    let mut buf = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| RequestError::from_reqwest(&e))?;
        if ttfb.is_none() && !chunk.is_empty() {
            *ttfb = Some(start.elapsed());
        }
        buf.extend_from_slice(&chunk);
    }
    if !status.is_success() {
        // The body was drained above so the connection can be reused.
        return Err(RequestError::Status(status.as_u16()));
    }
    Ok(Answer { usage: parse_usage(&buf), route, worker })
}

/// `usage` of a chat answer: a JSON object, or the last SSE `data:` event that carries one.
pub(crate) fn parse_usage(body: &[u8]) -> Option<Usage> {
    let trimmed = body.trim_ascii_start();
    if trimmed.starts_with(b"{") {
        return serde_json::from_slice::<Value>(trimmed).ok().and_then(|v| usage_of(&v));
    }
    let text = std::str::from_utf8(body).ok()?;
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim)
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| usage_of(&v))
        .next_back()
}

fn usage_of(v: &Value) -> Option<Usage> {
    let u = v.get("usage")?;
    let prompt_tokens = u.get("prompt_tokens")?.as_u64()?;
    let cached_tokens =
        u.get("prompt_tokens_details").and_then(|d| d.get("cached_tokens")).and_then(Value::as_u64).unwrap_or(0);
    Some(Usage { prompt_tokens, cached_tokens })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_from_plain_json() {
        let b = br#"{"id":"x","usage":{"prompt_tokens":120,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":96}}}"#;
        assert_eq!(parse_usage(b), Some(Usage { prompt_tokens: 120, cached_tokens: 96 }));
        let b = br#"{"usage":{"prompt_tokens":7,"prompt_tokens_details":null}}"#;
        assert_eq!(parse_usage(b), Some(Usage { prompt_tokens: 7, cached_tokens: 0 }));
        assert_eq!(parse_usage(br#"{"choices":[]}"#), None);
    }

    #[test]
    fn usage_from_the_sse_chunk_that_carries_it() {
        let b = b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":64,\"prompt_tokens_details\":{\"cached_tokens\":48}}}\n\n\
data: [DONE]\n\n";
        assert_eq!(parse_usage(b), Some(Usage { prompt_tokens: 64, cached_tokens: 48 }));
        assert_eq!(parse_usage(b"data: {\"choices\":[]}\n\ndata: [DONE]\n\n"), None);
        assert_eq!(parse_usage(b""), None);
    }
}
