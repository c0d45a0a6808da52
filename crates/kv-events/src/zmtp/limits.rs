//! What a peer may send: the bounds every frame and message is checked against, on its *declared*
//! length, before memory is reserved for it. Shared by the codec (which enforces them) and the socket
//! (which times the handshake).

use std::time::Duration;

/// Bounds on what a peer may send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Largest body of one frame.
    pub max_frame_bytes: usize,
    /// Largest sum of frame bodies of one multi-part message.
    pub max_message_bytes: usize,
    /// Most frames in one message.
    pub max_frames: usize,
    /// Largest command frame (READY, PING, ERROR, …).
    pub max_command_bytes: usize,
    /// Time allowed for the greeting and READY exchange.
    pub handshake_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame_bytes: 16 << 20,
            max_message_bytes: 16 << 20,
            max_frames: 8,
            max_command_bytes: 4096,
            handshake_timeout: Duration::from_secs(2),
        }
    }
}
