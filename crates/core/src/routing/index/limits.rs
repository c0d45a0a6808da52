//! The index's fixed bounds: how many workers it can track, and how much work one lock hold may do
//! (keys written, slots scanned, keys looked up together). Below every other part of the index.

/// Most workers one index (and therefore one router) can track: worker ids are `0..MAX_WORKERS`.
pub const MAX_WORKERS: usize = 1024;

/// Most keys written per lock hold: ~20 µs for new keys in a full 10 M-key index (a hold ends after
/// [`MIN_CHUNK`] when a probe is waiting). At 256 a `kv` select's p99 while events were ingested was
/// 162 µs, at 64 99 µs, for 6 % less ingestion throughput (`benches/index.rs`, 1024 workers × 10 M
/// blocks); a hold ending early for a probe brought it to the select's p99 without ingestion.
pub const WRITE_CHUNK: usize = 64;

/// Most slots [`super::BlockIndex::remove_worker`] scans per lock hold: about 20 µs at 10 M keys (a step may
/// follow a pointer to the key's holders).
pub const SCAN_CHUNK: usize = 1024;

/// Keys a probe looks up together before walking their holders.
pub const LOOKAHEAD: usize = 16;

/// Fewest keys a write applies per lock hold even when a probe is waiting (it ends the hold early
/// past this): ~2 µs for a probe to wait, and ingestion keeps going however many probes arrive.
pub const MIN_CHUNK: usize = 8;

/// How long a probe spins for the lock before it parks: a writer holds it for one chunk (~20 µs at
/// most) and then lets a spinning probe go first, so the probe rarely parks; parked, it waits for a
/// wake-up too (tens of µs on a VM). Past this the probe parks, so a long hold costs no CPU.
pub const PROBE_SPIN: std::time::Duration = std::time::Duration::from_micros(100);

/// How long a writer, between two chunks, lets spinning probes take the lock first; then it queues
/// like everyone else, so probes arriving back to back cannot starve the event feeds.
pub const WRITER_DEFERS: std::time::Duration = std::time::Duration::from_micros(100);
