//! The per-request context (pingora's `CTX`): what one proxied request carries from phase to phase —
//! the received request, the pool, the plan, the decision, the attempts and what they did — and, once
//! the response has ended, what the observer is handed.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::http::{HeaderMap, Method};
use bytes::Bytes;
use mmrouter_core::media::ProbeTiming;
use mmrouter_core::pipeline::{Planned, RoutePlan, StageTimings};
use mmrouter_core::routing::{Decision, ImageUse, Worker};

use crate::front::ReceivedBody;
use crate::observe::{export_trace, Attempt, Ending, Leg, Observer, RequestRecord, RequestTrace};
use crate::pools::Pool;
use crate::upstream::Pieces;

/// One proxied request, from its arrival to the end of its response.
pub struct Ctx {
    pub method: Method,
    /// Path and query as received.
    pub path: String,
    pub headers: HeaderMap,
    /// The body as received (read once, by the front door); what is forwarded, but for the uuid splice.
    pub body: Bytes,
    /// The body with each exact image's `uuid` written in, built once when a vLLM worker needs it.
    pub spliced: Option<Pieces>,
    pub pool: Option<Arc<Pool>>,
    /// The LoRA adapter the request's `model` names in its pool, if it names one: only workers serving
    /// it are selected.
    pub adapter: Option<String>,
    pub plan: Option<RoutePlan>,
    pub timings: Option<StageTimings>,
    pub probes: Vec<ProbeTiming>,
    pub select: Option<Duration>,
    /// The ranking; it holds its candidates, so their ids cannot name other workers while it lives.
    pub decision: Option<Decision>,
    /// The plan's images as selection weighed them (exact route only), recorded at dispatch.
    pub images: Vec<ImageUse>,
    /// Predicted overlap on the first worker tried (counted once per request).
    pub dispatched_overlap: Option<u32>,
    pub attempts: Vec<Attempt>,
    pub retry_budget_exhausted: bool,
    pub ejected: Vec<Arc<Worker>>,
    /// Disaggregated serving: the body the next attempts send instead of the received one (a leg's).
    pub leg_body: Option<Bytes>,
    /// What each leg of a disaggregated request did, in order.
    pub legs: Vec<Leg>,
    /// A Responses request the worker may store: its answer's id is learnt at the end of the relay.
    pub learn_response_id: bool,
    /// A request pinned to the worker holding its stored response: how (`known`, `recovered`, or the
    /// `PinError` label).
    pub pinned: Option<&'static str>,
    /// The response id learnt from the worker's answer.
    pub learnt: bool,
    /// The client's trace context (taken out of `headers`) and our spans' ids: each upstream send
    /// sets its own `traceparent` ([`Ctx::trace_send`]).
    pub trace: RequestTrace,
}

impl Ctx {
    /// The context of `req`, whose body the front door has read.
    pub fn new(req: Request) -> Ctx {
        let (parts, _) = req.into_parts();
        let body = parts.extensions.get::<ReceivedBody>().map(|b| b.0.clone()).unwrap_or_default();
        let path = parts.uri.path_and_query().map_or_else(|| parts.uri.path().to_owned(), |p| p.as_str().to_owned());
        Ctx::from_parts(parts.method, path, parts.headers, body)
    }

    /// The context of a request received another way (the endpoint picker's, from Envoy).
    pub fn from_parts(method: Method, path: String, mut headers: HeaderMap, body: Bytes) -> Ctx {
        let trace = RequestTrace::take(method.as_str(), &path, &mut headers);
        Ctx {
            method,
            path,
            headers,
            body,
            spliced: None,
            pool: None,
            adapter: None,
            plan: None,
            timings: None,
            probes: Vec::new(),
            select: None,
            decision: None,
            images: Vec::new(),
            dispatched_overlap: None,
            attempts: Vec::new(),
            retry_budget_exhausted: false,
            ejected: Vec::new(),
            leg_body: None,
            legs: Vec::new(),
            learn_response_id: false,
            pinned: None,
            learnt: false,
            trace,
        }
    }

    /// Keeps what planning produced.
    pub fn planned(&mut self, planned: Planned) {
        self.plan = Some(planned.plan);
        self.timings = Some(planned.timings);
        self.probes = planned.probes;
        self.trace.planned_at = Some(std::time::Instant::now());
    }

    /// An upstream send is about to leave: its `traceparent` (and the client's `tracestate`) replace
    /// the previous send's in the headers it is sent with. `leg` names a send that is not an attempt.
    pub fn trace_send(&mut self, observe: &Observer, leg: Option<&'static str>) {
        let [parent, state] = self.trace.send(observe.tracer(), leg);
        crate::upstream::set_trace_context(&mut self.headers, parent, state);
    }

    /// The pool picked (every phase after `pick_pool` has one).
    pub fn pool(&self) -> &Arc<Pool> {
        self.pool.as_ref().expect("a pool was picked before this phase")
    }

    /// The plan (every phase after `plan` has one).
    pub fn plan(&self) -> &RoutePlan {
        self.plan.as_ref().expect("the request was planned before this phase")
    }

    /// The observation phase: hands what this request did to the observer, once.
    pub fn observe(&self, observe: &Observer, ending: Ending, drift: Option<f64>) {
        if let Some(adapter) = &self.adapter {
            observe.adapter_request(adapter);
        }
        let record = RequestRecord {
            pool: self.pool.as_ref().map(|p| p.name.as_str()),
            plan: self.plan.as_ref(),
            timings: self.timings.as_ref(),
            probes: &self.probes,
            select: self.select,
            dispatched_overlap: self.dispatched_overlap,
            attempts: &self.attempts,
            retry_budget_exhausted: self.retry_budget_exhausted,
            ejected: &self.ejected,
            legs: &self.legs,
            pinned: self.pinned,
            response_learnt: self.learnt,
            drift,
            ending,
        };
        observe.record(&record);
        export_trace(observe, &self.trace, &record);
    }
}
