//! Router-side block keys from a worker's own KV-cache events (what Dynamo and llm-d do): the
//! engine's block hashes are opaque ids, used only to link a block to its parent and to find what a
//! `BlockRemoved` removes; the key the index stores is recomputed from the event's token ids and
//! `extra_keys` with the same [`chain_key`] the planner uses, so a block the engine stores gets exactly
//! the key the router computes for the same prompt.
//!
//! * The chain's root uses the planner's [`seed`]: the pool's model name, the event's `lora_name`, and
//!   the `cache_salt` vLLM puts among the root block's bare-string extra keys (after the LoRA name).
//! * Image items `[identifier, offset]` become (`image_key(identifier)`, offset): the router writes its
//!   own content digest as each image's vLLM `uuid`, so a vLLM event names the image the way the
//!   planner keys it.
//! * Only full-attention, device-tier (GPU), local blocks of the pool's block size count. A block the
//!   router cannot key (token ids above u32, e.g. SGLang's image pad values; prompt-embeds digests) is
//!   remembered as unmatchable so its descendants are too. A block whose parent was never seen (stored
//!   before the subscription started) is an orphan: counted and skipped — its prompt cannot be keyed.
//! * Data-parallel ranks keep separate engine-hash maps; a key stays held while any rank holds it.
//! * Bounded: at most `max_blocks` engine hashes per worker; beyond that the worker's state is reset (as
//!   for a resync), so a misbehaving publisher cannot grow memory without bound.

use std::collections::HashMap;

use mmrouter_kv_events::{BlockRemoved, BlockStored, EventBatch, ExtraKey, KvEvent};

use crate::keys::{chain_key, image_key, seed};

/// What one batch changes in the index for its worker, in order: clear (if set), remove, store.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct EventOps {
    /// The worker's event-sourced blocks are gone (`AllBlocksCleared`, or the state bound was hit).
    pub cleared: bool,
    pub removed: Vec<u64>,
    pub stored: Vec<u64>,
}

/// What happened to the events of one worker (for metrics).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EventCounts {
    pub stored_blocks: u64,
    pub removed_blocks: u64,
    pub cleared: u64,
    /// Blocks of another tier (CPU, disk, …), group (sliding window, mamba) or a remote locality.
    pub ignored_blocks: u64,
    /// Events whose block size is not the pool's.
    pub block_size_mismatch: u64,
    /// Blocks whose parent was never seen.
    pub orphan_blocks: u64,
    /// Blocks that cannot be keyed (wide token ids, prompt embeds) and their descendants.
    pub unmatchable_blocks: u64,
    /// Events with inconsistent fields (token count ≠ blocks × block size).
    pub malformed: u64,
    /// Unknown event tags.
    pub unknown: u64,
    /// Times the per-worker bound reset the state.
    pub overflows: u64,
}

/// One rank's engine hash → router key entries (`None`: unmatchable), as a snapshot carries them.
pub type RankMap = Vec<(u64, Option<u64>)>;

/// The event state of one worker: each rank's engine hash → router key (`None`: unmatchable), and how
/// many ranks hold each key.
pub struct WorkerEvents {
    model: String,
    block_size: u32,
    max_blocks: usize,
    /// Token ids at or above this are not the tokenizer's (SGLang's image pad values): unmatchable.
    vocab: u64,
    ranks: HashMap<u32, HashMap<u64, Option<u64>>>,
    holders: HashMap<u64, u32>,
    counts: EventCounts,
    buf: Vec<u8>,
}

impl WorkerEvents {
    /// `model` seeds block keys as the planner's `[model] name` does; `block_size` is the pool's.
    pub fn new(model: &str, block_size: u32, max_blocks: usize) -> WorkerEvents {
        WorkerEvents {
            model: model.to_owned(),
            block_size,
            max_blocks: max_blocks.max(1),
            vocab: u64::from(u32::MAX) + 1,
            ranks: HashMap::new(),
            holders: HashMap::new(),
            counts: EventCounts::default(),
            buf: Vec::new(),
        }
    }

    /// Token ids `>= vocab` make a block unmatchable: no prompt the router renders contains them
    /// (SGLang writes its image pad values, derived from the processed pixels, into `token_ids`).
    pub fn with_vocab(mut self, vocab: u32) -> WorkerEvents {
        self.vocab = u64::from(vocab);
        self
    }

    pub fn counts(&self) -> EventCounts {
        self.counts
    }

    /// Router keys the worker holds (on any rank): its cache's fill, in blocks.
    pub fn held(&self) -> usize {
        self.holders.len()
    }

    /// Engine hashes tracked over all ranks.
    pub fn tracked(&self) -> usize {
        self.ranks.values().map(HashMap::len).sum()
    }

    /// Forgets everything (the worker restarted, or a gap could not be replayed).
    pub fn reset(&mut self) {
        self.ranks.clear();
        self.holders.clear();
    }

    /// Every rank's engine hash → router key map (`None`: unmatchable), ranks in order: what a router
    /// replica hands a starting one, so that the blocks it later sees stored on top of these, and their
    /// removals, resolve there too.
    pub fn export(&self) -> Vec<(u32, RankMap)> {
        let mut ranks: Vec<_> =
            self.ranks.iter().map(|(&rank, map)| (rank, map.iter().map(|(&h, &k)| (h, k)).collect())).collect();
        ranks.sort_unstable_by_key(|(rank, _)| *rank);
        ranks
    }

    /// Adds a peer's map of one rank (see [`export`](Self::export)) to this state, within the state's
    /// bound (entries beyond it are dropped and counted as an overflow); returns the router keys of the
    /// entries it took (the caller's index needs them as `Event` entries).
    pub fn graft(&mut self, rank: u32, entries: &[(u64, Option<u64>)]) -> Vec<u64> {
        let (mut ops, counts) = (EventOps::default(), self.counts);
        let mut overflowed = false;
        for &(hash, key) in entries {
            if self.tracked() >= self.max_blocks {
                overflowed = true;
                break;
            }
            self.hold(rank, hash, key, &mut ops);
        }
        // A graft is no event of this worker's: its counters stay as they were.
        self.counts = counts;
        self.counts.overflows += u64::from(overflowed);
        ops.stored
    }

    /// Applies one batch; returns the index changes for this worker.
    pub fn apply(&mut self, batch: &EventBatch) -> EventOps {
        let mut ops = EventOps::default();
        for event in &batch.events {
            match event {
                KvEvent::BlockStored(s) => self.stored(batch.dp_rank, s, &mut ops),
                KvEvent::BlockRemoved(r) => self.removed(batch.dp_rank, r, &mut ops),
                KvEvent::AllBlocksCleared => self.clear(&mut ops),
                KvEvent::Unknown(_) => self.counts.unknown += 1,
            }
        }
        if self.tracked() > self.max_blocks {
            self.counts.overflows += 1;
            self.clear(&mut ops);
        }
        ops
    }

    fn clear(&mut self, ops: &mut EventOps) {
        self.reset();
        self.counts.cleared += 1;
        *ops = EventOps { cleared: true, ..EventOps::default() };
    }

    fn stored(&mut self, rank: u32, s: &BlockStored, ops: &mut EventOps) {
        let n = s.block_hashes.len();
        if !s.is_main_attention() || !s.is_device_tier() || s.is_remote() {
            self.counts.ignored_blocks += n as u64;
            return;
        }
        if s.block_size != self.block_size {
            self.counts.block_size_mismatch += 1;
            return;
        }
        if s.token_ids.len() != n * self.block_size as usize {
            self.counts.malformed += 1;
            return;
        }
        let mut prev = match &s.parent {
            None => Some(self.root_seed(s)),
            Some(parent) => match self.ranks.get(&rank).and_then(|m| m.get(&parent.id())) {
                Some(key) => *key,
                None => {
                    self.counts.orphan_blocks += n as u64;
                    return;
                }
            },
        };
        for (i, hash) in s.block_hashes.iter().enumerate() {
            let tokens = &s.token_ids[i * self.block_size as usize..(i + 1) * self.block_size as usize];
            let extras = s.extra_keys.as_ref().and_then(|e| e.get(i)).and_then(Option::as_ref);
            let key = match (prev, block_key_inputs(tokens, extras.map(Vec::as_slice), self.vocab)) {
                (Some(p), Some((ids, images))) => Some(chain_key(p, &ids, &images, &mut self.buf)),
                _ => None,
            };
            self.hold(rank, hash.id(), key, ops);
            prev = key;
        }
    }

    /// Records that `rank` holds engine block `hash` as `key`.
    fn hold(&mut self, rank: u32, hash: u64, key: Option<u64>, ops: &mut EventOps) {
        let old = self.ranks.entry(rank).or_default().insert(hash, key);
        if old == Some(key) {
            return; // announced again: already counted
        }
        if let Some(Some(old)) = old {
            self.release(old, ops);
        }
        match key {
            Some(k) => {
                *self.holders.entry(k).or_insert(0) += 1;
                self.counts.stored_blocks += 1;
                ops.stored.push(k);
            }
            None => self.counts.unmatchable_blocks += 1,
        }
    }

    fn release(&mut self, key: u64, ops: &mut EventOps) {
        if let Some(count) = self.holders.get_mut(&key) {
            *count -= 1;
            if *count == 0 {
                self.holders.remove(&key);
                ops.removed.push(key);
            }
        }
    }

    fn removed(&mut self, rank: u32, r: &BlockRemoved, ops: &mut EventOps) {
        if !r.is_main_attention() || !r.is_device_tier() || r.is_remote() {
            self.counts.ignored_blocks += r.block_hashes.len() as u64;
            return;
        }
        for hash in &r.block_hashes {
            let removed = self.ranks.get_mut(&rank).and_then(|m| m.remove(&hash.id()));
            if let Some(Some(key)) = removed {
                self.counts.removed_blocks += 1;
                self.release(key, ops);
            }
        }
    }

    /// The planner's seed for a chain root: the pool's model, the event's LoRA, and the salt vLLM lists
    /// among the root block's bare strings (after the LoRA name when there is one).
    fn root_seed(&self, s: &BlockStored) -> u64 {
        let lora = s.lora_name.as_deref();
        let root = s.extra_keys.as_ref().and_then(|e| e.first()).and_then(Option::as_ref);
        let mut strings = root.into_iter().flatten().filter_map(|k| match k {
            ExtraKey::Str(s) => Some(s.as_str()),
            _ => None,
        });
        let salt = strings.nth(usize::from(lora.is_some())).or(s.cache_salt.as_deref());
        seed(&self.model, lora, salt)
    }
}

/// A block as the planner keys it: its ids and its image items as (image key, offset).
type KeyInputs = (Vec<u32>, Vec<(u128, i64)>);

/// A block's key inputs; `None` when the router cannot key it (wide token ids, prompt embeds).
fn block_key_inputs(tokens: &[u64], extras: Option<&[ExtraKey]>, vocab: u64) -> Option<KeyInputs> {
    let ids = tokens.iter().map(|&t| (t < vocab).then_some(t as u32)).collect::<Option<Vec<u32>>>()?;
    let mut images = Vec::new();
    for extra in extras.unwrap_or_default() {
        match extra {
            ExtraKey::Mm { id, offset } => images.push((image_key(id), *offset)),
            // LoRA names and the salt are in the seed; an old integer LoRA id changes nothing here.
            ExtraKey::Str(_) | ExtraKey::Int(_) => {}
            ExtraKey::Bytes(_) | ExtraKey::Tuple(_) => return None,
        }
    }
    Some((ids, images))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{block_keys, ImageDigest, ImageSpan};
    use mmrouter_kv_events::EngineHash;

    const BS: u32 = 4;

    fn stored(
        hashes: &[u64],
        parent: Option<u64>,
        tokens: Vec<u64>,
        extra: Option<Vec<Option<Vec<ExtraKey>>>>,
    ) -> KvEvent {
        KvEvent::BlockStored(BlockStored {
            block_hashes: hashes.iter().map(|&h| EngineHash::Int(h)).collect(),
            parent: parent.map(EngineHash::Int),
            token_ids: tokens,
            block_size: BS,
            medium: Some("GPU".into()),
            extra_keys: extra,
            ..BlockStored::default()
        })
    }

    fn removed(hashes: &[u64]) -> KvEvent {
        KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: hashes.iter().map(|&h| EngineHash::Int(h)).collect(),
            ..BlockRemoved::default()
        })
    }

    fn batch(rank: u32, events: Vec<KvEvent>) -> EventBatch {
        EventBatch { ts: 0.0, dp_rank: rank, events }
    }

    #[test]
    fn event_keys_equal_the_planners_keys_for_the_same_prompt() {
        let ids: Vec<u32> = (100..112).collect();
        let digest = ImageDigest::of(b"a picture");
        // An image over tokens 2..7: in blocks 0 (offset 2) and 1 (offset -2).
        let span = ImageSpan { offset: 2, len: 5, hash: digest.key() };
        let planned = block_keys(&ids, &[span], BS as usize, seed("m", None, Some("tenant")));
        let mm = |offset| ExtraKey::Mm { id: digest.hex(), offset };
        let extra = [Some(vec![mm(2), ExtraKey::Str("tenant".into())]), Some(vec![mm(-2)]), None];
        let tokens: Vec<u64> = ids.iter().map(|&t| u64::from(t)).collect();
        let mut w = WorkerEvents::new("m", BS, 100);
        // Split over two events: the second names the first's last block as its parent.
        let first = w.apply(&batch(0, vec![stored(&[11, 12], None, tokens[..8].to_vec(), Some(extra[..2].to_vec()))]));
        let second = w.apply(&batch(0, vec![stored(&[13], Some(12), tokens[8..].to_vec(), Some(extra[2..].to_vec()))]));
        assert_eq!([first.stored, second.stored].concat(), planned);
        // A different image identifier gives different keys (no false image hit).
        let mut other = WorkerEvents::new("m", BS, 100);
        let wrong =
            vec![Some(vec![ExtraKey::Mm { id: "vllm-own-hash".into(), offset: 2 }, ExtraKey::Str("tenant".into())])];
        let ops = other.apply(&batch(0, vec![stored(&[21], None, tokens[..4].to_vec(), Some(wrong))]));
        assert_ne!(ops.stored[0], planned[0]);
    }

    #[test]
    fn a_grafted_state_resolves_later_children_and_removals_like_the_original() {
        let tokens: Vec<u64> = (0..12).collect();
        let mut a = WorkerEvents::new("m", BS, 100);
        let first = a.apply(&batch(1, vec![stored(&[1, 2], None, tokens[..8].to_vec(), None)]));
        let mut b = WorkerEvents::new("m", BS, 100);
        for (rank, entries) in a.export() {
            let mut keys = b.graft(rank, &entries);
            keys.sort_unstable();
            let mut want = first.stored.clone();
            want.sort_unstable();
            assert_eq!((rank, keys), (1, want));
        }
        assert_eq!(b.counts(), EventCounts::default(), "a graft counts no event");
        // A child stored on the grafted parent is no orphan, and gets the original's key.
        let child = batch(1, vec![stored(&[3], Some(2), tokens[8..].to_vec(), None)]);
        assert_eq!(b.apply(&child).stored, a.apply(&child).stored);
        assert_eq!(b.apply(&batch(1, vec![removed(&[1])])).removed, vec![first.stored[0]]);
        // Beyond the bound the graft stops and says so.
        let mut small = WorkerEvents::new("m", BS, 1);
        assert_eq!(small.graft(1, &a.export()[0].1).len(), 1);
        assert_eq!(small.counts().overflows, 1);
    }

    #[test]
    fn removals_follow_engine_hashes_and_ranks_share_keys() {
        let tokens: Vec<u64> = (0..8).collect();
        let mut w = WorkerEvents::new("m", BS, 100);
        let a = w.apply(&batch(0, vec![stored(&[1, 2], None, tokens.clone(), None)]));
        // Rank 1 holds the same prompt under other engine hashes: nothing new for the index.
        let b = w.apply(&batch(1, vec![stored(&[7, 8], None, tokens.clone(), None)]));
        assert_eq!(b.stored, a.stored);
        let gone = w.apply(&batch(0, vec![removed(&[2])]));
        assert!(gone.removed.is_empty(), "rank 1 still holds it");
        let gone = w.apply(&batch(1, vec![removed(&[8, 999])]));
        assert_eq!(gone.removed, vec![a.stored[1]]);
        assert_eq!(w.counts().removed_blocks, 2);
    }

    #[test]
    fn orphans_other_tiers_and_wide_tokens_are_not_keyed() {
        let mut w = WorkerEvents::new("m", BS, 100);
        let ops = w.apply(&batch(0, vec![stored(&[5], Some(404), (0..4).collect(), None)]));
        assert!(ops.stored.is_empty());
        assert_eq!(w.counts().orphan_blocks, 1);
        let mut cpu = stored(&[6], None, (0..4).collect(), None);
        if let KvEvent::BlockStored(s) = &mut cpu {
            s.medium = Some("CPU".into());
        }
        assert!(w.apply(&batch(0, vec![cpu])).stored.is_empty());
        // SGLang image pad values: the block and its child cannot be keyed.
        let wide = vec![1, 2, 1 << 40, 3, 4, 5, 6, 7];
        let ops = w.apply(&batch(0, vec![stored(&[9, 10], None, wide, None)]));
        assert!(ops.stored.is_empty());
        assert_eq!(w.counts().unmatchable_blocks, 2);
        let child = w.apply(&batch(0, vec![stored(&[11], Some(10), (0..4).collect(), None)]));
        assert!(child.stored.is_empty(), "descendant of an unmatchable block");
        let mut wrong_size = stored(&[12], None, (0..8).collect(), None);
        if let KvEvent::BlockStored(s) = &mut wrong_size {
            s.block_size = 8;
        }
        w.apply(&batch(0, vec![wrong_size]));
        assert_eq!(w.counts().block_size_mismatch, 1);
    }

    #[test]
    fn ids_beyond_the_vocabulary_are_sglang_pads() {
        let mut w = WorkerEvents::new("m", BS, 100).with_vocab(1000);
        // SGLang image pads are 2^30-bounded, so they fit u32: only the vocabulary tells them apart.
        let ops = w.apply(&batch(0, vec![stored(&[1, 2], None, vec![1, 2, 3, 999, 4, 1_000_123, 5, 6], None)]));
        assert_eq!(ops.stored.len(), 1, "the text block is keyed, the padded one is not");
        assert_eq!(w.counts().unmatchable_blocks, 1);
    }

    #[test]
    fn clear_and_the_bound_reset_the_worker() {
        let mut w = WorkerEvents::new("m", BS, 3);
        w.apply(&batch(0, vec![stored(&[1, 2], None, (0..8).collect(), None)]));
        let ops = w.apply(&batch(0, vec![KvEvent::AllBlocksCleared, stored(&[3], None, (10..14).collect(), None)]));
        assert!(ops.cleared);
        assert_eq!(ops.stored.len(), 1, "what follows the clear still counts");
        let ops = w.apply(&batch(0, vec![stored(&[4, 5, 6], None, (20..32).collect(), None)]));
        assert!(ops.cleared && ops.stored.is_empty(), "4 tracked blocks exceed the bound of 3");
        assert_eq!(w.tracked(), 0);
        assert_eq!(w.counts().overflows, 1);
    }

    #[test]
    fn lora_name_and_salt_seed_the_root() {
        let tokens: Vec<u64> = (0..4).collect();
        let ids: Vec<u32> = (0..4).collect();
        let mut w = WorkerEvents::new("m", BS, 100);
        let mut ev = stored(
            &[1],
            None,
            tokens,
            Some(vec![Some(vec![ExtraKey::Str("adapter".into()), ExtraKey::Str("s".into())])]),
        );
        if let KvEvent::BlockStored(s) = &mut ev {
            s.lora_name = Some("adapter".into());
        }
        let ops = w.apply(&batch(0, vec![ev]));
        assert_eq!(ops.stored, block_keys(&ids, &[], BS as usize, seed("m", Some("adapter"), Some("s"))));
    }
}
