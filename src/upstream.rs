//! Stage **forward**: send the received bytes, unchanged, to the chosen worker and relay its answer back
//! chunk by chunk as it arrives.
//!
//! The relay stream owns the request's [`LoadGuard`], so the worker's load is released exactly when the
//! response ends — completed, failed, timed out, or dropped because the client went away (dropping the
//! stream also drops the upstream connection, which cancels the request on the worker).
//!
//! A body the worker cuts (transport error) or that stalls longer than `server.upstream_idle_timeout_ms`
//! between chunks ends honestly: an SSE stream gets an error event and `data: [DONE]` (what vLLM sends
//! when its generator fails mid-stream), any other body ends with an error, which closes the client's
//! connection (the status is already sent). Either way the outcome is reported as a failure.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::header::CONNECTION;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use bytes::Bytes;
use futures_util::Stream;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::time::{Instant, Sleep};

use mmrouter_core::routing::LoadGuard;

use crate::config::ServerSettings;
use crate::error::ApiError;

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
}

/// A worker's response head, its body still streaming.
pub type UpstreamResponse = axum::http::Response<Body>;

/// hyper's own pooled client, for plain-http workers (the usual case inside a cluster).
type PlainClient = Client<HttpConnector, Full<Bytes>>;

/// The pooled HTTP clients to the workers, with the configured timeouts.
///
/// Plain `http://` workers are reached with hyper's client directly: reqwest's layers (its URL
/// type, redirect and retry services, header conversions) cost ~6 % of the router's CPU per text
/// request and do nothing we use — redirects are relayed, retries are ours. `https://` workers (and
/// base URLs carrying credentials) go through reqwest, which brings TLS and basic auth.
pub struct Upstream {
    client: reqwest::Client,
    plain: PlainClient,
    /// Workers' base URLs, parsed once: parsing (IDNA and all) on every request was ~2 % of the
    /// router's CPU. Bounded: cleared when a pool's churn fills it.
    bases: RwLock<HashMap<String, Arc<Base>>>,
    first_byte: Duration,
    total: Duration,
    idle: Duration,
}

/// A parsed worker base URL.
struct Base {
    url: reqwest::Url,
    /// For a plain-http base without credentials: the URL without query and trailing `/`, to which
    /// the request's path and query are appended.
    plain: Option<String>,
}

/// Where one request goes.
#[derive(Debug)]
enum Target {
    Plain(Uri),
    Reqwest(reqwest::Url),
}

impl Upstream {
    pub fn new(cfg: &ServerSettings) -> anyhow::Result<Upstream> {
        let client = mmrouter_core::http_client_builder()
            .connect_timeout(cfg.connect_timeout)
            .pool_idle_timeout(POOL_IDLE)
            .pool_max_idle_per_host(POOL_MAX_IDLE)
            .tcp_nodelay(true)
            // A worker's redirect is its answer to the client, not ours to follow.
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(cfg.connect_timeout));
        let plain = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE)
            .pool_max_idle_per_host(POOL_MAX_IDLE)
            .build(connector);
        Ok(Upstream {
            client,
            plain,
            bases: RwLock::new(HashMap::new()),
            first_byte: cfg.first_byte_timeout,
            total: cfg.total_timeout,
            idle: cfg.upstream_idle_timeout,
        })
    }

    pub fn total_timeout(&self) -> Duration {
        self.total
    }

    /// Longest silence allowed between two chunks of a worker's body.
    pub fn idle_timeout(&self) -> Duration {
        self.idle
    }

    /// Sends one request and waits for the response head (bounded by the first-byte timeout).
    pub async fn send(
        &self,
        base_url: &str,
        method: Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<UpstreamResponse, UpstreamError> {
        let target = self.target(base_url, path_and_query)?;
        let mut out = HeaderMap::with_capacity(headers.len());
        for (name, value) in end_to_end(headers) {
            // Host and length describe the client's hop; the client sets ours from the URL and the bytes.
            if name == "host" || name == "content-length" {
                continue;
            }
            out.append(name.clone(), value.clone());
        }
        let sent = async {
            match target {
                Target::Plain(uri) => self.send_plain(method, uri, out, body).await,
                Target::Reqwest(url) => self.send_reqwest(method, url, out, body).await,
            }
        };
        match tokio::time::timeout(self.first_byte, sent).await {
            Err(_) => Err(UpstreamError::FirstByteTimeout(self.first_byte)),
            Ok(r) => r,
        }
    }

    async fn send_plain(
        &self,
        method: Method,
        uri: Uri,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<UpstreamResponse, UpstreamError> {
        let mut req = axum::http::Request::new(Full::new(body));
        *req.method_mut() = method;
        *req.uri_mut() = uri;
        *req.headers_mut() = headers;
        match self.plain.request(req).await {
            Ok(resp) => Ok(resp.map(Body::new)),
            Err(e) if e.is_connect() => Err(UpstreamError::Connect(error_chain(&e))),
            Err(e) => Err(UpstreamError::Other(error_chain(&e))),
        }
    }

    async fn send_reqwest(
        &self,
        method: Method,
        url: reqwest::Url,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<UpstreamResponse, UpstreamError> {
        match self.client.request(method, url).headers(headers).body(body).send().await {
            Ok(resp) => Ok(axum::http::Response::<reqwest::Body>::from(resp).map(Body::new)),
            Err(e) if e.is_connect() => Err(UpstreamError::Connect(error_chain(&e))),
            Err(e) if e.is_timeout() => Err(UpstreamError::FirstByteTimeout(self.first_byte)),
            Err(e) => Err(UpstreamError::Other(error_chain(&e))),
        }
    }
}

impl Upstream {
    /// `base_url` (its path, if any, kept as a prefix) joined with the request's path and query.
    fn target(&self, base_url: &str, path_and_query: &str) -> Result<Target, UpstreamError> {
        let base = self.base(base_url)?;
        if let Some(prefix) = &base.plain {
            let uri = format!("{prefix}{path_and_query}");
            return uri
                .parse()
                .map(Target::Plain)
                .map_err(|e| UpstreamError::Other(format!("worker URI {uri:?}: {e}")));
        }
        let mut url = base.url.clone();
        let (path, query) = match path_and_query.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (path_and_query, None),
        };
        let joined = format!("{}{path}", url.path().trim_end_matches('/'));
        url.set_path(&joined);
        url.set_query(query);
        Ok(Target::Reqwest(url))
    }

    fn base(&self, base_url: &str) -> Result<Arc<Base>, UpstreamError> {
        if let Some(base) = self.bases.read().unwrap_or_else(|e| e.into_inner()).get(base_url) {
            return Ok(base.clone());
        }
        let url =
            reqwest::Url::parse(base_url).map_err(|e| UpstreamError::Other(format!("worker URL {base_url:?}: {e}")))?;
        let plain = (url.scheme() == "http" && url.username().is_empty() && url.password().is_none()).then(|| {
            let mut bare = url.clone();
            bare.set_query(None);
            bare.set_fragment(None);
            bare.as_str().trim_end_matches('/').to_owned()
        });
        let base = Arc::new(Base { url, plain });
        let mut bases = self.bases.write().unwrap_or_else(|e| e.into_inner());
        if bases.len() >= MAX_BASES {
            bases.clear();
        }
        bases.insert(base_url.to_owned(), base.clone());
        Ok(base)
    }
}

/// How long an idle pooled connection to a worker is kept, and how many per worker.
const POOL_IDLE: Duration = Duration::from_secs(90);
const POOL_MAX_IDLE: usize = 256;

/// Most parsed base URLs kept (far more than any pool's workers).
const MAX_BASES: usize = 4096;

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

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
    /// `usage.prompt_tokens` seen in the response (non-stream JSON, or a streamed usage chunk).
    pub usage_prompt_tokens: Option<u64>,
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
    pub fn new(
        inner: S,
        limits: RelayLimits,
        guard: LoadGuard,
        sse: bool,
        content_length: Option<u64>,
        on_end: OnEnd,
    ) -> Self {
        Relay {
            inner,
            deadline: Box::pin(tokio::time::sleep_until(limits.deadline)),
            idle: Box::pin(tokio::time::sleep(limits.idle)),
            idle_len: limits.idle,
            sse,
            tail: *b"\n\n",
            guard: Some(guard),
            usage: UsageWatch::new(sse),
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
            let usage_prompt_tokens = if outcome == Outcome::Complete { self.usage.finish() } else { None };
            f(EndReport { outcome, usage_prompt_tokens });
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

/// Finds `usage.prompt_tokens` in a response as it streams past, without buffering SSE streams whole.
enum UsageWatch {
    /// Non-stream JSON: keep a bounded copy and parse it at the end.
    Json { buf: Vec<u8>, overflow: bool },
    /// SSE: scan complete `data:` lines; remember the last usage seen.
    Sse { line: Vec<u8>, last: Option<u64> },
}

/// A non-stream answer larger than this is not inspected for usage (it is still relayed whole).
const MAX_JSON_WATCH: usize = 8 << 20;
const MAX_SSE_LINE: usize = 1 << 20;

#[derive(serde::Deserialize)]
struct UsageOnly {
    usage: Option<UsageTokens>,
}
#[derive(serde::Deserialize)]
struct UsageTokens {
    prompt_tokens: Option<u64>,
}

impl UsageWatch {
    fn new(sse: bool) -> Self {
        if sse {
            UsageWatch::Sse { line: Vec::new(), last: None }
        } else {
            UsageWatch::Json { buf: Vec::new(), overflow: false }
        }
    }

    fn feed(&mut self, chunk: &[u8]) {
        match self {
            UsageWatch::Json { buf, overflow } => {
                if !*overflow && buf.len() + chunk.len() <= MAX_JSON_WATCH {
                    buf.extend_from_slice(chunk);
                } else {
                    *overflow = true;
                    buf.clear();
                }
            }
            UsageWatch::Sse { line, last } => {
                for part in chunk.split_inclusive(|&b| b == b'\n') {
                    if line.len() + part.len() <= MAX_SSE_LINE {
                        line.extend_from_slice(part);
                    }
                    if part.ends_with(b"\n") {
                        if let Some(n) = sse_line_usage(line) {
                            *last = Some(n);
                        }
                        line.clear();
                    }
                }
            }
        }
    }

    fn finish(&mut self) -> Option<u64> {
        match self {
            UsageWatch::Json { buf, overflow } => {
                if *overflow {
                    return None;
                }
                let u: UsageOnly = serde_json::from_slice(buf).ok()?;
                u.usage?.prompt_tokens
            }
            UsageWatch::Sse { line, last } => sse_line_usage(line).or(*last),
        }
    }
}

fn sse_line_usage(line: &[u8]) -> Option<u64> {
    let data = line.strip_prefix(b"data:")?;
    // Cheap pre-check: most chunks carry no usage.
    if !data.windows(7).any(|w| w == b"\"usage\"") {
        return None;
    }
    let u: UsageOnly = serde_json::from_slice(data.trim_ascii()).ok()?;
    u.usage?.prompt_tokens
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_urls_join_the_request_path_and_query() {
        let up = Upstream::new(&ServerSettings::default()).expect("client");
        for (base, pq, want, plain) in [
            ("http://127.0.0.1:8000", "/v1/chat/completions", "http://127.0.0.1:8000/v1/chat/completions", true),
            ("http://127.0.0.1:8000/", "/v1/models?x=1", "http://127.0.0.1:8000/v1/models?x=1", true),
            ("http://w.example:8000/prefix/", "/v1/completions", "http://w.example:8000/prefix/v1/completions", true),
            ("http://127.0.0.1:8000/?k=v", "/v1/models", "http://127.0.0.1:8000/v1/models", true),
            ("http://[::1]:8000", "/v1/models", "http://[::1]:8000/v1/models", true),
            // Again: now from the cache of parsed bases.
            ("http://127.0.0.1:8000", "/v1/chat/completions", "http://127.0.0.1:8000/v1/chat/completions", true),
            ("https://w.example/prefix", "/v1/models?x=1", "https://w.example/prefix/v1/models?x=1", false),
            // Credentials need reqwest's basic auth.
            ("http://u:p@w.example:8000", "/v1/models", "http://u:p@w.example:8000/v1/models", false),
        ] {
            let (got, is_plain) = match up.target(base, pq).expect("target") {
                Target::Plain(uri) => (uri.to_string(), true),
                Target::Reqwest(url) => (url.to_string(), false),
            };
            assert_eq!((got.as_str(), is_plain), (want, plain), "{base} + {pq}");
        }
        assert!(up.target("not a url", "/v1/models").is_err());
    }

    #[test]
    fn usage_from_json_split_anywhere() {
        let body = br#"{"id":"x","usage":{"prompt_tokens":42,"completion_tokens":3}}"#;
        for cut in 0..body.len() {
            let mut w = UsageWatch::new(false);
            w.feed(&body[..cut]);
            w.feed(&body[cut..]);
            assert_eq!(w.finish(), Some(42), "cut at {cut}");
        }
    }

    #[test]
    fn usage_from_sse_split_anywhere() {
        let body = b"data: {\"choices\":[{\"delta\":{}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":7}}\n\ndata: [DONE]\n\n";
        for cut in 0..body.len() {
            let mut w = UsageWatch::new(true);
            w.feed(&body[..cut]);
            w.feed(&body[cut..]);
            assert_eq!(w.finish(), Some(7), "cut at {cut}");
        }
        let mut w = UsageWatch::new(true);
        w.feed(b"data: {\"choices\":[],\"usage\":null}\n\ndata: [DONE]\n\n");
        assert_eq!(w.finish(), None);
    }

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
        let items: Vec<_> = Relay::new(body, limits, guard, sse, None, on_end).collect().await;
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
