//! Tests against committed fixtures encoded exactly as the engines encode them.
//!
//! `fixtures/gen.py` declares msgspec structs with each vLLM / SGLang version's fields and struct options
//! and writes the payloads, `fixtures/cases.json` (the decoded values expected from every payload, or the
//! decode error of a malformed one) and `fixtures/sequences.json` (publisher scripts for the feed). This
//! test reads only the committed files: no Python, no network.
//!
//! * `decode`: every case through [`decode_batch`], compared field by field with the manifest.
//! * `feed` (feature `feed`): every sequence replayed through a real `zeromq` publisher on 127.0.0.1
//!   (an XPUB, wire-identical to the engines' PUB for a subscriber, so the test can wait for the
//!   subscription instead of sleeping) and a replay ROUTER serving a bounded ring with the version's
//!   3- or 4-frame replies; the [`FeedEvent`]s and the final [`FeedStats`] must be the ones the
//!   script names.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use mmrouter_kv_events::{decode_batch, DecodeError, EngineHash, EventBatch, ExtraKey, KvEvent};
use serde_json::Value as Json;

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

fn read_fixture(rel: &str) -> Vec<u8> {
    let path = fixtures_dir().join(rel);
    std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn load_json(rel: &str) -> Json {
    serde_json::from_slice(&read_fixture(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn cases() -> Vec<Json> {
    load_json("cases.json")["cases"].as_array().expect("cases array").clone()
}

fn str_of<'a>(v: &'a Json, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_else(|| panic!("`{key}` is not a string in {v}"))
}

fn u64_of(v: &Json, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("`{key}` is not a u64 in {v}"))
}

fn hex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex length: {s}");
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit")).collect()
}

fn opt_str(v: &Json) -> Option<&str> {
    match v {
        Json::Null => None,
        Json::String(s) => Some(s),
        other => panic!("expected a string or null, got {other}"),
    }
}

fn opt_u32(v: &Json) -> Option<u32> {
    match v {
        Json::Null => None,
        other => {
            Some(other.as_u64().and_then(|n| u32::try_from(n).ok()).unwrap_or_else(|| panic!("not a u32: {other}")))
        }
    }
}

fn u64_list(v: &Json) -> Vec<u64> {
    v.as_array()
        .unwrap_or_else(|| panic!("expected an array, got {v}"))
        .iter()
        .map(|n| n.as_u64().unwrap_or_else(|| panic!("not a u64: {n}")))
        .collect()
}

// ---------------------------------------------------------------------------------------------------------
// Expected values (the manifest's JSON forms) → the crate's types
// ---------------------------------------------------------------------------------------------------------

/// `{"int": wire value, "id": u64}` or `{"bytes": hex, "id": u64}`. Also checks the manifest's own
/// consistency: the id of an integer is its wire value bit-cast to u64.
fn expected_hash(v: &Json) -> EngineHash {
    let id = u64_of(v, "id");
    let hash = if let Some(b) = v.get("bytes") {
        EngineHash::Bytes(hex(b.as_str().expect("bytes hex")))
    } else {
        let wire = &v["int"];
        let as_u64 = wire.as_u64().or_else(|| wire.as_i64().map(|i| i as u64)).expect("int hash");
        assert_eq!(as_u64, id, "manifest: id of {v} is not its bit-cast wire value");
        EngineHash::Int(as_u64)
    };
    assert_eq!(hash.id(), id, "EngineHash::id of {v}");
    hash
}

fn expected_extra_item(v: &Json) -> ExtraKey {
    let obj = v.as_object().unwrap_or_else(|| panic!("extra key item {v}"));
    assert_eq!(obj.len(), 1, "extra key item {v}");
    let (kind, value) = obj.iter().next().unwrap();
    match kind.as_str() {
        "str" => ExtraKey::Str(value.as_str().unwrap().to_owned()),
        "bytes" => ExtraKey::Bytes(hex(value.as_str().unwrap())),
        "int" => ExtraKey::Int(value.as_i64().unwrap()),
        "mm" => {
            let pair = value.as_array().unwrap();
            ExtraKey::Mm { id: pair[0].as_str().unwrap().to_owned(), offset: pair[1].as_i64().unwrap() }
        }
        "tuple" => ExtraKey::Tuple(value.as_array().unwrap().iter().map(expected_extra_item).collect()),
        other => panic!("unknown extra key kind {other}"),
    }
}

type ExtraKeys = Option<Vec<Option<Vec<ExtraKey>>>>;

fn expected_extra_keys(v: &Json) -> ExtraKeys {
    match v {
        Json::Null => None,
        Json::Array(blocks) => Some(
            blocks
                .iter()
                .map(|b| match b {
                    Json::Null => None,
                    Json::Array(items) => Some(items.iter().map(expected_extra_item).collect()),
                    other => panic!("per-block extra keys {other}"),
                })
                .collect(),
        ),
        other => panic!("extra_keys {other}"),
    }
}

/// Every key of an expected `BlockStored`: the manifest states each field, null when absent.
const STORED_KEYS: [&str; 21] = [
    "type",
    "block_hashes",
    "parent",
    "token_ids",
    "eagle_bigram",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "spec_kind",
    "sliding_window",
    "locality",
    "ownership",
    "session_id",
    "cache_salt",
    "lookahead_token_ids",
    "is_main_attention",
    "is_device_tier",
    "is_remote",
];

const REMOVED_KEYS: [&str; 9] = [
    "type",
    "block_hashes",
    "medium",
    "group_idx",
    "locality",
    "ownership",
    "is_main_attention",
    "is_device_tier",
    "is_remote",
];

fn assert_keys(exp: &Json, keys: &[&str]) {
    let got: BTreeSet<&str> = exp.as_object().expect("event object").keys().map(String::as_str).collect();
    let want: BTreeSet<&str> = keys.iter().copied().collect();
    assert_eq!(got, want, "manifest event keys");
}

/// Compares one decoded event with its expectation, field by field (the message names the field).
fn check_event(ev: &KvEvent, exp: &Json) {
    match (str_of(exp, "type"), ev) {
        ("BlockStored", KvEvent::BlockStored(st)) => {
            assert_keys(exp, &STORED_KEYS);
            let hashes: Vec<EngineHash> = exp["block_hashes"].as_array().unwrap().iter().map(expected_hash).collect();
            assert_eq!(st.block_hashes, hashes, "block_hashes");
            let parent = (!exp["parent"].is_null()).then(|| expected_hash(&exp["parent"]));
            assert_eq!(st.parent, parent, "parent_block_hash");
            assert_eq!(st.token_ids, u64_list(&exp["token_ids"]), "token_ids");
            assert_eq!(st.eagle_bigram, exp["eagle_bigram"].as_bool().unwrap(), "eagle_bigram");
            assert_eq!(Some(st.block_size), opt_u32(&exp["block_size"]), "block_size");
            assert_eq!(st.lora_id, exp["lora_id"].as_i64(), "lora_id");
            assert_eq!(exp["lora_id"].is_null(), st.lora_id.is_none(), "lora_id presence");
            assert_eq!(st.medium.as_deref(), opt_str(&exp["medium"]), "medium");
            assert_eq!(st.lora_name.as_deref(), opt_str(&exp["lora_name"]), "lora_name");
            assert_eq!(st.extra_keys, expected_extra_keys(&exp["extra_keys"]), "extra_keys");
            assert_eq!(st.group_idx, opt_u32(&exp["group_idx"]), "group_idx");
            assert_eq!(st.spec_kind.as_deref(), opt_str(&exp["spec_kind"]), "kv_cache_spec_kind");
            assert_eq!(st.sliding_window, opt_u32(&exp["sliding_window"]), "kv_cache_spec_sliding_window");
            assert_eq!(st.locality.as_deref(), opt_str(&exp["locality"]), "locality");
            assert_eq!(st.ownership.as_deref(), opt_str(&exp["ownership"]), "ownership");
            assert_eq!(st.session_id.as_deref(), opt_str(&exp["session_id"]), "session_id");
            assert_eq!(st.cache_salt.as_deref(), opt_str(&exp["cache_salt"]), "cache_salt");
            let lookahead = match &exp["lookahead_token_ids"] {
                Json::Null => None,
                Json::Array(rows) => Some(rows.iter().map(u64_list).collect::<Vec<_>>()),
                other => panic!("lookahead_token_ids {other}"),
            };
            assert_eq!(st.lookahead_token_ids, lookahead, "lookahead_token_ids");
            assert_eq!(st.is_main_attention(), exp["is_main_attention"].as_bool().unwrap(), "is_main_attention");
            assert_eq!(st.is_device_tier(), exp["is_device_tier"].as_bool().unwrap(), "is_device_tier");
            assert_eq!(st.is_remote(), exp["is_remote"].as_bool().unwrap(), "is_remote");
        }
        ("BlockRemoved", KvEvent::BlockRemoved(rm)) => {
            assert_keys(exp, &REMOVED_KEYS);
            let hashes: Vec<EngineHash> = exp["block_hashes"].as_array().unwrap().iter().map(expected_hash).collect();
            assert_eq!(rm.block_hashes, hashes, "block_hashes");
            assert_eq!(rm.medium.as_deref(), opt_str(&exp["medium"]), "medium");
            assert_eq!(rm.group_idx, opt_u32(&exp["group_idx"]), "group_idx");
            assert_eq!(rm.locality.as_deref(), opt_str(&exp["locality"]), "locality");
            assert_eq!(rm.ownership.as_deref(), opt_str(&exp["ownership"]), "ownership");
            assert_eq!(rm.spec_kind, None, "no sampled engine sends a kind on removals");
            assert_eq!(rm.is_main_attention(), exp["is_main_attention"].as_bool().unwrap(), "is_main_attention");
            assert_eq!(rm.is_device_tier(), exp["is_device_tier"].as_bool().unwrap(), "is_device_tier");
            assert_eq!(rm.is_remote(), exp["is_remote"].as_bool().unwrap(), "is_remote");
        }
        ("AllBlocksCleared", KvEvent::AllBlocksCleared) => assert_keys(exp, &["type"]),
        ("Unknown", KvEvent::Unknown(tag)) => {
            assert_keys(exp, &["type", "tag"]);
            assert_eq!(tag, str_of(exp, "tag"), "unknown tag");
        }
        (want, got) => panic!("expected a {want} event, decoded {got:?}"),
    }
}

fn check_batch(batch: &EventBatch, exp: &Json) {
    assert_eq!(Some(batch.ts), exp["ts"].as_f64(), "ts");
    assert_eq!(u64::from(batch.dp_rank), u64_of(exp, "dp_rank"), "dp_rank");
    let events = exp["events"].as_array().expect("events");
    assert_eq!(batch.events.len(), events.len(), "number of events");
    for (i, (ev, e)) in batch.events.iter().zip(events).enumerate() {
        let result = std::panic::catch_unwind(|| check_event(ev, e));
        if let Err(p) = result {
            let msg = p.downcast_ref::<String>().map(String::as_str).or(p.downcast_ref::<&str>().copied());
            panic!("event #{i}: {}", msg.unwrap_or("panic"));
        }
    }
}

fn check_error(err: &DecodeError, exp: &Json) {
    assert_eq!(err.label(), str_of(exp, "label"), "error label ({err})");
    assert!(!err.to_string().is_empty());
    let (index, field) = match err {
        DecodeError::BadEvent { index, .. } => (Some(*index), None),
        DecodeError::BadField { index, field, .. } => (Some(*index), Some(*field)),
        _ => (None, None),
    };
    assert_eq!(index.map(|i| i as u64), exp.get("index").and_then(Json::as_u64), "event index ({err})");
    assert_eq!(field, exp.get("field").and_then(Json::as_str), "field ({err})");
}

/// Decodes every case and reports every failing case by name (not just the first).
#[test]
fn every_case_decodes_as_the_manifest_says() {
    let mut failures = Vec::new();
    let cases = cases();
    for case in &cases {
        let name = str_of(case, "name");
        let payload = read_fixture(str_of(case, "file"));
        let result = std::panic::catch_unwind(|| {
            assert_eq!(payload.len() as u64, u64_of(case, "size"), "payload size");
            match (decode_batch(&payload), case.get("expect"), case.get("expect_error")) {
                (Ok(batch), Some(exp), None) => check_batch(&batch, exp),
                (Err(err), None, Some(exp)) => check_error(&err, exp),
                (Ok(batch), None, Some(exp)) => panic!("expected error {exp}, decoded {batch:?}"),
                (Err(err), Some(_), None) => panic!("decode failed: {err}"),
                _ => panic!("a case has exactly one of expect / expect_error"),
            }
        });
        if let Err(p) = result {
            let msg = p.downcast_ref::<String>().cloned().or(p.downcast_ref::<&str>().map(|s| s.to_string()));
            failures.push(format!("{name}: {}", msg.unwrap_or_default()));
        }
    }
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

/// Payload bytes cut anywhere are an error, never a panic (and never a different valid batch).
#[test]
fn every_truncated_payload_is_an_error() {
    for case in cases().iter().filter(|c| c.get("expect").is_some()) {
        let payload = read_fixture(str_of(case, "file"));
        for cut in 0..payload.len() {
            let err = decode_batch(&payload[..cut]).expect_err("a truncated payload decoded");
            assert_eq!(err.label(), "not_msgpack", "{} cut at {cut}", str_of(case, "name"));
        }
    }
}

#[test]
fn manifests_list_exactly_the_committed_payloads() {
    let listed: BTreeSet<String> = cases().iter().map(|c| str_of(c, "file").to_owned()).collect();
    let mut on_disk = BTreeSet::new();
    for entry in std::fs::read_dir(fixtures_dir().join("payloads")).unwrap() {
        on_disk.insert(format!("payloads/{}", entry.unwrap().file_name().to_string_lossy()));
    }
    assert_eq!(listed, on_disk, "payloads/ and cases.json disagree (rerun fixtures/gen.py)");

    let mut referenced = BTreeSet::new();
    for sc in load_json("sequences.json")["scenarios"].as_array().unwrap() {
        for step in sc["steps"].as_array().unwrap() {
            if let Some(p) = step.get("payload").and_then(Json::as_str) {
                referenced.insert(p.to_owned());
            }
        }
    }
    let mut on_disk = BTreeSet::new();
    for dir in std::fs::read_dir(fixtures_dir().join("seq")).unwrap() {
        let dir = dir.unwrap();
        for f in std::fs::read_dir(dir.path()).unwrap() {
            on_disk.insert(format!(
                "seq/{}/{}",
                dir.file_name().to_string_lossy(),
                f.unwrap().file_name().to_string_lossy()
            ));
        }
    }
    assert_eq!(referenced, on_disk, "seq/ and sequences.json disagree (rerun fixtures/gen.py)");
}

/// The fixture set keeps covering every wire shape the crate claims to decode.
#[test]
fn cases_cover_every_shape() {
    let cases = cases();
    let shapes: Vec<&str> = cases.iter().map(|c| str_of(c, "shape")).collect();
    let has = |needle: &str| shapes.iter().any(|s| s.split(' ').any(|part| part == needle));
    for needle in [
        "batch:array2",
        "batch:array3",
        "batch:map3",
        "BlockStored:array6",
        "BlockStored:array7",
        "BlockStored:array8",
        "BlockStored:array9",
        "BlockStored:array10",
        "BlockStored:array12",
        "BlockStored:array17",
        "BlockRemoved:array2",
        "BlockRemoved:array3",
        "BlockRemoved:array4",
        "AllBlocksCleared:array1",
        "AllBlocksCleared:map1",
        "BlockMigrated:map3",
        "BlockMigrated:array3",
    ] {
        assert!(has(needle), "no case has {needle}");
    }
    let engines: BTreeSet<(&str, &str)> = cases.iter().map(|c| (str_of(c, "engine"), str_of(c, "versions"))).collect();
    for (engine, versions) in [
        ("vllm", "0.9.0"),
        ("vllm", "0.15"),
        ("vllm", "0.17"),
        ("vllm", "0.21"),
        ("vllm", "0.23"),
        ("vllm", "0.24 – 0.25"),
        ("vllm", "0.27"),
        ("vllm", "0.30"),
        ("vllm", "0.32"),
        ("vllm", "0.33"),
        ("sglang", "0.5.10 – 0.5.15"),
        ("sglang", "0.5.19"),
        ("sglang", "0.5.21"),
        ("sglang", "0.5.23"),
    ] {
        assert!(engines.contains(&(engine, versions)), "no case for {engine} {versions}");
    }
    let labels: BTreeSet<&str> =
        cases.iter().filter_map(|c| c.get("expect_error")).map(|e| str_of(e, "label")).collect();
    let all = ["not_msgpack", "trailing_bytes", "batch_not_array", "bad_batch", "bad_event", "bad_field"];
    assert_eq!(labels, all.into_iter().collect(), "every DecodeError label has a malformed case");
    let medium: BTreeSet<&str> = cases
        .iter()
        .filter_map(|c| c.get("expect"))
        .flat_map(|e| e["events"].as_array().unwrap())
        .filter_map(|ev| ev.get("medium").and_then(Json::as_str))
        .collect();
    for m in ["GPU", "CPU", "STORAGE", "CPU_PINNED", "DISK", "EXTERNAL"] {
        assert!(medium.contains(m), "no case with medium {m}");
    }
}

// ---------------------------------------------------------------------------------------------------------
// Feed sequences through real sockets
// ---------------------------------------------------------------------------------------------------------

#[cfg(feature = "feed")]
mod feed {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use bytes::Bytes;
    use mmrouter_kv_events::{spawn_feed, FeedConfig, FeedEvent, FeedStats};
    use tokio::sync::{mpsc, oneshot};
    use tokio::task::JoinHandle;
    use zeromq::{RouterSocket, Socket, SocketRecv, SocketSend, XPubSocket, ZmqMessage};

    use super::*;

    /// Generous: waits end as soon as the condition holds; the bound only turns a hang into a failure.
    const WAIT: Duration = Duration::from_secs(20);

    type Ring = Arc<Mutex<VecDeque<(u64, Bytes)>>>;

    /// A publisher as vLLM's / SGLang's `ZmqEventPublisher`: PUB (as XPUB), seq counter, replay ring
    /// of `ring` batches served by a ROUTER.
    struct Publisher {
        xpub: XPubSocket,
        endpoint: String,
        replay_endpoint: Option<String>,
        topic: Bytes,
        ring: Ring,
        ring_size: usize,
        next_seq: u64,
        stop: Option<oneshot::Sender<()>>,
        replay_task: Option<JoinHandle<()>>,
    }

    impl Publisher {
        async fn start(topic: &str, replay: Option<(u8, usize)>) -> Publisher {
            let mut xpub = XPubSocket::new();
            let endpoint = xpub.bind("tcp://127.0.0.1:0").await.expect("bind PUB").to_string();
            let topic = Bytes::from(topic.to_owned());
            let ring: Ring = Arc::default();
            let (mut replay_endpoint, mut stop, mut replay_task, mut ring_size) = (None, None, None, usize::MAX);
            if let Some((frames, size)) = replay {
                let mut router = RouterSocket::new();
                replay_endpoint = Some(router.bind("tcp://127.0.0.1:0").await.expect("bind ROUTER").to_string());
                let (tx, rx) = oneshot::channel();
                stop = Some(tx);
                replay_task = Some(tokio::spawn(serve_replay(router, ring.clone(), frames, topic.clone(), rx)));
                ring_size = size;
            }
            Publisher { xpub, endpoint, replay_endpoint, topic, ring, ring_size, next_seq: 0, stop, replay_task }
        }

        /// Waits until the feed's subscription reached the publisher (later sends are not dropped).
        async fn wait_subscribed(&mut self) {
            let deadline = tokio::time::Instant::now() + WAIT;
            loop {
                let msg = tokio::time::timeout_at(deadline, self.xpub.recv()).await.expect("no subscription").unwrap();
                if msg.get(0).is_some_and(|f| f.first() == Some(&1)) {
                    return;
                }
            }
        }

        /// Takes the next seq and keeps the batch in the replay ring (the engines buffer after sending).
        fn record(&mut self, seq: u64, payload: Bytes) {
            assert_eq!(seq, self.next_seq, "the script's seq is the publisher's counter");
            self.next_seq += 1;
            let mut ring = self.ring.lock().unwrap();
            ring.push_back((seq, payload));
            while ring.len() > self.ring_size {
                ring.pop_front();
            }
        }

        async fn send(&mut self, frames: Vec<Bytes>) {
            self.xpub.send(ZmqMessage::try_from(frames).unwrap()).await.expect("PUB send");
        }

        /// A new publisher process: seq from 0, nothing to replay.
        fn restart(&mut self) {
            self.next_seq = 0;
            self.ring.lock().unwrap().clear();
        }

        async fn shutdown(mut self) {
            let _ = self.xpub.close().await;
            if let Some(stop) = self.stop.take() {
                let _ = stop.send(());
            }
            if let Some(task) = self.replay_task.take() {
                task.await.expect("replay ROUTER task");
            }
        }
    }

    /// The engines' `_service_replay`: `[identity, b"", start]` → every ring entry with seq ≥ start, then
    /// the end marker; `[b"", seq, payload]` (3 frames as the DEALER sees them) or `[b"", topic, seq,
    /// payload]` (4 frames).
    async fn serve_replay(
        mut router: RouterSocket,
        ring: Ring,
        frames: u8,
        topic: Bytes,
        mut stop: oneshot::Receiver<()>,
    ) {
        loop {
            let msg = tokio::select! {
                _ = &mut stop => break,
                msg = router.recv() => msg.expect("ROUTER recv"),
            };
            let req = msg.into_vec();
            assert_eq!(req.len(), 3, "replay request must be [identity, empty, start]");
            assert!(req[1].is_empty(), "replay request without the empty delimiter");
            let start = u64::from_be_bytes(req[2].as_ref().try_into().expect("8-byte start seq"));
            let entries: Vec<_> = ring.lock().unwrap().iter().filter(|(s, _)| *s >= start).cloned().collect();
            let reply = |seq: u64, payload: Bytes, topic: Bytes| {
                let mut f = vec![req[0].clone(), Bytes::new()];
                if frames == 4 {
                    f.push(topic);
                }
                f.extend([Bytes::copy_from_slice(&seq.to_be_bytes()), payload]);
                ZmqMessage::try_from(f).unwrap()
            };
            for (seq, payload) in entries {
                router.send(reply(seq, payload, topic.clone())).await.expect("ROUTER send");
            }
            router.send(reply(u64::MAX, Bytes::new(), Bytes::new())).await.expect("ROUTER send end");
        }
        let _ = router.close().await;
    }

    async fn next_event(rx: &mut mpsc::Receiver<FeedEvent>, what: &str) -> FeedEvent {
        tokio::time::timeout(WAIT, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
            .expect("the feed ended")
    }

    fn check_expectation(step: &Json, ev: FeedEvent) {
        if let Some(exp) = step.get("batch") {
            let FeedEvent::Batch { seq, batch, replayed } = ev else { panic!("expected batch {exp}, got {ev:?}") };
            assert_eq!((seq, replayed), (u64_of(exp, "seq"), exp["replayed"].as_bool().unwrap()), "batch {exp}");
            let want = decode_batch(&read_fixture(str_of(exp, "payload"))).expect("fixture payload decodes");
            assert_eq!(batch, want, "batch {seq} is not the published payload");
            assert_eq!(Some(batch.ts), exp["ts"].as_f64(), "ts of batch {seq}");
            assert_eq!(batch.events.len() as u64, u64_of(exp, "events"), "events of batch {seq}");
            let KvEvent::BlockStored(st) = &batch.events[0] else { panic!("batch {seq}: {:?}", batch.events[0]) };
            assert_eq!(st.block_hashes[0].id(), u64_of(exp, "first_hash_id"), "first hash of batch {seq}");
        } else if let Some(reason) = step.get("reset") {
            let FeedEvent::Reset { reason: got } = ev else { panic!("expected reset {reason}, got {ev:?}") };
            assert_eq!(got.label(), reason.as_str().unwrap(), "reset reason");
        } else if let Some(exp) = step.get("malformed") {
            let FeedEvent::Malformed { seq, error } = ev else { panic!("expected malformed {exp}, got {ev:?}") };
            assert_eq!(seq, exp["seq"].as_u64(), "seq of the malformed message");
            assert_eq!(error.label(), str_of(exp, "label"), "malformed label ({error})");
        } else {
            panic!("unknown expectation {step}");
        }
    }

    fn check_stats(stats: &FeedStats, exp: &Json) {
        let got = serde_json::json!({
            "messages": stats.messages,
            "replayed_messages": stats.replayed_messages,
            "batches": stats.batches,
            "events": stats.events,
            "malformed": stats.malformed,
            "gaps": stats.gaps,
            "duplicates": stats.duplicates,
            "replays": stats.replays,
            "replay_failures": stats.replay_failures,
            "resyncs": stats.resyncs,
            "restarts": stats.restarts,
            "reconnect_resets": stats.reconnect_resets,
            "last_seq": stats.last_seq,
            "history_complete": stats.history_complete,
        });
        assert_eq!(&got, exp, "final FeedStats");
        assert!(stats.connected);
        assert_eq!((stats.disconnects, stats.socket_recreations), (0, 0));
    }

    async fn run_scenario(name: &str) {
        let doc = load_json("sequences.json");
        let sc = doc["scenarios"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("no scenario {name} in sequences.json"))
            .clone();
        let replay = sc["replay"]
            .as_object()
            .map(|r| (r["frames"].as_u64().unwrap() as u8, r["ring"].as_u64().unwrap() as usize));
        let mut publisher = Publisher::start(str_of(&sc, "topic"), replay).await;
        let mut cfg = FeedConfig::new(&publisher.endpoint).with_topic(str_of(&sc, "subscribe"));
        cfg.replay_endpoint = publisher.replay_endpoint.clone();
        cfg.replay_timeout = WAIT;
        let (handle, mut rx) = spawn_feed(cfg).expect("feed config");
        publisher.wait_subscribed().await;

        for (i, step) in sc["steps"].as_array().unwrap().iter().enumerate() {
            match str_of(step, "op") {
                "publish" | "lose" => {
                    let seq = u64_of(step, "seq");
                    let payload = Bytes::from(read_fixture(str_of(step, "payload")));
                    publisher.record(seq, payload.clone());
                    if step["op"] == "publish" {
                        let frames = vec![publisher.topic.clone(), Bytes::copy_from_slice(&seq.to_be_bytes()), payload];
                        publisher.send(frames).await;
                    }
                }
                "restart" => publisher.restart(),
                "frames" => {
                    let frames =
                        step["frames"].as_array().unwrap().iter().map(|f| Bytes::from(hex(f.as_str().unwrap())));
                    publisher.send(frames.collect()).await;
                }
                "expect" => {
                    let ev = next_event(&mut rx, &format!("step {i} of {name}: {step}")).await;
                    check_expectation(step, ev);
                }
                other => panic!("unknown op {other}"),
            }
        }
        check_stats(&handle.stats(), &sc["stats"]);
        if let Ok(ev) = rx.try_recv() {
            panic!("{name}: unexpected extra event {ev:?}");
        }
        handle.shutdown().await;
        publisher.shutdown().await;
    }

    /// One test per scenario; this list must name every scenario of sequences.json.
    const SCENARIOS: [&str; 8] = [
        "normal",
        "gap-replay-3frame",
        "gap-replay-4frame",
        "restart",
        "resync-ring-too-short",
        "gap-without-replay",
        "slow-joiner",
        "malformed-in-stream",
    ];

    #[test]
    fn every_scenario_has_a_test() {
        let doc = load_json("sequences.json");
        let names: BTreeSet<&str> = doc["scenarios"].as_array().unwrap().iter().map(|s| str_of(s, "name")).collect();
        assert_eq!(names, SCENARIOS.into_iter().collect());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn seq_normal() {
        run_scenario("normal").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn seq_gap_filled_by_replay_three_frame_replies() {
        run_scenario("gap-replay-3frame").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn seq_gap_filled_by_replay_four_frame_replies() {
        run_scenario("gap-replay-4frame").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn seq_going_backwards_is_a_restart() {
        run_scenario("restart").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn seq_gap_older_than_the_ring_resyncs() {
        run_scenario("resync-ring-too-short").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn seq_gap_without_replay_endpoint_resyncs() {
        run_scenario("gap-without-replay").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn seq_slow_joiner_replays_from_zero() {
        run_scenario("slow-joiner").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn seq_malformed_messages_in_the_stream() {
        run_scenario("malformed-in-stream").await;
    }
}
