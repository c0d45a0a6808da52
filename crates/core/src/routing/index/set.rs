//! Worker sets as fixed bitsets of [`MAX_WORKERS`] bits: [`WorkerSet`] (the event holders of a widely
//! held key) and [`Matching`] (the workers a probe still matches).
//!
//! `Matching` works on the range of words that can still hold a member: it starts with the words of
//! the pool (one for 8 workers, sixteen for 1024) and narrows as workers drop out, so after a shared
//! system prompt a probe with four workers left touches one or two words per block, not sixteen.

use super::limits::MAX_WORKERS;

/// Words in a full set.
const WORDS: usize = MAX_WORKERS / 64;

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
        for (i, word) in set.bits.iter_mut().enumerate().take(n.div_ceil(64)) {
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

    pub(super) fn remove(&mut self, w: usize) {
        if let Some(word) = self.bits.get_mut(w / 64) {
            *word &= !(1u64 << (w % 64));
        }
    }

    pub(super) fn len(&self) -> usize {
        self.bits.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Calls `f` with every member, lowest first.
    pub(super) fn for_each(&self, mut f: impl FnMut(usize)) {
        for_each_bit(&self.bits, 0, &mut f);
    }
}

/// Calls `f` with the set bits of `words`, numbered from `first_word`.
fn for_each_bit(words: &[u64], first_word: usize, f: &mut impl FnMut(usize)) {
    for (i, &word) in words.iter().enumerate() {
        let mut word = word;
        while word != 0 {
            f((first_word + i) * 64 + word.trailing_zeros() as usize);
            word &= word - 1;
        }
    }
}

/// The probe's state: the workers that held every block so far (`alive`), and those found holding the
/// current block (`marked`). Both are zero outside `lo..hi`.
pub(super) struct Matching {
    alive: WorkerSet,
    marked: WorkerSet,
    lo: usize,
    hi: usize,
}

impl Matching {
    /// Every worker of `0..n` alive.
    pub(super) fn new(n: usize) -> Matching {
        let alive = WorkerSet::first(n);
        Matching { alive, marked: WorkerSet::EMPTY, lo: 0, hi: n.min(MAX_WORKERS).div_ceil(64) }
    }

    pub(super) fn is_alive(&self, w: usize) -> bool {
        self.alive.contains(w)
    }

    /// `w` holds the current block (only meaningful for an alive `w`).
    pub(super) fn mark(&mut self, w: usize) {
        self.marked.insert(w);
    }

    /// Marks the alive members of `set`.
    pub(super) fn mark_all(&mut self, set: &WorkerSet) {
        for i in self.lo..self.hi {
            self.marked.bits[i] |= self.alive.bits[i] & set.bits[i];
        }
    }

    /// Ends the current block: calls `dropped` with each alive worker that was not marked (lowest first),
    /// keeps the marked ones alive and clears the marks. False once no worker is alive.
    pub(super) fn advance(&mut self, mut dropped: impl FnMut(usize)) -> bool {
        let (mut lo, mut hi) = (self.hi, self.lo);
        for i in self.lo..self.hi {
            let (alive, marked) = (self.alive.bits[i], self.marked.bits[i]);
            for_each_bit(&[alive & !marked], i, &mut dropped);
            if marked != 0 {
                lo = lo.min(i);
                hi = i + 1;
            }
            self.alive.bits[i] = marked;
            self.marked.bits[i] = 0;
        }
        (self.lo, self.hi) = if lo < hi { (lo, hi) } else { (0, 0) };
        self.lo < self.hi
    }

    /// Calls `f` with every alive worker, lowest first.
    pub(super) fn for_each_alive(&self, mut f: impl FnMut(usize)) {
        for_each_bit(&self.alive.bits[self.lo..self.hi], self.lo, &mut f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(s: &WorkerSet) -> Vec<usize> {
        let mut out = Vec::new();
        s.for_each(|w| out.push(w));
        out
    }

    fn alive(m: &Matching) -> Vec<usize> {
        let mut out = Vec::new();
        m.for_each_alive(|w| out.push(w));
        out
    }

    #[test]
    fn first_n_sets_exactly_the_low_ids_across_word_edges() {
        for n in [0, 1, 63, 64, 65, 127, 128, 1023, 1024, 5000] {
            let s = WorkerSet::first(n);
            let want: Vec<usize> = (0..n.min(MAX_WORKERS)).collect();
            assert_eq!(members(&s), want, "n = {n}");
            assert_eq!(s.len(), want.len());
            assert_eq!(alive(&Matching::new(n)), want, "n = {n}");
        }
    }

    #[test]
    fn insert_remove_and_contains_at_the_edges() {
        let mut s = WorkerSet::EMPTY;
        for w in [0, 63, 64, 1023] {
            assert!(!s.contains(w));
            s.insert(w);
            assert!(s.contains(w), "{w}");
        }
        s.insert(1024); // out of range: ignored, not a panic
        s.remove(5000);
        assert!(!s.contains(1024) && !s.contains(usize::MAX));
        assert_eq!(members(&s), vec![0, 63, 64, 1023]);
        s.remove(63);
        assert_eq!((members(&s), s.len()), (vec![0, 64, 1023], 3));
    }

    #[test]
    fn matching_drops_unmarked_workers_and_narrows_its_words() {
        let mut m = Matching::new(1024);
        for w in [0, 63, 64, 700, 1023] {
            m.mark(w);
        }
        let mut dropped = Vec::new();
        assert!(m.advance(|w| dropped.push(w)));
        assert_eq!(dropped.len(), 1024 - 5);
        assert!(!dropped.contains(&63) && dropped.contains(&62) && dropped.contains(&65));
        assert_eq!(alive(&m), vec![0, 63, 64, 700, 1023]);
        // A bitset member outside the alive set is not marked.
        let mut set = WorkerSet::EMPTY;
        for w in [63, 64, 65, 1023] {
            set.insert(w);
        }
        m.mark_all(&set);
        dropped.clear();
        assert!(m.advance(|w| dropped.push(w)));
        assert_eq!((dropped.clone(), alive(&m)), (vec![0, 700], vec![63, 64, 1023]));
        assert_eq!((m.lo, m.hi), (0, 16));
        m.mark(64);
        assert!(m.advance(|_| {}));
        assert_eq!((alive(&m), m.lo, m.hi), (vec![64], 1, 2), "only word 1 is left");
        assert!(!m.is_alive(63) && m.is_alive(64));
        dropped.clear();
        assert!(!m.advance(|w| dropped.push(w)), "nobody marked: nobody left");
        assert_eq!(dropped, vec![64]);
        assert!(!Matching::new(0).advance(|_| {}));
    }
}
