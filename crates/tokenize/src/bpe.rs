//! Byte-level BPE with the exact merge order of `tokenizers`' `BPE` model.
//!
//! `tokenizers` merges with a priority queue ordered by `(rank, position)` and discards stale entries;
//! that is the same as repeatedly merging the left-most adjacent pair of minimal rank until no adjacent
//! pair is in the merge table. This module does exactly that, on raw bytes rather than on the
//! byte-level-encoded characters (the byte <-> character map is a bijection):
//!
//! * a whole-word fast path: when the piece is itself a vocabulary token *and* BPE of that token's
//!   bytes yields the token (checked for every token when loading), the answer is that one id;
//!   with `ignore_merges` the vocabulary hit alone decides, as in `tokenizers`;
//! * short pieces: flat arrays on the stack, minimum found by a linear scan (no allocation);
//! * longer pieces: a linked list and a min-tree of `(rank, position)`, `O(n log n)` (stack arrays up to
//!   128 bytes).

use crate::hash::{pair_key, BytesMap, PairMap, NO_MERGE};

/// Payload bit of [`Bpe::vocab`]: the token's bytes encode to the token itself.
const WHOLE: u32 = 1 << 31;
const ID_MASK: u32 = WHOLE - 1;

/// Pieces up to this many bytes use the stack-array algorithm.
const LINEAR_MAX: usize = 24;

pub(crate) struct Bpe {
    /// Token bytes -> id (low 31 bits) | [`WHOLE`].
    vocab: BytesMap,
    /// Id of each single byte.
    byte_ids: [u32; 256],
    /// Packed merge of two single bytes, indexed by `(a << 8) | b`.
    byte_pairs: Box<[u64]>,
    /// Packed `(rank << 32) | new_id` by pair of ids.
    merges: PairMap,
    ignore_merges: bool,
}

impl Bpe {
    /// `vocab`: token bytes and ids (ids < 2^31, all 256 single bytes present, no id shared by two
    /// tokens). `merges`: `(left id, right id, merged id)` in rank order; a later duplicate of a pair
    /// replaces the earlier one, like `tokenizers`' `HashMap` collect.
    pub(crate) fn new(map: BytesMap, merges: &[(u32, u32, u32)], ignore_merges: bool) -> Bpe {
        let mut byte_ids = [0u32; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = map.get(&[b as u8]).expect("all single bytes are in the vocabulary");
        }
        let mut pm = PairMap::with_capacity(merges.len());
        for (rank, &(a, b, new_id)) in merges.iter().enumerate() {
            pm.insert(pair_key(a, b), ((rank as u64) << 32) | new_id as u64);
        }
        let mut byte_pairs = vec![NO_MERGE; 1 << 16].into_boxed_slice();
        for a in 0..256 {
            for b in 0..256 {
                byte_pairs[(a << 8) | b] = pm.get(pair_key(byte_ids[a], byte_ids[b]));
            }
        }
        let mut bpe = Bpe { vocab: map, byte_ids, byte_pairs, merges: pm, ignore_merges };
        if !ignore_merges {
            // Mark the tokens that BPE maps to themselves.
            let mut key = Vec::new();
            let mut scratch = Vec::new();
            for i in 0..bpe.vocab.n_slots() {
                let Some(id) = bpe.vocab.slot(i, &mut key) else { continue };
                if key.is_empty() {
                    continue;
                }
                scratch.clear();
                bpe.merge(&key, &mut scratch);
                if scratch.len() == 1 && scratch[0] == id {
                    bpe.vocab.set_slot_value(i, id | WHOLE);
                }
            }
        }
        bpe
    }

    /// Id of a token given by its raw bytes.
    pub(crate) fn token_id(&self, bytes: &[u8]) -> Option<u32> {
        self.vocab.get(bytes).map(|v| v & ID_MASK)
    }

    /// Appends the ids of one pre-tokenized piece (non-empty) to `out`.
    #[inline]
    pub(crate) fn encode_piece(&self, w: &[u8], out: &mut Vec<u32>) {
        if w.len() == 1 {
            out.push(self.byte_ids[w[0] as usize]);
            return;
        }
        if let Some(v) = self.vocab.get(w) {
            if self.ignore_merges || v & WHOLE != 0 {
                out.push(v & ID_MASK);
                return;
            }
        }
        self.merge(w, out);
    }

    /// Runs the merge loop on `w` (at least one byte) and appends the result.
    fn merge(&self, w: &[u8], out: &mut Vec<u32>) {
        let n = w.len();
        if n <= 8 {
            self.merge_linear::<8>(w, out)
        } else if n <= LINEAR_MAX {
            self.merge_linear::<LINEAR_MAX>(w, out)
        } else if n <= 128 {
            let mut ids = [0u32; 128];
            let mut next = [0u32; 128];
            let mut prev = [0u32; 128];
            let mut new_ids = [0u32; 128];
            let mut tree = [NO_MERGE; 256];
            self.merge_tree(w, &mut ids, &mut next, &mut prev, &mut new_ids, &mut tree, out)
        } else {
            self.merge_tree_heap(w, out)
        }
    }

    /// Small pieces: symbols and pair merges in flat arrays; the left-most minimum is found by a scan.
    #[inline]
    fn merge_linear<const N: usize>(&self, w: &[u8], out: &mut Vec<u32>) {
        let n = w.len();
        debug_assert!((1..=N).contains(&n));
        let mut syms = [0u32; N];
        // packed[i]: merge of (syms[i], syms[i + 1]); `NO_MERGE` (the maximum) when none.
        let mut packed = [NO_MERGE; N];
        for i in 0..n {
            syms[i] = self.byte_ids[w[i] as usize];
        }
        for i in 0..n - 1 {
            packed[i] = self.byte_pairs[((w[i] as usize) << 8) | w[i + 1] as usize];
        }
        let mut len = n;
        while len > 1 {
            // Left-most minimum. Ranks are unique per pair, so equal values mean equal pairs.
            let mut best = packed[0];
            let mut bi = 0;
            for (i, &p) in packed[1..len - 1].iter().enumerate() {
                if p < best {
                    best = p;
                    bi = i + 1;
                }
            }
            if best == NO_MERGE {
                break;
            }
            syms[bi] = best as u32;
            for k in bi + 1..len - 1 {
                syms[k] = syms[k + 1];
                packed[k - 1] = packed[k];
            }
            len -= 1;
            if bi > 0 {
                packed[bi - 1] = self.merges.get(pair_key(syms[bi - 1], syms[bi]));
            }
            if bi + 1 < len {
                packed[bi] = self.merges.get(pair_key(syms[bi], syms[bi + 1]));
            }
        }
        out.extend_from_slice(&syms[..len]);
    }

    /// [`merge_tree`](Self::merge_tree) with its working arrays on the heap (pieces over 128 bytes).
    fn merge_tree_heap(&self, w: &[u8], out: &mut Vec<u32>) {
        let n = w.len();
        let (mut ids, mut next, mut prev, mut new_ids) = (vec![0; n], vec![0; n], vec![0; n], vec![0; n]);
        let mut tree = vec![NO_MERGE; 2 * n.next_power_of_two()];
        self.merge_tree(w, &mut ids, &mut next, &mut prev, &mut new_ids, &mut tree, out)
    }

    /// Longer pieces: a linked list of symbols and a min-tree over the pair at each position, keyed by
    /// `(rank << 32) | position`, so the root is always the left-most pair of minimal rank. Each merge
    /// updates at most three leaves and looks up exactly the two new pairs.
    #[allow(clippy::too_many_arguments)]
    fn merge_tree(
        &self,
        w: &[u8],
        ids: &mut [u32],
        next: &mut [u32],
        prev: &mut [u32],
        new_ids: &mut [u32],
        tree: &mut [u64],
        out: &mut Vec<u32>,
    ) {
        let n = w.len();
        let size = n.next_power_of_two();
        let tree = &mut tree[..2 * size];
        for i in 0..n {
            ids[i] = self.byte_ids[w[i] as usize];
            next[i] = i as u32 + 1;
            prev[i] = (i as u32).wrapping_sub(1);
        }
        for i in 0..n - 1 {
            let p = self.byte_pairs[((w[i] as usize) << 8) | w[i + 1] as usize];
            new_ids[i] = p as u32;
            tree[size + i] = if p == NO_MERGE { NO_MERGE } else { (p & !0xFFFF_FFFF) | i as u64 };
        }
        for k in (1..size).rev() {
            tree[k] = tree[2 * k].min(tree[2 * k + 1]);
        }
        #[inline(always)]
        fn set(tree: &mut [u64], size: usize, i: usize, v: u64) {
            let mut k = size + i;
            tree[k] = v;
            while k > 1 {
                let m = tree[k].min(tree[k ^ 1]);
                k >>= 1;
                if tree[k] == m {
                    break;
                }
                tree[k] = m;
            }
        }
        loop {
            let top = tree[1];
            if top == NO_MERGE {
                break;
            }
            let pos = (top & 0xFFFF_FFFF) as usize;
            let nx = next[pos] as usize;
            ids[pos] = new_ids[pos];
            let nn = next[nx] as usize;
            next[pos] = nn as u32;
            if nn < n {
                prev[nn] = pos as u32;
            }
            set(tree, size, nx, NO_MERGE);
            let pp = prev[pos] as usize;
            if pp < n {
                let q = self.merges.get(pair_key(ids[pp], ids[pos]));
                new_ids[pp] = q as u32;
                set(tree, size, pp, if q == NO_MERGE { NO_MERGE } else { (q & !0xFFFF_FFFF) | pp as u64 });
            }
            let q = if nn < n { self.merges.get(pair_key(ids[pos], ids[nn])) } else { NO_MERGE };
            new_ids[pos] = q as u32;
            set(tree, size, pos, if q == NO_MERGE { NO_MERGE } else { (q & !0xFFFF_FFFF) | pos as u64 });
        }
        let mut i = 0;
        while i < n {
            out.push(ids[i]);
            i = next[i] as usize;
        }
    }

    /// Approximate heap size in bytes.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.vocab.heap_bytes() + self.merges.heap_bytes() + self.byte_pairs.len() * 8
    }

    /// Number of merges in the table.
    pub(crate) fn n_merges(&self) -> usize {
        self.merges.len()
    }

    #[cfg(test)]
    pub(crate) fn merge_both_ways(&self, w: &[u8]) -> (Vec<u32>, Vec<u32>) {
        let mut a = Vec::new();
        let mut b = Vec::new();
        self.merge_linear::<256>(w, &mut a);
        self.merge_tree_heap(w, &mut b);
        (a, b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy vocabulary over the bytes plus a few merges, including a non-monotonic rank order and a
    /// token reachable by two different merges.
    fn toy() -> Bpe {
        let mut vocab: Vec<(Vec<u8>, u32)> = (0..=255u8).map(|b| (vec![b], b as u32)).collect();
        let mut next = 256u32;
        let mut add = |s: &str, vocab: &mut Vec<(Vec<u8>, u32)>| {
            vocab.push((s.as_bytes().to_vec(), next));
            next += 1;
            next - 1
        };
        let ab = add("ab", &mut vocab);
        let bc = add("bc", &mut vocab);
        let abc = add("abc", &mut vocab);
        let aa = add("aa", &mut vocab);
        let aaa = add("aaa", &mut vocab);
        let merges = vec![
            (b'b' as u32, b'c' as u32, bc),
            (b'a' as u32, b'a' as u32, aa),
            (ab, b'c' as u32, abc),
            (b'a' as u32, b'b' as u32, ab),
            (b'a' as u32, bc, abc),
            (aa, b'a' as u32, aaa),
        ];
        Bpe::new(BytesMap::new(&vocab), &merges, false)
    }

    fn enc(b: &Bpe, s: &str) -> Vec<u32> {
        let mut v = Vec::new();
        b.encode_piece(s.as_bytes(), &mut v);
        v
    }

    #[test]
    fn toy_merges() {
        let b = toy();
        // "abc": (b,c) has rank 0 -> a + bc -> (a, bc) rank 4 -> abc.
        assert_eq!(enc(&b, "abc"), vec![258]);
        // "aaaa": (a,a) at 0 first -> aa a a -> (a,a) at 1 (rank 1 < rank 5 of (aa,a)) -> aa aa.
        assert_eq!(enc(&b, "aaaa"), vec![259, 259]);
        // "aaa": aa a -> (aa, a) -> aaa.
        assert_eq!(enc(&b, "aaa"), vec![260]);
        assert_eq!(enc(&b, "abab"), vec![256, 256]);
        for w in ["abcaaabcab", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab", "a", "ab", "bcbcbcabcaaaab"] {
            let (x, y) = b.merge_both_ways(w.as_bytes());
            assert_eq!(x, y, "{w}");
        }
    }
}
