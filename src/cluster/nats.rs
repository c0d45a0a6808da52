//! The replicas' NATS core connection: this replica's messages out (in order, on one subject), the
//! others' in, and a heartbeat that also expires silent replicas and links new pools. NATS down:
//! messages beyond the outbox are dropped and counted, the others' bookings expire after
//! `booking_ttl`, the client reconnects on its own — requests never wait for any of it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::bookings::{Inbox, Msg, Outbox};
use crate::config::ClusterSettings;
use crate::observe::Observer;
use crate::observe::*;
use crate::pools::Pools;

/// Records (dispatch, images, unseen tokens) received and not yet applied, beyond which new ones are
/// dropped (counted as `records_queue_full`): a replica that cannot keep up loses index entries, never
/// bookings.
const RECORDS_QUEUE: usize = 4_096;
/// Longest pause between two reconnection attempts: a restarted NATS is found again within it.
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(1);

/// What the NATS tasks share.
pub struct Nats {
    pub settings: ClusterSettings,
    pub pools: Arc<Pools>,
    pub observe: Arc<Observer>,
    pub outbox: Arc<Outbox>,
    inbox: Inbox,
}

impl Nats {
    pub fn new(settings: ClusterSettings, pools: Arc<Pools>, observe: Arc<Observer>, outbox: Arc<Outbox>) -> Nats {
        let inbox = Inbox::new(settings.replica_id.clone(), settings.booking_ttl, observe.clone());
        Nats { settings, pools, observe, outbox, inbox }
    }

    fn subject(&self) -> String {
        format!("{}.replicas", self.settings.subject_prefix)
    }

    /// Connects (retrying in the background until NATS answers) and runs until the process ends.
    pub async fn run(self: Arc<Self>, url: String, outgoing: mpsc::Receiver<Msg>) {
        let observe = self.observe.clone();
        observe.cluster_gauge(CLUSTER_NATS_CONNECTED, None, 0.0);
        let options = async_nats::ConnectOptions::new()
            .name(&self.settings.replica_id)
            .no_echo()
            .retry_on_initial_connect()
            .max_reconnects(None)
            .connection_timeout(Duration::from_secs(2))
            .reconnect_delay_callback(|attempt| {
                Duration::from_millis(100u64.saturating_mul(1 << attempt.min(4))).min(MAX_RECONNECT_DELAY)
            })
            .event_callback(move |event| {
                let observe = observe.clone();
                async move { on_event(&observe, event) }
            });
        let client = match options.connect(url.as_str()).await {
            Ok(c) => c,
            Err(e) => return tracing::error!(%url, "cluster: NATS client not started: {e}"),
        };
        let subscriber = match client.subscribe(self.subject()).await {
            Ok(s) => s,
            Err(e) => return tracing::error!(%url, "cluster: NATS subscription failed: {e}"),
        };
        tokio::spawn(self.clone().publish(client, outgoing));
        tokio::spawn(self.clone().heartbeat());
        self.clone().receive(subscriber).await;
    }

    /// Sends this replica's messages in order. A full client buffer (NATS down) makes this wait, and
    /// the outbox then drops what does not fit.
    async fn publish(self: Arc<Self>, client: async_nats::Client, mut outgoing: mpsc::Receiver<Msg>) {
        let subject = self.subject();
        while let Some(msg) = outgoing.recv().await {
            let Ok(payload) = serde_json::to_vec(&msg) else { continue };
            if client.publish(subject.clone(), payload.into()).await.is_err() {
                self.observe.cluster_count(CLUSTER_MESSAGES_DROPPED_TOTAL, ("reason", "publish_failed"), 1);
            }
        }
    }

    /// Applies bookings (and their first bytes, ends, heartbeats) as they arrive, in order; records
    /// go to [`Nats::apply_records`], so a booking never waits behind a dispatch's thousands of
    /// index writes (the window in which another replica routes without it).
    async fn receive(self: Arc<Self>, mut subscriber: async_nats::Subscriber) {
        let (records, queued) = mpsc::channel(RECORDS_QUEUE);
        tokio::spawn(self.clone().apply_records(queued));
        while let Some(m) = subscriber.next().await {
            if !Msg::is_booking(&m.payload) {
                if records.try_send(m.payload).is_err() {
                    self.observe.cluster_count(CLUSTER_MESSAGES_DROPPED_TOTAL, ("reason", "records_queue_full"), 1);
                }
                continue;
            }
            self.apply(&m.payload);
        }
    }

    async fn apply_records(self: Arc<Self>, mut queued: mpsc::Receiver<bytes::Bytes>) {
        while let Some(payload) = queued.recv().await {
            self.apply(&payload);
        }
    }

    fn apply(&self, payload: &[u8]) {
        match serde_json::from_slice::<Msg>(payload) {
            Ok(msg) => self.inbox.apply(&|name| self.router_of(name), msg),
            Err(_) => self.observe.cluster_count(CLUSTER_MESSAGES_DROPPED_TOTAL, ("reason", "malformed"), 1),
        }
    }

    fn router_of(&self, pool: &str) -> Option<Arc<mmrouter_core::routing::Router>> {
        self.pools.list().iter().find(|p| p.name == pool).map(|p| p.router.clone())
    }

    /// Every `heartbeat`: announce this replica and its live bookings, expire silent replicas, link the
    /// routers of pools a reload created.
    async fn heartbeat(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.settings.heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.outbox.beat();
            let (peers, bookings) = self.inbox.expire(Instant::now());
            self.observe.cluster_gauge(CLUSTER_PEERS, None, peers as f64);
            self.observe.cluster_gauge(CLUSTER_REMOTE_BOOKINGS, None, bookings as f64);
            super::link_pools(&self.pools, &self.outbox);
        }
    }
}

fn on_event(observe: &Observer, event: async_nats::Event) {
    match event {
        async_nats::Event::Connected => {
            observe.cluster_gauge(CLUSTER_NATS_CONNECTED, None, 1.0);
            observe.cluster_count(CLUSTER_NATS_EVENTS_TOTAL, ("event", "connected"), 1);
            tracing::info!("cluster: NATS connected");
        }
        async_nats::Event::Disconnected => {
            observe.cluster_gauge(CLUSTER_NATS_CONNECTED, None, 0.0);
            observe.cluster_count(CLUSTER_NATS_EVENTS_TOTAL, ("event", "disconnected"), 1);
            tracing::warn!("cluster: NATS disconnected; routing on this replica's own view until it is back");
        }
        other => tracing::debug!("cluster: NATS {other}"),
    }
}
