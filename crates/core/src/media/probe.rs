//! Width × height of an image: from the header with `imagesize` (works on a prefix; microseconds),
//! and only when the header cannot tell, a decode with `image` under `Limits`. The pixel cap is
//! applied to the header's claim before anything is decoded, so a tiny file claiming
//! 100000×100000 is refused without allocating it.

use std::io::Cursor;

use image::{ImageDecoder, ImageFormat, ImageReader, Limits};

use crate::media::config::{MediaConfig, Orientation};
use crate::media::error::MediaError;

/// Bytes of a prefix worth probing: JPEG EXIF/ICC segments before SOF can each be up to 64 KiB.
pub(crate) const HEADER_PROBE_BYTES: usize = 64 * 1024;

/// Bounds of the fallback decoder's working memory.
const MIN_DECODE_ALLOC: u64 = 64 * 1024 * 1024;
const MAX_DECODE_ALLOC: u64 = 512 * 1024 * 1024;

/// The formats we accept, as (label, `image` format).
fn supported(kind: imagesize::ImageType) -> Option<(&'static str, ImageFormat)> {
    use imagesize::ImageType as T;
    Some(match kind {
        T::Jpeg => ("jpeg", ImageFormat::Jpeg),
        T::Png => ("png", ImageFormat::Png),
        T::Gif => ("gif", ImageFormat::Gif),
        T::Webp => ("webp", ImageFormat::WebP),
        T::Bmp => ("bmp", ImageFormat::Bmp),
        _ => return None,
    })
}

/// The format of `bytes`, or `None` while the prefix is too short to tell.
fn format_of(bytes: &[u8]) -> Result<Option<(&'static str, ImageFormat)>, MediaError> {
    match imagesize::image_type(bytes) {
        Ok(kind) => {
            supported(kind).map(Some).ok_or_else(|| MediaError::UnsupportedFormat(format!("{kind:?}").to_lowercase()))
        }
        Err(imagesize::ImageError::IoError(_)) => Ok(None),
        Err(_) => Err(MediaError::UnsupportedFormat("not JPEG, PNG, GIF, WebP or BMP".to_string())),
    }
}

/// Refuses zero sizes and headers over `max_pixels` (either side alone or the product).
fn check_dims(width: u64, height: u64, cfg: &MediaConfig) -> Result<(u32, u32), MediaError> {
    if width == 0 || height == 0 {
        return Err(MediaError::ProbeFailed(format!("header claims {width}x{height}")));
    }
    let too_many = || MediaError::TooManyPixels { width, height, limit: cfg.max_pixels };
    match width.checked_mul(height) {
        Some(pixels) if pixels <= cfg.max_pixels => {}
        _ => return Err(too_many()),
    }
    match (u32::try_from(width), u32::try_from(height)) {
        (Ok(w), Ok(h)) => Ok((w, h)),
        _ => Err(too_many()),
    }
}

/// A header probe on a (possibly partial) buffer: `Ok(None)` means "read more".
/// Stored dimensions; format and pixel cap already enforced.
pub(crate) fn probe_header(bytes: &[u8], cfg: &MediaConfig) -> Result<Option<(u32, u32, &'static str)>, MediaError> {
    let Some((label, format)) = format_of(bytes)? else {
        return Ok(None);
    };
    if format == ImageFormat::Bmp {
        // A BMP header does not say whether the engines' loader (Pillow) can open the file: it refuses
        // compressions the header happily declares (embedded JPEG/PNG, some RLE and bitfield layouts).
        // Counting it would route a request the worker answers with 400, so BMPs are decoded.
        return Ok(None);
    }
    match imagesize::blob_size(bytes) {
        Ok(size) => {
            let (w, h) = check_dims(size.width as u64, size.height as u64, cfg)?;
            Ok(Some((w, h, label)))
        }
        // Too short, or a layout imagesize does not follow: the decoder decides.
        Err(_) => Ok(None),
    }
}

/// Probes a complete image: header first, a limited decode only if the header cannot tell,
/// then the orientation policy.
pub fn probe_bytes(bytes: &[u8], cfg: &MediaConfig) -> Result<(u32, u32, &'static str), MediaError> {
    let (label, format) = format_of(bytes)?
        .ok_or_else(|| MediaError::ProbeFailed(format!("{} bytes is too short for an image", bytes.len())))?;
    let (w, h) = match probe_header(bytes, cfg)? {
        Some((w, h, _)) => (w, h),
        None => decode_dims(bytes, format, cfg)?,
    };
    if cfg.orientation == Orientation::Exif && swaps_axes(bytes, format, cfg) {
        return Ok((h, w, label));
    }
    Ok((w, h, label))
}

fn limits(cfg: &MediaConfig) -> Limits {
    let side = u32::try_from(cfg.max_pixels).unwrap_or(u32::MAX);
    let mut limits = Limits::default();
    limits.max_image_width = Some(side);
    limits.max_image_height = Some(side);
    limits.max_alloc = Some(cfg.max_pixels.saturating_mul(4).clamp(MIN_DECODE_ALLOC, MAX_DECODE_ALLOC));
    limits
}

fn decode_error(e: image::ImageError) -> MediaError {
    match e {
        image::ImageError::Limits(l) => MediaError::DecodeLimit(l.to_string()),
        other => MediaError::DecodeFailed(other.to_string()),
    }
}

/// Full decode under `Limits`; the header's claim is checked before any pixel is decoded.
fn decode_dims(bytes: &[u8], format: ImageFormat, cfg: &MediaConfig) -> Result<(u32, u32), MediaError> {
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    reader.limits(limits(cfg));
    let decoder = reader.into_decoder().map_err(decode_error)?;
    let (w, h) = decoder.dimensions();
    check_dims(u64::from(w), u64::from(h), cfg)?;
    let img = image::DynamicImage::from_decoder(decoder).map_err(decode_error)?;
    Ok((img.width(), img.height()))
}

/// True when `bytes` (an image, or its first bytes) carry an EXIF orientation that transposes it.
pub(crate) fn transposes(bytes: &[u8], cfg: &MediaConfig) -> bool {
    match format_of(bytes) {
        Ok(Some((_, format))) => swaps_axes(bytes, format, cfg),
        _ => false,
    }
}

/// True when the EXIF orientation is one of the four that transpose the image (5–8).
fn swaps_axes(bytes: &[u8], format: ImageFormat, cfg: &MediaConfig) -> bool {
    use image::metadata::Orientation as O;
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    reader.limits(limits(cfg));
    let orientation = reader.into_decoder().and_then(|mut d| d.orientation());
    match orientation {
        Ok(o) => matches!(o, O::Rotate90 | O::Rotate270 | O::Rotate90FlipH | O::Rotate270FlipH),
        Err(e) => {
            // Dimensions are known; an unreadable EXIF block just means "as stored".
            tracing::debug!(error = %e, "could not read EXIF orientation");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png_header(w: u32, h: u32) -> Vec<u8> {
        let mut v = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
        v.extend_from_slice(&w.to_be_bytes());
        v.extend_from_slice(&h.to_be_bytes());
        v.extend_from_slice(&[8, 6, 0, 0, 0, 0, 0, 0, 0]);
        v
    }

    /// A 2×2 24-bit BMP; `compression` 0 is plain RGB, 4 declares embedded JPEG data.
    fn bmp(compression: u32) -> Vec<u8> {
        let mut v = b"BM".to_vec();
        let le = |v: &mut Vec<u8>, n: u32| v.extend_from_slice(&n.to_le_bytes());
        le(&mut v, 54 + 16); // file size
        le(&mut v, 0);
        le(&mut v, 54); // pixel data offset
        le(&mut v, 40); // BITMAPINFOHEADER
        le(&mut v, 2);
        le(&mut v, 2);
        v.extend_from_slice(&1u16.to_le_bytes()); // planes
        v.extend_from_slice(&24u16.to_le_bytes()); // bits per pixel
        le(&mut v, compression);
        le(&mut v, 16);
        for _ in 0..4 {
            le(&mut v, 0);
        }
        v.extend_from_slice(&[0x20; 16]); // two rows of 2 pixels, padded to 4 bytes
        v
    }

    #[test]
    fn bmps_are_counted_only_when_they_decode() {
        let cfg = MediaConfig::default();
        assert_eq!(probe_bytes(&bmp(0), &cfg).unwrap(), (2, 2, "bmp"));
        // The header claims 2×2 either way; only decoding tells that the engine cannot open it.
        assert_eq!(imagesize::blob_size(&bmp(4)).map(|s| (s.width, s.height)).unwrap(), (2, 2));
        assert_eq!(probe_header(&bmp(4), &cfg).unwrap(), None);
        assert_eq!(probe_bytes(&bmp(4), &cfg).unwrap_err().label(), "decode_failed");
    }

    #[test]
    fn prefix_too_short_asks_for_more() {
        let cfg = MediaConfig::default();
        let png = png_header(3, 5);
        assert_eq!(probe_header(&png[..10], &cfg).unwrap(), None);
        assert_eq!(probe_header(&png, &cfg).unwrap(), Some((3, 5, "png")));
    }

    #[test]
    fn zero_and_overflowing_sizes_are_refused() {
        let cfg = MediaConfig::default();
        assert_eq!(probe_header(&png_header(0, 5), &cfg).unwrap_err().label(), "probe_failed");
        let err = probe_header(&png_header(u32::MAX, u32::MAX), &cfg).unwrap_err();
        assert_eq!(err.label(), "too_large");
    }

    #[test]
    fn unknown_bytes_are_unsupported_format() {
        let cfg = MediaConfig::default();
        let err = probe_bytes(b"this is not an image at all", &cfg).unwrap_err();
        assert_eq!(err.label(), "unsupported_format");
        let tiff = b"II*\x00\x08\x00\x00\x00\x00\x00\x00\x00\x00\x00";
        assert_eq!(probe_bytes(tiff, &cfg).unwrap_err().label(), "unsupported_format");
        assert_eq!(probe_bytes(b"\x89PNG", &cfg).unwrap_err().label(), "probe_failed");
    }
}
