//! One ext_proc stream: one client request through the gateway. Its messages arrive in order —
//! request head, request body (buffered whole), response head, response body chunks — and each gets
//! its answer:
//!
//! ```text
//! request head ─► (wait) ─► request body ─► parse → pick pool → plan → select (the proxy's phases)
//!                                           └► endpoints in header + `envoy.lb`, the uuid splice as a body mutation
//! response head ─► the endpoint that served, its status fed to its state ─► response body ─► usage
//!                                                                           └► end: load released, observed once
//! ```
//!
//! The context is the proxy's [`Ctx`]; the request is observed through the same observer, so
//! `/metrics` counts it like a proxied one. When the stream ends early (the client went away, the
//! gateway gave up) the request ends as cancelled.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;
use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Message;
use envoy_types::pb::envoy::service::ext_proc::v3::{HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse};
use mmrouter_core::request::Endpoint;
use mmrouter_core::routing::{Admission, Failure, LoadGuard};
use tonic::codegen::http::{Method, StatusCode};
use tonic::Status;

use super::envoy::{self, Head};
use crate::error::ApiError;
use crate::observe::{Attempt, AttemptStatus};
use crate::proxy::{self, Ctx};
use crate::state::AppState;
use crate::upstream::{EndReport, Outcome, UsageWatch};

/// What every stream of one picker server shares.
pub struct Shared {
    pub st: Arc<AppState>,
    /// Fallback endpoints listed after the pick (`server.ext_proc_fallbacks`).
    pub fallbacks: usize,
    pub max_body_bytes: usize,
    /// Requests decided and not yet ended, against `server.max_inflight_requests`.
    pub inflight: AtomicUsize,
    pub max_inflight: Option<usize>,
    pub retry_after_secs: u64,
}

/// A request sent to a worker, until its response ends.
struct Sent {
    worker: usize,
    guard: LoadGuard,
    /// Until the response head reports the outcome (a half-open worker's probe).
    admission: Option<Admission>,
    at: Instant,
    status: Option<StatusCode>,
    watch: Option<UsageWatch>,
}

/// One stream's state.
pub struct Exchange {
    shared: Arc<Shared>,
    head: Option<Head>,
    body: BytesMut,
    ctx: Option<Ctx>,
    sent: Option<Sent>,
    /// Holds one of `Shared::inflight` while true.
    counted: bool,
}

impl Exchange {
    pub fn new(shared: Arc<Shared>) -> Exchange {
        Exchange { shared, head: None, body: BytesMut::new(), ctx: None, sent: None, counted: false }
    }

    /// The answer to one message of the stream.
    pub async fn handle(&mut self, req: ProcessingRequest) -> Result<ProcessingResponse, Status> {
        let Some(message) = req.request else { return Err(Status::invalid_argument("empty ProcessingRequest")) };
        Ok(match message {
            Message::RequestHeaders(h) => self.request_head(h).await,
            Message::RequestBody(b) => self.request_body(b).await?,
            Message::ResponseHeaders(h) => self.response_head(h, req.metadata_context.as_ref()),
            Message::ResponseBody(b) => self.response_body(b),
            Message::RequestTrailers(_) => envoy::trailers(false),
            Message::ResponseTrailers(_) => {
                self.finish(Outcome::Complete);
                envoy::trailers(true)
            }
        })
    }

    /// Keeps the head; the body decides (a request without one is decided now).
    async fn request_head(&mut self, h: HttpHeaders) -> ProcessingResponse {
        self.head = Some(envoy::head(h.headers.as_ref()));
        if h.end_of_stream {
            return self.decide().await;
        }
        envoy::request_headers()
    }

    /// The body, whole (`request_body_mode: BUFFERED`), then the decision.
    async fn request_body(&mut self, b: HttpBody) -> Result<ProcessingResponse, Status> {
        if self.body.len() + b.body.len() > self.shared.max_body_bytes {
            return Ok(self.refuse(None, ApiError::too_large(self.shared.max_body_bytes)));
        }
        self.body.extend_from_slice(&b.body);
        if !b.end_of_stream {
            // A streamed body would reach the worker before the decision names it.
            return Err(Status::failed_precondition("mmrouter needs request_body_mode: BUFFERED"));
        }
        Ok(self.decide().await)
    }

    /// The proxy's phases up to select, then the endpoints and the body the worker gets.
    async fn decide(&mut self) -> ProcessingResponse {
        let head = self.head.take().unwrap_or_default();
        let path = head.pseudo.get("path").cloned().unwrap_or_default();
        let method = head.pseudo.get("method").and_then(|m| m.parse().ok()).unwrap_or(Method::POST);
        let body = std::mem::take(&mut self.body).freeze();
        let mut ctx = Ctx::from_parts(method.clone(), path.clone(), head.headers, body);
        let endpoint = match path.split('?').next() {
            Some("/v1/chat/completions") => Endpoint::Chat,
            Some("/v1/completions") => Endpoint::Completion,
            _ => return self.refuse(Some(&ctx), ApiError::unknown_route(method.as_str(), &path)),
        };
        if !self.admit() {
            let e =
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", "shed", "the router is at capacity");
            return self.refuse(Some(&ctx), e);
        }
        if let Err(e) = proxy::decide(&self.shared.st, &mut ctx, endpoint).await {
            return self.refuse(Some(&ctx), e);
        }
        self.pick(ctx)
    }

    /// Takes one of the in-flight slots; false when `max_inflight_requests` are out.
    fn admit(&mut self) -> bool {
        let n = self.shared.inflight.fetch_add(1, Ordering::AcqRel) + 1;
        self.counted = true;
        self.shared.max_inflight.is_none_or(|max| n <= max)
    }

    /// The first candidate its state admits, then up to `fallbacks` more; the load held on the pick.
    fn pick(&mut self, mut ctx: Ctx) -> ProcessingResponse {
        let router = ctx.pool().router.clone();
        let candidates = ctx.decision.as_ref().map(|d| d.candidates.clone()).unwrap_or_default();
        let admitted = candidates.iter().enumerate().find_map(|(i, &w)| router.admit(w).map(|a| (i, a)));
        let Some((i, admission)) = admitted else { return self.refuse(Some(&ctx), ApiError::no_worker()) };
        let w = candidates[i];
        let listed = std::iter::once(w).chain(candidates[i + 1..].iter().copied().take(self.shared.fallbacks));
        let endpoints: Vec<String> = listed.filter_map(|w| envoy::endpoint_of(router.worker(w).url())).collect();
        if endpoints.is_empty() {
            return self.refuse(Some(&ctx), ApiError::no_worker());
        }
        // Where the proxy would splice the uuids, the body is replaced (fallbacks get the same bytes).
        let body = proxy::body_for(&mut ctx, router.worker(w).engine());
        let mutated = ctx.spliced.is_some().then(|| body.into_bytes().to_vec());
        let guard = proxy::dispatch(&mut ctx, w, true);
        let at = Instant::now();
        self.sent = Some(Sent { worker: w, guard, admission: Some(admission), at, status: None, watch: None });
        self.ctx = Some(ctx);
        self.shared.st.observe.picker_decision("picked");
        envoy::picked(&endpoints.join(","), mutated)
    }

    /// The router answers itself: observed like the proxy's own answers, counted by outcome.
    fn refuse(&mut self, ctx: Option<&Ctx>, e: ApiError) -> ProcessingResponse {
        if let Some(ctx) = ctx {
            proxy::observe_error(&self.shared.st, ctx, &e);
        }
        let outcome = match e.status {
            StatusCode::SERVICE_UNAVAILABLE => "unavailable",
            StatusCode::TOO_MANY_REQUESTS => "shed",
            _ => "rejected",
        };
        self.shared.st.observe.picker_decision(outcome);
        self.release();
        let retry = (e.status == StatusCode::TOO_MANY_REQUESTS).then_some(self.shared.retry_after_secs);
        let body = serde_json::to_vec(&e.body_json()).unwrap_or_default();
        envoy::immediate(e.status.as_u16(), body, e.code, retry)
    }

    /// The response head: which endpoint served (the gateway says, else the pick), its status fed to
    /// that worker's state as the proxy does.
    fn response_head(&mut self, h: HttpHeaders, metadata: Option<&Metadata>) -> ProcessingResponse {
        let head = envoy::head(h.headers.as_ref());
        let (Some(ctx), Some(sent)) = (self.ctx.as_mut(), self.sent.as_mut()) else {
            return envoy::response_headers(&[]);
        };
        let status = head.pseudo.get("status").and_then(|s| s.parse().ok()).unwrap_or(StatusCode::BAD_GATEWAY);
        let served = envoy::served_in(metadata)
            .or_else(|| head.headers.get(envoy::SERVED).and_then(|v| v.to_str().ok()).map(str::to_owned));
        if let Some(served) = served {
            move_to_served(ctx, sent, &served);
        }
        let router = ctx.pool().router.clone();
        let worker = router.worker(sent.worker);
        let head_after = Some(sent.at.elapsed());
        ctx.attempts.push(Attempt {
            worker: worker.clone(),
            status: AttemptStatus::Http(status),
            head_after,
            retried: None,
        });
        let probe = sent.admission.take().is_some_and(|a| a.is_probe());
        // A 429 says "busy", not "broken": it neither ejects nor recovers the worker.
        let t = match status.as_u16() {
            500.. => router.failed(sent.worker, Failure::Error, probe),
            429 => None,
            _ => router.succeeded(sent.worker, probe),
        };
        proxy::report(ctx, sent.worker, t);
        let sse = head
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        sent.status = Some(status);
        sent.watch = Some(UsageWatch::new(sse, false));
        let route = ctx.plan().route.label();
        let answer = envoy::response_headers(&[("x-mmrouter-route", route), ("x-mmrouter-worker", worker.name())]);
        if h.end_of_stream {
            self.finish(Outcome::Complete);
        }
        answer
    }

    /// A response body chunk: watched for `usage`, passed on unchanged.
    fn response_body(&mut self, b: HttpBody) -> ProcessingResponse {
        if let Some(watch) = self.sent.as_mut().and_then(|s| s.watch.as_mut()) {
            watch.feed(&b.body);
        }
        if b.end_of_stream {
            self.finish(Outcome::Complete);
        }
        envoy::response_body()
    }

    /// The request's end: observed once (drift, unseen tokens, the worker's record), load released.
    fn finish(&mut self, outcome: Outcome) {
        let (Some(ctx), Some(mut sent)) = (self.ctx.take(), self.sent.take()) else { return };
        let complete = outcome == Outcome::Complete && sent.status.is_some();
        let usage = if complete { sent.watch.as_mut().and_then(|w| w.finish().prompt_tokens) } else { None };
        let outcome = if complete { outcome } else { Outcome::Cancelled };
        // No response head: the client or the gateway went away first (nginx's 499).
        let status = sent.status.unwrap_or(StatusCode::from_u16(499).expect("a valid status"));
        let end = EndReport { outcome, usage_prompt_tokens: usage, usage_cached_tokens: None, response_id: None };
        proxy::ended(&self.shared.st, ctx, (sent.worker, status), end);
        drop(sent.guard);
        self.release();
    }

    fn release(&mut self) {
        if std::mem::take(&mut self.counted) {
            self.shared.inflight.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        self.finish(Outcome::Cancelled);
        self.release();
    }
}

/// The gateway went down the list: the load and the blocks move to the endpoint that served.
fn move_to_served(ctx: &mut Ctx, sent: &mut Sent, served: &str) {
    let router = ctx.pool().router.clone();
    let candidates = ctx.decision.as_ref().map(|d| d.candidates.clone()).unwrap_or_default();
    let found = candidates.into_iter().find(|&w| envoy::endpoint_of(router.worker(w).url()).as_deref() == Some(served));
    if let Some(w) = found.filter(|&w| w != sent.worker) {
        sent.guard = proxy::dispatch(ctx, w, false);
        sent.worker = w;
        // The pick's admission is not this worker's.
        sent.admission = None;
    }
}
