//! Tiny PNG writer for synthetic workload images.
//!
//! The router and the simulator only read an image's header (width, height) and hash its bytes, so
//! a synthetic "camera photo" only has to be a valid PNG with realistic dimensions. A 1-bit palette
//! image of one colour compresses to about a kilobyte even at 4032×3024, which keeps workload files
//! small; [`noise`] makes an incompressible image when a test needs a body of a given size.

use std::io::Write;

use flate2::write::ZlibEncoder;
use flate2::{Compression, Crc};
use rand::RngCore;

const SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'];

/// A `width`×`height` PNG of one colour (1-bit palette, so rows are tiny and compress well).
/// `tag` goes into a `tEXt` chunk: images with distinct tags have distinct bytes (identities).
pub fn solid(width: u32, height: u32, rgb: [u8; 3], tag: &str) -> Vec<u8> {
    let row_bytes = 1 + (width as usize).div_ceil(8);
    let zero_row = vec![0u8; row_bytes];
    // Level 1 is plenty for runs of zeros and several times faster than the default on 36 MP.
    let mut z = ZlibEncoder::new(Vec::new(), Compression::fast());
    for _ in 0..height {
        // Writing into a Vec cannot fail.
        let _ = z.write_all(&zero_row);
    }
    let idat = z.finish().unwrap_or_default();
    let mut out = Vec::with_capacity(idat.len() + 64);
    out.extend_from_slice(&SIGNATURE);
    chunk(&mut out, b"IHDR", &ihdr(width, height, 1, 3));
    chunk(&mut out, b"PLTE", &[rgb[0], rgb[1], rgb[2], 255 - rgb[0], 255 - rgb[1], 255 - rgb[2]]);
    if !tag.is_empty() {
        let mut text = b"Comment\0".to_vec();
        text.extend_from_slice(tag.as_bytes());
        chunk(&mut out, b"tEXt", &text);
    }
    chunk(&mut out, b"IDAT", &idat);
    chunk(&mut out, b"IEND", &[]);
    out
}

/// A `width`×`height` RGB PNG of random pixels, stored without compression gain, so its size is
/// about `3 × width × height` bytes.
pub fn noise(width: u32, height: u32, rng: &mut impl RngCore) -> Vec<u8> {
    let row_bytes = 1 + 3 * width as usize;
    let mut row = vec![0u8; row_bytes];
    let mut z = ZlibEncoder::new(Vec::new(), Compression::fast());
    for _ in 0..height {
        rng.fill_bytes(&mut row[1..]);
        let _ = z.write_all(&row);
    }
    let idat = z.finish().unwrap_or_default();
    let mut out = Vec::with_capacity(idat.len() + 64);
    out.extend_from_slice(&SIGNATURE);
    chunk(&mut out, b"IHDR", &ihdr(width, height, 8, 2));
    chunk(&mut out, b"IDAT", &idat);
    chunk(&mut out, b"IEND", &[]);
    out
}

fn ihdr(width: u32, height: u32, bit_depth: u8, colour_type: u8) -> [u8; 13] {
    let mut h = [0u8; 13];
    h[0..4].copy_from_slice(&width.to_be_bytes());
    h[4..8].copy_from_slice(&height.to_be_bytes());
    h[8] = bit_depth;
    h[9] = colour_type;
    // compression 0, filter 0, interlace 0
    h
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    // Chunk data of these images is far below 2^31 bytes, the PNG limit.
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let mut crc = Crc::new();
    crc.update(kind);
    crc.update(data);
    out.extend_from_slice(&crc.sum().to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn decoded_size(bytes: &[u8]) -> (u32, u32) {
        let img = image::load_from_memory_with_format(bytes, image::ImageFormat::Png).expect("valid png");
        (img.width(), img.height())
    }

    #[test]
    fn solid_png_decodes_with_its_dimensions_and_stays_small() {
        let bytes = solid(1280, 720, [10, 200, 30], "a");
        assert_eq!(decoded_size(&bytes), (1280, 720));
        assert!(bytes.len() < 4096, "{} bytes", bytes.len());
        let img = image::load_from_memory(&bytes).expect("valid png").to_rgb8();
        assert_eq!(img.get_pixel(5, 700).0, [10, 200, 30]);
    }

    #[test]
    fn tags_make_distinct_bytes() {
        assert_ne!(solid(64, 48, [0, 0, 0], "x"), solid(64, 48, [0, 0, 0], "y"));
    }

    #[test]
    fn extreme_aspect_png_is_valid() {
        assert_eq!(decoded_size(&solid(5000, 20, [1, 2, 3], "")), (5000, 20));
        assert_eq!(decoded_size(&solid(7, 3, [1, 2, 3], "b")), (7, 3));
    }

    #[test]
    fn noise_png_has_about_three_bytes_per_pixel() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let bytes = noise(224, 224, &mut rng);
        assert_eq!(decoded_size(&bytes), (224, 224));
        let raw = 3 * 224 * 224;
        assert!(bytes.len() > raw && bytes.len() < raw + raw / 50, "{} bytes", bytes.len());
    }
}
