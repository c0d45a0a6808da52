//! The key → slot table: open addressing with linear probing, sized once for the whole budget.
//!
//! Why not `HashMap<u64, u32>`: its bucket is 16 bytes plus a control byte, and it rehashes everything
//! when it grows, which at ten million keys is a stall of a few hundred milliseconds under the index
//! lock. Here an entry is 8 bytes (32 hash bits | slot + 1; 0 = empty), the key itself lives in its node,
//! and the table is allocated zeroed for `max_blocks` at a load factor ≤ 3/4 up front (the OS commits
//! the zero pages as they are used), so it never rehashes. Removal shifts the following entries back
//! instead of leaving tombstones, so lookups never slow down with churn.
//!
//! Keys are hashed with a per-index random seed: they come from clients' prompts (and workers' events),
//! so their low bits must not be able to pile up into one probe run.

/// Most keys a table can hold: its capacity is then 2^32, the most the 32 stored hash bits can place.
pub(super) const MAX_KEYS: usize = 3 << 30;

pub(super) struct Table {
    entries: Vec<u64>,
    /// `entries.len() - 1` (the length is a power of two).
    mask: usize,
    /// `32 - log2(entries.len())`: the stored hash bits shifted by this are the home position.
    shift: u32,
    seed: u64,
}

impl Table {
    /// A table for up to `max_keys` keys (clamped to 1..=[`MAX_KEYS`]).
    pub(super) fn new(max_keys: usize, seed: u64) -> Table {
        let max_keys = max_keys.clamp(1, MAX_KEYS);
        let capacity = (max_keys + max_keys.div_ceil(3)).next_power_of_two().max(8);
        Table { entries: vec![0; capacity], mask: capacity - 1, shift: 32 - capacity.trailing_zeros(), seed }
    }

    /// The slot holding `key`; `key_of(slot)` is the key stored at a slot.
    pub(super) fn get(&self, key: u64, key_of: impl Fn(u32) -> u64) -> Option<u32> {
        self.position(key, key_of).map(|i| slot_of(self.entries[i]))
    }

    /// Adds `key` (which must be absent) at `slot`.
    pub(super) fn insert(&mut self, key: u64, slot: u32) {
        let hash = self.hash(key);
        let mut i = self.home(hash);
        while self.entries[i] != 0 {
            i = (i + 1) & self.mask;
        }
        self.entries[i] = u64::from(hash) << 32 | u64::from(slot + 1);
    }

    /// Removes `key`; false if it was absent.
    pub(super) fn remove(&mut self, key: u64, key_of: impl Fn(u32) -> u64) -> bool {
        let Some(mut hole) = self.position(key, key_of) else {
            return false;
        };
        // Backward shift: move each following entry of the run into the hole if its home allows.
        let mut j = (hole + 1) & self.mask;
        while self.entries[j] != 0 {
            let home = self.home((self.entries[j] >> 32) as u32);
            if (j.wrapping_sub(home) & self.mask) >= (j.wrapping_sub(hole) & self.mask) {
                self.entries[hole] = self.entries[j];
                hole = j;
            }
            j = (j + 1) & self.mask;
        }
        self.entries[hole] = 0;
        true
    }

    fn position(&self, key: u64, key_of: impl Fn(u32) -> u64) -> Option<usize> {
        let hash = self.hash(key);
        let mut i = self.home(hash);
        loop {
            let e = self.entries[i];
            if e == 0 {
                return None;
            }
            // The 32 stored hash bits rule out almost every other key before its node is read.
            if (e >> 32) as u32 == hash && key_of(slot_of(e)) == key {
                return Some(i);
            }
            i = (i + 1) & self.mask;
        }
    }

    /// 32 well-mixed bits of `key` (a 64-bit finalizer over the seeded key, top half).
    fn hash(&self, key: u64) -> u32 {
        let mut x = key ^ self.seed;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^= x >> 33;
        (x >> 32) as u32
    }

    fn home(&self, hash: u32) -> usize {
        // A 64-bit shift so that a 2^32-entry table (shift 0) and an 8-entry one both work.
        (u64::from(hash) >> self.shift) as usize & self.mask
    }
}

fn slot_of(entry: u64) -> u32 {
    (entry as u32) - 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn capacity_keeps_the_load_at_most_three_quarters() {
        for (keys, capacity) in [(1, 8), (6, 8), (7, 16), (12, 16), (13, 32), (1_000_000, 1 << 21)] {
            let t = Table::new(keys, 0);
            assert_eq!(t.entries.len(), capacity, "{keys} keys");
            assert!(keys * 4 <= capacity * 3);
        }
    }

    #[test]
    fn colliding_homes_survive_removal_from_the_middle_of_a_run() {
        // Seed 0 and a tiny table: many keys share homes, so runs wrap and shift.
        let keys: Vec<u64> = (0..6).collect();
        let mut t = Table::new(6, 0);
        for (slot, &k) in keys.iter().enumerate() {
            t.insert(k, slot as u32);
        }
        let key_of = |s: u32| keys[s as usize];
        for (slot, &k) in keys.iter().enumerate() {
            assert_eq!(t.get(k, key_of), Some(slot as u32));
        }
        assert!(t.remove(2, key_of));
        assert!(!t.remove(2, key_of));
        assert_eq!(t.get(2, key_of), None);
        for (slot, &k) in keys.iter().enumerate().filter(|&(_, &k)| k != 2) {
            assert_eq!(t.get(k, key_of), Some(slot as u32), "key {k} lost after removing 2");
        }
    }

    proptest! {
        /// Inserts and removals in any order agree with a HashMap (small tables force wrap-around runs).
        #[test]
        fn agrees_with_a_hash_map(ops in proptest::collection::vec((any::<bool>(), 0u64..40), 0..300), seed: u64) {
            let mut t = Table::new(30, seed);
            let mut model: HashMap<u64, u32> = HashMap::new();
            // Slot s always holds key s here, so the key of a slot is the slot itself.
            let key_of = |s: u32| u64::from(s);
            for (insert, k) in ops {
                if insert && !model.contains_key(&k) && model.len() < 30 {
                    t.insert(k, k as u32);
                    model.insert(k, k as u32);
                } else if !insert {
                    prop_assert_eq!(t.remove(k, key_of), model.remove(&k).is_some());
                }
                for probe in 0..40u64 {
                    prop_assert_eq!(t.get(probe, key_of), model.get(&probe).copied());
                }
            }
        }
    }
}
