//! The checks of one worker, in order: reachable → engine → served model → cache config → KV events
//! (found, bound) → per probe: render ids, prompt tokens → events flowing, uuid named → cached tokens
//! after a repeat. Each check adds one line; a check that cannot run says why (skip). Every answer is
//! read under its cap and parsed into the typed fields below (`http.rs`).

use std::time::Duration;

use mmrouter_core::pipeline::{splice_uuids, Pipeline, Planned, Route};
use mmrouter_core::request::{Endpoint, Request};
use mmrouter_core::routing::{Engine, Role};
use serde::Deserialize;

use super::events::{bound, Listener, Seen};
use super::http::{Expect, HttpError, WorkerHttp};
use super::probe::{probes, Probe};
use super::report::Checks;
use crate::config::{EventSource, KvEventsSection, PoolSettings, WorkerSettings};

/// A pool's pipeline, built when the first of its workers reaches the probes: the model's tokenizer
/// is most of doctor's memory (~190 MiB for a bundled Qwen profile), which a worker failing its
/// first checks — unreachable, or answering megabytes of junk — never needs.
pub struct LazyPipeline<'a> {
    pool: &'a PoolSettings,
    built: std::sync::OnceLock<Result<Pipeline, String>>,
}

impl<'a> LazyPipeline<'a> {
    pub fn new(pool: &'a PoolSettings) -> LazyPipeline<'a> {
        LazyPipeline { pool, built: std::sync::OnceLock::new() }
    }

    fn get(&self) -> Result<&Pipeline, &str> {
        let built = self.built.get_or_init(|| Pipeline::new(&self.pool.pipeline).map_err(|e| e.to_string()));
        built.as_ref().map_err(String::as_str)
    }
}

/// What every worker of a pool is checked against.
#[derive(Clone, Copy)]
pub struct Scope<'a> {
    pub pool: &'a PoolSettings,
    pub pipeline: &'a LazyPipeline<'a>,
    pub limits: &'a KvEventsSection,
    pub timeout: Duration,
}

/// How long the publisher gets to announce what the probes stored.
const EVENTS_WITHIN: Duration = Duration::from_secs(5);
const CONNECT_WITHIN: Duration = Duration::from_secs(3);

/// A probe as the router plans and forwards it.
struct Sent {
    name: &'static str,
    body: Vec<u8>,
    planned: Planned,
}

/// `/version` (vLLM) or `/server_info` (SGLang): only the version is read.
#[derive(Deserialize)]
struct VersionAnswer {
    version: Option<String>,
}

/// `/v1/models`: the served names.
#[derive(Deserialize)]
struct ModelList {
    #[serde(default)]
    data: Vec<ModelEntry>,
}

#[derive(Deserialize)]
struct ModelEntry {
    id: Option<String>,
}

/// vLLM's render answer: the token ids and the image placeholders' ranges (the pixels are skipped).
#[derive(Deserialize)]
struct RenderAnswer {
    #[serde(default)]
    token_ids: Vec<u32>,
    features: Option<RenderFeatures>,
}

#[derive(Deserialize)]
struct RenderFeatures {
    mm_placeholders: Option<Placeholders>,
}

#[derive(Deserialize)]
struct Placeholders {
    #[serde(default)]
    image: Vec<Placeholder>,
}

#[derive(Deserialize)]
struct Placeholder {
    offset: u64,
    length: u64,
}

/// A chat answer: only its `usage`.
#[derive(Deserialize)]
struct ChatAnswer {
    usage: Option<Usage>,
}

#[derive(Deserialize, Default)]
struct Usage {
    prompt_tokens: Option<u64>,
    prompt_tokens_details: Option<TokenDetails>,
}

#[derive(Deserialize)]
struct TokenDetails {
    cached_tokens: Option<u64>,
}

/// Checks one worker, adding its lines to `c` as they are found: the caller's deadline may stop this
/// between any two, and the lines found so far still count.
pub async fn worker(scope: &Scope<'_>, w: &WorkerSettings, c: &mut Checks) {
    let http = match WorkerHttp::new(&w.spec.url, scope.timeout) {
        Ok(http) => http,
        Err(e) => return c.fail("reachable", e.to_string(), "check the worker's URL"),
    };
    if super::roles::has_roles(scope.pool) {
        super::roles::role(c, w);
    }
    if !reachable(c, &http).await {
        return;
    }
    engine(c, &http, w.spec.engine).await;
    let model = served_model(c, &http, scope.pool).await;
    cache_config(c, &http, w, scope.pool.pipeline.model.block_size).await;
    let listener = kv_events(c, w, scope.limits).await;
    let Some(model) = model else {
        return c.skip("probes", "no model to send the probe chats to");
    };
    let pipeline = match scope.pipeline.get() {
        Ok(p) => p,
        Err(e) => {
            return c.fail("probes", format!("the pool's model does not load: {e}"), "see the pool's [model] settings")
        }
    };
    let nonce = format!("{:016x}", rand::random::<u64>());
    let mut image = None;
    for probe in probes(&model, &nonce) {
        if let Some(sent) = probe_once(c, (&http, w.spec.engine), pipeline, probe).await {
            if sent.name == "image" {
                image = Some(sent);
            }
        }
    }
    if let Some(listener) = &listener {
        events_seen(c, listener, image.as_ref(), (w.spec.engine, scope.pool.pipeline.model.block_size)).await;
    }
    if w.spec.role == Role::Encode {
        return c.skip("cached_tokens", ENCODER_CACHES_NO_PREFIX);
    }
    cached_tokens(c, &http, image.as_ref()).await;
}

/// Why an encode worker's prefix caching is not checked.
const ENCODER_CACHES_NO_PREFIX: &str = "an encode worker runs with --no-enable-prefix-caching (docs/disaggregated.md)";

async fn reachable(c: &mut Checks, http: &WorkerHttp) -> bool {
    let started = std::time::Instant::now();
    match http.get("/health", Expect::Json).await {
        Ok(a) if a.is_success() => {
            c.ok("reachable", format!("/health {} in {} ms", a.status, started.elapsed().as_millis()));
            true
        }
        Ok(a) => {
            c.fail("reachable", a.excerpt(), "the worker is up but not healthy: see its log (still loading?)");
            false
        }
        Err(e) => {
            c.fail("reachable", e.to_string(), "start the worker, or fix its url (and the network path to it)");
            false
        }
    }
}

async fn engine(c: &mut Checks, http: &WorkerHttp, engine: Engine) {
    let path = match engine {
        Engine::Vllm => "/version",
        Engine::Sglang => "/server_info",
    };
    match http.get_json::<VersionAnswer>(path).await {
        Ok(v) => match v.version {
            Some(version) => c.ok("engine", format!("{} {version}", engine_name(engine))),
            None => c.fail("engine", format!("{path} has no version"), wrong_engine(engine)),
        },
        Err(e) => c.fail("engine", format!("{path}: {e}"), wrong_engine(engine)),
    }
}

fn engine_name(engine: Engine) -> &'static str {
    match engine {
        Engine::Vllm => "vLLM",
        Engine::Sglang => "SGLang",
    }
}

fn wrong_engine(engine: Engine) -> String {
    format!("is this worker {}? set the worker's engine (vllm | sglang) to what it runs", engine_name(engine))
}

/// The model the probes use: the pool's first name the worker serves, or (a pool taking any model)
/// the worker's first.
async fn served_model(c: &mut Checks, http: &WorkerHttp, pool: &PoolSettings) -> Option<String> {
    let served: Vec<String> = match http.get_json::<ModelList>("/v1/models").await {
        Ok(list) => list.data.into_iter().filter_map(|m| m.id).collect(),
        Err(e) => {
            c.fail("served_model", format!("/v1/models: {e}"), "the worker must serve the OpenAI API under /v1");
            return None;
        }
    };
    c.served = Some(served.clone());
    if pool.models.is_empty() {
        let first = served.first().cloned();
        match &first {
            Some(m) => {
                c.ok("served_model", format!("serves {} (the pool takes any model; probes use {m})", served.join(", ")))
            }
            None => c.fail("served_model", "/v1/models lists no model", "the worker has not loaded a model"),
        }
        return first;
    }
    let missing: Vec<&str> = pool.models.iter().filter(|m| !served.contains(m)).map(String::as_str).collect();
    let detail = format!("serves [{}], pool routes [{}]", served.join(", "), pool.models.join(", "));
    c.check("served_model", missing.is_empty(), detail, || {
        format!(
            "requests for {} would fail here: add --served-model-name to the worker or fix the pool's models",
            missing.join(", ")
        )
    });
    pool.models.iter().find(|m| served.contains(m)).cloned()
}

/// Block size and prefix caching from vLLM's `vllm:cache_config_info` gauge.
async fn cache_config(c: &mut Checks, http: &WorkerHttp, w: &WorkerSettings, block_size: u32) {
    if w.spec.engine != Engine::Vllm {
        c.skip("block_size", "SGLang does not publish its cache config; check --page-size by hand");
        return;
    }
    let text = match http.get("/metrics", Expect::Metrics).await {
        Ok(a) if a.is_success() => String::from_utf8_lossy(&a.body).into_owned(),
        Ok(a) => return c.skip("block_size", format!("/metrics: {}", a.excerpt())),
        Err(e) => return c.skip("block_size", format!("/metrics: {e}")),
    };
    let Some(info) = text.lines().find(|l| l.starts_with("vllm:cache_config_info{")) else {
        return c.skip("block_size", "no vllm:cache_config_info in /metrics");
    };
    match label(info, "block_size").and_then(|b| b.parse::<u32>().ok()) {
        Some(b) => c.check("block_size", b == block_size, format!("worker {b}, pool {block_size}"), || {
            format!("block keys only match with equal block sizes: start the worker with --block-size {block_size}, or set the pool's [model] block_size = {b}")
        }),
        None => c.skip("block_size", "vllm:cache_config_info has no block_size"),
    }
    if w.spec.role == Role::Encode {
        return c.skip("prefix_caching", ENCODER_CACHES_NO_PREFIX);
    }
    let caching = label(info, "enable_prefix_caching");
    c.check(
        "prefix_caching",
        caching == Some("True"),
        format!("enable_prefix_caching={}", caching.unwrap_or("?")),
        || "start the worker with --enable-prefix-caching: without it nothing is reused".to_owned(),
    );
}

/// A Prometheus label's value in one exposition line.
fn label<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("{name}=\"");
    let at = line.find(&format!(",{key}")).map(|i| i + 1).or_else(|| line.find(&format!("{{{key}")).map(|i| i + 1))?;
    let rest = &line[at + key.len()..];
    rest.find('"').map(|end| &rest[..end])
}

/// Finds the worker's publishers, checks that each is bound, and subscribes.
async fn kv_events(c: &mut Checks, w: &WorkerSettings, limits: &KvEventsSection) -> Option<Listener> {
    let Some(source) = w.events.clone() else {
        c.skip("kv_events", "none configured: approximate routing (the router assumes what it routed is cached)");
        return None;
    };
    let configs = match source {
        EventSource::Discover => match crate::pools::discover_now(w, limits).await {
            Ok(configs) if !configs.is_empty() => configs,
            Ok(_) => {
                c.fail(
                    "kv_events",
                    "discovery names no publisher",
                    "start the worker with --kv-events-config (enable_kv_cache_events, publisher zmq)",
                );
                return None;
            }
            Err(e) => {
                c.fail("kv_events", format!("discovery: {e}"), "the worker's /kv_event_sources (vLLM) or /server_info (SGLang) must name its publisher on the worker's own host");
                return None;
            }
        },
        source => {
            crate::pools::resolve(w, source, limits, &crate::pools::Refusals::default()).await.unwrap_or_default()
        }
    };
    let endpoints: Vec<&str> = configs.iter().map(|f| f.endpoint.as_str()).collect();
    c.ok("kv_events", endpoints.join(", "));
    let mut all_bound = true;
    for cfg in &configs {
        if let Err(e) = bound(&cfg.endpoint, CONNECT_WITHIN).await {
            all_bound = false;
            c.fail("kv_events_bound", e, NOT_BOUND_HINT);
        }
    }
    if !all_bound {
        return None;
    }
    c.ok("kv_events_bound", "accepting connections");
    let listener =
        Listener::start(configs).map_err(|e| c.fail("kv_events_flowing", e, "fix the kv_events endpoint")).ok()?;
    if !listener.connected(CONNECT_WITHIN).await {
        c.fail(
            "kv_events_flowing",
            "no subscription established",
            "the endpoint accepts TCP but does not speak ZMTP: is it the publisher?",
        );
        return None;
    }
    Some(listener)
}

const NOT_BOUND_HINT: &str =
    "nothing listens there. vLLM binds its PUB socket only when the endpoint contains `*` or `::` and \
     connects out otherwise: start it with --kv-events-config endpoint tcp://*:PORT (all interfaces) or \
     tcp://[::ffff:HOST]:PORT (that IPv4 address only), and point kv_events at the worker's host";

/// Plans one probe as the router would, sends it as the router would forward it, and compares.
async fn probe_once(
    c: &mut Checks,
    (http, engine): (&WorkerHttp, Engine),
    pipeline: &Pipeline,
    probe: Probe,
) -> Option<Sent> {
    let (render_check, tokens_check) = check_names(probe.name);
    let planned = match plan(pipeline, &probe.body).await {
        Ok(p) => p,
        Err(e) => {
            c.fail(tokens_check, format!("the router cannot plan the probe: {e}"), "see the pool's [model] settings");
            return None;
        }
    };
    if let Route::TextPrefix { reason } = planned.plan.route {
        c.fail(
            tokens_check,
            format!("the router falls back ({reason}) on the probe"),
            "the pool cannot account this model's images: see docs/accounting.md, \"Token parity with vLLM\"",
        );
        return None;
    }
    let body = forwarded(&probe.body, &planned, engine);
    if engine == Engine::Vllm {
        render(c, http, render_check, (&body, &planned)).await;
    } else {
        c.skip(render_check, "SGLang has no render endpoint");
    }
    prompt_tokens(c, http, tokens_check, (&body, &planned)).await;
    Some(Sent { name: probe.name, body, planned })
}

fn check_names(probe: &str) -> (&'static str, &'static str) {
    match probe {
        "text" => ("render_text", "prompt_tokens_text"),
        "image" => ("render_image", "prompt_tokens_image"),
        _ => ("render_tools", "prompt_tokens_tools"),
    }
}

async fn plan(pipeline: &Pipeline, body: &[u8]) -> Result<Planned, String> {
    let request = Request::parse(Endpoint::Chat, body).map_err(|e| e.to_string())?;
    pipeline.plan_with(&request, true).await.map_err(|e| e.to_string())
}

/// What the router forwards: on the exact route to vLLM, each image part carries the router's uuid.
fn forwarded(body: &[u8], planned: &Planned, engine: Engine) -> Vec<u8> {
    let plan = &planned.plan;
    if engine == Engine::Vllm && plan.route == Route::Exact && plan.images.iter().any(|i| i.splice.is_some()) {
        splice_uuids(body, &plan.images)
    } else {
        body.to_vec()
    }
}

/// The worker's own token ids and image spans (vLLM's `/v1/chat/completions/render`) vs the router's.
async fn render(c: &mut Checks, http: &WorkerHttp, check: &'static str, (body, planned): (&[u8], &Planned)) {
    let answer = match http.post("/v1/chat/completions/render", body.to_vec(), Expect::Render).await {
        Ok(a) => a,
        Err(e) => return c.fail(check, e.to_string(), "the worker did not answer the render request"),
    };
    match answer.status {
        403 => {
            return c.fail(
                check,
                answer.excerpt(),
                "start vLLM with --enable-scale-out: its render endpoint is off otherwise",
            )
        }
        404 | 405 => return c.skip(check, format!("no render endpoint ({})", answer.status)),
        _ if !answer.is_success() => {
            return c.fail(check, answer.excerpt(), "the worker refuses a request the router accepts")
        }
        _ => {}
    }
    let v: RenderAnswer = match answer.parse() {
        Ok(v) => v,
        Err(e) => return c.fail(check, e.to_string(), "the render answer is not the JSON vLLM sends"),
    };
    let trace = planned.trace.as_ref().expect("planned with a trace");
    let theirs = v.token_ids;
    if let Some(at) = first_difference(&trace.ids, &theirs) {
        let show = |ids: &[u32]| format!("{:?}", &ids[at.min(ids.len())..(at + 5).min(ids.len())]);
        let detail = format!(
            "ids differ at {at} (router {} ids, worker {}): router {} vs worker {}",
            trace.ids.len(),
            theirs.len(),
            show(&trace.ids),
            show(&theirs)
        );
        return c.fail(check, detail, TEMPLATE_HINT);
    }
    let spans: Vec<(u64, u64)> = trace.spans.iter().map(|s| (u64::from(s.offset), u64::from(s.len))).collect();
    let placeholders: Vec<(u64, u64)> = v
        .features
        .and_then(|f| f.mm_placeholders)
        .map(|p| p.image.iter().map(|p| (p.offset, p.length)).collect())
        .unwrap_or_default();
    let detail = format!("{} ids equal, image spans router {spans:?} worker {placeholders:?}", theirs.len());
    c.check(check, spans == placeholders, detail, || {
        "same ids, different image ranges: the engine keys image blocks by its own ranges (see docs/accounting.md, \"Token parity with vLLM\")".to_owned()
    });
}

const TEMPLATE_HINT: &str = "the worker renders another prompt: give the pool the worker's chat template ([model] chat_template = \
     the file of its --chat-template), its --chat-template-content-format, and its --mm-processor-kwargs as processor_kwargs; \
     and serve both from the same model files";

fn first_difference(a: &[u32], b: &[u32]) -> Option<usize> {
    let common = a.iter().zip(b).position(|(x, y)| x != y);
    common.or_else(|| (a.len() != b.len()).then(|| a.len().min(b.len())))
}

/// `usage.prompt_tokens` of a real chat vs the router's count.
async fn prompt_tokens(c: &mut Checks, http: &WorkerHttp, check: &'static str, (body, planned): (&[u8], &Planned)) {
    let usage = match chat_usage(http, body).await {
        Ok(u) => u,
        Err(e) => return c.fail(check, e.to_string(), "the worker refuses a probe chat the router accepts"),
    };
    let (theirs, ours) = (usage.prompt_tokens, u64::from(planned.plan.prompt_tokens));
    let detail = format!("worker {}, router {ours}", theirs.map_or("?".to_owned(), |t| t.to_string()));
    c.check(check, theirs == Some(ours), detail, || {
        "the worker counts another prompt: see the render line; for images, processor_kwargs must mirror its --mm-processor-kwargs".to_owned()
    });
}

async fn chat_usage(http: &WorkerHttp, body: &[u8]) -> Result<Usage, HttpError> {
    let answer = http.post("/v1/chat/completions", body.to_vec(), Expect::Json).await?;
    if !answer.is_success() {
        return Err(HttpError::Status(answer.excerpt()));
    }
    Ok(answer.parse::<ChatAnswer>()?.usage.unwrap_or_default())
}

/// After the probes: the publisher announced blocks, of the pool's size, and named the image by the
/// router's uuid (vLLM only: SGLang's events carry no image identity).
async fn events_seen(c: &mut Checks, listener: &Listener, image: Option<&Sent>, (engine, block_size): (Engine, u32)) {
    let uuid = image.and_then(|s| s.planned.plan.images.first()).map(|i| i.hash.clone());
    let want_uuid = engine == Engine::Vllm && uuid.is_some();
    let seen = listener
        .wait(EVENTS_WITHIN, |s: &Seen| {
            s.stored_blocks > 0 && (!want_uuid || uuid.as_ref().is_some_and(|u| s.mm_ids.contains(u)))
        })
        .await;
    if seen.stored_blocks == 0 {
        return c.fail(
            "kv_events_flowing",
            format!("no stored block announced within {EVENTS_WITHIN:?} of the probes ({} batches)", seen.batches),
            "subscribed, but nothing arrives: check the publisher's topic (= kv_events_topic) and that prefix caching is on",
        );
    }
    let sizes: Vec<u32> = seen.block_sizes.iter().copied().collect();
    let detail = format!("{} batches, {} blocks stored, block size {sizes:?}", seen.batches, seen.stored_blocks);
    c.check("kv_events_flowing", sizes == [block_size], detail, || {
        format!("the worker's events carry blocks of {sizes:?} tokens, the pool expects {block_size}: make them equal")
    });
    match (want_uuid, uuid) {
        (true, Some(uuid)) => {
            let named = seen.mm_ids.contains(&uuid);
            c.check("uuid_in_events", named, format!("image {}… {}", &uuid[..12.min(uuid.len())], if named { "named by the router's uuid" } else { "not named" }), || {
                format!("the worker names images otherwise ({} ids seen): it must honour the image part's uuid (vLLM multimodal uuids)", seen.mm_ids.len())
            });
        }
        _ => c.skip("uuid_in_events", "no image probe to look for"),
    }
}

/// Repeats the image probe: vLLM reuses every full block but the one holding the last prompt token.
async fn cached_tokens(c: &mut Checks, http: &WorkerHttp, image: Option<&Sent>) {
    let Some(sent) = image else {
        return c.skip("cached_tokens", "no image probe to repeat");
    };
    let plan = &sent.planned.plan;
    let usage = match chat_usage(http, &sent.body).await {
        Ok(u) => u,
        Err(e) => return c.fail("cached_tokens", e.to_string(), "the worker refused the repeated probe"),
    };
    let Some(cached) = usage.prompt_tokens_details.and_then(|d| d.cached_tokens) else {
        return c.fail(
            "cached_tokens",
            "usage has no prompt_tokens_details.cached_tokens",
            "start vLLM with --enable-prompt-tokens-details",
        );
    };
    let bs = u64::from(plan.block_size);
    let expected = u64::from(plan.prompt_tokens).saturating_sub(1) / bs * bs;
    c.check("cached_tokens", cached == expected, format!("repeat of {} tokens: worker reused {cached}, router expects {expected}", plan.prompt_tokens), || {
        "the worker reuses another share of the prompt: check the block_size and prefix_caching lines (and that its cache is not too small to keep the probe)".to_owned()
    });
}
