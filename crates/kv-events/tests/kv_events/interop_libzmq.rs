//! Interop test against a real libzmq publisher: a Python script (pyzmq + msgspec, installed into a venv
//! that this test creates under the cargo target dir) encodes events with msgspec structs declared the way
//! the reference describes vLLM's (`array_like=True, omit_defaults=True, tag=True` for ≤ 0.23, tagged maps
//! for ≥ 0.24), publishes them on a libzmq PUB and serves replays on a libzmq ROUTER (3- or 4-frame
//! replies). The feed must deliver every batch from seq 0 exactly once, in order, replaying what the slow
//! join missed.
//!
//! The test is skipped only when `python3 -m venv` is unavailable. Any other failure (no network for pip,
//! import errors, a crashing script) fails the test.
//!
//! Only 127.0.0.1 is used.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use mmrouter_kv_events::{spawn_feed, EngineHash, ExtraKey, FeedConfig, FeedEvent, KvEvent};

const PUBLISHER: &str = r#"
import sys, time
from typing import Any, Optional, Union
import msgspec, zmq

ENCODING, REPLAY_FRAMES, COUNT = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
TOPIC = b"kv@w1"

if ENCODING == "array":
    class Base(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
        pass
else:
    class Base(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
        pass

class BlockStored(Base):
    block_hashes: list[Union[int, bytes]]
    parent_block_hash: Optional[Union[int, bytes]]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]
    extra_keys: Optional[list[Optional[tuple[Any, ...]]]] = None
    group_idx: Optional[int] = None
    kv_cache_spec_kind: Optional[str] = None
    kv_cache_spec_sliding_window: Optional[int] = None

class BlockRemoved(Base):
    block_hashes: list[Union[int, bytes]]
    medium: Optional[str]
    group_idx: Optional[int] = None

class AllBlocksCleared(Base):
    pass

class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]
    data_parallel_rank: Optional[int] = None

encoder = msgspec.msgpack.Encoder()

def batch(seq):
    events = [
        BlockStored(block_hashes=[seq, 2**64 - 1 - seq], parent_block_hash=(seq - 1) if seq else None,
                    token_ids=[seq, 151655, 4 * (1_000_000 + 2**61), 7], block_size=2, lora_id=None,
                    medium="GPU", lora_name=None, extra_keys=[(("img1", -1), "tenant-a"), None],
                    group_idx=0, kv_cache_spec_kind="full_attention"),
        BlockRemoved(block_hashes=[seq], medium="GPU"),
    ]
    if seq % 10 == 9:
        events.append(AllBlocksCleared())
    return encoder.encode(KVEventBatch(ts=float(seq), events=events, data_parallel_rank=1))

END = (2**64 - 1).to_bytes(8, "big")
ctx = zmq.Context()
pub = ctx.socket(zmq.PUB)
pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
router = ctx.socket(zmq.ROUTER)
replay_port = router.bind_to_random_port("tcp://127.0.0.1")
ring, seq = [], 0

def publish_next():
    global ring, seq
    payload = batch(seq)
    ring = (ring + [(seq, payload)])[-10000:]
    pub.send_multipart([TOPIC, seq.to_bytes(8, "big"), payload])
    seq += 1

# Nobody can be subscribed yet (the ports are not known outside): these 5 are lost like a slow join.
for _ in range(5):
    publish_next()
print(f"tcp://127.0.0.1:{pub_port} tcp://127.0.0.1:{replay_port}", flush=True)

poller = zmq.Poller()
poller.register(router, zmq.POLLIN)
deadline = time.monotonic() + 30
next_pub = time.monotonic()
while time.monotonic() < deadline:
    now = time.monotonic()
    if seq < COUNT and now >= next_pub:
        publish_next()
        next_pub = now + 0.01
    wait_ms = 50 if seq >= COUNT else max(0, int((next_pub - time.monotonic()) * 1000))
    for _sock, _ev in poller.poll(wait_ms):
        ident, empty, start = router.recv_multipart()
        assert empty == b"", "replay request without the empty delimiter"
        start = int.from_bytes(start, "big")
        for s, p in ring:
            if s >= start:
                seq_b = s.to_bytes(8, "big")
                router.send_multipart([ident, b"", seq_b, p] if REPLAY_FRAMES == 3 else [ident, b"", TOPIC, seq_b, p])
        router.send_multipart([ident, b"", END, b""] if REPLAY_FRAMES == 3 else [ident, b"", b"", END, b""])
"#;

static SETUP: Mutex<()> = Mutex::new(());

/// Creates (once) a venv with pyzmq and msgspec. `None` only when `python3 -m venv` is unavailable.
fn venv_python() -> Option<PathBuf> {
    let _guard = SETUP.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kv-events-interop-venv");
    let python = dir.join("bin").join("python");
    let ready = |py: &Path| {
        Command::new(py).args(["-c", "import zmq, msgspec"]).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
    };
    if python.exists() && ready(&python) {
        return Some(python);
    }
    let venv = Command::new("python3").args(["-m", "venv", "--clear"]).arg(&dir).output();
    match venv {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            eprintln!("SKIPPED: `python3 -m venv` failed: {}", String::from_utf8_lossy(&out.stderr));
            return None;
        }
        Err(e) => {
            eprintln!("SKIPPED: cannot run python3: {e}");
            return None;
        }
    }
    let out = Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "--no-cache-dir", "--disable-pip-version-check", "pyzmq", "msgspec"])
        .output()
        .expect("run pip");
    assert!(
        out.status.success(),
        "pip install pyzmq msgspec failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(ready(&python), "pyzmq / msgspec not importable after install");
    Some(python)
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn check_batch(seq: u64, ev: &FeedEvent) {
    let FeedEvent::Batch { seq: s, batch, .. } = ev else { panic!("expected batch {seq}, got {ev:?}") };
    assert_eq!(*s, seq);
    assert_eq!(batch.ts, seq as f64);
    assert_eq!(batch.dp_rank, 1);
    assert_eq!(batch.events.len(), if seq % 10 == 9 { 3 } else { 2 });
    let KvEvent::BlockStored(st) = &batch.events[0] else { panic!("{:?}", batch.events[0]) };
    assert_eq!(st.block_hashes, vec![EngineHash::Int(seq), EngineHash::Int(u64::MAX - seq)]);
    assert_eq!(st.parent, seq.checked_sub(1).map(EngineHash::Int));
    assert_eq!(st.token_ids, vec![seq, 151_655, 4 * (1_000_000 + (1 << 61)), 7]);
    assert_eq!(st.block_size, 2);
    assert_eq!((st.lora_id, st.lora_name.as_deref(), st.medium.as_deref()), (None, None, Some("GPU")));
    assert_eq!(
        st.extra_keys,
        Some(vec![Some(vec![ExtraKey::Mm { id: "img1".into(), offset: -1 }, ExtraKey::Str("tenant-a".into())]), None])
    );
    assert_eq!((st.group_idx, st.spec_kind.as_deref(), st.sliding_window), (Some(0), Some("full_attention"), None));
    assert!(st.is_main_attention() && st.is_device_tier() && !st.is_remote());
    let KvEvent::BlockRemoved(rm) = &batch.events[1] else { panic!("{:?}", batch.events[1]) };
    assert_eq!(rm.block_hashes, vec![EngineHash::Int(seq)]);
    assert_eq!(rm.medium.as_deref(), Some("GPU"));
    if seq % 10 == 9 {
        assert_eq!(batch.events[2], KvEvent::AllBlocksCleared);
    }
}

async fn run_interop(encoding: &str, replay_frames: u8) {
    let Some(python) = venv_python() else { return };
    let script = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kv_events_publisher.py");
    std::fs::File::create(&script).and_then(|mut f| f.write_all(PUBLISHER.as_bytes())).expect("write script");
    const LAST: u64 = 40;
    let mut child = KillOnDrop(
        Command::new(&python)
            .arg(&script)
            .args([encoding, &replay_frames.to_string(), "60"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start publisher"),
    );
    let stdout = child.0.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    });
    let line =
        tokio::time::timeout(Duration::from_secs(20), line).await.expect("publisher did not start").unwrap().unwrap();
    let mut eps = line.split_whitespace();
    let (pub_ep, replay_ep) = (eps.next().expect("pub endpoint"), eps.next().expect("replay endpoint"));

    let cfg = FeedConfig::new(pub_ep).with_replay_endpoint(replay_ep).with_topic("kv@w1");
    let (handle, mut rx) = spawn_feed(cfg).unwrap();
    for seq in 0..=LAST {
        let ev =
            tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.expect("timed out").expect("feed ended");
        check_batch(seq, &ev);
    }
    let stats = handle.stats();
    assert!(stats.replays >= 1 && stats.replayed_messages >= 1, "slow join was not replayed: {stats:?}");
    assert_eq!((stats.resyncs, stats.restarts, stats.malformed, stats.replay_failures), (0, 0, 0, 0), "{stats:?}");
    assert!(stats.history_complete);
    eprintln!("{encoding}/{replay_frames}-frame replay: {stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libzmq_vllm_0_23_arrays_with_three_frame_replay() {
    run_interop("array", 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libzmq_vllm_0_24_maps_with_four_frame_replay() {
    run_interop("map", 4).await;
}
