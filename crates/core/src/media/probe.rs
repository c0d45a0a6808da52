//! Width × height of an image, from its headers only: `imagesize` first (works on a prefix;
//! microseconds), BMPs as the engines' Pillow reads them (`bmp.rs`: what it refuses, checked without
//! expanding a pixel), and only when `imagesize` cannot tell, the header as an `image` decoder reads
//! it. No pixel is ever decoded: the accounting needs the size alone, and a decode is what let a
//! kilobyte of RLE cost hundreds of megabytes. The pixel cap is applied to the header's claim.

use std::io::Cursor;

use image::{ImageDecoder, ImageFormat, ImageReader, Limits};

use crate::media::bmp;
use crate::media::budget::HEADER_ALLOC;
use crate::media::config::{MediaConfig, Orientation};
use crate::media::error::MediaError;

/// Bytes of a prefix worth probing: JPEG EXIF/ICC segments before SOF can each be up to 64 KiB.
pub(crate) const HEADER_PROBE_BYTES: usize = 64 * 1024;

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
        // The headers alone may refuse it (a layout Pillow does not open, too many pixels); whether
        // Pillow loads it depends on its pixel data too (rows all there, an RLE stream that fills the
        // image), judged on the whole file in `probe_bytes`.
        match bmp::header(bytes) {
            Ok(header) => {
                check_dims(header.width, header.height, cfg)?;
            }
            Err(MediaError::ProbeFailed(_)) => {} // a prefix too short: read more
            Err(refused) => return Err(refused),
        }
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

/// Probes a complete image from its headers (a BMP as Pillow would load it), then the orientation
/// policy.
pub fn probe_bytes(bytes: &[u8], cfg: &MediaConfig) -> Result<(u32, u32, &'static str), MediaError> {
    let (label, format) = format_of(bytes)?
        .ok_or_else(|| MediaError::ProbeFailed(format!("{} bytes is too short for an image", bytes.len())))?;
    let (w, h) = match probe_header(bytes, cfg)? {
        Some((w, h, _)) => (w, h),
        None if format == ImageFormat::Bmp => bmp_dims(bytes, cfg)?,
        None => decoder_dims(bytes, format, cfg)?,
    };
    if cfg.orientation == Orientation::Exif && swaps_axes(bytes, format, cfg) {
        return Ok((h, w, label));
    }
    Ok((w, h, label))
}

/// The headers Pillow reads, the pixel cap, then the pixel data's presence (never its expansion).
fn bmp_dims(bytes: &[u8], cfg: &MediaConfig) -> Result<(u32, u32), MediaError> {
    let header = bmp::header(bytes)?;
    let dims = check_dims(header.width, header.height, cfg)?;
    header.check_data(bytes)?;
    Ok(dims)
}

/// A header read's limits: the pixel cap per side, and metadata memory (no pixel buffer is made).
fn limits(cfg: &MediaConfig) -> Limits {
    let side = u32::try_from(cfg.max_pixels).unwrap_or(u32::MAX);
    let mut limits = Limits::default();
    limits.max_image_width = Some(side);
    limits.max_image_height = Some(side);
    limits.max_alloc = Some(HEADER_ALLOC as u64);
    limits
}

fn decode_error(e: image::ImageError) -> MediaError {
    match e {
        image::ImageError::Limits(l) => MediaError::DecodeLimit(l.to_string()),
        other => MediaError::DecodeFailed(other.to_string()),
    }
}

/// The size as an `image` decoder reads it from the headers, for layouts `imagesize` does not follow;
/// its pixels are never read.
fn decoder_dims(bytes: &[u8], format: ImageFormat, cfg: &MediaConfig) -> Result<(u32, u32), MediaError> {
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    reader.limits(limits(cfg));
    let decoder = reader.into_decoder().map_err(decode_error)?;
    let (w, h) = decoder.dimensions();
    check_dims(u64::from(w), u64::from(h), cfg)
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
    if format == ImageFormat::Bmp {
        return false; // no EXIF in a BMP
    }
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

    #[test]
    fn bmps_are_counted_only_when_pillow_loads_them() {
        use crate::media::bmp::tests::{bmp, rle8_bomb};
        let cfg = MediaConfig::default();
        assert_eq!(probe_bytes(&bmp(2, 2, 24, 0, &[0x20; 16]), &cfg).unwrap(), (2, 2, "bmp"));
        // The header claims 2×2 either way; its compression (embedded JPEG) tells, from a prefix
        // already, that the engine cannot open it.
        let jpeg_inside = bmp(2, 2, 24, 4, &[0x20; 16]);
        assert_eq!(imagesize::blob_size(&jpeg_inside).map(|s| (s.width, s.height)).unwrap(), (2, 2));
        assert_eq!(probe_header(&jpeg_inside, &cfg).unwrap_err().label(), "unsupported_format");
        assert_eq!(probe_bytes(&jpeg_inside, &cfg).unwrap_err().label(), "unsupported_format");
        // A plain one needs the whole file (are all its rows there?).
        assert_eq!(probe_header(&bmp(2, 2, 24, 0, &[0x20; 16]), &cfg).unwrap(), None);
        // The attack (1 080 bytes declaring 11 000 × 11 000): refused from its headers and its
        // two-byte stream; over a tighter pixel cap, refused from the header alone.
        let err = probe_bytes(&rle8_bomb(11_000), &cfg).unwrap_err();
        assert!(matches!(err, MediaError::EngineRefuses(_)), "{err:?}");
        let tight = MediaConfig { max_pixels: 1_000_000, ..MediaConfig::default() };
        assert_eq!(probe_bytes(&rle8_bomb(11_000), &tight).unwrap_err().label(), "too_large");
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
