//! The holders of one key: which workers hold it, from which [`Source`], stamped when.
//!
//! A holder is a 16-bit tag (worker id in the low 12 bits, source above) and a 32-bit stamp; a worker
//! appears at most once per key. Three forms, chosen by the number of holders, so memory follows the
//! holders present and a probe follows at most one pointer per key:
//! - **Inline** (≤ 2): inside the node, no allocation — most keys.
//! - **Few** (3–4): one 24-byte allocation.
//! - **Many** (5+): a list (never more than 2× its length in spare capacity) and, once more than
//!   [`WIDE_AT`] holders are events, an event bitset of [`MAX_WORKERS`] bits: a system prompt that
//!   every worker holds is then matched with a few word operations instead of a walk over a thousand
//!   entries. Event holders in the bitset keep no stamp (an event has no TTL).
//!
//! Removals move a key back to the smaller forms.

use super::limits::MAX_WORKERS;
use super::set::{Matching, WorkerSet};
use super::source::Source;

/// Tag of an unused array position.
const EMPTY: u16 = u16::MAX;
/// Worker ids use the low bits of a tag (1024 workers need 10), the source sits above them.
const SOURCE_SHIFT: u16 = 12;
const INLINE: usize = 2;
const FEW: usize = 4;
/// Event holders in a list beyond which they move to a bitset (256 bytes of list vs 128 of bitset).
pub(super) const WIDE_AT: usize = 32;

const _: () = assert!(MAX_WORKERS <= 1 << SOURCE_SHIFT);
const _: () = assert!(std::mem::size_of::<Holders>() == 16);
const _: () = assert!(std::mem::size_of::<Few>() == 24);

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

/// Three or four holders, in one allocation; unused positions are [`EMPTY`], after the used ones.
#[derive(Debug)]
pub(super) struct Few {
    stamps: [u32; FEW],
    tags: [u16; FEW],
}

/// Five or more holders.
#[derive(Debug)]
pub(super) struct Many {
    /// Holders not in `events`, unordered.
    entries: Vec<Entry>,
    /// Event holders, once there are many of them (then `entries` has no event holder).
    events: Option<Box<WorkerSet>>,
}

#[derive(Debug)]
pub(super) enum Holders {
    /// Up to two holders; unused positions are [`EMPTY`], after the used ones.
    Inline {
        stamps: [u32; INLINE],
        tags: [u16; INLINE],
    },
    Few(Box<Few>),
    Many(Box<Many>),
}

impl Holders {
    pub(super) const NONE: Holders = Holders::Inline { stamps: [0; INLINE], tags: [EMPTY; INLINE] };

    /// Only the inline form can be empty: the others move back inline before that.
    pub(super) fn is_empty(&self) -> bool {
        matches!(self, Holders::Inline { tags, .. } if tags[0] == EMPTY)
    }

    pub(super) fn len(&self) -> usize {
        match self {
            Holders::Inline { tags, .. } => used(tags),
            Holders::Few(f) => used(&f.tags),
            Holders::Many(m) => m.entries.len() + m.events.as_ref().map_or(0, |e| e.len()),
        }
    }

    /// Calls `f` with every holder (no particular order).
    pub(super) fn for_each(&self, mut f: impl FnMut(Holder)) {
        match self {
            Holders::Inline { stamps, tags } => array_for_each(stamps, tags, f),
            Holders::Few(x) => array_for_each(&x.stamps, &x.tags, f),
            Holders::Many(m) => {
                m.entries.iter().for_each(|&e| f(e.holder()));
                if let Some(events) = &m.events {
                    events.for_each(|w| f(Holder { worker: w as u16, source: Source::Event, stamp: 0 }));
                }
            }
        }
    }

    /// Whether `pred` holds for some holder; stops at the first that does.
    pub(super) fn any(&self, mut pred: impl FnMut(Holder) -> bool) -> bool {
        match self {
            Holders::Inline { stamps, tags } => array_any(stamps, tags, pred),
            Holders::Few(x) => array_any(&x.stamps, &x.tags, pred),
            Holders::Many(m) => {
                m.entries.iter().any(|&e| pred(e.holder()))
                    || m.events.as_ref().is_some_and(|events| {
                        let mut found = false;
                        events.for_each(|w| {
                            found = found || pred(Holder { worker: w as u16, source: Source::Event, stamp: 0 })
                        });
                        found
                    })
            }
        }
    }

    /// The probe's step: marks in `m` every still-matching worker whose entry is `fresh`, and reports
    /// each pending or approximate match to `timed` (event matches are counted by difference).
    pub(super) fn mark_fresh(
        &self,
        m: &mut Matching,
        fresh: impl Fn(Holder) -> bool,
        mut timed: impl FnMut(usize, Source),
    ) {
        let mut visit = |h: Holder| {
            let w = usize::from(h.worker);
            if m.is_alive(w) && fresh(h) {
                m.mark(w);
                if h.source != Source::Event {
                    timed(w, h.source);
                }
            }
        };
        match self {
            Holders::Inline { stamps, tags } => array_for_each(stamps, tags, visit),
            Holders::Few(x) => array_for_each(&x.stamps, &x.tags, visit),
            Holders::Many(many) => {
                many.entries.iter().for_each(|&e| visit(e.holder()));
                if let Some(events) = &many.events {
                    m.mark_all(events);
                }
            }
        }
    }

    #[cfg(test)]
    pub(super) fn get(&self, worker: u16) -> Option<Holder> {
        if let Holders::Many(m) = self {
            if m.events.as_ref().is_some_and(|e| e.contains(usize::from(worker))) {
                return Some(Holder { worker, source: Source::Event, stamp: 0 });
            }
        }
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
            Holders::Inline { stamps, tags } => match array_set(stamps, tags, entry) {
                Ok(old) => old,
                Err(()) => {
                    let few = grow(stamps, tags, entry);
                    *self = Holders::Few(Box::new(few));
                    None
                }
            },
            Holders::Few(x) => match array_set(&mut x.stamps, &mut x.tags, entry) {
                Ok(old) => old,
                Err(()) => {
                    let mut entries = Vec::with_capacity(2 * FEW);
                    entries.extend((0..FEW).map(|i| Entry { stamp: x.stamps[i], tag: x.tags[i] }));
                    entries.push(entry);
                    *self = Holders::Many(Box::new(Many { entries, events: None }));
                    None
                }
            },
            Holders::Many(m) => m.set(h),
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
    pub(super) fn retain(&mut self, keep: impl FnMut(Holder) -> bool) {
        match self {
            Holders::Inline { stamps, tags } => array_retain(stamps, tags, keep),
            Holders::Few(x) => array_retain(&mut x.stamps, &mut x.tags, keep),
            Holders::Many(m) => m.retain(keep),
        }
        self.shrink();
    }

    /// Moves to the smallest form that fits.
    fn shrink(&mut self) {
        let fits_smaller = match self {
            Holders::Inline { .. } => false,
            Holders::Few(_) => self.len() <= INLINE,
            Holders::Many(_) => self.len() <= FEW,
        };
        if !fits_smaller {
            return;
        }
        let mut smaller = Holders::NONE;
        self.for_each(|h| _ = smaller.set(h));
        *self = smaller;
    }

    /// Heap bytes this key's holders use (0 when inline).
    #[cfg(test)]
    pub(super) fn heap_bytes(&self) -> usize {
        match self {
            Holders::Inline { .. } => 0,
            Holders::Few(_) => std::mem::size_of::<Few>(),
            Holders::Many(m) => {
                std::mem::size_of::<Many>()
                    + m.entries.capacity() * std::mem::size_of::<Entry>()
                    + m.events.as_ref().map_or(0, |_| std::mem::size_of::<WorkerSet>())
            }
        }
    }
}

impl Many {
    fn set(&mut self, h: Holder) -> Option<Holder> {
        let w = usize::from(h.worker);
        let was_event = Holder { worker: h.worker, source: Source::Event, stamp: 0 };
        match &mut self.events {
            Some(events) if events.contains(w) => {
                if h.source != Source::Event {
                    events.remove(w);
                    self.entries.push(Entry::new(h));
                }
                return Some(was_event);
            }
            Some(events) if h.source == Source::Event => {
                events.insert(w);
                return self.take_entry(h.worker);
            }
            _ => {}
        }
        let old = match self.entries.iter_mut().find(|e| e.worker() == h.worker) {
            Some(e) => Some(std::mem::replace(e, Entry::new(h)).holder()),
            None => {
                self.entries.push(Entry::new(h));
                None
            }
        };
        self.widen();
        old
    }

    fn take_entry(&mut self, worker: u16) -> Option<Holder> {
        let i = self.entries.iter().position(|e| e.worker() == worker)?;
        Some(self.entries.swap_remove(i).holder())
    }

    /// Moves the event holders to a bitset once there are more than [`WIDE_AT`] of them.
    fn widen(&mut self) {
        if self.events.is_some() || self.entries.len() <= WIDE_AT {
            return;
        }
        let events = self.entries.iter().filter(|e| e.holder().source == Source::Event).count();
        if events <= WIDE_AT {
            return;
        }
        let mut set = WorkerSet::EMPTY;
        self.entries.retain(|e| {
            let event = e.holder().source == Source::Event;
            if event {
                set.insert(usize::from(e.worker()));
            }
            !event
        });
        self.events = Some(Box::new(set));
        self.fit();
    }

    fn retain(&mut self, mut keep: impl FnMut(Holder) -> bool) {
        self.entries.retain(|e| keep(e.holder()));
        if let Some(events) = &mut self.events {
            let mut gone = Vec::new();
            events.for_each(|w| {
                if !keep(Holder { worker: w as u16, source: Source::Event, stamp: 0 }) {
                    gone.push(w);
                }
            });
            gone.into_iter().for_each(|w| events.remove(w));
            if events.len() == 0 {
                self.events = None;
            }
        }
        self.fit();
    }

    /// At most 2× spare capacity in the list.
    fn fit(&mut self) {
        if self.entries.capacity() > 4 * self.entries.len().max(1) {
            self.entries.shrink_to(2 * self.entries.len());
        }
    }
}

fn used(tags: &[u16]) -> usize {
    tags.iter().take_while(|&&t| t != EMPTY).count()
}

fn array_any(stamps: &[u32], tags: &[u16], mut pred: impl FnMut(Holder) -> bool) -> bool {
    for (&stamp, &tag) in stamps.iter().zip(tags) {
        if tag == EMPTY {
            return false;
        }
        if pred(Entry { stamp, tag }.holder()) {
            return true;
        }
    }
    false
}

fn array_for_each(stamps: &[u32], tags: &[u16], mut f: impl FnMut(Holder)) {
    for (&stamp, &tag) in stamps.iter().zip(tags).take_while(|&(_, &t)| t != EMPTY) {
        f(Entry { stamp, tag }.holder());
    }
}

/// Sets the entry in place or in the first free position; `Err` if the array is full of others.
fn array_set(stamps: &mut [u32], tags: &mut [u16], entry: Entry) -> Result<Option<Holder>, ()> {
    for i in 0..tags.len() {
        let current = Entry { stamp: stamps[i], tag: tags[i] };
        if current.tag == EMPTY || current.worker() == entry.worker() {
            (stamps[i], tags[i]) = (entry.stamp, entry.tag);
            return Ok((current.tag != EMPTY).then(|| current.holder()));
        }
    }
    Err(())
}

fn array_retain(stamps: &mut [u32], tags: &mut [u16], mut keep: impl FnMut(Holder) -> bool) {
    let mut kept = 0;
    for i in 0..tags.len() {
        if tags[i] != EMPTY && keep(Entry { stamp: stamps[i], tag: tags[i] }.holder()) {
            (stamps[kept], tags[kept]) = (stamps[i], tags[i]);
            kept += 1;
        }
    }
    tags[kept..].fill(EMPTY);
}

/// The full inline array plus `entry`, as a `Few`.
fn grow(stamps: &[u32; INLINE], tags: &[u16; INLINE], entry: Entry) -> Few {
    let mut few = Few { stamps: [0; FEW], tags: [EMPTY; FEW] };
    few.stamps[..INLINE].copy_from_slice(stamps);
    few.tags[..INLINE].copy_from_slice(tags);
    (few.stamps[INLINE], few.tags[INLINE]) = (entry.stamp, entry.tag);
    few
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
        assert_eq!(v.len(), hs.len());
        v
    }

    fn form(hs: &Holders) -> &'static str {
        match hs {
            Holders::Inline { .. } => "inline",
            Holders::Few(_) => "few",
            Holders::Many(m) if m.events.is_some() => "wide",
            Holders::Many(_) => "many",
        }
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
    fn forms_follow_the_holder_count_both_ways() {
        let mut hs = Holders::NONE;
        assert!(hs.is_empty());
        assert_eq!(hs.set(h(7, Source::Pending, 1)), None);
        assert_eq!(hs.set(h(1023, Source::Event, 2)), None);
        assert_eq!((form(&hs), hs.heap_bytes()), ("inline", 0));
        assert_eq!(hs.set(h(7, Source::Event, 3)), Some(h(7, Source::Pending, 1)), "replaced in place");
        assert_eq!(hs.set(h(0, Source::Approximate, 4)), None);
        assert_eq!((form(&hs), hs.heap_bytes()), ("few", 24));
        assert_eq!(hs.set(h(64, Source::Pending, 5)), None);
        assert_eq!(hs.set(h(63, Source::Pending, 6)), None);
        assert_eq!(form(&hs), "many");
        assert_eq!(hs.get(1023), Some(h(1023, Source::Event, 2)));
        assert_eq!(hs.remove(63), Some(h(63, Source::Pending, 6)));
        assert_eq!(form(&hs), "few", "four holders fit in a Few again");
        assert_eq!(hs.remove(7), Some(h(7, Source::Event, 3)));
        assert_eq!(hs.remove(64), Some(h(64, Source::Pending, 5)));
        assert_eq!(form(&hs), "inline");
        assert_eq!(all(&hs), vec![h(0, Source::Approximate, 4), h(1023, Source::Event, 2)]);
        assert_eq!(hs.remove(7), None);
        assert_eq!(hs.remove(0), Some(h(0, Source::Approximate, 4)));
        assert_eq!(all(&hs), vec![h(1023, Source::Event, 2)], "the survivor moved to the first position");
        hs.remove(1023);
        assert!(hs.is_empty());
    }

    #[test]
    fn many_event_holders_move_to_a_bitset_and_sources_still_change() {
        let mut hs = Holders::NONE;
        for w in 0..1024u16 {
            let source = if w % 100 == 5 { Source::Pending } else { Source::Event };
            hs.set(h(w, source, 9));
        }
        assert_eq!(form(&hs), "wide");
        assert_eq!(hs.len(), 1024);
        assert!(hs.heap_bytes() < 1024, "{} bytes for 1024 holders", hs.heap_bytes());
        assert_eq!(hs.get(5), Some(h(5, Source::Pending, 9)));
        assert_eq!(hs.get(6), Some(h(6, Source::Event, 0)), "bitset members keep no stamp");
        // Pending → event moves into the bitset; event → pending moves out (the store never does the
        // latter, but the form must not care).
        assert_eq!(hs.set(h(5, Source::Event, 10)), Some(h(5, Source::Pending, 9)));
        assert_eq!(hs.set(h(6, Source::Pending, 10)), Some(h(6, Source::Event, 0)));
        assert_eq!((hs.get(5).map(|x| x.source), hs.get(6)), (Some(Source::Event), Some(h(6, Source::Pending, 10))));
        assert_eq!(hs.set(h(1023, Source::Event, 11)), Some(h(1023, Source::Event, 0)));
        assert_eq!(hs.len(), 1024);
        assert_eq!(hs.remove(1023), Some(h(1023, Source::Event, 0)));
        hs.retain(|x| x.worker < 3 || x.worker == 6);
        assert_eq!(
            all(&hs),
            vec![h(0, Source::Event, 0), h(1, Source::Event, 0), h(2, Source::Event, 0), h(6, Source::Pending, 10)]
        );
        assert_eq!(form(&hs), "few");
    }

    #[test]
    fn mark_fresh_matches_alive_fresh_holders_in_every_form() {
        for n in [2u16, 4, 9, 1024] {
            let mut hs = Holders::NONE;
            for w in 0..n {
                let source = [Source::Event, Source::Pending, Source::Approximate][usize::from(w % 3)];
                hs.set(h(w, source, u32::from(w)));
            }
            let mut m = Matching::new(1024);
            let mut timed = Vec::new();
            // Fresh: events, and timed entries with an even stamp.
            hs.mark_fresh(&mut m, |x| x.source == Source::Event || x.stamp % 2 == 0, |w, s| timed.push((w, s)));
            let mut matched = Vec::new();
            m.advance(|_| {});
            m.for_each_alive(|w| matched.push(w));
            let want: Vec<usize> = (0..usize::from(n)).filter(|w| w % 3 == 0 || w % 2 == 0).collect();
            assert_eq!(matched, want, "{n} holders");
            timed.sort_by_key(|&(w, _)| w);
            let want_timed: Vec<usize> = (0..usize::from(n)).filter(|w| w % 3 != 0 && w % 2 == 0).collect();
            assert_eq!(timed.iter().map(|&(w, _)| w).collect::<Vec<_>>(), want_timed, "{n} holders");
        }
    }

    #[test]
    fn a_shrinking_list_releases_its_spare_capacity() {
        let mut hs = Holders::NONE;
        for w in 0..1024 {
            hs.set(h(w, Source::Approximate, 0));
        }
        assert_eq!(form(&hs), "many", "timed holders never go to the bitset");
        let full = hs.heap_bytes();
        hs.retain(|h| h.worker < 10);
        assert_eq!(all(&hs).len(), 10);
        assert!(hs.heap_bytes() <= full / 16, "{} of {full} bytes kept for 10 holders", hs.heap_bytes());
        assert!(hs.heap_bytes() <= std::mem::size_of::<Many>() + 2 * 10 * std::mem::size_of::<Entry>());
    }
}
