//! What each worker's engine serves: after a passing health check of a vLLM worker its `/v1/models` is
//! read (bounded) for its base models and LoRA adapters (vLLM lists an adapter with its base model as
//! `parent`). Requests for an adapter are routed only to workers that list it, and keyed with the
//! adapter's name as the engine keys them (the pool's pipeline learns the name). Operators need not
//! list adapters in the config: a worker that loads one is found at the next health round; one that
//! unloads it stops getting its requests then.
//!
//! A worker's listing is untrusted: at most [`MAX_MODELS`] entries of at most [`MAX_NAME`] bytes are
//! taken, from a page of at most [`MAX_PAGE_BYTES`]; a page that breaks a bound is ignored whole (the
//! last good listing kept).

use mmrouter_core::pipeline::Pipeline;
use mmrouter_core::routing::{ServedModels, Worker};

use super::page::read_page;

/// A `/v1/models` page larger than this is not read (vLLM's is a few hundred bytes per model).
const MAX_PAGE_BYTES: usize = 1 << 20;
/// Most models one worker may list.
pub const MAX_MODELS: usize = 1024;
/// Longest model or adapter name taken.
pub const MAX_NAME: usize = 256;

/// Reads `w`'s listing; a change is applied to the worker and its adapters taught to `pipeline`.
pub async fn refresh(client: &reqwest::Client, w: &Worker, pipeline: &Pipeline) {
    let Some(page) = read_page(client, w.url(), "/v1/models", MAX_PAGE_BYTES).await else { return };
    let Some(served) = parse(&page) else {
        tracing::debug!(worker = %w.name(), "a /v1/models listing out of bounds was ignored");
        return;
    };
    pipeline.learn_adapters(&served.adapters);
    if w.set_served_models(served) {
        tracing::info!(worker = %w.name(), adapters = ?w.served_models().map(|s| s.adapters.clone()), "worker's models changed");
    }
}

/// The listing's base models and adapters; `None` when it is not OpenAI's shape or breaks a bound.
fn parse(page: &[u8]) -> Option<ServedModels> {
    #[derive(serde::Deserialize)]
    struct Page {
        data: Vec<Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        id: String,
        #[serde(default)]
        parent: Option<String>,
    }
    let page: Page = serde_json::from_slice(page).ok()?;
    if page.data.len() > MAX_MODELS || page.data.iter().any(|e| e.id.is_empty() || e.id.len() > MAX_NAME) {
        return None;
    }
    let mut served = ServedModels::default();
    for e in page.data {
        match e.parent {
            Some(_) => served.adapters.push(e.id),
            None => served.base.push(e.id),
        }
    }
    served.adapters.sort();
    served.adapters.dedup();
    Some(served)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adapters_are_the_entries_with_a_parent() {
        let page = br#"{"object":"list","data":[
            {"id":"Qwen/Qwen2.5-VL","object":"model","parent":null,"root":"/m"},
            {"id":"sql-lora","object":"model","parent":"Qwen/Qwen2.5-VL","root":"/loras/sql"},
            {"id":"chat-lora","object":"model","parent":"Qwen/Qwen2.5-VL"}]}"#;
        let s = parse(page).unwrap();
        assert_eq!(s.base, ["Qwen/Qwen2.5-VL"]);
        assert_eq!(s.adapters, ["chat-lora", "sql-lora"]);
    }

    #[test]
    fn listings_out_of_bounds_are_ignored_whole() {
        assert_eq!(parse(b"not json"), None);
        assert_eq!(parse(br#"{"data":[{"id":""}]}"#), None);
        let long = format!(r#"{{"data":[{{"id":"{}"}}]}}"#, "x".repeat(MAX_NAME + 1));
        assert_eq!(parse(long.as_bytes()), None);
        let many: Vec<String> = (0..=MAX_MODELS).map(|i| format!(r#"{{"id":"m{i}","parent":"b"}}"#)).collect();
        assert_eq!(parse(format!(r#"{{"data":[{}]}}"#, many.join(",")).as_bytes()), None);
    }
}
