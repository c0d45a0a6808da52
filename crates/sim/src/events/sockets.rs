//! The event sockets: the PUB that sends `[topic, seq (8 bytes BE), payload]` and the replay ROUTER.
//!
//! The PUB is a ZMQ XPUB, wire-identical to a PUB for subscribers: it also hands the publisher the
//! subscription messages, so [`Sockets::subscriptions`] can tell a test when a subscriber is certain to
//! receive what follows (a PUB silently drops what it sends before the subscription arrives). A send
//! that a subscriber does not take within [`SEND_TIMEOUT`] is given up, as a PUB drops at its high-water
//! mark: the batch stays in the ring, so the subscriber sees a gap and replays it.
//!
//! The ROUTER answers `[identity, b"", start seq (8 bytes BE)]` with every buffered batch with seq ≥
//! start as `[identity, b"", topic, seq, payload]` (the 4-frame replies of vLLM ≥ 0.27 and SGLang ≥
//! 0.5.22), then the end marker `[identity, b"", b"", FF×8, b""]`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use zeromq::{RouterSocket, Socket, SocketRecv, SocketSend, XPubSocket, ZmqMessage};

use super::batcher::Batcher;
use super::ring::{lock, Change, Log, Outgoing};
use crate::options::SimOptions;

/// Longest a send may wait on a slow subscriber before the batch is given up.
const SEND_TIMEOUT: Duration = Duration::from_secs(1);
/// The replay end marker's seq (−1 as an unsigned 64-bit).
const END_SEQ: [u8; 8] = [0xff; 8];

/// The bound event sockets; dropping it stops their tasks, which closes the sockets.
pub(crate) struct Sockets {
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    subscriptions: Arc<AtomicU64>,
    tasks: Vec<JoinHandle<()>>,
}

impl Sockets {
    pub async fn bind(
        endpoint: &str,
        opts: &SimOptions,
        log: Arc<Mutex<Log>>,
        batcher: Batcher,
        queue: mpsc::Receiver<Change>,
    ) -> anyhow::Result<Sockets> {
        let topic = Bytes::from(opts.kv_events_topic.clone());
        let mut xpub = XPubSocket::new();
        let bound = xpub.bind(endpoint).await.with_context(|| format!("sim: cannot bind --kv-events {endpoint}"))?;
        let subscriptions = Arc::new(AtomicU64::new(0));
        let publish = PublishTask {
            socket: xpub,
            queue,
            topic: topic.clone(),
            delay: Duration::from_millis(opts.kv_events_delay_ms),
            batcher,
            subscriptions: subscriptions.clone(),
        };
        let mut sockets = Sockets {
            endpoint: bound.to_string(),
            replay_endpoint: None,
            subscriptions,
            tasks: vec![tokio::spawn(publish.run())],
        };
        if let Some(replay) = &opts.kv_events_replay {
            let mut router = RouterSocket::new();
            let bound =
                router.bind(replay).await.with_context(|| format!("sim: cannot bind --kv-events-replay {replay}"))?;
            sockets.replay_endpoint = Some(bound.to_string());
            sockets.tasks.push(tokio::spawn(serve_replay(router, log, topic)));
        }
        Ok(sockets)
    }

    /// Subscription messages the PUB has received so far.
    pub fn subscriptions(&self) -> u64 {
        self.subscriptions.load(Relaxed)
    }
}

impl Drop for Sockets {
    fn drop(&mut self) {
        self.tasks.iter().for_each(JoinHandle::abort);
    }
}

struct PublishTask {
    socket: XPubSocket,
    queue: mpsc::Receiver<Change>,
    topic: Bytes,
    delay: Duration,
    batcher: Batcher,
    subscriptions: Arc<AtomicU64>,
}

impl PublishTask {
    /// Turns queued changes into batches and sends them once they are `delay` old, in seq order, while
    /// taking in subscriptions.
    async fn run(mut self) {
        let mut due: VecDeque<Outgoing> = VecDeque::new();
        loop {
            let next_at = due.front().map(|o| o.created + self.delay);
            tokio::select! {
                change = self.queue.recv() => match change {
                    Some(change) => due.extend(self.batcher.batch(&change)),
                    None => return,
                },
                message = self.socket.recv() => {
                    // `[0x01 topic]` subscribes; the socket registered it before returning it.
                    if message.is_ok_and(|m| m.get(0).is_some_and(|f| f.first() == Some(&1))) {
                        self.subscriptions.fetch_add(1, Relaxed);
                    }
                }
                () = sleep_until(next_at), if next_at.is_some() => {
                    if let Some(outgoing) = due.pop_front() {
                        self.send(outgoing).await;
                    }
                }
            }
        }
    }

    async fn send(&mut self, outgoing: Outgoing) {
        let frames = vec![self.topic.clone(), Bytes::copy_from_slice(&outgoing.seq.to_be_bytes()), outgoing.payload];
        let Ok(message) = ZmqMessage::try_from(frames) else { return };
        match tokio::time::timeout(SEND_TIMEOUT, self.socket.send(message)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                self.batcher.counters.overflowed.fetch_add(1, Relaxed);
                tracing::debug!(seq = outgoing.seq, error = %e, "sim: kv event batch not sent");
            }
            Err(_) => {
                self.batcher.counters.overflowed.fetch_add(1, Relaxed);
                tracing::debug!(seq = outgoing.seq, "sim: kv event batch given up on a slow subscriber");
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Answers replay requests until the task is aborted.
async fn serve_replay(mut router: RouterSocket, log: Arc<Mutex<Log>>, topic: Bytes) {
    // The socket waits for peers rather than failing, so an error here means it is unusable.
    while let Ok(request) = router.recv().await {
        let frames = request.into_vec();
        let Some((identity, start)) = parse_request(&frames) else {
            tracing::debug!(frames = frames.len(), "sim: malformed kv event replay request ignored");
            continue;
        };
        let batches = lock(&log).since(start);
        let replies = batches.into_iter().map(|(seq, payload)| (Bytes::copy_from_slice(&seq.to_be_bytes()), payload));
        let end = (Bytes::copy_from_slice(&END_SEQ), Bytes::new());
        for (seq, payload) in replies.chain(std::iter::once(end)) {
            // The end marker's topic frame is empty.
            let topic = if seq.as_ref() == END_SEQ { Bytes::new() } else { topic.clone() };
            let frames = vec![identity.clone(), Bytes::new(), topic, seq, payload];
            let Ok(reply) = ZmqMessage::try_from(frames) else { break };
            if router.send(reply).await.is_err() {
                break; // the requester went away
            }
        }
    }
}

/// `[identity, b"", start (8 bytes BE)]` → (identity, start).
fn parse_request(frames: &[Bytes]) -> Option<(Bytes, u64)> {
    match frames {
        [identity, delimiter, start] if delimiter.is_empty() => {
            Some((identity.clone(), u64::from_be_bytes(start.as_ref().try_into().ok()?)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_requests_need_the_delimiter_and_eight_bytes() {
        let b = |x: &[u8]| Bytes::copy_from_slice(x);
        let start = 7u64.to_be_bytes();
        assert_eq!(parse_request(&[b(b"id"), b(b""), b(&start)]), Some((b(b"id"), 7)));
        assert_eq!(parse_request(&[b(b"id"), b(&start)]), None);
        assert_eq!(parse_request(&[b(b"id"), b(b"x"), b(&start)]), None);
        assert_eq!(parse_request(&[b(b"id"), b(b""), b(b"short")]), None);
    }
}
