//! Metric handles registered on first use and kept by label values, so the hot path does not build
//! metric keys per request.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;

/// Handles registered on first use, by label values.
pub(super) struct Cache<K, H>(Mutex<HashMap<K, H>>);

impl<K: Eq + Hash, H: Clone> Cache<K, H> {
    pub(super) fn new() -> Self {
        Cache(Mutex::new(HashMap::new()))
    }

    pub(super) fn get(&self, key: K, make: impl FnOnce(&K) -> H) -> H {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(key).or_insert_with_key(make).clone()
    }
}

impl<H: Clone> Cache<String, H> {
    /// Like [`Cache::get_str`], with at most `cap` keys of their own: a later new key gets `other`'s
    /// handle (a label's values stay bounded whatever keys arrive).
    pub(super) fn get_capped(&self, key: &str, cap: usize, other: &str, make: impl Fn(&str) -> H) -> H {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = map.get(key) {
            return h.clone();
        }
        let key = if map.len() < cap { key } else { other };
        map.entry(key.to_owned()).or_insert_with(|| make(key)).clone()
    }

    /// Like [`Cache::get`], found by `&str`: no owned key is built unless the handle is new (the request
    /// path records per pool on every request).
    pub(super) fn get_str(&self, key: &str, make: impl FnOnce(&str) -> H) -> H {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = map.get(key) {
            return h.clone();
        }
        let h = make(key);
        map.insert(key.to_owned(), h.clone());
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capped_cache_gives_later_keys_the_other_handle() {
        let c: Cache<String, String> = Cache::new();
        let make = |k: &str| format!("h-{k}");
        assert_eq!(c.get_capped("a", 2, "other", make), "h-a");
        assert_eq!(c.get_capped("b", 2, "other", make), "h-b");
        assert_eq!(c.get_capped("c", 2, "other", make), "h-other");
        assert_eq!(c.get_capped("d", 2, "other", make), "h-other");
        assert_eq!(c.get_capped("a", 2, "other", make), "h-a", "a key of its own keeps it");
        assert_eq!(c.0.lock().unwrap().len(), 3);
    }
}
