//! Replay client: asks an engine's replay ROUTER for every buffered batch from a given seq.
//!
//! Protocol (identical for vLLM and SGLang): a DEALER sends `[b"", start_seq (8 bytes BE)]`; the ROUTER
//! answers with one message per buffered batch with `seq >= start`, then an end marker. As seen by the
//! DEALER:
//!
//! | Engine | data message | end marker |
//! |---|---|---|
//! | vLLM ≤ 0.25, SGLang ≤ 0.5.21 | `[b"", seq, payload]` | `[b"", FF×8, b""]` |
//! | vLLM ≥ 0.27, SGLang ≥ 0.5.22 | `[b"", topic, seq, payload]` | `[b"", b"", FF×8, b""]` |
//!
//! Replies are told apart by frame count. A fresh DEALER is used per replay (replays are rare), so no
//! state survives a failed one.

use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use zeromq::{DealerSocket, Socket, SocketOptions, SocketRecv, SocketSend, ZmqMessage};

/// Seq value of the end-of-replay marker.
pub const END_MARKER_SEQ: u64 = u64::MAX;

/// Why a replay failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// Could not connect to the replay endpoint.
    #[error("cannot connect to replay endpoint: {0}")]
    Connect(String),
    /// Could not send the request.
    #[error("cannot send replay request: {0}")]
    Send(String),
    /// No reply within the replay timeout.
    #[error("replay timed out waiting for a reply")]
    Timeout,
    /// The socket failed while receiving.
    #[error("replay receive failed: {0}")]
    Recv(String),
    /// A reply did not have the documented shape.
    #[error("bad replay reply: {0}")]
    BadReply(&'static str),
}

impl ReplayError {
    /// Snake_case label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            ReplayError::Connect(_) => "connect",
            ReplayError::Send(_) => "send",
            ReplayError::Timeout => "timeout",
            ReplayError::Recv(_) => "recv",
            ReplayError::BadReply(_) => "bad_reply",
        }
    }
}

/// One parsed reply message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplayReply {
    /// A buffered batch.
    Data {
        /// Its seq.
        seq: u64,
        /// Its msgpack payload.
        payload: Bytes,
    },
    /// End of the replay.
    End,
}

/// Parses the frames of one reply as received by a DEALER (empty delimiter first).
pub fn parse_reply(frames: &[Bytes]) -> Result<ReplayReply, ReplayError> {
    let (seq, payload) = match frames {
        [delim, seq, payload] | [delim, _, seq, payload] => {
            if !delim.is_empty() {
                return Err(ReplayError::BadReply("first frame is not the empty delimiter"));
            }
            (seq, payload)
        }
        _ => return Err(ReplayError::BadReply("expected 3 or 4 frames")),
    };
    let seq: [u8; 8] = seq.as_ref().try_into().map_err(|_| ReplayError::BadReply("seq frame is not 8 bytes"))?;
    let seq = u64::from_be_bytes(seq);
    if seq == END_MARKER_SEQ {
        return Ok(ReplayReply::End);
    }
    Ok(ReplayReply::Data { seq, payload: payload.clone() })
}

/// Builds the request message `[b"", start_seq]`.
pub(crate) fn request(from: u64) -> ZmqMessage {
    let frames = vec![Bytes::new(), Bytes::copy_from_slice(&from.to_be_bytes())];
    ZmqMessage::try_from(frames).expect("two frames")
}

/// Messages from a replay task to the feed task.
#[derive(Debug)]
pub(crate) enum ReplayMsg {
    Data { seq: u64, payload: Bytes },
    End,
    Failed(ReplayError),
}

/// Runs one replay from `from` and forwards everything to `tx`, tagged with `generation`.
pub(crate) async fn run(
    endpoint: String,
    from: u64,
    timeout: Duration,
    generation: u64,
    tx: mpsc::Sender<(u64, ReplayMsg)>,
) {
    let result = replay(&endpoint, from, timeout, generation, &tx).await;
    let last = match result {
        Ok(()) => ReplayMsg::End,
        Err(e) => ReplayMsg::Failed(e),
    };
    let _ = tx.send((generation, last)).await;
}

async fn replay(
    endpoint: &str,
    from: u64,
    timeout: Duration,
    generation: u64,
    tx: &mpsc::Sender<(u64, ReplayMsg)>,
) -> Result<(), ReplayError> {
    let mut options = SocketOptions::default();
    options.connect_timeout(timeout);
    let mut socket = DealerSocket::with_options(options);
    socket.connect(endpoint).await.map_err(|e| ReplayError::Connect(e.to_string()))?;
    tokio::time::timeout(timeout, socket.send(request(from)))
        .await
        .map_err(|_| ReplayError::Timeout)?
        .map_err(|e| ReplayError::Send(e.to_string()))?;
    loop {
        let msg = tokio::time::timeout(timeout, socket.recv())
            .await
            .map_err(|_| ReplayError::Timeout)?
            .map_err(|e| ReplayError::Recv(e.to_string()))?;
        match parse_reply(&msg.into_vec())? {
            ReplayReply::End => return Ok(()),
            ReplayReply::Data { seq, payload } => {
                if tx.send((generation, ReplayMsg::Data { seq, payload })).await.is_err() {
                    return Ok(()); // the feed is gone
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(x: &[u8]) -> Bytes {
        Bytes::copy_from_slice(x)
    }

    #[test]
    fn parses_both_reply_formats() {
        let seq = 7u64.to_be_bytes();
        assert_eq!(
            parse_reply(&[b(b""), b(&seq), b(b"payload")]).unwrap(),
            ReplayReply::Data { seq: 7, payload: b(b"payload") }
        );
        assert_eq!(
            parse_reply(&[b(b""), b(b"topic"), b(&seq), b(b"p")]).unwrap(),
            ReplayReply::Data { seq: 7, payload: b(b"p") }
        );
        let end = [0xFF; 8];
        assert_eq!(parse_reply(&[b(b""), b(&end), b(b"")]).unwrap(), ReplayReply::End);
        assert_eq!(parse_reply(&[b(b""), b(b""), b(&end), b(b"")]).unwrap(), ReplayReply::End);
    }

    #[test]
    fn rejects_bad_replies() {
        let seq = 7u64.to_be_bytes();
        for frames in [
            vec![b(&seq), b(b"p")],
            vec![b(b"x"), b(&seq), b(b"p")],
            vec![b(b""), b(b"short"), b(b"p")],
            vec![b(b""), b(b""), b(b""), b(&seq), b(b"p")],
        ] {
            let err = parse_reply(&frames).unwrap_err();
            assert_eq!(err.label(), "bad_reply", "{frames:?}");
        }
    }

    #[test]
    fn request_frames() {
        let req = request(0x0102).into_vec();
        assert_eq!(req, vec![Bytes::new(), b(&[0, 0, 0, 0, 0, 0, 1, 2])]);
    }
}
