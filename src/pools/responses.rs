//! Which worker stored each Responses API answer. vLLM keeps a stored response (and the messages it
//! answered) in the memory of the engine that produced it, so a follow-up naming it by
//! `previous_response_id`, and `GET /v1/responses/{id}`, must go to that worker: this store maps a
//! response id to its pool and worker name, learnt from the workers' answers (the proxy) or from
//! another replica (the cluster).
//!
//! Bounded: at most `responses.max_ids` ids in two generations (the older one is dropped whole when
//! the younger fills, an id used again moves to the younger one), and an id not used for
//! `responses.ttl_secs` is forgotten. Only ids of at most [`MAX_ID_BYTES`] URL-safe characters are
//! kept: a worker's or a peer's word is bounded too.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use crate::config::ResponsesConfig;

/// Longest response id remembered (vLLM's are `resp_` and 32 hex digits).
pub const MAX_ID_BYTES: usize = 256;

/// Where a stored response lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Place {
    pub pool: Arc<str>,
    pub worker: Arc<str>,
}

/// What the store tells the other replicas (the cluster room implements it).
pub trait ResponsePeers: Send + Sync {
    /// Response `id` is stored at worker `worker` of pool `pool`.
    fn stored(&self, id: &str, pool: &str, worker: &str);
}

/// Response id → the worker that stored it (see the module docs).
pub struct ResponseStore {
    gens: Mutex<Generations>,
    ttl: Duration,
    /// The `[responses]` settings (the proxy reads the probe's).
    pub config: ResponsesConfig,
    peers: RwLock<Option<Arc<dyn ResponsePeers>>>,
    /// Requests asking the workers for an unknown id at once, process-wide: made-up ids cannot turn
    /// into an unbounded fan-out of `GET`s.
    pub probes: tokio::sync::Semaphore,
}

/// Requests that may ask the workers for unknown ids at the same time.
pub const MAX_PROBING_REQUESTS: usize = 64;

struct Entry {
    place: Place,
    used: Instant,
}

/// Two generations of at most `half` ids each.
struct Generations {
    young: HashMap<Box<str>, Entry>,
    old: HashMap<Box<str>, Entry>,
    half: usize,
}

/// Whether `id` may be remembered and asked for in a URL path: 1 to [`MAX_ID_BYTES`] ASCII letters,
/// digits and `-_.~:` (vLLM's ids, and a client's `request_id` of that kind).
pub fn valid_id(id: &str) -> bool {
    let ok = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b':');
    !id.is_empty() && id.len() <= MAX_ID_BYTES && id.bytes().all(ok)
}

impl ResponseStore {
    pub fn new(config: &ResponsesConfig) -> ResponseStore {
        let half = (config.max_ids / 2).max(1);
        let gens = Generations { young: HashMap::new(), old: HashMap::new(), half };
        let probes = tokio::sync::Semaphore::new(MAX_PROBING_REQUESTS);
        let (ttl, config, peers) = (config.ttl(), config.clone(), RwLock::new(None));
        ResponseStore { gens: Mutex::new(gens), ttl, config, peers, probes }
    }

    fn gens(&self) -> MutexGuard<'_, Generations> {
        self.gens.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tells the other replicas what this one learns from its workers from now on.
    pub fn set_peers(&self, peers: Arc<dyn ResponsePeers>) {
        *self.peers.write().unwrap_or_else(|e| e.into_inner()) = Some(peers);
    }

    /// A worker answered with stored response `id`: remembered, and told to the other replicas.
    /// False (nothing kept) for an id [`valid_id`] refuses.
    pub fn learn(&self, id: &str, pool: &str, worker: &str) -> bool {
        if !self.keep(id, pool, worker) {
            return false;
        }
        if let Some(peers) = self.peers.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
            peers.stored(id, pool, worker);
        }
        true
    }

    /// Another replica says `id` is stored at `pool`/`worker`: remembered, not told again.
    pub fn learn_from_peer(&self, id: &str, pool: &str, worker: &str) -> bool {
        self.keep(id, pool, worker)
    }

    fn keep(&self, id: &str, pool: &str, worker: &str) -> bool {
        if !valid_id(id) || pool.is_empty() || worker.is_empty() {
            return false;
        }
        let place = Place { pool: pool.into(), worker: worker.into() };
        self.gens().insert(id.into(), Entry { place, used: Instant::now() });
        true
    }

    /// Where `id` was stored, if known and used within the TTL (the use counts).
    pub fn lookup(&self, id: &str) -> Option<Place> {
        let mut gens = self.gens();
        let now = Instant::now();
        let entry = match gens.young.get_mut(id) {
            Some(e) => e,
            None => {
                let (key, e) = gens.old.remove_entry(id)?;
                gens.insert(key, e);
                gens.young.get_mut(id).expect("just inserted")
            }
        };
        if now.duration_since(entry.used) > self.ttl {
            gens.young.remove(id);
            return None;
        }
        entry.used = now;
        Some(entry.place.clone())
    }

    /// Forgets `id` (its worker no longer has it).
    pub fn forget(&self, id: &str) {
        let mut gens = self.gens();
        gens.young.remove(id);
        gens.old.remove(id);
    }

    /// Ids held (expired ones included until they are looked up or their generation goes).
    pub fn len(&self) -> usize {
        let gens = self.gens();
        gens.young.len() + gens.old.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Generations {
    fn insert(&mut self, id: Box<str>, entry: Entry) {
        self.old.remove(&id);
        if self.young.len() >= self.half && !self.young.contains_key(&id) {
            self.old = std::mem::take(&mut self.young);
        }
        self.young.insert(id, entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(max_ids: usize) -> ResponseStore {
        ResponseStore::new(&ResponsesConfig { max_ids, ..Default::default() })
    }

    #[test]
    fn remembers_and_forgets() {
        let s = store(100);
        assert!(s.learn("resp_abc", "vl", "w1"));
        assert_eq!(s.lookup("resp_abc"), Some(Place { pool: "vl".into(), worker: "w1".into() }));
        s.learn("resp_abc", "vl", "w2");
        assert_eq!(s.lookup("resp_abc").unwrap().worker.as_ref(), "w2", "the latest word wins");
        s.forget("resp_abc");
        assert_eq!(s.lookup("resp_abc"), None);
    }

    #[test]
    fn refuses_ids_it_could_not_ask_for() {
        let s = store(100);
        let long = "r".repeat(MAX_ID_BYTES + 1);
        for bad in ["", "a b", "a/b", "a?b", "a%2f", "résumé", "x\ny", long.as_str()] {
            assert!(!s.learn(bad, "vl", "w"), "{bad:?}");
        }
        assert!(!s.learn("resp_1", "", "w"));
        assert!(s.is_empty());
        assert!(s.learn(&"r".repeat(MAX_ID_BYTES), "vl", "w"));
        assert!(s.learn("chatcmpl-1.2:3~x", "vl", "w"));
    }

    #[test]
    fn holds_at_most_max_ids_and_keeps_what_is_used() {
        let s = store(100);
        s.learn("keep", "vl", "w");
        for i in 0..10_000 {
            s.learn(&format!("resp_{i}"), "vl", "w");
            // A conversation in use keeps its id however many others come.
            assert!(s.lookup("keep").is_some(), "after {i}");
            assert!(s.len() <= 100);
        }
        assert!(s.lookup("resp_0").is_none(), "an id no one used is gone");
        assert!(s.lookup("resp_9999").is_some());
    }

    #[test]
    fn forgets_ids_past_their_ttl() {
        let mut s = store(100);
        s.ttl = Duration::from_millis(20);
        s.learn("resp_1", "vl", "w");
        assert!(s.lookup("resp_1").is_some());
        std::thread::sleep(Duration::from_millis(40));
        assert!(s.lookup("resp_1").is_none());
        assert!(s.is_empty(), "an expired id is dropped when found");
    }

    #[test]
    fn tells_peers_what_workers_said_not_what_peers_said() {
        #[derive(Default)]
        struct Told(Mutex<Vec<String>>);
        impl ResponsePeers for Told {
            fn stored(&self, id: &str, pool: &str, worker: &str) {
                self.0.lock().unwrap().push(format!("{id}@{pool}/{worker}"));
            }
        }
        let s = store(100);
        let told = Arc::new(Told::default());
        s.set_peers(told.clone());
        s.learn("resp_1", "vl", "w1");
        s.learn_from_peer("resp_2", "vl", "w2");
        s.learn("bad id", "vl", "w1");
        assert_eq!(*told.0.lock().unwrap(), ["resp_1@vl/w1"]);
        assert_eq!(s.lookup("resp_2").unwrap().worker.as_ref(), "w2");
    }
}
