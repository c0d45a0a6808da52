//! Two small open-addressing hash tables specialised for the BPE hot path.
//!
//! Both are built once and never modified afterwards, so they need no deletion support and can use
//! linear probing over a power-of-two table with a load factor of at most ~0.6.

/// Folded 64x64->128 multiply: a fast, well-mixing finaliser.
#[inline(always)]
fn fold_mul(a: u64, b: u64) -> u64 {
    let m = (a as u128).wrapping_mul(b as u128);
    (m as u64) ^ ((m >> 64) as u64)
}

const K0: u64 = 0x9E37_79B9_7F4A_7C15;
const K1: u64 = 0x2D35_8DCC_AA6C_78A5;

/// Exact fingerprint of a string of at most 8 bytes (together with its length): the first and last four
/// bytes (overlapping) for 4..=8 bytes, the first, middle and last byte for 1..=3.
#[inline(always)]
fn short_fp(b: &[u8]) -> u64 {
    let n = b.len();
    debug_assert!(n <= 8);
    if n >= 4 {
        let lo = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u64;
        let hi = u32::from_le_bytes([b[n - 4], b[n - 3], b[n - 2], b[n - 1]]) as u64;
        lo | (hi << 32)
    } else if n > 0 {
        (b[0] as u64) | ((b[n / 2] as u64) << 8) | ((b[n - 1] as u64) << 16)
    } else {
        0
    }
}

/// Hash of a byte string.
#[inline(always)]
pub(crate) fn hash_bytes(b: &[u8]) -> u64 {
    let n = b.len();
    let mut h = K0 ^ (n as u64);
    if n <= 8 {
        return fold_mul(h ^ short_fp(b), K1);
    }
    let mut chunks = b.chunks_exact(8);
    for c in &mut chunks {
        h = fold_mul(h ^ u64::from_le_bytes(c.try_into().expect("8 bytes")), K1);
    }
    // The last 8 bytes (overlapping the previous chunk when needed) cover the remainder.
    if !chunks.remainder().is_empty() {
        let tail = u64::from_le_bytes(b[n - 8..].try_into().expect("8 bytes"));
        h = fold_mul(h ^ tail, K0);
    }
    h
}

fn table_size(entries: usize) -> usize {
    // Load factor <= 0.6.
    (entries * 5 / 3 + 1).next_power_of_two().max(16)
}

/// One slot of [`BytesMap`].
#[derive(Clone, Copy)]
struct Slot {
    /// Keys of at most 8 bytes: their exact fingerprint; longer keys: their first 8 bytes.
    head: u64,
    /// Key length, or `u32::MAX` for an empty slot.
    len: u32,
    value: u32,
}

const EMPTY: u32 = u32::MAX;

/// Map from a byte string to a `u32` payload (a token id plus flag bits).
///
/// Keys of up to 8 bytes (most tokens) are compared inside the slot, so a lookup touches one cache line;
/// longer keys also compare their remaining bytes in a side arena.
pub(crate) struct BytesMap {
    slots: Vec<Slot>,
    /// Offset in `arena` of the full key of each slot whose key is longer than 8 bytes.
    long_off: Vec<u32>,
    arena: Vec<u8>,
    shift: u32,
    len: usize,
}

impl BytesMap {
    /// An empty map with room for `n` keys.
    pub(crate) fn with_capacity(n: usize) -> BytesMap {
        let size = table_size(n);
        BytesMap {
            slots: vec![Slot { head: 0, len: EMPTY, value: 0 }; size],
            long_off: vec![0; size],
            arena: Vec::new(),
            shift: 64 - size.trailing_zeros(),
            len: 0,
        }
    }

    /// Builds the map. Later duplicates of a key overwrite earlier ones.
    #[cfg(test)]
    pub(crate) fn new(items: &[(Vec<u8>, u32)]) -> BytesMap {
        let mut map = BytesMap::with_capacity(items.len());
        for (key, value) in items {
            map.insert(key, *value);
        }
        map
    }

    /// Number of keys.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[inline(always)]
    fn head_of(key: &[u8]) -> u64 {
        if key.len() <= 8 {
            short_fp(key)
        } else {
            u64::from_le_bytes(key[..8].try_into().expect("8 bytes"))
        }
    }

    /// Slot index holding `key`, or the empty slot where it would go.
    #[inline(always)]
    fn find(&self, key: &[u8]) -> usize {
        let head = Self::head_of(key);
        let n = key.len() as u32;
        let mask = self.slots.len() - 1;
        let mut i = (hash_bytes(key) >> self.shift) as usize;
        loop {
            let s = self.slots[i];
            if s.len == EMPTY {
                return i;
            }
            if s.len == n && s.head == head {
                if n <= 8 {
                    return i;
                }
                let off = self.long_off[i] as usize;
                if self.arena[off + 8..off + n as usize] == key[8..] {
                    return i;
                }
            }
            i = (i + 1) & mask;
        }
    }

    /// Inserts or overwrites. Panics beyond the capacity given at construction.
    pub(crate) fn insert(&mut self, key: &[u8], value: u32) {
        assert!(key.len() < EMPTY as usize);
        let i = self.find(key);
        if self.slots[i].len == EMPTY {
            assert!(self.len * 5 / 3 < self.slots.len(), "BytesMap over capacity");
            self.len += 1;
            if key.len() > 8 {
                self.long_off[i] = u32::try_from(self.arena.len()).expect("vocabulary under 4 GiB");
                self.arena.extend_from_slice(key);
            }
        }
        self.slots[i] = Slot { head: Self::head_of(key), len: key.len() as u32, value };
    }

    /// Looks a key up.
    #[inline]
    pub(crate) fn get(&self, key: &[u8]) -> Option<u32> {
        let s = self.slots[self.find(key)];
        if s.len == EMPTY {
            None
        } else {
            Some(s.value)
        }
    }

    /// Number of slots (for [`BytesMap::slot`]).
    pub(crate) fn n_slots(&self) -> usize {
        self.slots.len()
    }

    /// Key (written to `buf`) and payload of slot `i`, if occupied.
    pub(crate) fn slot(&self, i: usize, buf: &mut Vec<u8>) -> Option<u32> {
        let s = self.slots[i];
        if s.len == EMPTY {
            return None;
        }
        buf.clear();
        if s.len > 8 {
            let off = self.long_off[i] as usize;
            buf.extend_from_slice(&self.arena[off..off + s.len as usize]);
        } else {
            {
                // Rebuild a short key from its fingerprint.
                let n = s.len as usize;
                let fp = s.head.to_le_bytes();
                match n {
                    0 => {}
                    1..=3 => {
                        buf.push(fp[0]);
                        if n >= 2 {
                            buf.push(if n == 2 { fp[2] } else { fp[1] });
                        }
                        if n == 3 {
                            buf.push(fp[2]);
                        }
                    }
                    _ => {
                        buf.extend_from_slice(&fp[..4]);
                        buf.extend_from_slice(&fp[4 + (8 - n)..8]);
                    }
                }
            }
        }
        Some(s.value)
    }

    /// Replaces the payload of occupied slot `i`.
    pub(crate) fn set_slot_value(&mut self, i: usize, value: u32) {
        assert!(self.slots[i].len != EMPTY);
        self.slots[i].value = value;
    }

    /// Approximate heap size in bytes.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.arena.capacity() + self.slots.capacity() * 16 + self.long_off.capacity() * 4
    }
}

/// Sentinel for "no merge" in [`PairMap`] results: rank `u32::MAX`.
pub(crate) const NO_MERGE: u64 = u64::MAX;

/// Map from a pair of token ids to a packed `(rank << 32) | new_id`.
pub(crate) struct PairMap {
    /// (key, packed value); key `u64::MAX` marks an empty slot.
    slots: Vec<(u64, u64)>,
    shift: u32,
    len: usize,
}

#[inline(always)]
pub(crate) fn pair_key(a: u32, b: u32) -> u64 {
    ((a as u64) << 32) | b as u64
}

impl PairMap {
    pub(crate) fn with_capacity(n: usize) -> PairMap {
        let size = table_size(n);
        PairMap { slots: vec![(u64::MAX, 0); size], shift: 64 - size.trailing_zeros(), len: 0 }
    }

    /// Inserts or overwrites. `key` must not be `u64::MAX`.
    pub(crate) fn insert(&mut self, key: u64, value: u64) {
        assert!(key != u64::MAX);
        assert!(self.len * 5 / 3 < self.slots.len(), "PairMap over capacity");
        let mask = self.slots.len() - 1;
        let mut i = (fold_mul(key, K1) >> self.shift) as usize;
        loop {
            let s = &mut self.slots[i];
            if s.0 == u64::MAX {
                *s = (key, value);
                self.len += 1;
                return;
            }
            if s.0 == key {
                s.1 = value;
                return;
            }
            i = (i + 1) & mask;
        }
    }

    /// Packed `(rank << 32) | new_id`, or [`NO_MERGE`].
    #[inline(always)]
    pub(crate) fn get(&self, key: u64) -> u64 {
        let mask = self.slots.len() - 1;
        let mut i = (fold_mul(key, K1) >> self.shift) as usize;
        loop {
            let (k, v) = self.slots[i];
            if k == key {
                return v;
            }
            if k == u64::MAX {
                return NO_MERGE;
            }
            i = (i + 1) & mask;
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.slots.capacity() * 16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_map_roundtrip() {
        let items: Vec<(Vec<u8>, u32)> = (0..5000u32)
            .map(|i| (format!("k{i}-{}", "x".repeat((i % 23) as usize)).into_bytes(), i))
            .chain((0..600u32).map(|i| ((i % 9..9).map(|j| (i * 7 + j) as u8).collect::<Vec<u8>>(), 100_000 + i)))
            .chain([(Vec::new(), 7777)])
            .collect();
        let m = BytesMap::new(&items);
        for (k, v) in &items {
            assert_eq!(m.get(k), Some(*v));
        }
        assert_eq!(m.get(b"nope"), None);
        assert_eq!(m.get(b"k1-"), None);
        let mut seen = Vec::new();
        let mut buf = Vec::new();
        for i in 0..m.n_slots() {
            if let Some(v) = m.slot(i, &mut buf) {
                seen.push((buf.clone(), v));
            }
        }
        seen.sort();
        let mut want = items.clone();
        want.sort();
        assert_eq!(seen, want);
    }

    #[test]
    fn pair_map_roundtrip() {
        let mut m = PairMap::with_capacity(1000);
        for i in 0..1000u32 {
            m.insert(pair_key(i, i * 7), (i as u64) << 32 | 5);
        }
        m.insert(pair_key(3, 21), 99);
        assert_eq!(m.get(pair_key(3, 21)), 99);
        assert_eq!(m.get(pair_key(4, 28)), (4u64 << 32) | 5);
        assert_eq!(m.get(pair_key(4, 29)), NO_MERGE);
        assert_eq!(m.len(), 1000);
    }
}
