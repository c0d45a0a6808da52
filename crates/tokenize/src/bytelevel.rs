//! The GPT-2 byte <-> character map used by the `ByteLevel` pre-tokenizer.
//!
//! Printable bytes (`!`..=`~`, `¡`..=`¬`, `®`..=`ÿ`) map to the character with the same code point; the
//! remaining 68 bytes map, in increasing order, to U+0100, U+0101, ….

/// Character of each byte.
pub(crate) static BYTE_TO_CHAR: [char; 256] = {
    let mut t = ['\0'; 256];
    let mut n = 0u32;
    let mut b = 0usize;
    while b < 256 {
        let printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        t[b] = if printable {
            match char::from_u32(b as u32) {
                Some(c) => c,
                None => panic!(),
            }
        } else {
            let c = match char::from_u32(256 + n) {
                Some(c) => c,
                None => panic!(),
            };
            n += 1;
            c
        };
        b += 1;
    }
    t
};

/// Byte of a byte-level character, if it is one.
#[inline]
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    static INV: [i16; 324] = {
        let mut t = [-1i16; 324];
        let mut b = 0;
        while b < 256 {
            t[BYTE_TO_CHAR[b] as usize] = b as i16;
            b += 1;
        }
        t
    };
    match INV.get(c as usize) {
        Some(&v) if v >= 0 => Some(v as u8),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bijection() {
        assert_eq!(BYTE_TO_CHAR[b' ' as usize], 'Ġ');
        assert_eq!(BYTE_TO_CHAR[b'\n' as usize], 'Ċ');
        assert_eq!(BYTE_TO_CHAR[b'a' as usize], 'a');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(BYTE_TO_CHAR[b as usize]), Some(b));
        }
        assert_eq!(char_to_byte(' '), None);
        assert_eq!(char_to_byte('中'), None);
    }
}
