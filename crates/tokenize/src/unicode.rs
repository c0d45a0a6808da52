//! Character classes used by the pre-tokenizer and the NFC fast path.
//!
//! The pre-tokenizer regexes only ask three Unicode questions about a character: is it `\p{L}`, is it
//! `\p{N}`, is it `\s` (White_Space)? `tokenizers` answers them with the tables of `regex-syntax` 0.8
//! (Unicode 16.0), which are *not* the tables of the Rust standard library (`char::is_alphabetic` is
//! Alphabetic, not `\p{L}`, and std may ship a newer Unicode version). The ranges in
//! [`crate::unicode_data`] are therefore generated from `regex-syntax` itself, and a unit test checks every
//! code point against it (`MMROUTER_TOKENIZE_REGEN=1 cargo test --lib unicode` rewrites the file).
//!
//! The same byte also carries an "NFC unsafe" bit: set for every code point that is not both a starter
//! (canonical combining class 0) and `NFC_Quick_Check=Yes` in the Unicode 9.0 tables of
//! `unicode-normalization-alignments`, the crate `tokenizers` normalizes with. Text made only of code points
//! without the bit is already in NFC, so it can skip normalization.

use std::sync::OnceLock;

use crate::unicode_data;

/// Not a letter, number or white space (punctuation, symbols, marks, controls, unassigned…).
pub(crate) const OTHER: u8 = 0;
/// `\p{L}`.
pub(crate) const LETTER: u8 = 1;
/// `\p{N}`.
pub(crate) const NUMBER: u8 = 2;
/// `\s` (the White_Space property).
pub(crate) const SPACE: u8 = 3;
/// Mask of the class bits.
pub(crate) const CLASS_MASK: u8 = 3;
/// Set when the code point may change under NFC or make its neighbours change.
pub(crate) const NFC_UNSAFE: u8 = 4;

const BLOCK_BITS: u32 = 8;
const BLOCK_SIZE: usize = 1 << BLOCK_BITS;
const N_BLOCKS: usize = 0x11_0000 >> BLOCK_BITS;

/// Two-level lookup table: `blocks[index[cp >> 8]][cp & 0xff]`.
pub(crate) struct Table {
    index: Box<[u16; N_BLOCKS]>,
    blocks: Vec<[u8; BLOCK_SIZE]>,
}

impl Table {
    fn build() -> Table {
        let mut flat = vec![OTHER; 0x11_0000];
        let mut fill = |ranges: &[(u32, u32)], bits: u8| {
            for &(lo, hi) in ranges {
                for b in &mut flat[lo as usize..=hi as usize] {
                    *b |= bits;
                }
            }
        };
        fill(unicode_data::LETTER, LETTER);
        fill(unicode_data::NUMBER, NUMBER);
        fill(unicode_data::WHITE_SPACE, SPACE);
        fill(unicode_data::NFC_UNSAFE, NFC_UNSAFE);
        // Surrogates cannot occur in a `str`; give them a harmless value.
        let mut index = Box::new([0u16; N_BLOCKS]);
        let mut blocks: Vec<[u8; BLOCK_SIZE]> = Vec::new();
        let mut seen = std::collections::HashMap::new();
        for (bi, chunk) in flat.chunks_exact(BLOCK_SIZE).enumerate() {
            let block: [u8; BLOCK_SIZE] = chunk.try_into().expect("block size");
            let next = blocks.len();
            let id = *seen.entry(block).or_insert_with(|| {
                blocks.push(block);
                next
            });
            index[bi] = u16::try_from(id).expect("fewer than 65536 distinct blocks");
        }
        Table { index, blocks }
    }

    /// Class byte of a code point (`cp <= 0x10FFFF`).
    #[inline(always)]
    pub(crate) fn get(&self, cp: u32) -> u8 {
        let block = self.index[(cp >> BLOCK_BITS) as usize] as usize;
        self.blocks[block][(cp as usize) & (BLOCK_SIZE - 1)]
    }
}

/// The process-wide table (about 40 KiB, built once in well under a millisecond).
pub(crate) fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(Table::build)
}

/// Class of each ASCII byte. Bit `NFC_UNSAFE` is never set for ASCII.
pub(crate) static ASCII: [u8; 128] = {
    let mut t = [OTHER; 128];
    let mut i = 0;
    while i < 128 {
        let c = i as u8;
        t[i] = if c.is_ascii_alphabetic() {
            LETTER
        } else if c.is_ascii_digit() {
            NUMBER
        } else if matches!(c, b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | b' ') {
            SPACE
        } else {
            OTHER
        };
        i += 1;
    }
    t
};

/// Decodes the character starting at `i` of valid UTF-8 `b`; returns `(code point, byte length)`.
#[inline(always)]
pub(crate) fn decode(b: &[u8], i: usize) -> (u32, usize) {
    let b0 = b[i] as u32;
    if b0 < 0x80 {
        (b0, 1)
    } else if b0 < 0xE0 {
        (((b0 & 0x1F) << 6) | (b[i + 1] as u32 & 0x3F), 2)
    } else if b0 < 0xF0 {
        (((b0 & 0x0F) << 12) | ((b[i + 1] as u32 & 0x3F) << 6) | (b[i + 2] as u32 & 0x3F), 3)
    } else {
        (
            ((b0 & 0x07) << 18)
                | ((b[i + 1] as u32 & 0x3F) << 12)
                | ((b[i + 2] as u32 & 0x3F) << 6)
                | (b[i + 3] as u32 & 0x3F),
            4,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use regex_syntax::hir::{Class, HirKind};
    use unicode_normalization_alignments::char::canonical_combining_class;
    use unicode_normalization_alignments::{is_nfc_quick, IsNormalized};

    /// The code point ranges of a `regex-syntax` character class.
    fn class_ranges(pattern: &str) -> Vec<(u32, u32)> {
        let hir = regex_syntax::Parser::new().parse(pattern).expect("valid pattern");
        match hir.kind() {
            HirKind::Class(Class::Unicode(c)) => {
                c.ranges().iter().map(|r| (r.start() as u32, r.end() as u32)).collect()
            }
            other => panic!("{pattern}: not a Unicode class: {other:?}"),
        }
    }

    fn nfc_unsafe(cp: u32) -> bool {
        match char::from_u32(cp) {
            None => false, // surrogates never reach us
            Some(c) => canonical_combining_class(c) != 0 || is_nfc_quick(std::iter::once(c)) != IsNormalized::Yes,
        }
    }

    fn to_ranges(pred: impl Fn(u32) -> bool) -> Vec<(u32, u32)> {
        let mut out: Vec<(u32, u32)> = Vec::new();
        for cp in 0..0x11_0000u32 {
            if pred(cp) {
                match out.last_mut() {
                    Some(last) if last.1 + 1 == cp => last.1 = cp,
                    _ => out.push((cp, cp)),
                }
            }
        }
        out
    }

    fn render(name: &str, doc: &str, ranges: &[(u32, u32)]) -> String {
        let mut s = format!("/// {doc}\npub(crate) const {name}: &[(u32, u32)] = &[\n");
        for chunk in ranges.chunks(6) {
            s.push_str("    ");
            let items: Vec<String> = chunk.iter().map(|(a, b)| format!("(0x{a:04X}, 0x{b:04X})")).collect();
            s.push_str(&items.join(", "));
            s.push_str(",\n");
        }
        s.push_str("];\n");
        s
    }

    /// Checks `unicode_data.rs` against its sources; rewrites it when `MMROUTER_TOKENIZE_REGEN=1`.
    #[test]
    fn unicode_data_matches_sources() {
        let letter = class_ranges(r"\p{L}");
        let number = class_ranges(r"\p{N}");
        let space = class_ranges(r"\s");
        let nfc = to_ranges(nfc_unsafe);
        if std::env::var("MMROUTER_TOKENIZE_REGEN").as_deref() == Ok("1") {
            let mut s = String::from(
                "//! Generated by `MMROUTER_TOKENIZE_REGEN=1 cargo test --lib unicode_data_matches_sources`.\n\
                 //! Do not edit. Sources: `regex-syntax` 0.8 (Unicode 16.0) for the classes, and\n\
                 //! `unicode-normalization-alignments` 0.1.12 (Unicode 9.0) for `NFC_UNSAFE`.\n\n",
            );
            s.push_str(&render("LETTER", r"`\p{L}` as `regex-syntax` defines it.", &letter));
            s.push('\n');
            s.push_str(&render("NUMBER", r"`\p{N}` as `regex-syntax` defines it.", &number));
            s.push('\n');
            s.push_str(&render("WHITE_SPACE", r"`\s` (Unicode mode) as `regex-syntax` defines it.", &space));
            s.push('\n');
            s.push_str(&render(
                "NFC_UNSAFE",
                "Code points that are not (ccc = 0 and NFC_Quick_Check = Yes) in `unicode-normalization-alignments`.",
                &nfc,
            ));
            std::fs::write(concat!(env!("CARGO_MANIFEST_DIR"), "/src/unicode_data.rs"), s).unwrap();
            return;
        }
        assert_eq!(unicode_data::LETTER, &letter[..], "LETTER is stale: regenerate");
        assert_eq!(unicode_data::NUMBER, &number[..], "NUMBER is stale: regenerate");
        assert_eq!(unicode_data::WHITE_SPACE, &space[..], "WHITE_SPACE is stale: regenerate");
        assert_eq!(unicode_data::NFC_UNSAFE, &nfc[..], "NFC_UNSAFE is stale: regenerate");
    }

    #[test]
    fn table_agrees_with_ranges_for_every_code_point() {
        let letter = class_ranges(r"\p{L}");
        let number = class_ranges(r"\p{N}");
        let space = class_ranges(r"\s");
        let inr = |rs: &[(u32, u32)], cp: u32| {
            rs.binary_search_by(|&(a, b)| {
                if b < cp {
                    std::cmp::Ordering::Less
                } else if a > cp {
                    std::cmp::Ordering::Greater
                } else {
                    std::cmp::Ordering::Equal
                }
            })
            .is_ok()
        };
        let t = table();
        for cp in 0..0x11_0000u32 {
            let v = t.get(cp);
            let want = if inr(&letter, cp) {
                LETTER
            } else if inr(&number, cp) {
                NUMBER
            } else if inr(&space, cp) {
                SPACE
            } else {
                OTHER
            };
            assert_eq!(v & CLASS_MASK, want, "class of U+{cp:04X}");
            assert_eq!(v & NFC_UNSAFE != 0, nfc_unsafe(cp), "nfc bit of U+{cp:04X}");
            if cp < 128 {
                assert_eq!(ASCII[cp as usize], want, "ASCII class of U+{cp:04X}");
            }
        }
    }

    #[test]
    fn decode_matches_std() {
        let s = "a\u{7f}\u{80}\u{7ff}\u{800}\u{ffff}\u{10000}\u{10ffff}é中😀";
        let b = s.as_bytes();
        let mut i = 0;
        for c in s.chars() {
            let (cp, len) = decode(b, i);
            assert_eq!((cp, len), (c as u32, c.len_utf8()));
            i += len;
        }
    }
}
