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

use crate::zmtp::{self, Limits, SocketType, ZmtpError};

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
    /// The replay endpoint broke the ZMTP protocol or a limit (also counted as a protocol violation).
    #[error("replay endpoint broke the protocol: {0}")]
    Protocol(ZmtpError),
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
            ReplayError::Protocol(_) => "protocol",
        }
    }

    fn from_connect(e: ZmtpError) -> Self {
        match e {
            ZmtpError::ConnectTimeout => ReplayError::Timeout,
            e if e.is_violation() => ReplayError::Protocol(e),
            e => ReplayError::Connect(e.to_string()),
        }
    }

    fn from_recv(e: ZmtpError) -> Self {
        if e.is_violation() {
            ReplayError::Protocol(e)
        } else {
            ReplayError::Recv(e.to_string())
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

/// The request frames `[b"", start_seq]`.
pub(crate) fn request(from: u64) -> [Vec<u8>; 2] {
    [Vec::new(), from.to_be_bytes().to_vec()]
}

/// Messages from a replay task to the feed task.
#[derive(Debug)]
pub(crate) enum ReplayMsg {
    Data { seq: u64, payload: Bytes },
    End,
    Failed(ReplayError),
}

/// What one replay task does.
#[derive(Clone, Debug)]
pub(crate) struct Request {
    pub endpoint: String,
    pub from: u64,
    /// Bounds the connection, the handshake and the wait for each reply.
    pub timeout: Duration,
    pub limits: Limits,
    /// Tags every message, so the feed can ignore those of a cancelled replay.
    pub generation: u64,
}

/// Runs one replay and forwards everything to `tx`, tagged with the request's generation.
pub(crate) async fn run(req: Request, tx: mpsc::Sender<(u64, ReplayMsg)>) {
    let last = match replay(&req, &tx).await {
        Ok(()) => ReplayMsg::End,
        Err(e) => ReplayMsg::Failed(e),
    };
    let _ = tx.send((req.generation, last)).await;
}

async fn replay(req: &Request, tx: &mpsc::Sender<(u64, ReplayMsg)>) -> Result<(), ReplayError> {
    let limits = Limits { handshake_timeout: req.timeout, ..req.limits };
    let mut socket = zmtp::connect(&req.endpoint, SocketType::Dealer, b"", limits, req.timeout)
        .await
        .map_err(ReplayError::from_connect)?;
    let [delim, start] = request(req.from);
    tokio::time::timeout(req.timeout, socket.send(&[&delim, &start]))
        .await
        .map_err(|_| ReplayError::Timeout)?
        .map_err(|e| ReplayError::Send(e.to_string()))?;
    loop {
        let frames = tokio::time::timeout(req.timeout, socket.recv())
            .await
            .map_err(|_| ReplayError::Timeout)?
            .map_err(ReplayError::from_recv)?;
        match parse_reply(&frames)? {
            ReplayReply::End => return Ok(()),
            ReplayReply::Data { seq, payload } => {
                if tx.send((req.generation, ReplayMsg::Data { seq, payload })).await.is_err() {
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
        let [delim, start] = request(0x0102);
        assert!(delim.is_empty());
        assert_eq!(start, [0, 0, 0, 0, 0, 0, 1, 2]);
    }
}
