//! The simulator's KV events, read the way the router reads a worker's: through
//! `mmrouter_kv_events::spawn_feed` on real ZMQ sockets (127.0.0.1, ephemeral ports), against a sim that
//! plans with the exact pipeline. Expected token ids and image runs come from the router's own
//! `Pipeline::plan_with` of the same body.
//!
//! Every wait is on a condition with a timeout; a test knows a subscriber is in place once the sim's PUB
//! has counted its subscription, so nothing depends on sleeping past ZMQ's slow-joiner window.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mmrouter_core::media::MediaConfig;
use mmrouter_core::model::{ModelSource, ModelSpec};
use mmrouter_core::pipeline::{Pipeline, PipelineConfig, PromptTrace};
use mmrouter_core::request::{Endpoint, Request};
use mmrouter_kv_events::decode::BlockExtraKeys;
use mmrouter_kv_events::{
    spawn_feed, BlockStored, EventBatch, ExtraKey, FeedConfig, FeedEvent, FeedHandle, KvEvent, ResetReason,
};
use mmrouter_sim::{self as sim, KvEventsFormat, Role, SimHandle, SimOptions, WordPrompter};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::{client, words};

const BS: usize = 16;
const WAIT: Duration = Duration::from_secs(10);
const UUID: &str = "5f0c2a9e8b7d41c3a6e9f1b2d4c8e7a05f0c2a9e8b7d41c3a6e9f1b2d4c8e7a0";
const IMAGE: &str = "alien1.gif";

/// A zero-delay exact sim publishing events on ephemeral loopback ports, with a replay ROUTER.
fn events_opts() -> SimOptions {
    SimOptions {
        ttft_base_ms: 0,
        prefill_us_per_token: 0,
        decode_ms_per_token: 0,
        default_output_tokens: 1,
        kv_events: Some("tcp://127.0.0.1:0".into()),
        kv_events_replay: Some("tcp://127.0.0.1:0".into()),
        ..SimOptions::default()
    }
}

/// A sim and a feed subscribed to it.
struct Rig {
    sim: SimHandle,
    _feed: FeedHandle,
    events: mpsc::Receiver<FeedEvent>,
}

impl Rig {
    async fn start(opts: SimOptions) -> Rig {
        Rig::with_sim(sim::spawn_exact(opts).await.expect("sim starts")).await
    }

    async fn with_sim(sim: SimHandle) -> Rig {
        let endpoint = sim.kv_events_endpoint().expect("events on");
        assert!(endpoint.starts_with("tcp://127.0.0.1:") && !endpoint.ends_with(":0"), "{endpoint}");
        let mut config = FeedConfig::new(endpoint);
        config.replay_endpoint = sim.kv_events_replay_endpoint().map(str::to_owned);
        let (feed, events) = spawn_feed(config).expect("feed");
        wait_until("the PUB counts the subscription", || sim.kv_event_subscriptions() >= 1).await;
        Rig { sim, _feed: feed, events }
    }

    async fn chat(&self, body: &[u8]) -> Value {
        let resp = client()
            .post(format!("{}/v1/chat/completions", self.sim.url()))
            .header("content-type", "application/json")
            .body(body.to_vec())
            .send()
            .await
            .expect("request sent");
        assert_eq!(resp.status(), 200);
        resp.json().await.expect("json")
    }

    async fn next(&mut self) -> FeedEvent {
        tokio::time::timeout(WAIT, self.events.recv()).await.expect("a feed event in time").expect("feed alive")
    }

    /// The next batch; anything else (a reset, a malformed message) fails the test.
    async fn batch(&mut self) -> (u64, EventBatch, bool) {
        match self.next().await {
            FeedEvent::Batch { seq, batch, replayed } => (seq, batch, replayed),
            other => panic!("expected a batch, got {other:?}"),
        }
    }

    /// The only `BlockStored` of the next batch, which must have no other event.
    async fn only_stored(&mut self) -> BlockStored {
        let (_, batch, _) = self.batch().await;
        assert_eq!(removed(&batch), Vec::<u64>::new());
        let mut stored = stored(&batch);
        assert_eq!(stored.len(), 1, "{batch:?}");
        stored.remove(0)
    }
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn stored(batch: &EventBatch) -> Vec<BlockStored> {
    let stored = batch.events.iter().filter_map(|e| match e {
        KvEvent::BlockStored(s) => Some(s.clone()),
        _ => None,
    });
    stored.collect()
}

fn removed(batch: &EventBatch) -> Vec<u64> {
    let removed = batch.events.iter().filter_map(|e| match e {
        KvEvent::BlockRemoved(r) => Some(r.block_hashes.iter().map(|h| h.id()).collect::<Vec<_>>()),
        _ => None,
    });
    removed.flatten().collect()
}

fn hashes(stored: &BlockStored) -> Vec<u64> {
    stored.block_hashes.iter().map(|h| h.id()).collect()
}

fn text_body(tag: &str, n: usize) -> Vec<u8> {
    serde_json::to_vec(&json!({"model": "m", "messages": [{"role": "user", "content": words(n, tag)}]})).expect("json")
}

fn image_bytes() -> Vec<u8> {
    std::fs::read(format!("{}/../../tests/fixtures/images/{IMAGE}", env!("CARGO_MANIFEST_DIR"))).expect("fixture")
}

/// A chat with text, then the image (with `uuid` if given), then more text.
fn image_body(uuid: Option<&str>, extra: Value) -> Vec<u8> {
    use base64::Engine as _;
    let url = format!("data:image/gif;base64,{}", base64::engine::general_purpose::STANDARD.encode(image_bytes()));
    let mut image = json!({"type": "image_url", "image_url": {"url": url}});
    if let Some(uuid) = uuid {
        image["uuid"] = json!(uuid);
    }
    let content = json!([{"type": "text", "text": words(20, "pre")}, image, {"type": "text", "text": "what is it?"}]);
    let mut body = json!({"model": "m", "messages": [{"role": "user", "content": content}]});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    serde_json::to_vec(&body).expect("json")
}

/// The router's own view of `body`'s prompt (ids and image runs), planned as the sim plans it.
async fn trace(body: &[u8]) -> PromptTrace {
    let source = ModelSource::parse("qwen3-vl").expect("bundled profile");
    let model = ModelSpec { block_size: BS as u32, ..ModelSpec::new(source) };
    let media = MediaConfig { trust_client_uuids: true, ..MediaConfig::default() };
    let pipeline = Pipeline::new(&PipelineConfig { model, media }).expect("pipeline");
    let request = Request::parse(Endpoint::Chat, body).expect("parse");
    pipeline.plan_with(&request, true).await.expect("planned").trace.expect("trace")
}

fn full_blocks(ids: &[u32]) -> Vec<u64> {
    ids[..ids.len() / BS * BS].iter().map(|&t| u64::from(t)).collect()
}

/// The extra keys vLLM publishes for blocks `from..` of a prompt with one image named `id` at `span`.
fn expected_extra_keys(trace: &PromptTrace, from: usize, id: &str, salt: Option<&str>) -> BlockExtraKeys {
    let span = trace.spans[0];
    let (start, end) = (span.offset as usize, (span.offset + span.len) as usize);
    (from..trace.ids.len() / BS)
        .map(|i| {
            let mut keys = Vec::new();
            if start < (i + 1) * BS && end > i * BS {
                keys.push(ExtraKey::Mm { id: id.to_owned(), offset: start as i64 - (i * BS) as i64 });
            }
            if i == 0 {
                keys.extend(salt.map(|s| ExtraKey::Str(s.to_owned())));
            }
            (!keys.is_empty()).then_some(keys)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_prompts_announce_their_new_full_blocks_once_chained_to_what_is_cached() {
    let mut rig = Rig::start(events_opts()).await;
    let first = text_body("alpha", 60);
    rig.chat(&first).await;
    let ids = trace(&first).await.ids;
    let (seq, batch, replayed) = rig.batch().await;
    assert_eq!((seq, replayed, batch.dp_rank), (0, false, 0));
    let [announced] = &stored(&batch)[..] else { panic!("one BlockStored: {batch:?}") };
    assert_eq!(announced.token_ids, full_blocks(&ids), "the prompt's full blocks, exactly");
    assert_eq!(announced.block_hashes.len(), ids.len() / BS);
    assert_eq!((announced.parent.as_ref(), announced.block_size), (None, BS as u32));
    assert_eq!((announced.medium.as_deref(), announced.lora_name.as_deref()), (Some("GPU"), None));
    assert_eq!(announced.extra_keys, None);
    let first_hashes = hashes(announced);

    // The same prompt again is served from the cache: nothing new is announced.
    let batches = rig.sim.stats().kv_batches;
    let repeat = rig.chat(&first).await;
    assert!(repeat["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() > Some(0));
    assert_eq!(rig.sim.stats().kv_batches, batches);

    // A prompt sharing a prefix announces only its blocks after the shared ones, parented to the last
    // shared block — and it is the very next batch the feed sees.
    let second = serde_json::to_vec(&json!({"model": "m", "messages": [{"role": "user",
        "content": format!("{} {}", words(30, "alpha"), words(40, "beta"))}]}))
    .expect("json");
    rig.chat(&second).await;
    let second_ids = trace(&second).await.ids;
    let shared = ids.iter().zip(&second_ids).take_while(|(a, b)| a == b).count() / BS;
    assert!(shared >= 2, "the prompts share {shared} full blocks");
    let (seq, batch, _) = rig.batch().await;
    assert_eq!(seq, 1);
    let [next] = &stored(&batch)[..] else { panic!("one BlockStored: {batch:?}") };
    assert_eq!(next.parent.as_ref().map(|h| h.id()), Some(first_hashes[shared - 1]));
    assert_eq!(next.token_ids, full_blocks(&second_ids)[shared * BS..]);
    assert_eq!(next.block_hashes.len(), second_ids.len() / BS - shared);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_a_decode_leg_pulled_are_announced_as_computed_ones() {
    let mut rig = Rig::start(SimOptions { role: Role::Decode, ..events_opts() }).await;
    let plain = text_body("pulled", 50);
    let mut leg: Value = serde_json::from_slice(&plain).expect("json");
    leg["kv_transfer_params"] = json!({"do_remote_prefill": true, "remote_engine_id": "e", "remote_block_ids": [[0, 1, 2, 3]],
        "remote_host": "127.0.0.1", "remote_port": 5600, "remote_num_tokens": 50});
    let answer = rig.chat(&serde_json::to_vec(&leg).expect("json")).await;
    assert_eq!(answer["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(rig.sim.stats().kv_transfers, 1);
    let ids = trace(&plain).await.ids;
    let announced = rig.only_stored().await;
    assert_eq!(announced.token_ids, full_blocks(&ids), "the pulled prompt's full blocks");
    // Sent again without the handoff, the prompt is a local hit and announces nothing new.
    let batches = rig.sim.stats().kv_batches;
    let again = rig.chat(&plain).await;
    assert_eq!(again["usage"]["prompt_tokens_details"]["cached_tokens"], (ids.len() - 1) / BS * BS);
    assert_eq!(rig.sim.stats().kv_batches, batches);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_blocks_carry_the_uuid_or_else_the_sims_own_image_hash() {
    let mut rig = Rig::start(events_opts()).await;
    let with_uuid = image_body(Some(UUID), json!({}));
    rig.chat(&with_uuid).await;
    let plan = trace(&with_uuid).await;
    assert_eq!(plan.spans.len(), 1, "an exact plan with one image");
    let announced = rig.only_stored().await;
    assert_eq!(announced.token_ids, full_blocks(&plan.ids));
    let keys = announced.extra_keys.clone().expect("image blocks have extra keys");
    assert_eq!(keys, expected_extra_keys(&plan, 0, UUID, None));
    let image_blocks = keys.iter().filter(|k| k.is_some()).count();
    assert!(keys[0].is_none() && image_blocks >= 2, "text-only first block, image over {image_blocks} blocks");

    // Without a uuid the image is named by the sim's own hash — neither the uuid nor the router's
    // identity (the hex BLAKE3 digest). Blocks before the image are cached and not announced again.
    let without = image_body(None, json!({}));
    rig.chat(&without).await;
    let plan = trace(&without).await;
    let first_image_block = plan.spans[0].offset as usize / BS;
    let router_id = blake3::hash(&image_bytes()).to_hex().to_string();
    let sim_id = sim::engine_image_id(&router_id);
    assert_ne!(sim_id, router_id);
    let renamed = rig.only_stored().await;
    assert_eq!(renamed.parent.as_ref().map(|h| h.id()), Some(hashes(&announced)[first_image_block - 1]));
    assert_eq!(renamed.token_ids, full_blocks(&plan.ids)[first_image_block * BS..]);
    assert_eq!(renamed.extra_keys, Some(expected_extra_keys(&plan, first_image_block, &sim_id, None)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evictions_remove_previously_announced_blocks_tail_first() {
    let (a, b) = (text_body("gamma", 40), text_body("delta", 40));
    let (a_blocks, b_blocks) = (trace(&a).await.ids.len() / BS, trace(&b).await.ids.len() / BS);
    assert!(b_blocks > 2 && b_blocks <= a_blocks, "{a_blocks} {b_blocks}");
    // Room for A and two more blocks: B must evict the rest from A's tail.
    let mut rig = Rig::start(SimOptions { kv_blocks: a_blocks + 2, ..events_opts() }).await;
    rig.chat(&a).await;
    let a_hashes = hashes(&rig.only_stored().await);
    rig.chat(&b).await;
    let (_, batch, _) = rig.batch().await;
    let evicted = b_blocks - 2;
    let expected: Vec<u64> = a_hashes.iter().rev().take(evicted).copied().collect();
    assert_eq!(removed(&batch), expected);
    assert!(batch.events.iter().take(evicted).all(|e| matches!(e, KvEvent::BlockRemoved(_))), "removals come first");
    let [b_stored] = &stored(&batch)[..] else { panic!("one BlockStored: {batch:?}") };
    assert_eq!(b_stored.block_hashes.len(), b_blocks);
    assert!(hashes(b_stored).iter().all(|h| !a_hashes.contains(h)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_three_formats_decode_to_the_same_content() {
    let body = image_body(None, json!({"cache_salt": "tenant-a"}));
    let mut announced = Vec::new();
    for format in [KvEventsFormat::VllmArray, KvEventsFormat::VllmMap, KvEventsFormat::Sglang] {
        let mut rig = Rig::start(SimOptions { kv_events_format: format, ..events_opts() }).await;
        rig.chat(&body).await;
        announced.push(rig.only_stored().await);
    }
    let [array, map, sglang] = &announced[..] else { unreachable!() };
    assert_eq!(array, map, "vLLM 0.23 arrays and ≥ 0.24 maps carry the same event");
    let plan = trace(&body).await;
    let sim_id = sim::engine_image_id(&blake3::hash(&image_bytes()).to_hex());
    assert_eq!(map.extra_keys, Some(expected_extra_keys(&plan, 0, &sim_id, Some("tenant-a"))));
    assert_eq!(map.cache_salt, None);

    // SGLang: the same ids and links, no extra keys, the salt as metadata, image positions padded.
    assert_eq!((hashes(sglang), &sglang.parent, sglang.block_size), (hashes(map), &map.parent, map.block_size));
    assert_eq!((sglang.extra_keys.as_ref(), sglang.cache_salt.as_deref()), (None, Some("tenant-a")));
    let span = plan.spans[0];
    let image = span.offset as usize..(span.offset + span.len) as usize;
    let pad = sglang.token_ids[image.start];
    assert!((1_000_000..1_000_000 + (1 << 30)).contains(&pad), "pad value {pad}");
    for (i, (&padded, &real)) in sglang.token_ids.iter().zip(&map.token_ids).enumerate() {
        let expected = if image.contains(&i) { pad } else { real };
        assert_eq!(padded, expected, "token {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_batches_are_a_gap_the_feed_fills_by_replay() {
    let mut rig = Rig::start(events_opts()).await;
    rig.chat(&text_body("one", 30)).await;
    assert_eq!(rig.batch().await.0, 0);
    rig.sim.set_kv_events_drop_rate(1.0);
    rig.chat(&text_body("two", 30)).await;
    rig.chat(&text_body("three", 30)).await;
    // The publisher task makes batches after the answers, so wait for it.
    wait_until("three batches, two dropped", || {
        let stats = rig.sim.stats();
        (stats.kv_batches, stats.kv_batches_dropped) == (3, 2)
    })
    .await;
    rig.sim.set_kv_events_drop_rate(0.0);
    rig.chat(&text_body("four", 30)).await;
    let mut seen = Vec::new();
    for _ in 0..3 {
        let (seq, batch, replayed) = rig.batch().await;
        assert_eq!(stored(&batch).len(), 1);
        seen.push((seq, replayed));
    }
    assert_eq!(seen[..2], [(1, true), (2, true)], "the dropped batches come from the replay ring");
    assert_eq!(seen[2].0, 3);
    let stats = rig._feed.stats();
    assert!(stats.gaps >= 1 && stats.replays >= 1, "{stats:?}");
    assert_eq!((stats.resyncs, stats.restarts), (0, 0), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_resets_the_sequence_without_clearing_events() {
    let mut rig = Rig::start(events_opts()).await;
    let first = text_body("epsilon", 30);
    rig.chat(&first).await;
    let before = rig.only_stored().await;
    rig.chat(&text_body("zeta", 30)).await;
    assert_eq!(rig.batch().await.0, 1);

    let resp = client().post(format!("{}/sim/restart", rig.sim.url())).send().await.expect("restart");
    assert_eq!(resp.status(), 200);
    // The cache is empty: the first prompt is stored (and announced) afresh, from seq 0.
    let again = rig.chat(&first).await;
    assert_eq!(again["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(rig.next().await, FeedEvent::Reset { reason: ResetReason::Restart });
    let (seq, batch, _) = rig.batch().await;
    assert_eq!(seq, 0);
    assert!(!batch.events.contains(&KvEvent::AllBlocksCleared), "a restarted vLLM sends no AllBlocksCleared");
    assert_eq!(stored(&batch), vec![before]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_publication_and_prompts_without_token_ids() {
    let mut rig = Rig::start(SimOptions { kv_events_delay_ms: 300, ..events_opts() }).await;
    let sent = Instant::now();
    rig.chat(&text_body("eta", 30)).await;
    rig.batch().await;
    assert!(sent.elapsed() >= Duration::from_millis(300), "published after {:?}", sent.elapsed());

    // A prompter that knows no token ids caches the prompt but announces nothing.
    let word = sim::spawn(events_opts(), Arc::new(WordPrompter)).await.expect("sim starts");
    let rig = Rig::with_sim(word).await;
    let first = rig.chat(&text_body("theta", 40)).await;
    let again = rig.chat(&text_body("theta", 40)).await;
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert!(again["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() > Some(0));
    assert_eq!(rig.sim.stats().kv_batches, 0);
}

#[tokio::test]
async fn without_kv_events_nothing_is_bound() {
    let sim = sim::spawn(SimOptions::default(), Arc::new(WordPrompter)).await.expect("sim starts");
    assert_eq!((sim.kv_events_endpoint(), sim.kv_events_replay_endpoint()), (None, None));
    assert_eq!(sim.kv_event_subscriptions(), 0);
}
