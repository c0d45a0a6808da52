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
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use prost::Message;

use super::names::*;
use super::record::{AttemptStatus, Ending, LegOutcome, RequestRecord};
use super::recorder::Observer;

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

fn span_id() -> [u8; 8] {
    loop {
        let id = rand::random::<[u8; 8]>();
        if id != [0; 8] {
            return id;
        }
    }
}

/// One upstream send: the span id the worker was told is its parent, and when it left.
struct Sent {
    span_id: [u8; 8],
    at: Instant,
    /// Not one of the context's attempts (SGLang's prefill leg, sent beside the decode's).
    leg: Option<&'static str>,
}

/// A request's trace, carried in the proxy's context: the client's context and our spans' ids.
pub struct RequestTrace {
    pub trace_id: [u8; 16],
    /// The server span (ours); its parent is the client's span, when the client sent one.
    pub span_id: [u8; 8],
    client: Option<TraceParent>,
    tracestate: Option<HeaderValue>,
    name: String,
    method: String,
    path: String,
    started: (SystemTime, Instant),
    /// When planning ended (the `plan` span ends there).
    pub planned_at: Option<Instant>,
    sent: Vec<Sent>,
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
            name: format!("{method} {path}"),
            method: method.to_owned(),
            path,
            started: (SystemTime::now(), Instant::now()),
            planned_at: None,
            sent: Vec::new(),
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

    fn nanos(&self, at: Instant) -> u64 {
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
    exported: Counter,
    queue_full: Counter,
    export_failed: Counter,
}

impl Tracer {
    /// The exporter, and its task (spawned on the current runtime; it ends with the exporter).
    pub fn start(cfg: TraceExport, observe: &Observer) -> anyhow::Result<Arc<Tracer>> {
        // Started from the server's runtime; a state built outside one cannot export.
        tokio::runtime::Handle::try_current().map_err(|_| anyhow::anyhow!("tracing needs a tokio runtime"))?;
        let client = reqwest::Client::builder().timeout(cfg.timeout).build()?;
        let dropped = |reason| observe.counter(TRACE_SPANS_DROPPED_TOTAL, &[("reason", reason)]);
        let tracer = Arc::new(Tracer {
            exported: observe.counter(TRACE_SPANS_EXPORTED_TOTAL, &[]),
            queue_full: dropped("queue_full"),
            export_failed: dropped("export_failed"),
            queue: Mutex::new(Vec::new()),
            wake: tokio::sync::Notify::new(),
            cfg,
        });
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

    /// The request's spans, queued when it is sampled (dropped and counted when the queue is full).
    pub fn export(&self, t: &RequestTrace, r: &RequestRecord<'_>) {
        if !self.sampled(t) {
            return;
        }
        let spans = spans(t, r, Instant::now());
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() + spans.len() > self.cfg.max_queue {
            self.queue_full.increment(spans.len() as u64);
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
        let scope = InstrumentationScope { name: "mmrouter".into(), version: env!("CARGO_PKG_VERSION").into(), ..Default::default() };
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
            Ok(resp) if resp.status().is_success() => t.exported.increment(n),
            Ok(resp) => {
                tracing::debug!(status = %resp.status(), "OTLP export refused");
                t.export_failed.increment(n);
            }
            Err(e) => {
                tracing::debug!("OTLP export failed: {e}");
                t.export_failed.increment(n);
            }
        }
    }
}

fn kv(key: &str, v: impl Into<Attr>) -> KeyValue {
    let value = match v.into() {
        Attr::S(s) => any_value::Value::StringValue(s),
        Attr::I(i) => any_value::Value::IntValue(i),
    };
    KeyValue { key: key.into(), value: Some(AnyValue { value: Some(value) }), ..Default::default() }
}

enum Attr {
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

impl From<u16> for Attr {
    fn from(i: u16) -> Attr {
        Attr::I(i64::from(i))
    }
}

/// The spans of one request that ended at `end`.
fn spans(t: &RequestTrace, r: &RequestRecord<'_>, end: Instant) -> Vec<Span> {
    let mut b = Builder { t, spans: Vec::new() };
    b.server(r, end);
    b.plan(r);
    b.select(r, end);
    b.upstream(r, end);
    b.spans
}

struct Builder<'a> {
    t: &'a RequestTrace,
    spans: Vec<Span>,
}

impl Builder<'_> {
    fn span(&mut self, name: &str, parent: [u8; 8], (from, to): (Instant, Instant), attrs: Vec<KeyValue>) -> [u8; 8] {
        self.with_id(span_id(), name, parent, (from, to), attrs)
    }

    fn with_id(&mut self, id: [u8; 8], name: &str, parent: [u8; 8], at: (Instant, Instant), attrs: Vec<KeyValue>) -> [u8; 8] {
        self.spans.push(Span {
            trace_id: self.t.trace_id.to_vec(),
            span_id: id.to_vec(),
            // A root span has no parent (an empty id), not a zero one.
            parent_span_id: if parent == [0; 8] { Vec::new() } else { parent.to_vec() },
            trace_state: self.t.tracestate.as_ref().and_then(|v| v.to_str().ok()).unwrap_or_default().into(),
            name: name.into(),
            kind: SpanKind::Internal as i32,
            start_time_unix_nano: self.t.nanos(at.0),
            end_time_unix_nano: self.t.nanos(at.1.max(at.0)),
            attributes: attrs,
            ..Default::default()
        });
        id
    }

    fn last_mut(&mut self) -> &mut Span {
        self.spans.last_mut().expect("just pushed")
    }

    /// The request as the client saw it: route, fallback reason, worker, predicted tokens, outcome.
    fn server(&mut self, r: &RequestRecord<'_>, end: Instant) {
        let mut a = vec![kv("http.request.method", &self.t.method), kv("url.path", &self.t.path)];
        if let Some(pool) = r.pool {
            a.push(kv("mmrouter.pool", pool));
        }
        if let Some(plan) = r.plan {
            a.push(kv("mmrouter.route", plan.route.label()));
            if let Some(reason) = plan.fallback_reason() {
                a.push(kv("mmrouter.fallback_reason", reason));
            }
            a.push(kv("mmrouter.prompt_tokens", plan.prompt_tokens));
            if let (Some(pred), Some(drift)) = (plan.predicted_prompt_tokens(), r.drift) {
                a.push(kv("gen_ai.usage.input_tokens", (f64::from(pred) + drift).max(0.0) as u32));
            }
        }
        if let Some(overlap) = r.dispatched_overlap {
            a.push(kv("mmrouter.predicted_cached_tokens", overlap));
        }
        if let Some(w) = r.attempts.last() {
            a.push(kv("mmrouter.worker", w.worker.name()));
        }
        for leg in r.legs {
            let v = leg.outcome.reason().map_or_else(|| leg.outcome.label().to_owned(), |why| format!("{}:{why}", leg.outcome.label()));
            a.push(kv(&format!("mmrouter.leg.{}", leg.kind.label()), &v));
        }
        let (status, error) = match r.ending {
            Ending::Rejected { status, code } => (Some(status), Some(code)),
            Ending::Answered { status } => (Some(status), (status >= 500).then_some("http_error")),
            Ending::Cut { reason } => (None, Some(reason)),
        };
        if let Some(s) = status {
            a.push(kv("http.response.status_code", s));
        }
        let parent = self.t.client.map_or([0; 8], |c| c.span_id);
        let name = self.t.name.clone();
        self.with_id(self.t.span_id, &name, parent, (self.t.started.1, end), a);
        let span = self.last_mut();
        span.kind = SpanKind::Server as i32;
        if let Some(e) = error {
            span.status = Some(Status { message: e.into(), code: StatusCode::Error as i32 });
            span.attributes.push(kv("error.type", e));
        }
    }

    /// `plan`, ending when planning ended, with its stages laid back to back from their durations.
    fn plan(&mut self, r: &RequestRecord<'_>) {
        let (Some(t), Some(end)) = (r.timings, self.t.planned_at) else { return };
        let stages = [("intake", t.intake), ("account", t.account), ("render", Some(t.plan))];
        let total: Duration = stages.iter().filter_map(|s| s.1).sum();
        let start = end.checked_sub(total).unwrap_or(end);
        let mut attrs = Vec::new();
        if let Some(plan) = r.plan {
            attrs.push(kv("mmrouter.route", plan.route.label()));
            if let Some(reason) = plan.fallback_reason() {
                attrs.push(kv("mmrouter.fallback_reason", reason));
            }
            attrs.push(kv("mmrouter.images", plan.images.len() as u32));
        }
        let plan = self.span("plan", self.t.span_id, (start, end), attrs);
        let mut at = start;
        for (name, d) in stages {
            let Some(d) = d else { continue };
            self.span(name, plan, (at, at + d), Vec::new());
            at += d;
        }
    }

    /// `select`, ending when the first upstream send left (or planning plus its duration).
    fn select(&mut self, r: &RequestRecord<'_>, end: Instant) {
        let Some(d) = r.select else { return };
        let to = self.t.sent.first().map(|s| s.at).or(self.t.planned_at.map(|p| p + d)).unwrap_or(end).min(end);
        let mut attrs = Vec::new();
        if let Some(w) = r.attempts.first() {
            attrs.push(kv("mmrouter.worker", w.worker.name()));
        }
        if let Some(o) = r.dispatched_overlap {
            attrs.push(kv("mmrouter.predicted_cached_tokens", o));
        }
        self.span("select", self.t.span_id, (to.checked_sub(d).unwrap_or(to), to), attrs);
    }

    /// One `upstream` span per send (its id is the parent the worker was given), then `relay`.
    fn upstream(&mut self, r: &RequestRecord<'_>, end: Instant) {
        let mut attempts = r.attempts.iter();
        let sent = &self.t.sent;
        for (i, s) in sent.iter().enumerate() {
            let next = sent[i + 1..].iter().find(|n| n.leg.is_none()).map_or(end, |n| n.at);
            let mut a = Vec::new();
            let to = match s.leg {
                Some(leg) => {
                    a.push(kv("mmrouter.leg", leg));
                    let l = r.legs.iter().find(|l| l.kind.label() == leg);
                    if let Some(w) = l.and_then(|l| l.worker.as_deref()) {
                        a.push(kv("mmrouter.worker", w));
                    }
                    if let Some(LegOutcome::Failed(why)) = l.map(|l| l.outcome) {
                        a.push(kv("error.type", why));
                    }
                    l.and_then(|l| l.elapsed).map_or(end, |d| s.at + d)
                }
                None => {
                    let Some(att) = attempts.next() else { continue };
                    a.push(kv("mmrouter.worker", att.worker.name()));
                    match att.status {
                        AttemptStatus::Http(st) => a.push(kv("http.response.status_code", st.as_u16())),
                        AttemptStatus::Failed(why) => a.push(kv("error.type", why)),
                    }
                    if let Some(why) = att.retried {
                        a.push(kv("mmrouter.retry_reason", why));
                    }
                    att.head_after.map_or(next, |h| s.at + h)
                }
            };
            self.with_id(s.span_id, "upstream", self.t.span_id, (s.at, to.min(end)), a);
            self.last_mut().kind = SpanKind::Client as i32;
        }
        self.relay(r, end);
    }

    /// `relay`: from the answer's head to the end of its body.
    fn relay(&mut self, r: &RequestRecord<'_>, end: Instant) {
        let last = self.t.sent.iter().rev().find(|s| s.leg.is_none());
        let head = r.attempts.last().and_then(|a| a.head_after);
        let (Some(s), Some(h), Ending::Answered { .. } | Ending::Cut { .. }) = (last, head, r.ending) else { return };
        let mut attrs = Vec::new();
        if let Ending::Cut { reason } = r.ending {
            attrs.push(kv("error.type", reason));
        }
        self.span("relay", self.t.span_id, (s.at + h, end), attrs);
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
        assert_eq!(t.name, "POST /v1/chat/completions");
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
