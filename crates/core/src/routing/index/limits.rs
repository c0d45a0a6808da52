//! The index's fixed bounds: how many workers it can track, and how much work one lock hold may do
//! (keys written, slots scanned, keys looked up together). Below every other part of the index.

/// Most workers one index (and therefore one router) can track: worker ids are `0..MAX_WORKERS`.
pub const MAX_WORKERS: usize = 1024;

/// Most keys written per lock hold: a 256-key chunk takes tens of microseconds at most.
pub const WRITE_CHUNK: usize = 256;

/// Most slots [`super::BlockIndex::remove_worker`] scans per lock hold: about 20 µs at 10 M keys (a step may
/// follow a pointer to the key's holders).
pub const SCAN_CHUNK: usize = 1024;

/// Keys a probe looks up together before walking their holders.
pub const LOOKAHEAD: usize = 16;
