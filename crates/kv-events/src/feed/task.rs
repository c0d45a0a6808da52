//! The feed's socket task: owns the SUB socket and the running replay, feeds the sans-IO
//! [`Tracker`](super::tracker::Tracker) and executes its actions.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::log_limit::{self, LogLimit};
use super::replay::{self, ReplayError, ReplayMsg};
use super::tracker::{Action, Tracker, TrackerConfig};
use super::{Counters, FeedConfig, FeedEvent, FrameError, Malformed};
use crate::decode::decode_batch;
use crate::zmtp::{self, SocketType, Stream, ZmtpError, ZmtpSocket};

/// The consumer dropped the receiver: stop.
struct Closed;

/// Aborts the wrapped task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct RunningReplay {
    generation: u64,
    _task: AbortOnDrop,
}

struct Feed {
    cfg: Arc<FeedConfig>,
    counters: Arc<Counters>,
    tx: mpsc::Sender<FeedEvent>,
    tracker: Tracker<Bytes>,
    actions: Vec<Action<Bytes>>,
    replay: Option<RunningReplay>,
    generation: u64,
    replay_tx: mpsc::Sender<(u64, ReplayMsg)>,
    replay_rx: mpsc::Receiver<(u64, ReplayMsg)>,
    log_limit: LogLimit,
    /// Where the consumer's state stands, once it knows (a held feed: see [`super::FeedHandle::resume`]).
    resume: Option<oneshot::Receiver<Option<u64>>>,
}

pub(super) async fn run(
    cfg: Arc<FeedConfig>,
    counters: Arc<Counters>,
    tx: mpsc::Sender<FeedEvent>,
    resume: Option<oneshot::Receiver<Option<u64>>>,
) {
    let tracker_cfg = TrackerConfig {
        replay_enabled: cfg.replay_endpoint.is_some(),
        reset_on_reconnect: cfg.reset_on_reconnect,
        max_replay_buffer: cfg.max_replay_buffer,
        max_replay_buffer_bytes: cfg.max_replay_buffer_bytes,
    };
    // Replayed messages are applied as they arrive; a short channel keeps at most a few of them (each up
    // to `max_message_bytes`) in flight.
    let (replay_tx, replay_rx) = mpsc::channel(2);
    let tracker = match resume {
        Some(_) => Tracker::holding(tracker_cfg, counters.clone()),
        None => Tracker::new(tracker_cfg, counters.clone()),
    };
    let mut feed = Feed {
        tracker,
        resume,
        cfg,
        counters,
        tx,
        actions: Vec::new(),
        replay: None,
        generation: 0,
        replay_tx,
        replay_rx,
        log_limit: LogLimit::new(),
    };
    let _ = feed.run().await;
    feed.counters.connected.store(false, Ordering::Relaxed);
    tracing::debug!(endpoint = %feed.cfg.endpoint, dp_rank = feed.cfg.dp_rank, "kv event feed stopped");
}

/// Exponential backoff with a cap.
struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    const MIN: Duration = Duration::from_millis(100);

    fn new(max: Duration) -> Self {
        Backoff { next: Self::MIN.min(max), max }
    }

    fn step(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    fn reset(&mut self) {
        self.next = Self::MIN.min(self.max);
    }

    /// The delay after a protocol violation: the cap, and the backoff stays there.
    fn penalty(&mut self) -> Duration {
        self.next = self.max;
        self.max
    }
}

type Conn = ZmtpSocket<Box<dyn Stream>>;

impl Feed {
    async fn run(&mut self) -> Result<(), Closed> {
        let mut backoff = Backoff::new(self.cfg.reconnect_interval_max);
        loop {
            let mut conn = self.connect(&mut backoff).await?;
            self.counters.connected.store(true, Ordering::Relaxed);
            tracing::debug!(endpoint = %self.cfg.endpoint, dp_rank = self.cfg.dp_rank, "kv event feed connected");
            let (error, delivered) = self.serve(&mut conn).await?;
            drop(conn);
            if delivered {
                backoff.reset(); // the peer behaved for a while: reconnect quickly
            }
            self.on_lost(&error).await?;
            self.pause(&mut backoff, &error).await?;
            Counters::inc(&self.counters.socket_recreations);
        }
    }

    /// Reads the connection until it fails: the error, and whether any message arrived.
    async fn serve(&mut self, conn: &mut Conn) -> Result<(ZmtpError, bool), Closed> {
        let mut delivered = false;
        loop {
            tokio::select! {
                biased;
                _ = self.tx.closed() => return Err(Closed),
                Some((generation, msg)) = self.replay_rx.recv() => self.on_replay_msg(generation, msg).await?,
                after = async { self.resume.as_mut().expect("guarded").await }, if self.resume.is_some() => {
                    self.resume = None;
                    // A dropped handle sends nothing: the feed is stopping anyway (`tx.closed`).
                    if let Ok(after) = after {
                        self.tracker.resume(after, &mut self.actions);
                        self.execute().await?;
                    }
                }
                res = conn.recv() => match res {
                    Ok(frames) => {
                        delivered = true;
                        self.on_live(frames).await?;
                    }
                    Err(e) => return Ok((e, delivered)),
                },
            }
        }
    }

    /// The live connection ended.
    async fn on_lost(&mut self, error: &ZmtpError) -> Result<(), Closed> {
        Counters::inc(&self.counters.disconnects);
        self.counters.connected.store(false, Ordering::Relaxed);
        if error.is_violation() {
            self.violation(&self.cfg.endpoint.clone(), error);
        } else {
            tracing::info!(endpoint = %self.cfg.endpoint, dp_rank = self.cfg.dp_rank, reason = %error,
                "kv event publisher disconnected");
        }
        self.tracker.on_disconnect(&mut self.actions);
        self.execute().await
    }

    /// Counts and logs (rate-limited) a protocol violation of the live or replay peer.
    fn violation(&mut self, endpoint: &str, error: &ZmtpError) {
        Counters::inc(&self.counters.protocol_violations);
        self.counters.protocol_by_reason.inc(error.label());
        log_limit::warn(&mut self.log_limit, endpoint, error.label(), || {
            tracing::warn!(endpoint, reason = error.label(), error = %error,
                "kv event peer broke the protocol, connection dropped");
        });
    }

    /// Waits before the next connection attempt: the backoff, or after a protocol violation the full
    /// backoff cap (a misbehaving peer is not retried eagerly).
    async fn pause(&mut self, backoff: &mut Backoff, error: &ZmtpError) -> Result<(), Closed> {
        let delay = if error.is_violation() { backoff.penalty() } else { backoff.step() };
        tokio::select! {
            _ = self.tx.closed() => Err(Closed),
            _ = tokio::time::sleep(delay) => Ok(()),
        }
    }

    /// Connects and handshakes, retrying with backoff until it works or the consumer is gone.
    async fn connect(&mut self, backoff: &mut Backoff) -> Result<Conn, Closed> {
        loop {
            let attempt = zmtp::connect(
                &self.cfg.endpoint,
                SocketType::Sub,
                self.cfg.topic.as_bytes(),
                self.cfg.zmtp_limits(),
                self.cfg.connect_timeout,
            );
            let result = tokio::select! {
                _ = self.tx.closed() => return Err(Closed),
                r = attempt => r,
            };
            match result {
                Ok(conn) => return Ok(conn),
                Err(e) => {
                    Counters::inc(&self.counters.connect_failures);
                    if e.is_violation() {
                        self.violation(&self.cfg.endpoint.clone(), &e);
                    } else {
                        tracing::debug!(endpoint = %self.cfg.endpoint, error = %e, "kv event connect failed");
                    }
                    self.pause(backoff, &e).await?;
                }
            }
        }
    }

    async fn on_live(&mut self, frames: Vec<Bytes>) -> Result<(), Closed> {
        Counters::inc(&self.counters.messages);
        match parse_live(frames) {
            Ok((seq, payload)) => {
                self.tracker.on_live(seq, payload, &mut self.actions);
                self.execute().await
            }
            Err(e) => {
                let error = Malformed::from(e);
                self.malformed(None, &error);
                self.send(FeedEvent::Malformed { seq: None, error }).await
            }
        }
    }

    /// Counts and logs (rate-limited) a malformed message.
    fn malformed(&mut self, seq: Option<u64>, error: &Malformed) {
        Counters::inc(&self.counters.malformed);
        self.counters.malformed_by_reason.inc(error.label());
        let endpoint = &self.cfg.endpoint;
        log_limit::warn(&mut self.log_limit, endpoint, error.label(), || {
            tracing::warn!(endpoint, ?seq, reason = error.label(), error = %error, "malformed kv event message");
        });
    }

    async fn on_replay_msg(&mut self, generation: u64, msg: ReplayMsg) -> Result<(), Closed> {
        if self.replay.as_ref().map(|r| r.generation) != Some(generation) {
            return Ok(()); // left over from a cancelled replay
        }
        match msg {
            ReplayMsg::Data { seq, payload } => {
                Counters::inc(&self.counters.replayed_messages);
                self.tracker.on_replay_item(seq, payload, &mut self.actions);
            }
            ReplayMsg::End => {
                self.replay = None;
                self.tracker.on_replay_end(true, &mut self.actions);
            }
            ReplayMsg::Failed(e) => {
                self.replay = None;
                self.replay_failed(&e);
                self.tracker.on_replay_end(false, &mut self.actions);
            }
        }
        self.execute().await
    }

    fn replay_failed(&mut self, e: &ReplayError) {
        let endpoint = self.cfg.replay_endpoint.clone().unwrap_or_default();
        if let ReplayError::Protocol(z) = e {
            return self.violation(&endpoint, z);
        }
        log_limit::warn(&mut self.log_limit, &endpoint, e.label(), || {
            tracing::warn!(endpoint, reason = e.label(), error = %e, "kv event replay failed");
        });
    }

    async fn execute(&mut self) -> Result<(), Closed> {
        // The tracker state is final for this step: publish it before the consumer sees the events.
        let last = self.tracker.last_seq().unwrap_or(u64::MAX);
        self.counters.last_seq.store(last, Ordering::Relaxed);
        self.counters.history_complete.store(self.tracker.history_complete(), Ordering::Relaxed);
        // Executing an action may queue more (see `start_replay`), hence the outer loop.
        while !self.actions.is_empty() {
            let mut actions = std::mem::take(&mut self.actions);
            for action in actions.drain(..) {
                self.execute_one(action).await?;
            }
            if self.actions.is_empty() {
                self.actions = actions; // keep the allocation
            }
        }
        Ok(())
    }

    async fn execute_one(&mut self, action: Action<Bytes>) -> Result<(), Closed> {
        match action {
            Action::Deliver { seq, item, replayed } => match decode_batch(&item) {
                Ok(batch) => {
                    Counters::inc(&self.counters.batches);
                    self.counters.events.fetch_add(batch.events.len() as u64, Ordering::Relaxed);
                    self.send(FeedEvent::Batch { seq, batch, replayed }).await
                }
                Err(e) => {
                    let error = Malformed::Payload(e);
                    self.malformed(Some(seq), &error);
                    self.send(FeedEvent::Malformed { seq: Some(seq), error }).await
                }
            },
            Action::Reset(reason) => {
                // A publisher can make the seq go back with every message: resets share the refusals'
                // rate limit (the first of each reason in full, then summaries).
                let cfg = self.cfg.clone();
                log_limit::warn(&mut self.log_limit, &cfg.endpoint, reason.label(), || {
                    tracing::info!(endpoint = %cfg.endpoint, dp_rank = cfg.dp_rank, reason = reason.label(),
                        "kv event feed reset");
                });
                self.send(FeedEvent::Reset { reason }).await
            }
            Action::StartReplay { from } => {
                self.start_replay(from);
                Ok(())
            }
            Action::CancelReplay => {
                self.replay = None;
                Ok(())
            }
            Action::Synced => self.send(FeedEvent::Synced).await,
        }
    }

    fn start_replay(&mut self, from: u64) {
        let Some(endpoint) = self.cfg.replay_endpoint.clone() else {
            // Not reached (the tracker only replays when an endpoint is configured); fail the replay so the
            // tracker leaves replay mode. `execute` runs the actions this queues.
            self.tracker.on_replay_end(false, &mut self.actions);
            return;
        };
        self.generation += 1;
        tracing::debug!(endpoint = %endpoint, from, "kv event replay requested");
        let request = replay::Request {
            endpoint,
            from,
            timeout: self.cfg.replay_timeout,
            limits: self.cfg.zmtp_limits(),
            generation: self.generation,
        };
        let task = tokio::spawn(replay::run(request, self.replay_tx.clone()));
        self.replay = Some(RunningReplay { generation: self.generation, _task: AbortOnDrop(task) });
    }

    async fn send(&self, ev: FeedEvent) -> Result<(), Closed> {
        self.tx.send(ev).await.map_err(|_| Closed)
    }
}

/// Splits a live message into `(seq, payload)`.
fn parse_live(frames: Vec<Bytes>) -> Result<(u64, Bytes), FrameError> {
    let [_topic, seq, payload] = <[Bytes; 3]>::try_from(frames).map_err(|f| FrameError::FrameCount(f.len()))?;
    let seq: [u8; 8] = seq.as_ref().try_into().map_err(|_| FrameError::SeqLength(seq.len()))?;
    Ok((u64::from_be_bytes(seq), payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_frames() {
        let msg = |frames: Vec<&[u8]>| frames.into_iter().map(Bytes::copy_from_slice).collect::<Vec<_>>();
        assert_eq!(parse_live(msg(vec![b"t", &5u64.to_be_bytes(), b"p"])).unwrap(), (5, Bytes::from_static(b"p")));
        assert_eq!(parse_live(msg(vec![b"", &[0; 8], b""])).unwrap(), (0, Bytes::new()));
        assert_eq!(parse_live(msg(vec![b"t", b"p"])), Err(FrameError::FrameCount(2)));
        assert_eq!(parse_live(msg(vec![b"t", b"1234", b"p"])), Err(FrameError::SeqLength(4)));
    }

    #[test]
    fn backoff_is_capped() {
        let mut b = Backoff::new(Duration::from_millis(500));
        let steps: Vec<_> = (0..5).map(|_| b.step().as_millis()).collect();
        assert_eq!(steps, vec![100, 200, 400, 500, 500]);
        b.reset();
        assert_eq!(b.step().as_millis(), 100);
    }
}
