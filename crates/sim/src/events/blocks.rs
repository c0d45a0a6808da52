//! What one admission announces: the simulated engine's own block hashes, each block's extra keys, and
//! the `BlockStored` events for the blocks it newly cached.
//!
//! Engine hashes are chained like vLLM's (`H_i = hash(H_{i−1}, block i's token ids, block i's extra
//! keys)`, from a fixed root), but with the simulator's own function and seed: they are deliberately not
//! the router's block keys, so a router that relies on engine hashes for anything but opaque ids (parent
//! links, removals) fails against the simulator as it would against vLLM.
//!
//! Extra keys follow vLLM's order per block: every image overlapping the block as `[identifier,
//! image start − block start]` (negative for an image continuing from an earlier block), then, in block
//! 0 only, the request's `cache_salt`.
//!
//! SGLang has no extra keys: its events carry image positions as pad token ids, `1_000_000 + (key &
//! (2^30 − 1))` with `key` a hash of the image's identifier (the value older SGLang releases and Dynamo
//! use), so they match a router's keys only on the text before the first image.

use std::ops::Range;

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use super::wire::{ExtraKey, Stored};
use crate::options::KvEventsFormat;
use crate::prompt::{SimImage, SimPrompt};

/// Seed of the simulated engine's block hash (`"sim-engn"`), unrelated to any key the router computes.
const ENGINE_SEED: u64 = 0x7369_6d2d_656e_676e;
/// Seed of the per-image key behind SGLang pad values (`"sim-sgpd"`).
const PAD_SEED: u64 = 0x7369_6d2d_7367_7064;
/// SGLang's pad values start above every real vocabulary id.
const PAD_BASE: u32 = 1_000_000;
const PAD_MASK: u64 = (1 << 30) - 1;

/// The announceable blocks of one prompt: its full blocks that have both a key and token ids.
pub(crate) struct PromptBlocks<'a> {
    prompt: &'a SimPrompt,
    block_size: usize,
    /// Engine hash of each announceable block.
    pub hashes: Vec<u64>,
}

impl<'a> PromptBlocks<'a> {
    /// `None` when the prompter gave no token ids: such a request announces nothing.
    pub fn new(prompt: &'a SimPrompt, block_size: usize) -> Option<PromptBlocks<'a>> {
        let n = prompt.block_keys.len().min(prompt.token_ids.len() / block_size.max(1));
        if n == 0 {
            return None;
        }
        let mut blocks = PromptBlocks { prompt, block_size, hashes: Vec::with_capacity(n) };
        let mut parent = root_hash();
        for i in 0..n {
            parent = engine_hash(parent, &prompt.token_ids[blocks.tokens(i..i + 1)], blocks.extra_keys(i).as_deref());
            blocks.hashes.push(parent);
        }
        Some(blocks)
    }

    /// The router key of block `i`.
    pub fn key(&self, i: usize) -> u64 {
        self.prompt.block_keys[i]
    }

    /// Runs of consecutive blocks among the announceable ones whose keys are in `stored` (the cache's
    /// newly stored keys, in prompt order).
    pub fn new_runs(&self, stored: &[u64]) -> Vec<Range<usize>> {
        let mut runs: Vec<Range<usize>> = Vec::new();
        let mut next = stored.iter().peekable();
        for i in 0..self.hashes.len() {
            if next.peek() != Some(&&self.key(i)) {
                continue;
            }
            next.next();
            match runs.last_mut() {
                Some(run) if run.end == i => run.end = i + 1,
                _ => runs.push(i..i + 1),
            }
        }
        runs
    }

    /// The `BlockStored` event of `run`, shaped for `format`.
    pub fn stored(&self, run: Range<usize>, format: KvEventsFormat) -> Stored {
        let tokens = self.tokens(run.clone());
        let mut stored = Stored {
            hashes: self.hashes[run.clone()].to_vec(),
            parent: run.start.checked_sub(1).map(|p| self.hashes[p]),
            token_ids: self.prompt.token_ids[tokens.clone()].to_vec(),
            block_size: u32::try_from(self.block_size).unwrap_or(u32::MAX),
            ..Stored::default()
        };
        match format {
            KvEventsFormat::VllmArray | KvEventsFormat::VllmMap => {
                let keys: Vec<Option<Vec<ExtraKey>>> = run.map(|i| self.extra_keys(i)).collect();
                stored.extra_keys = keys.iter().any(Option::is_some).then_some(keys);
            }
            KvEventsFormat::Sglang => {
                pad_images(&mut stored.token_ids, tokens.start, &self.prompt.images);
                // SGLang salts every store of a salted request (`BlockStoredWithMetadata`).
                stored.cache_salt = self.prompt.cache_salt.clone();
            }
        }
        stored
    }

    fn tokens(&self, blocks: Range<usize>) -> Range<usize> {
        blocks.start * self.block_size..blocks.end * self.block_size
    }

    /// vLLM's extra keys of block `i`: overlapping images, then the salt in block 0.
    fn extra_keys(&self, i: usize) -> Option<Vec<ExtraKey>> {
        let Range { start, end } = self.tokens(i..i + 1);
        let (start, end) = (start as u64, end as u64);
        let mut keys: Vec<ExtraKey> = self
            .prompt
            .images
            .iter()
            .filter(|img| {
                img.len > 0 && u64::from(img.offset) < end && u64::from(img.offset) + u64::from(img.len) > start
            })
            .map(|img| ExtraKey::Mm { id: img.identifier.clone(), offset: i64::from(img.offset) - start as i64 })
            .collect();
        if i == 0 {
            keys.extend(self.prompt.cache_salt.iter().map(|salt| ExtraKey::Salt(salt.clone())));
        }
        (!keys.is_empty()).then_some(keys)
    }
}

fn root_hash() -> u64 {
    xxh3_64(b"mmrouter-sim engine root")
}

/// One chained engine hash. Counts and lengths are explicit, so different inputs never serialise alike.
fn engine_hash(parent: u64, tokens: &[u32], extra: Option<&[ExtraKey]>) -> u64 {
    let mut buf = Vec::with_capacity(16 + 4 * tokens.len());
    buf.extend_from_slice(&parent.to_le_bytes());
    buf.extend_from_slice(&(tokens.len() as u64).to_le_bytes());
    tokens.iter().for_each(|t| buf.extend_from_slice(&t.to_le_bytes()));
    for key in extra.unwrap_or_default() {
        let (tag, text, offset) = match key {
            ExtraKey::Mm { id, offset } => (1u8, id, *offset),
            ExtraKey::Salt(salt) => (2u8, salt, 0),
        };
        buf.push(tag);
        buf.extend_from_slice(&(text.len() as u64).to_le_bytes());
        buf.extend_from_slice(text.as_bytes());
        buf.extend_from_slice(&offset.to_le_bytes());
    }
    xxh3_64_with_seed(&buf, ENGINE_SEED)
}

/// SGLang's pad value for every position of an image named `identifier`.
pub(crate) fn pad_value(identifier: &str) -> u32 {
    // Masked to 30 bits, so the sum stays far below u32::MAX.
    PAD_BASE + (xxh3_64_with_seed(identifier.as_bytes(), PAD_SEED) & PAD_MASK) as u32
}

/// Replaces the image positions of `tokens` (which start at prompt position `at`) by pad values.
fn pad_images(tokens: &mut [u32], at: usize, images: &[SimImage]) {
    let window = at..at + tokens.len();
    for image in images {
        let span = image.offset as usize..image.offset as usize + image.len as usize;
        let pad = pad_value(&image.identifier);
        for pos in span.start.max(window.start)..span.end.min(window.end) {
            tokens[pos - at] = pad;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BS: usize = 4;

    fn prompt(n_tokens: u32, images: Vec<SimImage>, salt: Option<&str>) -> SimPrompt {
        SimPrompt {
            prompt_tokens: n_tokens,
            block_keys: (0..u64::from(n_tokens) / BS as u64).map(|i| 100 + i).collect(),
            token_ids: (1..=n_tokens).collect(),
            images,
            cache_salt: salt.map(str::to_owned),
        }
    }

    fn image(offset: u32, len: u32, id: &str) -> SimImage {
        SimImage { offset, len, identifier: id.to_owned(), feature_tokens: len, ..SimImage::default() }
    }

    #[test]
    fn no_token_ids_announce_nothing() {
        let mut p = prompt(8, Vec::new(), None);
        p.token_ids.clear();
        assert!(PromptBlocks::new(&p, BS).is_none());
        assert!(PromptBlocks::new(&prompt(3, Vec::new(), None), BS).is_none(), "no full block");
    }

    #[test]
    fn hashes_chain_and_differ_from_the_router_keys() {
        let p = prompt(9, Vec::new(), None);
        let blocks = PromptBlocks::new(&p, BS).expect("blocks");
        assert_eq!(blocks.hashes.len(), 2, "the partial block is not hashed");
        assert!(blocks.hashes.iter().all(|h| !p.block_keys.contains(h)));
        let mut other = prompt(9, Vec::new(), None);
        other.token_ids[5] = 99;
        let changed = PromptBlocks::new(&other, BS).expect("blocks");
        assert_eq!(changed.hashes[0], blocks.hashes[0]);
        assert_ne!(changed.hashes[1], blocks.hashes[1]);
        let salted = prompt(9, Vec::new(), Some("tenant"));
        let salted = PromptBlocks::new(&salted, BS).expect("blocks");
        assert!(salted.hashes.iter().zip(&blocks.hashes).all(|(a, b)| a != b), "the salt changes the whole chain");
    }

    #[test]
    fn runs_follow_the_newly_stored_keys() {
        let p = prompt(20, Vec::new(), None);
        let blocks = PromptBlocks::new(&p, BS).expect("blocks");
        assert_eq!(blocks.new_runs(&[100, 101, 102, 103, 104]), vec![0..5]);
        assert_eq!(blocks.new_runs(&[102, 103]), vec![2..4]);
        assert_eq!(blocks.new_runs(&[101, 103, 104]), vec![1..2, 3..5]);
        assert!(blocks.new_runs(&[]).is_empty());
        let stored = blocks.stored(2..4, KvEventsFormat::VllmMap);
        assert_eq!(stored.parent, Some(blocks.hashes[1]));
        assert_eq!(stored.token_ids, (9..=16).collect::<Vec<u32>>());
        assert_eq!(stored.extra_keys, None);
        assert_eq!(blocks.stored(0..1, KvEventsFormat::VllmMap).parent, None, "chain root");
    }

    #[test]
    fn extra_keys_name_every_overlapping_image_then_the_salt() {
        // Image a covers 2..6 (blocks 0 and 1), image b 8..9 (block 2).
        let p = prompt(12, vec![image(2, 4, "a"), image(8, 1, "b")], Some("s"));
        let blocks = PromptBlocks::new(&p, BS).expect("blocks");
        let mm = |id: &str, offset| ExtraKey::Mm { id: id.into(), offset };
        let stored = blocks.stored(0..3, KvEventsFormat::VllmArray);
        assert_eq!(
            stored.extra_keys,
            Some(vec![
                Some(vec![mm("a", 2), ExtraKey::Salt("s".into())]),
                Some(vec![mm("a", -2)]),
                Some(vec![mm("b", 0)])
            ])
        );
        let later = blocks.stored(1..2, KvEventsFormat::VllmMap);
        assert_eq!(later.extra_keys, Some(vec![Some(vec![mm("a", -2)])]), "the salt is block 0's only");
        let renamed = prompt(12, vec![image(2, 4, "z"), image(8, 1, "b")], Some("s"));
        let renamed = PromptBlocks::new(&renamed, BS).expect("blocks");
        assert_ne!(renamed.hashes[0], blocks.hashes[0], "identifiers enter the hash");
    }

    #[test]
    fn sglang_pads_image_positions_and_keeps_the_salt_as_metadata() {
        let p = prompt(12, vec![image(2, 4, "a")], Some("s"));
        let blocks = PromptBlocks::new(&p, BS).expect("blocks");
        let pad = pad_value("a");
        assert!((PAD_BASE..PAD_BASE + (1 << 30)).contains(&pad));
        let stored = blocks.stored(0..3, KvEventsFormat::Sglang);
        assert_eq!(stored.token_ids, vec![1, 2, pad, pad, pad, pad, 7, 8, 9, 10, 11, 12]);
        assert_eq!((stored.extra_keys, stored.cache_salt.as_deref()), (None, Some("s")));
        let tail = blocks.stored(1..2, KvEventsFormat::Sglang);
        assert_eq!(tail.token_ids, vec![pad, pad, 7, 8]);
        assert_eq!(tail.cache_salt.as_deref(), Some("s"), "every salted store carries it");
        assert_eq!(tail.hashes, blocks.stored(1..2, KvEventsFormat::VllmMap).hashes, "same ids in every format");
    }
}
