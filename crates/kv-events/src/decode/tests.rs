//! Tests for the payload decoder: the reference's hex vectors, synthetic encodings of every engine version's
//! event layout, error labels, and property tests that arbitrary input never panics.

use super::*;
use proptest::prelude::*;
use rmpv::Value;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    assert!(s.len().is_multiple_of(2), "odd hex length");
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// msgpack fixstr encoding of a short ASCII string, as hex.
fn fixstr(s: &str) -> String {
    assert!(s.len() < 32);
    let mut out = format!("{:02x}", 0xa0 | s.len());
    for b in s.bytes() {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// Tiny msgpack encoder for tests.
fn enc(v: &Value) -> Vec<u8> {
    let mut buf = Vec::new();
    rmpv::encode::write_value(&mut buf, v).unwrap();
    buf
}

fn s(x: &str) -> Value {
    Value::from(x)
}

fn arr(items: Vec<Value>) -> Value {
    Value::Array(items)
}

fn map(entries: Vec<(&str, Value)>) -> Value {
    Value::Map(entries.into_iter().map(|(k, v)| (s(k), v)).collect())
}

fn u(v: u64) -> Value {
    Value::from(v)
}

fn batch(events: Vec<Value>, rank: Option<Value>) -> Vec<u8> {
    let mut items = vec![Value::F64(1.5), arr(events)];
    items.extend(rank);
    enc(&arr(items))
}

fn only_stored(b: &EventBatch) -> &BlockStored {
    match b.events.as_slice() {
        [KvEvent::BlockStored(s)] => s,
        other => panic!("expected one BlockStored, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------------------
// Reference §5 hex vectors
// ---------------------------------------------------------------------------------------------------------

#[test]
fn hex_vllm_0_11_layout() {
    let bytes = hex("93 cb41d954fc40100000 92
        97 ab426c6f636b53746f726564 92 05 cd012c 07 92 ce000186a1 02 01 c0 a3475055
        93 ac426c6f636b52656d6f766564 91 05 a3475055
        01");
    let b = decode_batch(&bytes).unwrap();
    assert_eq!(b.ts, 1_700_000_000.25);
    assert_eq!(b.dp_rank, 1);
    assert_eq!(b.events.len(), 2);
    let KvEvent::BlockStored(st) = &b.events[0] else { panic!() };
    assert_eq!(st.block_hashes, vec![EngineHash::Int(5), EngineHash::Int(300)]);
    assert_eq!(st.parent, Some(EngineHash::Int(7)));
    assert_eq!(st.token_ids, vec![100_001, 2]);
    assert_eq!(st.block_size, 1);
    assert_eq!(st.lora_id, None);
    assert_eq!(st.medium.as_deref(), Some("GPU"));
    assert_eq!(st.lora_name, None);
    assert!(st.is_device_tier() && st.is_main_attention() && !st.is_remote());
    let KvEvent::BlockRemoved(rm) = &b.events[1] else { panic!() };
    assert_eq!(rm.block_hashes, vec![EngineHash::Int(5)]);
    assert_eq!(rm.medium.as_deref(), Some("GPU"));
}

const HEX_0_23: &str = "93cb3ff8000000000000939cab426c6f636b53746f72656492cf1122334455667788cff0e0d0c0b0a09080c0940102030402c0a3475055c0c0c0c0c094ac426c6f636b52656d6f76656491cf1122334455667788a3475055c091b0416c6c426c6f636b73436c656172656400";

const HEX_0_24: &str = "93cb3ff800000000000093de000aa474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cf1122334455667788cff0e0d0c0b0a09080b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f6964739401020304aa626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e84a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cf1122334455667788a66d656469756da3475055a967726f75705f6964780081a474797065b0416c6c426c6f636b73436c656172656400";

#[test]
fn hex_vllm_0_23_layout() {
    let bytes = hex(HEX_0_23);
    assert_eq!(bytes.len(), 108);
    let b = decode_batch(&bytes).unwrap();
    assert_eq!(b.ts, 1.5);
    assert_eq!(b.dp_rank, 0);
    assert_eq!(b.events.len(), 3);
    let KvEvent::BlockStored(st) = &b.events[0] else { panic!() };
    assert_eq!(st.block_hashes, vec![EngineHash::Int(0x1122_3344_5566_7788), EngineHash::Int(0xF0E0_D0C0_B0A0_9080)]);
    assert_eq!(st.parent, None);
    assert_eq!(st.token_ids, vec![1, 2, 3, 4]);
    assert_eq!(st.block_size, 2);
    assert_eq!(st.medium.as_deref(), Some("GPU"));
    assert_eq!(
        (st.lora_name.as_ref(), st.extra_keys.as_ref(), st.group_idx, st.spec_kind.as_ref()),
        (None, None, None, None)
    );
    assert_eq!(st.sliding_window, None);
    let KvEvent::BlockRemoved(rm) = &b.events[1] else { panic!() };
    assert_eq!(rm.block_hashes, vec![EngineHash::Int(0x1122_3344_5566_7788)]);
    assert_eq!(rm.group_idx, None);
    assert_eq!(b.events[2], KvEvent::AllBlocksCleared);
}

#[test]
fn hex_vllm_0_24_map_layout() {
    let bytes = hex(HEX_0_24);
    assert_eq!(bytes.len(), 273);
    let b = decode_batch(&bytes).unwrap();
    let old = decode_batch(&hex(HEX_0_23)).unwrap();
    assert_eq!(b.events.len(), 3);
    let KvEvent::BlockStored(st) = &b.events[0] else { panic!() };
    let KvEvent::BlockStored(old_st) = &old.events[0] else { panic!() };
    // Same content as the 0.23 vector, plus group_idx 0 and the spec kind.
    assert_eq!(st.group_idx, Some(0));
    assert_eq!(st.spec_kind.as_deref(), Some("full_attention"));
    let expected = BlockStored { group_idx: Some(0), spec_kind: Some("full_attention".into()), ..old_st.clone() };
    assert_eq!(st, &expected);
    assert!(st.is_main_attention());
    let KvEvent::BlockRemoved(rm) = &b.events[1] else { panic!() };
    assert_eq!(rm.group_idx, Some(0));
    assert_eq!(rm.medium.as_deref(), Some("GPU"));
    assert_eq!(b.events[2], KvEvent::AllBlocksCleared);
}

#[test]
fn hex_multimodal_and_salt_fragments() {
    // The reference gives the `extra_keys` and `token_ids` fragments; wrap them into a minimal map event.
    let extra = "92 92 92 a4696d673101 a874656e616e742d61 91 92 a4696d6731 ff";
    let tokens = "94 cd0368 ce00025067 ce00025067 0d";
    let event = format!(
        "85 {} {} {} 92 0102 {} {} {} 02 {} {}",
        fixstr("type"),
        fixstr("BlockStored"),
        fixstr("block_hashes"),
        fixstr("token_ids"),
        tokens,
        fixstr("block_size"),
        fixstr("extra_keys"),
        extra
    );
    let bytes = hex(&format!("93 cb3ff8000000000000 91 {event} 00"));
    let b = decode_batch(&bytes).unwrap();
    let st = only_stored(&b);
    assert_eq!(st.token_ids, vec![872, 151_655, 151_655, 13]);
    assert_eq!(st.parent, None);
    assert_eq!(st.medium, None);
    assert!(st.is_device_tier());
    assert_eq!(
        st.extra_keys,
        Some(vec![
            Some(vec![ExtraKey::Mm { id: "img1".into(), offset: 1 }, ExtraKey::Str("tenant-a".into())]),
            Some(vec![ExtraKey::Mm { id: "img1".into(), offset: -1 }]),
        ])
    );
}

#[test]
fn hex_bytes_hashes() {
    // sha256 digest of block 0 from reference §7.9 (sha256_cbor): ext value 8866452693264111234.
    let digest = "cd7c51bc5a8fc8643f383a2b9e01522fba7473c669e9270c7b0bf7bf7fd01682";
    let xx = "00112233445566778899aabbccddeeff";
    let event = format!("95 {} 91 c420{digest} c410{xx} 90 10", fixstr("BlockStored"));
    let b = decode_batch(&hex(&format!("92 cb3ff8000000000000 91 {event}"))).unwrap();
    let st = only_stored(&b);
    assert_eq!(b.dp_rank, 0, "0.9.0 two-element batch defaults the rank to 0");
    assert_eq!(st.block_hashes[0].id(), 8_866_452_693_264_111_234);
    assert_eq!(st.block_hashes[0].raw_bytes(), Some(hex(digest).as_slice()));
    let parent = st.parent.as_ref().unwrap();
    assert_eq!(parent.raw_bytes().unwrap().len(), 16);
    assert_eq!(parent.id(), 0x8899_aabb_ccdd_eeff);
    assert!(st.token_ids.is_empty());
    assert_eq!(st.block_size, 16);
}

#[test]
fn engine_hash_ids() {
    // Reference §7.9 "ext" values are the last 8 bytes, big-endian.
    let cases = [
        ("2533ea50426b36e9e4d68296cac6bce8cf602e46957d0fe40b368b33d87bf3bf", 807_986_237_951_177_663u64),
        ("7b255da405e1d722823892e4fef187b4d8ac78215d7f0dd2137bb037547f4caf", 1_403_909_460_543_360_175),
        ("8e717becdc2054b7a3223b7b844f462c0db0ac86287b752b16d077ad0843c577", 1_643_945_449_041_937_783),
    ];
    for (digest, id) in cases {
        assert_eq!(EngineHash::Bytes(hex(digest)).id(), id);
    }
    assert_eq!(EngineHash::Bytes(vec![1, 2]).id(), 0x0102, "short byte strings are zero-extended");
    assert_eq!(EngineHash::Bytes(vec![]).id(), 0);
    assert_eq!(EngineHash::from(9).raw_bytes(), None);
}

// ---------------------------------------------------------------------------------------------------------
// Synthetic encodings of every version's layout
// ---------------------------------------------------------------------------------------------------------

/// Every vLLM `BlockStored` field in array order (after the tag), with non-default values.
fn vllm_all_fields() -> Vec<Value> {
    vec![
        arr(vec![u(11), u(12)]),                           // 1 block_hashes
        u(10),                                             // 2 parent
        arr(vec![u(1), u(2), u(3), u(4)]),                 // 3 token_ids
        u(2),                                              // 4 block_size
        u(3),                                              // 5 lora_id
        s("CPU"),                                          // 6 medium
        s("adapter"),                                      // 7 lora_name
        arr(vec![arr(vec![s("adapter")]), Value::Nil]),    // 8 extra_keys
        u(1),                                              // 9 group_idx
        s("sliding_window"),                               // 10 kind
        u(4096),                                           // 11 window
        s("REMOTE"),                                       // 12 locality
        s("secondary"),                                    // 13 ownership
        s("sess"),                                         // 14 session_id
        arr(vec![arr(vec![u(5)]), arr(vec![u(6), u(7)])]), // 15 lookahead
    ]
}

fn stored_array(len: usize) -> Value {
    let mut items = vec![s("BlockStored")];
    items.extend(vllm_all_fields().into_iter().take(len - 1));
    arr(items)
}

#[test]
fn vllm_array_lengths_by_version() {
    // 0.9–0.10 → 6, 0.11–0.13 → 7, 0.15 → 8, 0.17–0.19 → 9, 0.21 → 10, 0.23 → 12; 16 covers all known fields.
    for len in [6usize, 7, 8, 9, 10, 12, 13, 16] {
        let b = decode_batch(&batch(vec![stored_array(len)], Some(u(0)))).unwrap();
        let st = only_stored(&b);
        assert_eq!(st.block_hashes, vec![EngineHash::Int(11), EngineHash::Int(12)], "len {len}");
        assert_eq!(st.parent, Some(EngineHash::Int(10)));
        assert_eq!(st.token_ids, vec![1, 2, 3, 4]);
        assert_eq!(st.block_size, 2);
        assert_eq!(st.lora_id, Some(3));
        assert_eq!(st.medium.is_some(), len > 6, "len {len}");
        assert_eq!(st.lora_name.is_some(), len > 7, "len {len}");
        assert_eq!(st.extra_keys.is_some(), len > 8, "len {len}");
        assert_eq!(st.group_idx.is_some(), len > 9, "len {len}");
        assert_eq!(st.spec_kind.is_some(), len > 10, "len {len}");
        assert_eq!(st.sliding_window.is_some(), len > 11, "len {len}");
        assert_eq!(st.locality.is_some(), len > 12, "len {len}");
        assert_eq!(st.lookahead_token_ids.is_some(), len > 15, "len {len}");
        if len == 16 {
            assert_eq!(st.extra_keys, Some(vec![Some(vec![ExtraKey::Str("adapter".into())]), None]));
            assert_eq!(st.ownership.as_deref(), Some("secondary"));
            assert_eq!(st.session_id.as_deref(), Some("sess"));
            assert_eq!(st.lookahead_token_ids, Some(vec![vec![5], vec![6, 7]]));
            assert!(!st.is_main_attention(), "sliding_window is not main attention");
            assert!(st.is_remote());
            assert!(!st.is_device_tier());
        }
    }
}

#[test]
fn trailing_nils_and_extra_elements_are_tolerated() {
    let mut items = vec![s("BlockStored")];
    items.extend(vllm_all_fields().into_iter().take(4));
    items.extend(std::iter::repeat_n(Value::Nil, 11));
    items.push(s("some future field"));
    let b = decode_batch(&batch(vec![arr(items)], Some(Value::Nil))).unwrap();
    let st = only_stored(&b);
    assert_eq!(b.dp_rank, 0, "nil rank → 0");
    assert_eq!(st.block_size, 2);
    assert_eq!(st.medium, None);
    assert_eq!(st.lora_id, None);
}

#[test]
fn vllm_block_removed_array_lengths() {
    let full = [s("BlockRemoved"), arr(vec![u(1)]), s("GPU"), u(0), s("LOCAL"), s("own")];
    for len in 2..=full.len() {
        let b = decode_batch(&batch(vec![arr(full[..len].to_vec())], None)).unwrap();
        let KvEvent::BlockRemoved(rm) = &b.events[0] else { panic!() };
        assert_eq!(rm.block_hashes, vec![EngineHash::Int(1)]);
        assert_eq!(rm.medium.is_some(), len > 2);
        assert_eq!(rm.group_idx.is_some(), len > 3);
        assert_eq!(rm.locality.is_some(), len > 4);
        assert_eq!(rm.ownership.is_some(), len > 5);
        assert!(rm.is_main_attention() && rm.is_device_tier() && !rm.is_remote());
    }
}

#[test]
fn vllm_map_form_with_omitted_defaults_and_unknown_keys() {
    let ev = map(vec![
        ("type", s("BlockStored")),
        ("block_hashes", arr(vec![u(u64::MAX)])),
        ("parent_block_hash", Value::Nil),
        ("token_ids", arr(vec![u(1), u(2)])),
        ("block_size", u(2)),
        ("lora_id", Value::Nil),
        ("medium", Value::Nil),
        ("lora_name", Value::Nil),
        ("locality", s("REMOTE")),
        ("origin", s("unknown key, ignored")),
        ("kv_cache_spec_kind", s("mla_attention")),
        ("group_idx", u(3)),
    ]);
    let b = decode_batch(&batch(vec![ev], Some(u(7)))).unwrap();
    let st = only_stored(&b);
    assert_eq!(b.dp_rank, 7);
    assert_eq!(st.block_hashes, vec![EngineHash::Int(u64::MAX)]);
    assert!(st.is_main_attention(), "mla_attention counts even on group 3");
    assert!(st.is_remote());
    assert_eq!(st.extra_keys, None);
}

#[test]
fn main_attention_rule() {
    let mk = |kind: Option<&str>, g: Option<u32>| BlockStored {
        spec_kind: kind.map(str::to_owned),
        group_idx: g,
        ..Default::default()
    };
    assert!(mk(None, None).is_main_attention());
    assert!(mk(None, Some(0)).is_main_attention());
    assert!(!mk(None, Some(1)).is_main_attention());
    for k in ["full_attention", "mla_attention", "sink_full_attention"] {
        assert!(mk(Some(k), Some(2)).is_main_attention(), "{k}");
    }
    for k in ["sliding_window", "sliding_window_mla", "mamba", "chunked_local_attention"] {
        assert!(!mk(Some(k), Some(0)).is_main_attention(), "{k}");
    }
}

#[test]
fn map_batch_snapshot_form() {
    let bytes = enc(&map(vec![
        ("ts", Value::F64(2.0)),
        ("events", arr(vec![map(vec![("type", s("AllBlocksCleared"))])])),
        ("data_parallel_rank", u(3)),
    ]));
    let b = decode_batch(&bytes).unwrap();
    assert_eq!((b.ts, b.dp_rank), (2.0, 3));
    assert_eq!(b.events, vec![KvEvent::AllBlocksCleared]);
}

#[test]
fn sglang_array_forms() {
    // 0.5.10 – 0.5.15: tag + 6 fields, signed hashes.
    let plain = arr(vec![
        s("BlockStored"),
        arr(vec![Value::from(-3_488_128_144_981_237_669i64), Value::from(5_674_439_469_042_975_057i64)]),
        Value::Nil,
        arr((1..=8).map(u).collect()),
        u(4),
        Value::Nil,
        s("GPU"),
    ]);
    // 0.5.19 BlockStoredWithMetadata: same tag, 8th element is a metadata map.
    let salted = arr(vec![
        s("BlockStored"),
        arr(vec![Value::from(-1i64)]),
        Value::from(-3_488_128_144_981_237_669i64),
        arr(vec![u(9), u(10), u(11), u(12)]),
        u(4),
        Value::Nil,
        s("GPU"),
        map(vec![("cache_salt", s("tenant-a"))]),
    ]);
    let removed = arr(vec![s("BlockRemoved"), arr(vec![Value::from(-1i64)]), s("GPU")]);
    let b = decode_batch(&batch(vec![plain, salted, removed], Some(u(1)))).unwrap();
    let KvEvent::BlockStored(a) = &b.events[0] else { panic!() };
    assert_eq!(a.block_hashes[0].id(), (-3_488_128_144_981_237_669i64) as u64);
    assert_eq!(a.cache_salt, None);
    assert_eq!(a.token_ids.len(), 8);
    let KvEvent::BlockStored(c) = &b.events[1] else { panic!() };
    assert_eq!(c.cache_salt.as_deref(), Some("tenant-a"));
    assert_eq!(c.lora_name, None);
    assert_eq!(c.block_hashes, vec![EngineHash::Int(u64::MAX)]);
    assert_eq!(c.parent, Some(EngineHash::Int((-3_488_128_144_981_237_669i64) as u64)));
    let KvEvent::BlockRemoved(r) = &b.events[2] else { panic!() };
    assert_eq!(r.block_hashes, vec![EngineHash::Int(u64::MAX)]);
}

#[test]
fn sglang_map_forms() {
    // 0.5.21/0.5.23: map, omit_defaults (medium "GPU" omitted in 0.5.23), wide pad token ids > u32.
    let wide = 4 * (1_000_000 + (1u64 << 61));
    let ev = map(vec![
        ("type", s("BlockStored")),
        ("block_hashes", arr(vec![Value::from(-5i64)])),
        ("parent_block_hash", Value::Nil),
        ("token_ids", arr(vec![u(1), u(wide), u(wide), u(2)])),
        ("block_size", u(4)),
        ("lora_id", Value::Nil),
        ("cache_salt", s("salt")),
        ("session_id", s("s1")),
        ("lora_name", s("lora-a")),
    ]);
    let rm = map(vec![
        ("type", s("BlockRemoved")),
        ("block_hashes", arr(vec![Value::from(-5i64)])),
        ("medium", s("CPU_PINNED")),
    ]);
    let b = decode_batch(&batch(vec![ev, rm], Some(u(0)))).unwrap();
    let KvEvent::BlockStored(st) = &b.events[0] else { panic!() };
    assert_eq!(st.token_ids, vec![1, wide, wide, 2]);
    assert_eq!(st.cache_salt.as_deref(), Some("salt"));
    assert_eq!(st.session_id.as_deref(), Some("s1"));
    assert_eq!(st.lora_name.as_deref(), Some("lora-a"));
    assert!(st.is_device_tier(), "omitted medium means GPU");
    let KvEvent::BlockRemoved(r) = &b.events[1] else { panic!() };
    assert!(!r.is_device_tier());
}

#[test]
fn sglang_eagle_bigram_tokens() {
    let pairs = arr(vec![arr(vec![u(1), u(2)]), arr(vec![u(2), u(3)]), arr(vec![u(3), u(4)])]);
    let ev = arr(vec![s("BlockStored"), arr(vec![u(1)]), Value::Nil, pairs, u(3), Value::Nil, s("GPU")]);
    let b = decode_batch(&batch(vec![ev], None)).unwrap();
    let st = only_stored(&b);
    assert!(st.eagle_bigram);
    assert_eq!(st.token_ids, vec![1, 2, 3, 4]);

    let bad_pairs = arr(vec![arr(vec![u(1), u(2)]), u(3)]);
    let ev = arr(vec![s("BlockStored"), arr(vec![u(1)]), Value::Nil, bad_pairs, u(3)]);
    let err = decode_batch(&batch(vec![ev], None)).unwrap_err();
    assert_eq!(err.label(), "bad_field");
}

#[test]
fn extra_key_shapes() {
    let keys = arr(vec![
        arr(vec![
            s("lora"),
            arr(vec![s("mm"), Value::from(-300i64)]),
            Value::Binary(vec![0xde, 0xad]),
            u(42),
            u(u64::MAX),
            arr(vec![s("cache_salt"), s("x")]),
            arr(vec![s("mm"), s("id"), u(3)]),
        ]),
        Value::Nil,
        arr(vec![]),
    ]);
    let ev = map(vec![
        ("type", s("BlockStored")),
        ("block_hashes", arr(vec![u(1), u(2), u(3)])),
        ("token_ids", arr(vec![])),
        ("block_size", u(16)),
        ("extra_keys", keys),
    ]);
    let b = decode_batch(&batch(vec![ev], None)).unwrap();
    let keys = only_stored(&b).extra_keys.clone().unwrap();
    assert_eq!(
        keys,
        vec![
            Some(vec![
                ExtraKey::Str("lora".into()),
                ExtraKey::Mm { id: "mm".into(), offset: -300 },
                ExtraKey::Bytes(vec![0xde, 0xad]),
                ExtraKey::Int(42),
                ExtraKey::Int(-1),
                ExtraKey::Tuple(vec![ExtraKey::Str("cache_salt".into()), ExtraKey::Str("x".into())]),
                ExtraKey::Tuple(vec![ExtraKey::Str("mm".into()), ExtraKey::Str("id".into()), ExtraKey::Int(3)]),
            ]),
            None,
            Some(vec![]),
        ]
    );
}

#[test]
fn unknown_tags_are_kept() {
    let b = decode_batch(&batch(
        vec![arr(vec![s("BlockPinned"), u(1)]), map(vec![("type", s("Future")), ("x", u(1))])],
        None,
    ))
    .unwrap();
    assert_eq!(b.events, vec![KvEvent::Unknown("BlockPinned".into()), KvEvent::Unknown("Future".into())]);
}

// ---------------------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------------------

#[test]
fn error_labels() {
    let stored = |hashes: Value| arr(vec![s("BlockStored"), hashes, Value::Nil, arr(vec![]), u(1)]);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (vec![], "not_msgpack"),
        // 0xc1 is the reserved marker; rmpv reads it as nil, which is not a batch.
        (vec![0xc1], "batch_not_array"),
        (vec![0x93, 0xcb, 0x3f], "not_msgpack"),
        ([enc(&arr(vec![Value::F64(1.0), arr(vec![])])), vec![0x00]].concat(), "trailing_bytes"),
        (enc(&u(5)), "batch_not_array"),
        (enc(&s("x")), "batch_not_array"),
        (enc(&arr(vec![Value::F64(1.0)])), "bad_batch"),
        (enc(&arr(vec![s("ts"), arr(vec![])])), "bad_batch"),
        (enc(&arr(vec![Value::F64(1.0), u(3)])), "bad_batch"),
        (enc(&arr(vec![Value::F64(1.0), arr(vec![]), Value::from(-1i64)])), "bad_batch"),
        (enc(&arr(vec![Value::F64(1.0), arr(vec![]), u(1 << 40)])), "bad_batch"),
        (enc(&map(vec![("events", arr(vec![]))])), "bad_batch"),
        (batch(vec![u(1)], None), "bad_event"),
        (batch(vec![arr(vec![])], None), "bad_event"),
        (batch(vec![arr(vec![u(1)])], None), "bad_event"),
        (batch(vec![map(vec![("block_hashes", arr(vec![]))])], None), "bad_event"),
        (batch(vec![arr(vec![s("BlockStored"), arr(vec![u(1)])])], None), "bad_event"),
        (batch(vec![arr(vec![s("BlockRemoved")])], None), "bad_event"),
        (batch(vec![stored(u(1))], None), "bad_field"),
        (batch(vec![stored(arr(vec![Value::F64(1.0)]))], None), "bad_field"),
        (batch(vec![stored(arr(vec![s("h")]))], None), "bad_field"),
        (
            batch(
                vec![arr(vec![s("BlockStored"), arr(vec![]), Value::Nil, arr(vec![Value::from(-1i64)]), u(1)])],
                None,
            ),
            "bad_field",
        ),
        (batch(vec![arr(vec![s("BlockStored"), arr(vec![]), Value::Nil, arr(vec![]), u(1 << 33)])], None), "bad_field"),
        (
            batch(
                vec![arr(vec![s("BlockStored"), arr(vec![]), Value::Nil, arr(vec![]), u(1), Value::Nil, u(5)])],
                None,
            ),
            "bad_field",
        ),
        (
            batch(
                vec![arr(vec![
                    s("BlockStored"),
                    arr(vec![]),
                    Value::Nil,
                    arr(vec![]),
                    u(1),
                    Value::Nil,
                    Value::Nil,
                    u(1),
                ])],
                None,
            ),
            "bad_field",
        ),
        (
            batch(
                vec![map(vec![
                    ("type", s("BlockStored")),
                    ("block_hashes", arr(vec![])),
                    ("token_ids", arr(vec![])),
                    ("block_size", u(1)),
                    ("extra_keys", arr(vec![u(1)])),
                ])],
                None,
            ),
            "bad_field",
        ),
    ];
    for (i, (bytes, label)) in cases.iter().enumerate() {
        let err = decode_batch(bytes).expect_err(&format!("case {i} should fail"));
        assert_eq!(err.label(), *label, "case {i}: {err}");
        assert!(!err.to_string().is_empty());
    }
}

#[test]
fn deep_nesting_is_rejected_not_overflowed() {
    let mut bytes = vec![0x91; 100_000];
    bytes.push(0xc0);
    assert_eq!(decode_batch(&bytes).unwrap_err().label(), "not_msgpack");
}

#[test]
fn huge_length_prefix_does_not_allocate() {
    // array32 claiming 4 billion elements, then nothing.
    let bytes = [0xdd, 0xff, 0xff, 0xff, 0xff];
    assert_eq!(decode_batch(&bytes).unwrap_err().label(), "not_msgpack");
    let bytes = [0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff];
    assert_eq!(decode_batch(&bytes).unwrap_err().label(), "not_msgpack");
}

// ---------------------------------------------------------------------------------------------------------
// Property tests: nothing panics
// ---------------------------------------------------------------------------------------------------------

fn arb_value() -> impl Strategy<Value = Value> {
    arb_value_sized(6, 64)
}

fn arb_value_sized(depth: u32, size: u32) -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        Just("type"),
        Just("block_hashes"),
        Just("parent_block_hash"),
        Just("token_ids"),
        Just("block_size"),
        Just("medium"),
        Just("extra_keys"),
        Just("group_idx"),
        Just("cache_salt"),
        Just("ts"),
        Just("events"),
    ];
    let leaf = prop_oneof![
        Just(Value::Nil),
        any::<bool>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::F64),
        any::<f32>().prop_map(Value::F32),
        prop_oneof![
            Just("BlockStored"),
            Just("BlockRemoved"),
            Just("AllBlocksCleared"),
            Just("GPU"),
            Just("full_attention")
        ]
        .prop_map(Value::from),
        ".{0,8}".prop_map(Value::from),
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(Value::Binary),
        (any::<i8>(), proptest::collection::vec(any::<u8>(), 0..4)).prop_map(|(t, d)| Value::Ext(t, d)),
    ];
    leaf.prop_recursive(depth, size, 10, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..10).prop_map(Value::Array),
            proptest::collection::vec((key.clone().prop_map(Value::from), inner.clone()), 0..8).prop_map(Value::Map),
        ]
    })
}

/// A structurally plausible batch whose leaves are random: exercises the field decoders, not just the
/// top-level type checks.
fn arb_batch() -> impl Strategy<Value = Value> {
    let ev = prop_oneof![
        proptest::collection::vec(arb_value_sized(2, 8), 0..16).prop_map(|mut v| {
            v.insert(0, Value::from("BlockStored"));
            Value::Array(v)
        }),
        proptest::collection::vec(arb_value_sized(2, 8), 0..6).prop_map(|mut v| {
            v.insert(0, Value::from("BlockRemoved"));
            Value::Array(v)
        }),
        arb_value_sized(3, 16),
    ];
    (any::<f64>(), proptest::collection::vec(ev, 0..4), arb_value_sized(1, 2))
        .prop_map(|(ts, evs, rank)| Value::Array(vec![Value::F64(ts), Value::Array(evs), rank]))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_batch(&bytes);
    }

    #[test]
    fn random_msgpack_values_never_panic(v in arb_value()) {
        let bytes = enc(&v);
        if let Err(e) = decode_batch(&bytes) {
            prop_assert!(!e.label().is_empty());
        }
    }

    #[test]
    fn random_batches_never_panic(v in arb_batch()) {
        let _ = decode_batch(&enc(&v));
    }

    #[test]
    fn truncations_of_a_valid_batch_never_panic(cut in 0usize..273) {
        let bytes = hex(HEX_0_24);
        let r = decode_batch(&bytes[..cut]);
        prop_assert!(r.is_err());
    }

    #[test]
    fn integer_hashes_roundtrip(h in any::<u64>(), sh in any::<i64>()) {
        let ev = arr(vec![s("BlockRemoved"), arr(vec![u(h), Value::from(sh)])]);
        let b = decode_batch(&batch(vec![ev], None)).unwrap();
        let KvEvent::BlockRemoved(rm) = &b.events[0] else { panic!() };
        prop_assert_eq!(rm.block_hashes[0].id(), h);
        prop_assert_eq!(rm.block_hashes[1].id(), sh as u64);
    }
}

#[test]
fn non_finite_timestamps_are_refused() {
    for ts in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let bytes = enc(&arr(vec![Value::F64(ts), arr(vec![]), u(0)]));
        assert_eq!(decode_batch(&bytes).unwrap_err().label(), "bad_timestamp", "{ts}");
    }
    let bytes = enc(&arr(vec![Value::F32(f32::NAN), arr(vec![])]));
    assert_eq!(decode_batch(&bytes).unwrap_err().label(), "bad_timestamp");
}

#[test]
fn declared_lengths_beyond_the_payload_are_refused_up_front() {
    // map32 / str32 / bin32 / ext32 claiming 4 billion, with a few bytes after.
    for header in [&[0xdf][..], &[0xdb], &[0xc6], &[0xc9]] {
        let mut bytes = vec![0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0];
        bytes.extend_from_slice(header);
        bytes.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 1, 2, 3]);
        assert_eq!(decode_batch(&bytes).unwrap_err().label(), "not_msgpack", "{header:x?}");
    }
}

#[test]
fn too_many_values_are_refused_before_decoding() {
    // One array of MAX_VALUES + 1 nils: a valid msgpack value rmpv would expand ~30-fold.
    let n = super::MAX_VALUES as u32 + 1;
    let mut bytes = vec![0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd];
    bytes.extend_from_slice(&n.to_be_bytes());
    bytes.resize(bytes.len() + n as usize, 0xc0);
    assert_eq!(decode_batch(&bytes).unwrap_err().label(), "too_many_values");
}

/// Fixtures to mutate: every payload in `fixtures/payloads`.
fn fixture_payloads() -> Vec<Vec<u8>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/payloads");
    let mut files: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    files.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Mutated real payloads (byte flips, insertions, truncation): no panic, quick answer, and the
    /// pre-scan agrees with rmpv (a payload it accepts decodes or fails with a decoder label).
    #[test]
    fn mutated_fixtures_never_panic(
        pick in any::<usize>(),
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..8),
        insert in proptest::option::of((any::<usize>(), proptest::collection::vec(any::<u8>(), 1..12))),
        cut in any::<usize>(),
    ) {
        let payloads = fixture_payloads();
        let mut bytes = payloads[pick % payloads.len()].clone();
        if let Some((at, extra)) = insert {
            let at = at % (bytes.len() + 1);
            bytes.splice(at..at, extra);
        }
        for (at, b) in flips {
            if !bytes.is_empty() {
                let at = at % bytes.len();
                bytes[at] = b;
            }
        }
        bytes.truncate(cut % (bytes.len() + 2));
        let started = std::time::Instant::now();
        let _ = decode_batch(&bytes);
        prop_assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }
}
