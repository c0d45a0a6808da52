//! Load generator (`mmrouter loadgen`) and multimodal workload generator (`mmrouter workload`).
//!
//! `run` replays a JSONL workload (see [`workload`] for the format and how `generate_workload`
//! builds one) against one or more base URLs, and reports latency and time-to-first-byte
//! percentiles, errors by status, throughput, the prompt/cached tokens from each answer's `usage`
//! (cached ratio = Σcached / Σprompt) and the counts of mmrouter's `x-mmrouter-route` and
//! `x-mmrouter-worker` response headers.
//!
//! Scheduling:
//! * closed loop (`--concurrency N`, the default with N = 8): N requests in flight; each slot takes
//!   the earliest line of the file whose conversation has no request in flight, so a
//!   conversation's turn k+1 starts only after turn k ended. Requests carry their full history, so
//!   they are otherwise independent.
//! * open loop (`--rate R`): line i is due at i/R seconds; if the conversation's previous turn is
//!   still in flight it is sent as soon as that one ends. Latency is measured from the actual send.
//! * several `--url`s are used round-robin per request (a "direct" baseline without a router).
//!
//! A run ends when the workload is exhausted, `--max-requests` were sent or `--duration-secs`
//! passed (requests in flight are waited for, each bounded by `--timeout-secs`).

mod client;
mod error;
mod png;
mod stats;
mod texts;
mod workload;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::sync::{oneshot, Notify};

pub use error::LoadgenError;
pub use stats::Summary;
pub use workload::{generate_workload, WorkloadOptions, WorkloadShape, FALLBACK_MIN_PIXELS};

use client::Outcome;

/// A reqwest client builder with the rustls ring provider installed (reqwest is built without a
/// bundled provider in this workspace; building a client without one would panic).
fn client_builder() -> reqwest::ClientBuilder {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Err means another provider is already installed, which serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
    reqwest::Client::builder()
}

/// Options of `mmrouter loadgen`.
#[derive(clap::Args, Clone, Debug)]
pub struct LoadgenOptions {
    /// Base URL (e.g. http://127.0.0.1:8080); repeat to spread requests round-robin over several.
    #[arg(long = "url", required = true)]
    pub urls: Vec<String>,
    /// JSONL workload (`mmrouter workload`).
    #[arg(long)]
    pub workload: PathBuf,
    /// Closed loop: requests in flight (default 8 when --rate is not given).
    #[arg(long, conflicts_with = "rate")]
    pub concurrency: Option<usize>,
    /// Open loop: requests per second.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Stop sending new requests after this many seconds.
    #[arg(long)]
    pub duration_secs: Option<f64>,
    /// Stop after sending this many requests.
    #[arg(long)]
    pub max_requests: Option<usize>,
    /// Start at this line of the workload (so successive runs against one router send new requests).
    #[arg(long, default_value_t = 0)]
    pub skip: usize,
    /// Per-request timeout (whole response).
    #[arg(long, default_value_t = 120.0)]
    pub timeout_secs: f64,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
    /// Also write one JSON line per request sent to this file, in send order: its workload line,
    /// conversation, send time and latency (ms from the run's start), status, route, worker and usage
    /// (to compare where two runs of one workload differ, request by request).
    #[arg(long)]
    pub requests_out: Option<PathBuf>,
    /// Name of this run in the report.
    #[arg(long, default_value = "run")]
    pub label: String,
    /// Extra request header `NAME: VALUE` (repeatable).
    #[arg(long = "header")]
    pub headers: Vec<String>,
}

impl LoadgenOptions {
    /// Options with defaults for `urls` and `workload`.
    pub fn new(urls: Vec<String>, workload: PathBuf) -> LoadgenOptions {
        LoadgenOptions {
            urls,
            workload,
            concurrency: None,
            rate: None,
            duration_secs: None,
            max_requests: None,
            skip: 0,
            timeout_secs: 120.0,
            json_out: None,
            requests_out: None,
            label: "run".into(),
            headers: Vec::new(),
        }
    }
}

/// The result of a run (printable as a table row, serialisable as JSON).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Report {
    pub label: String,
    /// `closed(N)` or `open(R/s)`.
    pub mode: String,
    /// Requests sent.
    pub requests: u64,
    /// Requests answered 2xx with a complete body.
    pub ok: u64,
    /// Failures by `http_<status>` or failure label (`timeout`, `connect`, `transport`).
    pub errors: BTreeMap<String, u64>,
    /// From the first send to the last answer.
    pub duration_secs: f64,
    /// `ok / duration_secs`.
    pub throughput_rps: f64,
    /// Latency of successful requests, milliseconds.
    pub latency_ms: Summary,
    /// Time to the first body byte of successful requests, milliseconds.
    pub ttfb_ms: Summary,
    /// Σ `usage.prompt_tokens` over successful requests.
    pub prompt_tokens: u64,
    /// Σ `usage.prompt_tokens_details.cached_tokens`.
    pub cached_tokens: u64,
    /// `cached_tokens / prompt_tokens` (0 when no prompt tokens were reported).
    pub cached_ratio: f64,
    /// Successful answers without a readable `usage`.
    pub usage_missing: u64,
    /// Counts of `x-mmrouter-route` values (`-` when absent).
    pub routes: BTreeMap<String, u64>,
    /// Counts of `x-mmrouter-worker` values (`-` when absent).
    pub workers: BTreeMap<String, u64>,
    /// Prompt and cached tokens by `x-mmrouter-route` value (where a route's cache hits come from:
    /// exact plans against fallbacks).
    #[serde(default)]
    pub route_tokens: BTreeMap<String, Tokens>,
}

/// Σ of `usage` over some answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tokens {
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

impl Report {
    /// Markdown table header matching [`Report::table_row`].
    pub fn table_header() -> String {
        "| run | mode | ok/sent | errors | req/s | p50 ms | p99 ms | ttfb p50 | ttfb p99 | cached | routes |\n\
         |---|---|---|---|---|---|---|---|---|---|---|"
            .to_string()
    }

    /// One markdown table row.
    pub fn table_row(&self) -> String {
        let ms = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"));
        let map = |m: &BTreeMap<String, u64>| {
            if m.is_empty() {
                "-".to_string()
            } else {
                m.iter().map(|(k, v)| format!("{k}:{v}")).collect::<Vec<_>>().join(" ")
            }
        };
        format!(
            "| {} | {} | {}/{} | {} | {:.2} | {} | {} | {} | {} | {:.1}% | {} |",
            self.label,
            self.mode,
            self.ok,
            self.requests,
            map(&self.errors),
            self.throughput_rps,
            ms(self.latency_ms.p50),
            ms(self.latency_ms.p99),
            ms(self.ttfb_ms.p50),
            ms(self.ttfb_ms.p99),
            100.0 * self.cached_ratio,
            map(&self.routes),
        )
    }

    /// Header, separator and this run's row.
    pub fn table(&self) -> String {
        format!("{}\n{}", Report::table_header(), self.table_row())
    }
}

/// One request of the workload, ready to send.
struct Request {
    conversation: Arc<str>,
    path: String,
    body: Bytes,
}

#[derive(Deserialize)]
struct Line<'a> {
    path: String,
    conversation: serde_json::Value,
    #[serde(borrow)]
    body: &'a RawValue,
}

fn load_workload(path: &Path) -> Result<Vec<Request>, LoadgenError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadgenError::Read { path: path.into(), source })?;
    let mut ids: HashMap<String, Arc<str>> = HashMap::new();
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        if raw.trim().is_empty() {
            continue;
        }
        let bad = |reason: String| LoadgenError::WorkloadLine { path: path.into(), line: i + 1, reason };
        let line: Line = serde_json::from_str(raw).map_err(|e| bad(e.to_string()))?;
        if !line.path.starts_with('/') {
            return Err(bad(format!("path {:?} does not start with '/'", line.path)));
        }
        let key = match line.conversation {
            serde_json::Value::String(s) => s,
            serde_json::Value::Number(n) => n.to_string(),
            other => return Err(bad(format!("conversation {other} is not a string or number"))),
        };
        let conversation = ids.entry(key).or_insert_with_key(|k| Arc::from(k.as_str())).clone();
        // The body is sent exactly as written in the file.
        let body = Bytes::copy_from_slice(line.body.get().as_bytes());
        out.push(Request { conversation, path: line.path, body });
    }
    if out.is_empty() {
        return Err(LoadgenError::EmptyWorkload { path: path.into() });
    }
    Ok(out)
}

fn base_urls(urls: &[String]) -> Result<Vec<String>, LoadgenError> {
    if urls.is_empty() {
        return Err(LoadgenError::InvalidOption { option: "url", reason: "at least one is required".into() });
    }
    urls.iter()
        .map(|u| {
            if !(u.starts_with("http://") || u.starts_with("https://")) {
                return Err(LoadgenError::BadUrl {
                    url: u.clone(),
                    reason: "must start with http:// or https://".into(),
                });
            }
            Ok(u.trim_end_matches('/').to_string())
        })
        .collect()
}

fn parse_headers(headers: &[String]) -> Result<Vec<(String, String)>, LoadgenError> {
    headers
        .iter()
        .map(|h| match h.split_once(':') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
            _ => Err(LoadgenError::InvalidOption { option: "header", reason: format!("{h:?} is not NAME: VALUE") }),
        })
        .collect()
}

fn positive_secs(option: &'static str, v: f64) -> Result<Duration, LoadgenError> {
    if v.is_finite() && v > 0.0 && v < 1e9 {
        Ok(Duration::from_secs_f64(v))
    } else {
        Err(LoadgenError::InvalidOption { option, reason: format!("{v} is not a positive number of seconds") })
    }
}

/// Everything a sending task needs.
struct Shared {
    client: reqwest::Client,
    urls: Vec<String>,
    headers: Vec<(String, String)>,
    next_url: AtomicUsize,
    requests: Vec<Request>,
    start: Instant,
    outcomes: Mutex<Vec<Sent>>,
}

/// One request's outcome, with which request it was and when it was sent.
struct Sent {
    /// Index into [`Shared::requests`].
    request: usize,
    /// Since the run's start.
    at: Duration,
    outcome: Outcome,
}

impl Shared {
    async fn execute(&self, i: usize) {
        let req = &self.requests[i];
        let n = self.next_url.fetch_add(1, Ordering::Relaxed) % self.urls.len();
        let url = format!("{}{}", self.urls[n], req.path);
        let at = self.start.elapsed();
        let outcome = client::execute(&self.client, &url, &self.headers, req.body.clone()).await;
        if let Ok(mut o) = self.outcomes.lock() {
            o.push(Sent { request: i, at, outcome });
        }
    }
}

/// Limits on how much of the workload a run sends.
struct Stop {
    deadline: Option<Instant>,
    max_requests: usize,
}

impl Stop {
    fn reached(&self, sent: usize) -> bool {
        sent >= self.max_requests || self.deadline.is_some_and(|d| Instant::now() >= d)
    }
}

/// Closed-loop picker: the earliest unsent line whose conversation has nothing in flight.
struct Scheduler {
    sent: Vec<bool>,
    first_unsent: usize,
    busy: HashSet<Arc<str>>,
    issued: usize,
}

enum Pick {
    Go(usize),
    Wait,
    Done,
}

impl Scheduler {
    fn pick(&mut self, requests: &[Request], stop: &Stop) -> Pick {
        while self.first_unsent < self.sent.len() && self.sent[self.first_unsent] {
            self.first_unsent += 1;
        }
        if self.first_unsent >= self.sent.len() || stop.reached(self.issued) {
            return Pick::Done;
        }
        let ready = (self.first_unsent..self.sent.len())
            .find(|&i| !self.sent[i] && !self.busy.contains(&requests[i].conversation));
        match ready {
            Some(i) => {
                self.sent[i] = true;
                self.busy.insert(requests[i].conversation.clone());
                self.issued += 1;
                Pick::Go(i)
            }
            None => Pick::Wait,
        }
    }
}

async fn closed_loop(shared: Arc<Shared>, concurrency: usize, stop: Stop) {
    let n = shared.requests.len();
    let sched =
        Arc::new(Mutex::new(Scheduler { sent: vec![false; n], first_unsent: 0, busy: HashSet::new(), issued: 0 }));
    let notify = Arc::new(Notify::new());
    let stop = Arc::new(stop);
    let mut tasks = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let (shared, sched, notify, stop) = (shared.clone(), sched.clone(), notify.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                // Registered before looking, so a completion between the look and the wait is not missed.
                let notified = notify.notified();
                let pick = match sched.lock() {
                    Ok(mut s) => s.pick(&shared.requests, &stop),
                    Err(_) => Pick::Done,
                };
                match pick {
                    Pick::Done => break,
                    Pick::Wait => notified.await,
                    Pick::Go(i) => {
                        shared.execute(i).await;
                        if let Ok(mut s) = sched.lock() {
                            s.busy.remove(&shared.requests[i].conversation);
                        }
                        notify.notify_waiters();
                    }
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

async fn open_loop(shared: Arc<Shared>, rate: f64, stop: Stop) {
    let start = tokio::time::Instant::now();
    let mut previous: HashMap<Arc<str>, oneshot::Receiver<()>> = HashMap::new();
    let mut tasks = Vec::new();
    for i in 0..shared.requests.len() {
        let due = start + Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until(due).await;
        if stop.reached(i) {
            break;
        }
        let (done_tx, done_rx) = oneshot::channel::<()>();
        let before = previous.insert(shared.requests[i].conversation.clone(), done_rx);
        let shared = shared.clone();
        tasks.push(tokio::spawn(async move {
            if let Some(before) = before {
                // An error only means the previous turn's task ended without signalling: go on.
                let _ = before.await;
            }
            shared.execute(i).await;
            drop(done_tx);
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// Replays the workload as `opts` says and returns the report (also written to `--json-out`).
pub async fn run(opts: LoadgenOptions) -> anyhow::Result<Report> {
    Ok(run_typed(opts).await?)
}

async fn run_typed(opts: LoadgenOptions) -> Result<Report, LoadgenError> {
    let urls = base_urls(&opts.urls)?;
    let headers = parse_headers(&opts.headers)?;
    let timeout = positive_secs("timeout-secs", opts.timeout_secs)?;
    let deadline = opts.duration_secs.map(|d| positive_secs("duration-secs", d)).transpose()?;
    if let Some(r) = opts.rate {
        positive_secs("rate", 1.0 / r).map_err(|_| LoadgenError::InvalidOption {
            option: "rate",
            reason: format!("{r} is not a positive request rate"),
        })?;
    }
    let concurrency = opts.concurrency.unwrap_or(8);
    if concurrency == 0 {
        return Err(LoadgenError::InvalidOption { option: "concurrency", reason: "must be at least 1".into() });
    }
    let mut requests = load_workload(&opts.workload)?;
    if opts.skip >= requests.len() {
        return Err(LoadgenError::InvalidOption {
            option: "skip",
            reason: format!("{} skips all {} requests of the workload", opts.skip, requests.len()),
        });
    }
    requests.drain(..opts.skip);
    let client = client_builder()
        .timeout(timeout)
        .no_proxy()
        .pool_max_idle_per_host(concurrency.max(64))
        .tcp_nodelay(true)
        .build()
        .map_err(|e| LoadgenError::Client(e.to_string()))?;
    let shared = Arc::new(Shared {
        client,
        urls,
        headers,
        next_url: AtomicUsize::new(0),
        requests,
        start: Instant::now(),
        outcomes: Mutex::new(Vec::new()),
    });

    let start = shared.start;
    let stop = Stop { deadline: deadline.map(|d| start + d), max_requests: opts.max_requests.unwrap_or(usize::MAX) };
    let mode = match opts.rate {
        Some(rate) => {
            open_loop(shared.clone(), rate, stop).await;
            format!("open({rate}/s)")
        }
        None => {
            closed_loop(shared.clone(), concurrency, stop).await;
            format!("closed({concurrency})")
        }
    };
    let elapsed = start.elapsed();
    let mut sent = shared.outcomes.lock().map(|mut o| std::mem::take(&mut *o)).unwrap_or_default();
    let outcomes: Vec<&Outcome> = sent.iter().map(|s| &s.outcome).collect();
    let report = summarise(&opts.label, mode, &outcomes, elapsed);
    let write = |path: &PathBuf, bytes: Vec<u8>| {
        std::fs::write(path, bytes).map_err(|source| LoadgenError::Write { path: path.clone(), source })
    };
    if let Some(path) = &opts.json_out {
        let json = serde_json::to_vec_pretty(&report)
            .map_err(|e| LoadgenError::Write { path: path.clone(), source: e.into() })?;
        write(path, json)?;
    }
    if let Some(path) = &opts.requests_out {
        sent.sort_by_key(|s| s.at);
        write(path, request_lines(&sent, &shared.requests, opts.skip))?;
    }
    Ok(report)
}

/// `--requests-out`: one JSON object per line and request, in send order.
fn request_lines(sent: &[Sent], requests: &[Request], skip: usize) -> Vec<u8> {
    let ms = |d: Duration| (d.as_secs_f64() * 1e6).round() / 1e3;
    let mut out = Vec::new();
    for s in sent {
        let (status, route, worker, usage) = match &s.outcome.result {
            Ok(a) => ("ok".to_string(), a.route.as_deref(), a.worker.as_deref(), a.usage),
            Err(e) => (e.report_key(), None, None, None),
        };
        let line = serde_json::json!({
            "line": skip + s.request + 1,
            "conversation": &*requests[s.request].conversation,
            "at_ms": ms(s.at),
            "latency_ms": ms(s.outcome.latency),
            "status": status,
            "route": route,
            "worker": worker,
            "prompt_tokens": usage.map(|u| u.prompt_tokens),
            "cached_tokens": usage.map(|u| u.cached_tokens),
        });
        out.extend_from_slice(line.to_string().as_bytes());
        out.push(b'\n');
    }
    out
}

fn summarise(label: &str, mode: String, outcomes: &[&Outcome], elapsed: Duration) -> Report {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mut errors = BTreeMap::new();
    let mut routes = BTreeMap::new();
    let mut workers = BTreeMap::new();
    let mut route_tokens: BTreeMap<String, Tokens> = BTreeMap::new();
    let (mut latency, mut ttfb) = (Vec::new(), Vec::new());
    let (mut ok, mut prompt, mut cached, mut usage_missing) = (0u64, 0u64, 0u64, 0u64);
    for &o in outcomes {
        match &o.result {
            Err(e) => *errors.entry(e.report_key()).or_insert(0) += 1,
            Ok(a) => {
                ok += 1;
                latency.push(ms(o.latency));
                if let Some(t) = o.ttfb {
                    ttfb.push(ms(t));
                }
                let route = a.route.clone().unwrap_or_else(|| "-".into());
                match a.usage {
                    Some(u) => {
                        prompt = prompt.saturating_add(u.prompt_tokens);
                        cached = cached.saturating_add(u.cached_tokens);
                        let t = route_tokens.entry(route.clone()).or_default();
                        t.prompt_tokens = t.prompt_tokens.saturating_add(u.prompt_tokens);
                        t.cached_tokens = t.cached_tokens.saturating_add(u.cached_tokens);
                    }
                    None => usage_missing += 1,
                }
                *routes.entry(route).or_insert(0) += 1;
                *workers.entry(a.worker.clone().unwrap_or_else(|| "-".into())).or_insert(0) += 1;
            }
        }
    }
    let secs = elapsed.as_secs_f64();
    Report {
        label: label.to_string(),
        mode,
        requests: outcomes.len() as u64,
        ok,
        errors,
        duration_secs: secs,
        throughput_rps: if secs > 0.0 { ok as f64 / secs } else { 0.0 },
        latency_ms: Summary::of(latency),
        ttfb_ms: Summary::of(ttfb),
        prompt_tokens: prompt,
        cached_tokens: cached,
        cached_ratio: if prompt > 0 { cached as f64 / prompt as f64 } else { 0.0 },
        usage_missing,
        routes,
        workers,
        route_tokens,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use client::{Answer, Usage};
    use error::RequestError;

    fn ok(ms: u64, prompt: u64, cached: u64, route: Option<&str>) -> Outcome {
        Outcome {
            latency: Duration::from_millis(ms),
            ttfb: Some(Duration::from_millis(ms / 2)),
            result: Ok(Answer {
                usage: Some(Usage { prompt_tokens: prompt, cached_tokens: cached }),
                route: route.map(String::from),
                worker: Some("w0".into()),
            }),
        }
    }

    #[test]
    fn summary_counts_errors_routes_and_cached_ratio() {
        let outcomes = [
            ok(10, 100, 50, Some("exact")),
            ok(30, 300, 0, Some("text_prefix")),
            ok(20, 0, 0, None),
            Outcome { latency: Duration::from_millis(5), ttfb: None, result: Err(RequestError::Status(503)) },
            Outcome { latency: Duration::from_millis(5), ttfb: None, result: Err(RequestError::Timeout) },
        ];
        let r = summarise("t", "closed(1)".into(), &outcomes.iter().collect::<Vec<_>>(), Duration::from_secs(2));
        assert_eq!((r.requests, r.ok), (5, 3));
        assert_eq!(r.errors.get("http_503"), Some(&1));
        assert_eq!(r.errors.get("timeout"), Some(&1));
        assert_eq!((r.prompt_tokens, r.cached_tokens), (400, 50));
        assert!((r.cached_ratio - 0.125).abs() < 1e-12);
        assert!((r.throughput_rps - 1.5).abs() < 1e-12);
        assert_eq!(r.latency_ms.p50, Some(20.0));
        assert_eq!(r.ttfb_ms.max, Some(15.0));
        assert_eq!(r.routes.get("exact"), Some(&1));
        assert_eq!(r.routes.get("-"), Some(&1));
        assert_eq!(r.workers.get("w0"), Some(&3));
        assert_eq!(r.route_tokens.get("exact"), Some(&Tokens { prompt_tokens: 100, cached_tokens: 50 }));
        assert_eq!(r.route_tokens.get("text_prefix"), Some(&Tokens { prompt_tokens: 300, cached_tokens: 0 }));
        assert!(r.table_row().contains("| 3/5 |"), "{}", r.table_row());
    }

    #[test]
    fn request_lines_name_each_request_its_answer_and_usage() {
        let sent = vec![
            Sent { request: 1, at: Duration::from_micros(1_500), outcome: ok(10, 100, 50, Some("exact")) },
            Sent {
                request: 0,
                at: Duration::from_millis(3),
                outcome: Outcome { latency: Duration::from_millis(5), ttfb: None, result: Err(RequestError::Timeout) },
            },
        ];
        let text = String::from_utf8(request_lines(&sent, &requests(&["a", "b"]), 10)).expect("utf-8");
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).expect("json")).collect();
        assert_eq!(lines.len(), 2);
        let first = serde_json::json!({"line": 12, "conversation": "b", "at_ms": 1.5, "latency_ms": 10.0,
            "status": "ok", "route": "exact", "worker": "w0", "prompt_tokens": 100, "cached_tokens": 50});
        assert_eq!(lines[0], first);
        assert_eq!((lines[1]["line"].as_u64(), lines[1]["status"].as_str()), (Some(11), Some("timeout")));
        assert!(lines[1]["cached_tokens"].is_null() && lines[1]["worker"].is_null());
    }

    fn requests(convs: &[&str]) -> Vec<Request> {
        convs
            .iter()
            .map(|c| Request { conversation: Arc::from(*c), path: "/v1/chat/completions".into(), body: Bytes::new() })
            .collect()
    }

    #[test]
    fn scheduler_keeps_conversation_order() {
        let reqs = requests(&["a", "a", "b", "a", "c"]);
        let stop = Stop { deadline: None, max_requests: usize::MAX };
        let mut s = Scheduler { sent: vec![false; reqs.len()], first_unsent: 0, busy: HashSet::new(), issued: 0 };
        let go = |p: Pick| match p {
            Pick::Go(i) => Some(i),
            _ => None,
        };
        assert_eq!(go(s.pick(&reqs, &stop)), Some(0));
        // "a" is in flight: its turn 2 waits, "b" and "c" go.
        assert_eq!(go(s.pick(&reqs, &stop)), Some(2));
        assert_eq!(go(s.pick(&reqs, &stop)), Some(4));
        assert!(matches!(s.pick(&reqs, &stop), Pick::Wait));
        s.busy.remove("a");
        assert_eq!(go(s.pick(&reqs, &stop)), Some(1));
        s.busy.clear();
        assert_eq!(go(s.pick(&reqs, &stop)), Some(3));
        assert!(matches!(s.pick(&reqs, &stop), Pick::Done));
    }

    #[test]
    fn scheduler_stops_at_max_requests() {
        let reqs = requests(&["a", "b", "c"]);
        let stop = Stop { deadline: None, max_requests: 2 };
        let mut s = Scheduler { sent: vec![false; 3], first_unsent: 0, busy: HashSet::new(), issued: 0 };
        assert!(matches!(s.pick(&reqs, &stop), Pick::Go(0)));
        assert!(matches!(s.pick(&reqs, &stop), Pick::Go(1)));
        assert!(matches!(s.pick(&reqs, &stop), Pick::Done));
    }

    #[derive(clap::Parser, Debug)]
    struct LoadgenCli {
        #[command(flatten)]
        o: LoadgenOptions,
    }

    #[derive(clap::Parser, Debug)]
    struct WorkloadCli {
        #[command(flatten)]
        o: WorkloadOptions,
    }

    #[test]
    fn command_lines_parse() {
        use clap::Parser;
        let c =
            LoadgenCli::try_parse_from(["x", "--url", "http://a:1", "--url", "http://b:2", "--workload", "w.jsonl"])
                .expect("parse");
        assert_eq!(c.o.urls.len(), 2);
        assert_eq!(c.o.concurrency, None);
        let both = ["x", "--url", "http://a", "--workload", "w", "--rate", "5", "--concurrency", "2"];
        assert!(LoadgenCli::try_parse_from(both).is_err(), "--rate and --concurrency conflict");
        assert!(LoadgenCli::try_parse_from(["x", "--workload", "w"]).is_err(), "--url is required");

        // `with_out` gives the command line's defaults.
        let w = WorkloadCli::try_parse_from(["x", "--out", "w.jsonl"]).expect("parse").o;
        let d = WorkloadOptions::with_out("w.jsonl".into());
        assert_eq!(format!("{w:?}"), format!("{d:?}"));
    }

    #[test]
    fn options_are_checked() {
        assert_eq!(base_urls(&["localhost:80".into()]).map_err(|e| e.label()).err(), Some("bad_url"));
        assert_eq!(base_urls(&["http://h:1/".into()]).ok(), Some(vec!["http://h:1".to_string()]));
        assert_eq!(
            parse_headers(&["authorization: Bearer x".into()]).ok(),
            Some(vec![("authorization".into(), "Bearer x".into())])
        );
        assert_eq!(parse_headers(&["nocolon".into()]).map_err(|e| e.label()).err(), Some("invalid_option"));
        assert!(positive_secs("x", 0.0).is_err());
        assert!(positive_secs("x", f64::NAN).is_err());
    }
}
