//! Every message from another replica is checked before it counts (issue 45): its size, names and
//! values against what an honest sender can send (the senders' own caps in `bookings.rs`), and its
//! effect against that replica's share — a replica may claim at most `peer_load_ratio` × this
//! replica's own traffic (plus a floor) in load on one worker and in index keys per window, hold at
//! most `max_peer_bookings` bookings and a quarter of the records queue. So one replica, forged or
//! broken, moves routing as much as one busy honest replica could, and no more.
//!
//! Refusals are counted in `cluster_messages_refused_total{reason}`, the reason being
//! [`Refusal::label`].

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mmrouter_core::routing::Load;

use crate::config::PeerQuotas;

/// Blocks one dispatch record carries at most (a prompt's head matters most; the message stays small).
pub const MAX_DISPATCH_BLOCKS: usize = 8_192;
/// Images one record carries at most (a request's images; more are not shared).
pub const MAX_IMAGES: usize = 64;
/// Live bookings one heartbeat lists at most (beyond it, the others reconcile the rest away: a
/// replica with more in flight is under-counted, never over-counted).
pub const MAX_BEAT_LIVE: usize = 32_768;
/// The largest message an honest replica sends: a full dispatch record is ~180 KB of JSON, a
/// heartbeat of `MAX_BEAT_LIVE` ids ~700 KB; NATS's own default `max_payload` is 1 MiB.
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;
/// Tokens one booking or unseen record may claim: beyond any served context (16 M).
pub const MAX_TOKENS: u32 = 1 << 24;
/// Encoder tokens one image may claim.
pub const MAX_IMAGE_TOKENS: u32 = 1 << 20;
/// Pool and worker names (config caps worker names at 128 bytes; pools are named alike).
const MAX_NAME_BYTES: usize = 256;
/// Index keys (blocks, images, unseen records) any replica may write per window, whatever this
/// replica's own traffic: two full dispatch records.
const KEYS_FLOOR: u64 = 2 * MAX_DISPATCH_BLOCKS as u64;
/// The window over which a replica's index writes are compared with this replica's own.
const KEYS_WINDOW: Duration = Duration::from_secs(10);
/// Records queued for the index at once (all replicas), and in bytes.
pub const RECORDS_QUEUE: usize = 4_096;
pub const RECORDS_QUEUE_BYTES: usize = 64 << 20;

/// Why a message of another replica was refused, whole or in part.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("message over {MAX_MESSAGE_BYTES} bytes")]
    Oversized,
    #[error("not a replica message")]
    Malformed,
    #[error("a replica, pool or worker name out of bounds")]
    BadName,
    #[error("tokens beyond what any request holds")]
    ImplausibleLoad,
    #[error("more block keys, images or live bookings than a sender sends")]
    TooMany,
    #[error("more replicas than cluster.max_peers")]
    QuotaPeers,
    #[error("more live bookings than cluster.max_peer_bookings")]
    QuotaBookings,
    #[error("load beyond the replica's share of a worker")]
    QuotaLoad,
    #[error("index keys beyond the replica's share")]
    QuotaKeys,
    #[error("records beyond the replica's share of the queue")]
    QuotaQueue,
}

impl Refusal {
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Oversized => "oversized",
            Refusal::Malformed => "malformed",
            Refusal::BadName => "bad_name",
            Refusal::ImplausibleLoad => "implausible_load",
            Refusal::TooMany => "too_many",
            Refusal::QuotaPeers => "quota_peers",
            Refusal::QuotaBookings => "quota_bookings",
            Refusal::QuotaLoad => "quota_load",
            Refusal::QuotaKeys => "quota_keys",
            Refusal::QuotaQueue => "quota_queue",
        }
    }
}

/// A replica id as `[cluster] replica_id` allows it.
pub fn replica_ok(r: &str) -> bool {
    !r.is_empty() && r.len() <= 128 && r.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn name_ok(n: &str) -> bool {
    !n.is_empty() && n.len() <= MAX_NAME_BYTES
}

/// Pool and worker names within bounds.
pub fn names(pool: &str, w: &str) -> Result<(), Refusal> {
    if name_ok(pool) && name_ok(w) {
        Ok(())
    } else {
        Err(Refusal::BadName)
    }
}

/// Token counts within `max`.
pub fn tokens(t: &[u32], max: u32) -> Result<(), Refusal> {
    if t.iter().all(|&t| t <= max) {
        Ok(())
    } else {
        Err(Refusal::ImplausibleLoad)
    }
}

/// A list's length within `max`.
pub fn count(n: usize, max: usize) -> Result<(), Refusal> {
    if n <= max {
        Ok(())
    } else {
        Err(Refusal::TooMany)
    }
}

/// The tag and replica id at the head of a message (`{"k":"book","r":"r1",…`, as serde writes it),
/// read without parsing the rest: the records queue is shared out by replica before any parsing.
pub fn peek(payload: &[u8]) -> Option<(&str, &str)> {
    let rest = payload.strip_prefix(b"{\"k\":\"")?;
    let end = memchr_quote(rest)?;
    let tag = std::str::from_utf8(&rest[..end]).ok()?;
    let rest = rest[end..].strip_prefix(b"\",\"r\":\"")?;
    let end = memchr_quote(rest)?;
    let r = std::str::from_utf8(&rest[..end]).ok()?;
    replica_ok(r).then_some((tag, r))
}

fn memchr_quote(b: &[u8]) -> Option<usize> {
    b.iter().take(129).position(|&c| c == b'"')
}

/// This replica's own traffic, the yardstick of what another may claim.
#[derive(Default)]
pub struct OwnTraffic {
    /// Index keys this replica's dispatch records carried, since start.
    pub keys: AtomicU64,
}

/// One replica's index writes in the current window.
#[derive(Clone, Copy)]
struct KeyWindow {
    start: Instant,
    own_at_start: u64,
    allowance: u64,
    used: u64,
}

/// What one replica may weigh here, kept per replica by the inbox.
pub struct Share {
    quotas: PeerQuotas,
    window: Option<KeyWindow>,
    /// Load this replica's bookings hold per worker (by the worker's address while any holds it).
    load: HashMap<usize, u64>,
}

impl Share {
    pub fn new(quotas: PeerQuotas) -> Share {
        Share { quotas, window: None, load: HashMap::new() }
    }

    /// The part of `load` a new booking may add on a worker, where this replica itself has
    /// `own_tokens` in flight; `Err` when nothing is left.
    pub fn grant(&mut self, worker: usize, load: Load, own_tokens: u64) -> Result<(Load, bool), Refusal> {
        let cap = self.quotas.load_floor_tokens.saturating_add((self.quotas.ratio * own_tokens as f64) as u64);
        let held = self.load.get(&worker).copied().unwrap_or(0);
        let room = cap.saturating_sub(held);
        let asked = total(load);
        if room == 0 && asked > 0 {
            return Err(Refusal::QuotaLoad);
        }
        let granted = if asked <= room { load } else { scale(load, room, asked) };
        *self.load.entry(worker).or_default() += total(granted);
        Ok((granted, asked > room))
    }

    /// A booking's load (or part of it) released on `worker`.
    pub fn release(&mut self, worker: usize, load: Load) {
        if let Some(held) = self.load.get_mut(&worker) {
            *held = held.saturating_sub(total(load));
            if *held == 0 {
                self.load.remove(&worker);
            }
        }
    }

    /// Whether `keys` more index writes fit this replica's window, this replica having written
    /// `own` keys since start; charges them when they do.
    pub fn take_keys(&mut self, keys: u64, own: u64, now: Instant) -> Result<(), Refusal> {
        let ratio = self.quotas.ratio;
        let w = match self.window {
            Some(w) if now.duration_since(w.start) < KEYS_WINDOW => w,
            // A new window's allowance follows this replica's own writes in the last one.
            last => {
                let own_last = last.map_or(0, |w| own.saturating_sub(w.own_at_start));
                KeyWindow {
                    start: now,
                    own_at_start: own,
                    allowance: KEYS_FLOOR + (ratio * own_last as f64) as u64,
                    used: 0,
                }
            }
        };
        let used = w.used.saturating_add(keys);
        let fits = used <= w.allowance;
        // A refused record charges nothing: the replica's next, smaller one may still fit.
        self.window = Some(KeyWindow { used: if fits { used } else { w.used }, ..w });
        if fits {
            Ok(())
        } else {
            Err(Refusal::QuotaKeys)
        }
    }
}

fn total(l: Load) -> u64 {
    u64::from(l.prefill_tokens) + u64::from(l.decode_tokens) + u64::from(l.image_tokens)
}

/// `load` scaled down to `room` tokens of its `asked`, each part alike.
fn scale(load: Load, room: u64, asked: u64) -> Load {
    let part = |t: u32| ((u64::from(t) * room) / asked.max(1)) as u32;
    Load {
        prefill_tokens: part(load.prefill_tokens),
        decode_tokens: part(load.decode_tokens),
        image_tokens: part(load.image_tokens),
    }
}

/// The records queue, shared out by replica: a quarter of its count and bytes at most each, so one
/// flooding replica cannot crowd out the others' records.
#[derive(Default)]
pub struct QueueShares {
    inner: Mutex<QueueState>,
}

#[derive(Default)]
struct QueueState {
    count: usize,
    bytes: usize,
    by_replica: HashMap<String, (usize, usize)>,
}

impl QueueShares {
    /// Admits a record of `len` bytes from replica `r`.
    pub fn admit(&self, r: &str, len: usize) -> Result<(), Refusal> {
        let mut q = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (count, bytes) = q.by_replica.get(r).copied().unwrap_or((0, 0));
        let full = q.count + 1 > RECORDS_QUEUE || q.bytes + len > RECORDS_QUEUE_BYTES;
        let over_share = count + 1 > RECORDS_QUEUE / 4 || bytes + len > RECORDS_QUEUE_BYTES / 4;
        if full || over_share {
            return Err(Refusal::QuotaQueue);
        }
        q.count += 1;
        q.bytes += len;
        q.by_replica.insert(r.to_owned(), (count + 1, bytes + len));
        Ok(())
    }

    /// A record of `len` bytes from `r` left the queue.
    pub fn done(&self, r: &str, len: usize) {
        let mut q = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        q.count = q.count.saturating_sub(1);
        q.bytes = q.bytes.saturating_sub(len);
        if let Some((count, bytes)) = q.by_replica.get_mut(r) {
            *count = count.saturating_sub(1);
            *bytes = bytes.saturating_sub(len);
            if *count == 0 {
                q.by_replica.remove(r);
            }
        }
    }

    /// Records and bytes queued now.
    #[cfg(test)]
    pub fn queued(&self) -> (usize, usize) {
        let q = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        (q.count, q.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(p: u32, d: u32) -> Load {
        Load { prefill_tokens: p, decode_tokens: d, image_tokens: 0 }
    }

    #[test]
    fn peek_reads_tag_and_replica_without_parsing() {
        let bytes = br#"{"k":"dispatch","r":"r-1.a","pool":"p","w":"w","src":1,"b":[1,2]}"#;
        assert_eq!(peek(bytes), Some(("dispatch", "r-1.a")));
        for bad in [&b"{\"k\":\"book\",\"r\":\"a\\\"b\"}"[..], b"{\"r\":\"x\",\"k\":\"book\"}", b"", b"{\"k\":\"book\""]
        {
            assert_eq!(peek(bad), None, "{}", String::from_utf8_lossy(bad));
        }
        let long = format!("{{\"k\":\"book\",\"r\":\"{}\"}}", "a".repeat(100_000));
        assert_eq!(peek(long.as_bytes()), None, "a long id is refused without scanning it all");
    }

    #[test]
    fn a_replicas_load_on_a_worker_is_capped_by_this_replicas_own() {
        let q = PeerQuotas { load_floor_tokens: 1_000, ratio: 2.0, ..PeerQuotas::default() };
        let mut s = Share::new(q);
        // Idle here: the floor alone.
        assert_eq!(s.grant(1, load(600, 0), 0), Ok((load(600, 0), false)));
        let (granted, clipped) = s.grant(1, load(800, 200), 0).unwrap();
        assert!(clipped && total(granted) <= 400, "{granted:?}");
        assert_eq!(s.grant(1, load(10, 0), 0), Err(Refusal::QuotaLoad));
        // Another worker has its own room; busy here, the cap grows with this replica's own load.
        assert_eq!(s.grant(2, load(5_000, 0), 2_000), Ok((load(5_000, 0), false)));
        s.release(1, load(600, 0));
        assert_eq!(s.grant(1, load(500, 0), 0), Ok((load(500, 0), false)));
    }

    #[test]
    fn index_keys_per_window_follow_this_replicas_own_writes() {
        let mut s = Share::new(PeerQuotas { ratio: 4.0, ..PeerQuotas::default() });
        let t0 = Instant::now();
        assert_eq!(s.take_keys(KEYS_FLOOR, 0, t0), Ok(()));
        assert_eq!(s.take_keys(1, 0, t0), Err(Refusal::QuotaKeys), "the floor, while this replica writes none");
        // This replica wrote 10 000 keys over that window: the next allows 4 × that more.
        let t1 = t0 + KEYS_WINDOW;
        assert_eq!(s.take_keys(KEYS_FLOOR + 40_000, 10_000, t1), Ok(()));
        assert_eq!(s.take_keys(1, 10_000, t1), Err(Refusal::QuotaKeys));
    }

    #[test]
    fn one_replica_gets_a_quarter_of_the_records_queue() {
        let q = QueueShares::default();
        for _ in 0..RECORDS_QUEUE / 4 {
            q.admit("rogue", 10).unwrap();
        }
        assert_eq!(q.admit("rogue", 10), Err(Refusal::QuotaQueue));
        q.admit("honest", 10).expect("another replica still has room");
        assert_eq!(q.admit("big", RECORDS_QUEUE_BYTES / 4 + 1), Err(Refusal::QuotaQueue));
        q.done("rogue", 10);
        q.admit("rogue", 10).expect("room again once applied");
        assert_eq!(q.queued(), (RECORDS_QUEUE / 4 + 1, (RECORDS_QUEUE / 4 + 1) * 10));
    }
}
