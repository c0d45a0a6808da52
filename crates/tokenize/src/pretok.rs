//! Hand-written matcher for the GPT-4-style split regexes used by Qwen2/2.5/3 and Llama-3.
//!
//! The pattern (Qwen; Llama-3 has `\p{N}{1,3}` instead of `\p{N}`) is
//!
//! ```text
//! (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//! ```
//!
//! `tokenizers` runs it with `fancy-regex` (backtracking, leftmost-first alternation) through `find_iter`,
//! and with `Split { behavior: Isolated }` both the matches and the gaps between them become pieces. Every
//! character is matched by one of the alternatives (a letter by the 2nd, a number by the 3rd, white space by
//! the last, anything else by the 4th), so the matches tile the input and each match starts where the
//! previous one ended. [`for_each_piece`] reproduces the match that the regex finds at a position:
//!
//! 1. `'` followed by `s|t|re|ve|m|ll|d`, case-insensitively with Unicode simple case folding (which adds
//!    U+017F LATIN SMALL LETTER LONG S as a third spelling of `s`; the other letters have no extra folds).
//! 2. An optional character that is not CR, LF, a letter or a number, then a run of letters.
//! 3. One number (up to three for Llama-3; greedy).
//! 4. An optional U+0020, then a run of characters that are neither white space, letters nor numbers,
//!    then a run of CR/LF.
//! 5. `\s*[\r\n]+`: within the maximal white-space run `W` starting here, everything up to and including
//!    the last CR or LF (the greedy `\s*` backtracks to the last CR/LF).
//! 6. `\s+(?!\S)`: all of `W` when it ends the text, otherwise `W` minus its last character (when `W` has
//!    at least two characters): the greedy `\s+` gives back one character so that the look-ahead sees
//!    white space.
//! 7. `\s+`: all of `W` (only reached when `W` is one character followed by a non-space).
//!
//! One more rule reproduces a limit of the engine rather than of the pattern: `fancy-regex` runs the
//! `\s+(?!\S)` alternative in its backtracking VM, which pushes one backtrack entry per character of the
//! white-space run and gives up with a `StackOverflow` error at 1 000 000 entries. `tokenizers` stops the
//! split at the first error, so the rest of the text becomes one single piece. That happens when step 6
//! is reached with a run (without CR/LF) of [`STACK_LIMIT_RUN`] characters or more; [`for_each_piece`]
//! then emits the remainder as one piece too (checked against `tokenizers` in the parity tests).

use crate::unicode::{decode, table, Table, ASCII, CLASS_MASK, LETTER, NUMBER, OTHER, SPACE};

/// Length (in characters) of a CR/LF-free white-space run at which `fancy-regex`'s VM stack overflows.
pub(crate) const STACK_LIMIT_RUN: usize = 999_999;

/// Class of the character at `i`: `(code point, byte length, class)`.
#[inline(always)]
fn at(t: &Table, b: &[u8], i: usize) -> (u32, usize, u8) {
    let b0 = b[i];
    if b0 < 0x80 {
        (b0 as u32, 1, ASCII[b0 as usize])
    } else {
        let (cp, len) = decode(b, i);
        (cp, len, t.get(cp) & CLASS_MASK)
    }
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = ONES * 0x80;

/// High bit of each byte of `w` set where that byte is an ASCII letter. `| 0x20` folds `A-Z` onto
/// `a-z` (and no other byte onto them); with every byte's high bit cleared the additions never carry
/// into the next byte.
#[inline(always)]
fn ascii_letter_mask(w: u64) -> u64 {
    let x = w | (ONES * 0x20);
    let v = x & !HIGH;
    let ge_a = v + ONES * (0x80 - u64::from(b'a'));
    let gt_z = v + ONES * (0x80 - u64::from(b'z') - 1);
    ge_a & !gt_z & !x & HIGH
}

/// End of the run of ASCII letters starting at `i`, eight bytes at a time: most pieces of most text
/// are such runs, and a byte loop pays a branch per letter and a misprediction where the word ends.
#[inline(always)]
fn ascii_letters_end(b: &[u8], mut i: usize) -> usize {
    while let Some(chunk) = b.get(i..i + 8) {
        let w = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        let other = !ascii_letter_mask(w) & HIGH;
        if other != 0 {
            return i + (other.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    i
}

/// End of the run of characters of class `class` starting at `i`.
#[inline(always)]
fn run_of(t: &Table, b: &[u8], mut i: usize, class: u8) -> usize {
    let n = b.len();
    if class == LETTER {
        i = ascii_letters_end(b, i);
    }
    while i < n {
        let b0 = b[i];
        if b0 < 0x80 {
            if ASCII[b0 as usize] != class {
                break;
            }
            i += 1;
        } else {
            let (cp, len) = decode(b, i);
            if t.get(cp) & CLASS_MASK != class {
                break;
            }
            i += len;
        }
    }
    i
}

/// End of the run of `\r` / `\n` starting at `i`.
#[inline(always)]
fn run_of_crlf(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && (b[i] == b'\r' || b[i] == b'\n') {
        i += 1;
    }
    i
}

/// Is the character at `i` one of `lower`, its ASCII upper case, or (for `s`) U+017F? Returns its length.
#[inline(always)]
fn fold_eq(b: &[u8], i: usize, lower: u8) -> Option<usize> {
    let c = *b.get(i)?;
    if c | 0x20 == lower {
        return Some(1);
    }
    // U+017F LATIN SMALL LETTER LONG S = C5 BF folds to 's'.
    if lower == b's' && c == 0xC5 && b.get(i + 1) == Some(&0xBF) {
        return Some(2);
    }
    None
}

/// End of a contraction (`'s`, `'t`, `'re`, `'ve`, `'m`, `'ll`, `'d`) whose `'` is at `i - 1`.
#[inline]
fn contraction(b: &[u8], i: usize) -> Option<usize> {
    for one in [b's', b't', b'm', b'd'] {
        if let Some(l) = fold_eq(b, i, one) {
            return Some(i + l);
        }
    }
    for (x, y) in [(b'r', b'e'), (b'v', b'e'), (b'l', b'l')] {
        if let Some(l1) = fold_eq(b, i, x) {
            if let Some(l2) = fold_eq(b, i + l1, y) {
                return Some(i + l1 + l2);
            }
        }
    }
    None
}

/// End of the match that starts at `i` (which must be `< b.len()`).
#[inline(always)]
fn match_at(t: &Table, b: &[u8], i: usize, max_digits: usize) -> usize {
    let n = b.len();
    let (c0, l0, k0) = at(t, b, i);
    let j = i + l0;
    // 1. Contractions.
    if c0 == b'\'' as u32 {
        if let Some(e) = contraction(b, j) {
            return e;
        }
    }
    // 2. [^\r\n\p{L}\p{N}]?\p{L}+
    if k0 == LETTER {
        return run_of(t, b, j, LETTER);
    }
    if k0 != NUMBER && c0 != b'\r' as u32 && c0 != b'\n' as u32 && j < n {
        let (_, l1, k1) = at(t, b, j);
        if k1 == LETTER {
            return run_of(t, b, j + l1, LETTER);
        }
    }
    // 3. \p{N} / \p{N}{1,3}
    if k0 == NUMBER {
        let mut e = j;
        for _ in 1..max_digits {
            if e >= n {
                break;
            }
            let (_, l, k) = at(t, b, e);
            if k != NUMBER {
                break;
            }
            e += l;
        }
        return e;
    }
    // 4. ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    if k0 == OTHER {
        return run_of_crlf(b, run_of(t, b, j, OTHER));
    }
    if c0 == b' ' as u32 && j < n {
        let (_, l1, k1) = at(t, b, j);
        if k1 == OTHER {
            return run_of_crlf(b, run_of(t, b, j + l1, OTHER));
        }
    }
    // 5-7: white space.
    debug_assert_eq!(k0, SPACE);
    let mut last_crlf_end = if c0 == b'\r' as u32 || c0 == b'\n' as u32 { j } else { 0 };
    let mut last_start = i;
    let mut e = j;
    let mut chars = 1;
    while e < n {
        let (c, l, k) = at(t, b, e);
        if k != SPACE {
            break;
        }
        if c == b'\r' as u32 || c == b'\n' as u32 {
            last_crlf_end = e + l;
        }
        last_start = e;
        e += l;
        chars += 1;
    }
    if last_crlf_end != 0 {
        last_crlf_end
    } else if chars >= STACK_LIMIT_RUN {
        // `fancy-regex` fails here; `tokenizers` keeps the rest of the text as one piece.
        n
    } else if e == n || last_start == i {
        e
    } else {
        last_start
    }
}

/// Calls `f` with each piece of `text`, in order. The pieces tile `text`.
///
/// `max_digits` is 1 for the Qwen pattern and 3 for the Llama-3 pattern.
#[inline]
pub(crate) fn for_each_piece(text: &str, max_digits: usize, mut f: impl FnMut(&[u8])) {
    let t = table();
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let e = match_at(t, b, i, max_digits);
        f(&b[i..e]);
        i = e;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(s: &str, digits: usize) -> Vec<String> {
        let mut v = Vec::new();
        for_each_piece(s, digits, |p| v.push(String::from_utf8(p.to_vec()).unwrap()));
        v
    }

    /// The contraction letters match exactly their case folds as `regex-syntax` computes them.
    #[test]
    fn contraction_case_folds_match_regex_syntax() {
        use regex_syntax::hir::{Class, HirKind};
        for letter in ['s', 't', 'r', 'e', 'v', 'm', 'l', 'd'] {
            let hir = regex_syntax::Parser::new().parse(&format!("(?i:{letter})")).unwrap();
            let HirKind::Class(Class::Unicode(class)) = hir.kind() else { panic!("{letter}: {hir:?}") };
            let folds: Vec<char> = class.iter().flat_map(|r| r.start()..=r.end()).collect();
            let mut want = vec![letter.to_ascii_uppercase(), letter];
            if letter == 's' {
                want.push('\u{17f}');
            }
            assert_eq!(folds, want, "{letter}");
            for c in folds {
                let s = c.to_string();
                assert!(fold_eq(s.as_bytes(), 0, letter as u8).is_some(), "{c:?}");
            }
        }
        assert!(fold_eq("k".as_bytes(), 0, b's').is_none());
    }

    /// The eight-byte letter scan agrees with the class table on every byte value in every lane.
    #[test]
    fn ascii_letter_mask_matches_the_table() {
        for v in 0..=255u8 {
            for lane in 0..8 {
                let mut w = [b'a'; 8];
                w[lane] = v;
                let m = ascii_letter_mask(u64::from_le_bytes(w));
                let letter = v < 0x80 && ASCII[v as usize] == LETTER;
                assert_eq!(m & (0x80 << (8 * lane)) != 0, letter, "byte {v:#x} in lane {lane}");
                assert_eq!(m | (0x80 << (8 * lane)), HIGH, "byte {v:#x} in lane {lane} moved another lane");
            }
        }
        let s = b"Hello, wonderful world of letters";
        assert_eq!(ascii_letters_end(s, 0), 5);
        assert_eq!(ascii_letters_end(s, 7), 16);
        assert_eq!(ascii_letters_end(s, 17), 22);
        assert_eq!(ascii_letters_end(s, 26), 26, "fewer than eight bytes left: the byte loop's");
        assert_eq!(ascii_letters_end("abcdefgh\u{e9}".as_bytes(), 0), 8);
    }

    #[test]
    fn basic_splits() {
        assert_eq!(pieces("Hello world", 1), ["Hello", " world"]);
        assert_eq!(pieces("a  b", 1), ["a", " ", " b"]);
        assert_eq!(pieces("a  ", 1), ["a", "  "]);
        assert_eq!(pieces("x 123", 1), ["x", " ", "1", "2", "3"]);
        assert_eq!(pieces("x 12345", 3), ["x", " ", "123", "45"]);
        assert_eq!(
            pieces("I'M here, they'LL go!\n\nok", 1),
            ["I", "'M", " here", ",", " they", "'LL", " go", "!\n\n", "ok"]
        );
        assert_eq!(pieces("it\u{17F}'\u{17F}", 1), ["it\u{17F}", "'\u{17F}"]);
        assert_eq!(pieces(" \n\n  x", 1), [" \n\n", " ", " x"]);
        assert_eq!(pieces("\tfoo", 1), ["\tfoo"]);
        assert_eq!(pieces("a \tfoo", 1), ["a", " ", "\tfoo"]);
        assert_eq!(pieces(" ...", 1), [" ..."]);
        assert_eq!(pieces("'sup", 1), ["'s", "up"]);
        assert_eq!(pieces("''", 1), ["''"]);
    }
}
