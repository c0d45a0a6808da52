//! In-flight state shared between replicas: what this replica tells the others ([`Outbox`], the
//! core's `Link` per pool) and what it holds of theirs ([`Inbox`]).
//!
//! Every message of a replica goes out on one subject, in order, so a booking's first byte and end
//! never overtake it. Another replica's booking is remote load on its worker until its end arrives,
//! its replica's heartbeat no longer lists it (a lost end), or its replica has been silent for
//! `booking_ttl` (it died, or NATS is down: each replica then routes on its own view). Dispatch records
//! (blocks) and image records (what the exact route sent a worker, for its image-residency model) are
//! applied as the sender recorded them, and so are the unseen tokens its fallbacks' engines counted
//! and the Responses API answers its workers stored (response id → worker, for pinning follow-ups).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mmrouter_core::routing::{ImageUse, Link, Load, Router, Source, Worker};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::checks::{self, OwnTraffic, Refusal, Share, MAX_BEAT_LIVE, MAX_DISPATCH_BLOCKS, MAX_IMAGES};
use crate::config::PeerQuotas;
use crate::observe::Observer;
use crate::observe::*;
use crate::pools::{valid_response_id, ResponsePeers, ResponseStore};

/// Messages queued for NATS, beyond which new ones are dropped (counted): a NATS outage must never
/// hold up a request.
pub const OUTBOX_CAPACITY: usize = 16_384;

/// One replica's message (JSON on `<prefix>.replicas`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "k", rename_all = "snake_case")]
pub enum Msg {
    /// Request `id` admitted on `pool`/`w` with prefill `p`, decode `d` and image `i` tokens, sent
    /// at `t` (microseconds since the Unix epoch; 0 or absent: unknown).
    Book {
        r: String,
        id: u64,
        pool: String,
        w: String,
        p: u32,
        d: u32,
        i: u32,
        #[serde(default)]
        t: u64,
    },
    First {
        r: String,
        id: u64,
    },
    End {
        r: String,
        id: u64,
    },
    /// The replica is alive; `live` are its bookings in flight.
    Beat {
        r: String,
        live: Vec<u64>,
    },
    /// `b` recorded for `pool`/`w` at dispatch, `src` 1 = pending, 2 = approximate.
    Dispatch {
        r: String,
        pool: String,
        w: String,
        src: u8,
        b: Vec<u64>,
    },
    /// Images sent to `pool`/`w` on the exact route: (identity as 32 hex digits, encoder tokens).
    Images {
        r: String,
        pool: String,
        w: String,
        img: Vec<(String, u32)>,
    },
    /// In `pool`, a fallback's prefix ending at block key `key` held `t` tokens more than its plan.
    Unseen {
        r: String,
        pool: String,
        key: u64,
        t: u32,
    },
    /// Response `id` (Responses API) is stored at `pool`/`w`: follow-ups naming it go there.
    Stored {
        r: String,
        pool: String,
        w: String,
        id: String,
    },
}

impl Msg {
    /// Whether a message's tag (`checks::peek`) is a booking, its first byte, end or a heartbeat:
    /// those are applied on arrival and in order, ahead of the records (dispatch, images, unseen
    /// tokens), whose index writes would otherwise delay the next booking.
    pub fn is_booking(tag: &str) -> bool {
        matches!(tag, "book" | "first" | "end" | "beat")
    }

    /// The message's values against what an honest sender sends (its sender's state is checked later).
    pub fn check(&self) -> Result<(), Refusal> {
        use checks::{count, names, tokens, MAX_IMAGE_TOKENS, MAX_TOKENS};
        if !checks::replica_ok(self.replica()) {
            return Err(Refusal::BadName);
        }
        match self {
            Msg::Book { pool, w, p, d, i, .. } => names(pool, w).and(tokens(&[*p, *d, *i], MAX_TOKENS)),
            Msg::First { .. } | Msg::End { .. } => Ok(()),
            Msg::Beat { live, .. } => count(live.len(), MAX_BEAT_LIVE),
            Msg::Dispatch { pool, w, b, .. } => names(pool, w).and(count(b.len(), MAX_DISPATCH_BLOCKS)),
            Msg::Images { pool, w, img, .. } => {
                let t: Vec<u32> = img.iter().map(|(_, t)| *t).collect();
                names(pool, w).and(count(img.len(), MAX_IMAGES)).and(tokens(&t, MAX_IMAGE_TOKENS))
            }
            Msg::Unseen { pool, t, .. } => names(pool, "-").and(tokens(&[*t], MAX_TOKENS)),
            Msg::Stored { pool, w, id, .. } => {
                names(pool, w).and(if valid_response_id(id) { Ok(()) } else { Err(Refusal::BadName) })
            }
        }
    }

    /// Index keys the record writes (0 for bookings).
    pub fn keys(&self) -> u64 {
        match self {
            Msg::Dispatch { b, .. } => b.len() as u64,
            Msg::Images { img, .. } => img.len() as u64,
            Msg::Unseen { .. } | Msg::Stored { .. } => 1,
            _ => 0,
        }
    }

    pub fn replica(&self) -> &str {
        match self {
            Msg::Book { r, .. } | Msg::First { r, .. } | Msg::End { r, .. } | Msg::Beat { r, .. } => r,
            Msg::Dispatch { r, .. } | Msg::Images { r, .. } | Msg::Unseen { r, .. } | Msg::Stored { r, .. } => r,
        }
    }
}

/// This replica's side: ids, its live bookings (for heartbeats) and the queue to NATS.
pub struct Outbox {
    replica: String,
    next: AtomicU64,
    live: Mutex<HashSet<u64>>,
    tx: mpsc::Sender<Msg>,
    observe: Arc<Observer>,
    /// What this replica itself sends: the yardstick of what the others may claim here.
    pub own: Arc<OwnTraffic>,
}

impl Outbox {
    pub fn new(replica: String, observe: Arc<Observer>) -> (Arc<Outbox>, mpsc::Receiver<Msg>) {
        let (tx, rx) = mpsc::channel(OUTBOX_CAPACITY);
        let own = Arc::default();
        let out = Outbox { replica, next: AtomicU64::new(1), live: Mutex::default(), tx, observe, own };
        (Arc::new(out), rx)
    }

    /// The core's link for `pool`.
    pub fn link(self: &Arc<Self>, pool: &str) -> Arc<dyn Link> {
        Arc::new(PoolLink { pool: pool.to_owned(), out: self.clone() })
    }

    /// Queues a heartbeat listing the live bookings. Queued under the live set's lock, as bookings
    /// and ends are: the queue's order is the set's, so a heartbeat never omits a booking queued
    /// before it nor lists one whose end was queued before it.
    pub fn beat(&self) {
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let live = live.iter().take(MAX_BEAT_LIVE).copied().collect();
        self.send(Msg::Beat { r: self.replica.clone(), live });
    }

    fn send(&self, msg: Msg) {
        if self.tx.try_send(msg).is_err() {
            self.observe.cluster_count(CLUSTER_MESSAGES_DROPPED_TOTAL, ("reason", "queue_full"), 1);
        }
    }
}

impl ResponsePeers for Outbox {
    fn stored(&self, id: &str, pool: &str, worker: &str) {
        self.own.keys.fetch_add(1, Ordering::Relaxed);
        let (r, pool, w, id) = (self.replica.clone(), pool.to_owned(), worker.to_owned(), id.to_owned());
        self.send(Msg::Stored { r, pool, w, id });
    }
}

/// The core's `Link` for one pool.
struct PoolLink {
    pool: String,
    out: Arc<Outbox>,
}

impl Link for PoolLink {
    fn book(&self, worker: &str, load: Load) -> u64 {
        let o = &self.out;
        let id = o.next.fetch_add(1, Ordering::Relaxed);
        let (p, d, i) = (load.prefill_tokens, load.decode_tokens, load.image_tokens);
        let (r, pool, w, t) = (o.replica.clone(), self.pool.clone(), worker.to_owned(), unix_micros());
        let msg = Msg::Book { r, id, pool, w, p, d, i, t };
        let mut live = o.live.lock().unwrap_or_else(|e| e.into_inner());
        live.insert(id);
        o.send(msg);
        drop(live);
        o.observe.cluster_count(CLUSTER_BOOKINGS_TOTAL, ("event", "sent"), 1);
        id
    }

    fn first_byte(&self, booking: u64) {
        self.out.send(Msg::First { r: self.out.replica.clone(), id: booking });
    }

    fn finish(&self, booking: u64) {
        let o = &self.out;
        let mut live = o.live.lock().unwrap_or_else(|e| e.into_inner());
        live.remove(&booking);
        o.send(Msg::End { r: o.replica.clone(), id: booking });
    }

    fn dispatched(&self, worker: &str, blocks: &[u64], source: Source) {
        let src = match source {
            Source::Pending => 1,
            Source::Approximate => 2,
            Source::Event => return,
        };
        let b = blocks[..blocks.len().min(MAX_DISPATCH_BLOCKS)].to_vec();
        self.out.own.keys.fetch_add(b.len() as u64, Ordering::Relaxed);
        let (r, pool, w) = (self.out.replica.clone(), self.pool.clone(), worker.to_owned());
        self.out.send(Msg::Dispatch { r, pool, w, src, b });
        self.out.observe.cluster_count(CLUSTER_DISPATCHES_TOTAL, ("direction", "sent"), 1);
    }

    fn images_sent(&self, worker: &str, images: &[ImageUse]) {
        let img = images.iter().take(MAX_IMAGES).map(|i| (format!("{:032x}", i.key), i.tokens)).collect();
        let (r, pool, w) = (self.out.replica.clone(), self.pool.clone(), worker.to_owned());
        self.out.send(Msg::Images { r, pool, w, img });
    }

    fn unseen_learnt(&self, key: u64, tokens: u32) {
        let (r, pool) = (self.out.replica.clone(), self.pool.clone());
        self.out.send(Msg::Unseen { r, pool, key, t: tokens });
    }
}

/// Now, in microseconds since the Unix epoch (0 if the clock is before it).
fn unix_micros() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
}

/// A pool's router by the pool's name (the pools in force).
pub type RouterOf<'a> = dyn Fn(&str) -> Option<Arc<Router>> + 'a;

/// One booking of another replica, with the load it still holds here (its share, not its claim).
struct Booking {
    worker: Arc<Worker>,
    load: Load,
}

struct Peer {
    last_seen: Instant,
    bookings: HashMap<u64, Booking>,
    share: Share,
}

impl Peer {
    /// Releases `load` of a booking on `worker`: the worker's remote load and the replica's share.
    fn release(&mut self, worker: &Worker, load: Load, requests: u64) {
        worker.release_remote(load, requests);
        self.share.release(worker as *const Worker as usize, load);
    }

    fn end(&mut self, id: u64) {
        if let Some(b) = self.bookings.remove(&id) {
            self.release(&b.worker, b.load, 1);
        }
    }
}

/// The other replicas' bookings, as remote load on this replica's workers.
pub struct Inbox {
    replica: String,
    ttl: Duration,
    peers: Mutex<HashMap<String, Peer>>,
    observe: Arc<Observer>,
    quotas: PeerQuotas,
    own: Arc<OwnTraffic>,
    /// Where other replicas' stored response ids go (none: they are ignored).
    responses: Option<Arc<ResponseStore>>,
}

impl Inbox {
    pub fn new(replica: String, ttl: Duration, observe: Arc<Observer>) -> Inbox {
        let (quotas, own) = (PeerQuotas::default(), Arc::default());
        Inbox { replica, ttl, peers: Mutex::default(), observe, quotas, own, responses: None }
    }

    /// The same, remembering other replicas' stored response ids in `store`.
    pub fn with_responses(self, store: Arc<ResponseStore>) -> Inbox {
        Inbox { responses: Some(store), ..self }
    }

    /// The same, with `[cluster]`'s quotas measured against this replica's own traffic.
    pub fn limited(self, quotas: PeerQuotas, own: Arc<OwnTraffic>) -> Inbox {
        Inbox { quotas, own, ..self }
    }

    /// Applies one message from another replica (this replica's own are ignored); `routers` finds a
    /// pool's router by the pool's name. A message is checked before it counts, and refused (counted
    /// by reason) when it exceeds what an honest replica sends or its sender's share.
    pub fn apply(&self, routers: &RouterOf<'_>, msg: Msg) {
        if msg.replica() == self.replica {
            return;
        }
        if let Err(refusal) = self.try_apply(routers, msg) {
            self.refused(refusal);
        }
    }

    pub fn refused(&self, refusal: Refusal) {
        self.observe.cluster_count(CLUSTER_MESSAGES_REFUSED_TOTAL, ("reason", refusal.label()), 1);
    }

    fn try_apply(&self, routers: &RouterOf<'_>, msg: Msg) -> Result<(), Refusal> {
        msg.check()?;
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if !peers.contains_key(msg.replica()) && peers.len() >= self.quotas.max_peers {
            return Err(Refusal::QuotaPeers);
        }
        let peer = peers.entry(msg.replica().to_owned()).or_insert_with(|| Peer {
            last_seen: Instant::now(),
            bookings: HashMap::new(),
            share: Share::new(self.quotas),
        });
        peer.last_seen = Instant::now();
        let keys = msg.keys();
        if keys > 0 {
            peer.share.take_keys(keys, self.own.keys.load(Ordering::Relaxed), Instant::now())?;
            // The index writes run without the lock: bookings never wait behind them.
            drop(peers);
            return self.record(routers, msg);
        }
        match msg {
            Msg::Book { id, pool, w, p, d, i, t, .. } => {
                if t > 0 {
                    self.observe.booking_delay(unix_micros().saturating_sub(t) as f64 / 1e6);
                }
                let load = Load { prefill_tokens: p, decode_tokens: d, image_tokens: i };
                return self.book(routers, peer, id, (&pool, &w, load));
            }
            Msg::First { id, .. } => {
                if let Some(b) = peer.bookings.get_mut(&id) {
                    let prefill =
                        Load { prefill_tokens: std::mem::take(&mut b.load.prefill_tokens), ..Load::default() };
                    let worker = b.worker.clone();
                    peer.release(&worker, prefill, 0);
                }
            }
            Msg::End { id, .. } => peer.end(id),
            Msg::Beat { live, .. } => {
                let live: HashSet<u64> = live.into_iter().collect();
                let lost: Vec<u64> = peer.bookings.keys().filter(|id| !live.contains(id)).copied().collect();
                lost.iter().for_each(|&id| peer.end(id));
                self.observe.cluster_count(CLUSTER_BOOKINGS_TOTAL, ("event", "reconciled"), lost.len() as u64);
            }
            Msg::Dispatch { .. } | Msg::Images { .. } | Msg::Unseen { .. } | Msg::Stored { .. } => {}
        }
        Ok(())
    }

    /// A booking: held as remote load on its worker, up to the replica's share of that worker.
    fn book(
        &self,
        routers: &RouterOf<'_>,
        peer: &mut Peer,
        id: u64,
        (pool, w, load): (&str, &str, Load),
    ) -> Result<(), Refusal> {
        if peer.bookings.len() >= self.quotas.max_bookings && !peer.bookings.contains_key(&id) {
            return Err(Refusal::QuotaBookings);
        }
        let Some(worker) = self.worker(routers, pool, w) else { return Ok(()) };
        peer.end(id); // a doubled booking holds once
        let own = worker.inflight();
        let own_tokens = own.prefill_tokens + own.decode_tokens + own.image_tokens;
        let (granted, clipped) = peer.share.grant(Arc::as_ptr(&worker) as usize, load, own_tokens)?;
        worker.add_remote(granted);
        peer.bookings.insert(id, Booking { worker, load: granted });
        self.observe.cluster_count(CLUSTER_BOOKINGS_TOTAL, ("event", "applied"), 1);
        if clipped {
            self.refused(Refusal::QuotaLoad);
        }
        Ok(())
    }

    /// Dispatch, image and unseen-token records, already charged to their replica's key share.
    fn record(&self, routers: &RouterOf<'_>, msg: Msg) -> Result<(), Refusal> {
        match msg {
            Msg::Dispatch { pool, w, src, b, .. } => self.dispatch(routers, (&pool, &w), src, &b),
            Msg::Images { pool, w, img, .. } => self.images(routers, (&pool, &w), &img),
            Msg::Unseen { pool, key, t, .. } => {
                if let Some(router) = self.router(routers, &pool) {
                    router.apply_remote_unseen(key, t);
                }
            }
            Msg::Stored { pool, w, id, .. } => self.stored(routers, (&pool, &w), &id),
            _ => {}
        }
        Ok(())
    }

    /// Another replica's worker stored response `id`: remembered when this replica has that worker.
    fn stored(&self, routers: &RouterOf<'_>, (pool, w): (&str, &str), id: &str) {
        let Some(store) = self.responses.as_ref() else { return };
        if self.worker_id(routers, pool, w).is_some() && store.learn_from_peer(id, pool, w) {
            self.observe.cluster_count(RESPONSES_LEARNT_TOTAL, ("source", "peer"), 1);
        }
    }

    fn images(&self, routers: &RouterOf<'_>, (pool, w): (&str, &str), img: &[(String, u32)]) {
        let parsed: Option<Vec<ImageUse>> = img
            .iter()
            .take(MAX_IMAGES)
            .map(|(k, tokens)| u128::from_str_radix(k, 16).ok().map(|key| ImageUse { key, tokens: *tokens, end: 0 }))
            .collect();
        let Some(images) = parsed else {
            return self.observe.cluster_count(CLUSTER_MESSAGES_DROPPED_TOTAL, ("reason", "malformed"), 1);
        };
        if let Some((router, id)) = self.worker_id(routers, pool, w) {
            router.apply_remote_images(id, &images);
        }
    }

    fn dispatch(&self, routers: &RouterOf<'_>, (pool, w): (&str, &str), src: u8, blocks: &[u64]) {
        let source = match src {
            1 => Source::Pending,
            2 => Source::Approximate,
            _ => return self.observe.cluster_count(CLUSTER_MESSAGES_DROPPED_TOTAL, ("reason", "malformed"), 1),
        };
        if let Some((router, id)) = self.worker_id(routers, pool, w) {
            router.apply_remote_dispatch(id, blocks, source);
            self.observe.cluster_count(CLUSTER_DISPATCHES_TOTAL, ("direction", "applied"), 1);
        }
    }

    /// `pool`'s router, or none (counted as dropped).
    fn router(&self, routers: &RouterOf<'_>, pool: &str) -> Option<Arc<Router>> {
        let router = routers(pool);
        if router.is_none() {
            self.observe.cluster_count(CLUSTER_MESSAGES_DROPPED_TOTAL, ("reason", "unknown_pool"), 1);
        }
        router
    }

    /// `pool`'s router and the id of its worker named `w`, or none (counted as dropped).
    fn worker_id(&self, routers: &RouterOf<'_>, pool: &str, w: &str) -> Option<(Arc<Router>, usize)> {
        let router = self.router(routers, pool)?;
        let Some(id) = router.find(w) else {
            self.observe.cluster_count(CLUSTER_MESSAGES_DROPPED_TOTAL, ("reason", "unknown_worker"), 1);
            return None;
        };
        Some((router, id))
    }

    fn worker(&self, routers: &RouterOf<'_>, pool: &str, w: &str) -> Option<Arc<Worker>> {
        let router = self.router(routers, pool)?;
        let found = router.lookup(w).map(|(_, w)| w);
        if found.is_none() {
            self.observe.cluster_count(CLUSTER_MESSAGES_DROPPED_TOTAL, ("reason", "unknown_worker"), 1);
        }
        found
    }

    /// Drops the bookings of replicas silent for longer than the TTL; returns (peers alive, bookings
    /// held) after it.
    pub fn expire(&self, now: Instant) -> (usize, usize) {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        let ttl = self.ttl;
        let silent: Vec<String> =
            peers.iter().filter(|(_, p)| now.duration_since(p.last_seen) > ttl).map(|(r, _)| r.clone()).collect();
        for r in silent {
            if let Some(peer) = peers.remove(&r) {
                let n = peer.bookings.len() as u64;
                peer.bookings.into_values().for_each(|b| b.worker.release_remote(b.load, 1));
                self.observe.cluster_count(CLUSTER_BOOKINGS_TOTAL, ("event", "expired"), n);
                tracing::info!(replica = %r, bookings = n, "cluster: replica silent, its bookings expired");
            }
        }
        (peers.len(), peers.values().map(|p| p.bookings.len()).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mmrouter_core::routing::SelectRequest;
    use proptest::prelude::*;

    #[test]
    fn messages_are_small_tagged_json() {
        let m = Msg::Book { r: "r1".into(), id: 7, pool: "p".into(), w: "w0".into(), p: 100, d: 16, i: 0, t: 5 };
        let text = serde_json::to_string(&m).unwrap();
        assert_eq!(text, r#"{"k":"book","r":"r1","id":7,"pool":"p","w":"w0","p":100,"d":16,"i":0,"t":5}"#);
        assert_eq!(serde_json::from_str::<Msg>(&text).unwrap(), m);
        assert!(serde_json::from_str::<Msg>(r#"{"k":"nuke","r":"x"}"#).is_err());
        // A replica of an earlier version sends no send time.
        let old = r#"{"k":"book","r":"r1","id":7,"pool":"p","w":"w0","p":100,"d":16,"i":0}"#;
        assert!(matches!(serde_json::from_str::<Msg>(old).unwrap(), Msg::Book { id: 7, t: 0, .. }));
    }

    #[test]
    fn bookings_are_told_from_records_by_their_tag() {
        let r = || "r".to_owned();
        let bookings = [
            Msg::Book { r: r(), id: 1, pool: r(), w: r(), p: 1, d: 1, i: 0, t: 1 },
            Msg::First { r: r(), id: 1 },
            Msg::End { r: r(), id: 1 },
            Msg::Beat { r: r(), live: vec![1] },
        ];
        let records = [
            Msg::Dispatch { r: r(), pool: r(), w: r(), src: 1, b: vec![1] },
            Msg::Images { r: r(), pool: r(), w: r(), img: vec![] },
            Msg::Unseen { r: r(), pool: r(), key: 1, t: 1 },
        ];
        let tag = |m: &Msg| {
            let bytes = serde_json::to_vec(m).unwrap();
            checks::peek(&bytes).map(|(tag, _)| Msg::is_booking(tag))
        };
        assert!(bookings.iter().all(|m| tag(m) == Some(true)));
        assert!(records.iter().all(|m| tag(m) == Some(false)));
        for odd in [&b"{\"k\":\"booking\"}"[..], b"{\"k\":\"end", b"", b"not json"] {
            assert!(
                !checks::peek(odd).is_some_and(|(tag, _)| Msg::is_booking(tag)),
                "{}",
                String::from_utf8_lossy(odd)
            );
        }
    }

    fn router() -> Arc<Router> {
        let specs = ["w0", "w1"].map(|n| mmrouter_core::routing::WorkerSpec::new(n, "http://127.0.0.1:1")).to_vec();
        Arc::new(Router::new(Default::default(), specs).unwrap())
    }

    fn book(r: &str, id: u64, w: &str) -> Msg {
        Msg::Book { r: r.into(), id, pool: "p".into(), w: w.into(), p: 100, d: 10, i: 5, t: 0 }
    }

    #[test]
    fn bookings_hold_remote_load_until_their_end_a_heartbeat_without_them_or_silence() {
        let (router, observe) = (router(), Arc::new(Observer::new()));
        let routers = |pool: &str| (pool == "p").then(|| router.clone());
        let inbox = Inbox::new("me".into(), Duration::from_secs(5), observe);
        let w1 = router.worker(1);
        inbox.apply(&routers, book("other", 1, "w1"));
        inbox.apply(&routers, book("other", 2, "w1"));
        inbox.apply(&routers, book("me", 3, "w1")); // our own echo: ignored
        inbox.apply(&routers, book("other", 4, "nobody")); // unknown worker: dropped
        assert_eq!((w1.remote_inflight().requests, w1.remote_inflight().prefill_tokens), (2, 200));
        inbox.apply(&routers, Msg::First { r: "other".into(), id: 1 });
        inbox.apply(&routers, Msg::First { r: "other".into(), id: 1 }); // doubled: once
        assert_eq!(w1.remote_inflight().prefill_tokens, 100);
        inbox.apply(&routers, Msg::End { r: "other".into(), id: 1 });
        assert_eq!(w1.remote_inflight().requests, 1);
        // Booking 2's end was lost: the next heartbeat no longer lists it.
        inbox.apply(&routers, Msg::Beat { r: "other".into(), live: vec![] });
        assert_eq!(w1.remote_inflight(), Default::default());
        inbox.apply(&routers, book("other", 5, "w0"));
        assert_eq!(inbox.expire(Instant::now()), (1, 1));
        assert_eq!(inbox.expire(Instant::now() + Duration::from_secs(6)), (0, 0), "silent: expired");
        assert_eq!(router.worker(0).remote_inflight(), Default::default());
        assert_eq!(router.worker(0).inflight(), Default::default(), "this replica's own load is untouched");
    }

    #[test]
    fn dispatch_records_enter_the_index_as_the_sender_recorded_them() {
        let (router, observe) = (router(), Arc::new(Observer::new()));
        let routers = |pool: &str| (pool == "p").then(|| router.clone());
        let inbox = Inbox::new("me".into(), Duration::from_secs(5), observe);
        let dispatch = |src| Msg::Dispatch { r: "o".into(), pool: "p".into(), w: "w1".into(), src, b: vec![1, 2, 3] };
        inbox.apply(&routers, dispatch(2));
        assert_eq!(router.index().probe_detail(&[1, 2, 3], 2)[1].approximate, 3);
        inbox.apply(&routers, dispatch(9)); // not a source: dropped
        assert_eq!(router.index_entries().total(), 3);
    }

    #[test]
    fn image_records_reach_the_workers_residency_model_and_bad_ones_are_dropped() {
        let (router, observe) = (router(), Arc::new(Observer::new()));
        let routers = |pool: &str| (pool == "p").then(|| router.clone());
        let inbox = Inbox::new("me".into(), Duration::from_secs(5), observe);
        let images =
            |k: &str| Msg::Images { r: "o".into(), pool: "p".into(), w: "w1".into(), img: vec![(k.into(), 300)] };
        let key = 0xab_u128 << 100 | 7;
        inbox.apply(&routers, images(&format!("{key:032x}")));
        let probe = [ImageUse { key, tokens: 300, end: 0 }];
        assert_eq!(router.worker(1).images_held(&probe)[0].encoder, 1.0);
        assert_eq!(router.worker(0).images_held(&probe)[0].encoder, 0.0);
        inbox.apply(&routers, images("not hex"));
        assert_eq!(router.worker(1).images_resident(), 1, "a malformed record changes nothing");
    }

    #[test]
    fn unseen_records_reach_the_router_and_a_linked_router_shares_what_it_learns() {
        let (router, observe) = (router(), Arc::new(Observer::new()));
        let routers = |pool: &str| (pool == "p").then(|| router.clone());
        let inbox = Inbox::new("me".into(), Duration::from_secs(5), observe);
        inbox.apply(&routers, Msg::Unseen { r: "o".into(), pool: "p".into(), key: 3, t: 16_000 });
        inbox.apply(&routers, Msg::Unseen { r: "o".into(), pool: "elsewhere".into(), key: 4, t: 9 });
        let blocks = [1, 2, 3, 4];
        let req = SelectRequest {
            blocks: &blocks,
            block_size: 16,
            prompt_tokens: 64,
            decode_tokens: 0,
            images: Vec::new(),
            unseen: true,
        };
        assert_eq!(router.select(&req).expect("healthy").unseen.total, 16_000);

        let (out, mut rx) = Outbox::new("me".into(), Arc::new(Observer::new()));
        router.set_link(out.link("p"));
        router.learn_unseen(9, 1200);
        let sent = rx.try_recv().expect("shared");
        assert_eq!(sent, Msg::Unseen { r: "me".into(), pool: "p".into(), key: 9, t: 1200 });
    }

    #[test]
    fn stored_response_ids_are_shared_checked_and_bounded_by_the_key_share() {
        let (router, observe) = (router(), Arc::new(Observer::new()));
        let routers = |pool: &str| (pool == "p").then(|| router.clone());
        let store = Arc::new(ResponseStore::new(&Default::default()));
        let inbox = Inbox::new("me".into(), Duration::from_secs(5), observe)
            .limited(PeerQuotas::default(), Arc::default())
            .with_responses(store.clone());
        let stored = |id: &str, w: &str| Msg::Stored { r: "o".into(), pool: "p".into(), w: w.into(), id: id.into() };
        inbox.apply(&routers, stored("resp_1", "w1"));
        assert_eq!(store.lookup("resp_1").map(|p| p.worker.to_string()).as_deref(), Some("w1"));
        inbox.apply(&routers, stored("resp_2", "nobody")); // no such worker here: not kept
        assert!(store.lookup("resp_2").is_none());
        // An id no worker could give is refused before it counts.
        assert_eq!(stored("../x", "w1").check(), Err(Refusal::BadName));
        assert_eq!(stored(&"r".repeat(300), "w1").check(), Err(Refusal::BadName));
        inbox.apply(&routers, stored("../x", "w1"));
        assert!(store.lookup("../x").is_none());
        // A flood is held to the peer's share of index keys per window (this replica sent none).
        let flood = 3 * checks::MAX_DISPATCH_BLOCKS;
        for i in 0..flood {
            inbox.apply(&routers, stored(&format!("resp_flood_{i}"), "w0"));
        }
        let kept = (0..flood).filter(|i| store.lookup(&format!("resp_flood_{i}")).is_some()).count();
        assert!(kept <= 2 * checks::MAX_DISPATCH_BLOCKS, "{kept} of {flood} kept");

        // This replica's own learning goes out as a record.
        let (out, mut rx) = Outbox::new("me".into(), Arc::new(Observer::new()));
        let mine = ResponseStore::new(&Default::default());
        mine.set_peers(out.clone());
        mine.learn("resp_9", "p", "w0");
        let sent = rx.try_recv().expect("shared");
        assert_eq!(sent, Msg::Stored { r: "me".into(), pool: "p".into(), w: "w0".into(), id: "resp_9".into() });
        assert_eq!(sent.keys(), 1);
    }

    #[test]
    fn values_beyond_an_honest_senders_are_refused() {
        let r = || "r1".to_owned();
        let ok = Msg::Book { r: r(), id: 1, pool: r(), w: r(), p: 6_400, d: 256, i: 0, t: 0 };
        assert_eq!(ok.check(), Ok(()));
        let cases = [
            (
                Msg::Book { r: r(), id: 1, pool: r(), w: r(), p: 4_000_000_000, d: 1, i: 0, t: 0 },
                Refusal::ImplausibleLoad,
            ),
            (Msg::Book { r: "x".repeat(129), id: 1, pool: r(), w: r(), p: 1, d: 1, i: 0, t: 0 }, Refusal::BadName),
            (Msg::Book { r: "a b".into(), id: 1, pool: r(), w: r(), p: 1, d: 1, i: 0, t: 0 }, Refusal::BadName),
            (Msg::Book { r: r(), id: 1, pool: r(), w: "w".repeat(300), p: 1, d: 1, i: 0, t: 0 }, Refusal::BadName),
            (Msg::Dispatch { r: r(), pool: r(), w: r(), src: 1, b: vec![7; 51_412] }, Refusal::TooMany),
            (Msg::Beat { r: r(), live: vec![1; MAX_BEAT_LIVE + 1] }, Refusal::TooMany),
            (Msg::Images { r: r(), pool: r(), w: r(), img: vec![("00".into(), 1); 65] }, Refusal::TooMany),
            (Msg::Images { r: r(), pool: r(), w: r(), img: vec![("00".into(), u32::MAX)] }, Refusal::ImplausibleLoad),
            (Msg::Unseen { r: r(), pool: r(), key: 1, t: u32::MAX }, Refusal::ImplausibleLoad),
        ];
        for (msg, want) in cases {
            assert_eq!(msg.check(), Err(want), "{msg:?}");
        }
    }

    fn three_workers() -> Arc<Router> {
        let specs =
            ["w0", "w1", "w2"].map(|n| mmrouter_core::routing::WorkerSpec::new(n, "http://127.0.0.1:1")).to_vec();
        Arc::new(Router::new(Default::default(), specs).unwrap())
    }

    fn refused(observe: &Observer, reason: &str) -> u64 {
        let text = observe.render(&[]);
        let line = format!("mmrouter_cluster_messages_refused_total{{reason=\"{reason}\"}} ");
        text.lines().find_map(|l| l.strip_prefix(&line)).map_or(0, |v| v.trim().parse().unwrap())
    }

    /// Where a cached 6 400-token prompt (400 blocks on w0) goes.
    fn cached_prompt_goes_to(router: &Router) -> usize {
        let blocks: Vec<u64> = (1..=400).collect();
        let req = SelectRequest {
            blocks: &blocks,
            block_size: 16,
            prompt_tokens: 6_400,
            decode_tokens: 256,
            images: Vec::new(),
            unseen: false,
        };
        router.select(&req).expect("healthy").candidates[0]
    }

    fn forge(inbox: &Inbox, routers: &RouterOf<'_>) {
        // The attack of issue 45: ten bookings of ~4·10⁹ tokens (sent here as the most a booking may
        // claim, and as the attack's own values) on the two workers without the prompt.
        for id in 0..10 {
            let w = if id % 2 == 0 { "w0" } else { "w1" };
            let book = |p| Msg::Book { r: "rogue".into(), id, pool: "p".into(), w: w.into(), p, d: p, i: 0, t: 0 };
            inbox.apply(routers, book(4_000_000_000));
            inbox.apply(routers, book((1 << 24) - 1));
        }
    }

    #[test]
    fn a_forging_replica_cannot_move_a_cached_prompt() {
        let (router, observe) = (three_workers(), Arc::new(Observer::new()));
        router.store_events(0, &(1..=400).collect::<Vec<u64>>());
        let routers = |pool: &str| (pool == "p").then(|| router.clone());
        assert_eq!(cached_prompt_goes_to(&router), 0);
        let inbox = Inbox::new("me".into(), Duration::from_secs(5), observe.clone());
        forge(&inbox, &routers);
        for w in 0..2 {
            let remote = router.worker(w).remote_inflight();
            let tokens = remote.prefill_tokens + remote.decode_tokens + remote.image_tokens;
            assert!(tokens <= PeerQuotas::default().load_floor_tokens, "w{w}: {remote:?}");
        }
        assert_eq!(cached_prompt_goes_to(&router), 0, "the forger's share is too small to move it");
        assert_eq!(refused(&observe, "implausible_load"), 10);
        assert!(refused(&observe, "quota_load") >= 8, "{}", observe.render(&[]));

        // The control: without the share the same attack moves the prompt (the test can fail).
        let (router, observe) = (three_workers(), Arc::new(Observer::new()));
        router.store_events(0, &(1..=400).collect::<Vec<u64>>());
        let routers = |pool: &str| (pool == "p").then(|| router.clone());
        let unbounded = PeerQuotas { load_floor_tokens: 1 << 32, ..PeerQuotas::default() };
        let inbox = Inbox::new("me".into(), Duration::from_secs(5), observe).limited(unbounded, Arc::default());
        forge(&inbox, &routers);
        assert_ne!(cached_prompt_goes_to(&router), 0);
    }

    #[test]
    fn the_index_flood_is_held_to_the_replicas_share() {
        let (router, observe) = (three_workers(), Arc::new(Observer::new()));
        let routers = |pool: &str| (pool == "p").then(|| router.clone());
        let inbox = Inbox::new("me".into(), Duration::from_secs(5), observe.clone());
        // 24 records: first the attack's 51 412 keys each (refused whole), then the senders' cap.
        for n in 0..24u64 {
            let b: Vec<u64> = (n * 100_000..n * 100_000 + 51_412).collect();
            inbox.apply(&routers, Msg::Dispatch { r: "rogue".into(), pool: "p".into(), w: "w1".into(), src: 2, b });
            let b: Vec<u64> = (n * 100_000..n * 100_000 + MAX_DISPATCH_BLOCKS as u64).collect();
            inbox.apply(&routers, Msg::Dispatch { r: "rogue".into(), pool: "p".into(), w: "w1".into(), src: 2, b });
        }
        assert_eq!(router.index_entries().total(), 2 * MAX_DISPATCH_BLOCKS, "two records' worth while idle here");
        assert_eq!(refused(&observe, "too_many"), 24);
        assert_eq!(refused(&observe, "quota_keys"), 22);
        // Another replica's records still count: the share is per replica.
        let b = vec![7_000_000, 7_000_001];
        inbox.apply(&routers, Msg::Dispatch { r: "honest".into(), pool: "p".into(), w: "w2".into(), src: 2, b });
        assert_eq!(router.index_entries().total(), 2 * MAX_DISPATCH_BLOCKS + 2);
    }

    #[test]
    fn bookings_and_replicas_are_bounded_and_a_silent_replica_is_forgotten() {
        let (router, observe) = (three_workers(), Arc::new(Observer::new()));
        let routers = |pool: &str| (pool == "p").then(|| router.clone());
        let quotas = PeerQuotas { max_peers: 2, max_bookings: 3, ..PeerQuotas::default() };
        let inbox = Inbox::new("me".into(), Duration::from_secs(5), observe.clone()).limited(quotas, Arc::default());
        let book =
            |r: &str, id| Msg::Book { r: r.into(), id, pool: "p".into(), w: "w2".into(), p: 1, d: 1, i: 0, t: 0 };
        for id in 0..5 {
            inbox.apply(&routers, book("a", id));
        }
        assert_eq!(router.worker(2).remote_inflight().requests, 3);
        assert_eq!(refused(&observe, "quota_bookings"), 2);
        inbox.apply(&routers, book("b", 1));
        inbox.apply(&routers, book("c", 1));
        assert_eq!(refused(&observe, "quota_peers"), 1);
        assert_eq!(inbox.expire(Instant::now() + Duration::from_secs(6)), (0, 0));
        assert_eq!(router.worker(2).remote_inflight(), Default::default());
        inbox.apply(&routers, book("c", 1));
        assert_eq!(router.worker(2).remote_inflight().requests, 1, "room again once the silent ones are forgotten");
    }

    fn arb_msg() -> impl Strategy<Value = Msg> {
        let r = prop_oneof![Just("rogue".to_owned()), Just("other".to_owned()), "[a-z]{0,3}", ".{0,4}"];
        let w = prop_oneof![Just("w0".to_owned()), Just("w1".to_owned()), Just("nobody".to_owned())];
        let pool = prop_oneof![Just("p".to_owned()), Just("q".to_owned())];
        let id = 0u64..8;
        prop_oneof![
            (r.clone(), id.clone(), pool.clone(), w.clone(), any::<u32>(), any::<u32>(), any::<u32>())
                .prop_map(|(r, id, pool, w, p, d, i)| Msg::Book { r, id, pool, w, p, d, i, t: 0 }),
            (r.clone(), id.clone()).prop_map(|(r, id)| Msg::First { r, id }),
            (r.clone(), id.clone()).prop_map(|(r, id)| Msg::End { r, id }),
            (r.clone(), proptest::collection::vec(0u64..8, 0..8)).prop_map(|(r, live)| Msg::Beat { r, live }),
            (r.clone(), pool.clone(), w.clone(), 0u8..4, proptest::collection::vec(any::<u64>(), 0..64))
                .prop_map(|(r, pool, w, src, b)| Msg::Dispatch { r, pool, w, src, b }),
            (r.clone(), pool.clone(), w, proptest::collection::vec((".{0,40}", any::<u32>()), 0..4))
                .prop_map(|(r, pool, w, img)| Msg::Images { r, pool, w, img }),
            (r, pool, any::<u64>(), any::<u32>()).prop_map(|(r, pool, key, t)| Msg::Unseen { r, pool, key, t }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

        /// Whatever other replicas send, nothing panics, no replica holds more than its share of a
        /// worker, and once they go silent every worker is back to this replica's own load.
        #[test]
        fn any_message_sequence_keeps_the_shares_and_leaves_nothing_behind(msgs in proptest::collection::vec(arb_msg(), 0..64)) {
            let (router, observe) = (router(), Arc::new(Observer::new()));
            let routers = |pool: &str| (pool == "p").then(|| router.clone());
            let inbox = Inbox::new("me".into(), Duration::from_secs(5), observe);
            let floor = PeerQuotas::default().load_floor_tokens;
            for m in msgs {
                inbox.apply(&routers, m);
                for w in 0..2 {
                    let remote = router.worker(w).remote_inflight();
                    let tokens = remote.prefill_tokens + remote.decode_tokens + remote.image_tokens;
                    // Two well-named replicas at most reach the pool: each within its floor.
                    prop_assert!(tokens <= 2 * floor + 8, "w{}: {:?}", w, remote);
                }
            }
            inbox.expire(Instant::now() + Duration::from_secs(6));
            for w in 0..2 {
                prop_assert_eq!(router.worker(w).remote_inflight(), Default::default());
            }
        }

        /// Arbitrary bytes on the subject are refused, never a panic.
        #[test]
        fn arbitrary_payloads_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = crate::cluster::checks::peek(&bytes);
            if let Ok(msg) = serde_json::from_slice::<Msg>(&bytes) {
                let router = router();
                let routers = |pool: &str| (pool == "p").then(|| router.clone());
                Inbox::new("me".into(), Duration::from_secs(5), Arc::new(Observer::new())).apply(&routers, msg);
            }
        }
    }

    #[test]
    fn a_linked_router_shares_the_images_it_sends() {
        let sent = Arc::new(Mutex::new(Vec::new()));
        struct Spy(Arc<Mutex<Vec<String>>>);
        impl Link for Spy {
            fn book(&self, _: &str, _: Load) -> u64 {
                0
            }
            fn first_byte(&self, _: u64) {}
            fn finish(&self, _: u64) {}
            fn dispatched(&self, _: &str, _: &[u64], _: Source) {}
            fn images_sent(&self, worker: &str, images: &[ImageUse]) {
                self.0.lock().unwrap().push(format!("{worker}:{}", images.len()));
            }
        }
        let router = router();
        router.set_link(Arc::new(Spy(sent.clone())));
        router.images_sent(1, &[ImageUse { key: 1, tokens: 10, end: 0 }]);
        router.apply_remote_images(0, &[ImageUse { key: 2, tokens: 10, end: 0 }]);
        assert_eq!(*sent.lock().unwrap(), vec!["w1:1".to_owned()], "a remote record is not passed on");
    }
}
