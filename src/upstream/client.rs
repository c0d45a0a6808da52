//! The pooled HTTP clients to the workers: send one request, wait for its response head within the
//! first-byte timeout.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, Method, Uri};
use bytes::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::error::{error_chain, UpstreamError};
use super::headers::outgoing;
use super::pieces::Pieces;
use crate::config::ServerSettings;

/// What is sent to a worker besides the body: the client's method, path and query, and headers.
pub struct Outgoing<'a> {
    pub method: &'a Method,
    pub path_and_query: &'a str,
    pub headers: &'a HeaderMap,
}

/// A worker's response head, its body still streaming.
pub type UpstreamResponse = axum::http::Response<Body>;

/// hyper's own pooled client, for plain-http workers (the usual case inside a cluster).
type PlainClient = Client<HttpConnector, Pieces>;

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
        req: &Outgoing<'_>,
        body: Pieces,
    ) -> Result<UpstreamResponse, UpstreamError> {
        let target = self.target(base_url, req.path_and_query)?;
        let (method, out) = (req.method.clone(), outgoing(req.headers));
        let sent = async {
            match target {
                Target::Plain(uri) => self.send_plain(method, uri, out, body).await,
                Target::Reqwest(url) => self.send_reqwest(method, url, out, body.into_bytes()).await,
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
        body: Pieces,
    ) -> Result<UpstreamResponse, UpstreamError> {
        let mut req = axum::http::Request::new(body);
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
}
