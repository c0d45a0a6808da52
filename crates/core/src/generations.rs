//! A bounded cache in two generations: lookups promote from `old` to `new`; when `new` is full (in
//! entries or in weight) it becomes `old` and the previous `old` is dropped. Bounded memory, LRU-like,
//! O(1) per operation. The segment cache (`prompt/segments.rs`) and the prompt memo
//! (`pipeline/memo.rs`) keep their values in one.

use std::collections::HashMap;

pub(crate) struct Generations<V> {
    new: HashMap<u128, V>,
    old: HashMap<u128, V>,
    /// Weight of what `new` holds.
    new_weight: usize,
    max_entries: usize,
    max_weight: usize,
    weight: fn(&V) -> usize,
}

impl<V: Clone> Generations<V> {
    /// At most `max_entries` values and `max_weight` of weight per generation (so twice that in all).
    pub(crate) fn new(max_entries: usize, max_weight: usize, weight: fn(&V) -> usize) -> Generations<V> {
        let (new, old) = (HashMap::new(), HashMap::new());
        Generations { new, old, new_weight: 0, max_entries, max_weight, weight }
    }

    /// The value under `key`; one found in `old` moves to `new` (which may drop a generation: it is
    /// freed here, under the caller's lock, which only a rotation makes long).
    pub(crate) fn get(&mut self, key: u128) -> Option<V> {
        if let Some(v) = self.new.get(&key) {
            return Some(v.clone());
        }
        let v = self.old.remove(&key)?;
        let _dropped = self.insert(key, v.clone());
        Some(v)
    }

    /// Keeps `value` under `key` (nothing heavier than a whole generation is kept). Returns the
    /// generation this dropped, empty if none, so the caller can free it after releasing its lock.
    pub(crate) fn insert(&mut self, key: u128, value: V) -> HashMap<u128, V> {
        let w = (self.weight)(&value);
        if w > self.max_weight {
            return HashMap::new();
        }
        let mut dropped = HashMap::new();
        if self.new.len() >= self.max_entries || self.new_weight + w > self.max_weight {
            dropped = std::mem::replace(&mut self.old, std::mem::take(&mut self.new));
            self.new_weight = 0;
        }
        self.new_weight += w;
        if let Some(replaced) = self.new.insert(key, value) {
            self.new_weight -= (self.weight)(&replaced);
        }
        dropped
    }

    /// Drops the value under `key` from both generations (an insert leaves an older copy in `old`).
    /// Returns what it dropped, to be freed after the caller's lock.
    pub(crate) fn remove(&mut self, key: u128) -> (Option<V>, Option<V>) {
        let new = self.new.remove(&key);
        if let Some(v) = &new {
            self.new_weight -= (self.weight)(v);
        }
        (new, self.old.remove(&key))
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.new.len() + self.old.len()
    }

    /// Weight held in both generations.
    #[cfg(test)]
    pub(crate) fn weight(&self) -> usize {
        self.new.values().chain(self.old.values()).map(self.weight).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gens() -> Generations<Vec<u8>> {
        Generations::new(4, 10, Vec::len)
    }

    #[test]
    fn old_hits_are_promoted_and_survive_a_rotation() {
        let mut g = gens();
        let _ = g.insert(1, vec![1]);
        for k in 10..14 {
            let _ = g.insert(k, vec![0]); // 1 turns old at the fourth
        }
        assert_eq!(g.get(1), Some(vec![1]), "promoted");
        for k in 20..23 {
            let _ = g.insert(k, vec![0]);
        }
        assert_eq!(g.get(1), Some(vec![1]), "in the current generation, it outlived one rotation");
        for k in 30..38 {
            let _ = g.insert(k, vec![0]);
        }
        assert_eq!(g.get(1), None, "two rotations later it is gone");
    }

    #[test]
    fn bounded_in_entries_and_weight_and_the_weight_stays_exact() {
        let mut g = gens();
        for k in 0..100u128 {
            let _ = g.insert(k, vec![0; (k % 4) as usize]);
            let _ = g.insert(k, vec![0; (k % 3) as usize]); // a replacement
            assert!(g.len() <= 8 && g.weight() <= 20, "{} entries, weight {}", g.len(), g.weight());
            assert_eq!(g.new_weight, g.new.values().map(Vec::len).sum::<usize>());
        }
        for k in (0..100u128).step_by(3) {
            let _ = g.remove(k);
            assert_eq!(g.get(k), None, "removed");
            assert_eq!(g.new_weight, g.new.values().map(Vec::len).sum::<usize>());
        }
        assert!(g.insert(500, vec![0; 11]).is_empty());
        assert_eq!(g.get(500), None, "heavier than a generation: not kept");
    }
}
