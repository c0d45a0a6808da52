//! Which LoRA adapters a worker's engine has *active* — in one of its `max_loras` GPU slots — as far as
//! the router can tell: the adapters of the requests its engine last ran or queued (vLLM's
//! `vllm:lora_requests_info` gauge, read after each health check), and, faster than a health round,
//! the adapters this router itself sent it recently. A request for an adapter that is not active costs
//! the engine a swap into a slot (evicting another adapter when all are taken), which the `kv` cost
//! weighs (`routing.adapter_swap_tokens`).
//!
//! Both sets are bounded: at most [`MAX_ENGINE_ACTIVE`] names from the engine (the page is
//! untrusted), and at most [`MAX_SENT`] recent sends per worker, each counted for [`SENT_TTL`].

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Most adapters taken from one engine's reading.
pub const MAX_ENGINE_ACTIVE: usize = 64;
/// Most adapters remembered as sent to one worker (the oldest is forgotten first).
pub const MAX_SENT: usize = 8;
/// How long an adapter sent to a worker counts as active there: vLLM keeps an adapter in its slot
/// until a request for another evicts it (LRU), so a recent send is a good guess for about a minute.
pub const SENT_TTL: Duration = Duration::from_secs(60);

/// A worker's active adapters (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct ActiveAdapters {
    /// The engine's running and waiting adapters, as last read; `None` until read.
    engine: Option<Vec<String>>,
    /// Adapters this router sent the worker, oldest first.
    sent: VecDeque<(String, Instant)>,
}

impl ActiveAdapters {
    /// Whether `name` is likely in one of the engine's slots at `now`.
    pub fn is_active(&self, name: &str, now: Instant) -> bool {
        let recent = self.sent.iter().any(|(a, at)| a == name && now.saturating_duration_since(*at) < SENT_TTL);
        recent || self.engine.as_ref().is_some_and(|e| e.iter().any(|a| a == name))
    }

    /// The engine's reading replaces the last one (bounded).
    pub fn set_engine(&mut self, mut names: Vec<String>) {
        names.truncate(MAX_ENGINE_ACTIVE);
        self.engine = Some(names);
    }

    /// This router sent the worker a request for `name` at `now`.
    pub fn sent(&mut self, name: &str, now: Instant) {
        self.sent.retain(|(a, _)| a != name);
        if self.sent.len() == MAX_SENT {
            self.sent.pop_front();
        }
        self.sent.push_back((name.to_owned(), now));
    }

    /// The adapters active at `now` (engine's and recent sends), each once, sorted.
    pub fn names(&self, now: Instant) -> Vec<String> {
        let recent = self.sent.iter().filter(|(_, at)| now.saturating_duration_since(*at) < SENT_TTL);
        let mut names: Vec<String> =
            recent.map(|(a, _)| a.clone()).chain(self.engine.iter().flatten().cloned()).collect();
        names.sort();
        names.dedup();
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_send_counts_for_its_ttl_and_the_engine_reading_until_replaced() {
        let t0 = Instant::now();
        let mut a = ActiveAdapters::default();
        assert!(!a.is_active("sql", t0));
        a.sent("sql", t0);
        assert!(a.is_active("sql", t0 + Duration::from_secs(59)));
        assert!(!a.is_active("sql", t0 + SENT_TTL));
        a.set_engine(vec!["chat".into()]);
        assert!(a.is_active("chat", t0 + SENT_TTL * 10));
        a.set_engine(Vec::new());
        assert!(!a.is_active("chat", t0));
        assert_eq!(a.names(t0), ["sql"]);
    }

    #[test]
    fn both_sets_are_bounded() {
        let t0 = Instant::now();
        let mut a = ActiveAdapters::default();
        for i in 0..=MAX_SENT {
            a.sent(&format!("a{i}"), t0);
        }
        assert!(!a.is_active("a0", t0), "the oldest send is forgotten");
        assert!(a.is_active(&format!("a{MAX_SENT}"), t0));
        a.sent("a1", t0); // sent again: moved to the back, not doubled
        assert_eq!(a.sent.len(), MAX_SENT);
        a.set_engine((0..1000).map(|i| format!("e{i}")).collect());
        assert_eq!(a.engine.as_ref().map(Vec::len), Some(MAX_ENGINE_ACTIVE));
    }
}
