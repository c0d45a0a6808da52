//! Long texts encoded in parallel, in parts cut where the encoding of the whole is the concatenation
//! of the parts' encodings.
//!
//! A text is normalized (NFC), split into pieces by the pre-tokenizer and each piece BPE-encoded on its
//! own, so a cut at a position that is a piece boundary whatever came before it, and that NFC cannot
//! move, gives the same ids in two halves as in one. Two kinds of positions `p` are such cuts
//! (`b` the text's bytes):
//!
//! * `b[p-1]` is `\n` and `b[p]` is an ASCII character that is not white space. Every alternative of
//!   the split regex that can take a `\n` (`\s*[\r\n]+`, which comes before the other white-space
//!   alternatives, and the `[\r\n]*` tail of the punctuation one) ends at the end of the CR/LF or
//!   white-space run, which is `p`; no other alternative takes a `\n`.
//! * `b[p-1]` and `b[p+1]` are ASCII letters and `b[p]` a space: every alternative that takes a letter
//!   ends with the run of letters it is in (the contractions end with their letters too), which is `p`.
//!
//! Both characters around such a cut are starters that compose with nothing on the other side, so NFC
//! of the parts is NFC of the whole. One more condition: the pre-tokenizer's one context-dependent rule,
//! the rest of the text as one piece after a white-space run of [`STACK_LIMIT_RUN`] characters, cannot
//! apply to a text shorter than that many bytes, and longer texts are never cut.
//!
//! Parts run on rayon's pool, and only while no other encode is running in the process: a router
//! under load already has every core planning its own request, and splitting would only add the
//! hand-off; an idle router gives its spare cores to the one long prompt it is planning.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::pretok::STACK_LIMIT_RUN;
use crate::unicode::{ASCII, LETTER, SPACE};

/// Texts shorter than this are encoded on the calling thread (~4 000 tokens of prose: ~150 µs on one
/// core, against the tens of microseconds a hand-off to another thread costs).
pub(crate) const PARALLEL_MIN_BYTES: usize = 16 * 1024;

/// Encodes running in the process now (see the module docs).
static RUNNING: AtomicUsize = AtomicUsize::new(0);

/// Counts one running encode while alive.
pub(crate) struct Running {
    alone: bool,
}

impl Running {
    pub(crate) fn start() -> Running {
        Running { alone: RUNNING.fetch_add(1, Ordering::Relaxed) == 0 }
    }

    /// No other encode was running when this one started.
    pub(crate) fn alone(&self) -> bool {
        self.alone
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Whether the text may be cut at all (see the module docs).
pub(crate) fn cuttable(len: usize) -> bool {
    (PARALLEL_MIN_BYTES..STACK_LIMIT_RUN).contains(&len)
}

/// Whether `p` is a safe cut of `b` (see the module docs).
pub(crate) fn is_cut(b: &[u8], p: usize) -> bool {
    if p == 0 || p + 1 >= b.len() {
        return false;
    }
    let ascii_class = |c: u8| (c < 0x80).then(|| ASCII[c as usize]);
    let after_newline = b[p - 1] == b'\n' && ascii_class(b[p]).is_some_and(|k| k != SPACE);
    let between_words = b[p] == b' ' && ascii_class(b[p - 1]) == Some(LETTER) && ascii_class(b[p + 1]) == Some(LETTER);
    after_newline || between_words
}

/// The safe cut nearest to `target` within `window` bytes either side, if any.
pub(crate) fn cut_near(b: &[u8], target: usize, window: usize) -> Option<usize> {
    (0..=window).find_map(|d| {
        let ahead = target + d;
        let behind = target.checked_sub(d);
        [Some(ahead), behind].into_iter().flatten().find(|&p| is_cut(b, p))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::normalize::nfc;
    use crate::pretok::for_each_piece;

    fn pieces(s: &str) -> Vec<String> {
        let mut v = Vec::new();
        for_each_piece(s, 1, |p| v.push(String::from_utf8(p.to_vec()).unwrap()));
        v
    }

    fn normalized(s: &str) -> String {
        nfc(s).unwrap_or_else(|| s.to_owned())
    }

    /// A small xorshift generator: deterministic texts without a dependency.
    fn texts(seed: u64, n: usize) -> Vec<String> {
        const ATOMS: &[&str] = &[
            "a", "word", "The", " ", "  ", "\n", "\n\n", "\r\n", " \n ", "\t", "'s", "'LL", "it's", "123", "4", ".",
            "!!", " ...", "東京", "é", "e\u{301}", "\u{301}", "\u{17F}", "Ⅻ", "\u{a0}", "\u{3000}", "x y", "-",
        ];
        let mut x = seed | 1;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        (0..n).map(|_| (0..40).map(|_| ATOMS[next() as usize % ATOMS.len()]).collect()).collect()
    }

    #[test]
    fn a_cut_splits_pieces_and_normalization_exactly() {
        let mut cuts = 0;
        for text in texts(0x5EED, 4000) {
            let b = text.as_bytes();
            for p in (1..b.len()).filter(|&p| is_cut(b, p)) {
                let (head, tail) = text.split_at(p);
                let whole = pieces(&normalized(&text));
                let mut parts = pieces(&normalized(head));
                parts.extend(pieces(&normalized(tail)));
                assert_eq!(parts, whole, "cut at {p} of {text:?}");
                cuts += 1;
            }
        }
        assert!(cuts > 1000, "only {cuts} cuts were tried");
    }

    #[test]
    fn cuts_are_found_near_the_target() {
        let b = b"alpha beta\ngamma";
        assert_eq!(cut_near(b, 5, 0), Some(5));
        assert_eq!(cut_near(b, 8, 3), Some(11), "ahead before behind at the same distance");
        assert_eq!(cut_near(b, 11, 0), Some(11));
        assert_eq!(cut_near("東京東京".as_bytes(), 6, 6), None);
        assert!(!is_cut(b"a b", 0) && !is_cut(b"a b", 2));
        assert!(!cuttable(PARALLEL_MIN_BYTES - 1) && cuttable(PARALLEL_MIN_BYTES) && !cuttable(STACK_LIMIT_RUN));
    }

    #[test]
    fn only_a_lone_encode_may_split() {
        let first = Running::start();
        let second = Running::start();
        assert!(!second.alone(), "another encode is running");
        drop((first, second));
    }
}
