//! OpenTelemetry traces, built at the observation point like every other record: the proxy keeps a
//! [`RequestTrace`] in its context (the client's validated W3C `traceparent`, the ids it gave each
//! upstream send and when), and when the response has ended [`Tracer::export`] turns it and the
//! [`RequestRecord`] into spans — the server span, `plan` (with `intake`, `account`, `render`), `select`,
//! one `upstream` span per attempt or leg, `relay` — queued for one task that sends them as OTLP/HTTP
//! protobuf (`POST {endpoint}`, the official protos). Nothing is traced along the request's path.
//!
//! The queue is bounded: a span that does not fit is dropped and counted, never waited for; a batch
//! the collector refuses or that times out is dropped and counted (no retry: traces are best effort).

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use metrics::Counter;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;

pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
pub const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");
/// A longer `tracestate` is not passed on (W3C: 32 members; a vendor's member is short).
const MAX_TRACESTATE: usize = 512;
/// Spans sent in one export request at most; the queue is drained at least once a second.
const MAX_BATCH: usize = 512;
const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// A valid W3C `traceparent` (version 00): the trace, the sender's span, the sampled flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub sampled: bool,
}

impl TraceParent {
    /// Parses `00-<32 hex>-<16 hex>-<2 hex>` (lower-case hex, ids not all zero); anything else is
    /// `None`: a new trace starts and the garbage is not propagated.
    pub fn parse(v: &str) -> Option<TraceParent> {
        let b = v.as_bytes();
        if b.len() != 55 || &b[..3] != b"00-" || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let (trace_id, span_id): ([u8; 16], [u8; 8]) = (hex(&b[3..35])?, hex(&b[36..52])?);
        let flags: [u8; 1] = hex(&b[53..55])?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceParent { trace_id, span_id, sampled: flags[0] & 1 == 1 })
    }

    pub fn header(&self) -> HeaderValue {
        let s = format!("00-{}-{}-0{}", to_hex(&self.trace_id), to_hex(&self.span_id), u8::from(self.sampled));
        HeaderValue::from_str(&s).expect("hex is a valid header value")
    }
}

fn hex<const N: usize>(s: &[u8]) -> Option<[u8; N]> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, pair) in s.chunks_exact(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    (s.len() == 2 * N).then_some(out)
}

fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub(super) fn span_id() -> [u8; 8] {
    loop {
        let id = rand::random::<[u8; 8]>();
        if id != [0; 8] {
            return id;
        }
    }
}

/// One upstream send: the span id the worker was told is its parent, and when it left.
pub(super) struct Sent {
    pub(super) span_id: [u8; 8],
    pub(super) at: Instant,
    /// Not one of the context's attempts (SGLang's prefill leg, sent beside the decode's).
    pub(super) leg: Option<&'static str>,
}

/// A request's trace, carried in the proxy's context: the client's context and our spans' ids.
pub struct RequestTrace {
    pub trace_id: [u8; 16],
    /// The server span (ours); its parent is the client's span, when the client sent one.
    pub span_id: [u8; 8],
    pub(super) client: Option<TraceParent>,
    pub(super) tracestate: Option<HeaderValue>,
    pub(super) method: String,
    pub(super) path: String,
    pub(super) started: (SystemTime, Instant),
    /// When planning ended (the `plan` span ends there).
    pub planned_at: Option<Instant>,
    pub(super) sent: Vec<Sent>,
    /// What the worker's `usage` reported: prompt tokens, cached prompt tokens.
    pub usage: [Option<u64>; 2],
}

impl RequestTrace {
    /// The trace of a request arriving with `headers`, from which the client's `traceparent` and
    /// `tracestate` are taken out: each upstream send sets its own ([`RequestTrace::send`]).
    pub fn take(method: &str, path: &str, headers: &mut HeaderMap) -> RequestTrace {
        let client = headers.remove(TRACEPARENT).and_then(|v| v.to_str().ok().and_then(TraceParent::parse));
        let state = headers.remove(TRACESTATE).filter(|v| v.len() <= MAX_TRACESTATE);
        let path = path.split('?').next().unwrap_or_default().to_owned();
        RequestTrace {
            trace_id: client.map_or_else(new_trace_id, |c| c.trace_id),
            span_id: span_id(),
            tracestate: client.and(state),
            client,
            method: method.to_owned(),
            path,
            started: (SystemTime::now(), Instant::now()),
            planned_at: None,
            sent: Vec::new(),
            usage: [None; 2],
        }
    }

    /// The client's span, parent of the server span.
    pub fn client(&self) -> Option<TraceParent> {
        self.client
    }

    /// An upstream send begins: the `traceparent` (and `tracestate`) the worker gets. With tracing on,
    /// its parent is this send's span (the worker's spans nest under it), sampled as the request is;
    /// with tracing off, the client's valid context as received (we are transparent), or none.
    /// `leg` names a send that is not one of the context's attempts.
    pub fn send(&mut self, tracer: Option<&Tracer>, leg: Option<&'static str>) -> [Option<HeaderValue>; 2] {
        let Some(tracer) = tracer else {
            return [self.client.map(|c| c.header()), self.tracestate.clone()];
        };
        let sent = Sent { span_id: span_id(), at: Instant::now(), leg };
        let tp = TraceParent { trace_id: self.trace_id, span_id: sent.span_id, sampled: tracer.sampled(self) };
        self.sent.push(sent);
        [Some(tp.header()), self.tracestate.clone()]
    }

    pub(super) fn nanos(&self, at: Instant) -> u64 {
        let t = self.started.0 + at.saturating_duration_since(self.started.1);
        t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
    }
}

fn new_trace_id() -> [u8; 16] {
    loop {
        let id = rand::random::<[u8; 16]>();
        if id != [0; 16] {
            return id;
        }
    }
}

/// Where and how spans are exported (`[tracing]`).
#[derive(Clone, Debug)]
pub struct TraceExport {
    /// The OTLP/HTTP traces URL (`…/v1/traces`).
    pub url: String,
    /// Sent with every export (authentication); values marked sensitive.
    pub headers: HeaderMap,
    pub service_name: String,
    /// Traces started here that are sampled; a client's sampled flag is followed (parent-based).
    pub sample_ratio: f64,
    /// Spans queued at most.
    pub max_queue: usize,
    pub timeout: Duration,
}

/// The exporter: the sampling rule, the bounded queue, and its counters.
pub struct Tracer {
    cfg: TraceExport,
    queue: Mutex<Vec<Span>>,
    wake: tokio::sync::Notify,
    counters: TraceCounters,
}

/// The exporter's counters: spans delivered, and dropped by reason.
pub struct TraceCounters {
    pub exported: Counter,
    pub queue_full: Counter,
    pub export_failed: Counter,
}

impl Tracer {
    /// The exporter, and its task (spawned on the current runtime; it ends with the exporter).
    pub fn start(cfg: TraceExport, counters: TraceCounters) -> anyhow::Result<Arc<Tracer>> {
        // Started from the server's runtime; a state built outside one cannot export.
        tokio::runtime::Handle::try_current().map_err(|_| anyhow::anyhow!("tracing needs a tokio runtime"))?;
        let client = reqwest::Client::builder().timeout(cfg.timeout).build()?;
        let tracer =
            Arc::new(Tracer { counters, queue: Mutex::new(Vec::new()), wake: tokio::sync::Notify::new(), cfg });
        tokio::spawn(drain(Arc::downgrade(&tracer), client));
        Ok(tracer)
    }

    /// Parent-based: a client's sampled flag decides; a trace started here is sampled when its id's
    /// low 8 bytes fall under the ratio (the same answer for every send and the export).
    pub fn sampled(&self, t: &RequestTrace) -> bool {
        if let Some(c) = t.client {
            return c.sampled;
        }
        let ratio = self.cfg.sample_ratio;
        let low = u64::from_be_bytes(t.trace_id[8..].try_into().expect("8 bytes"));
        ratio >= 1.0 || (low as f64) < ratio * u64::MAX as f64
    }

    /// A sampled request's spans, queued (dropped and counted when the queue is full).
    pub fn push(&self, spans: Vec<Span>) {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() + spans.len() > self.cfg.max_queue {
            self.counters.queue_full.increment(spans.len() as u64);
            return;
        }
        q.extend(spans);
        if q.len() >= MAX_BATCH {
            self.wake.notify_one();
        }
    }

    fn batch(&self) -> Vec<Span> {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let n = q.len().min(MAX_BATCH);
        q.drain(..n).collect()
    }

    fn request(&self, spans: Vec<Span>) -> Vec<u8> {
        let resource = Resource { attributes: vec![kv("service.name", &self.cfg.service_name)], ..Default::default() };
        let scope = InstrumentationScope {
            name: "mmrouter".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            ..Default::default()
        };
        let scope_spans = ScopeSpans { scope: Some(scope), spans, ..Default::default() };
        let rs = ResourceSpans { resource: Some(resource), scope_spans: vec![scope_spans], ..Default::default() };
        ExportTraceServiceRequest { resource_spans: vec![rs] }.encode_to_vec()
    }
}

/// The export task: a batch when the queue holds one, else whatever is queued once a second.
async fn drain(tracer: Weak<Tracer>, client: reqwest::Client) {
    loop {
        let Some(t) = tracer.upgrade() else { return };
        let batch = t.batch();
        if batch.is_empty() {
            // Held for at most a second: the task ends at the first look after the exporter is gone.
            let _ = tokio::time::timeout(FLUSH_EVERY, t.wake.notified()).await;
            continue;
        }
        let n = batch.len() as u64;
        let body = t.request(batch);
        let post = client.post(&t.cfg.url).headers(t.cfg.headers.clone());
        let sent = post.header("content-type", "application/x-protobuf").body(body).send().await;
        match sent {
            Ok(resp) if resp.status().is_success() => t.counters.exported.increment(n),
            Ok(resp) => {
                tracing::debug!(status = %resp.status(), "OTLP export refused");
                t.counters.export_failed.increment(n);
            }
            Err(e) => {
                tracing::debug!("OTLP export failed: {e}");
                t.counters.export_failed.increment(n);
            }
        }
    }
}

pub(super) fn kv(key: &str, v: impl Into<Attr>) -> KeyValue {
    let value = match v.into() {
        Attr::S(s) => any_value::Value::StringValue(s),
        Attr::I(i) => any_value::Value::IntValue(i),
    };
    KeyValue { key: key.into(), value: Some(AnyValue { value: Some(value) }), ..Default::default() }
}

pub(super) enum Attr {
    S(String),
    I(i64),
}

impl From<&str> for Attr {
    fn from(s: &str) -> Attr {
        Attr::S(s.into())
    }
}

impl From<&String> for Attr {
    fn from(s: &String) -> Attr {
        Attr::S(s.clone())
    }
}

impl From<u32> for Attr {
    fn from(i: u32) -> Attr {
        Attr::I(i64::from(i))
    }
}

impl From<u64> for Attr {
    fn from(i: u64) -> Attr {
        Attr::I(i64::try_from(i).unwrap_or(i64::MAX))
    }
}

impl From<u16> for Attr {
    fn from(i: u16) -> Attr {
        Attr::I(i64::from(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_is_parsed_per_w3c() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let tp = TraceParent::parse(ok).expect("valid");
        assert!(tp.sampled);
        assert_eq!(tp.header().to_str().unwrap(), ok);
        let unsampled = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap();
        assert!(!unsampled.sampled);
        for bad in [
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            "",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_bad_client_context_starts_a_new_trace_and_is_not_propagated() {
        let mut h = HeaderMap::new();
        h.insert(TRACEPARENT, HeaderValue::from_static("00-zz-00f067aa0ba902b7-01"));
        h.insert(TRACESTATE, HeaderValue::from_static("k=v"));
        let mut t = RequestTrace::take("POST", "/v1/chat/completions?x=1", &mut h);
        assert!(h.get(TRACEPARENT).is_none() && h.get(TRACESTATE).is_none());
        assert_eq!(t.client(), None);
        assert_ne!(t.trace_id, [0; 16]);
        assert_eq!(t.send(None, None), [None, None], "tracing off: nothing made up, nothing invalid passed on");
        assert_eq!((t.method.as_str(), t.path.as_str()), ("POST", "/v1/chat/completions"), "the query is not kept");
    }

    #[test]
    fn tracing_off_passes_the_clients_context_on_unchanged() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut h = HeaderMap::new();
        h.insert(TRACEPARENT, HeaderValue::from_static(tp));
        h.insert(TRACESTATE, HeaderValue::from_static("vendor=abc"));
        let mut t = RequestTrace::take("POST", "/v1/chat/completions", &mut h);
        let [p, s] = t.send(None, None);
        assert_eq!(p.unwrap(), tp);
        assert_eq!(s.unwrap(), "vendor=abc");
    }

    #[test]
    fn an_oversized_tracestate_is_dropped() {
        let mut h = HeaderMap::new();
        h.insert(TRACEPARENT, HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
        h.insert(TRACESTATE, HeaderValue::from_str(&"k=v,".repeat(200)).unwrap());
        let mut t = RequestTrace::take("POST", "/", &mut h);
        assert!(t.send(None, None)[1].is_none());
    }
}
