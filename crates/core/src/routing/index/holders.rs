//! The holders of one key: which workers hold it, from which [`Source`], stamped when.
//!
//! Most keys are held by one or two workers, so two holders live inline in the node (12 bytes, no
//! allocation); a third moves them all to the heap ([`Many`]), and dropping back to two moves them
//! back. A holder is a 16-bit tag (worker id in the low 12 bits, source above) and a 32-bit stamp;
//! a worker appears at most once per key. Memory is therefore proportional to the holders present:
//! a heap list never keeps more than twice its length in spare capacity.

use super::{Source, MAX_WORKERS};

/// Tag of an unused inline position.
const EMPTY: u16 = u16::MAX;
/// Worker ids use the low bits of a tag (1024 workers need 10), the source sits above them.
const SOURCE_SHIFT: u16 = 12;
const INLINE: usize = 2;

const _: () = assert!(MAX_WORKERS <= 1 << SOURCE_SHIFT);

/// One (key, worker) entry as seen from outside.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Holder {
    pub worker: u16,
    pub source: Source,
    pub stamp: u32,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    stamp: u32,
    tag: u16,
}

impl Entry {
    fn new(h: Holder) -> Entry {
        Entry { stamp: h.stamp, tag: h.worker | (h.source as u16) << SOURCE_SHIFT }
    }

    fn worker(self) -> u16 {
        self.tag & ((1 << SOURCE_SHIFT) - 1)
    }

    fn holder(self) -> Holder {
        let source = match self.tag >> SOURCE_SHIFT {
            0 => Source::Event,
            1 => Source::Pending,
            _ => Source::Approximate,
        };
        Holder { worker: self.worker(), source, stamp: self.stamp }
    }
}

/// Three or more holders, unordered.
#[derive(Debug)]
pub(super) struct Many {
    entries: Vec<Entry>,
}

#[derive(Debug)]
pub(super) enum Holders {
    /// Up to two holders; unused positions are [`EMPTY`] and always after the used ones.
    Inline {
        stamps: [u32; INLINE],
        tags: [u16; INLINE],
    },
    Many(Box<Many>),
}

impl Holders {
    pub(super) const NONE: Holders = Holders::Inline { stamps: [0; INLINE], tags: [EMPTY; INLINE] };

    pub(super) fn is_empty(&self) -> bool {
        match self {
            Holders::Inline { tags, .. } => tags[0] == EMPTY,
            Holders::Many(m) => m.entries.is_empty(),
        }
    }

    /// Calls `f` with every holder (no particular order).
    pub(super) fn for_each(&self, mut f: impl FnMut(Holder)) {
        match self {
            Holders::Inline { stamps, tags } => {
                for i in 0..INLINE {
                    if tags[i] == EMPTY {
                        return;
                    }
                    f(Entry { stamp: stamps[i], tag: tags[i] }.holder());
                }
            }
            Holders::Many(m) => m.entries.iter().for_each(|&e| f(e.holder())),
        }
    }

    pub(super) fn get(&self, worker: u16) -> Option<Holder> {
        let mut found = None;
        self.for_each(|h| {
            if h.worker == worker {
                found = Some(h);
            }
        });
        found
    }

    /// Sets `h.worker`'s entry to `h`; returns the entry it replaced, if any.
    pub(super) fn set(&mut self, h: Holder) -> Option<Holder> {
        let entry = Entry::new(h);
        match self {
            Holders::Inline { stamps, tags } => {
                for i in 0..INLINE {
                    let current = Entry { stamp: stamps[i], tag: tags[i] };
                    if tags[i] == EMPTY || current.worker() == h.worker {
                        (stamps[i], tags[i]) = (entry.stamp, entry.tag);
                        return (current.tag != EMPTY).then(|| current.holder());
                    }
                }
                // Both positions hold other workers: move to the heap.
                let mut entries = Vec::with_capacity(2 * (INLINE + 1));
                entries.extend((0..INLINE).map(|i| Entry { stamp: stamps[i], tag: tags[i] }));
                entries.push(entry);
                *self = Holders::Many(Box::new(Many { entries }));
                None
            }
            Holders::Many(m) => match m.entries.iter_mut().find(|e| e.worker() == h.worker) {
                Some(e) => Some(std::mem::replace(e, entry).holder()),
                None => {
                    m.entries.push(entry);
                    None
                }
            },
        }
    }

    /// Removes `worker`'s entry; returns it if there was one.
    pub(super) fn remove(&mut self, worker: u16) -> Option<Holder> {
        let mut removed = None;
        self.retain(|h| {
            let keep = h.worker != worker;
            if !keep {
                removed = Some(h);
            }
            keep
        });
        removed
    }

    /// Keeps the holders for which `keep` returns true (it sees each holder once).
    pub(super) fn retain(&mut self, mut keep: impl FnMut(Holder) -> bool) {
        match self {
            Holders::Inline { stamps, tags } => {
                let mut kept = 0;
                for i in 0..INLINE {
                    if tags[i] != EMPTY && keep(Entry { stamp: stamps[i], tag: tags[i] }.holder()) {
                        (stamps[kept], tags[kept]) = (stamps[i], tags[i]);
                        kept += 1;
                    }
                }
                tags[kept..].fill(EMPTY);
            }
            Holders::Many(m) => {
                m.entries.retain(|e| keep(e.holder()));
                self.compact();
            }
        }
    }

    /// Back inline at two holders or fewer; at most 2× spare capacity otherwise.
    fn compact(&mut self) {
        let Holders::Many(m) = self else {
            return;
        };
        if m.entries.len() <= INLINE {
            let mut inline = Holders::NONE;
            for &e in &m.entries {
                inline.set(e.holder());
            }
            *self = inline;
        } else if m.entries.capacity() > 4 * m.entries.len() {
            m.entries.shrink_to(2 * m.entries.len());
        }
    }

    /// Heap bytes this key's holders use (0 when inline).
    #[cfg(test)]
    pub(super) fn heap_bytes(&self) -> usize {
        match self {
            Holders::Inline { .. } => 0,
            Holders::Many(m) => std::mem::size_of::<Many>() + m.entries.capacity() * std::mem::size_of::<Entry>(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(worker: u16, source: Source, stamp: u32) -> Holder {
        Holder { worker, source, stamp }
    }

    fn all(hs: &Holders) -> Vec<Holder> {
        let mut v = Vec::new();
        hs.for_each(|h| v.push(h));
        v.sort_by_key(|h| h.worker);
        v
    }

    #[test]
    fn tags_round_trip_every_source_and_the_largest_worker() {
        for source in [Source::Event, Source::Pending, Source::Approximate] {
            for worker in [0, 63, 64, 1023] {
                let x = h(worker, source, u32::MAX);
                assert_eq!(Entry::new(x).holder(), x);
            }
        }
    }

    #[test]
    fn two_holders_stay_inline_a_third_spills_and_removal_comes_back() {
        let mut hs = Holders::NONE;
        assert!(hs.is_empty());
        assert_eq!(hs.set(h(7, Source::Pending, 1)), None);
        assert_eq!(hs.set(h(1023, Source::Event, 2)), None);
        assert_eq!(hs.heap_bytes(), 0);
        assert_eq!(hs.set(h(7, Source::Event, 3)), Some(h(7, Source::Pending, 1)), "replaced in place");
        assert_eq!(hs.set(h(0, Source::Approximate, 4)), None);
        assert!(matches!(hs, Holders::Many(_)));
        assert_eq!(all(&hs), vec![h(0, Source::Approximate, 4), h(7, Source::Event, 3), h(1023, Source::Event, 2)]);
        assert_eq!(hs.get(1023), Some(h(1023, Source::Event, 2)));
        assert_eq!(hs.remove(7), Some(h(7, Source::Event, 3)));
        assert!(matches!(hs, Holders::Inline { .. }), "two holders fit inline again");
        assert_eq!(all(&hs), vec![h(0, Source::Approximate, 4), h(1023, Source::Event, 2)]);
        assert_eq!(hs.remove(7), None);
        assert_eq!(hs.remove(0), Some(h(0, Source::Approximate, 4)));
        assert_eq!(all(&hs), vec![h(1023, Source::Event, 2)], "the survivor moved to the first position");
        hs.remove(1023);
        assert!(hs.is_empty());
    }

    #[test]
    fn a_shrinking_list_releases_its_spare_capacity() {
        let mut hs = Holders::NONE;
        for w in 0..1024 {
            hs.set(h(w, Source::Event, 0));
        }
        let full = hs.heap_bytes();
        hs.retain(|h| h.worker < 10);
        assert_eq!(all(&hs).len(), 10);
        assert!(hs.heap_bytes() <= full / 16, "{} of {full} bytes kept for 10 holders", hs.heap_bytes());
        assert!(hs.heap_bytes() <= std::mem::size_of::<Many>() + 2 * 10 * std::mem::size_of::<Entry>());
    }
}
