//! Block keys: the names the router's index is keyed by, computed the same way from a planned prompt and
//! from a worker's KV events, so the two always agree (see `routing/events.rs`).
//!
//! * An image's key: the first 16 bytes of its BLAKE3 content digest ([`ImageDigest::key`]), or, for an
//!   image named by some other identifier in an event, a hash of that name ([`image_key`]).
//! * A chain's [`seed`]: model, LoRA adapter and `cache_salt`, so requests differing in any never share a key.
//! * Chained block keys, shaped like vLLM's prefix-cache hashes: one key per *full* block, each covering
//!   its whole prefix (the previous key is hashed in, [`chain_key`]), with the images overlapping the block
//!   as extra keys (image key + start offset relative to the block, negative for an image continuing from
//!   an earlier block); [`block_keys`] cuts a whole prompt.
//!
//! Hash input is fixed-width little-endian with explicit counts and lengths, so two different inputs never
//! serialise to the same bytes. A leaf: it imports nothing of the crate, so the planner, intake and the
//! event side of routing can all use it without knowing each other.

use xxhash_rust::xxh3::{xxh3_128, xxh3_64};

/// An image's identity: BLAKE3 of its raw (encoded) bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImageDigest(pub [u8; 32]);

impl ImageDigest {
    pub fn of(bytes: &[u8]) -> ImageDigest {
        ImageDigest(*blake3::hash(bytes).as_bytes())
    }

    /// The key block hashing uses: the digest's first 16 bytes, big-endian.
    pub fn key(&self) -> u128 {
        let mut head = [0u8; 16];
        head.copy_from_slice(&self.0[..16]);
        u128::from_be_bytes(head)
    }

    /// 64 lowercase hex digits: the `uuid` vLLM is given, and its KV events' identifier.
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl std::fmt::Debug for ImageDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ImageDigest({})", self.hex())
    }
}

/// The block-hash key of an image named `identifier` in a worker's KV events: the router's own
/// digests (64 hex digits) map back to their [`ImageDigest::key`]; any other name (a trusted client
/// uuid, an engine's own hash) is keyed by a hash of the name, as the router keys it when it routes.
pub fn image_key(identifier: &str) -> u128 {
    let hex = identifier.as_bytes();
    if hex.len() == 64 && hex.iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b)) {
        if let Ok(key) = u128::from_str_radix(&identifier[..32], 16) {
            return key;
        }
    }
    xxh3_128(identifier.as_bytes())
}

/// Where one image's run sits in the expanded prompt, and what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ImageSpan {
    pub offset: u32,
    pub len: u32,
    /// Content identity of the image (hash of its raw bytes).
    pub hash: u128,
}

impl ImageSpan {
    pub fn end(&self) -> u64 {
        u64::from(self.offset) + u64::from(self.len)
    }
}

/// Keys of the full blocks of `ids` (a partial tail block gets none). `key_i = xxh3_64(key_{i-1}
/// ‖ block_size ‖ the block's ids ‖ n ‖ n × (image hash ‖ image offset − block start))`, with
/// `key_{-1} = seed`. A `block_size` of 0 yields no keys.
pub fn block_keys(ids: &[u32], spans: &[ImageSpan], block_size: usize, seed: u64) -> Vec<u64> {
    if block_size == 0 {
        return Vec::new();
    }
    // Sorted by start so one forward cursor skips the images that ended before a block.
    let mut spans: Vec<ImageSpan> = spans.iter().copied().filter(|s| s.len > 0).collect();
    spans.sort_unstable_by_key(|s| (s.offset, s.len, s.hash));

    let mut keys = Vec::with_capacity(ids.len() / block_size);
    let mut buf: Vec<u8> = Vec::with_capacity(8 + 8 + 4 * block_size + 4 + 24 * 2);
    let mut extras: Vec<(u128, i64)> = Vec::new();
    let mut prev = seed;
    let mut first = 0;
    for (index, block) in ids.chunks_exact(block_size).enumerate() {
        let start = (index * block_size) as u64;
        let end = start + block_size as u64;
        while first < spans.len() && spans[first].end() <= start {
            first += 1;
        }
        extras.clear();
        for span in spans[first..].iter().take_while(|s| u64::from(s.offset) < end) {
            if span.end() > start {
                // Both sides < 2^33, so the difference always fits.
                extras.push((span.hash, i64::from(span.offset) - start as i64));
            }
        }
        prev = chain_key(prev, block, &extras, &mut buf);
        keys.push(prev);
    }
    keys
}

/// One link of the chain: the key of a full block given its parent's key (or the seed), its token
/// ids, and the images overlapping it as (image key, image start − block start). The same function
/// turns a worker's KV event (tokens + `extra_keys`) into the key the router computes for the same
/// prompt. `buf` is scratch space.
pub fn chain_key(prev: u64, block: &[u32], extras: &[(u128, i64)], buf: &mut Vec<u8>) -> u64 {
    if extras.is_empty() && block.len() <= INLINE_TOKENS {
        return chain_key_inline(prev, block);
    }
    chain_key_in(prev, block, extras, buf)
}

/// Blocks up to this many tokens without images are written to the stack (the common case: text
/// blocks of 16), the same bytes [`chain_key_in`] writes, without a length check per token.
const INLINE_TOKENS: usize = 32;

fn chain_key_inline(prev: u64, block: &[u32]) -> u64 {
    let mut a = [0u8; 16 + 4 * INLINE_TOKENS + 4];
    a[..8].copy_from_slice(&prev.to_le_bytes());
    a[8..16].copy_from_slice(&(block.len() as u64).to_le_bytes());
    for (dst, id) in a[16..].chunks_exact_mut(4).zip(block) {
        dst.copy_from_slice(&id.to_le_bytes());
    }
    // The image count (0) is already zero.
    xxh3_64(&a[..16 + 4 * block.len() + 4])
}

fn chain_key_in(prev: u64, block: &[u32], extras: &[(u128, i64)], buf: &mut Vec<u8>) -> u64 {
    buf.clear();
    buf.extend_from_slice(&prev.to_le_bytes());
    buf.extend_from_slice(&(block.len() as u64).to_le_bytes());
    for id in block {
        buf.extend_from_slice(&id.to_le_bytes());
    }
    buf.extend_from_slice(&(extras.len() as u32).to_le_bytes());
    for (key, offset) in extras {
        buf.extend_from_slice(&key.to_le_bytes());
        buf.extend_from_slice(&offset.to_le_bytes());
    }
    xxh3_64(buf)
}

/// The chain seed for a model, an optional LoRA adapter (when the request names one) and an
/// optional `cache_salt`: requests differing in any of them never share a block key.
pub fn seed(model: &str, lora: Option<&str>, cache_salt: Option<&str>) -> u64 {
    let mut buf = Vec::with_capacity(64 + model.len());
    buf.extend_from_slice(b"mmrouter.kv-seed.v1\0");
    put_str(&mut buf, model);
    put_opt_str(&mut buf, lora);
    put_opt_str(&mut buf, cache_salt);
    xxh3_64(&buf)
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

fn put_opt_str(buf: &mut Vec<u8>, s: Option<&str>) {
    match s {
        None => buf.push(0),
        Some(s) => {
            buf.push(1);
            put_str(buf, s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_chain_keys_are_the_written_ones() {
        let mut buf = Vec::new();
        for len in 0..=INLINE_TOKENS + 2 {
            let block: Vec<u32> = (0..len as u32).map(|i| i.wrapping_mul(0x9E37_79B9) ^ 151_643).collect();
            let key = chain_key(0xDEAD_BEEF, &block, &[], &mut buf);
            assert_eq!(key, chain_key_in(0xDEAD_BEEF, &block, &[], &mut buf), "{len} tokens");
            let image = [(7u128 << 90, -3i64)];
            assert_ne!(chain_key(0xDEAD_BEEF, &block, &image, &mut buf), key, "an image changes the key");
        }
    }

    #[test]
    fn digest_keys_and_identifiers_agree() {
        let d = ImageDigest::of(b"an image");
        assert_eq!(d.hex().len(), 64);
        assert_eq!(image_key(&d.hex()), d.key(), "the router's uuid maps back to its key");
        assert_ne!(image_key("client-chosen-id"), d.key());
        assert_eq!(image_key("client-chosen-id"), image_key("client-chosen-id"));
        // Upper-case hex is not ours (we write lower case): keyed as a name.
        assert_ne!(image_key(&d.hex().to_uppercase()), d.key());
    }

    #[test]
    fn seed_sections_are_unambiguous() {
        // Same concatenated text, different split between fields.
        assert_ne!(seed("ab", Some("c"), None), seed("a", Some("bc"), None));
        assert_ne!(seed("m", Some("x"), None), seed("m", None, Some("x")));
        assert_ne!(seed("m", Some(""), None), seed("m", None, None));
    }

    #[test]
    fn zero_length_span_is_ignored_and_zero_block_size_gives_nothing() {
        let ids: Vec<u32> = (0..8).collect();
        let empty = [ImageSpan { offset: 2, len: 0, hash: 9 }];
        assert_eq!(block_keys(&ids, &empty, 4, 1), block_keys(&ids, &[], 4, 1));
        assert!(block_keys(&ids, &[], 0, 1).is_empty());
    }
}
