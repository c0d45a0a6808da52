//! The rules a pool's worker roles obey (docs/disaggregated.md), in one place: checked on every pool
//! of the file, and on every change of a running pool (admin API, reload) over the workers that stay
//! in rotation, so no change leaves a pool with a leg no worker can serve.

use mmrouter_core::routing::{Engine, Role, WorkerSpec};

/// One worker as the role rules see it.
#[derive(Clone, Copy, Debug)]
pub struct Member<'a> {
    pub name: &'a str,
    pub engine: Engine,
    pub role: Role,
}

impl<'a> From<&'a WorkerSpec> for Member<'a> {
    fn from(spec: &'a WorkerSpec) -> Member<'a> {
        Member { name: &spec.name, engine: spec.engine, role: spec.role }
    }
}

/// Why a pool's roles cannot serve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RolesError {
    #[error(
        "pool '{pool}' has prefill workers but no decode worker (a prefill leg's KV cache is pulled by a decode worker)"
    )]
    PrefillWithoutDecode { pool: String },
    #[error("pool '{pool}' has decode workers but no prefill worker (a decode leg pulls a prefill worker's KV cache)")]
    DecodeWithoutPrefill { pool: String },
    #[error(
        "pool '{pool}' has encode workers but neither prefill and decode workers nor both workers to load their \
         embeddings"
    )]
    EncodeAlone { pool: String },
    #[error(
        "pool '{pool}' mixes engines across its prefill and decode workers ('{a}' is {a_engine}, '{b}' is \
         {b_engine}): vLLM's NIXL transfer and SGLang's bootstrap do not pair"
    )]
    MixedEngines { pool: String, a: String, a_engine: &'static str, b: String, b_engine: &'static str },
    #[error(
        "pool '{pool}' has encode workers, whose embeddings only vLLM engines load, and worker '{worker}' is \
         engine = \"sglang\" (SGLang E/PD is not supported)"
    )]
    SglangWithEncoder { pool: String, worker: String },
}

/// The engine's config value.
pub fn engine_label(e: Engine) -> &'static str {
    match e {
        Engine::Vllm => "vllm",
        Engine::Sglang => "sglang",
    }
}

/// Checks the roles of `pool`'s workers (those in rotation, for a running pool).
pub fn check_roles<'a>(pool: &str, workers: impl IntoIterator<Item = Member<'a>>) -> Result<(), RolesError> {
    let workers: Vec<Member<'a>> = workers.into_iter().collect();
    let has = |role: Role| workers.iter().any(|w| w.role == role);
    let pool = pool.to_owned();
    match (has(Role::Prefill), has(Role::Decode)) {
        (true, false) => return Err(RolesError::PrefillWithoutDecode { pool }),
        (false, true) => return Err(RolesError::DecodeWithoutPrefill { pool }),
        _ => {}
    }
    if has(Role::Encode) {
        if !has(Role::Prefill) && !has(Role::Both) {
            return Err(RolesError::EncodeAlone { pool });
        }
        // Every engine an encoder hands its embeddings to must be vLLM.
        if let Some(w) = workers.iter().find(|w| w.engine == Engine::Sglang) {
            return Err(RolesError::SglangWithEncoder { pool, worker: w.name.to_owned() });
        }
    }
    check_pairs(pool, &workers)
}

/// Any prefill worker may pair with any decode worker: they must all run one engine.
fn check_pairs(pool: String, workers: &[Member<'_>]) -> Result<(), RolesError> {
    let mut legs = workers.iter().filter(|w| matches!(w.role, Role::Prefill | Role::Decode));
    let Some(first) = legs.next() else { return Ok(()) };
    match legs.find(|w| w.engine != first.engine) {
        Some(other) => Err(RolesError::MixedEngines {
            pool,
            a: first.name.to_owned(),
            a_engine: engine_label(first.engine),
            b: other.name.to_owned(),
            b_engine: engine_label(other.engine),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(name: &str, role: Role, engine: Engine) -> Member<'_> {
        Member { name, engine, role }
    }

    fn check(workers: &[Member<'_>]) -> Result<(), RolesError> {
        check_roles("p", workers.iter().copied())
    }

    const V: Engine = Engine::Vllm;
    const S: Engine = Engine::Sglang;

    #[test]
    fn serving_compositions_pass() {
        let ok: [&[Member<'_>]; 6] = [
            &[m("a", Role::Both, V)],
            &[m("a", Role::Both, V), m("b", Role::Both, S)],
            &[m("p", Role::Prefill, S), m("d", Role::Decode, S)],
            &[m("e", Role::Encode, V), m("p", Role::Prefill, V), m("d", Role::Decode, V)],
            &[m("e", Role::Encode, V), m("a", Role::Both, V)],
            &[m("a", Role::Both, S), m("p", Role::Prefill, V), m("d", Role::Decode, V)],
        ];
        for workers in ok {
            assert_eq!(check(workers), Ok(()), "{workers:?}");
        }
    }

    #[test]
    fn each_broken_composition_is_named() {
        let cases: [(&[Member<'_>], &str); 6] = [
            (&[m("p", Role::Prefill, V)], "no decode worker"),
            (&[m("a", Role::Both, V), m("d", Role::Decode, V)], "no prefill worker"),
            (&[m("e", Role::Encode, V)], "neither prefill and decode workers nor both"),
            (&[m("p", Role::Prefill, V), m("d", Role::Decode, S)], "'p' is vllm, 'd' is sglang"),
            (
                &[m("e", Role::Encode, V), m("p", Role::Prefill, S), m("d", Role::Decode, S)],
                "worker 'p' is engine = \"sglang\" (SGLang E/PD is not supported)",
            ),
            (&[m("e", Role::Encode, V), m("a", Role::Both, S)], "SGLang E/PD is not supported"),
        ];
        for (workers, want) in cases {
            let err = check(workers).unwrap_err().to_string();
            assert!(err.starts_with("pool 'p' ") && err.contains(want), "{workers:?}: {err}");
        }
    }
}
