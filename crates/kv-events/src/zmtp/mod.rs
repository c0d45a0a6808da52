//! A small, bounded ZMTP 3.x client (the wire protocol of ZeroMQ, rfc.zeromq.org 23/ZMTP and 37/ZMTP).
//!
//! **Why our own.** The pure-Rust `zeromq` crate enforces no frame or message size: a 9-byte long-frame
//! header claiming 2^62 bytes makes it reserve that much and abort the process, and multi-part messages
//! buffer without limit. A KV-event publisher is a network peer, so every byte it sends must be bounded.
//!
//! Scope: the client side only, socket types SUB and DEALER, the NULL security mechanism, transports
//! `tcp://host:port` and `ipc://path`. Every [`Limits`] value is checked on the *declared* length of a frame
//! before memory is reserved for it (see [`codec`]); a violation is a typed [`ZmtpError`] and the
//! connection is dropped. The socket reads only when [`ZmtpSocket::recv`] is polled, so a slow consumer
//! pushes back on the TCP connection instead of queueing in memory.
//!
//! Handshake: both greetings (we announce 3.0, see [`codec::greeting`]), then `READY` with `Socket-Type`
//! (and an empty `Identity` for DEALER) both ways, then, for SUB, the subscription as a `0x01 + topic`
//! message. After the handshake `PING` is answered with `PONG`, `ERROR` ends the connection and other
//! commands are ignored.

pub(crate) mod codec;
mod error;
mod limits;
#[cfg(test)]
mod tests;

use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};

use crate::endpoint::Endpoint;
use codec::{Decoder, Item};

pub use error::ZmtpError;
pub(crate) use limits::Limits;

/// Pending output (PONGs) beyond which PINGs go unanswered: a peer that does not read gets no more.
const MAX_PENDING_OUT: usize = 1024;
/// The spec bounds a PING context to 16 bytes.
const MAX_PING_CONTEXT: usize = 16;

/// Our side of the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SocketType {
    Sub,
    Dealer,
}

impl SocketType {
    fn name(self) -> &'static [u8] {
        match self {
            SocketType::Sub => b"SUB",
            SocketType::Dealer => b"DEALER",
        }
    }

    /// Peer socket types the spec allows us to talk to.
    fn accepts(self, peer: &[u8]) -> bool {
        let ok: &[&[u8]] = match self {
            SocketType::Sub => &[b"PUB", b"XPUB"],
            SocketType::Dealer => &[b"ROUTER", b"DEALER", b"REP"],
        };
        ok.contains(&peer)
    }
}

/// A stream we can speak ZMTP over.
pub(crate) trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}

/// One ZMTP connection after a completed handshake.
pub(crate) struct ZmtpSocket<S> {
    rd: ReadHalf<S>,
    wr: WriteHalf<S>,
    dec: Decoder,
    /// Queued output (PONGs), written while `recv` waits for input.
    out: Vec<u8>,
}

/// Connects to `endpoint` (`tcp://` or `ipc://`) within `connect_timeout`, then runs the handshake.
pub(crate) async fn connect(
    endpoint: &str,
    ty: SocketType,
    subscription: &[u8],
    limits: Limits,
    connect_timeout: Duration,
) -> Result<ZmtpSocket<Box<dyn Stream>>, ZmtpError> {
    let stream =
        tokio::time::timeout(connect_timeout, open(endpoint)).await.map_err(|_| ZmtpError::ConnectTimeout)??;
    ZmtpSocket::handshake(stream, ty, subscription, limits).await
}

async fn open(endpoint: &str) -> Result<Box<dyn Stream>, ZmtpError> {
    let connect_err = |e: std::io::Error| ZmtpError::Connect(e.to_string());
    match Endpoint::parse(endpoint).map_err(|e| ZmtpError::Connect(e.to_string()))? {
        Endpoint::Tcp { host, port } => {
            let stream = tokio::net::TcpStream::connect((host.as_str(), port)).await.map_err(connect_err)?;
            // Small request frames (subscription, replay request) must not wait for Nagle.
            stream.set_nodelay(true).map_err(connect_err)?;
            Ok(Box::new(stream))
        }
        #[cfg(unix)]
        Endpoint::Ipc(path) => Ok(Box::new(tokio::net::UnixStream::connect(path).await.map_err(connect_err)?)),
        #[cfg(not(unix))]
        other => Err(ZmtpError::Connect(format!("unsupported transport: {other}"))),
    }
}

impl<S: Stream> ZmtpSocket<S> {
    /// Greeting and READY exchange over `stream` (plus the subscription for SUB), bounded by
    /// [`Limits::handshake_timeout`].
    pub(crate) async fn handshake(
        stream: S,
        ty: SocketType,
        subscription: &[u8],
        limits: Limits,
    ) -> Result<Self, ZmtpError> {
        let (rd, wr) = tokio::io::split(stream);
        let mut socket = ZmtpSocket { rd, wr, dec: Decoder::new(limits), out: Vec::new() };
        tokio::time::timeout(limits.handshake_timeout, socket.greet(ty))
            .await
            .map_err(|_| ZmtpError::HandshakeTimeout)??;
        if ty == SocketType::Sub {
            let mut sub = Vec::with_capacity(1 + subscription.len());
            sub.push(1);
            sub.extend_from_slice(subscription);
            socket.send(&[&sub]).await?;
        }
        Ok(socket)
    }

    async fn greet(&mut self, ty: SocketType) -> Result<(), ZmtpError> {
        self.wr.write_all(&codec::greeting()).await.map_err(ZmtpError::io)?;
        self.wr.flush().await.map_err(ZmtpError::io)?;
        match self.read_item().await? {
            // Any 3.x minor is fine: having announced 3.0, we are talked to as a 3.0 peer.
            Item::Greeting(_) => {}
            _ => return Err(ZmtpError::BadGreeting("no greeting")),
        }
        let mut ready = Vec::new();
        let identity: &[(&str, &[u8])] = match ty {
            SocketType::Sub => &[],
            SocketType::Dealer => &[("Identity", b"")],
        };
        let props: Vec<(&str, &[u8])> =
            [("Socket-Type", ty.name())].into_iter().chain(identity.iter().copied()).collect();
        codec::encode_command(&mut ready, b"READY", &codec::ready_body(&props));
        self.wr.write_all(&ready).await.map_err(ZmtpError::io)?;
        self.wr.flush().await.map_err(ZmtpError::io)?;
        match self.read_item().await? {
            Item::Command { name, body } if name.as_ref() == b"READY" => {
                let peer = codec::ready_property(&body, "Socket-Type")?
                    .ok_or(ZmtpError::BadHandshake("READY without Socket-Type"))?;
                if !ty.accepts(peer) {
                    return Err(ZmtpError::BadHandshake("incompatible peer socket type"));
                }
                Ok(())
            }
            Item::Command { name, body } if name.as_ref() == b"ERROR" => Err(peer_error(&body)),
            _ => Err(ZmtpError::BadHandshake("expected READY")),
        }
    }

    /// Reads until the decoder yields an item (no output is pending during the handshake).
    async fn read_item(&mut self) -> Result<Item, ZmtpError> {
        loop {
            if let Some(item) = self.dec.next_item()? {
                return Ok(item);
            }
            self.read_some().await?;
        }
    }

    async fn read_some(&mut self) -> Result<(), ZmtpError> {
        let n = self.rd.read(self.dec.read_buf()).await.map_err(ZmtpError::io)?;
        if n == 0 {
            return Err(ZmtpError::Closed);
        }
        self.dec.filled(n);
        Ok(())
    }

    /// The next message. Cancel-safe: all state lives in `self`, and each await point is a single
    /// `read` or `write` call.
    pub(crate) async fn recv(&mut self) -> Result<Vec<Bytes>, ZmtpError> {
        loop {
            match self.dec.next_item()? {
                Some(Item::Message(frames)) => return Ok(frames),
                Some(Item::Command { name, body }) => self.on_command(&name, &body)?,
                Some(Item::Greeting(_)) => return Err(ZmtpError::BadHandshake("second greeting")),
                None if self.out.is_empty() => self.read_some().await?,
                None => self.read_or_write().await?,
            }
        }
    }

    async fn read_or_write(&mut self) -> Result<(), ZmtpError> {
        tokio::select! {
            r = self.rd.read(self.dec.read_buf()) => match r.map_err(ZmtpError::io)? {
                0 => Err(ZmtpError::Closed),
                n => {
                    self.dec.filled(n);
                    Ok(())
                }
            },
            r = self.wr.write(&self.out) => {
                let n = r.map_err(ZmtpError::io)?;
                self.out.drain(..n);
                Ok(())
            }
        }
    }

    fn on_command(&mut self, name: &[u8], body: &[u8]) -> Result<(), ZmtpError> {
        match name {
            b"PING" => {
                // PING = TTL (2 bytes) + context, PONG echoes the context.
                let context = body.get(2..).unwrap_or_default();
                let context = &context[..context.len().min(MAX_PING_CONTEXT)];
                if self.out.len() + 8 + MAX_PING_CONTEXT <= MAX_PENDING_OUT {
                    codec::encode_command(&mut self.out, b"PONG", context);
                }
                Ok(())
            }
            b"ERROR" => Err(peer_error(body)),
            _ => Ok(()), // READY again, PONG, SUBSCRIBE, …: nothing for a client to do
        }
    }

    /// Sends one multi-part message. Not cancel-safe (callers bound it with a timeout and drop the
    /// connection on failure).
    pub(crate) async fn send(&mut self, frames: &[&[u8]]) -> Result<(), ZmtpError> {
        let mut buf = std::mem::take(&mut self.out);
        codec::encode_message(&mut buf, frames);
        let res = self.wr.write_all(&buf).await;
        self.out = Vec::new();
        res.map_err(ZmtpError::io)?;
        self.wr.flush().await.map_err(ZmtpError::io)
    }

    /// Bytes the decoder holds right now.
    #[cfg(test)]
    pub(crate) fn held_bytes(&self) -> usize {
        self.dec.held_bytes() + self.out.capacity()
    }
}

fn peer_error(body: &[u8]) -> ZmtpError {
    // ERROR = reason length (1 byte) + reason.
    let reason = body.get(1..).unwrap_or_default();
    let reason = &reason[..reason.len().min(255)];
    ZmtpError::PeerError(String::from_utf8_lossy(reason).into_owned())
}
