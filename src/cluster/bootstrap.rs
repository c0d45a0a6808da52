//! A starting replica's warm start. Its feeds are already subscribed and holding their live batches;
//! this fetches a snapshot from the first peer that serves one (every `peers` entry and every address
//! of `peers_dns`, in rounds with back-off), grafts it, resumes each feed at the seq its grafted state
//! reflects (the engine replays the gap, then the held batches follow), waits until every feed has
//! caught up, and only then lets `/health` report ready. No peer to ask (the first replica, or all
//! restarted at once): each feed asks its engine's replay ring for everything from seq 0. The whole
//! wait is bounded by `bootstrap_timeout`; after it the replica serves with what it has, and says so.
//!
//! A peer is trusted with as little as the mechanism allows: a snapshot counts only whole (a graft
//! that fails or runs out of time part-way is undone, and the feeds replay their engines from 0), and
//! each resume point it names is checked against the worker's engine by the feed itself (a point the
//! engine refutes drops that worker's grafted state; `cluster_resume_fallbacks_total`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use mmrouter_core::routing::Worker;

use super::snapshot::{Frame, Head, Reader};
use crate::config::ClusterSettings;
use crate::observe::Observer;
use crate::observe::*;
use crate::pools::{BootstrapState, Pool, Pools};

/// The snapshot endpoint every replica serves (admin-authenticated).
pub const SNAPSHOT_PATH: &str = "/admin/cluster/snapshot";
/// Rounds in which every peer was unreachable or still bootstrapping itself, after which there is
/// nobody to ask (~2 s with the back-off below).
const EMPTY_ROUNDS: u32 = 4;
/// A feed whose publisher is not connected this long after the start holds up nobody.
const CONNECT_GRACE: Duration = Duration::from_secs(1);

/// What the bootstrap needs.
pub struct Bootstrapper {
    pub settings: ClusterSettings,
    pub pools: Arc<Pools>,
    pub observe: Arc<Observer>,
    /// Sent to peers as `Authorization: Bearer` (this replica's first admin key: replicas share them).
    pub admin_key: Option<String>,
}

/// Why one peer gave no snapshot.
enum PeerFailure {
    /// Nobody there, or a replica still bootstrapping itself (503): does not count as an answer.
    Absent,
    /// It answered, but the snapshot failed (label for the failure counter).
    Failed(&'static str),
}

impl Bootstrapper {
    pub async fn run(self) {
        let started = Instant::now();
        let deadline = started + self.settings.bootstrap_timeout;
        self.record(); // pending shows while it lasts
        let grafted = tokio::time::timeout_at(deadline.into(), self.fetch_any()).await.ok().flatten();
        let seqs = match &grafted {
            Some((peer, head)) => {
                self.pools.bootstrap.grafted(peer, Some(head.taken()));
                tracing::info!(peer, replica = %head.replica_id, "cluster: grafted a peer's snapshot");
                resume_points(&self.pools, head)
            }
            None => {
                self.pools.bootstrap.grafted("engines", None);
                tracing::info!("cluster: no peer snapshot; replaying the engines' rings from seq 0");
                HashMap::new()
            }
        };
        for pool in self.pools.list().iter() {
            for (id, feeds) in pool.feeds_by_worker() {
                feeds.resume(seqs.get(&(pool.name.clone(), id)).cloned().unwrap_or_default());
            }
        }
        let complete = self.wait_settled(started, deadline).await;
        self.pools.bootstrap.finish(complete);
        if !complete {
            tracing::warn!("cluster: bootstrap wait ran out; serving with a partial view of the caches");
        }
        self.record();
    }

    fn record(&self) {
        let b = &self.pools.bootstrap;
        for state in [BootstrapState::Pending, BootstrapState::Complete, BootstrapState::Incomplete] {
            let on = f64::from(u8::from(b.state() == state));
            self.observe.cluster_gauge(CLUSTER_BOOTSTRAP, Some(("state", state.label())), on);
        }
        self.observe.cluster_gauge(CLUSTER_BOOTSTRAP_STATE_AGE_SECONDS, None, b.state_age_secs().unwrap_or(0.0));
        self.observe.cluster_gauge(CLUSTER_BOOTSTRAP_DURATION_SECONDS, None, b.duration_secs());
    }

    /// Until every feed has caught up (`true`) or the deadline (`false`).
    async fn wait_settled(&self, started: Instant, deadline: Instant) -> bool {
        loop {
            let grace_over = started.elapsed() >= CONNECT_GRACE;
            let feeds: Vec<_> = self.pools.list().iter().flat_map(|p| p.feeds_by_worker()).collect();
            if feeds.iter().all(|(_, f)| f.settled(grace_over)) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The first peer's snapshot, grafted: its base URL and head. `None`: nobody to ask.
    async fn fetch_any(&self) -> Option<(String, Head)> {
        let client = reqwest::Client::builder()
            .connect_timeout(self.settings.peer_timeout)
            .read_timeout(self.settings.peer_timeout)
            .build()
            .ok()?;
        let (mut empty_rounds, mut delay) = (0, Duration::from_millis(250));
        loop {
            let peers = self.peers().await;
            let mut answered = false;
            for peer in &peers {
                match self.fetch(&client, peer).await {
                    Ok(head) => return Some((peer.clone(), head)),
                    Err(PeerFailure::Absent) => {}
                    Err(PeerFailure::Failed(reason)) => {
                        answered = true;
                        self.observe.cluster_count(CLUSTER_SNAPSHOT_FAILURES_TOTAL, ("reason", reason), 1);
                    }
                }
            }
            empty_rounds = if answered { 0 } else { empty_rounds + 1 };
            if peers.is_empty() || empty_rounds >= EMPTY_ROUNDS {
                return None;
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(2));
        }
    }

    /// `peers`, then the addresses `peers_dns` resolves to now.
    async fn peers(&self) -> Vec<String> {
        let mut out = self.settings.peers.clone();
        if let Some(name) = &self.settings.peers_dns {
            match tokio::net::lookup_host(name.as_str()).await {
                Ok(addrs) => out.extend(addrs.map(|a| format!("http://{a}"))),
                Err(e) => tracing::debug!(%name, "cluster: peers_dns did not resolve: {e}"),
            }
        }
        out
    }

    /// Fetches and grafts `peer`'s snapshot; a failure part-way undoes what was grafted.
    async fn fetch(&self, client: &reqwest::Client, peer: &str) -> Result<Head, PeerFailure> {
        let mut req = client.get(format!("{peer}{SNAPSHOT_PATH}"));
        if let Some(key) = &self.admin_key {
            req = req.bearer_auth(key);
        }
        let resp = req.send().await.map_err(|e| {
            tracing::debug!(peer, "cluster: peer unreachable: {e}");
            PeerFailure::Absent
        })?;
        match resp.status().as_u16() {
            200 => {}
            503 => return Err(PeerFailure::Absent),
            status => {
                tracing::warn!(peer, status, "cluster: peer refused the snapshot request");
                return Err(PeerFailure::Failed("status"));
            }
        }
        // Undone when dropped uncommitted: a refusal here, or the bootstrap's deadline dropping this
        // future part-way through the stream.
        let mut graft = Graft::default();
        let head = self.stream(resp, &mut graft).await?;
        if head.replica_id == self.settings.replica_id {
            return Err(PeerFailure::Absent); // ourselves, by DNS
        }
        graft.commit();
        Ok(head)
    }

    async fn stream(&self, resp: reqwest::Response, graft: &mut Graft) -> Result<Head, PeerFailure> {
        let (mut reader, mut body) = (Reader::default(), resp.bytes_stream());
        let pools = self.pools.list();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| {
                tracing::warn!("cluster: snapshot stream failed: {e}");
                PeerFailure::Failed(if e.is_timeout() { "timeout" } else { "stream" })
            })?;
            self.observe.cluster_count(CLUSTER_SNAPSHOT_BYTES_TOTAL, ("direction", "received"), chunk.len() as u64);
            let frames = reader.push(&chunk).map_err(|e| {
                tracing::warn!("cluster: snapshot refused: {e}");
                PeerFailure::Failed(e.label())
            })?;
            for frame in frames {
                graft.apply(&pools, frame);
            }
        }
        reader.finish().map_err(|e| PeerFailure::Failed(e.label()))?;
        graft.head.take().ok_or(PeerFailure::Failed("malformed"))
    }
}

/// Per (pool, worker id), the seq per rank the grafted state reflects.
type ResumePoints = HashMap<(String, usize), BTreeMap<u32, u64>>;

fn resume_points(pools: &Pools, head: &Head) -> ResumePoints {
    let mut out = HashMap::new();
    for p in &head.pools {
        let Some(pool) = pools.list().iter().find(|own| own.name == p.name).cloned() else { continue };
        for w in &p.workers {
            if let Some(id) = pool.router.find(&w.name) {
                out.insert((p.name.clone(), id), w.seqs.iter().copied().collect());
            }
        }
    }
    out
}

/// One snapshot pool matched here: this replica's pool, and snapshot slot → this replica's worker id.
type Matched = (Arc<Pool>, HashMap<u16, usize>);
/// A matched worker and the head's word on its cache: blocks held, capacity.
type CacheFigures = (Arc<Worker>, u64, Option<u64>);

/// A snapshot being grafted: the head's pools and workers matched to this replica's by name. Its
/// entries go into the index and event states as they arrive (bounded there, not here); dropped
/// before [`Graft::commit`], it takes them out again.
#[derive(Default)]
struct Graft {
    head: Option<Head>,
    /// Per snapshot pool: this replica's pool, and snapshot slot → this replica's worker id.
    pools: Vec<Option<Matched>>,
    /// The head's cache figures per matched worker (held, capacity), set on commit only: a capacity
    /// only ever grows, so it could not be taken back.
    caches: Vec<CacheFigures>,
    committed: bool,
}

impl Graft {
    fn apply(&mut self, own: &[Arc<Pool>], frame: Frame) {
        match frame {
            Frame::Head(head) => {
                self.pools = head.pools.iter().map(|p| match_pool(own, p, &mut self.caches)).collect();
                self.head = Some(head);
            }
            Frame::Map { pool, slot, rank, entries } => {
                let Some((p, slots)) = self.pool(pool) else { return };
                if let Some(feeds) = slots.get(&slot).and_then(|&id| p.feeds_of(id)) {
                    feeds.graft(rank, &entries);
                }
            }
            Frame::Index { pool, mut entries } => {
                let Some((p, slots)) = self.pool(pool) else { return };
                entries.retain_mut(|e| match slots.get(&e.worker) {
                    Some(&id) => {
                        e.worker = id as u16;
                        true
                    }
                    None => false,
                });
                p.router.index().graft(&entries);
            }
            Frame::End { maps, index } => tracing::debug!(maps, index, "cluster: snapshot grafted"),
        }
    }

    fn pool(&self, i: u16) -> Option<&Matched> {
        self.pools.get(usize::from(i)).and_then(Option::as_ref)
    }

    /// The stream was whole: what it grafted stays.
    fn commit(&mut self) {
        for (worker, held, capacity) in self.caches.drain(..) {
            worker.restore_cache(held, capacity);
        }
        self.committed = true;
    }

    /// Forgets a graft that failed part-way: the next peer's, or the engines' replay, starts clean.
    fn undo(&self) {
        for (pool, slots) in self.pools.iter().flatten() {
            for &id in slots.values() {
                pool.router.clear_worker(id);
                if let Some(f) = pool.feeds_of(id) {
                    f.forget_graft();
                }
            }
        }
    }
}

impl Drop for Graft {
    fn drop(&mut self) {
        if !self.committed {
            self.undo();
        }
    }
}

fn match_pool(own: &[Arc<Pool>], p: &super::snapshot::PoolHead, caches: &mut Vec<CacheFigures>) -> Option<Matched> {
    let pool = own.iter().find(|o| o.name == p.name)?.clone();
    let mut slots = HashMap::new();
    for w in &p.workers {
        if let Some((id, worker)) = pool.router.lookup(&w.name) {
            caches.push((worker, w.held, w.capacity));
            slots.insert(w.slot, id);
        }
    }
    Some((pool, slots))
}
