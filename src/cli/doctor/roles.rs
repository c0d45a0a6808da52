//! A pool with roles (docs/disaggregated.md): each worker's role, and whether its legs can meet —
//! the prefill, decode and encode workers serve the same model names as the pool's first prefill
//! worker (or, E + aggregated, its first `both` worker): a decode engine pulls the prefill's KV cache,
//! and an encoder's embeddings are loaded by the engines it hands them to, so they must run one model.
//!
//! A probe of the legs themselves (a chat sent through prefill then decode) is not made yet: the
//! doctor checks each engine alone.

use mmrouter_core::routing::Role;

use super::report::Checks;
use crate::config::{PoolSettings, WorkerSettings};

/// Whether the pool's workers have roles (any not `both`): then each one's role is a line.
pub fn has_roles(pool: &PoolSettings) -> bool {
    pool.workers.iter().any(|w| w.spec.role != Role::Both)
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
