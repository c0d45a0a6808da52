//! Decoding of KV-cache event payloads (frame 2 of every ZMQ message) into typed events.
//!
//! One decoder accepts every wire shape that vLLM (0.9 – 0.33) and SGLang (0.5.10 – 0.5.23) publish:
//!
//! * **Batch**: a msgpack array `[ts, events, dp_rank]`, where `dp_rank` may be missing (vLLM 0.9.0) or nil
//!   (both mean rank 0). A map batch `{ts, events, data_parallel_rank}` (one unreleased vLLM snapshot) is
//!   accepted too.
//! * **Events**: positional arrays `[tag, field1, field2, …]` (vLLM ≤ 0.23, SGLang ≤ 0.5.19) whose length
//!   depends on the engine version (missing trailing fields default to `None`, extra ones are ignored), or
//!   tagged maps `{"type": tag, field: value, …}` (vLLM ≥ 0.24, SGLang ≥ 0.5.21) where default-valued fields
//!   may be omitted and unknown keys are ignored. Unknown tags become [`KvEvent::Unknown`].
//! * SGLang 0.5.19 `BlockStoredWithMetadata`: tag `"BlockStored"` whose 8th element is a map
//!   `{"cache_salt": …}` instead of vLLM's `lora_name` string.
//! * **Hashes**: unsigned or signed integers (signed ones are bit-cast) or raw digest bytes, see
//!   [`EngineHash`].
//! * **Token ids**: `u64` (SGLang's wide multimodal pad values exceed `u32`), or SGLang's EAGLE bigram pairs
//!   `[[a, b], …]`, flattened as described on [`BlockStored::eagle_bigram`].
//!
//! Malformed input is reported as a [`DecodeError`], never as a panic; [`DecodeError::label`] gives a
//! snake_case label suitable for a metrics dimension.

use rmpv::ValueRef;

mod scan;
#[cfg(test)]
mod tests;

/// Maximum msgpack nesting accepted. The deepest legitimate payload nests about 8 levels
/// (batch → events → event → extra_keys → block → `[id, offset]` → string).
const MAX_DEPTH: usize = 32;
/// Maximum number of msgpack values in one payload. rmpv builds one `ValueRef` (tens of bytes) per
/// value, so this bounds the decoder's memory at a few dozen MiB whatever the payload size. A batch for a
/// 128k-token prompt has about 140 000 values.
pub const MAX_VALUES: usize = 1 << 20;

/// Block-level kinds of KV-cache groups that count as "main attention" (see [`BlockStored::is_main_attention`]).
pub const MAIN_ATTENTION_KINDS: [&str; 3] = ["full_attention", "mla_attention", "sink_full_attention"];

/// One decoded `EventBatch`: everything one engine step published.
#[derive(Clone, Debug, PartialEq)]
pub struct EventBatch {
    /// Publisher wall-clock time (`time.time()` in the engine), seconds since the Unix epoch.
    pub ts: f64,
    /// Data-parallel rank the publisher reported (0 when absent or nil).
    pub dp_rank: u32,
    /// Events in publication order.
    pub events: Vec<KvEvent>,
}

/// One KV-cache event.
#[derive(Clone, Debug, PartialEq)]
pub enum KvEvent {
    /// New full blocks were cached.
    BlockStored(BlockStored),
    /// Blocks were evicted.
    BlockRemoved(BlockRemoved),
    /// The whole prefix cache was reset (`POST /reset_prefix_cache`, SGLang `POST /flush_cache`).
    AllBlocksCleared,
    /// An event whose tag this crate does not know; the tag is kept for logging and metrics.
    Unknown(String),
}

/// A block hash as published by the engine. Treat it as an opaque 64-bit id (see [`EngineHash::id`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum EngineHash {
    /// Integer hash. Signed integers (SGLang) are bit-cast to `u64`.
    Int(u64),
    /// Raw digest bytes (vLLM with `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`).
    Bytes(Vec<u8>),
}

impl EngineHash {
    /// The 64-bit id of this hash. For bytes this is the **last 8 bytes, big-endian** (shorter inputs are
    /// zero-extended on the left), which equals what vLLM publishes when integer hashes are enabled
    /// (`int.from_bytes(digest, "big") & (2**64 - 1)`).
    pub fn id(&self) -> u64 {
        match self {
            EngineHash::Int(v) => *v,
            EngineHash::Bytes(b) => {
                let tail = &b[b.len().saturating_sub(8)..];
                tail.iter().fold(0u64, |acc, &byte| (acc << 8) | u64::from(byte))
            }
        }
    }

    /// The raw digest bytes, when the engine published bytes.
    pub fn raw_bytes(&self) -> Option<&[u8]> {
        match self {
            EngineHash::Int(_) => None,
            EngineHash::Bytes(b) => Some(b),
        }
    }
}

impl From<u64> for EngineHash {
    fn from(v: u64) -> Self {
        EngineHash::Int(v)
    }
}

/// One item of a block's `extra_keys` list (vLLM ≥ 0.17).
///
/// vLLM publishes, per block and in this order: the LoRA name, every multimodal item overlapping the block,
/// the `cache_salt` (first block of a chain only) and the prompt-embeds digest.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ExtraKey {
    /// A bare string: LoRA name, salt, or (vLLM 0.17) a multimodal identifier.
    Str(String),
    /// A multimodal item `[identifier, offset]` (vLLM ≥ 0.19). `offset` is the item start relative to the
    /// block start and is negative for a block that continues an item.
    Mm {
        /// Multimodal identifier (`mm_hash`, or the client-supplied uuid).
        id: String,
        /// Item start offset relative to the block's first token.
        offset: i64,
    },
    /// Raw bytes (prompt-embeds digest).
    Bytes(Vec<u8>),
    /// An integer (old LoRA int ids). Unsigned values above `i64::MAX` are bit-cast.
    Int(i64),
    /// Any other array of scalar items, e.g. a tagged tuple `["cache_salt", "s"]` should an engine publish
    /// the hash-side form. Kept so that nothing is silently dropped.
    Tuple(Vec<ExtraKey>),
}

/// Per-block extra keys: one entry per block, each `None` or a list of items.
pub type BlockExtraKeys = Vec<Option<Vec<ExtraKey>>>;

/// Payload of a `BlockStored` event.
///
/// Field availability by engine version is documented in the crate's reference; every field that a given
/// version does not send is `None`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BlockStored {
    /// Chained hashes of the stored blocks, oldest first.
    pub block_hashes: Vec<EngineHash>,
    /// Hash of the block preceding `block_hashes[0]`, `None` for a chain root.
    pub parent: Option<EngineHash>,
    /// Token ids of **all** blocks in the event (`block_size × block_hashes.len()` for full blocks).
    pub token_ids: Vec<u64>,
    /// Tokens per block (of this KV-cache group).
    pub block_size: u32,
    /// Deprecated integer LoRA id.
    pub lora_id: Option<i64>,
    /// Storage tier: `GPU` (default), `CPU`, `STORAGE`, `CPU_PINNED`, `DISK`, `EXTERNAL`, … `None` means GPU.
    pub medium: Option<String>,
    /// LoRA adapter name (vLLM ≥ 0.15, SGLang ≥ 0.5.23).
    pub lora_name: Option<String>,
    /// Per-block extra keys (vLLM ≥ 0.17).
    pub extra_keys: Option<BlockExtraKeys>,
    /// KV-cache group index (vLLM ≥ 0.21, hybrid models emit one event per group).
    pub group_idx: Option<u32>,
    /// `kv_cache_spec_kind` (vLLM ≥ 0.23): `full_attention`, `mla_attention`, `sliding_window`, `mamba`, …
    pub spec_kind: Option<String>,
    /// `kv_cache_spec_sliding_window` (vLLM ≥ 0.23).
    pub sliding_window: Option<u32>,
    /// `LOCAL` / `REMOTE` (vLLM ≥ 0.27).
    pub locality: Option<String>,
    /// Secondary offload tier (vLLM ≥ 0.30).
    pub ownership: Option<String>,
    /// Session id (vLLM ≥ 0.30, SGLang ≥ 0.5.21).
    pub session_id: Option<String>,
    /// `cache_salt` (SGLang: 0.5.19 metadata element, ≥ 0.5.21 map field).
    pub cache_salt: Option<String>,
    /// EAGLE-style lookahead token ids (vLLM 0.33).
    pub lookahead_token_ids: Option<Vec<Vec<u64>>>,
    /// `true` when the engine sent SGLang EAGLE bigram pairs `[[a, b], …]`. `token_ids` then holds the
    /// first element of every pair followed by the second element of the last pair.
    pub eagle_bigram: bool,
}

impl BlockStored {
    /// Whether this event belongs to a main-attention KV-cache group: the kind is one of
    /// [`MAIN_ATTENTION_KINDS`], or, when no kind was sent, `group_idx` is absent or 0.
    pub fn is_main_attention(&self) -> bool {
        main_attention(self.spec_kind.as_deref(), self.group_idx)
    }

    /// Whether the blocks live on the device tier (`medium` absent or `"GPU"`).
    pub fn is_device_tier(&self) -> bool {
        device_tier(self.medium.as_deref())
    }

    /// Whether the blocks are reported as remote (`locality == "REMOTE"`).
    pub fn is_remote(&self) -> bool {
        remote(self.locality.as_deref())
    }
}

/// Payload of a `BlockRemoved` event.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BlockRemoved {
    /// Hashes of the evicted blocks.
    pub block_hashes: Vec<EngineHash>,
    /// Storage tier (see [`BlockStored::medium`]).
    pub medium: Option<String>,
    /// KV-cache group index (vLLM ≥ 0.21).
    pub group_idx: Option<u32>,
    /// `kv_cache_spec_kind`, if a future engine sends it (no sampled version does).
    pub spec_kind: Option<String>,
    /// `LOCAL` / `REMOTE` (vLLM ≥ 0.27).
    pub locality: Option<String>,
    /// Secondary offload tier (vLLM ≥ 0.30).
    pub ownership: Option<String>,
}

impl BlockRemoved {
    /// Same rule as [`BlockStored::is_main_attention`]. Sampled engines send no kind on removals, so for a
    /// hybrid model whose main group is not group 0, check `group_idx` against the groups seen in
    /// `BlockStored` events instead.
    pub fn is_main_attention(&self) -> bool {
        main_attention(self.spec_kind.as_deref(), self.group_idx)
    }

    /// Whether the blocks live on the device tier (`medium` absent or `"GPU"`).
    pub fn is_device_tier(&self) -> bool {
        device_tier(self.medium.as_deref())
    }

    /// Whether the blocks are reported as remote (`locality == "REMOTE"`).
    pub fn is_remote(&self) -> bool {
        remote(self.locality.as_deref())
    }
}

fn main_attention(kind: Option<&str>, group_idx: Option<u32>) -> bool {
    match kind {
        Some(kind) => MAIN_ATTENTION_KINDS.contains(&kind),
        None => matches!(group_idx, None | Some(0)),
    }
}

fn device_tier(medium: Option<&str>) -> bool {
    medium.is_none_or(|m| m.eq_ignore_ascii_case("GPU"))
}

fn remote(locality: Option<&str>) -> bool {
    locality.is_some_and(|l| l.eq_ignore_ascii_case("REMOTE"))
}

/// Why a payload could not be decoded.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum DecodeError {
    /// The bytes are not one complete msgpack value (truncated, invalid marker, nested too deeply, …).
    #[error("payload is not valid msgpack: {0}")]
    NotMsgpack(String),
    /// A complete msgpack value was followed by more bytes.
    #[error("{0} trailing bytes after the msgpack batch")]
    TrailingBytes(usize),
    /// The payload holds more than [`MAX_VALUES`] msgpack values.
    #[error("payload has more than {MAX_VALUES} msgpack values")]
    TooManyValues,
    /// The batch timestamp is NaN or infinite.
    #[error("batch timestamp is not finite")]
    BadTimestamp,
    /// The top-level value is neither an array nor a map.
    #[error("batch is not a msgpack array (or map)")]
    BatchNotArray,
    /// The batch has the right container type but bad contents.
    #[error("bad batch: {0}")]
    BadBatch(&'static str),
    /// An event is not a tagged array/map, or lacks a required field.
    #[error("bad event #{index}: {reason}")]
    BadEvent {
        /// Position of the event in the batch.
        index: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// An event field has the wrong type or an out-of-range value.
    #[error("bad field `{field}` in event #{index}: {reason}")]
    BadField {
        /// Position of the event in the batch.
        index: usize,
        /// Wire name of the field.
        field: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
}

impl DecodeError {
    /// A stable snake_case label for metrics: `not_msgpack`, `trailing_bytes`, `too_many_values`,
    /// `bad_timestamp`, `batch_not_array`, `bad_batch`, `bad_event` or `bad_field`.
    pub fn label(&self) -> &'static str {
        match self {
            DecodeError::NotMsgpack(_) => "not_msgpack",
            DecodeError::TrailingBytes(_) => "trailing_bytes",
            DecodeError::TooManyValues => "too_many_values",
            DecodeError::BadTimestamp => "bad_timestamp",
            DecodeError::BatchNotArray => "batch_not_array",
            DecodeError::BadBatch(_) => "bad_batch",
            DecodeError::BadEvent { .. } => "bad_event",
            DecodeError::BadField { .. } => "bad_field",
        }
    }
}

/// Decodes one msgpack `EventBatch` payload.
pub fn decode_batch(payload: &[u8]) -> Result<EventBatch, DecodeError> {
    scan::check(payload, MAX_VALUES)?;
    let mut rd = payload;
    let root = rmpv::decode::read_value_ref_with_max_depth(&mut rd, MAX_DEPTH)
        .map_err(|e| DecodeError::NotMsgpack(e.to_string()))?;
    if !rd.is_empty() {
        return Err(DecodeError::TrailingBytes(rd.len()));
    }
    decode_batch_value(&root)
}

/// Decodes an already parsed msgpack value as an `EventBatch`.
fn decode_batch_value(root: &ValueRef<'_>) -> Result<EventBatch, DecodeError> {
    let (ts, events, rank) = match root {
        ValueRef::Array(items) => {
            if items.len() < 2 {
                return Err(DecodeError::BadBatch("batch array has fewer than 2 elements"));
            }
            (Some(&items[0]), Some(&items[1]), items.get(2))
        }
        ValueRef::Map(entries) => {
            let get = |name: &str| map_get(entries, name);
            (get("ts"), get("events"), get("data_parallel_rank").or_else(|| get("dp_rank")))
        }
        _ => return Err(DecodeError::BatchNotArray),
    };
    let ts = match ts {
        Some(ValueRef::F64(v)) => *v,
        Some(ValueRef::F32(v)) => f64::from(*v),
        Some(ValueRef::Integer(i)) => i.as_f64().ok_or(DecodeError::BadBatch("ts is not a number"))?,
        Some(_) => return Err(DecodeError::BadBatch("ts is not a number")),
        None => return Err(DecodeError::BadBatch("ts missing")),
    };
    // A NaN or infinite ts would poison the consumer's lag statistics for good.
    if !ts.is_finite() {
        return Err(DecodeError::BadTimestamp);
    }
    let events = match events {
        Some(ValueRef::Array(events)) => events,
        Some(_) => return Err(DecodeError::BadBatch("events is not an array")),
        None => return Err(DecodeError::BadBatch("events missing")),
    };
    let dp_rank = match rank {
        None | Some(ValueRef::Nil) => 0,
        Some(ValueRef::Integer(i)) => {
            i.as_u64().and_then(|v| u32::try_from(v).ok()).ok_or(DecodeError::BadBatch("dp rank out of range"))?
        }
        Some(_) => return Err(DecodeError::BadBatch("dp rank is not an integer")),
    };
    let events = events.iter().enumerate().map(|(index, ev)| decode_event(index, ev)).collect::<Result<_, _>>()?;
    Ok(EventBatch { ts, dp_rank, events })
}

fn map_get<'v, 'a>(entries: &'v [(ValueRef<'a>, ValueRef<'a>)], name: &str) -> Option<&'v ValueRef<'a>> {
    entries.iter().find(|(k, _)| matches!(k, ValueRef::String(s) if s.as_str() == Some(name))).map(|(_, v)| v)
}

/// Field access over either event encoding.
enum Fields<'v, 'a> {
    /// Positional: index 0 is the tag, field `k` sits at index `k`.
    Pos(&'v [ValueRef<'a>]),
    /// Tagged map.
    Map(&'v [(ValueRef<'a>, ValueRef<'a>)]),
}

impl<'v, 'a> Fields<'v, 'a> {
    /// Returns the field if present and not nil.
    fn get(&self, name: &str, pos: Option<usize>) -> Option<&'v ValueRef<'a>> {
        let v = match self {
            Fields::Pos(items) => pos.and_then(|p| items.get(p)),
            Fields::Map(entries) => map_get(entries, name),
        };
        v.filter(|v| !matches!(v, ValueRef::Nil))
    }
}

// Positional indexes of vLLM `BlockStored` fields (index 0 is the tag).
mod pos {
    pub const HASHES: usize = 1;
    pub const PARENT: usize = 2;
    pub const TOKENS: usize = 3;
    pub const BLOCK_SIZE: usize = 4;
    pub const LORA_ID: usize = 5;
    pub const MEDIUM: usize = 6;
    /// vLLM: `lora_name`; SGLang 0.5.19: metadata map `{"cache_salt": …}`.
    pub const LORA_NAME_OR_META: usize = 7;
    pub const EXTRA_KEYS: usize = 8;
    pub const GROUP_IDX: usize = 9;
    pub const KIND: usize = 10;
    pub const WINDOW: usize = 11;
    pub const LOCALITY: usize = 12;
    pub const OWNERSHIP: usize = 13;
    pub const SESSION_ID: usize = 14;
    pub const LOOKAHEAD: usize = 15;
    // `BlockRemoved`
    pub const RM_MEDIUM: usize = 2;
    pub const RM_GROUP_IDX: usize = 3;
    pub const RM_LOCALITY: usize = 4;
    pub const RM_OWNERSHIP: usize = 5;
}

fn decode_event(index: usize, ev: &ValueRef<'_>) -> Result<KvEvent, DecodeError> {
    let bad_event = |reason| DecodeError::BadEvent { index, reason };
    let (tag, fields) = match ev {
        ValueRef::Array(items) => {
            let tag = match items.first() {
                Some(ValueRef::String(s)) => s.as_str().ok_or(bad_event("tag is not valid UTF-8"))?,
                Some(_) => return Err(bad_event("tag is not a string")),
                None => return Err(bad_event("empty event array")),
            };
            (tag, Fields::Pos(items))
        }
        ValueRef::Map(entries) => {
            let tag = match map_get(entries, "type") {
                Some(ValueRef::String(s)) => s.as_str().ok_or(bad_event("tag is not valid UTF-8"))?,
                Some(_) => return Err(bad_event("tag is not a string")),
                None => return Err(bad_event("map event without \"type\"")),
            };
            (tag, Fields::Map(entries))
        }
        _ => return Err(bad_event("event is neither an array nor a map")),
    };
    let f = FieldReader { index, fields };
    match tag {
        "BlockStored" => f.block_stored().map(KvEvent::BlockStored),
        "BlockRemoved" => f.block_removed().map(KvEvent::BlockRemoved),
        "AllBlocksCleared" => Ok(KvEvent::AllBlocksCleared),
        other => Ok(KvEvent::Unknown(other.to_owned())),
    }
}

struct FieldReader<'v, 'a> {
    index: usize,
    fields: Fields<'v, 'a>,
}

impl<'v, 'a> FieldReader<'v, 'a> {
    fn bad(&self, field: &'static str, reason: &'static str) -> DecodeError {
        DecodeError::BadField { index: self.index, field, reason }
    }

    fn required(&self, field: &'static str, pos: usize) -> Result<&'v ValueRef<'a>, DecodeError> {
        self.fields.get(field, Some(pos)).ok_or(DecodeError::BadEvent { index: self.index, reason: missing(field) })
    }

    fn opt_str(&self, field: &'static str, pos: Option<usize>) -> Result<Option<String>, DecodeError> {
        self.fields.get(field, pos).map(|v| self.string(field, v)).transpose()
    }

    fn opt_u32(&self, field: &'static str, pos: Option<usize>) -> Result<Option<u32>, DecodeError> {
        self.fields.get(field, pos).map(|v| self.u32(field, v)).transpose()
    }

    fn string(&self, field: &'static str, v: &ValueRef<'_>) -> Result<String, DecodeError> {
        match v {
            ValueRef::String(s) => s.as_str().map(str::to_owned).ok_or(self.bad(field, "string is not valid UTF-8")),
            _ => Err(self.bad(field, "expected a string")),
        }
    }

    fn u32(&self, field: &'static str, v: &ValueRef<'_>) -> Result<u32, DecodeError> {
        match v {
            ValueRef::Integer(i) => {
                i.as_u64().and_then(|v| u32::try_from(v).ok()).ok_or(self.bad(field, "integer out of u32 range"))
            }
            _ => Err(self.bad(field, "expected an integer")),
        }
    }

    fn hash(&self, field: &'static str, v: &ValueRef<'_>) -> Result<EngineHash, DecodeError> {
        match v {
            ValueRef::Integer(i) => match (i.as_u64(), i.as_i64()) {
                (Some(u), _) => Ok(EngineHash::Int(u)),
                (None, Some(s)) => Ok(EngineHash::Int(s as u64)),
                (None, None) => Err(self.bad(field, "integer hash out of range")),
            },
            ValueRef::Binary(b) => Ok(EngineHash::Bytes(b.to_vec())),
            _ => Err(self.bad(field, "hash is neither an integer nor bytes")),
        }
    }

    fn hashes(&self, field: &'static str, v: &ValueRef<'_>) -> Result<Vec<EngineHash>, DecodeError> {
        match v {
            ValueRef::Array(items) => items.iter().map(|h| self.hash(field, h)).collect(),
            _ => Err(self.bad(field, "expected an array of hashes")),
        }
    }

    fn token(&self, field: &'static str, v: &ValueRef<'_>) -> Result<u64, DecodeError> {
        match v {
            ValueRef::Integer(i) => i.as_u64().ok_or(self.bad(field, "negative token id")),
            _ => Err(self.bad(field, "expected an integer token id")),
        }
    }

    fn token_list(&self, field: &'static str, v: &ValueRef<'_>) -> Result<Vec<u64>, DecodeError> {
        match v {
            ValueRef::Array(items) => items.iter().map(|t| self.token(field, t)).collect(),
            _ => Err(self.bad(field, "expected an array of token ids")),
        }
    }

    /// Token ids as plain integers, or SGLang EAGLE bigram pairs (returns `true` for pairs).
    fn token_ids(&self, v: &ValueRef<'_>) -> Result<(Vec<u64>, bool), DecodeError> {
        const F: &str = "token_ids";
        let ValueRef::Array(items) = v else {
            return Err(self.bad(F, "expected an array"));
        };
        if !matches!(items.first(), Some(ValueRef::Array(_))) {
            return Ok((self.token_list(F, v)?, false));
        }
        let mut out = Vec::with_capacity(items.len() + 1);
        let mut last_second = None;
        for item in items {
            match item {
                ValueRef::Array(pair) if pair.len() == 2 => {
                    out.push(self.token(F, &pair[0])?);
                    last_second = Some(self.token(F, &pair[1])?);
                }
                _ => return Err(self.bad(F, "bigram token ids must all be [a, b] pairs")),
            }
        }
        out.extend(last_second);
        Ok((out, true))
    }

    fn extra_key_item(&self, v: &ValueRef<'_>, nested: bool) -> Result<ExtraKey, DecodeError> {
        const F: &str = "extra_keys";
        match v {
            ValueRef::String(s) => Ok(ExtraKey::Str(s.as_str().ok_or(self.bad(F, "invalid UTF-8"))?.to_owned())),
            ValueRef::Binary(b) => Ok(ExtraKey::Bytes(b.to_vec())),
            ValueRef::Integer(i) => match (i.as_i64(), i.as_u64()) {
                (Some(s), _) => Ok(ExtraKey::Int(s)),
                (None, Some(u)) => Ok(ExtraKey::Int(u as i64)),
                (None, None) => Err(self.bad(F, "integer out of range")),
            },
            ValueRef::Array(items) if !nested => match items.as_slice() {
                [ValueRef::String(id), ValueRef::Integer(off)] if id.as_str().is_some() && off.as_i64().is_some() => {
                    Ok(ExtraKey::Mm {
                        id: id.as_str().unwrap_or_default().to_owned(),
                        offset: off.as_i64().unwrap_or(0),
                    })
                }
                _ => items.iter().map(|i| self.extra_key_item(i, true)).collect::<Result<_, _>>().map(ExtraKey::Tuple),
            },
            _ => Err(self.bad(F, "unsupported extra key item")),
        }
    }

    fn extra_keys(&self, v: &ValueRef<'_>) -> Result<BlockExtraKeys, DecodeError> {
        const F: &str = "extra_keys";
        let ValueRef::Array(blocks) = v else {
            return Err(self.bad(F, "expected an array (one entry per block)"));
        };
        blocks
            .iter()
            .map(|block| match block {
                ValueRef::Nil => Ok(None),
                ValueRef::Array(items) => {
                    items.iter().map(|i| self.extra_key_item(i, false)).collect::<Result<Vec<_>, _>>().map(Some)
                }
                _ => Err(self.bad(F, "per-block entry is neither nil nor an array")),
            })
            .collect()
    }

    fn block_stored(&self) -> Result<BlockStored, DecodeError> {
        let block_hashes = self.hashes("block_hashes", self.required("block_hashes", pos::HASHES)?)?;
        let parent = self
            .fields
            .get("parent_block_hash", Some(pos::PARENT))
            .map(|v| self.hash("parent_block_hash", v))
            .transpose()?;
        let (token_ids, eagle_bigram) = self.token_ids(self.required("token_ids", pos::TOKENS)?)?;
        let block_size = self.u32("block_size", self.required("block_size", pos::BLOCK_SIZE)?)?;
        let lora_id = match self.fields.get("lora_id", Some(pos::LORA_ID)) {
            None => None,
            Some(ValueRef::Integer(i)) => Some(i.as_i64().ok_or(self.bad("lora_id", "integer out of range"))?),
            Some(_) => return Err(self.bad("lora_id", "expected an integer")),
        };

        let mut lora_name = None;
        let mut cache_salt = self.opt_str("cache_salt", None)?;
        let mut session_id = self.opt_str("session_id", Some(pos::SESSION_ID))?;
        match &self.fields {
            Fields::Map(_) => lora_name = self.opt_str("lora_name", None)?,
            Fields::Pos(items) => match items.get(pos::LORA_NAME_OR_META) {
                None | Some(ValueRef::Nil) => {}
                Some(v @ ValueRef::String(_)) => lora_name = Some(self.string("lora_name", v)?),
                // SGLang 0.5.19 `BlockStoredWithMetadata`.
                Some(ValueRef::Map(meta)) => {
                    let meta = FieldReader { index: self.index, fields: Fields::Map(meta) };
                    cache_salt = meta.opt_str("cache_salt", None)?;
                    lora_name = meta.opt_str("lora_name", None)?;
                    session_id = session_id.or(meta.opt_str("session_id", None)?);
                }
                Some(_) => return Err(self.bad("lora_name", "expected a string or a metadata map")),
            },
        }

        let lookahead_token_ids = match self.fields.get("lookahead_token_ids", Some(pos::LOOKAHEAD)) {
            None => None,
            Some(ValueRef::Array(rows)) => {
                Some(rows.iter().map(|r| self.token_list("lookahead_token_ids", r)).collect::<Result<_, _>>()?)
            }
            Some(_) => return Err(self.bad("lookahead_token_ids", "expected an array of arrays")),
        };

        Ok(BlockStored {
            block_hashes,
            parent,
            token_ids,
            block_size,
            lora_id,
            medium: self.opt_str("medium", Some(pos::MEDIUM))?,
            lora_name,
            extra_keys: self.fields.get("extra_keys", Some(pos::EXTRA_KEYS)).map(|v| self.extra_keys(v)).transpose()?,
            group_idx: self.opt_u32("group_idx", Some(pos::GROUP_IDX))?,
            spec_kind: self.opt_str("kv_cache_spec_kind", Some(pos::KIND))?,
            sliding_window: self.opt_u32("kv_cache_spec_sliding_window", Some(pos::WINDOW))?,
            locality: self.opt_str("locality", Some(pos::LOCALITY))?,
            ownership: self.opt_str("ownership", Some(pos::OWNERSHIP))?,
            session_id,
            cache_salt,
            lookahead_token_ids,
            eagle_bigram,
        })
    }

    fn block_removed(&self) -> Result<BlockRemoved, DecodeError> {
        Ok(BlockRemoved {
            block_hashes: self.hashes("block_hashes", self.required("block_hashes", pos::HASHES)?)?,
            medium: self.opt_str("medium", Some(pos::RM_MEDIUM))?,
            group_idx: self.opt_u32("group_idx", Some(pos::RM_GROUP_IDX))?,
            spec_kind: self.opt_str("kv_cache_spec_kind", None)?,
            locality: self.opt_str("locality", Some(pos::RM_LOCALITY))?,
            ownership: self.opt_str("ownership", Some(pos::RM_OWNERSHIP))?,
        })
    }
}

fn missing(field: &'static str) -> &'static str {
    match field {
        "block_hashes" => "missing block_hashes",
        "token_ids" => "missing token_ids",
        "block_size" => "missing block_size",
        _ => "missing required field",
    }
}
