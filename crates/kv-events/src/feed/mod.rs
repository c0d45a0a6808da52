//! One KV-event feed: a ZMQ subscription to a single publisher (one worker × one data-parallel rank).
//!
//! [`spawn_feed`] starts a tokio task that
//!
//! 1. connects a SUB socket to [`FeedConfig::endpoint`] and subscribes to [`FeedConfig::topic`]
//!    (reconnecting on its own when the publisher goes away, see below);
//! 2. reads `[topic, seq (8 bytes BE), payload]` messages and tracks `seq`:
//!    * the first message triggers a replay from 0 when a replay endpoint is configured (the SUB may have
//!      missed the first batches: "slow joiner");
//!    * a gap triggers a replay from `last + 1` through a DEALER connected to the engine's replay ROUTER;
//!      live messages received meanwhile are buffered and applied afterwards without duplicates;
//!    * an unfillable gap (no replay endpoint, replay failed or timed out, ring too short) yields
//!      [`FeedEvent::Reset`] with [`ResetReason::Resync`];
//!    * `seq <= last` yields [`ResetReason::Restart`];
//!    * after the connection was lost, the next message yields [`ResetReason::Restart`] or (with
//!      [`FeedConfig::reset_on_reconnect`], the default) [`ResetReason::Reconnect`];
//!    * a held feed's resume point ([`FeedHandle::resume`]) is checked against the engine's ring (or,
//!      without one, its live stream): one ahead of what the engine published yields
//!      [`ResetReason::ResumeAhead`] and a replay from 0, one the ring no longer reaches
//!      [`ResetReason::ResumeUnreachable`] and the ring from its start;
//! 3. decodes payloads with [`crate::decode`] and sends [`FeedEvent`]s on a bounded channel. A full channel
//!    applies backpressure to the socket; the engine's PUB then drops and the feed replays the gap.
//!
//! Counters (messages, malformed, gaps, replays, resyncs, restarts, …) are readable at any time through
//! [`FeedHandle::stats`]; the caller turns them into metrics. Dropping the [`FeedHandle`] stops the task.
//!
//! **Connections and limits.** The feed speaks ZMTP itself (module `zmtp`, private; the pure-Rust
//! `zeromq` crate enforces no frame or message size, so a 9-byte header could abort the process). Every
//! frame is checked against [`FeedConfig::max_message_bytes`] and [`FeedConfig::max_frames`] before memory
//! is reserved for it; live batches held during a replay are capped by count and by
//! [`FeedConfig::max_replay_buffer_bytes`]. One attacked feed therefore holds about `max_message_bytes`
//! per connection plus the replay budget. A peer that breaks the protocol or a limit loses its connection;
//! the refusal is counted in [`FeedStats::protocol_violations_by_reason`] and logged at WARN, the first of
//! each kind in full and then at most one summary line per 10 s (malformed messages likewise).
//!
//! **Reconnects.** A lost connection is re-established with the feed's own exponential backoff (100 ms,
//! doubling, capped at [`FeedConfig::reconnect_interval_max`]; reset once a connection delivered a
//! message). After a protocol violation the feed waits the full cap before trying again.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::decode::{DecodeError, EventBatch};
use crate::endpoint::{self, Endpoint, EndpointError};

mod log_limit;
mod replay;
mod task;
mod tracker;

#[cfg(test)]
mod hostile_tests;
#[cfg(test)]
mod socket_tests;

pub use crate::zmtp::ZmtpError;

/// Configuration of one feed (one publisher).
#[derive(Clone, Debug, PartialEq)]
pub struct FeedConfig {
    /// Publisher endpoint to connect to, `tcp://host:port` (or `ipc://path`).
    pub endpoint: String,
    /// Replay ROUTER endpoint, if the engine was started with `replay_endpoint`.
    pub replay_endpoint: Option<String>,
    /// Topic prefix to subscribe to (`""` = everything).
    pub topic: String,
    /// Data-parallel rank of this publisher (informational; batches carry their own rank too).
    pub dp_rank: u32,
    /// How long to wait for each replay reply (and for the replay connection) before giving up.
    pub replay_timeout: Duration,
    /// How long one connection attempt of the SUB socket may take.
    pub connect_timeout: Duration,
    /// Cap of the feed's own reconnect backoff, and how long a lost connection may stay down before the
    /// socket is recreated.
    pub reconnect_interval_max: Duration,
    /// Capacity of the [`FeedEvent`] channel.
    pub channel_capacity: usize,
    /// Live messages buffered while a replay runs; beyond this the replay is abandoned (resync). The
    /// default equals the engines' default replay ring (`buffer_steps` = 10 000): a replay slower than that
    /// many live batches could not be complete anyway.
    pub max_replay_buffer: usize,
    /// Byte budget of the live payloads buffered while a replay runs; beyond this the replay is abandoned
    /// (resync), like [`FeedConfig::max_replay_buffer`]. Default 32 MiB.
    pub max_replay_buffer_bytes: usize,
    /// Largest message (sum of its frames) accepted from the publisher or the replay endpoint; a larger
    /// one drops the connection (counted as `message_too_large` / `frame_too_large`). Default 16 MiB: a
    /// real vLLM batch for a 128k-token prompt is well under 1 MiB. This bounds the memory one connection
    /// can make the feed hold.
    pub max_message_bytes: usize,
    /// Most frames in one message (live batches have 3, replay replies 3 or 4). Default 8.
    pub max_frames: usize,
    /// Emit [`ResetReason::Reconnect`] on the first message after a lost connection (see
    /// [`ResetReason::Reconnect`]). Default `true`.
    pub reset_on_reconnect: bool,
    /// Hold live batches (within the replay buffer's bounds) until [`FeedHandle::resume`] says where
    /// the consumer's state stands: a router replica grafting a peer's snapshot subscribes first and
    /// learns the sequence its state reflects later. Default `false`.
    pub hold_until_resumed: bool,
}

impl FeedConfig {
    /// A configuration with defaults: no replay, topic `""`, rank 0, replay timeout 2 s, connect timeout
    /// 2 s (also the ZMTP handshake deadline), reconnect backoff cap 5 s, channel capacity 1024, replay
    /// buffer 10 000 batches / 32 MiB, messages ≤ 16 MiB and ≤ 8 frames, reset on reconnect.
    pub fn new(endpoint: impl Into<String>) -> Self {
        FeedConfig {
            endpoint: endpoint.into(),
            replay_endpoint: None,
            topic: String::new(),
            dp_rank: 0,
            replay_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            reconnect_interval_max: Duration::from_secs(5),
            channel_capacity: 1024,
            max_replay_buffer: 10_000,
            max_replay_buffer_bytes: 32 << 20,
            max_message_bytes: 16 << 20,
            max_frames: 8,
            reset_on_reconnect: true,
            hold_until_resumed: false,
        }
    }

    /// Sets the replay endpoint.
    pub fn with_replay_endpoint(mut self, replay_endpoint: impl Into<String>) -> Self {
        self.replay_endpoint = Some(replay_endpoint.into());
        self
    }

    /// Sets the topic prefix.
    pub fn with_topic(mut self, topic: impl Into<String>) -> Self {
        self.topic = topic.into();
        self
    }

    /// The configuration of data-parallel rank `rank`, given that `self` describes rank 0: the TCP ports
    /// of the PUB and replay endpoints are offset by `rank` (vLLM's and SGLang's rule).
    pub fn for_rank(&self, rank: u32) -> Result<FeedConfig, EndpointError> {
        Ok(FeedConfig {
            endpoint: endpoint::offset_port(&self.endpoint, rank)?,
            replay_endpoint: self.replay_endpoint.as_deref().map(|r| endpoint::offset_port(r, rank)).transpose()?,
            dp_rank: rank,
            ..self.clone()
        })
    }

    /// Expands a worker-level configuration (`self` = rank 0) with `data_parallel_size = n` into one feed
    /// per rank `0..n`.
    pub fn expand_data_parallel(&self, data_parallel_size: u32) -> Result<Vec<FeedConfig>, EndpointError> {
        (0..data_parallel_size.max(1)).map(|rank| self.for_rank(rank)).collect()
    }

    /// Builds rank-0 configuration from the engine's own `--kv-events-config` values, replacing a wildcard
    /// bind host (`tcp://*:5557`) with `worker_host`. Combine with [`FeedConfig::expand_data_parallel`].
    pub fn from_engine_config(
        worker_host: &str,
        engine_endpoint: &str,
        engine_replay_endpoint: Option<&str>,
        topic: &str,
    ) -> Result<FeedConfig, EndpointError> {
        let mut cfg = FeedConfig::new(endpoint::connectable(engine_endpoint, worker_host)?).with_topic(topic);
        cfg.replay_endpoint = engine_replay_endpoint.map(|r| endpoint::connectable(r, worker_host)).transpose()?;
        Ok(cfg)
    }

    /// Checks that the configuration can be used.
    pub fn validate(&self) -> Result<(), FeedConfigError> {
        let check = |ep: &str| match Endpoint::parse(ep)? {
            Endpoint::Tcp { port: 0, .. } => Err(EndpointError::EphemeralPort(ep.to_owned())),
            ep if ep.is_wildcard() => Err(EndpointError::Unsupported(ep.to_string())),
            _ => Ok(()),
        };
        check(&self.endpoint)?;
        if let Some(r) = &self.replay_endpoint {
            check(r)?;
        }
        if self.channel_capacity == 0 {
            return Err(FeedConfigError::Invalid("channel_capacity must be > 0"));
        }
        if self.max_replay_buffer == 0 {
            return Err(FeedConfigError::Invalid("max_replay_buffer must be > 0"));
        }
        if self.replay_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(FeedConfigError::Invalid("timeouts must be > 0"));
        }
        self.validate_limits()
    }

    fn validate_limits(&self) -> Result<(), FeedConfigError> {
        if self.max_message_bytes == 0 || self.max_message_bytes > MAX_MESSAGE_BYTES_CAP {
            return Err(FeedConfigError::Invalid("max_message_bytes must be in 1..=1 GiB"));
        }
        if !(4..=64).contains(&self.max_frames) {
            return Err(FeedConfigError::Invalid("max_frames must be in 4..=64 (replay replies have 4 frames)"));
        }
        if self.max_replay_buffer_bytes == 0 {
            return Err(FeedConfigError::Invalid("max_replay_buffer_bytes must be > 0"));
        }
        Ok(())
    }

    /// The ZMTP limits of this feed's connections.
    pub(crate) fn zmtp_limits(&self) -> crate::zmtp::Limits {
        crate::zmtp::Limits {
            max_frame_bytes: self.max_message_bytes,
            max_message_bytes: self.max_message_bytes,
            max_frames: self.max_frames,
            handshake_timeout: self.connect_timeout,
            ..Default::default()
        }
    }
}

/// Upper bound of [`FeedConfig::max_message_bytes`]: no engine batch comes near it.
pub const MAX_MESSAGE_BYTES_CAP: usize = 1 << 30;

/// Why a [`FeedConfig`] was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FeedConfigError {
    /// An endpoint is unusable.
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// Another setting is out of range.
    #[error("invalid feed configuration: {0}")]
    Invalid(&'static str),
}

/// Why the consumer must drop its state for this publisher.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResetReason {
    /// The seq went backwards: the publisher process restarted.
    Restart,
    /// Batches were lost and could not be replayed.
    Resync,
    /// The connection to the publisher was lost and re-established; the publisher may have restarted
    /// and already published past the last seen seq, which seq numbers cannot reveal.
    Reconnect,
    /// The point [`FeedHandle::resume`] gave is ahead of anything the engine published (its ring has
    /// nothing that far, or its live stream has not got there): the consumer's state came from
    /// somewhere else than this engine's batches. What follows is the engine's ring from its start.
    ResumeAhead,
    /// The engine's ring no longer reaches back to the point [`FeedHandle::resume`] gave: batches the
    /// consumer's state lacks are gone. What follows is the ring from its start.
    ResumeUnreachable,
}

impl ResetReason {
    /// Snake_case label for metrics.
    pub fn label(self) -> &'static str {
        match self {
            ResetReason::Restart => "restart",
            ResetReason::Resync => "resync",
            ResetReason::Reconnect => "reconnect",
            ResetReason::ResumeAhead => "resume_ahead",
            ResetReason::ResumeUnreachable => "resume_unreachable",
        }
    }
}

/// A live message whose frames are not `[topic, seq (8 bytes), payload]`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Not exactly 3 frames.
    #[error("expected 3 frames, got {0}")]
    FrameCount(usize),
    /// The seq frame is not 8 bytes.
    #[error("seq frame has {0} bytes, expected 8")]
    SeqLength(usize),
}

/// A message that was counted as malformed and skipped.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Malformed {
    /// Bad framing (the seq, if any, is unknown and sequence tracking ignores the message).
    #[error(transparent)]
    Frames(#[from] FrameError),
    /// Good framing, undecodable payload. Its seq still counts as received.
    #[error(transparent)]
    Payload(#[from] DecodeError),
}

impl Malformed {
    /// Snake_case label for metrics: `bad_frames`, `bad_seq`, or the [`DecodeError::label`].
    pub fn label(&self) -> &'static str {
        match self {
            Malformed::Frames(FrameError::FrameCount(_)) => "bad_frames",
            Malformed::Frames(FrameError::SeqLength(_)) => "bad_seq",
            Malformed::Payload(e) => e.label(),
        }
    }
}

/// What a feed reports.
#[derive(Clone, Debug, PartialEq)]
pub enum FeedEvent {
    /// A decoded batch, in seq order.
    Batch {
        /// The publisher's seq of this batch.
        seq: u64,
        /// The batch.
        batch: EventBatch,
        /// Whether it came from the replay endpoint rather than the live stream.
        replayed: bool,
    },
    /// The sync [`FeedHandle::resume`] asked for is over: every batch the engine could still replay
    /// has been delivered before this (or the replay failed, counted in [`FeedStats::replay_failures`]).
    Synced,
    /// Drop all state for this publisher; what follows starts afresh.
    Reset {
        /// Why.
        reason: ResetReason,
    },
    /// A message was skipped (also counted in [`FeedStats::malformed`]). With `seq: Some(_)` the batch's
    /// events are unknown, so the consumer's view may miss stores or removals; treat it like a reset if
    /// that matters.
    Malformed {
        /// Its seq, when the framing was readable.
        seq: Option<u64>,
        /// What was wrong.
        error: Malformed,
    },
}

/// Shared atomic counters, written by the feed task.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub messages: AtomicU64,
    pub replayed_messages: AtomicU64,
    pub batches: AtomicU64,
    pub events: AtomicU64,
    pub malformed: AtomicU64,
    pub gaps: AtomicU64,
    pub duplicates: AtomicU64,
    pub replays: AtomicU64,
    pub replay_failures: AtomicU64,
    pub resyncs: AtomicU64,
    pub restarts: AtomicU64,
    pub reconnect_resets: AtomicU64,
    pub resume_ahead: AtomicU64,
    pub resume_unreachable: AtomicU64,
    pub disconnects: AtomicU64,
    pub connect_failures: AtomicU64,
    pub socket_recreations: AtomicU64,
    /// `u64::MAX` = none.
    pub last_seq: AtomicU64,
    pub connected: AtomicBool,
    pub history_complete: AtomicBool,
    pub protocol_violations: AtomicU64,
    pub protocol_by_reason: LabelCounts,
    pub malformed_by_reason: LabelCounts,
}

/// Counts per snake_case label. Refusals are rare next to batches, so a mutex is cheap enough, and it
/// keeps the set of labels open (new error kinds need no new field).
#[derive(Debug, Default)]
pub(crate) struct LabelCounts(Mutex<Vec<(&'static str, u64)>>);

impl LabelCounts {
    pub(crate) fn inc(&self, label: &'static str) {
        let mut counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match counts.iter_mut().find(|(l, _)| *l == label) {
            Some((_, n)) => *n += 1,
            None => counts.push((label, 1)),
        }
    }

    fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let mut counts = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        counts.sort_unstable();
        counts
    }
}

impl Counters {
    pub(crate) fn new() -> Self {
        Counters { last_seq: AtomicU64::new(u64::MAX), ..Default::default() }
    }

    pub(crate) fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> FeedStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let last = g(&self.last_seq);
        FeedStats {
            messages: g(&self.messages),
            replayed_messages: g(&self.replayed_messages),
            batches: g(&self.batches),
            events: g(&self.events),
            malformed: g(&self.malformed),
            gaps: g(&self.gaps),
            duplicates: g(&self.duplicates),
            replays: g(&self.replays),
            replay_failures: g(&self.replay_failures),
            resyncs: g(&self.resyncs),
            restarts: g(&self.restarts),
            reconnect_resets: g(&self.reconnect_resets),
            resume_ahead: g(&self.resume_ahead),
            resume_unreachable: g(&self.resume_unreachable),
            disconnects: g(&self.disconnects),
            connect_failures: g(&self.connect_failures),
            socket_recreations: g(&self.socket_recreations),
            last_seq: (last != u64::MAX).then_some(last),
            connected: self.connected.load(Ordering::Relaxed),
            history_complete: self.history_complete.load(Ordering::Relaxed),
            protocol_violations: g(&self.protocol_violations),
            protocol_violations_by_reason: self.protocol_by_reason.snapshot(),
            malformed_by_reason: self.malformed_by_reason.snapshot(),
        }
    }
}

/// A snapshot of a feed's counters (monotonic since the feed started) and state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FeedStats {
    /// Live messages received (any framing).
    pub messages: u64,
    /// Data messages received from the replay endpoint.
    pub replayed_messages: u64,
    /// Batches delivered as [`FeedEvent::Batch`].
    pub batches: u64,
    /// Events inside delivered batches.
    pub events: u64,
    /// Messages skipped as malformed (bad framing or undecodable payload).
    pub malformed: u64,
    /// Sequence gaps detected on the live stream.
    pub gaps: u64,
    /// Messages dropped because their seq had already been delivered (replay/live overlap).
    pub duplicates: u64,
    /// Replay requests started (slow-joiner, gap, restart).
    pub replays: u64,
    /// Replays that failed (timeout, connect error, bad reply, buffer overflow).
    pub replay_failures: u64,
    /// [`ResetReason::Resync`] resets emitted.
    pub resyncs: u64,
    /// [`ResetReason::Restart`] resets emitted.
    pub restarts: u64,
    /// [`ResetReason::Reconnect`] resets emitted.
    pub reconnect_resets: u64,
    /// [`ResetReason::ResumeAhead`] resets emitted.
    pub resume_ahead: u64,
    /// [`ResetReason::ResumeUnreachable`] resets emitted.
    pub resume_unreachable: u64,
    /// Times the publisher connection was lost.
    pub disconnects: u64,
    /// Failed connection attempts of the SUB socket (including failed handshakes).
    pub connect_failures: u64,
    /// Times the feed set up a fresh connection after losing one (each reconnect is a new socket).
    pub socket_recreations: u64,
    /// Last seq delivered, if any since the last reset.
    pub last_seq: Option<u64>,
    /// Whether the SUB socket currently has a connection.
    pub connected: bool,
    /// Whether every batch since the publisher's seq 0 was delivered since the last reset.
    pub history_complete: bool,
    /// Connections (live or replay) dropped because the peer broke the ZMTP protocol or a limit.
    pub protocol_violations: u64,
    /// [`FeedStats::protocol_violations`] by [`ZmtpError::label`] (`frame_too_large`,
    /// `message_too_large`, `too_many_frames`, `bad_greeting`, `bad_handshake`, `handshake_timeout`,
    /// `peer_error`, …), sorted by label; only labels seen so far.
    pub protocol_violations_by_reason: Vec<(&'static str, u64)>,
    /// [`FeedStats::malformed`] by [`Malformed::label`], sorted by label; only labels seen so far.
    pub malformed_by_reason: Vec<(&'static str, u64)>,
}

/// Handle of a running feed. Dropping it stops the feed task (and closes its sockets).
#[derive(Debug)]
pub struct FeedHandle {
    task: JoinHandle<()>,
    counters: Arc<Counters>,
    config: Arc<FeedConfig>,
    resume: Mutex<Option<tokio::sync::oneshot::Sender<Option<u64>>>>,
}

impl FeedHandle {
    /// Current counters and state.
    pub fn stats(&self) -> FeedStats {
        self.counters.snapshot()
    }

    /// The configuration the feed runs with.
    pub fn config(&self) -> &FeedConfig {
        &self.config
    }

    /// For a feed started with [`FeedConfig::hold_until_resumed`]: the consumer's state reflects every
    /// batch up to `after` (`None`: none). The feed replays from there (from 0: everything the
    /// engine's ring still holds), then delivers what it held and follows live, and reports
    /// [`FeedEvent::Synced`] when that replay is over. Without a replay endpoint the held batches are
    /// delivered as live ones. `after` is someone else's word (a peer replica's snapshot), so it is
    /// checked against the engine: a point ahead of the engine or out of its ring's reach is answered
    /// with [`FeedEvent::Reset`] ([`ResetReason::ResumeAhead`], [`ResetReason::ResumeUnreachable`])
    /// and the ring from its start. Later calls, and calls on a feed that does not hold, do nothing.
    pub fn resume(&self, after: Option<u64>) {
        if let Some(tx) = self.resume.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = tx.send(after);
        }
    }

    /// Whether the task has ended (it ends when the event receiver is dropped).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Stops the task and waits until it is gone.
    pub async fn shutdown(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for FeedHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts a feed on the current tokio runtime. Returns its handle and the receiver of its events.
///
/// # Panics
/// When called outside a tokio runtime.
pub fn spawn_feed(config: FeedConfig) -> Result<(FeedHandle, mpsc::Receiver<FeedEvent>), FeedConfigError> {
    config.validate()?;
    let (tx, rx) = mpsc::channel(config.channel_capacity);
    let counters = Arc::new(Counters::new());
    let config = Arc::new(config);
    let (resume_tx, resume_rx) = match config.hold_until_resumed {
        true => {
            let (t, r) = tokio::sync::oneshot::channel();
            (Some(t), Some(r))
        }
        false => (None, None),
    };
    let task = tokio::spawn(task::run(config.clone(), counters.clone(), tx, resume_rx));
    Ok((FeedHandle { task, counters, config, resume: Mutex::new(resume_tx) }, rx))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expand_data_parallel_offsets_both_ports() {
        let base = FeedConfig::new("tcp://w1:5557").with_replay_endpoint("tcp://w1:6557").with_topic("kv");
        let feeds = base.expand_data_parallel(3).unwrap();
        assert_eq!(feeds.len(), 3);
        for (r, f) in feeds.iter().enumerate() {
            assert_eq!(f.dp_rank, r as u32);
            assert_eq!(f.endpoint, format!("tcp://w1:{}", 5557 + r));
            assert_eq!(f.replay_endpoint.as_deref(), Some(format!("tcp://w1:{}", 6557 + r).as_str()));
            assert_eq!(f.topic, "kv");
        }
        assert_eq!(base.expand_data_parallel(0).unwrap().len(), 1, "dp size 0 is treated as 1");
        assert!(FeedConfig::new("tcp://w:65535").expand_data_parallel(2).is_err());
        assert!(FeedConfig::new("ipc:///tmp/x").expand_data_parallel(2).is_err());
        assert_eq!(FeedConfig::new("ipc:///tmp/x").expand_data_parallel(1).unwrap()[0].endpoint, "ipc:///tmp/x");
    }

    #[test]
    fn from_engine_config_substitutes_wildcards() {
        let cfg = FeedConfig::from_engine_config("10.0.0.7", "tcp://*:5557", Some("tcp://0.0.0.0:5600"), "t").unwrap();
        assert_eq!(cfg.endpoint, "tcp://10.0.0.7:5557");
        assert_eq!(cfg.replay_endpoint.as_deref(), Some("tcp://10.0.0.7:5600"));
        assert_eq!(cfg.topic, "t");
        let dp = cfg.expand_data_parallel(2).unwrap();
        assert_eq!(dp[1].endpoint, "tcp://10.0.0.7:5558");
        assert_eq!(dp[1].replay_endpoint.as_deref(), Some("tcp://10.0.0.7:5601"));
    }

    #[test]
    fn validation() {
        assert!(FeedConfig::new("tcp://127.0.0.1:5557").validate().is_ok());
        assert!(FeedConfig::new("tcp://*:5557").validate().is_err());
        assert!(FeedConfig::new("tcp://h:0").validate().is_err());
        assert!(FeedConfig::new("inproc://x").validate().is_err());
        assert!(FeedConfig::new("tcp://h:1").with_replay_endpoint("bogus").validate().is_err());
        let mut c = FeedConfig::new("tcp://h:1");
        c.channel_capacity = 0;
        assert_eq!(c.validate(), Err(FeedConfigError::Invalid("channel_capacity must be > 0")));
        let base = FeedConfig::new("tcp://h:1");
        assert_eq!((base.max_message_bytes, base.max_frames, base.max_replay_buffer_bytes), (16 << 20, 8, 32 << 20));
        for bad in [
            FeedConfig { max_message_bytes: 0, ..base.clone() },
            FeedConfig { max_message_bytes: MAX_MESSAGE_BYTES_CAP + 1, ..base.clone() },
            FeedConfig { max_frames: 3, ..base.clone() },
            FeedConfig { max_frames: 65, ..base.clone() },
            FeedConfig { max_replay_buffer_bytes: 0, ..base.clone() },
        ] {
            assert!(matches!(bad.validate(), Err(FeedConfigError::Invalid(_))), "{bad:?}");
        }
    }

    #[test]
    fn labels() {
        assert_eq!(Malformed::from(FrameError::FrameCount(2)).label(), "bad_frames");
        assert_eq!(Malformed::from(FrameError::SeqLength(4)).label(), "bad_seq");
        assert_eq!(Malformed::from(DecodeError::BatchNotArray).label(), "batch_not_array");
        assert_eq!(ResetReason::Resync.label(), "resync");
        assert_eq!(ResetReason::ResumeAhead.label(), "resume_ahead");
        assert_eq!(ResetReason::ResumeUnreachable.label(), "resume_unreachable");
    }
}
