//! Behaviour of the routing facade: the policies' choices given index contents and in-flight load.

use mmrouter_core::routing::{
    BySource, Decision, ImageUse, Load, PolicyKind, Router, RoutingConfig, SelectRequest, WorkerSpec,
};

const BS: u32 = 16;

fn names(n: usize) -> Vec<WorkerSpec> {
    (0..n).map(|i| WorkerSpec::new(format!("w{i}"), format!("http://127.0.0.1:{}", 9000 + i))).collect()
}

/// Sets every worker's health from `healthy` (a missing entry is unhealthy), then selects.
fn select(r: &Router, req: &SelectRequest<'_>, healthy: &[bool]) -> Option<Decision> {
    for i in 0..r.workers().len() {
        if healthy.get(i).copied().unwrap_or(false) {
            r.mark_up(i);
        } else {
            r.mark_down(i);
        }
    }
    r.select(req)
}

fn router(policy: PolicyKind, n: usize) -> Router {
    let cfg = RoutingConfig { policy, ..RoutingConfig::default() };
    Router::new(cfg, names(n)).expect("valid router")
}

/// `n` chained-looking block keys, distinct per `seed`.
fn blocks(seed: u64, n: usize) -> Vec<u64> {
    (0..n as u64).map(|i| (seed << 32 | i).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed).collect()
}

fn req(blocks: &[u64]) -> SelectRequest<'_> {
    SelectRequest {
        blocks,
        block_size: BS,
        prompt_tokens: blocks.len() as u32 * BS,
        decode_tokens: 32,
        images: Vec::new(),
        unseen: false,
    }
}

fn prefill(tokens: u32) -> Load {
    Load { prefill_tokens: tokens, decode_tokens: 0, image_tokens: 0 }
}

#[test]
fn kv_prefers_more_overlap_when_loads_are_equal() {
    let r = router(PolicyKind::Kv, 3);
    let b = blocks(1, 40);
    r.record(0, &b[..10]);
    r.record(1, &b[..20]);
    for _ in 0..200 {
        let d = select(&r, &req(&b), &[true, true, true]).expect("healthy workers");
        assert_eq!(d.worker(), 1);
        assert_eq!(d.overlap_blocks, vec![10, 20, 0]);
        assert_eq!(d.overlap_tokens(d.worker(), BS), 320);
        // cost = uncached tokens here (no load): 640 − overlap × 16.
        assert_eq!(d.costs, vec![480.0, 320.0, 640.0]);
        assert_eq!(d.policy, "kv");
    }
}

#[test]
fn kv_prefers_a_cold_idle_worker_over_a_hot_busy_one() {
    // Prompt: 40 blocks × 16 = 640 tokens. Worker 0 holds the first 30 blocks (480 tokens saved).
    let b = blocks(2, 40);
    let healthy = [true, true];

    // Worker 0 has 2400 prefill tokens in flight, weighing (queue_weight 0.25) more than the 480 it
    // would save:
    //   cost(w0) = 1.0 × ((640 − 480) + 0.25 × 2400) + 1.0 × 0 = 760
    //   cost(w1) = 1.0 × (640 + 0)                   + 1.0 × 0 = 640  → the cold worker 1 wins.
    let r = router(PolicyKind::Kv, 2);
    r.record(0, &b[..30]);
    let _busy = r.begin(0, prefill(2400));
    let d = select(&r, &req(&b), &healthy).expect("healthy workers");
    assert_eq!(d.costs, vec![760.0, 640.0]);
    assert_eq!(d.worker(), 1);

    // With only 1600 in flight the cache still pays off: cost(w0) = 160 + 400 = 560 < 640.
    let r = router(PolicyKind::Kv, 2);
    r.record(0, &b[..30]);
    let _busy = r.begin(0, prefill(1600));
    let d = select(&r, &req(&b), &healthy).expect("healthy workers");
    assert_eq!(d.costs, vec![560.0, 640.0]);
    assert_eq!(d.worker(), 0);
}

#[test]
fn kv_counts_decode_load_with_its_weight() {
    // Equal overlap (none); worker 0 has 100 decode tokens in flight. decode_weight 0.5:
    //   cost(w0) = 1.0 × 640 + 0.5 × 100 = 690, cost(w1) = 640 → worker 1.
    let cfg = RoutingConfig { decode_weight: 0.5, ..RoutingConfig::default() };
    let r = Router::new(cfg, names(2)).expect("valid router");
    let b = blocks(3, 40);
    let _g = r.begin(0, Load { prefill_tokens: 0, decode_tokens: 100, image_tokens: 0 });
    let d = select(&r, &req(&b), &[true, true]).expect("healthy workers");
    assert_eq!(d.costs, vec![690.0, 640.0]);
    assert_eq!(d.worker(), 1);
}

#[test]
fn kv_breaks_ties_at_random() {
    let r = router(PolicyKind::Kv, 3);
    let b = blocks(4, 8);
    r.record(0, &b);
    r.record(2, &b);
    let mut seen = [0u32; 3];
    for _ in 0..1000 {
        seen[select(&r, &req(&b), &[true, true, true]).expect("healthy").worker()] += 1;
    }
    // Workers 0 and 2 tie (cost 0) and worker 1 is worse: ~500 each expected, < 200 is ~1e-80 likely.
    assert_eq!(seen[1], 0, "{seen:?}");
    assert!(seen[0] > 200 && seen[2] > 200, "{seen:?}");
}

#[test]
fn kv_temperature_spreads_choices() {
    let b = blocks(5, 40);
    let pick_counts = |temperature: f64| {
        let cfg = RoutingConfig { temperature, ..RoutingConfig::default() };
        let r = Router::new(cfg, names(2)).expect("valid router");
        r.record(0, &b);
        let mut seen = [0u32; 2];
        for _ in 0..2000 {
            seen[select(&r, &req(&b), &[true, true]).expect("healthy").worker()] += 1;
        }
        seen
    };
    // T = 0: the cheaper worker 0 always.
    assert_eq!(pick_counts(0.0), [2000, 0]);
    // T = 1: normalised costs 0 and 1, p(w1) = e⁻¹ / (1 + e⁻¹) ≈ 0.27 → ~540 of 2000.
    let seen = pick_counts(1.0);
    assert!(seen[1] > 300 && seen[0] > seen[1], "{seen:?}");
}

#[test]
fn unhealthy_workers_are_never_chosen() {
    for policy in [PolicyKind::Kv, PolicyKind::RoundRobin, PolicyKind::LeastLoaded] {
        let r = router(policy, 3);
        let b = blocks(6, 10);
        r.record(0, &b); // the best cache is on an unhealthy worker
        for _ in 0..100 {
            let d = select(&r, &req(&b), &[false, true, false]).expect("worker 1 is healthy");
            assert_eq!(d.worker(), 1, "{policy:?}");
            assert!(d.costs[0].is_nan() && d.costs[2].is_nan() && !d.costs[1].is_nan(), "{policy:?}");
        }
        assert!(select(&r, &req(&b), &[false, false, false]).is_none(), "{policy:?}");
        // A short health mask counts the missing workers as unhealthy.
        assert_eq!(select(&r, &req(&b), &[false, true]).map(|d| d.worker()), Some(1), "{policy:?}");
        assert!(select(&r, &req(&b), &[]).is_none(), "{policy:?}");
    }
    assert!(select(&router(PolicyKind::Kv, 0), &req(&[]), &[]).is_none());
}

#[test]
fn round_robin_cycles_over_healthy_workers() {
    let r = router(PolicyKind::RoundRobin, 4);
    let b = blocks(7, 4);
    let healthy = [true, false, true, true];
    let order: Vec<usize> = (0..9).map(|_| select(&r, &req(&b), &healthy).expect("healthy").worker()).collect();
    assert_eq!(order, vec![0, 2, 3, 0, 2, 3, 0, 2, 3]);
    // Worker 1 comes back: it gets its turn right after the last choice (3 → 0 → 1).
    let order: Vec<usize> = (0..4).map(|_| select(&r, &req(&b), &[true; 4]).expect("healthy").worker()).collect();
    assert_eq!(order, vec![0, 1, 2, 3]);
}

#[test]
fn every_policy_reports_the_index_overlap() {
    for policy in [PolicyKind::RoundRobin, PolicyKind::LeastLoaded] {
        let r = router(policy, 2);
        let b = blocks(8, 10);
        r.record(1, &b[..7]);
        let d = select(&r, &req(&b), &[true, true]).expect("healthy");
        assert_eq!(d.overlap_blocks, vec![0, 7], "{policy:?}");
    }
}

#[test]
fn least_loaded_picks_fewest_requests_then_fewest_tokens() {
    let r = router(PolicyKind::LeastLoaded, 3);
    let b = blocks(9, 4);
    let all = [true, true, true];
    let _a = r.begin(0, prefill(10));
    let _b = r.begin(0, prefill(10));
    let c = r.begin(1, prefill(500));
    let _d = r.begin(2, prefill(100));
    // w0: 2 requests; w1 and w2: 1 request each, w2 has fewer tokens.
    let d = select(&r, &req(&b), &all).expect("healthy");
    assert_eq!(d.worker(), 2);
    assert_eq!(d.costs, vec![2.0, 1.0, 1.0]);
    assert_eq!(d.policy, "least_loaded");
    drop(c);
    assert_eq!(select(&r, &req(&b), &all).map(|d| d.worker()), Some(1));
}

#[test]
fn least_loaded_breaks_full_ties_at_random() {
    let r = router(PolicyKind::LeastLoaded, 2);
    let b = blocks(10, 4);
    let mut seen = [0u32; 2];
    for _ in 0..1000 {
        seen[select(&r, &req(&b), &[true, true]).expect("healthy").worker()] += 1;
    }
    assert!(seen[0] > 200 && seen[1] > 200, "{seen:?}");
}

#[test]
fn a_repeated_prompt_follows_its_cache() {
    let r = router(PolicyKind::Kv, 4);
    let b = blocks(11, 30);
    let healthy = [true; 4];
    let first = select(&r, &req(&b), &healthy).expect("healthy");
    assert_eq!(first.overlap_blocks, vec![0; 4]);
    {
        let mut guard = r.begin(first.worker(), prefill(480));
        r.record(first.worker(), &b);
        guard.first_byte();
    }
    for _ in 0..20 {
        let d = select(&r, &req(&b), &healthy).expect("healthy");
        assert_eq!(d.worker(), first.worker());
        assert_eq!(d.overlap_tokens(d.worker(), BS), 480);
    }
    assert_eq!(r.index_blocks(), 30);
    assert!(r.mark_down(first.worker()));
    assert_eq!(r.index_blocks(), 0);
}

#[test]
fn loads_snapshot_names_workers_and_returns_to_zero() {
    let r = router(PolicyKind::Kv, 2);
    let mut g = r.begin(1, Load { prefill_tokens: 50, decode_tokens: 8, image_tokens: 20 });
    let loads = r.loads();
    assert_eq!(loads[1].worker, "w1");
    assert_eq!(
        (loads[1].inflight.requests, loads[1].inflight.prefill_tokens, loads[1].inflight.image_tokens),
        (1, 50, 20)
    );
    g.first_byte();
    assert_eq!(r.loads()[1].inflight.prefill_tokens, 0);
    drop(g);
    assert!(r.loads().iter().all(|l| l.inflight == Default::default()));
}

#[test]
fn decision_serialises_unhealthy_costs_as_null() {
    let r = router(PolicyKind::Kv, 2);
    let b = blocks(12, 2);
    let d = select(&r, &req(&b), &[true, false]).expect("healthy");
    let v = serde_json::to_value(&d).expect("serialisable");
    assert_eq!(v["candidates"], serde_json::json!([0]));
    assert_eq!(v["costs"], serde_json::json!([32.0, null]));
    assert_eq!(v["overlap_blocks"], serde_json::json!([0, 0]));
    let none = serde_json::json!({"blocks": 0, "events": 0, "pending": 0, "approximate": 0});
    assert_eq!(v["overlap_sources"], serde_json::json!([none, none]));
    assert_eq!(v["policy"], "kv");
}

#[test]
fn config_parses_snake_case_policies_and_rejects_unknown_keys() {
    #[derive(serde::Deserialize)]
    struct Wrap {
        routing: RoutingConfig,
    }
    let parse = |s: &str| serde_json::from_str::<Wrap>(s).map(|w| w.routing);
    let c = parse(r#"{"routing": {"policy": "least_loaded", "temperature": 0.5}}"#).expect("valid");
    assert_eq!(c.policy, PolicyKind::LeastLoaded);
    assert_eq!((c.temperature, c.prefill_weight), (0.5, 1.0));
    assert_eq!(parse(r#"{"routing": {"policy": "round_robin"}}"#).expect("valid").policy, PolicyKind::RoundRobin);
    assert!(parse(r#"{"routing": {"policy": "random"}}"#).is_err());
    assert!(parse(r#"{"routing": {"temprature": 1}}"#).is_err());
    assert_eq!(parse(r#"{"routing": {"pending_ttl_secs": 5}}"#).expect("valid").pending_ttl_secs, 5);
}

#[test]
fn a_dispatch_is_pending_on_an_event_worker_and_approximate_elsewhere() {
    let r = router(PolicyKind::Kv, 2);
    let b = blocks(13, 6);
    r.worker(0).set_publishes_events(true);
    assert!(r.worker(0).publishes_events() && !r.worker(1).publishes_events());
    r.record(0, &b);
    r.record(1, &b[..4]);
    let d = select(&r, &req(&b), &[true, true]).expect("healthy");
    assert_eq!(d.overlap_blocks, vec![6, 4]);
    let o = &d.overlap_sources;
    assert_eq!((o[0].blocks, o[0].pending, o[0].events, o[0].approximate), (6, 6, 0, 0));
    assert_eq!((o[1].blocks, o[1].approximate), (4, 4));
    // The worker's events confirm the first blocks; a later dispatch does not downgrade them.
    r.store_events(0, &b[..3]);
    r.record(0, &b);
    let d = select(&r, &req(&b), &[true, true]).expect("healthy");
    assert_eq!((d.overlap_sources[0].events, d.overlap_sources[0].pending), (3, 3));
    assert_eq!(r.index_entries(), BySource { events: 3, pending: 3, approximate: 4 });
    let v = serde_json::to_value(&d).expect("serialisable");
    assert_eq!(v["overlap_sources"][0], serde_json::json!({"blocks": 6, "events": 3, "pending": 3, "approximate": 0}));
}

#[test]
fn image_blocks_events_cannot_confirm_stay_approximate() {
    let mut specs = names(3);
    specs[1].engine = mmrouter_core::routing::Engine::Sglang;
    let r = Router::new(RoutingConfig::default(), specs).expect("valid router");
    let b = blocks(15, 8);
    for w in 0..3 {
        r.worker(w).set_publishes_events(true);
    }
    r.record_prompt(0, &b, 3, true); // vLLM naming images by the router's uuid: all confirmable
    r.record_prompt(1, &b, 3, true); // SGLang: its events name image tokens by pad values
    r.record_prompt(2, &b, 3, false); // vLLM rehashing the uuid with the request's kwargs
    let d = select(&r, &req(&b), &[true; 3]).expect("healthy");
    let split: Vec<_> = d.overlap_sources.iter().map(|o| (o.pending, o.approximate)).collect();
    assert_eq!(split, vec![(8, 0), (3, 5), (3, 5)]);
    // Text-only prompts (image_from = len) are pending everywhere.
    let t = blocks(16, 4);
    r.record_prompt(1, &t, t.len(), true);
    assert_eq!(select(&r, &req(&t), &[true; 3]).expect("healthy").overlap_sources[1].pending, 4);
}

#[test]
fn event_removals_and_clears_reach_the_index() {
    let r = router(PolicyKind::Kv, 3);
    let b = blocks(14, 5);
    for w in 0..3 {
        r.worker(w).set_publishes_events(true);
        r.store_events(w, &b);
    }
    r.remove_events(1, &b[2..3]); // evicted in the middle: the overlap ends before it
    r.clear_worker(2); // e.g. the worker's feed resyncs
    let d = select(&r, &req(&b), &[true; 3]).expect("healthy");
    assert_eq!(d.overlap_blocks, vec![5, 2, 0]);
    assert_eq!(r.index_entries().events, 5 + 4);
    // A worker that goes down forgets its events too; the keys only it held go.
    assert!(r.mark_down(0));
    assert_eq!(r.index_entries().events, 4);
    assert_eq!(r.index_blocks(), 4);
}

#[test]
fn a_thousand_and_twenty_four_workers_route_to_the_longest_cache() {
    let r = router(PolicyKind::Kv, 1024);
    let b = blocks(15, 40);
    for w in 0..1024 {
        // Every worker holds the 8-block head; worker 1023 holds the whole prompt.
        r.store_events(w, &b[..if w == 1023 { 40 } else { 8 }]);
    }
    let d = r.select(&req(&b)).expect("healthy");
    assert_eq!(d.worker(), 1023);
    assert_eq!(d.candidates.len(), 1024);
    assert_eq!((d.overlap_blocks[0], d.overlap_blocks[1023]), (8, 40));
}

#[test]
fn a_full_worker_counts_what_it_would_evict() {
    let route = |eviction_weight: f64| {
        let cfg = RoutingConfig { eviction_weight, ..RoutingConfig::default() };
        let r = Router::new(cfg, names(2)).expect("valid router");
        let b = blocks(17, 40);
        for w in 0..2 {
            r.worker(w).set_publishes_events(true);
        }
        // Worker 0 holds the request's first 10 blocks and has evicted: it is full at 500 blocks.
        r.store_events(0, &b[..10]);
        r.worker(0).report_cache(500, true);
        assert_eq!(r.worker(0).cache_room(), Some(0));
        assert_eq!(r.worker(1).cache_room(), None, "never evicted: capacity unknown");
        select(&r, &req(&b), &[true, true]).expect("healthy")
    };
    // 30 new blocks there evict 30 others: 30 + 30 > 40 uncached blocks on the empty worker.
    let d = route(1.0);
    assert_eq!(d.worker(), 1, "{:?}", d.costs);
    assert_eq!(d.costs, vec![(30 + 30) as f64 * BS as f64, 40.0 * BS as f64]);
    // Without the eviction term the shared prefix wins whatever it costs the worker's other users.
    assert_eq!(route(0.0).worker(), 0);
}

#[test]
fn cache_room_follows_the_events() {
    let r = router(PolicyKind::Kv, 1);
    let w = r.worker(0);
    w.report_cache(100, false);
    assert_eq!(w.cache_room(), None);
    w.report_cache(120, true);
    assert_eq!((w.cache_capacity(), w.cache_room()), (Some(120), Some(0)));
    w.report_cache(90, false);
    assert_eq!(w.cache_room(), Some(30));
    w.report_cache(130, false); // held more than thought: the capacity grows with it
    assert_eq!(w.cache_capacity(), Some(130));
    w.report_cache(0, false); // restarted: empty, the capacity stays
    assert_eq!(w.cache_room(), Some(130));
}

/// A request of `n` blocks whose one image of `tokens` encoder tokens sits in blocks 2.. (after a
/// 32-token text prefix), named `key`.
fn image_req(blocks: &[u64], key: u128, tokens: u32) -> SelectRequest<'_> {
    let image = ImageUse { key, tokens, end: 32 + u64::from(tokens) };
    SelectRequest { images: vec![image], ..req(blocks) }
}

#[test]
fn the_image_credit_goes_to_the_worker_whose_engine_holds_the_image() {
    let r = router(PolicyKind::Kv, 3);
    let b = blocks(7, 40); // a new prefix: no worker holds any block of it
    r.images_sent(2, &[ImageUse { key: 42, tokens: 256, end: 0 }]);
    for _ in 0..100 {
        let d = select(&r, &image_req(&b, 42, 256), &[true, true, true]).expect("healthy workers");
        assert_eq!(d.worker(), 2, "{:?}", d.costs);
        // Just sent: full confidence in both caches, so 256 × (0.35 + 0.25) prefill tokens credited.
        assert!((d.image_credit[2] - 256.0 * 0.6).abs() < 1e-6, "{:?}", d.image_credit);
        assert_eq!(&d.image_credit[..2], &[0.0, 0.0]);
        assert!((d.costs[0] - d.costs[2] - 256.0 * 0.6).abs() < 1e-6);
    }
    // An image of another request is no credit, and load still weighs against the credit.
    let other = select(&r, &image_req(&b, 43, 256), &[true, true, true]).unwrap();
    assert_eq!(other.image_credit, vec![0.0; 3]);
    let _busy = r.begin(2, prefill(1_000));
    assert_ne!(select(&r, &image_req(&b, 42, 256), &[true, true, true]).unwrap().worker(), 2);
}

#[test]
fn the_image_credit_fades_and_ends_as_the_engines_lru_would_evict() {
    let cfg = RoutingConfig { encoder_cache_tokens: 1_000, processor_cache_gb: 0.0, ..RoutingConfig::default() };
    let r = Router::new(cfg, names(2)).unwrap();
    let b = blocks(9, 40);
    let credit = |r: &Router| select(r, &image_req(&b, 1, 200), &[true, true]).unwrap().image_credit[0];
    r.images_sent(0, &[ImageUse { key: 1, tokens: 200, end: 0 }]);
    assert!((credit(&r) - 200.0 * 0.35).abs() < 1e-6, "encoder cache only (processor cache off)");
    r.images_sent(0, &[ImageUse { key: 2, tokens: 400, end: 0 }]);
    assert!((credit(&r) - 200.0 * 0.35 * 0.75).abs() < 1e-6, "400 of the 800 tokens it leaves used since");
    r.images_sent(0, &[ImageUse { key: 3, tokens: 390, end: 0 }]);
    let next_out = 1.0 - 0.5 * 790.0 / 800.0;
    assert!((credit(&r) - 200.0 * 0.35 * next_out).abs() < 1e-6, "all but 10 of them used since");
    r.images_sent(0, &[ImageUse { key: 4, tokens: 20, end: 0 }]);
    assert_eq!(credit(&r), 0.0, "evicted: 200 + 400 + 390 + 20 > 1000");
}

#[test]
fn an_image_inside_the_cached_prefix_earns_only_the_processor_credit() {
    let r = router(PolicyKind::Kv, 2);
    let b = blocks(11, 40);
    r.record(0, &b[..30]); // 480 cached tokens reach past the image's end (32 + 256 = 288)
    r.images_sent(0, &[ImageUse { key: 5, tokens: 256, end: 0 }]);
    r.images_sent(1, &[ImageUse { key: 5, tokens: 256, end: 0 }]);
    let d = select(&r, &image_req(&b, 5, 256), &[true, true]).unwrap();
    // Its encoder skips the image there anyway; its processor runs on every request.
    assert!((d.image_credit[0] - 256.0 * 0.25).abs() < 1e-6, "{:?}", d.image_credit);
    assert!((d.image_credit[1] - 256.0 * 0.6).abs() < 1e-6, "{:?}", d.image_credit);
    assert_eq!(d.worker(), 0, "480 cached tokens beat the credit");
}
