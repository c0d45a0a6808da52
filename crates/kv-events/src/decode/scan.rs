//! A cheap pre-pass over a msgpack payload, before rmpv builds any value.
//!
//! rmpv does not preallocate from length headers (checked in rmpv 1.3's `decode/value_ref.rs`), but it
//! does build one `ValueRef` per element, so a 16 MiB payload of one-byte elements would become hundreds
//! of MiB of values. This pass walks the headers without allocating and refuses a payload whose declared
//! lengths exceed the bytes that remain (each value takes at least one byte) or that holds more than
//! `max_values` values.

use super::DecodeError;

fn truncated() -> DecodeError {
    DecodeError::NotMsgpack("declared length exceeds the payload".into())
}

/// Checks the declared lengths of the first msgpack value in `buf` (trailing bytes are left to the
/// decoder).
pub(super) fn check(buf: &[u8], max_values: usize) -> Result<(), DecodeError> {
    let mut pos = 0usize;
    let mut pending = 1usize; // values still to read
    let mut values = 0usize;
    while pending > 0 {
        pending -= 1;
        values += 1;
        if values > max_values {
            return Err(DecodeError::TooManyValues);
        }
        let (skip, children) = header(buf, pos)?;
        pos = pos.checked_add(skip).filter(|&p| p <= buf.len()).ok_or_else(truncated)?;
        pending = pending.checked_add(children).ok_or_else(truncated)?;
        if pending > buf.len() - pos {
            return Err(truncated());
        }
    }
    Ok(())
}

/// `(bytes to skip including the body of a str/bin/ext, child values)` of the value at `pos`.
fn header(buf: &[u8], pos: usize) -> Result<(usize, usize), DecodeError> {
    let marker = *buf.get(pos).ok_or_else(truncated)?;
    let len = |width: usize| -> Result<usize, DecodeError> {
        let bytes = buf.get(pos + 1..pos + 1 + width).ok_or_else(truncated)?;
        Ok(bytes.iter().fold(0usize, |acc, &b| (acc << 8) | usize::from(b)))
    };
    Ok(match marker {
        // 0xc1 is "never used"; rmpv reads it as a one-byte value and the decoder refuses it later.
        0x00..=0x7f | 0xe0..=0xff | 0xc0..=0xc3 => (1, 0),
        0x80..=0x8f => (1, 2 * usize::from(marker & 0x0f)),
        0x90..=0x9f => (1, usize::from(marker & 0x0f)),
        0xa0..=0xbf => (1 + usize::from(marker & 0x1f), 0),
        0xc4 | 0xd9 => (2 + len(1)?, 0),
        0xc5 | 0xda => (3 + len(2)?, 0),
        0xc6 | 0xdb => (5 + len(4)?, 0),
        0xc7 => (3 + len(1)?, 0),
        0xc8 => (4 + len(2)?, 0),
        0xc9 => (6 + len(4)?, 0),
        0xca | 0xce | 0xd2 => (5, 0),
        0xcb | 0xcf | 0xd3 => (9, 0),
        0xcc | 0xd0 => (2, 0),
        0xcd | 0xd1 => (3, 0),
        0xd4 => (3, 0),
        0xd5 => (4, 0),
        0xd6 => (6, 0),
        0xd7 => (10, 0),
        0xd8 => (18, 0),
        0xdc => (3, len(2)?),
        0xdd => (5, len(4)?),
        0xde => (3, len(2)?.checked_mul(2).ok_or_else(truncated)?),
        0xdf => (5, len(4)?.checked_mul(2).ok_or_else(truncated)?),
    })
}
