//! NFC, exactly as `tokenizers` applies it (`unicode-normalization-alignments`, Unicode 9.0), with a fast
//! path for text that is already normalized.

use unicode_normalization_alignments::UnicodeNormalization;

use crate::unicode::{decode, table, NFC_UNSAFE};

/// Position of the first code point of `s[from..]` that is not an NFC-safe starter, if any.
///
/// ASCII and starters with `NFC_Quick_Check=Yes` are "safe": NFC never changes them, never composes them
/// with what precedes them, and never reorders anything across them. So NFC can be applied to the
/// stretch between two safe characters independently of the rest of the text.
#[inline]
fn next_unsafe(b: &[u8], mut i: usize) -> Option<usize> {
    let t = table();
    while i < b.len() {
        if i + 8 <= b.len() {
            let w = u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
            if w & 0x8080_8080_8080_8080 == 0 {
                i += 8;
                continue;
            }
        }
        if b[i] < 0x80 {
            i += 1;
            continue;
        }
        let (cp, len) = decode(b, i);
        if t.get(cp) & NFC_UNSAFE != 0 {
            return Some(i);
        }
        i += len;
    }
    None
}

/// Start of the character that ends at `i` (`i > 0`).
#[inline]
fn prev_char_start(b: &[u8], mut i: usize) -> usize {
    i -= 1;
    while b[i] & 0xC0 == 0x80 {
        i -= 1;
    }
    i
}

/// End of the run of unsafe code points starting at `i`: the position of the next safe one (or the end).
#[inline]
fn end_of_unsafe_run(b: &[u8], mut i: usize) -> usize {
    let t = table();
    while i < b.len() {
        let (cp, len) = decode(b, i);
        if cp < 0x80 || t.get(cp) & NFC_UNSAFE == 0 {
            break;
        }
        i += len;
    }
    i
}

/// NFC of `s` when it differs from `s`, `None` when `s` is already normalized.
///
/// Only the stretches around code points that are not NFC-safe starters go through the normalizer:
/// from the safe character before such a code point to the next safe character. NFC of each stretch
/// equals the corresponding part of NFC of the whole text (the safe characters are normalization
/// boundaries), so the result is `tokenizers`' `NFC` output.
pub(crate) fn nfc(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let first = next_unsafe(b, 0)?;
    let mut out = String::with_capacity(s.len() + 16);
    let mut copied = 0; // s[..copied] has been emitted
    let mut at = first;
    let mut changed = false;
    loop {
        // The stretch starts at the safe character just before the unsafe run (if any).
        let start = if at > copied { prev_char_start(b, at) } else { at };
        let end = end_of_unsafe_run(b, at);
        out.push_str(&s[copied..start]);
        let stretch = &s[start..end];
        let before = out.len();
        out.extend(stretch.nfc().map(|(c, _)| c));
        changed |= &out[before..] != stretch;
        copied = end;
        match next_unsafe(b, end) {
            Some(next) => at = next,
            None => break,
        }
    }
    if !changed {
        return None;
    }
    out.push_str(&s[copied..]);
    Some(out)
}

/// Reference: NFC of the whole string at once, as `tokenizers` computes it.
#[cfg(test)]
pub(crate) fn nfc_whole(s: &str) -> String {
    s.nfc().map(|(c, _)| c).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stretch_normalization_equals_whole_normalization() {
        for s in [
            "plain ascii",
            "caf\u{e9}",
            "cafe\u{301}",
            "\u{301}cafe",
            "e\u{301}\u{301}x\u{323}\u{302}y",
            "\u{1100}\u{1161}",
            "\u{1100}\u{1161}\u{11a8}",
            "\u{ac00}\u{11a8}",
            "\u{f900}",
            "a\u{323}\u{302}",
            "a\u{302}\u{323}",
            "\u{915}\u{94d}\u{937}",
            "\u{627}\u{644}\u{652}",
            "\u{2f800}\u{2000}x\u{2001}",
            "😀👍🏽",
            "\u{9c7}\u{9be}",
            "\u{cc6}\u{cc2}\u{cd5}",
            "\u{344}\u{f73}",
            "=\u{338}",
        ] {
            let whole = nfc_whole(s);
            match nfc(s) {
                Some(n) => assert_eq!(n, whole, "{s:?}"),
                None => assert_eq!(whole, s, "{s:?} claimed NFC"),
            }
        }
        assert!(nfc("cafe\u{301}").is_some());
        assert!(nfc("\u{915}\u{94d}\u{937}").is_none());
    }
}
