//! Runtime LoRA loading, opt-in (`[model] load_lora_adapters`): when a request names a configured
//! adapter that no worker in the pool lists, the router loads it on one worker with vLLM's
//! `POST /v1/load_lora_adapter` `{"lora_name", "lora_path"}` (the engine must run with
//! `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`), marks that worker as serving it, and routes there.
//!
//! One load per adapter and pool at a time (single flight): concurrent requests for the adapter wait
//! for the load under way and then find the worker serving it, so a burst sends one load. Each load is
//! bounded by [`LOAD_TIMEOUT`], its answer by [`MAX_ANSWER_BYTES`] (a worker's answer is untrusted).
//! An engine that answers it already has the adapter (another replica loaded it first) counts as
//! loaded. Every outcome is counted (`mmrouter_adapter_loads_total{worker, outcome}`).
//!
//! Other replicas learn the adapter at their next health round, from the worker's `/v1/models`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mmrouter_core::routing::{Router, Worker};

use crate::config::LoadLoraAdapter;
use crate::observe::Observer;

/// Longest a load may take, answer included (vLLM reads the adapter's weights from disk).
pub const LOAD_TIMEOUT: Duration = Duration::from_secs(60);
/// Most bytes of a worker's answer read (its error message is trimmed to [`MAX_MESSAGE`]).
const MAX_ANSWER_BYTES: usize = 64 << 10;
/// Most characters of a worker's error message passed on to the client.
pub const MAX_MESSAGE: usize = 300;

/// Why a load failed; the labels are the `outcome` of `mmrouter_adapter_loads_total`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// The worker answered with an error (its status and message, trimmed).
    #[error("worker {worker} refused to load it ({status}): {message}")]
    Refused { worker: String, status: u16, message: String },
    #[error("worker {worker} could not be reached: {message}")]
    Unreachable { worker: String, message: String },
    #[error("worker {worker} did not answer within {}s", LOAD_TIMEOUT.as_secs())]
    Timeout { worker: String },
    /// No healthy vLLM worker to load it on.
    #[error("no healthy vLLM worker can load it")]
    NoWorker,
}

impl LoadError {
    pub fn label(&self) -> &'static str {
        match self {
            LoadError::Refused { .. } => "refused",
            LoadError::Unreachable { .. } => "unreachable",
            LoadError::Timeout { .. } => "timeout",
            LoadError::NoWorker => "no_worker",
        }
    }
}

/// Who asks for a load: the `Authorization` the proxy sends workers, and where loads are counted.
pub struct Requester<'a> {
    pub authorization: Option<&'a str>,
    pub observe: &'a Observer,
}

/// A failed load is answered again, not retried, for this long: the requests that waited for it (a
/// burst) get its error instead of each trying in turn.
pub const FAILURE_HOLD: Duration = Duration::from_secs(5);

/// A pool's last failed load of one adapter.
struct Failed {
    at: Instant,
    error: LoadError,
}

/// A pool's loadable adapters and the loads under way.
pub struct AdapterLoader {
    /// Adapter name → the path its engine loads it from.
    paths: HashMap<String, String>,
    client: Option<reqwest::Client>,
    /// One lock per configured adapter asked for, holding its last failed load.
    flights: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<Failed>>>>>,
}

impl AdapterLoader {
    pub fn new(adapters: &[LoadLoraAdapter]) -> AdapterLoader {
        let paths: HashMap<String, String> = adapters.iter().map(|a| (a.name.clone(), a.path.clone())).collect();
        let client = match paths.is_empty() {
            true => None,
            false => mmrouter_core::http_client_builder().timeout(LOAD_TIMEOUT).build().ok(),
        };
        AdapterLoader { paths, client, flights: Mutex::new(HashMap::new()) }
    }

    /// Whether the router may load `name` (it is configured).
    pub fn loadable(&self, name: &str) -> bool {
        self.paths.contains_key(name)
    }

    /// The configured adapters' names, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.paths.keys().cloned().collect();
        names.sort();
        names
    }

    /// Loads `name` on a worker unless one in `router`'s rotation serves it by the time this load's
    /// turn comes: `pick` is asked then for the worker to load it on (`None`: no worker). Ok once a
    /// worker serves it.
    pub async fn ensure(
        &self,
        router: &Router,
        name: &str,
        pick: impl Fn() -> Option<Arc<Worker>>,
        by: Requester<'_>,
    ) -> Result<(), LoadError> {
        if !self.loadable(name) {
            return Err(LoadError::NoWorker);
        }
        // Bounded by the configured names: only those get a lock.
        let flight = self.flights.lock().unwrap_or_else(|e| e.into_inner()).entry(name.to_owned()).or_default().clone();
        let mut last = flight.lock().await;
        if router.serves_adapter(name) {
            return Ok(());
        }
        if let Some(f) = last.as_ref().filter(|f| f.at.elapsed() < FAILURE_HOLD) {
            return Err(f.error.clone());
        }
        let worker = pick().ok_or(LoadError::NoWorker)?;
        let outcome = self.load(&worker, name, by.authorization).await;
        by.observe.adapter_load(worker.name(), outcome.as_ref().map_or_else(|e| e.label(), |&o| o));
        match outcome {
            Ok(_) => {
                worker.add_served_adapter(name);
                tracing::info!(worker = %worker.name(), adapter = name, "LoRA adapter loaded");
                *last = None;
                Ok(())
            }
            Err(error) => {
                tracing::warn!(adapter = name, "LoRA adapter load failed: {error}");
                *last = Some(Failed { at: Instant::now(), error: error.clone() });
                Err(error)
            }
        }
    }

    /// One `POST /v1/load_lora_adapter`: `loaded`, `already_loaded`, or why not.
    async fn load(&self, w: &Worker, name: &str, authorization: Option<&str>) -> Result<&'static str, LoadError> {
        let path = self.paths.get(name).ok_or(LoadError::NoWorker)?;
        let client = self.client.as_ref().ok_or(LoadError::NoWorker)?;
        let url = format!("{}/v1/load_lora_adapter", w.url().trim_end_matches('/'));
        let mut req = client.post(url).json(&serde_json::json!({"lora_name": name, "lora_path": path}));
        if let Some(auth) = authorization {
            req = req.header(reqwest::header::AUTHORIZATION, auth);
        }
        let worker = w.name().to_owned();
        let failed = |e: reqwest::Error| match e.is_timeout() {
            true => LoadError::Timeout { worker: worker.clone() },
            false => LoadError::Unreachable { worker: worker.clone(), message: trimmed(&e.to_string()) },
        };
        let mut resp = req.send().await.map_err(failed)?;
        let status = resp.status();
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(failed)? {
            body.extend_from_slice(&chunk[..chunk.len().min(MAX_ANSWER_BYTES - body.len())]);
            if body.len() == MAX_ANSWER_BYTES {
                break;
            }
        }
        if status.is_success() {
            return Ok("loaded");
        }
        let message = error_message(&body);
        // vLLM refuses a second load of a name it has: another replica (or an operator) was first.
        if status == reqwest::StatusCode::BAD_REQUEST && message.contains("has already been loaded") {
            return Ok("already_loaded");
        }
        Err(LoadError::Refused { worker, status: status.as_u16(), message })
    }
}

/// An error answer's message: OpenAI's / vLLM's `error.message`, else the body's text, trimmed.
fn error_message(body: &[u8]) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let message = parsed.as_ref().and_then(|v| v["error"]["message"].as_str().or(v["message"].as_str()));
    trimmed(&message.map_or_else(|| String::from_utf8_lossy(body).into_owned(), str::to_owned))
}

/// At most [`MAX_MESSAGE`] characters, control characters dropped, whitespace collapsed.
fn trimmed(text: &str) -> String {
    let words: Vec<&str> = text.split_whitespace().collect();
    let clean: String = words.join(" ").chars().filter(|c| !c.is_control()).collect();
    match clean.char_indices().nth(MAX_MESSAGE) {
        Some((cut, _)) => format!("{}…", &clean[..cut]),
        None => clean,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workers_message_is_read_and_trimmed() {
        let vllm = br#"{"error":{"message":"Loading lora x failed: No adapter found for /m/x","type":"NotFoundError","param":null,"code":404}}"#;
        assert_eq!(error_message(vllm), "Loading lora x failed: No adapter found for /m/x");
        assert_eq!(error_message(b"Internal Server Error\n\n"), "Internal Server Error");
        let long = "word ".repeat(1000);
        let t = error_message(long.as_bytes());
        assert_eq!(t.chars().count(), MAX_MESSAGE + 1);
        assert!(t.ends_with('…'));
        assert_eq!(trimmed("a\u{7}b\r\nc"), "ab c");
    }

    #[test]
    fn the_config_names_loadable_adapters_per_pool_and_checks_them() {
        let workers = "[[workers]]\nname = \"w\"\nurl = \"http://127.0.0.1:1\"\n";
        let parse = |model: &str| crate::config::Settings::parse(&format!("[model]\n{model}\n{workers}"));
        let c = parse(r#"load_lora_adapters = [{ name = "sql", path = "/m/sql" }]"#).unwrap();
        let want = [LoadLoraAdapter { name: "sql".into(), path: "/m/sql".into() }];
        assert_eq!(c.pools[0].load_lora_adapters, want);
        assert_eq!(c.pools[0].pipeline.model.lora_adapters, ["sql"], "keyed as an adapter");
        assert!(parse("").unwrap().pools[0].load_lora_adapters.is_empty(), "off by default");
        let err = |model: &str| parse(model).unwrap_err().to_string();
        assert!(err(r#"load_lora_adapters = [{ name = "", path = "/m" }]"#).contains("model.load_lora_adapters[0]"));
        let twice = r#"load_lora_adapters = [{ name = "a", path = "/a" }, { name = "a", path = "/b" }]"#;
        assert!(err(twice).contains("model.load_lora_adapters[1]"), "{}", err(twice));
        assert!(err(r#"load_lora_adapters = [{ name = "a", path = "/a", inplace = true }]"#).contains("inplace"));
    }

    #[test]
    fn only_configured_adapters_are_loadable() {
        let l = AdapterLoader::new(&[LoadLoraAdapter { name: "sql".into(), path: "/m/sql".into() }]);
        assert!(l.loadable("sql"));
        assert!(!l.loadable("other"));
        assert_eq!(l.names(), ["sql"]);
        assert!(AdapterLoader::new(&[]).client.is_none(), "no adapters, no client");
    }
}
