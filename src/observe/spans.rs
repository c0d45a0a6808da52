//! A request's spans, built once when its response has ended from its [`RequestRecord`] and the
//! [`RequestTrace`] its context kept: the server span, `plan` (with `intake`, `account`, `render`),
//! `select`, one `upstream` span per send (its id the parent the worker was given), `relay`
//! (docs/tracing.md). Handed to the exporter ([`super::trace::Tracer`]) when the request is sampled.

use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use opentelemetry_proto::tonic::trace::v1::{Span, Status};

use super::record::{AttemptStatus, Ending, LegOutcome, RequestRecord};
use super::recorder::Observer;
use super::trace::{kv, span_id, RequestTrace};

/// The observation point's trace step: the request's spans to the exporter, when traces are exported
/// and this request is sampled.
pub fn export_trace(observe: &Observer, t: &RequestTrace, r: &RequestRecord<'_>) {
    let Some(tracer) = observe.tracer() else { return };
    if tracer.sampled(t) {
        tracer.push(spans(t, r, Instant::now()));
    }
}

/// The spans of one request that ended at `end`.
pub(super) fn spans(t: &RequestTrace, r: &RequestRecord<'_>, end: Instant) -> Vec<Span> {
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
    /// A new span under `parent`; its id.
    fn span(&mut self, name: &str, parent: [u8; 8], at: (Instant, Instant), attrs: Vec<KeyValue>) -> [u8; 8] {
        let id = span_id();
        self.with_id(id, name, parent, at).attributes = attrs;
        id
    }

    /// The span `id` (one the context already named), to fill in.
    fn with_id(&mut self, id: [u8; 8], name: &str, parent: [u8; 8], at: (Instant, Instant)) -> &mut Span {
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
            ..Default::default()
        });
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
        }
        if let Some(overlap) = r.dispatched_overlap {
            a.push(kv("mmrouter.predicted_cached_tokens", overlap));
        }
        // The worker's own count, beside the prediction (OpenTelemetry's GenAI names).
        let [prompt, cached] = self.t.usage;
        if let Some(n) = prompt {
            a.push(kv("gen_ai.usage.input_tokens", n));
        }
        if let Some(n) = cached {
            a.push(kv("gen_ai.usage.cache_read.input_tokens", n));
        }
        if let Some(w) = r.attempts.last() {
            a.push(kv("mmrouter.worker", w.worker.name()));
        }
        for leg in r.legs {
            let v = leg
                .outcome
                .reason()
                .map_or_else(|| leg.outcome.label().to_owned(), |why| format!("{}:{why}", leg.outcome.label()));
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
        // The span's name is the route as OpenTelemetry's HTTP conventions name it (made here, not per request).
        let (t, name) = (self.t, format!("{} {}", self.t.method, self.t.path));
        let span = self.with_id(t.span_id, &name, parent, (t.started.1, end));
        span.attributes = a;
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
            let span = self.with_id(s.span_id, "upstream", self.t.span_id, (s.at, to.min(end)));
            span.attributes = a;
            span.kind = SpanKind::Client as i32;
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
