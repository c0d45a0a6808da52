//! The msgpack payloads of KV-event batches, byte for byte as the engines' msgspec encoders write them.
//!
//! * Batch: `[ts: f64, events: array, dp_rank: 0]`.
//! * vLLM 0.23 (`vllm-array`): a 12-element positional `BlockStored` `[tag, block_hashes, parent,
//!   token_ids, block_size, lora_id, medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind,
//!   kv_cache_spec_sliding_window]` and a 4-element `BlockRemoved` `[tag, block_hashes, medium,
//!   group_idx]`: msgspec writes every field of an `array_like` struct, trailing nils included.
//! * vLLM ≥ 0.24 (`vllm-map`): maps keyed by field name with `"type"` first. Fields whose value is their
//!   default (`None`) are omitted, except those declared without a default (`parent_block_hash`,
//!   `lora_id`, `medium`, `lora_name`), which are always written. msgspec sizes a struct's map header by
//!   its declared field count, so `BlockStored` (more than 15 fields) always gets a `map16` header.
//! * SGLang 0.5.19 (`sglang`): `[tag, block_hashes, parent, token_ids, block_size, lora_id, medium]`
//!   with the hashes as signed i64, plus an 8th element `{"cache_salt": s}` for a salted store
//!   (`BlockStoredWithMetadata`); `[tag, block_hashes, medium]` for a removal.
//!
//! Integers take their smallest encoding, `ts` is always a float64, as msgspec does.

use rmpv::Value;

use crate::options::KvEventsFormat;

/// One item of a block's `extra_keys` (vLLM ≥ 0.19 event form).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ExtraKey {
    /// A multimodal item overlapping the block: `[identifier, start − block start]`.
    Mm { id: String, offset: i64 },
    /// The request's `cache_salt` (first block only).
    Salt(String),
}

/// A `BlockStored` event, already shaped for its format (SGLang: pad token ids, no extra keys).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Stored {
    pub hashes: Vec<u64>,
    pub parent: Option<u64>,
    pub token_ids: Vec<u32>,
    pub block_size: u32,
    /// One entry per block (vLLM only); `None` when no block has any.
    pub extra_keys: Option<Vec<Option<Vec<ExtraKey>>>>,
    /// SGLang's metadata element; vLLM formats carry the salt in `extra_keys` instead.
    pub cache_salt: Option<String>,
    pub group_idx: Option<u32>,
    pub spec_kind: Option<&'static str>,
}

/// One KV-cache event.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Event {
    Stored(Stored),
    Removed(Vec<u64>),
    /// Not published by the simulator today; kept to check the encoding against the reference bytes.
    #[cfg(test)]
    Cleared,
}

/// Where the blocks live: the simulated engine has one device tier.
const MEDIUM: &str = "GPU";
/// The first field of every map-form event: msgspec's tag field.
const TAG: &str = "type";

/// Encodes one batch of `events` published at `ts` (seconds since the epoch) by data-parallel rank 0.
pub(crate) fn encode_batch(format: KvEventsFormat, ts: f64, events: &[Event]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + events.len() * 64);
    out.push(0x93); // fixarray(3)
    write(&mut out, &Value::F64(ts));
    write_array_len(&mut out, events.len());
    for event in events {
        encode_event(&mut out, format, event);
    }
    write(&mut out, &Value::from(0u32));
    out
}

fn encode_event(out: &mut Vec<u8>, format: KvEventsFormat, event: &Event) {
    match (format, event) {
        (KvEventsFormat::VllmMap, Event::Stored(s)) => stored_map(out, s),
        (KvEventsFormat::VllmMap, Event::Removed(hashes)) => {
            write_entries(out, MapHeader::Fix, &[(TAG, "BlockRemoved".into()), removed_hashes(hashes), medium()]);
        }
        (KvEventsFormat::VllmArray, Event::Stored(s)) => write(out, &stored_array(s)),
        (KvEventsFormat::VllmArray, Event::Removed(hashes)) => {
            write(out, &Value::Array(vec!["BlockRemoved".into(), unsigned(hashes), MEDIUM.into(), Value::Nil]))
        }
        (KvEventsFormat::Sglang, Event::Stored(s)) => write(out, &stored_sglang(s)),
        (KvEventsFormat::Sglang, Event::Removed(hashes)) => {
            write(out, &Value::Array(vec!["BlockRemoved".into(), signed(hashes), MEDIUM.into()]))
        }
        #[cfg(test)]
        (KvEventsFormat::VllmMap, Event::Cleared) => {
            write_entries(out, MapHeader::Fix, &[(TAG, "AllBlocksCleared".into())])
        }
        #[cfg(test)]
        (_, Event::Cleared) => write(out, &Value::Array(vec!["AllBlocksCleared".into()])),
    }
}

fn stored_array(s: &Stored) -> Value {
    Value::Array(vec![
        "BlockStored".into(),
        unsigned(&s.hashes),
        s.parent.map_or(Value::Nil, Value::from),
        tokens(&s.token_ids),
        Value::from(s.block_size),
        Value::Nil, // lora_id
        MEDIUM.into(),
        Value::Nil, // lora_name
        s.extra_keys.as_deref().map_or(Value::Nil, extra_keys),
        s.group_idx.map_or(Value::Nil, Value::from),
        s.spec_kind.map_or(Value::Nil, Value::from),
        Value::Nil, // kv_cache_spec_sliding_window
    ])
}

fn stored_map(out: &mut Vec<u8>, s: &Stored) {
    let mut entries: Vec<(&str, Value)> = vec![
        (TAG, "BlockStored".into()),
        ("block_hashes", unsigned(&s.hashes)),
        ("parent_block_hash", s.parent.map_or(Value::Nil, Value::from)),
        ("token_ids", tokens(&s.token_ids)),
        ("block_size", Value::from(s.block_size)),
        ("lora_id", Value::Nil),
        medium(),
        ("lora_name", Value::Nil),
    ];
    if let Some(keys) = &s.extra_keys {
        entries.push(("extra_keys", extra_keys(keys)));
    }
    if let Some(group) = s.group_idx {
        entries.push(("group_idx", Value::from(group)));
    }
    if let Some(kind) = s.spec_kind {
        entries.push(("kv_cache_spec_kind", Value::from(kind)));
    }
    write_entries(out, MapHeader::Map16, &entries);
}

fn stored_sglang(s: &Stored) -> Value {
    let mut fields = vec![
        "BlockStored".into(),
        signed(&s.hashes),
        s.parent.map_or(Value::Nil, |p| Value::from(p as i64)),
        tokens(&s.token_ids),
        Value::from(s.block_size),
        Value::Nil, // lora_id
        MEDIUM.into(),
    ];
    if let Some(salt) = &s.cache_salt {
        fields.push(Value::Map(vec![("cache_salt".into(), salt.as_str().into())]));
    }
    Value::Array(fields)
}

fn removed_hashes(hashes: &[u64]) -> (&'static str, Value) {
    ("block_hashes", unsigned(hashes))
}

fn medium() -> (&'static str, Value) {
    ("medium", MEDIUM.into())
}

fn unsigned(hashes: &[u64]) -> Value {
    Value::Array(hashes.iter().map(|&h| Value::from(h)).collect())
}

/// SGLang publishes the first 8 digest bytes as a signed i64; the bits are the same id.
fn signed(hashes: &[u64]) -> Value {
    Value::Array(hashes.iter().map(|&h| Value::from(h as i64)).collect())
}

fn tokens(ids: &[u32]) -> Value {
    Value::Array(ids.iter().map(|&t| Value::from(t)).collect())
}

fn extra_keys(blocks: &[Option<Vec<ExtraKey>>]) -> Value {
    let block = |keys: &Vec<ExtraKey>| {
        Value::Array(
            keys.iter()
                .map(|key| match key {
                    ExtraKey::Mm { id, offset } => Value::Array(vec![id.as_str().into(), Value::from(*offset)]),
                    ExtraKey::Salt(salt) => salt.as_str().into(),
                })
                .collect(),
        )
    };
    Value::Array(blocks.iter().map(|b| b.as_ref().map_or(Value::Nil, block)).collect())
}

/// How msgspec sizes a struct's map header: by its declared field count, not by the fields written.
#[derive(Clone, Copy)]
enum MapHeader {
    /// Up to 15 declared fields.
    Fix,
    /// More than 15 declared fields.
    Map16,
}

fn write_entries(out: &mut Vec<u8>, header: MapHeader, entries: &[(&str, Value)]) {
    // Events have at most 16 entries, far below both headers' limits.
    let n = entries.len();
    match header {
        MapHeader::Fix => out.push(0x80 | (n as u8 & 0x0f)),
        MapHeader::Map16 => {
            out.push(0xde);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
    }
    for (key, value) in entries {
        write(out, &Value::from(*key));
        write(out, value);
    }
}

fn write_array_len(out: &mut Vec<u8>, n: usize) {
    match n {
        0..=15 => out.push(0x90 | n as u8),
        16..=0xffff => {
            out.push(0xdc);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        _ => {
            out.push(0xdd);
            out.extend_from_slice(&(n as u32).to_be_bytes());
        }
    }
}

fn write(out: &mut Vec<u8>, value: &Value) {
    // Writing into a Vec cannot fail: the only errors rmpv reports are the writer's.
    if let Err(e) = rmpv::encode::write_value(out, value) {
        unreachable!("msgpack encoding into memory failed: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn reference_stored() -> Stored {
        Stored {
            hashes: vec![0x1122_3344_5566_7788, 0xF0E0_D0C0_B0A0_9080],
            token_ids: vec![1, 2, 3, 4],
            block_size: 2,
            ..Stored::default()
        }
    }

    /// The vLLM 0.23 example of the shared reference (kv-events.md §5), byte for byte.
    #[test]
    fn vllm_array_matches_the_reference_bytes() {
        let events = [Event::Stored(reference_stored()), Event::Removed(vec![0x1122_3344_5566_7788]), Event::Cleared];
        let expected = "93cb3ff8000000000000939cab426c6f636b53746f72656492cf1122334455667788cff0e0d0c0b0a09080c0940102030402c0a3475055c0c0c0c0c094ac426c6f636b52656d6f76656491cf1122334455667788a3475055c091b0416c6c426c6f636b73436c656172656400";
        assert_eq!(hex(&encode_batch(KvEventsFormat::VllmArray, 1.5, &events)), expected);
    }

    /// The vLLM ≥ 0.24 example of the reference (with group 0 and the spec kind set), byte for byte. The
    /// reference's removal also carries `group_idx 0`, which the simulator never sets: it is written
    /// here by hand, and the simulator's own removal is checked against it minus that entry.
    #[test]
    fn vllm_map_matches_the_reference_bytes() {
        let stored = Stored { group_idx: Some(0), spec_kind: Some("full_attention"), ..reference_stored() };
        let mut out = vec![0x93];
        write(&mut out, &Value::F64(1.5));
        out.push(0x93);
        encode_event(&mut out, KvEventsFormat::VllmMap, &Event::Stored(stored));
        let removed = [(TAG, "BlockRemoved".into()), removed_hashes(&[0x1122_3344_5566_7788]), medium()];
        write_entries(
            &mut out,
            MapHeader::Fix,
            &[removed[0].clone(), removed[1].clone(), removed[2].clone(), ("group_idx", 0.into())],
        );
        encode_event(&mut out, KvEventsFormat::VllmMap, &Event::Cleared);
        out.push(0x00);
        let expected = "93cb3ff800000000000093de000aa474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cf1122334455667788cff0e0d0c0b0a09080b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f6964739401020304aa626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e84a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cf1122334455667788a66d656469756da3475055a967726f75705f6964780081a474797065b0416c6c426c6f636b73436c656172656400";
        assert_eq!(hex(&out), expected);
        let mut ours = Vec::new();
        encode_event(&mut ours, KvEventsFormat::VllmMap, &Event::Removed(vec![0x1122_3344_5566_7788]));
        let without_group = "83a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cf1122334455667788a66d656469756da3475055";
        assert_eq!(hex(&ours), without_group);
    }

    /// The reference's multimodal + salt extra keys: `[[["img1", 1], "tenant-a"], [["img1", -1]]]`.
    #[test]
    fn extra_keys_match_the_reference_bytes() {
        let keys = vec![
            Some(vec![ExtraKey::Mm { id: "img1".into(), offset: 1 }, ExtraKey::Salt("tenant-a".into())]),
            Some(vec![ExtraKey::Mm { id: "img1".into(), offset: -1 }]),
        ];
        let mut out = Vec::new();
        write(&mut out, &extra_keys(&keys));
        assert_eq!(hex(&out), "929292a4696d673101a874656e616e742d619192a4696d6731ff");
    }

    #[test]
    fn map_form_omits_defaulted_fields_but_keeps_those_without_defaults() {
        let out = encode_batch(KvEventsFormat::VllmMap, 0.0, &[Event::Stored(reference_stored())]);
        let batch = rmpv::decode::read_value(&mut out.as_slice()).expect("msgpack");
        let event = &batch[1][0];
        let keys: Vec<&str> = event.as_map().expect("map").iter().filter_map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"]
        );
        assert_eq!(&out[11..14], &[0xde, 0x00, 0x08], "BlockStored always has a map16 header");
    }

    #[test]
    fn sglang_form_has_signed_hashes_and_salt_metadata() {
        let stored = Stored { parent: Some(u64::MAX), cache_salt: Some("s".into()), ..reference_stored() };
        let out = encode_batch(KvEventsFormat::Sglang, 0.0, &[Event::Stored(stored), Event::Removed(vec![u64::MAX])]);
        let batch = rmpv::decode::read_value(&mut out.as_slice()).expect("msgpack");
        let stored = batch[1][0].as_array().expect("array");
        assert_eq!(stored.len(), 8);
        assert_eq!(stored[1][1].as_i64(), Some(0xF0E0_D0C0_B0A0_9080_u64 as i64));
        assert_eq!(stored[2].as_i64(), Some(-1));
        assert_eq!(stored[7]["cache_salt"].as_str(), Some("s"));
        assert_eq!(
            batch[1][1],
            Value::Array(vec!["BlockRemoved".into(), Value::Array(vec![(-1).into()]), "GPU".into()])
        );
    }
}
