//! The feed's socket task: owns the SUB socket and the running replay, feeds the sans-IO
//! [`Tracker`](super::tracker::Tracker) and executes its actions.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use zeromq::{Socket, SocketEvent, SocketOptions, SocketRecv, SubSocket, ZmqMessage};

use super::replay::{self, ReplayMsg};
use super::tracker::{Action, Tracker, TrackerConfig};
use super::{Counters, FeedConfig, FeedEvent, FrameError, Malformed};
use crate::decode::decode_batch;

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
}

pub(super) async fn run(cfg: Arc<FeedConfig>, counters: Arc<Counters>, tx: mpsc::Sender<FeedEvent>) {
    let tracker_cfg = TrackerConfig {
        replay_enabled: cfg.replay_endpoint.is_some(),
        reset_on_reconnect: cfg.reset_on_reconnect,
        max_replay_buffer: cfg.max_replay_buffer,
    };
    let (replay_tx, replay_rx) = mpsc::channel(1024);
    let mut feed = Feed {
        tracker: Tracker::new(tracker_cfg, counters.clone()),
        cfg,
        counters,
        tx,
        actions: Vec::new(),
        replay: None,
        generation: 0,
        replay_tx,
        replay_rx,
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
}

impl Feed {
    async fn run(&mut self) -> Result<(), Closed> {
        let mut backoff = Backoff::new(self.cfg.reconnect_interval_max);
        loop {
            let (mut sub, mut monitor) = self.connect(&mut backoff).await?;
            backoff.reset();
            self.counters.connected.store(true, Ordering::Relaxed);
            tracing::debug!(endpoint = %self.cfg.endpoint, dp_rank = self.cfg.dp_rank, "kv event feed connected");

            let mut monitor_open = true;
            let mut down_since: Option<Instant> = None;
            loop {
                let recreate_at = down_since.map(|t| t + self.cfg.reconnect_interval_max);
                tokio::select! {
                    biased;
                    _ = self.tx.closed() => return Err(Closed),
                    ev = monitor.next(), if monitor_open => match ev {
                        Some(SocketEvent::Disconnected(_)) => {
                            Counters::inc(&self.counters.disconnects);
                            self.counters.connected.store(false, Ordering::Relaxed);
                            down_since.get_or_insert_with(Instant::now);
                            tracing::info!(endpoint = %self.cfg.endpoint, dp_rank = self.cfg.dp_rank,
                                "kv event publisher disconnected");
                            self.tracker.on_disconnect(&mut self.actions);
                            self.execute().await?;
                        }
                        Some(SocketEvent::Connected(..)) => {
                            self.counters.connected.store(true, Ordering::Relaxed);
                            down_since = None;
                        }
                        Some(_) => {}
                        None => monitor_open = false,
                    },
                    Some((generation, msg)) = self.replay_rx.recv() => self.on_replay_msg(generation, msg).await?,
                    res = sub.recv() => match res {
                        Ok(msg) => self.on_live(msg).await?,
                        // A peer's stream failed; the socket notices the disconnect itself.
                        Err(e) => tracing::debug!(endpoint = %self.cfg.endpoint, error = %e, "kv event recv error"),
                    },
                    _ = sleep_until_opt(recreate_at), if recreate_at.is_some() => {
                        tracing::info!(endpoint = %self.cfg.endpoint, dp_rank = self.cfg.dp_rank,
                            "kv event publisher still unreachable, recreating the SUB socket");
                        Counters::inc(&self.counters.socket_recreations);
                        break;
                    }
                }
            }
        }
    }

    /// Creates a SUB socket and connects it, retrying with backoff until it works or the consumer is gone.
    async fn connect(
        &mut self,
        backoff: &mut Backoff,
    ) -> Result<(SubSocket, futures_util::stream::BoxStream<'static, SocketEvent>), Closed> {
        loop {
            let attempt = async {
                let mut options = SocketOptions::default();
                options.connect_timeout(self.cfg.connect_timeout);
                let mut sub = SubSocket::with_options(options);
                let monitor = sub.monitor();
                sub.subscribe(&self.cfg.topic).await?;
                sub.connect(&self.cfg.endpoint).await?;
                Ok::<_, zeromq::ZmqError>((sub, monitor.boxed()))
            };
            let result = tokio::select! {
                _ = self.tx.closed() => return Err(Closed),
                r = attempt => r,
            };
            match result {
                Ok(pair) => return Ok(pair),
                Err(e) => {
                    Counters::inc(&self.counters.connect_failures);
                    let delay = backoff.step();
                    tracing::debug!(endpoint = %self.cfg.endpoint, error = %e, ?delay, "kv event connect failed");
                    tokio::select! {
                        _ = self.tx.closed() => return Err(Closed),
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    async fn on_live(&mut self, msg: ZmqMessage) -> Result<(), Closed> {
        Counters::inc(&self.counters.messages);
        match parse_live(msg) {
            Ok((seq, payload)) => {
                self.tracker.on_live(seq, payload, &mut self.actions);
                self.execute().await
            }
            Err(e) => {
                Counters::inc(&self.counters.malformed);
                tracing::warn!(endpoint = %self.cfg.endpoint, error = %e, "malformed kv event message");
                self.send(FeedEvent::Malformed { seq: None, error: e.into() }).await
            }
        }
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
                tracing::warn!(endpoint = ?self.cfg.replay_endpoint, error = %e, "kv event replay failed");
                self.tracker.on_replay_end(false, &mut self.actions);
            }
        }
        self.execute().await
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
                    Counters::inc(&self.counters.malformed);
                    tracing::warn!(endpoint = %self.cfg.endpoint, seq, error = %e, "undecodable kv event batch");
                    self.send(FeedEvent::Malformed { seq: Some(seq), error: Malformed::Payload(e) }).await
                }
            },
            Action::Reset(reason) => {
                tracing::info!(endpoint = %self.cfg.endpoint, dp_rank = self.cfg.dp_rank, reason = reason.label(),
                    "kv event feed reset");
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
        let task =
            tokio::spawn(replay::run(endpoint, from, self.cfg.replay_timeout, self.generation, self.replay_tx.clone()));
        self.replay = Some(RunningReplay { generation: self.generation, _task: AbortOnDrop(task) });
    }

    async fn send(&self, ev: FeedEvent) -> Result<(), Closed> {
        self.tx.send(ev).await.map_err(|_| Closed)
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Splits a live message into `(seq, payload)`.
fn parse_live(msg: ZmqMessage) -> Result<(u64, Bytes), FrameError> {
    let frames = msg.into_vec();
    let [_topic, seq, payload] = <[Bytes; 3]>::try_from(frames).map_err(|f| FrameError::FrameCount(f.len()))?;
    let seq: [u8; 8] = seq.as_ref().try_into().map_err(|_| FrameError::SeqLength(seq.len()))?;
    Ok((u64::from_be_bytes(seq), payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_frames() {
        let msg = |frames: Vec<&[u8]>| {
            ZmqMessage::try_from(frames.into_iter().map(Bytes::copy_from_slice).collect::<Vec<_>>()).unwrap()
        };
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
