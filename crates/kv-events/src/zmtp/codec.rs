//! Sans-IO ZMTP 3.x decoder and encoders.
//!
//! The [`Decoder`] owns every byte read from the peer. The caller reads into [`Decoder::read_buf`]
//! (never more than that slice), reports the count with [`Decoder::filled`] and pulls [`Item`]s with
//! [`Decoder::next_item`]. Each frame header is checked against the [`Limits`] *before* any memory is
//! reserved for its body, so what the decoder holds is bounded by
//! `READ_CHUNK + max_message_bytes` whatever the peer sends.

use bytes::Bytes;

use super::error::ZmtpError;
use super::limits::Limits;

/// Size of the fixed input buffer: headers, greeting, commands and small frames pass through it.
pub(crate) const READ_CHUNK: usize = 8 * 1024;
/// Frames larger than this get their own exactly-sized buffer instead of going through the input buffer.
const SMALL_FRAME: usize = READ_CHUNK / 2;
/// Length of the ZMTP 3 greeting.
pub(crate) const GREETING_LEN: usize = 64;

const FLAG_MORE: u8 = 0x01;
const FLAG_LONG: u8 = 0x02;
const FLAG_COMMAND: u8 = 0x04;
const FLAG_RESERVED: u8 = !(FLAG_MORE | FLAG_LONG | FLAG_COMMAND);

/// What the peer's greeting announced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Greeting {
    pub major: u8,
    pub minor: u8,
}

/// One decoded unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Item {
    /// The peer's greeting (always the first item).
    Greeting(Greeting),
    /// A command frame: name and body.
    Command { name: Bytes, body: Bytes },
    /// A complete multi-part message.
    Message(Vec<Bytes>),
}

/// A frame body larger than [`SMALL_FRAME`], read straight into its own buffer.
struct Body {
    data: Vec<u8>,
    filled: usize,
    more: bool,
    command: bool,
}

/// Incremental, bounded ZMTP decoder (see the module docs).
pub(crate) struct Decoder {
    limits: Limits,
    input: Box<[u8]>,
    start: usize,
    end: usize,
    greeted: bool,
    body: Option<Body>,
    frames: Vec<Bytes>,
    message_bytes: usize,
}

impl Decoder {
    pub(crate) fn new(limits: Limits) -> Self {
        Decoder {
            limits,
            input: vec![0; READ_CHUNK].into_boxed_slice(),
            start: 0,
            end: 0,
            greeted: false,
            body: None,
            frames: Vec::new(),
            message_bytes: 0,
        }
    }

    /// Where the next read must go. Non-empty whenever [`Decoder::next_item`] returned `Ok(None)`.
    pub(crate) fn read_buf(&mut self) -> &mut [u8] {
        if let Some(body) = &mut self.body {
            return &mut body.data[body.filled..];
        }
        if self.end == self.input.len() {
            // Compact: what is left is less than one header or small frame, far below the buffer size.
            self.input.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        &mut self.input[self.end..]
    }

    /// `n` bytes were written at the start of the last [`Decoder::read_buf`].
    pub(crate) fn filled(&mut self, n: usize) {
        match &mut self.body {
            Some(body) => body.filled = (body.filled + n).min(body.data.len()),
            None => self.end = (self.end + n).min(self.input.len()),
        }
    }

    /// Bytes this decoder currently holds (allocated), for tests and for bounding assertions.
    #[cfg(test)]
    pub(crate) fn held_bytes(&self) -> usize {
        let body = self.body.as_ref().map_or(0, |b| b.data.capacity());
        let frames: usize = self.frames.iter().map(Bytes::len).sum();
        self.input.len() + body + frames + self.frames.capacity() * std::mem::size_of::<Bytes>()
    }

    /// The next complete item, `Ok(None)` when more input is needed.
    pub(crate) fn next_item(&mut self) -> Result<Option<Item>, ZmtpError> {
        if !self.greeted {
            return self.greeting();
        }
        loop {
            if let Some(body) = &self.body {
                if body.filled < body.data.len() {
                    return Ok(None);
                }
                let body = self.body.take().expect("checked above");
                let data = Bytes::from(body.data);
                if let Some(item) = self.frame_done(body.more, body.command, data) {
                    return Ok(Some(item));
                }
                continue;
            }
            let Some((flags, len, header_len)) = self.header()? else { return Ok(None) };
            let command = flags & FLAG_COMMAND != 0;
            let more = flags & FLAG_MORE != 0;
            self.check_frame(command, more, len)?;
            let len = len as usize; // within the limits, so it fits
            if len > SMALL_FRAME {
                self.start_body(header_len, len, more, command)?;
                continue;
            }
            if self.end - self.start < header_len + len {
                return Ok(None);
            }
            let from = self.start + header_len;
            let data = Bytes::copy_from_slice(&self.input[from..from + len]);
            self.start = from + len;
            if !command {
                self.message_bytes += len;
            }
            if let Some(item) = self.frame_done(more, command, data) {
                return Ok(Some(item));
            }
        }
    }

    fn greeting(&mut self) -> Result<Option<Item>, ZmtpError> {
        let avail = &self.input[self.start..self.end];
        // Judge the signature as soon as it is there: a non-ZMTP peer is dropped without waiting.
        if avail.first().is_some_and(|&b| b != 0xFF) || avail.get(9).is_some_and(|&b| b & 0x01 == 0) {
            return Err(ZmtpError::BadGreeting("bad signature"));
        }
        if avail.len() < GREETING_LEN {
            return Ok(None);
        }
        let g = parse_greeting(&avail[..GREETING_LEN])?;
        self.start += GREETING_LEN;
        self.greeted = true;
        Ok(Some(Item::Greeting(g)))
    }

    /// Parses the frame header at `start`: `(flags, body length, header length)`.
    fn header(&self) -> Result<Option<(u8, u64, usize)>, ZmtpError> {
        let avail = &self.input[self.start..self.end];
        let Some(&flags) = avail.first() else { return Ok(None) };
        if flags & FLAG_RESERVED != 0 {
            return Err(ZmtpError::BadFrame("reserved flag bits set"));
        }
        if flags & FLAG_LONG == 0 {
            return Ok(avail.get(1).map(|&len| (flags, u64::from(len), 2)));
        }
        let Some(len) = avail.get(1..9) else { return Ok(None) };
        Ok(Some((flags, u64::from_be_bytes(len.try_into().expect("8 bytes")), 9)))
    }

    /// Every limit, checked on the declared length before anything is reserved for it.
    fn check_frame(&self, command: bool, more: bool, len: u64) -> Result<(), ZmtpError> {
        let limits = &self.limits;
        if command {
            if more || !self.frames.is_empty() {
                return Err(ZmtpError::BadFrame("command inside a multi-part message"));
            }
            if len > limits.max_command_bytes as u64 {
                return Err(ZmtpError::CommandTooLarge(len));
            }
            return Ok(());
        }
        if len > limits.max_frame_bytes as u64 {
            return Err(ZmtpError::FrameTooLarge(len));
        }
        if self.frames.len() >= limits.max_frames {
            return Err(ZmtpError::TooManyFrames(self.frames.len() + 1));
        }
        let total = self.message_bytes as u64 + len;
        if total > limits.max_message_bytes as u64 {
            return Err(ZmtpError::MessageTooLarge(total));
        }
        Ok(())
    }

    /// Switches to reading a large body into a buffer of exactly `len` bytes.
    fn start_body(&mut self, header_len: usize, len: usize, more: bool, command: bool) -> Result<(), ZmtpError> {
        let mut data = Vec::new();
        data.try_reserve_exact(len).map_err(|_| ZmtpError::OutOfMemory(len))?;
        data.resize(len, 0);
        self.start += header_len;
        let take = (self.end - self.start).min(len);
        data[..take].copy_from_slice(&self.input[self.start..self.start + take]);
        self.start += take;
        if !command {
            self.message_bytes += len;
        }
        self.body = Some(Body { data, filled: take, more, command });
        Ok(())
    }

    /// A whole frame was read; returns an item when it completes a command or a message.
    fn frame_done(&mut self, more: bool, command: bool, data: Bytes) -> Option<Item> {
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        }
        if command {
            return Some(split_command(data));
        }
        self.frames.push(data);
        if more {
            return None;
        }
        self.message_bytes = 0;
        Some(Item::Message(std::mem::take(&mut self.frames)))
    }
}

/// Splits a command body into name and data. A name longer than the body leaves the name truncated,
/// which no command matches.
fn split_command(data: Bytes) -> Item {
    let name_len = data.first().map_or(0, |&n| usize::from(n));
    let name_end = (1 + name_len).min(data.len());
    let name = data.slice(1.min(data.len())..name_end);
    Item::Command { name, body: data.slice(name_end..) }
}

fn parse_greeting(g: &[u8]) -> Result<Greeting, ZmtpError> {
    let (major, minor) = (g[10], g[11]);
    // Only ZMTP 3.x: 1.0/2.0 peers would need a different framing, and no engine speaks them.
    if major < 3 {
        return Err(ZmtpError::BadGreeting("ZMTP version below 3"));
    }
    let mechanism = &g[12..32];
    if &mechanism[..4] != b"NULL" || mechanism[4..].iter().any(|&b| b != 0) {
        return Err(ZmtpError::BadGreeting("security mechanism is not NULL"));
    }
    Ok(Greeting { major, minor })
}

/// Our greeting: ZMTP 3.0, NULL mechanism, as-server 0.
///
/// We announce 3.0 on purpose: a 3.1 peer then falls back to 3.0 behaviour for us (libzmq picks its
/// encoder per peer version), so subscriptions travel as `0x01 + topic` messages, which every PUB and XPUB
/// (libzmq 4.x, the `zeromq` crate) accepts.
pub(crate) fn greeting() -> [u8; GREETING_LEN] {
    let mut g = [0u8; GREETING_LEN];
    g[0] = 0xFF;
    g[9] = 0x7F;
    g[10] = 3;
    g[11] = 0;
    g[12..16].copy_from_slice(b"NULL");
    g
}

/// Appends one frame (header + body) to `out`.
pub(crate) fn encode_frame(out: &mut Vec<u8>, data: &[u8], more: bool, command: bool) {
    let mut flags = if more { FLAG_MORE } else { 0 };
    if command {
        flags |= FLAG_COMMAND;
    }
    match u8::try_from(data.len()) {
        Ok(len) => out.extend_from_slice(&[flags, len]),
        Err(_) => {
            out.push(flags | FLAG_LONG);
            out.extend_from_slice(&(data.len() as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(data);
}

/// Appends a command frame `name` + `body`.
pub(crate) fn encode_command(out: &mut Vec<u8>, name: &[u8], body: &[u8]) {
    let mut data = Vec::with_capacity(1 + name.len() + body.len());
    data.push(name.len() as u8);
    data.extend_from_slice(name);
    data.extend_from_slice(body);
    encode_frame(out, &data, false, true);
}

/// Appends a multi-part message.
pub(crate) fn encode_message(out: &mut Vec<u8>, frames: &[&[u8]]) {
    for (i, frame) in frames.iter().enumerate() {
        encode_frame(out, frame, i + 1 < frames.len(), false);
    }
}

/// READY metadata: `(name, value)` properties, each `name-len(1) name value-len(4, BE) value`.
pub(crate) fn ready_body(props: &[(&str, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    for (name, value) in props {
        body.push(name.len() as u8);
        body.extend_from_slice(name.as_bytes());
        body.extend_from_slice(&(value.len() as u32).to_be_bytes());
        body.extend_from_slice(value);
    }
    body
}

/// Finds property `name` (case-insensitive, as the spec says) in READY metadata.
pub(crate) fn ready_property<'a>(mut body: &'a [u8], name: &str) -> Result<Option<&'a [u8]>, ZmtpError> {
    const BAD: ZmtpError = ZmtpError::BadHandshake("malformed READY metadata");
    while let Some((&name_len, rest)) = body.split_first() {
        let (key, rest) = rest.split_at_checked(usize::from(name_len)).ok_or(BAD)?;
        let (len, rest) = rest.split_at_checked(4).ok_or(BAD)?;
        let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
        let (value, rest) = rest.split_at_checked(len).ok_or(BAD)?;
        if key.eq_ignore_ascii_case(name.as_bytes()) {
            return Ok(Some(value));
        }
        body = rest;
    }
    Ok(None)
}
