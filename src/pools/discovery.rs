//! Where a worker publishes its KV events: the configured endpoints (one publisher per data-parallel
//! rank), or, with `kv_events = "discover"`, the worker's own answer (vLLM `GET /kv_event_sources`,
//! SGLang `GET /server_info`), retried until it gives a usable one. A discovery document is untrusted
//! input: read up to `kv_events.discovery_max_bytes` without redirects, it must name few ranks on the
//! worker's own host (or `discovery_allow_hosts`); what is refused is counted by reason.

use std::sync::Mutex;
use std::time::Duration;

use mmrouter_core::routing::{Engine, WorkerSpec};
use mmrouter_kv_events::discovery::{parse_sglang_server_info, parse_vllm_kv_event_sources, DiscoveryError};
use mmrouter_kv_events::FeedConfig;

use crate::config::{EventSource, KvEventsSection, WorkerSettings};

/// Between discovery attempts while a worker does not answer yet, doubling up to the max.
const DISCOVERY_RETRY: Duration = Duration::from_secs(2);
const DISCOVERY_RETRY_MAX: Duration = Duration::from_secs(60);
/// One discovery request, whole.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(5);

/// The publishers of one worker: configured (one per data-parallel rank) or discovered.
pub async fn resolve(
    settings: &WorkerSettings,
    source: EventSource,
    limits: &KvEventsSection,
    refused: &Refusals,
) -> Option<Vec<FeedConfig>> {
    let configs = match source {
        EventSource::Endpoints { endpoint, replay, topic, data_parallel_size } => {
            let mut base = FeedConfig::new(endpoint).with_topic(topic);
            if let Some(replay) = replay {
                base = base.with_replay_endpoint(replay);
            }
            match base.expand_data_parallel(data_parallel_size) {
                Ok(configs) => configs,
                Err(e) => {
                    tracing::error!(worker = %settings.spec.name, "kv events: {e}");
                    return None;
                }
            }
        }
        EventSource::Discover => discover(settings, limits, refused).await,
    };
    Some(configs.into_iter().map(|cfg| bounded(cfg, limits)).collect())
}

/// A feed configuration with the operator's bounds on what a publisher may send.
fn bounded(mut cfg: FeedConfig, limits: &KvEventsSection) -> FeedConfig {
    cfg.max_message_bytes = limits.max_message_bytes;
    cfg.max_replay_buffer_bytes = limits.max_replay_buffer_bytes;
    cfg
}

/// Asks the worker where it publishes, until it answers with a usable document. A refused document
/// (too large, too many ranks, a foreign host, not the documented shape) is counted and retried with a
/// growing delay: the worker may be starting, or hostile, and is not asked more often than that.
async fn discover(settings: &WorkerSettings, limits: &KvEventsSection, refused: &Refusals) -> Vec<FeedConfig> {
    let spec = &settings.spec;
    let host = url::Url::parse(&spec.url).ok().and_then(|u| u.host_str().map(str::to_owned)).unwrap_or_default();
    // No redirects: a worker's answer must come from the worker.
    let client = mmrouter_core::http_client_builder()
        .timeout(DISCOVERY_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build();
    let mut delay = DISCOVERY_RETRY;
    loop {
        let answer = match &client {
            Ok(c) => discover_once(c, spec, &host, limits).await,
            Err(e) => Err(DiscoveryFailure::Fetch(e.to_string())),
        };
        match answer {
            Ok(configs) if !configs.is_empty() => return configs,
            Ok(_) => tracing::warn!(worker = %spec.name, "kv events discovery: no publisher; retrying"),
            Err(e) => {
                refused.count(e.label());
                tracing::warn!(worker = %spec.name, reason = e.label(), "kv events discovery failed ({e}); retrying in {delay:?}")
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(DISCOVERY_RETRY_MAX);
    }
}

/// One discovery attempt, no retry (`mmrouter doctor`): the publishers, or why there are none.
pub async fn discover_now(settings: &WorkerSettings, limits: &KvEventsSection) -> Result<Vec<FeedConfig>, String> {
    let spec = &settings.spec;
    let host = url::Url::parse(&spec.url).ok().and_then(|u| u.host_str().map(str::to_owned)).unwrap_or_default();
    let client = mmrouter_core::http_client_builder()
        .timeout(DISCOVERY_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| e.to_string())?;
    let configs = discover_once(&client, spec, &host, limits).await.map_err(|e| format!("{} ({e})", e.label()))?;
    Ok(configs.into_iter().map(|cfg| bounded(cfg, limits)).collect())
}

/// Counts of refused input by reason.
#[derive(Debug, Default)]
pub struct Refusals(Mutex<std::collections::BTreeMap<&'static str, u64>>);

impl Refusals {
    fn count(&self, reason: &'static str) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()).entry(reason).or_default() += 1;
    }

    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(k, v)| (*k, *v)).collect()
    }
}

/// Why one discovery attempt gave nothing usable.
#[derive(Debug, thiserror::Error)]
enum DiscoveryFailure {
    #[error("{0}")]
    Fetch(String),
    #[error("document over {0} bytes")]
    TooLarge(usize),
    #[error(transparent)]
    Refused(#[from] DiscoveryError),
    #[error("no kv_events in /server_info")]
    NotPublishing,
}

impl DiscoveryFailure {
    fn label(&self) -> &'static str {
        match self {
            DiscoveryFailure::Fetch(_) => "fetch",
            DiscoveryFailure::TooLarge(_) => "too_large",
            DiscoveryFailure::Refused(e) => e.label(),
            DiscoveryFailure::NotPublishing => "not_publishing",
        }
    }
}

async fn discover_once(
    client: &reqwest::Client,
    spec: &WorkerSpec,
    host: &str,
    limits: &KvEventsSection,
) -> Result<Vec<FeedConfig>, DiscoveryFailure> {
    let base = spec.url.trim_end_matches('/');
    let allow = &limits.discovery_allow_hosts;
    let max = limits.discovery_max_bytes;
    match spec.engine {
        Engine::Vllm => {
            let body = get_bounded(client, &format!("{base}/kv_event_sources"), max).await?;
            Ok(parse_vllm_kv_event_sources(&body, host, allow)?)
        }
        Engine::Sglang => {
            let body = get_bounded(client, &format!("{base}/server_info"), max).await?;
            let found = parse_sglang_server_info(&body, host, allow)?;
            found.map(|k| k.feeds).ok_or(DiscoveryFailure::NotPublishing)
        }
    }
}

/// A GET whose body is read only up to `max` bytes: a worker's document is untrusted input.
async fn get_bounded(client: &reqwest::Client, url: &str, max: usize) -> Result<Vec<u8>, DiscoveryFailure> {
    let fetch = |e: reqwest::Error| DiscoveryFailure::Fetch(e.to_string());
    let mut resp = client.get(url).send().await.map_err(fetch)?;
    if !resp.status().is_success() {
        return Err(DiscoveryFailure::Fetch(format!("HTTP {}", resp.status())));
    }
    if resp.content_length().is_some_and(|n| n > max as u64) {
        return Err(DiscoveryFailure::TooLarge(max));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(fetch)? {
        if body.len() + chunk.len() > max {
            return Err(DiscoveryFailure::TooLarge(max));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
