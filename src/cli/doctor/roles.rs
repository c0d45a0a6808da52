//! A pool with roles (docs/disaggregated.md): each worker's role, and whether its legs can meet —
//! the prefill, decode and encode workers serve the same model names as the pool's first prefill
//! worker (or, E + aggregated, its first `both` worker): a decode engine pulls the prefill's KV cache,
//! and an encoder's embeddings are loaded by the engines it hands them to, so they must run one model.
//!
//! And, once per vLLM P/D pool, its path end to end (`pd_path`): a text probe's prefill leg on the
//! first prefill worker that served the model, its `kv_transfer_params` checked as the router checks
//! them, and its decode leg on the first such decode worker — the bodies built by the router's own
//! `upstream::legs`. SGLang's legs (sent at once, meeting at the bootstrap server) and the encode
//! leg are not probed.

use std::time::{Duration, Instant};

use mmrouter_core::routing::{Engine, Role};

use super::http::{Expect, WorkerHttp};
use super::report::Checks;
use crate::config::{PoolSettings, WorkerSettings};
use crate::upstream::legs;

/// Whether the pool's workers have roles (any not `both`): then each one's role is a line.
pub fn has_roles(pool: &PoolSettings) -> bool {
    pool.workers.iter().any(|w| w.spec.role != Role::Both)
}

/// Whether the pool serves prefill and decode on different workers.
pub fn is_disaggregated(pool: &PoolSettings) -> bool {
    let has = |role: Role| pool.workers.iter().any(|w| w.spec.role == role);
    has(Role::Prefill) && has(Role::Decode)
}

/// The worker's role line.
pub fn role(c: &mut Checks, w: &WorkerSettings) {
    let detail = match w.spec.bootstrap_port {
        Some(port) => format!("{} (bootstrap port {port})", w.spec.role.label()),
        None => w.spec.role.label().to_owned(),
    };
    c.ok("role", detail);
}

/// One `same_model` line per prefill, decode and encode worker of `pool`, whose workers' checks are
/// `checks` (in the pool's order, each with the names its `/v1/models` served, if read).
pub fn same_model(pool: &PoolSettings, checks: &mut [Checks]) {
    if !has_roles(pool) {
        return;
    }
    let first =
        |role: Role| pool.workers.iter().zip(checks.iter()).find(|(w, c)| w.spec.role == role && c.served.is_some());
    let reference = first(Role::Prefill).or_else(|| first(Role::Both));
    let reference = reference.map(|(w, c)| (w.spec.name.clone(), sorted(c.served.as_deref().unwrap_or_default())));
    for (w, c) in pool.workers.iter().zip(checks.iter_mut()) {
        if w.spec.role == Role::Both {
            continue;
        }
        let served = c.served.as_deref().map(sorted);
        match (&reference, served) {
            (_, None) => c.skip("same_model", "its /v1/models was not read"),
            (None, _) => c.skip("same_model", "no prefill (or both) worker of the pool answered /v1/models"),
            (Some((name, _)), Some(_)) if *name == w.spec.name => {
                c.ok("same_model", "the pool's reference for its other legs")
            }
            (Some((name, want)), Some(got)) => {
                let detail =
                    format!("serves [{}], prefill worker '{name}' serves [{}]", got.join(", "), want.join(", "));
                c.check("same_model", got == *want, detail, || {
                    "a request's legs run on several engines, which must serve the same model (weights and \
                     --served-model-name): a decode engine pulls the prefill's KV cache"
                        .to_owned()
                });
            }
        }
    }
}

fn sorted(names: &[String]) -> Vec<String> {
    let mut v = names.to_vec();
    v.sort();
    v.dedup();
    v
}

/// The P/D path of `pool`, reported on its first decode worker's `checks` (see the module docs).
pub async fn pd_path(pool: &PoolSettings, checks: &mut [Checks], timeout: Duration) {
    let reached = |role: Role| {
        pool.workers.iter().zip(checks.iter()).position(|(w, c)| w.spec.role == role && c.served.is_some())
    };
    let Some(d) = pool.workers.iter().position(|w| w.spec.role == Role::Decode) else { return };
    if pool.workers[d].spec.engine != Engine::Vllm {
        return checks[d].skip("pd_path", "SGLang's legs are not probed (their bootstrap rooms meet on the engines)");
    }
    let (Some(p), Some(d)) = (reached(Role::Prefill), reached(Role::Decode)) else {
        return checks[d].skip("pd_path", "no prefill and decode worker of the pool answered /v1/models");
    };
    let model =
        checks[p].served.as_ref().and_then(|s| pool.models.iter().find(|m| s.contains(m)).or(s.first())).cloned();
    let Some(model) = model else {
        return checks[d].skip("pd_path", "the prefill worker serves no model");
    };
    let legs = (&pool.workers[p], &pool.workers[d]);
    match send_legs(legs, &model, timeout).await {
        Ok(took) => {
            let detail = format!(
                "prefill '{}' then decode '{}' answered in {} ms",
                legs.0.spec.name,
                legs.1.spec.name,
                took.as_millis()
            );
            checks[d].ok("pd_path", detail)
        }
        Err(LegFailure { detail, hint }) => checks[d].fail("pd_path", detail, hint),
    }
}

/// Why the probe's legs did not make an answer.
struct LegFailure {
    detail: String,
    hint: &'static str,
}

const CONNECTOR_HINT: &str = "start both engines with the same --kv-transfer-config (NixlConnector, kv_role \
                              kv_both: docs/disaggregated.md) and let the decode engine reach the prefill's \
                              NIXL side channel";

/// A text probe through `prefill` then `decode`, as the router sends it.
async fn send_legs(
    (prefill, decode): (&WorkerSettings, &WorkerSettings),
    model: &str,
    timeout: Duration,
) -> Result<Duration, LegFailure> {
    let fail = |detail: String| LegFailure { detail, hint: CONNECTOR_HINT };
    let nonce = format!("{:016x}", rand::random::<u64>());
    let text = format!("mmrouter doctor, disaggregated path {nonce}: say hello.");
    let body = serde_json::to_vec(
        &serde_json::json!({"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": text}]}),
    )
    .expect("a JSON value serialises");
    let started = Instant::now();
    let leg_body = legs::prefill_body(&body).map_err(|e| fail(format!("the prefill leg's body: {e}")))?;
    let answer = post(prefill, leg_body.to_vec(), timeout).await.map_err(|e| fail(format!("prefill leg: {e}")))?;
    let params = legs::kv_transfer_params(&answer).map_err(|e| fail(format!("the prefill's answer: {e}")))?;
    let leg_body = legs::decode_body(&body, &params).map_err(|e| fail(format!("the decode leg's body: {e}")))?;
    post(decode, leg_body.to_vec(), timeout).await.map_err(|e| fail(format!("decode leg: {e}")))?;
    Ok(started.elapsed())
}

/// A chat leg to `w`: its answer's body, or why there is none.
async fn post(w: &WorkerSettings, body: Vec<u8>, timeout: Duration) -> Result<Vec<u8>, String> {
    let http = WorkerHttp::new(&w.spec.url, timeout).map_err(|e| e.to_string())?;
    let answer = http.post("/v1/chat/completions", body, Expect::Json).await.map_err(|e| e.to_string())?;
    if !answer.is_success() {
        return Err(answer.excerpt());
    }
    Ok(answer.body)
}
