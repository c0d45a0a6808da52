//! The replicas' NATS core connection: this replica's messages out (in order, on one subject), the
//! others' in, and a heartbeat that also expires silent replicas and links new pools. NATS down:
//! messages beyond the outbox are dropped and counted, the others' bookings expire after
//! `booking_ttl`, the client reconnects on its own — requests never wait for any of it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::bookings::{Inbox, Msg, Outbox};
use super::checks::{self, QueueShares, Refusal, MAX_MESSAGE_BYTES, RECORDS_QUEUE};
use crate::config::{ClusterSettings, NatsAuth, NatsSettings};
use crate::observe::Observer;
use crate::observe::*;
use crate::pools::{Pools, ResponseStore};

/// Messages the NATS client holds for the subscriber before it drops (it counts slow consumers).
const SUBSCRIPTION_CAPACITY: usize = 128;
/// Longest pause between two reconnection attempts: a restarted NATS is found again within it.
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(1);

/// What the NATS tasks share.
pub struct Nats {
    pub settings: ClusterSettings,
    pub pools: Arc<Pools>,
    pub observe: Arc<Observer>,
    pub outbox: Arc<Outbox>,
    inbox: Inbox,
    /// Records (dispatch, images, unseen tokens) received and not yet applied, shared out by
    /// replica and bounded in count and bytes: beyond a replica's share its records are refused
    /// (`quota_queue`); a replica that cannot keep up loses index entries, never bookings.
    queued: QueueShares,
}

impl Nats {
    pub fn new(settings: ClusterSettings, pools: Arc<Pools>, observe: Arc<Observer>, outbox: Arc<Outbox>) -> Nats {
        let inbox = Inbox::new(settings.replica_id.clone(), settings.booking_ttl, observe.clone())
            .limited(settings.quotas, outbox.own.clone());
        Nats { settings, pools, observe, outbox, inbox, queued: QueueShares::default() }
    }

    /// Other replicas' stored response ids go to `store`.
    pub fn with_responses(self, store: Arc<ResponseStore>) -> Nats {
        Nats { inbox: self.inbox.with_responses(store), ..self }
    }

    fn subject(&self) -> String {
        format!("{}.replicas", self.settings.subject_prefix)
    }

    /// Connects (retrying in the background until NATS answers) and runs until the process ends.
    pub async fn run(self: Arc<Self>, conn: NatsSettings, outgoing: mpsc::Receiver<Msg>) {
        let observe = self.observe.clone();
        observe.cluster_gauge(CLUSTER_NATS_CONNECTED, None, 0.0);
        let url = conn.url.clone();
        let options = match connect_options(&conn).await {
            Ok(o) => o,
            Err(e) => return tracing::error!(%url, "cluster: NATS client not started: {e}"),
        };
        let options = options
            .name(&self.settings.replica_id)
            // Bounded: each message is checked and queued or refused at once, so the client's
            // buffer of received messages stays short unless a flood outruns the checks.
            .subscription_capacity(SUBSCRIPTION_CAPACITY)
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
        tracing::info!(%url, auth = conn.auth.method(), tls = conn.tls.required, "cluster: NATS client started");
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
    /// index writes (the window in which another replica routes without it). Sizes, tags and
    /// senders are checked here, before any parsing.
    async fn receive(self: Arc<Self>, mut subscriber: async_nats::Subscriber) {
        let (records, queued) = mpsc::channel(RECORDS_QUEUE);
        tokio::spawn(self.clone().apply_records(queued));
        while let Some(m) = subscriber.next().await {
            if m.payload.len() > MAX_MESSAGE_BYTES {
                self.inbox.refused(Refusal::Oversized);
                continue;
            }
            let Some((tag, replica)) = checks::peek(&m.payload) else {
                self.inbox.refused(Refusal::Malformed);
                continue;
            };
            if Msg::is_booking(tag) {
                self.apply(&m.payload);
                continue;
            }
            let (replica, len) = (replica.to_owned(), m.payload.len());
            if let Err(refusal) = self.queued.admit(&replica, len) {
                self.inbox.refused(refusal);
                continue;
            }
            if records.try_send((replica.clone(), m.payload)).is_err() {
                self.queued.done(&replica, len);
                self.observe.cluster_count(CLUSTER_MESSAGES_DROPPED_TOTAL, ("reason", "records_queue_full"), 1);
            }
        }
    }

    async fn apply_records(self: Arc<Self>, mut queued: mpsc::Receiver<(String, bytes::Bytes)>) {
        while let Some((replica, payload)) = queued.recv().await {
            self.apply(&payload);
            self.queued.done(&replica, payload.len());
        }
    }

    fn apply(&self, payload: &[u8]) {
        match serde_json::from_slice::<Msg>(payload) {
            Ok(msg) => self.inbox.apply(&|name| self.router_of(name), msg),
            Err(_) => self.inbox.refused(Refusal::Malformed),
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

/// The client's authentication and TLS, from `[cluster]`'s `nats_*` keys.
async fn connect_options(conn: &NatsSettings) -> std::io::Result<async_nats::ConnectOptions> {
    let mut o = async_nats::ConnectOptions::new();
    o = match &conn.auth {
        NatsAuth::None => o,
        NatsAuth::UserPassword { user, password } => o.user_and_password(user.clone(), password.expose().to_owned()),
        NatsAuth::Token(t) => o.token(t.expose().to_owned()),
        NatsAuth::NKey(seed) => o.nkey(seed.expose().to_owned()),
        NatsAuth::Creds(path) => o.credentials_file(path).await?,
    };
    let tls = &conn.tls;
    if tls.required {
        o = o.require_tls(true);
    }
    if let Some(ca) = &tls.ca_file {
        o = o.add_root_certificates(ca.clone());
    }
    if let Some((cert, key)) = &tls.client_cert {
        o = o.add_client_certificate(cert.clone(), key.clone());
    }
    Ok(o)
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
        async_nats::Event::ServerError(e) => {
            // An authorization violation lands here: say so loudly, the replica shares nothing until fixed.
            observe.cluster_count(CLUSTER_NATS_EVENTS_TOTAL, ("event", "server_error"), 1);
            tracing::warn!("cluster: NATS server error: {e}");
        }
        async_nats::Event::SlowConsumer(_) => {
            observe.cluster_count(CLUSTER_MESSAGES_DROPPED_TOTAL, ("reason", "slow_consumer"), 1);
        }
        other => tracing::debug!("cluster: NATS {other}"),
    }
}
