//! The proxied request's observation phase (pingora's `logging`): what one request did, handed to the
//! observer once, when its response has ended, as plain data — the proxy fills a [`RequestRecord`]
//! from its per-request context; nothing along the request's path records on its own.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use mmrouter_core::media::ProbeTiming;
use mmrouter_core::pipeline::{Route, RoutePlan, StageTimings};
use mmrouter_core::routing::Worker;

use super::names::*;
use super::recorder::Observer;

/// What one proxied request did.
pub struct RequestRecord<'a> {
    /// The pool its `model` picked, if one did.
    pub pool: Option<&'a str>,
    /// The plan it was routed by, once planned.
    pub plan: Option<&'a RoutePlan>,
    /// What planning took (absent for a passthrough, which is not planned).
    pub timings: Option<&'a StageTimings>,
    /// One sample per image read.
    pub probes: &'a [ProbeTiming],
    pub select: Option<Duration>,
    /// The prompt tokens the chosen worker was predicted to hold, once dispatched (counted once per
    /// request, whatever the worker answers).
    pub dispatched_overlap: Option<u32>,
    pub attempts: &'a [Attempt],
    /// A retry was refused by the budget.
    pub retry_budget_exhausted: bool,
    /// Workers this request's failures ejected.
    pub ejected: &'a [Arc<Worker>],
    /// Disaggregated serving: what each leg did.
    pub legs: &'a [Leg],
    /// A Responses request pinned to the worker holding its stored response: the outcome (`known`,
    /// `recovered`, or why not).
    pub pinned: Option<&'static str>,
    /// The id of the response the worker stored was learnt from its answer.
    pub response_learnt: bool,
    /// Worker-reported minus predicted prompt tokens, for a complete answer that reported usage.
    pub drift: Option<f64>,
    pub ending: Ending,
}

/// How a proxied request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// Refused before it had a route (bad body, unknown model, prompt too long…), by its error code.
    Rejected { status: u16, code: &'static str },
    /// Answered with this status (the worker's or ours) under its plan's route.
    Answered { status: u16 },
    /// The body was cut after its status went out (`upstream_error`, `idle_timeout`, `total_timeout`).
    Cut { reason: &'static str },
}

/// One leg of a disaggregated request.
#[derive(Clone, Debug)]
pub struct Leg {
    pub kind: LegKind,
    /// The worker it went to (none when skipped before one was chosen).
    pub worker: Option<String>,
    pub outcome: LegOutcome,
    pub elapsed: Option<Duration>,
}

impl Leg {
    /// A leg not sent, and why.
    pub fn skipped(kind: LegKind, reason: &'static str) -> Leg {
        Leg { kind, worker: None, outcome: LegOutcome::Skipped(reason), elapsed: None }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LegKind {
    Encode,
    Prefill,
    Decode,
}

impl LegKind {
    pub fn label(self) -> &'static str {
        match self {
            LegKind::Encode => "encode",
            LegKind::Prefill => "prefill",
            LegKind::Decode => "decode",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LegOutcome {
    Served,
    /// Sent and failed, by reason.
    Failed(&'static str),
    /// Not sent, by reason.
    Skipped(&'static str),
}

impl LegOutcome {
    pub fn label(self) -> &'static str {
        match self {
            LegOutcome::Served => "served",
            LegOutcome::Failed(_) => "failed",
            LegOutcome::Skipped(_) => "skipped",
        }
    }

    pub(super) fn reason(self) -> Option<&'static str> {
        match self {
            LegOutcome::Served => None,
            LegOutcome::Failed(r) | LegOutcome::Skipped(r) => Some(r),
        }
    }
}

/// One upstream attempt.
pub struct Attempt {
    pub worker: Arc<Worker>,
    pub status: AttemptStatus,
    /// Time to the response head, when one came.
    pub head_after: Option<Duration>,
    /// Why it was tried again on the next candidate, when it was.
    pub retried: Option<&'static str>,
}

/// What an attempt got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptStatus {
    /// The worker's response head.
    Http(StatusCode),
    /// No answer: `connect_error`, `timeout`, `error`.
    Failed(&'static str),
}

impl Observer {
    /// Records one proxied request, once, when its response has ended.
    pub fn record(&self, r: &RequestRecord<'_>) {
        if let Some(pool) = r.pool {
            self.pool_requests.get_str(pool, |p| self.counter(POOL_REQUESTS_TOTAL, &[("pool", p)])).increment(1);
        }
        if let Some(t) = r.timings {
            self.planned(t, r.probes);
        }
        if let Some(d) = r.select {
            self.stage(stage::SELECT, d);
        }
        if let (Some(plan), Some(overlap)) = (r.plan, r.dispatched_overlap) {
            self.dispatched(plan, overlap);
        }
        for a in r.attempts {
            self.attempt(a);
        }
        if r.retry_budget_exhausted {
            self.budget_exhausted.increment(1);
        }
        for w in r.ejected {
            self.series(w.name()).counter_for(WORKER_EJECTIONS_TOTAL, &[]).increment(1);
        }
        for leg in r.legs {
            self.leg(leg);
        }
        if let Some(outcome) = r.pinned {
            self.cluster_count(RESPONSES_PINNED_TOTAL, ("outcome", outcome), 1);
        }
        if r.response_learnt {
            self.cluster_count(RESPONSES_LEARNT_TOTAL, ("source", "worker"), 1);
        }
        if let Some(d) = r.drift {
            self.drift.record(d);
        }
        self.ending(r.plan.map(|p| p.route), r.ending);
    }

    fn stage(&self, name: &'static str, d: Duration) {
        let h = self.stages.get(name, |s| self.histogram(STAGE_DURATION_SECONDS, &[("stage", s)]));
        h.record(d.as_secs_f64());
    }

    /// What planning took: stage timings, and one probe sample per image read.
    fn planned(&self, t: &StageTimings, probes: &[ProbeTiming]) {
        if let Some(d) = t.intake {
            self.stage(stage::INTAKE, d);
        }
        if let Some(d) = t.account {
            self.stage(stage::ACCOUNT, d);
        }
        self.stage(stage::PLAN, t.plan);
        for probe in probes {
            let source = probe.source.label();
            let h = self.probes.get(source, |s| self.histogram(IMAGE_PROBE_DURATION_SECONDS, &[("source", s)]));
            h.record(probe.elapsed.as_secs_f64());
        }
    }

    /// Image samples only for an exact plan; a fallback counts its reason and nothing of its images.
    fn dispatched(&self, plan: &RoutePlan, overlap_tokens: u32) {
        match plan.route {
            Route::Exact => {
                self.image_tokens.record(f64::from(plan.exact_image_tokens()));
                self.images.record(plan.images.len() as f64);
            }
            Route::TextPrefix { reason } => {
                self.fallback.get(reason, |r| self.counter(MM_FALLBACK_TOTAL, &[("reason", r)])).increment(1);
            }
            Route::NoMedia => {
                if let Some(reason) = plan.unrendered {
                    let c = self.unrendered.get(reason, |r| self.counter(PROMPT_UNRENDERED_TOTAL, &[("reason", r)]));
                    c.increment(1);
                }
            }
            Route::Passthrough => {}
        }
        if plan.route != Route::Passthrough {
            let route = plan.route.label();
            let h = self.overlap.get(route, |r| self.histogram(KV_OVERLAP_TOKENS, &[("route", r)]));
            h.record(f64::from(overlap_tokens));
        }
    }

    fn leg(&self, leg: &Leg) {
        let kind = leg.kind.label();
        let outcome = leg.outcome.label();
        let c = self
            .leg_counters
            .get((DISAGG_LEGS_TOTAL, kind, outcome), |(n, k, o)| self.counter(n, &[("leg", k), ("outcome", o)]));
        c.increment(1);
        if let Some(reason) = leg.outcome.reason() {
            let c = self
                .leg_counters
                .get((DISAGG_FALLBACK_TOTAL, kind, reason), |(n, k, r)| self.counter(n, &[("leg", k), ("reason", r)]));
            c.increment(1);
        }
        if let Some(d) = leg.elapsed {
            let h = self.leg_durations.get(kind, |k| self.histogram(DISAGG_LEG_DURATION_SECONDS, &[("leg", k)]));
            h.record(d.as_secs_f64());
        }
        if let Some(worker) = &leg.worker {
            self.series(worker).counter_for(WORKER_LEGS_TOTAL, &[("leg", kind)]).increment(1);
        }
    }

    fn attempt(&self, a: &Attempt) {
        if let Some(d) = a.head_after {
            self.stage(stage::FORWARD_TTFB, d);
        }
        let status = match &a.status {
            AttemptStatus::Http(s) => s.as_str(),
            AttemptStatus::Failed(label) => label,
        };
        let series = self.series(a.worker.name());
        let c = series.upstream.get_str(status, |s| series.counter(UPSTREAM_REQUESTS_TOTAL, &[("status", s)]));
        c.increment(1);
        if let Some(reason) = a.retried {
            self.retries.get(reason, |r| self.counter(UPSTREAM_RETRIES_TOTAL, &[("reason", r)])).increment(1);
        }
    }

    fn ending(&self, route: Option<Route>, ending: Ending) {
        let label = route.map_or("rejected", |r| r.label());
        match ending {
            Ending::Rejected { status, code } => self.rejected(status, code),
            Ending::Answered { status } => {
                let c = self.requests.get((label, status), |(r, s)| {
                    self.counter(REQUESTS_TOTAL, &[("route", r), ("status", &s.to_string())])
                });
                c.increment(1);
            }
            Ending::Cut { reason } => {
                let c = self.stream_errors.get((label, reason), |(r, why)| {
                    self.counter(STREAM_ERRORS_TOTAL, &[("route", r), ("reason", why)])
                });
                c.increment(1);
                let c = self
                    .cut_requests
                    .get(label, |r| self.counter(REQUESTS_TOTAL, &[("route", r), ("status", "stream_error")]));
                c.increment(1);
            }
        }
    }
}
