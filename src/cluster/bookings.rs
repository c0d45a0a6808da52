//! In-flight state shared between replicas: what this replica tells the others ([`Outbox`], the
//! core's `Link` per pool) and what it holds of theirs ([`Inbox`]).
//!
//! Every message of a replica goes out on one subject, in order, so a booking's first byte and end
//! never overtake it. Another replica's booking is remote load on its worker until its end arrives,
//! its replica's heartbeat no longer lists it (a lost end), or its replica has been silent for
//! `booking_ttl` (it died, or NATS is down: each replica then routes on its own view). Dispatch records
//! (blocks) and image records (what the exact route sent a worker, for its image-residency model) are
//! applied as the sender recorded them, and so are the unseen tokens its fallbacks' engines counted.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mmrouter_core::routing::{ImageUse, Link, Load, Router, Source, Worker};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::observe::Observer;
use crate::observe::*;

/// Messages queued for NATS, beyond which new ones are dropped (counted): a NATS outage must never
/// hold up a request.
pub const OUTBOX_CAPACITY: usize = 16_384;
/// Blocks one dispatch record carries at most (a prompt's head matters most; the message stays small).
const MAX_DISPATCH_BLOCKS: usize = 8_192;
/// Images one record carries at most (a request's images; more are not shared).
const MAX_IMAGES: usize = 64;

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
}

impl Msg {
    /// Whether the payload is a booking, its first byte, end or a heartbeat, read from the tag alone
    /// (serde writes it first): those are applied on arrival and in order, ahead of the records
    /// (dispatch, images, unseen tokens), whose index writes would otherwise delay the next booking.
    pub fn is_booking(payload: &[u8]) -> bool {
        ["book", "first", "end", "beat"].iter().any(|k| {
            let tag = payload.strip_prefix(b"{\"k\":\"").and_then(|rest| rest.strip_prefix(k.as_bytes()));
            tag.is_some_and(|rest| rest.first() == Some(&b'"'))
        })
    }

    fn replica(&self) -> &str {
        match self {
            Msg::Book { r, .. } | Msg::First { r, .. } | Msg::End { r, .. } | Msg::Beat { r, .. } => r,
            Msg::Dispatch { r, .. } | Msg::Images { r, .. } | Msg::Unseen { r, .. } => r,
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
}

impl Outbox {
    pub fn new(replica: String, observe: Arc<Observer>) -> (Arc<Outbox>, mpsc::Receiver<Msg>) {
        let (tx, rx) = mpsc::channel(OUTBOX_CAPACITY);
        let out = Outbox { replica, next: AtomicU64::new(1), live: Mutex::default(), tx, observe };
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
        self.send(Msg::Beat { r: self.replica.clone(), live: live.iter().copied().collect() });
    }

    fn send(&self, msg: Msg) {
        if self.tx.try_send(msg).is_err() {
            self.observe.cluster_count(CLUSTER_MESSAGES_DROPPED_TOTAL, ("reason", "queue_full"), 1);
        }
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

/// One booking of another replica, with the load it still holds.
struct Booking {
    worker: Arc<Worker>,
    load: Load,
}

impl Booking {
    fn release(self) {
        self.worker.release_remote(self.load, 1);
    }
}

struct Peer {
    last_seen: Instant,
    bookings: HashMap<u64, Booking>,
}

/// The other replicas' bookings, as remote load on this replica's workers.
pub struct Inbox {
    replica: String,
    ttl: Duration,
    peers: Mutex<HashMap<String, Peer>>,
    observe: Arc<Observer>,
}

impl Inbox {
    pub fn new(replica: String, ttl: Duration, observe: Arc<Observer>) -> Inbox {
        Inbox { replica, ttl, peers: Mutex::default(), observe }
    }

    /// Applies one message from another replica (this replica's own are ignored); `routers` finds a
    /// pool's router by the pool's name.
    pub fn apply(&self, routers: &RouterOf<'_>, msg: Msg) {
        if msg.replica() == self.replica {
            return;
        }
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        let peer = peers
            .entry(msg.replica().to_owned())
            .or_insert_with(|| Peer { last_seen: Instant::now(), bookings: HashMap::new() });
        peer.last_seen = Instant::now();
        match msg {
            Msg::Book { id, pool, w, p, d, i, t, .. } => {
                if t > 0 {
                    self.observe.booking_delay(unix_micros().saturating_sub(t) as f64 / 1e6);
                }
                let Some(worker) = self.worker(routers, &pool, &w) else { return };
                let load = Load { prefill_tokens: p, decode_tokens: d, image_tokens: i };
                worker.add_remote(load);
                if let Some(old) = peer.bookings.insert(id, Booking { worker, load }) {
                    old.release(); // a doubled booking holds once
                }
                self.observe.cluster_count(CLUSTER_BOOKINGS_TOTAL, ("event", "applied"), 1);
            }
            Msg::First { id, .. } => {
                if let Some(b) = peer.bookings.get_mut(&id) {
                    let prefill =
                        Load { prefill_tokens: std::mem::take(&mut b.load.prefill_tokens), ..Load::default() };
                    b.worker.release_remote(prefill, 0);
                }
            }
            Msg::End { id, .. } => {
                if let Some(b) = peer.bookings.remove(&id) {
                    b.release();
                }
            }
            Msg::Beat { live, .. } => {
                let live: HashSet<u64> = live.into_iter().collect();
                let lost: Vec<u64> = peer.bookings.keys().filter(|id| !live.contains(id)).copied().collect();
                for id in &lost {
                    if let Some(b) = peer.bookings.remove(id) {
                        b.release();
                    }
                }
                self.observe.cluster_count(CLUSTER_BOOKINGS_TOTAL, ("event", "reconciled"), lost.len() as u64);
            }
            Msg::Dispatch { pool, w, src, b, .. } => self.dispatch(routers, (&pool, &w), src, &b),
            Msg::Images { pool, w, img, .. } => self.images(routers, (&pool, &w), &img),
            Msg::Unseen { pool, key, t, .. } => {
                if let Some(router) = self.router(routers, &pool) {
                    router.apply_remote_unseen(key, t);
                }
            }
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
                peer.bookings.into_values().for_each(Booking::release);
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
        assert!(bookings.iter().all(|m| Msg::is_booking(&serde_json::to_vec(m).unwrap())));
        assert!(records.iter().all(|m| !Msg::is_booking(&serde_json::to_vec(m).unwrap())));
        for odd in [&b"{\"k\":\"booking\"}"[..], b"{\"k\":\"end", b"", b"not json"] {
            assert!(!Msg::is_booking(odd), "{}", String::from_utf8_lossy(odd));
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
