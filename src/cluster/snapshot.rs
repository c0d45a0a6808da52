//! A replica's index state as a stream of frames, for a starting replica to graft: compact (15–17
//! bytes per entry), never the whole state in one message (no frame over [`MAX_FRAME_BYTES`]).
//!
//! ```text
//! frame   = len: u32 LE (kind + payload + check) · kind: u8 · payload · check: u64 LE
//!           (check = xxh3-64 of len · kind · payload)
//! 1 head  = JSON {format, replica_id, taken_unix_ms, pools: [{name, workers: [{slot, name, held,
//!           capacity, seqs: [[rank, seq]…]}]}]}                          (first, once)
//! 2 map   = pool u16 · slot u16 · rank u32 · n u32 · n × (engine hash u64 · has key u8 · key u64)
//! 3 index = pool u16 · n u32 · n × (key u64 · slot u16 · source u8 · age secs u32)
//! 4 end   = map entries u64 · index entries u64                           (last: the stream is whole)
//! ```
//!
//! The [`Reader`] refuses a stream it cannot take whole: a frame over the bound before it is buffered,
//! a check that does not match (a flipped bit yields nothing), counts that do not add up, a stream
//! without its end frame. The check guards against corruption, not against a hostile peer, who can
//! compute it: what a peer says is bounded where it is grafted, and its resume points are verified
//! against the engines (`bootstrap`).
//!
//! Pools and workers are named in the head and matched by name on the receiving side (slots differ
//! between replicas). The event maps and their seqs are copied first, worker by worker under each
//! one's lock, then the index is read in chunks: everything the index shows beyond a map's seq is
//! replayed again from the engine after the graft, and re-applying a batch is harmless.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};
use mmrouter_core::routing::index::Entry;
use mmrouter_core::routing::Source;
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

use crate::pools::{EventExport, Pool};

/// Largest frame written or accepted.
pub const MAX_FRAME_BYTES: usize = 4 << 20;
/// Entries per frame: a map entry is 17 bytes, an index entry 15, so a frame stays near 1 MiB.
const PER_FRAME: usize = 65_536;
/// 2: every frame ends with its check (1 had none; a replica reading the other refuses, and replays
/// its engines instead).
const FORMAT: u32 = 2;
/// The kind byte and the check: the shortest frame's `len`.
const FRAME_OVERHEAD: usize = 1 + CHECK_BYTES;
const CHECK_BYTES: usize = 8;

const HEAD: u8 = 1;
const MAP: u8 = 2;
const INDEX: u8 = 3;
const END: u8 = 4;

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Head {
    pub format: u32,
    pub replica_id: String,
    pub taken_unix_ms: u64,
    pub pools: Vec<PoolHead>,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct PoolHead {
    pub name: String,
    pub workers: Vec<WorkerHead>,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerHead {
    pub slot: u16,
    pub name: String,
    pub held: u64,
    pub capacity: Option<u64>,
    /// Per rank, the last seq the event map reflects (only workers with feeds).
    pub seqs: Vec<(u32, u64)>,
}

impl Head {
    pub fn taken(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.taken_unix_ms)
    }
}

/// One decoded frame.
#[derive(Debug, PartialEq)]
pub enum Frame {
    Head(Head),
    Map { pool: u16, slot: u16, rank: u32, entries: Vec<(u64, Option<u64>)> },
    Index { pool: u16, entries: Vec<Entry> },
    End { maps: u64, index: u64 },
}

/// Why a snapshot stream was refused.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("frame of {0} bytes is over the {MAX_FRAME_BYTES}-byte limit")]
    FrameTooLarge(usize),
    #[error("malformed frame: {0}")]
    Malformed(&'static str),
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("snapshot format {0} is not supported (this replica reads {FORMAT})")]
    Format(u32),
    #[error("the stream ended before its end frame")]
    Truncated,
    #[error("the end frame counts {want} entries, the stream carried {got}")]
    Count { want: u64, got: u64 },
    #[error("a frame's check does not match its bytes")]
    Checksum,
}

impl SnapshotError {
    pub fn label(&self) -> &'static str {
        match self {
            SnapshotError::FrameTooLarge(_) => "frame_too_large",
            SnapshotError::Malformed(_) => "malformed",
            SnapshotError::UnknownKind(_) => "unknown_kind",
            SnapshotError::Format(_) => "format",
            SnapshotError::Truncated => "truncated",
            SnapshotError::Count { .. } => "count_mismatch",
            SnapshotError::Checksum => "checksum",
        }
    }
}

fn frame(kind: u8, payload: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(4 + FRAME_OVERHEAD + payload.len());
    out.put_u32_le((FRAME_OVERHEAD + payload.len()) as u32);
    out.put_u8(kind);
    out.put_slice(payload);
    let check = xxh3_64(&out);
    out.put_u64_le(check);
    out.freeze()
}

/// Writes the snapshot of `pools` frame by frame into `tx` (a streamed HTTP body); stops early when
/// the receiver goes away. Returns the bytes written.
pub async fn write(replica_id: String, pools: Arc<Vec<Arc<Pool>>>, tx: tokio::sync::mpsc::Sender<Bytes>) -> u64 {
    let exports: Vec<Vec<(usize, EventExport)>> =
        pools.iter().map(|p| p.feeds_by_worker().into_iter().map(|(id, f)| (id, f.export())).collect()).collect();
    let head = head(replica_id, &pools, &exports);
    let mut sent = 0u64;
    let mut send = async |b: Bytes| {
        sent += b.len() as u64;
        tx.send(b).await.is_ok()
    };
    let Ok(head) = serde_json::to_vec(&head) else { return 0 };
    if !send(frame(HEAD, &head)).await {
        return sent;
    }
    let (mut maps, mut index) = (0u64, 0u64);
    for (p, workers) in exports.iter().enumerate() {
        for (slot, export) in workers {
            for (rank, entries) in &export.ranks {
                for chunk in entries.chunks(PER_FRAME) {
                    maps += chunk.len() as u64;
                    if !send(frame(MAP, &map_payload(p as u16, *slot as u16, *rank, chunk))).await {
                        return sent;
                    }
                }
            }
        }
    }
    for (p, pool) in pools.iter().enumerate() {
        let (mut next, mut buf) = (Some(0), Vec::new());
        while let Some(start) = next {
            next = pool.router.index().export_chunk(start, &mut buf);
            if buf.len() >= PER_FRAME || (next.is_none() && !buf.is_empty()) {
                for chunk in buf.chunks(PER_FRAME) {
                    index += chunk.len() as u64;
                    if !send(frame(INDEX, &index_payload(p as u16, chunk))).await {
                        return sent;
                    }
                }
                buf.clear();
            }
        }
    }
    let mut end = Vec::with_capacity(16);
    end.put_u64_le(maps);
    end.put_u64_le(index);
    send(frame(END, &end)).await;
    sent
}

fn head(replica_id: String, pools: &[Arc<Pool>], exports: &[Vec<(usize, EventExport)>]) -> Head {
    let taken_unix_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let pools = pools
        .iter()
        .zip(exports)
        .map(|(p, exports)| {
            let seqs: BTreeMap<usize, &Vec<(u32, u64)>> = exports.iter().map(|(id, e)| (*id, &e.seqs)).collect();
            let workers = p
                .router
                .live_workers()
                .into_iter()
                .map(|(slot, w)| WorkerHead {
                    slot: slot as u16,
                    name: w.name().to_owned(),
                    held: w.cache_held(),
                    capacity: w.cache_capacity(),
                    seqs: seqs.get(&slot).map(|s| s.to_vec()).unwrap_or_default(),
                })
                .collect();
            PoolHead { name: p.name.clone(), workers }
        })
        .collect();
    Head { format: FORMAT, replica_id, taken_unix_ms, pools }
}

fn map_payload(pool: u16, slot: u16, rank: u32, entries: &[(u64, Option<u64>)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(12 + entries.len() * 17);
    out.put_u16_le(pool);
    out.put_u16_le(slot);
    out.put_u32_le(rank);
    out.put_u32_le(entries.len() as u32);
    for &(hash, key) in entries {
        out.put_u64_le(hash);
        out.put_u8(u8::from(key.is_some()));
        out.put_u64_le(key.unwrap_or(0));
    }
    out
}

fn index_payload(pool: u16, entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(6 + entries.len() * 15);
    out.put_u16_le(pool);
    out.put_u32_le(entries.len() as u32);
    for e in entries {
        out.put_u64_le(e.key);
        out.put_u16_le(e.worker);
        out.put_u8(e.source as u8);
        out.put_u32_le(e.age_secs);
    }
    out
}

/// Splits a byte stream into frames, holding at most one frame (bounded by [`MAX_FRAME_BYTES`]).
#[derive(Default)]
pub struct Reader {
    buf: BytesMut,
    maps: u64,
    index: u64,
    ended: bool,
    headed: bool,
}

impl Reader {
    /// Takes `chunk` and returns the frames it completes.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<Frame>, SnapshotError> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        while self.buf.len() >= 4 {
            let len = u32::from_le_bytes(self.buf[..4].try_into().expect("4 bytes")) as usize;
            if len > MAX_FRAME_BYTES {
                return Err(SnapshotError::FrameTooLarge(len));
            }
            if len < FRAME_OVERHEAD {
                return Err(SnapshotError::Malformed("frame shorter than its kind and check"));
            }
            if self.buf.len() < 4 + len {
                break;
            }
            let whole = self.buf.split_to(4 + len).freeze();
            let (checked, check) = whole.split_at(whole.len() - CHECK_BYTES);
            if xxh3_64(checked) != u64::from_le_bytes(check.try_into().expect("8 bytes")) {
                return Err(self.unchecked(&whole));
            }
            out.push(self.decode(whole.slice(4..whole.len() - CHECK_BYTES))?);
        }
        Ok(out)
    }

    /// Why a frame's check failed: a format-1 peer's head (no check) says which format it speaks.
    fn unchecked(&self, whole: &[u8]) -> SnapshotError {
        #[derive(Deserialize)]
        struct Format {
            format: u32,
        }
        if !self.headed && whole.get(4) == Some(&HEAD) {
            if let Ok(old) = serde_json::from_slice::<Format>(&whole[5..]) {
                return SnapshotError::Format(old.format);
            }
        }
        SnapshotError::Checksum
    }

    /// The stream is over: it must have ended with its end frame.
    pub fn finish(&self) -> Result<(), SnapshotError> {
        if self.ended && self.buf.is_empty() {
            Ok(())
        } else {
            Err(SnapshotError::Truncated)
        }
    }

    fn decode(&mut self, body: Bytes) -> Result<Frame, SnapshotError> {
        if self.ended {
            return Err(SnapshotError::Malformed("data after the end frame"));
        }
        let (kind, mut p) = (body[0], &body[1..]);
        if kind != HEAD && !self.headed {
            return Err(SnapshotError::Malformed("the head frame must come first"));
        }
        let frame = match kind {
            // Once only: what a graft takes is matched by the head it had first (and undone by it).
            HEAD if self.headed => return Err(SnapshotError::Malformed("a second head frame")),
            HEAD => {
                let head: Head = serde_json::from_slice(p).map_err(|_| SnapshotError::Malformed("head is not JSON"))?;
                if head.format != FORMAT {
                    return Err(SnapshotError::Format(head.format));
                }
                self.headed = true;
                Frame::Head(head)
            }
            MAP => {
                let (pool, slot, rank, n) = (get_u16(&mut p)?, get_u16(&mut p)?, get_u32(&mut p)?, get_u32(&mut p)?);
                expect_len(p, n, 17)?;
                // `n` is bounded by the frame's length now: reserved once, exactly.
                let mut entries = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    let (hash, has, key) = (get_u64(&mut p)?, get_u8(&mut p)?, get_u64(&mut p)?);
                    entries.push((hash, (has != 0).then_some(key)));
                }
                self.maps += u64::from(n);
                Frame::Map { pool, slot, rank, entries }
            }
            INDEX => {
                let (pool, n) = (get_u16(&mut p)?, get_u32(&mut p)?);
                expect_len(p, n, 15)?;
                let mut entries = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    entries.push(entry(&mut p)?);
                }
                self.index += u64::from(n);
                Frame::Index { pool, entries }
            }
            END => {
                let (maps, index) = (get_u64(&mut p)?, get_u64(&mut p)?);
                if !p.is_empty() {
                    return Err(SnapshotError::Malformed("end frame longer than its counts"));
                }
                if (maps, index) != (self.maps, self.index) {
                    // Saturating: the counts are the peer's, any u64.
                    let (want, got) = (maps.saturating_add(index), self.maps.saturating_add(self.index));
                    return Err(SnapshotError::Count { want, got });
                }
                self.ended = true;
                Frame::End { maps, index }
            }
            other => return Err(SnapshotError::UnknownKind(other)),
        };
        Ok(frame)
    }
}

fn entry(p: &mut &[u8]) -> Result<Entry, SnapshotError> {
    let key = get_u64(p)?;
    let worker = get_u16(p)?;
    let source = match get_u8(p)? {
        0 => Source::Event,
        1 => Source::Pending,
        2 => Source::Approximate,
        _ => return Err(SnapshotError::Malformed("unknown entry source")),
    };
    Ok(Entry { key, worker, source, age_secs: get_u32(p)? })
}

fn expect_len(p: &[u8], n: u32, each: usize) -> Result<(), SnapshotError> {
    if (n as usize).checked_mul(each) == Some(p.len()) {
        Ok(())
    } else {
        Err(SnapshotError::Malformed("entry count does not match the frame's length"))
    }
}

fn take<const N: usize>(p: &mut &[u8]) -> Result<[u8; N], SnapshotError> {
    let (head, rest) = p.split_first_chunk::<N>().ok_or(SnapshotError::Malformed("frame too short"))?;
    *p = rest;
    Ok(*head)
}

fn get_u8(p: &mut &[u8]) -> Result<u8, SnapshotError> {
    Ok(take::<1>(p)?[0])
}

fn get_u16(p: &mut &[u8]) -> Result<u16, SnapshotError> {
    Ok(u16::from_le_bytes(take(p)?))
}

fn get_u32(p: &mut &[u8]) -> Result<u32, SnapshotError> {
    Ok(u32::from_le_bytes(take(p)?))
}

fn get_u64(p: &mut &[u8]) -> Result<u64, SnapshotError> {
    Ok(u64::from_le_bytes(take(p)?))
}

#[cfg(test)]
#[path = "snapshot_props.rs"]
mod props;

#[cfg(test)]
mod tests {
    use super::*;

    fn head_frame() -> Bytes {
        let head = Head { format: FORMAT, replica_id: "r1".into(), taken_unix_ms: 5, pools: Vec::new() };
        frame(HEAD, &serde_json::to_vec(&head).unwrap())
    }

    fn end_frame(maps: u64, index: u64) -> Bytes {
        let mut end = Vec::new();
        end.put_u64_le(maps);
        end.put_u64_le(index);
        frame(END, &end)
    }

    #[test]
    fn frames_round_trip_split_anywhere() {
        let entries = vec![
            Entry { key: u64::MAX, worker: 1023, source: Source::Approximate, age_secs: 7 },
            Entry { key: 1, worker: 0, source: Source::Event, age_secs: 0 },
        ];
        let map = vec![(9, Some(10)), (11, None)];
        let stream = [
            head_frame(),
            frame(MAP, &map_payload(0, 3, 1, &map)),
            frame(INDEX, &index_payload(0, &entries)),
            end_frame(2, 2),
        ]
        .concat();
        for split in [1, 3, 7, stream.len()] {
            let mut r = Reader::default();
            let mut frames = Vec::new();
            for chunk in stream.chunks(split) {
                frames.extend(r.push(chunk).unwrap());
            }
            r.finish().unwrap();
            assert!(matches!(&frames[0], Frame::Head(h) if h.replica_id == "r1"));
            assert!(matches!(&frames[1], Frame::Map { slot: 3, rank: 1, entries, .. } if *entries == map));
            assert!(matches!(&frames[2], Frame::Index { entries: e, .. } if *e == entries));
            assert!(matches!(frames[3], Frame::End { maps: 2, index: 2 }));
        }
    }

    #[test]
    fn hostile_or_broken_streams_are_refused_with_a_reason() {
        let label = |bytes: &[u8]| Reader::default().push(bytes).map(|_| ()).unwrap_err().label();
        assert_eq!(label(&(MAX_FRAME_BYTES as u32 + 1).to_le_bytes()), "frame_too_large");
        assert_eq!(label(&frame(INDEX, &index_payload(0, &[]))), "malformed", "head first");
        assert_eq!(label(&[head_frame(), frame(9, b"")].concat()), "unknown_kind");
        let mut short = index_payload(0, &[Entry { key: 1, worker: 0, source: Source::Event, age_secs: 0 }]);
        short.pop();
        assert_eq!(label(&[head_frame(), frame(INDEX, &short)].concat()), "malformed");
        assert_eq!(label(&[head_frame(), end_frame(1, 0)].concat()), "count_mismatch");
        let bad_head = frame(HEAD, br#"{"format":3,"replica_id":"x","taken_unix_ms":0,"pools":[]}"#);
        assert_eq!(label(&bad_head), "format");
        // A format-1 peer's head has no check: still told apart from a corrupt one.
        let old = br#"{"format":1,"replica_id":"x","taken_unix_ms":0,"pools":[]}"#;
        let old_head = [&(1 + old.len() as u32).to_le_bytes()[..], &[HEAD], old].concat();
        assert_eq!(label(&old_head), "format");
        let mut flipped = head_frame().to_vec();
        flipped[9] ^= 4;
        assert_eq!(label(&flipped), "checksum");
        assert_eq!(label(&[3, 0, 0, 0, HEAD, 0, 0]), "malformed", "shorter than its check");
        let mut r = Reader::default();
        r.push(&head_frame()).unwrap();
        assert_eq!(r.finish().unwrap_err().label(), "truncated");
        assert_eq!(label(&[head_frame(), head_frame()].concat()), "malformed", "one head only");
    }
}
