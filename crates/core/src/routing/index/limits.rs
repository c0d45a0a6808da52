//! The index's fixed bounds: how many workers it can track, and how much work one lock hold may do
//! (keys written, slots scanned, keys looked up together). Below every other part of the index.

/// Most workers one index (and therefore one router) can track: worker ids are `0..MAX_WORKERS`.
pub const MAX_WORKERS: usize = 1024;

/// Most keys written per lock hold: ~20 µs for new keys in a full 10 M-key index, so a probe waits
/// that long at most. At 256 a `kv` select's p99 while events were ingested was 162 µs, at 64 it is
/// 99 µs, for 6 % less ingestion throughput (`benches/index.rs`, 1024 workers × 10 M blocks).
pub const WRITE_CHUNK: usize = 64;

/// Most slots [`super::BlockIndex::remove_worker`] scans per lock hold: about 20 µs at 10 M keys (a step may
/// follow a pointer to the key's holders).
pub const SCAN_CHUNK: usize = 1024;

/// Keys a probe looks up together before walking their holders.
pub const LOOKAHEAD: usize = 16;
