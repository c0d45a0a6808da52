//! Splitting the raw input on added tokens, like `tokenizers`' `AddedVocabulary` does for tokens with
//! `normalized: false` and no `lstrip` / `rstrip` / `single_word`: left-most-longest literal matching on
//! the original (not normalized) text, scanning on after each match.

/// The literal added tokens and their ids.
pub(crate) struct AddedTokens {
    /// Tokens bucketed by first byte, longest first.
    by_first: Vec<Vec<(Box<[u8]>, u32)>>,
    /// Distinct first bytes (for `memchr`-style scanning).
    firsts: Vec<u8>,
}

impl AddedTokens {
    /// `tokens`: (content, id); contents must be distinct and non-empty.
    pub(crate) fn new(tokens: &[(String, u32)]) -> AddedTokens {
        let mut by_first: Vec<Vec<(Box<[u8]>, u32)>> = vec![Vec::new(); 256];
        for (content, id) in tokens {
            let b = content.as_bytes();
            by_first[b[0] as usize].push((b.into(), *id));
        }
        let mut firsts = Vec::new();
        for (i, bucket) in by_first.iter_mut().enumerate() {
            // Longest first, so the first hit at a position is the longest one.
            bucket.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
            if !bucket.is_empty() {
                firsts.push(i as u8);
            }
        }
        AddedTokens { by_first, firsts }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.firsts.is_empty()
    }

    #[inline]
    fn next_candidate(&self, b: &[u8], from: usize) -> Option<usize> {
        let hay = &b[from..];
        let found = match *self.firsts.as_slice() {
            [] => None,
            [x] => memchr::memchr(x, hay),
            [x, y] => memchr::memchr2(x, y, hay),
            [x, y, z] => memchr::memchr3(x, y, z, hay),
            _ => hay.iter().position(|c| !self.by_first[*c as usize].is_empty()),
        };
        found.map(|p| p + from)
    }

    /// The left-most-longest match at or after `from`: `(start, end, id)`.
    #[inline]
    pub(crate) fn find(&self, b: &[u8], mut from: usize) -> Option<(usize, usize, u32)> {
        while let Some(i) = self.next_candidate(b, from) {
            for (tok, id) in &self.by_first[b[i] as usize] {
                if b[i..].starts_with(tok) {
                    return Some((i, i + tok.len(), *id));
                }
            }
            from = i + 1;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftmost_longest() {
        let a = AddedTokens::new(&[("<a>".into(), 1), ("<a><b>".into(), 2), ("b>".into(), 3), ("<".into(), 4)]);
        assert_eq!(a.find(b"xx<a><b>", 0), Some((2, 8, 2)));
        assert_eq!(a.find(b"xx<a>b>", 0), Some((2, 5, 1)));
        assert_eq!(a.find(b"xxb><a>", 0), Some((2, 4, 3)));
        assert_eq!(a.find(b"x<", 0), Some((1, 2, 4)));
        assert_eq!(a.find(b"xyz", 0), None);
    }
}
