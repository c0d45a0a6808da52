//! vLLM's Responses store (`VLLM_ENABLE_RESPONSES_API_STORE`): each stored answer with the chat
//! messages its prompt was rendered from, so a `previous_response_id` continues the conversation.
//! vLLM keeps everything forever; the sim keeps the newest [`MAX_ENTRIES`] within [`MAX_BYTES`] (the
//! oldest dropped first), so a long benchmark cannot grow it without bound.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;

/// Stored answers kept at most.
pub(crate) const MAX_ENTRIES: usize = 10_000;
/// Their messages' and answers' JSON bytes kept at most.
pub(crate) const MAX_BYTES: usize = 256 << 20;

/// One stored answer.
#[derive(Debug)]
pub(crate) struct Stored {
    /// The response object as answered (its `status` changes when a background answer ends).
    pub response: Value,
    /// The chat messages the prompt was rendered from (vLLM's `msg_store`).
    pub messages: Arc<Vec<Value>>,
    weight: usize,
}

impl Stored {
    pub(crate) fn new(response: Value, messages: Arc<Vec<Value>>) -> Stored {
        let weight = json_len(&response) + messages.iter().map(json_len).sum::<usize>();
        Stored { response, messages, weight }
    }
}

fn json_len(v: &Value) -> usize {
    serde_json::to_vec(v).map_or(0, |b| b.len())
}

/// The store, or nothing when `--responses-store` is off.
pub(crate) struct Store {
    enabled: bool,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<String, Arc<Stored>>,
    /// Ids in insertion order, oldest first.
    order: VecDeque<String>,
    bytes: usize,
}

impl Store {
    pub(crate) fn new(enabled: bool) -> Store {
        Store { enabled, inner: Mutex::default() }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        // Every statement leaves the maps consistent, so a panic elsewhere does not poison them.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn get(&self, id: &str) -> Option<Arc<Stored>> {
        self.inner().entries.get(id).cloned()
    }

    /// Keeps `stored` under `id` (replacing an earlier answer of that id), then drops the oldest
    /// answers beyond the bounds. Nothing is kept when the store is off.
    pub(crate) fn put(&self, id: &str, stored: Stored) {
        if !self.enabled {
            return;
        }
        let mut inner = self.inner();
        inner.bytes += stored.weight;
        match inner.entries.insert(id.to_owned(), Arc::new(stored)) {
            Some(old) => inner.bytes -= old.weight,
            None => inner.order.push_back(id.to_owned()),
        }
        while inner.entries.len() > MAX_ENTRIES || (inner.bytes > MAX_BYTES && inner.entries.len() > 1) {
            let Some(oldest) = inner.order.pop_front() else { break };
            if let Some(gone) = inner.entries.remove(&oldest) {
                inner.bytes -= gone.weight;
            }
        }
    }

    /// Replaces the stored response of `id`, keeping its messages, if it is still stored.
    pub(crate) fn update(&self, id: &str, f: impl FnOnce(&mut Value)) -> Option<Value> {
        let stored = self.get(id)?;
        let mut response = stored.response.clone();
        f(&mut response);
        self.put(id, Stored::new(response.clone(), stored.messages.clone()));
        Some(response)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner().entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored(n: usize) -> Stored {
        Stored::new(json!({"n": n}), Arc::new(vec![json!({"role": "user", "content": "hi"})]))
    }

    #[test]
    fn off_keeps_nothing() {
        let store = Store::new(false);
        store.put("resp_a", stored(1));
        assert!(store.get("resp_a").is_none());
    }

    #[test]
    fn the_oldest_go_first_beyond_the_bound() {
        let store = Store::new(true);
        for i in 0..MAX_ENTRIES + 3 {
            store.put(&format!("resp_{i}"), stored(i));
        }
        assert_eq!(store.len(), MAX_ENTRIES);
        assert!(store.get("resp_2").is_none());
        assert_eq!(store.get("resp_3").expect("kept").response["n"], 3);
        // A replaced id keeps its place and its count.
        store.put("resp_3", stored(33));
        assert_eq!(store.len(), MAX_ENTRIES);
        assert_eq!(store.get("resp_3").expect("kept").response["n"], 33);
    }

    #[test]
    fn bytes_are_bounded_too() {
        let store = Store::new(true);
        let big = "x".repeat(MAX_BYTES / 3);
        for i in 0..4 {
            store.put(&format!("resp_{i}"), Stored::new(json!(big), Arc::new(Vec::new())));
        }
        assert!(store.get("resp_0").is_none());
        assert!(store.get("resp_3").is_some());
        assert!(store.inner().bytes <= MAX_BYTES);
    }

    #[test]
    fn update_keeps_the_messages() {
        let store = Store::new(true);
        store.put("resp_a", stored(1));
        let updated = store.update("resp_a", |r| r["status"] = json!("cancelled")).expect("stored");
        assert_eq!(updated["status"], "cancelled");
        assert_eq!(store.get("resp_a").expect("kept").messages.len(), 1);
        assert!(store.update("resp_b", |_| {}).is_none());
    }
}
