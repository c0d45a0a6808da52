//! Properties of the snapshot [`Reader`], the one parser of bytes a peer replica sends at startup:
//! any bytes, cut anywhere, never panic and never make it allocate more than a small multiple of what
//! arrived (a length or count that claims more is refused before anything is reserved); a valid
//! stream reads back equal, however it is cut; a truncated or bit-flipped one ends in an error, and
//! every frame it yields before that is the original's (nothing altered is ever handed to the graft,
//! which undoes what it took when the stream fails).
//!
//! Memory is measured by a counting allocator for this test binary: per thread, the bytes live now and
//! their peak, so tests running in parallel do not see each other's allocations.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use proptest::collection::vec;
use proptest::prelude::*;

use super::*;

struct Counting;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn grew(n: usize) {
    // `try_with`: an allocation while the thread is being torn down is simply not counted.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + n;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

fn shrank(n: usize) {
    // Saturating: memory allocated on another thread may be freed on this one.
    let _ = LIVE.try_with(|live| live.set(live.get().saturating_sub(n)));
}

// SAFETY: every call is forwarded to `System` unchanged; only counters are updated beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `System`'s.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            grew(new_size);
            shrank(layout.size());
        }
        p
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// What `f` returns, and the most bytes it had allocated at once beyond what was live before it.
fn peak_during<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let out = f();
    (out, PEAK.with(Cell::get).saturating_sub(base))
}

/// Allocation allowed for reading `input` bytes: frames decode into structures a few times the size
/// of their wire form (16–24 bytes per 15–17-byte entry, a growing buffer), never more.
fn allowance(input: usize) -> usize {
    16 * input + (64 << 10)
}

/// The frames of a stream fed to a [`Reader`] in chunks of the given sizes (cycled), and how it
/// ended: its first error, or `finish`'s verdict.
fn read(bytes: &[u8], cuts: &[usize]) -> (Vec<Frame>, Result<(), SnapshotError>) {
    let (mut reader, mut frames, mut rest) = (Reader::default(), Vec::new(), bytes);
    for &cut in cuts.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let (chunk, tail) = rest.split_at(cut.clamp(1, rest.len()));
        rest = tail;
        match reader.push(chunk) {
            Ok(more) => frames.extend(more),
            Err(e) => return (frames, Err(e)),
        }
    }
    let end = reader.finish();
    (frames, end)
}

/// The wire form of `frame`, as [`write`] produces it.
fn encode(frame: &Frame) -> Bytes {
    match frame {
        Frame::Head(head) => super::frame(HEAD, &serde_json::to_vec(head).unwrap()),
        Frame::Map { pool, slot, rank, entries } => super::frame(MAP, &map_payload(*pool, *slot, *rank, entries)),
        Frame::Index { pool, entries } => super::frame(INDEX, &index_payload(*pool, entries)),
        Frame::End { maps, index } => {
            let mut end = Vec::new();
            end.put_u64_le(*maps);
            end.put_u64_le(*index);
            super::frame(END, &end)
        }
    }
}

fn entry() -> impl Strategy<Value = Entry> {
    let source = prop_oneof![Just(Source::Event), Just(Source::Pending), Just(Source::Approximate)];
    (any::<u64>(), any::<u16>(), source, any::<u32>()).prop_map(|(key, worker, source, age_secs)| Entry {
        key,
        worker,
        source,
        age_secs,
    })
}

fn head() -> impl Strategy<Value = Head> {
    let worker = (any::<u16>(), "\\PC{0,12}", any::<u64>(), any::<Option<u64>>(), vec(any::<(u32, u64)>(), 0..3))
        .prop_map(|(slot, name, held, capacity, seqs)| WorkerHead { slot, name, held, capacity, seqs });
    let pool = ("\\PC{0,12}", vec(worker, 0..4)).prop_map(|(name, workers)| PoolHead { name, workers });
    ("\\PC{0,16}", any::<u64>(), vec(pool, 0..3)).prop_map(|(replica_id, taken_unix_ms, pools)| Head {
        format: FORMAT,
        replica_id,
        taken_unix_ms,
        pools,
    })
}

fn body_frame() -> impl Strategy<Value = Frame> {
    let map = (any::<u16>(), any::<u16>(), any::<u32>(), vec(any::<(u64, Option<u64>)>(), 0..40))
        .prop_map(|(pool, slot, rank, entries)| Frame::Map { pool, slot, rank, entries });
    let index = (any::<u16>(), vec(entry(), 0..40)).prop_map(|(pool, entries)| Frame::Index { pool, entries });
    prop_oneof![map, index]
}

/// A valid snapshot: its frames (head first, end last) and its bytes.
fn snapshot() -> impl Strategy<Value = (Vec<Frame>, Vec<u8>)> {
    (head(), vec(body_frame(), 0..6)).prop_map(|(head, body)| {
        let (mut maps, mut index) = (0, 0);
        for f in &body {
            match f {
                Frame::Map { entries, .. } => maps += entries.len() as u64,
                Frame::Index { entries, .. } => index += entries.len() as u64,
                _ => {}
            }
        }
        let frames: Vec<Frame> =
            std::iter::once(Frame::Head(head)).chain(body).chain([Frame::End { maps, index }]).collect();
        let bytes = frames.iter().flat_map(|f| encode(f).to_vec()).collect();
        (frames, bytes)
    })
}

fn cuts() -> impl Strategy<Value = Vec<usize>> {
    vec(1usize..700, 1..6)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic_nor_allocate_beyond_what_arrived(
        bytes in vec(any::<u8>(), 0..4096),
        cuts in cuts(),
    ) {
        let ((_, end), peak) = peak_during(|| read(&bytes, &cuts));
        prop_assert!(end.is_err(), "random bytes are no snapshot");
        prop_assert!(peak <= allowance(bytes.len()), "{peak} bytes allocated for {} read", bytes.len());
    }

    /// A peer that computes the checks: frames of any kind and content behind a valid head, with
    /// lengths and counts that lie. Each is refused or read, within the same memory allowance.
    #[test]
    fn checked_frames_of_any_content_never_panic_nor_over_allocate(
        head in head(),
        frames in vec((0u8..7, vec(any::<u8>(), 0..600)), 0..8),
        claims in vec((any::<u16>(), any::<u32>()), 0..8),
        cuts in cuts(),
    ) {
        let mut bytes = encode(&Frame::Head(head)).to_vec();
        for (i, (kind, mut payload)) in frames.into_iter().enumerate() {
            // Half of them claim an entry count, often a huge one, in front of whatever follows.
            if let Some(&(pool, n)) = claims.get(i).filter(|_| i % 2 == 0) {
                let mut claimed = pool.to_le_bytes().to_vec();
                claimed.extend_from_slice(&n.to_le_bytes());
                claimed.append(&mut payload);
                payload = claimed;
            }
            bytes.extend_from_slice(&super::frame(kind, &payload));
        }
        let (_, peak) = peak_during(|| read(&bytes, &cuts));
        prop_assert!(peak <= allowance(bytes.len()), "{peak} bytes allocated for {} read", bytes.len());
    }

    #[test]
    fn a_valid_snapshot_reads_back_equal_however_it_is_cut((frames, bytes) in snapshot(), cuts in cuts()) {
        let (read_back, end) = read(&bytes, &cuts);
        prop_assert!(end.is_ok(), "{end:?}");
        prop_assert_eq!(read_back, frames);
    }

    #[test]
    fn a_truncated_snapshot_is_refused((frames, bytes) in snapshot(), at in any::<prop::sample::Index>(), cuts in cuts()) {
        let cut = at.index(bytes.len()); // strictly shorter than the stream
        let (read_back, end) = read(&bytes[..cut], &cuts);
        prop_assert_eq!(end.map_err(|e| e.label()), Err("truncated"));
        prop_assert!(read_back.len() < frames.len());
        prop_assert_eq!(&read_back[..], &frames[..read_back.len()], "only the original's frames");
    }

    #[test]
    fn a_flipped_bit_is_refused_and_nothing_altered_is_yielded(
        (frames, mut bytes) in snapshot(),
        at in any::<prop::sample::Index>(),
        bit in 0u8..8,
        cuts in cuts(),
    ) {
        let i = at.index(bytes.len());
        bytes[i] ^= 1 << bit;
        let (read_back, end) = read(&bytes, &cuts);
        prop_assert!(end.is_err(), "byte {i} bit {bit} flipped, yet the stream was taken");
        prop_assert!(read_back.len() < frames.len());
        prop_assert_eq!(&read_back[..], &frames[..read_back.len()], "only the original's frames");
    }
}

/// The memory measure itself measures: a reader that reserved what a length claims would fail.
#[test]
fn the_allocation_measure_sees_a_large_reservation() {
    let (_, peak) = peak_during(|| Vec::<u8>::with_capacity(1 << 20));
    assert!(peak >= 1 << 20, "{peak}");
}
