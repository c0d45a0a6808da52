//! A set of worker ids as a fixed bitset of [`MAX_WORKERS`] bits: the workers a probe still matches.
//!
//! Operations take the number of 64-bit words in use ([`words`]), so a pool of 8 workers touches one
//! word per block, not sixteen.

use super::MAX_WORKERS;

/// Words in a full set.
const WORDS: usize = MAX_WORKERS / 64;

/// Words needed for workers `0..n` (`n` clamped to [`MAX_WORKERS`]).
pub(super) fn words(n: usize) -> usize {
    n.min(MAX_WORKERS).div_ceil(64)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct WorkerSet {
    bits: [u64; WORDS],
}

impl WorkerSet {
    pub(super) const EMPTY: WorkerSet = WorkerSet { bits: [0; WORDS] };

    /// Workers `0..n` (`n` clamped to [`MAX_WORKERS`]).
    pub(super) fn first(n: usize) -> WorkerSet {
        let n = n.min(MAX_WORKERS);
        let mut set = WorkerSet::EMPTY;
        for (i, word) in set.bits.iter_mut().enumerate().take(words(n)) {
            let bits_here = n - i * 64;
            *word = if bits_here >= 64 { u64::MAX } else { (1u64 << bits_here) - 1 };
        }
        set
    }

    /// False for any id at or above [`MAX_WORKERS`].
    pub(super) fn contains(&self, w: usize) -> bool {
        self.bits.get(w / 64).is_some_and(|word| word >> (w % 64) & 1 == 1)
    }

    /// Ids at or above [`MAX_WORKERS`] are ignored.
    pub(super) fn insert(&mut self, w: usize) {
        if let Some(word) = self.bits.get_mut(w / 64) {
            *word |= 1u64 << (w % 64);
        }
    }

    /// Empties the first `words` words (the rest must already be empty).
    pub(super) fn clear(&mut self, words: usize) {
        self.bits[..words].fill(0);
    }

    pub(super) fn is_empty(&self, words: usize) -> bool {
        self.bits[..words].iter().all(|&w| w == 0)
    }

    /// Calls `f` with every member of `self` missing from `other`, lowest first.
    pub(super) fn for_each_missing(&self, other: &WorkerSet, words: usize, mut f: impl FnMut(usize)) {
        for (i, (&a, &b)) in self.bits[..words].iter().zip(&other.bits[..words]).enumerate() {
            let mut word = a & !b;
            while word != 0 {
                f(i * 64 + word.trailing_zeros() as usize);
                word &= word - 1;
            }
        }
    }

    /// Calls `f` with every member, lowest first.
    pub(super) fn for_each(&self, words: usize, f: impl FnMut(usize)) {
        self.for_each_missing(&WorkerSet::EMPTY, words, f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(s: &WorkerSet) -> Vec<usize> {
        let mut out = Vec::new();
        s.for_each(WORDS, |w| out.push(w));
        out
    }

    #[test]
    fn first_n_sets_exactly_the_low_ids_across_word_edges() {
        for n in [0, 1, 63, 64, 65, 127, 128, 1023, 1024, 5000] {
            let s = WorkerSet::first(n);
            let want: Vec<usize> = (0..n.min(MAX_WORKERS)).collect();
            assert_eq!(members(&s), want, "n = {n}");
        }
        assert_eq!((words(0), words(1), words(64), words(65), words(1024), words(9999)), (0, 1, 1, 2, 16, 16));
    }

    #[test]
    fn insert_contains_and_missing_at_the_edges() {
        let mut s = WorkerSet::EMPTY;
        for w in [0, 63, 64, 1023] {
            assert!(!s.contains(w));
            s.insert(w);
            assert!(s.contains(w), "{w}");
        }
        s.insert(1024); // out of range: ignored, not a panic
        assert!(!s.contains(1024) && !s.contains(usize::MAX));
        assert_eq!(members(&s), vec![0, 63, 64, 1023]);
        let mut other = WorkerSet::EMPTY;
        other.insert(64);
        let mut missing = Vec::new();
        s.for_each_missing(&other, WORDS, |w| missing.push(w));
        assert_eq!(missing, vec![0, 63, 1023]);
        assert!(!s.is_empty(WORDS));
        assert!(!s.is_empty(1), "word 0 holds 0 and 63");
        s.clear(WORDS);
        assert!(s.is_empty(WORDS));
    }
}
