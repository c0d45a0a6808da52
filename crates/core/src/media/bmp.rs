//! A BMP read the way the engines' image loader (Pillow's `BmpImagePlugin`, 11 and 12) reads it,
//! without decoding a pixel: which files it opens and at what size, from the file and DIB headers
//! (header type, bit depth, compression, bitfield masks, palette size), and whether loading would
//! find enough pixel data: uncompressed rows must all be in the file, and an RLE stream must fill
//! the image (Pillow's RLE decoder answers "not enough image data" otherwise). The RLE stream is
//! walked by counting, never expanded, so an 11 000 × 11 000 RLE bomb costs nothing to judge.
//!
//! What Pillow refuses is a [`MediaError::EngineRefuses`]: counting it would route a request the
//! worker then answers with 400.

use crate::media::error::MediaError;

const RAW: u32 = 0;
const RLE8: u32 = 1;
const RLE4: u32 = 2;
const BITFIELDS: u32 = 3;

/// The bitfield masks Pillow maps to a raw mode, by bit depth: (r, g, b) or, at 32 bits, (r, g, b, a).
const MASKS_32: [[u32; 4]; 8] = [
    [0xFF0000, 0xFF00, 0xFF, 0x0],
    [0xFF000000, 0xFF0000, 0xFF00, 0x0],
    [0xFF000000, 0xFF00, 0xFF, 0x0],
    [0xFF000000, 0xFF0000, 0xFF00, 0xFF],
    [0xFF, 0xFF00, 0xFF0000, 0xFF000000],
    [0xFF0000, 0xFF00, 0xFF, 0xFF000000],
    [0xFF000000, 0xFF00, 0xFF, 0xFF0000],
    [0x0, 0x0, 0x0, 0x0],
];
const MASKS_24: [[u32; 3]; 1] = [[0xFF0000, 0xFF00, 0xFF]];
const MASKS_16: [[u32; 3]; 2] = [[0xF800, 0x7E0, 0x1F], [0x7C00, 0x3E0, 0x1F]];

/// What the headers of a BMP say, once Pillow would open it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BmpHeader {
    pub(crate) width: u64,
    pub(crate) height: u64,
    bits: u16,
    compression: u32,
    /// Where the pixel data starts, as Pillow computes it.
    data_start: u64,
}

fn refuse(why: impl Into<String>) -> MediaError {
    MediaError::EngineRefuses(why.into())
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The fields of the DIB header Pillow reads; the file offset after what it reads.
struct Dib {
    width: u64,
    height: u64,
    bits: u16,
    compression: u32,
    colors: u64,
    palette_entry: u64,
    end: u64,
}

/// Reads the file header and the DIB header (`bytes` is the whole file or a prefix of it).
pub(crate) fn header(bytes: &[u8]) -> Result<BmpHeader, MediaError> {
    let short = || MediaError::ProbeFailed(format!("BMP header truncated at {} bytes", bytes.len()));
    let offset = u64::from(u32_at(bytes, 10).ok_or_else(short)?);
    let size = u32_at(bytes, 14).ok_or_else(short)?;
    let dib = match size {
        12 => core_header(bytes).ok_or_else(short)?,
        40 | 52 | 56 | 64 | 108 | 124 => info_header(bytes, size).ok_or_else(short)??,
        other => return Err(refuse(format!("unsupported BMP header type ({other})"))),
    };
    if !matches!(dib.bits, 1 | 4 | 8 | 16 | 24 | 32) {
        return Err(refuse(format!("unsupported BMP pixel depth ({})", dib.bits)));
    }
    match dib.compression {
        RAW | BITFIELDS => {}
        // Pillow's RLE decoder writes palette indices: only paletted depths load.
        RLE8 | RLE4 if matches!(dib.bits, 4 | 8) => {}
        c => return Err(refuse(format!("unsupported BMP compression ({c}) at {} bits", dib.bits))),
    }
    let palette = dib.bits <= 8;
    if palette && !(1..=65_536).contains(&dib.colors) {
        return Err(refuse(format!("unsupported BMP palette size ({})", dib.colors)));
    }
    let palette_bytes = if palette { dib.palette_entry * dib.colors } else { 0 };
    // Pillow moves a data offset that points right after the header past the palette, and reads
    // from where the headers end when the offset is 0.
    let data_start = match offset {
        0 => dib.end + palette_bytes,
        o if palette && o == 14 + u64::from(size) => o + palette_bytes,
        o => o,
    };
    Ok(BmpHeader { width: dib.width, height: dib.height, bits: dib.bits, compression: dib.compression, data_start })
}

/// BITMAPCOREHEADER (OS/2 1.x): 16-bit sizes, never compressed.
fn core_header(b: &[u8]) -> Option<Dib> {
    Some(with_default_colors(Dib {
        width: u64::from(u16_at(b, 18)?),
        height: u64::from(u16_at(b, 20)?),
        bits: u16_at(b, 24)?,
        compression: RAW,
        colors: 0,
        palette_entry: 3,
        end: 26,
    }))
}

/// BITMAPINFOHEADER and its successors: 32-bit sizes, a negative height is a top-down image.
fn info_header(b: &[u8], size: u32) -> Option<Result<Dib, MediaError>> {
    let end = 14 + u64::from(size);
    b.get(..usize::try_from(end).ok()?)?;
    let raw_height = u32_at(b, 22)?;
    let height = if b[25] == 0xFF { (1u64 << 32) - u64::from(raw_height) } else { u64::from(raw_height) };
    let mut dib = Dib {
        width: u64::from(u32_at(b, 18)?),
        height,
        bits: u16_at(b, 28)?,
        compression: u32_at(b, 30)?,
        colors: u64::from(u32_at(b, 46)?),
        palette_entry: 4,
        end,
    };
    if dib.compression == BITFIELDS {
        // The masks sit right after the 40-byte fields either way; a 40-byte header reads them
        // from the file after it, a 56-byte one or longer carries an alpha mask too.
        let mask = |i: usize| u32_at(b, 54 + 4 * i);
        let rgb = [mask(0)?, mask(1)?, mask(2)?];
        let alpha = if size >= 56 { mask(3)? } else { 0 };
        if size == 40 {
            dib.end += 12;
        }
        if let Err(e) = check_masks(dib.bits, rgb, alpha) {
            return Some(Err(e));
        }
    }
    Some(Ok(with_default_colors(dib)))
}

/// A colour count of 0 means every colour the depth can index.
fn with_default_colors(mut dib: Dib) -> Dib {
    if dib.colors == 0 {
        dib.colors = 1u64.checked_shl(u32::from(dib.bits)).unwrap_or(u64::MAX);
    }
    dib
}

/// Pillow opens bitfields only in the layouts it has a raw mode for.
fn check_masks(bits: u16, [r, g, b]: [u32; 3], a: u32) -> Result<(), MediaError> {
    let known = match bits {
        32 => MASKS_32.contains(&[r, g, b, a]),
        24 => MASKS_24.contains(&[r, g, b]),
        16 => MASKS_16.contains(&[r, g, b]),
        _ => false,
    };
    if known {
        Ok(())
    } else {
        Err(refuse(format!("unsupported BMP bitfields layout ({bits} bits, {r:#x} {g:#x} {b:#x} {a:#x})")))
    }
}

impl BmpHeader {
    /// Whether loading finds the pixels it needs in `file` (the whole file): Pillow refuses a
    /// truncated raw image and an RLE stream that stops before the image is full.
    pub(crate) fn check_data(&self, file: &[u8]) -> Result<(), MediaError> {
        let start = usize::try_from(self.data_start).unwrap_or(usize::MAX);
        let data = file.get(start..).unwrap_or_default();
        match self.compression {
            RLE8 | RLE4 => {
                let need = self.width.saturating_mul(self.height);
                let got = rle_fill(data, start, self.width, self.compression == RLE4, need);
                if got < need {
                    return Err(refuse(format!("RLE data fills {got} of {need} pixels")));
                }
                Ok(())
            }
            _ => {
                // Rows are padded to 4 bytes; the last row's padding is never read.
                let bits = self.width * u64::from(self.bits);
                let stride = ((bits + 31) >> 3) & !3;
                let need = match self.height {
                    0 => 0,
                    h => stride.saturating_mul(h - 1).saturating_add(bits.div_ceil(8)),
                };
                if (data.len() as u64) < need {
                    return Err(refuse(format!("pixel data truncated: {} of {need} bytes", data.len())));
                }
                Ok(())
            }
        }
    }
}

/// How many pixels Pillow's RLE decoder would produce from `data` (which starts at file offset
/// `base`), stopping once `need` are there: its loop step by step, counting instead of writing.
fn rle_fill(data: &[u8], base: usize, xsize: u64, rle4: bool, need: u64) -> u64 {
    let (mut filled, mut x, mut at) = (0u64, 0u64, 0usize);
    while filled < need {
        let (Some(&pixels), Some(&byte)) = (data.get(at), data.get(at + 1)) else { break };
        at += 2;
        if pixels > 0 {
            // Encoded: a run, clipped at the end of the row.
            let run = u64::from(pixels).min(xsize.saturating_sub(x));
            filled += run;
            x += run;
            continue;
        }
        match byte {
            0 => {
                // End of line: the row is padded out.
                filled = filled.div_ceil(xsize) * xsize;
                x = 0;
            }
            1 => break,
            2 => {
                // Delta: right, then up whole rows.
                let (Some(&right), Some(&up)) = (data.get(at), data.get(at + 1)) else { break };
                at += 2;
                filled += u64::from(right) + u64::from(up) * xsize;
                x = filled % xsize;
            }
            n => {
                // Absolute: `n` literal pixels (two per byte in RLE4), word-aligned in the file.
                let count = if rle4 { usize::from(n / 2) } else { usize::from(n) };
                let read = count.min(data.len().saturating_sub(at));
                filled += if rle4 { 2 * read as u64 } else { read as u64 };
                at += read;
                if read < count {
                    break;
                }
                x += u64::from(n);
                if !(base + at).is_multiple_of(2) {
                    at += 1;
                }
            }
        }
    }
    filled
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A BMP with a 40-byte info header: `bits`, `compression`, `colors` (0: all), and `data`
    /// after the header and palette.
    pub(crate) fn bmp(width: i32, height: i32, bits: u16, compression: u32, data: &[u8]) -> Vec<u8> {
        let palette = if bits <= 8 { 4usize << bits } else { 0 };
        let offset = 54 + palette as u32;
        let mut v = b"BM".to_vec();
        for n in [offset + data.len() as u32, 0, offset, 40] {
            v.extend_from_slice(&n.to_le_bytes());
        }
        v.extend_from_slice(&width.to_le_bytes());
        v.extend_from_slice(&height.to_le_bytes());
        v.extend_from_slice(&1u16.to_le_bytes());
        v.extend_from_slice(&bits.to_le_bytes());
        for n in [compression, data.len() as u32, 2835, 2835, 0, 0] {
            v.extend_from_slice(&n.to_le_bytes());
        }
        // A palette of distinct colours, so that nothing in it reads as grey.
        v.extend((0..palette).map(|i| (i * 7 % 251) as u8));
        v.extend_from_slice(data);
        v
    }

    /// The attack: an RLE8 file of about 1 KB declaring `side` × `side`, whose stream ends at once.
    pub(crate) fn rle8_bomb(side: i32) -> Vec<u8> {
        bmp(side, side, 8, RLE8, &[0, 1])
    }

    fn accepted(file: &[u8]) -> Result<(u64, u64), MediaError> {
        let h = header(file)?;
        h.check_data(file)?;
        Ok((h.width, h.height))
    }

    #[test]
    fn the_attack_file_is_refused_as_pillow_refuses_it() {
        let bomb = rle8_bomb(11_000);
        assert_eq!(bomb.len(), 1080, "the attack's file size");
        let err = accepted(&bomb).unwrap_err();
        assert_eq!(err.label(), "unsupported_format", "{err}");
        assert!(err.to_string().contains("fills 0 of 121000000 pixels"), "{err}");
    }

    #[test]
    fn an_rle_stream_that_fills_the_image_is_counted_without_expanding_it() {
        // Deltas of 255 rows each fill 11 000 × 11 000 in 44 escapes: Pillow loads it.
        let mut data = Vec::new();
        for _ in 0..44 {
            data.extend_from_slice(&[0, 2, 0, 255]);
        }
        data.extend_from_slice(&[0, 1]);
        assert_eq!(accepted(&bmp(11_000, 11_000, 8, RLE8, &data)).unwrap(), (11_000, 11_000));
        // Runs and an end of line fill a 4 × 2 image exactly; one pixel short is refused.
        let rle = bmp(4, 2, 8, RLE8, &[4, 9, 0, 0, 3, 9, 0, 1]);
        assert!(accepted(&rle).is_err());
        let rle = bmp(4, 2, 8, RLE8, &[4, 9, 0, 0, 4, 9, 0, 1]);
        assert_eq!(accepted(&rle).unwrap(), (4, 2));
        // Absolute mode: 4 literal pixels per row, two rows.
        let rle = bmp(4, 2, 8, RLE8, &[0, 4, 1, 2, 3, 4, 0, 4, 1, 2, 3, 4, 0, 1]);
        assert_eq!(accepted(&rle).unwrap(), (4, 2));
        // RLE4 absolute mode: 4 bytes hold 8 pixels.
        let rle = bmp(8, 1, 4, RLE4, &[0, 8, 0x12, 0x34, 0x56, 0x78, 0, 1]);
        assert_eq!(accepted(&rle).unwrap(), (8, 1));
    }

    #[test]
    fn raw_pixels_must_all_be_in_the_file() {
        // 3 × 2 at 24 bits: rows of 9 bytes padded to 12 (the last one's padding may be missing).
        assert_eq!(accepted(&bmp(3, 2, 24, RAW, &[0; 24])).unwrap(), (3, 2));
        assert_eq!(accepted(&bmp(3, 2, 24, RAW, &[0; 21])).unwrap(), (3, 2));
        let err = accepted(&bmp(3, 2, 24, RAW, &[0; 20])).unwrap_err();
        assert!(err.to_string().contains("truncated: 20 of 21 bytes"), "{err}");
        // A top-down image (negative height) has the same size.
        assert_eq!(accepted(&bmp(3, -2, 24, RAW, &[0; 24])).unwrap(), (3, 2));
        // 1-bit rows are padded to 4 bytes too: 33 pixels take 5 bytes, 8 with padding.
        assert_eq!(accepted(&bmp(33, 2, 1, RAW, &[0; 13])).unwrap(), (33, 2));
        assert!(accepted(&bmp(33, 2, 1, RAW, &[0; 12])).is_err());
    }

    #[test]
    fn what_pillow_refuses_in_the_header() {
        let cases: [(Vec<u8>, &str); 5] = [
            (bmp(2, 2, 24, 4, &[0; 16]), "compression (4)"),
            (bmp(2, 2, 24, 5, &[0; 16]), "compression (5)"),
            (bmp(2, 2, 2, RAW, &[0; 16]), "pixel depth (2)"),
            (bmp(2, 2, 24, RLE8, &[0, 1]), "compression (1) at 24 bits"),
            (bmp(2, 2, 24, BITFIELDS, &[0; 28]), "bitfields layout"),
        ];
        for (file, why) in cases {
            let err = accepted(&file).unwrap_err();
            assert!(matches!(err, MediaError::EngineRefuses(_)), "{err:?}");
            assert!(err.to_string().contains(why), "{err} (expected {why})");
        }
        let mut v5 = bmp(2, 2, 24, RAW, &[0; 16]);
        v5[14] = 41;
        assert!(accepted(&v5).unwrap_err().to_string().contains("header type (41)"));
        // A colour count beyond 65 536 is refused; a short header is a probe failure.
        let mut colors = bmp(2, 2, 8, RAW, &[0; 8]);
        colors[46..50].copy_from_slice(&70_000u32.to_le_bytes());
        assert!(accepted(&colors).unwrap_err().to_string().contains("palette size"));
        assert_eq!(header(&bmp(2, 2, 24, RAW, &[])[..30]).unwrap_err().label(), "probe_failed");
    }

    #[test]
    fn bitfields_in_the_layouts_pillow_knows_are_opened() {
        let mut data = Vec::new();
        for m in [0xF800u32, 0x7E0, 0x1F] {
            data.extend_from_slice(&m.to_le_bytes());
        }
        data.extend_from_slice(&[0; 8]);
        // 16-bit 5:6:5, 2 × 2: rows of 4 bytes after the 12 mask bytes (offset points past them).
        let mut file = bmp(2, 2, 16, BITFIELDS, &data);
        file[10..14].copy_from_slice(&66u32.to_le_bytes());
        assert_eq!(accepted(&file).unwrap(), (2, 2));
        let h = header(&file).unwrap();
        assert_eq!(h.data_start, 66);
    }
}
