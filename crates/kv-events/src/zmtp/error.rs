//! Why a ZMTP connection ended or could not be set up, each reason with its snake_case metric label and
//! whether it was the peer's fault (a protocol or limit violation).

/// Why a ZMTP connection ended or could not be set up.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ZmtpError {
    /// The endpoint could not be reached (or is not `tcp://` / `ipc://`).
    #[error("cannot connect: {0}")]
    Connect(String),
    /// The connection attempt took longer than the connect timeout.
    #[error("connect timed out")]
    ConnectTimeout,
    /// Reading or writing failed.
    #[error("i/o error: {0}")]
    Io(String),
    /// The peer closed the connection.
    #[error("connection closed by the peer")]
    Closed,
    /// The peer's greeting is not a ZMTP 3 greeting with the NULL mechanism.
    #[error("bad ZMTP greeting: {0}")]
    BadGreeting(&'static str),
    /// The READY exchange failed (wrong command, incompatible socket type, bad metadata).
    #[error("bad ZMTP handshake: {0}")]
    BadHandshake(&'static str),
    /// Greeting and READY did not complete within the handshake timeout.
    #[error("ZMTP handshake timed out")]
    HandshakeTimeout,
    /// A frame header is invalid (reserved bits, command inside a multi-part message).
    #[error("bad ZMTP frame: {0}")]
    BadFrame(&'static str),
    /// A frame declared more bytes than the frame limit.
    #[error("frame of {0} bytes exceeds the limit")]
    FrameTooLarge(u64),
    /// A multi-part message declared more bytes than the message limit.
    #[error("message of at least {0} bytes exceeds the limit")]
    MessageTooLarge(u64),
    /// A multi-part message has more frames than the limit.
    #[error("message with at least {0} frames exceeds the limit")]
    TooManyFrames(usize),
    /// A command frame declared more bytes than the command limit.
    #[error("command of {0} bytes exceeds the limit")]
    CommandTooLarge(u64),
    /// A frame within the limits could not be allocated.
    #[error("cannot allocate {0} bytes for a frame")]
    OutOfMemory(usize),
    /// The peer sent an ERROR command.
    #[error("peer sent ERROR: {0}")]
    PeerError(String),
}

impl ZmtpError {
    /// Snake_case label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            ZmtpError::Connect(_) => "connect",
            ZmtpError::ConnectTimeout => "connect_timeout",
            ZmtpError::Io(_) => "io",
            ZmtpError::Closed => "closed",
            ZmtpError::BadGreeting(_) => "bad_greeting",
            ZmtpError::BadHandshake(_) => "bad_handshake",
            ZmtpError::HandshakeTimeout => "handshake_timeout",
            ZmtpError::BadFrame(_) => "bad_frame",
            ZmtpError::FrameTooLarge(_) => "frame_too_large",
            ZmtpError::MessageTooLarge(_) => "message_too_large",
            ZmtpError::TooManyFrames(_) => "too_many_frames",
            ZmtpError::CommandTooLarge(_) => "command_too_large",
            ZmtpError::OutOfMemory(_) => "out_of_memory",
            ZmtpError::PeerError(_) => "peer_error",
        }
    }

    /// Whether the peer broke the protocol or a limit (as opposed to a network failure or an orderly
    /// close). Such a peer is retried only after a penalty backoff.
    pub fn is_violation(&self) -> bool {
        !matches!(self, ZmtpError::Connect(_) | ZmtpError::ConnectTimeout | ZmtpError::Io(_) | ZmtpError::Closed)
    }

    pub(super) fn io(e: std::io::Error) -> Self {
        ZmtpError::Io(e.to_string())
    }
}
