//! `data:image/…;base64,…` URLs: header validation, the decoded length computed from the encoded
//! text *before* anything is allocated, and a chunked decoder so the caller can hash and keep only a
//! prefix instead of materialising the whole image.
//!
//! Decoding is lenient the way vLLM's is: ASCII whitespace is ignored, the standard and URL-safe
//! alphabets are both accepted, and padding is optional.

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;

use crate::media::error::MediaError;

/// Encoded characters decoded per chunk (a multiple of 4, so chunks need no padding). Each chunk
/// decodes to 48 KiB: whole 1 KiB BLAKE3 chunks, 16 at a time, which keeps the hasher on its wide
/// SIMD path (3 KiB pieces sent it down the one-chunk-at-a-time path: a quarter of the router's CPU
/// on image requests).
const CHUNK_CHARS: usize = 65_536;
const CHUNK_BYTES: usize = CHUNK_CHARS / 4 * 3;

/// The clean (common) case: SIMD check and decode.
const SIMD: base64_simd::Base64 = base64_simd::STANDARD_NO_PAD;

/// The lenient (rare) case: whitespace and URL-safe characters mapped first, then this scalar decoder,
/// which also accepts non-zero trailing bits.
const ENGINE: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

/// A validated data URL: where its payload is and how many bytes it decodes to.
#[derive(Debug)]
pub(crate) struct DataUrl<'a> {
    payload: &'a str,
    pub(crate) decoded_len: usize,
    /// The payload is plain standard base64 (no whitespace, no URL-safe characters): the common case,
    /// decoded straight from the text without a per-character pass.
    clean: bool,
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0c)
}

/// Checks the `data:` header and computes the decoded length without decoding or allocating.
pub(crate) fn parse(url: &str) -> Result<DataUrl<'_>, MediaError> {
    parse_as(url, "image")
}

/// The media type of a `data:` URL (`video/mp4`, `image/png`, …), lower-cased; `None` if it has none.
pub(crate) fn media_type(url: &str) -> Option<String> {
    let rest = url.get(..5).filter(|s| s.eq_ignore_ascii_case("data:")).map(|_| &url[5..])?;
    let meta = &rest[..rest.find(',')?];
    Some(meta.split(';').next().unwrap_or("").trim().to_ascii_lowercase())
}

/// [`parse`] for a data URL whose media type is `top/…` (`image` or `video`).
pub(crate) fn parse_as<'u>(url: &'u str, top: &str) -> Result<DataUrl<'u>, MediaError> {
    let invalid = |why: &str| MediaError::InvalidDataUrl(why.to_string());
    let rest = match url.get(..5) {
        Some(scheme) if scheme.eq_ignore_ascii_case("data:") => &url[5..],
        _ => return Err(invalid("does not start with 'data:'")),
    };
    let comma = rest.find(',').ok_or_else(|| invalid("no ',' before the payload"))?;
    let (meta, payload) = (&rest[..comma], &rest[comma + 1..]);
    let mut params = meta.split(';');
    let mime = params.next().unwrap_or("").trim();
    let is_top = mime.split_once('/').is_some_and(|(t, sub)| t.eq_ignore_ascii_case(top) && !sub.is_empty());
    if !is_top {
        return Err(MediaError::InvalidDataUrl(format!("media type '{mime}' is not {top}/*")));
    }
    if !params.next_back().is_some_and(|p| p.trim().eq_ignore_ascii_case("base64")) {
        return Err(invalid("only ';base64' payloads are supported"));
    }

    // Fast path: plain standard base64 with at most two trailing '=' (checked with SIMD).
    let body = payload.trim_end_matches('=');
    if payload.len() - body.len() <= 2 && SIMD.check(body.as_bytes()).is_ok() {
        return Ok(DataUrl { payload: body, decoded_len: decoded_len(body.len())?, clean: true });
    }

    // One pass over the bytes: count the significant characters and check that '=' only trails.
    let mut chars = 0usize;
    let mut in_padding = false;
    for &b in payload.as_bytes() {
        if is_ws(b) {
            continue;
        }
        if b == b'=' {
            in_padding = true;
        } else if in_padding {
            return Err(invalid("'=' padding before the end of the payload"));
        } else {
            chars += 1;
        }
    }
    Ok(DataUrl { payload, decoded_len: decoded_len(chars)?, clean: false })
}

/// Bytes that `chars` significant base64 characters decode to.
fn decoded_len(chars: usize) -> Result<usize, MediaError> {
    let invalid = |why: &str| MediaError::InvalidDataUrl(why.to_string());
    let len = match chars % 4 {
        0 => chars / 4 * 3,
        2 => chars / 4 * 3 + 1,
        3 => chars / 4 * 3 + 2,
        _ => return Err(invalid("base64 payload length is impossible (4n+1 characters)")),
    };
    if len == 0 {
        return Err(invalid("empty payload"));
    }
    Ok(len)
}

impl DataUrl<'_> {
    /// Decodes the payload in chunks of at most 48 KiB, handing each to `sink` in order.
    pub(crate) fn decode_chunks(
        &self,
        mut sink: impl FnMut(&[u8]) -> Result<(), MediaError>,
    ) -> Result<(), MediaError> {
        let bad = |e: &dyn std::fmt::Display| MediaError::InvalidDataUrl(format!("bad base64: {e}"));
        // `decode_slice` wants room for its estimate, up to 2 bytes over the exact length.
        let mut out = vec![0u8; CHUNK_BYTES.min(self.decoded_len + 2)];
        if self.clean {
            for chunk in self.payload.as_bytes().chunks(CHUNK_CHARS) {
                let decoded = SIMD.decode(chunk, base64_simd::Out::from_slice(&mut out)).map_err(|e| bad(&e))?;
                sink(decoded)?;
            }
            return Ok(());
        }
        let mut chars = vec![0u8; CHUNK_CHARS.min(self.payload.len())];
        let mut flush = |chars: &[u8]| -> Result<(), MediaError> {
            let n = ENGINE.decode_slice(chars, &mut out).map_err(|e| bad(&e))?;
            sink(&out[..n])
        };
        let mut filled = 0usize;
        for &b in self.payload.as_bytes() {
            if is_ws(b) {
                continue;
            }
            if b == b'=' {
                break; // `parse` checked that only padding and whitespace follow
            }
            // The URL-safe alphabet maps onto the standard one.
            chars[filled] = match b {
                b'-' => b'+',
                b'_' => b'/',
                other => other,
            };
            filled += 1;
            if filled == chars.len() {
                flush(&chars)?;
                filled = 0;
            }
        }
        if filled > 0 {
            flush(&chars[..filled])?;
        }
        Ok(())
    }
}

/// Decodes a `data:image/…;base64,…` URL, refusing (before allocating) payloads that decode to more
/// than `max_bytes`.
pub fn decode_data_url(url: &str, max_bytes: usize) -> Result<Vec<u8>, MediaError> {
    decode_parsed(parse(url)?, max_bytes)
}

/// A parsed data URL's payload, whole (refused over `max_bytes` before anything is allocated).
pub(crate) fn decode_parsed(parsed: DataUrl<'_>, max_bytes: usize) -> Result<Vec<u8>, MediaError> {
    if parsed.decoded_len > max_bytes {
        return Err(MediaError::ImageTooLarge { size: parsed.decoded_len as u64, limit: max_bytes });
    }
    if parsed.clean {
        // Straight into a buffer of the exact size: no chunk buffer on top of the image.
        let bytes =
            SIMD.decode_to_vec(parsed.payload).map_err(|e| MediaError::InvalidDataUrl(format!("bad base64: {e}")))?;
        debug_assert_eq!(bytes.len(), parsed.decoded_len);
        return Ok(bytes);
    }
    let mut bytes = Vec::with_capacity(parsed.decoded_len);
    parsed.decode_chunks(|chunk| {
        bytes.extend_from_slice(chunk);
        Ok(())
    })?;
    debug_assert_eq!(bytes.len(), parsed.decoded_len);
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};

    fn sample(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[test]
    fn standard_urlsafe_unpadded_and_wrapped_all_decode() {
        for len in [1, 2, 3, 4, 5, 3071, 3072, 3073, 10_000, 49_151, 49_152, 49_153, 150_000] {
            let raw = sample(len);
            let std = STANDARD.encode(&raw);
            let safe = URL_SAFE_NO_PAD.encode(&raw);
            let wrapped: String =
                std.as_bytes().chunks(76).map(|c| std::str::from_utf8(c).unwrap()).collect::<Vec<_>>().join("\r\n");
            for payload in [&std, &safe, &wrapped, &format!(" {std}\n")] {
                let url = format!("data:image/png;base64,{payload}");
                assert_eq!(decode_data_url(&url, len).unwrap(), raw, "len {len}");
            }
        }
    }

    #[test]
    fn non_zero_trailing_bits_are_accepted_as_vllm_does() {
        // 'B' leaves the bits 0001 after the first byte: a strict decoder refuses, Python's does not.
        assert_eq!(decode_data_url("data:image/png;base64,AB", 8).unwrap(), vec![0]);
        assert_eq!(decode_data_url("data:image/png;base64,AB==", 8).unwrap(), vec![0]);
        assert_eq!(decode_data_url("data:image/png;base64,AAB", 8).unwrap(), vec![0, 0]);
    }

    #[test]
    fn decoded_length_is_exact_and_checked_before_decoding() {
        let raw = sample(1000);
        let url = format!("data:image/jpeg;base64,{}", STANDARD.encode(&raw));
        assert_eq!(parse(&url).unwrap().decoded_len, 1000);
        let err = decode_data_url(&url, 999).unwrap_err();
        assert!(matches!(err, MediaError::ImageTooLarge { size: 1000, limit: 999 }));
        // Over the limit wins over invalid characters: nothing was decoded.
        let junk = format!("data:image/png;base64,{}", "!".repeat(4000));
        assert_eq!(decode_data_url(&junk, 100).unwrap_err().label(), "too_large");
    }

    #[test]
    fn rejects_bad_headers_and_payloads() {
        for url in [
            "data:text/plain;base64,QUJD",
            "data:;base64,QUJD",
            "data:image/png,QUJD",
            "data:image/png;base64",
            "data:image/png;base64,",
            "data:image/png;base64,QUJD!",
            "data:image/png;base64,QU=JD",
            "data:image/png;base64,QUJDR",
            "http://x/",
            "da",
        ] {
            let err = decode_data_url(url, 1 << 20).unwrap_err();
            assert_eq!(err.label(), "invalid_data_url", "{url}");
        }
        assert!(decode_data_url("DATA:IMAGE/PNG;BASE64,QUJD", 16).is_ok());
    }
}
