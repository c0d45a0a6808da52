//! The encoder stage's choice (`Router::select_encoder`): affinity by image residency until the
//! holder's queue outweighs it, the fallback by load, and the comparison policies.

use mmrouter_core::routing::{EncodePolicy, EncodeRequest, ImageUse, Load, Role, Router, RoutingConfig, WorkerSpec};

fn encoders(n: usize, policy: EncodePolicy) -> Router {
    let specs = (0..n).map(|i| WorkerSpec::new(format!("e{i}"), "http://127.0.0.1:1").with_role(Role::Encode));
    let mut specs: Vec<WorkerSpec> = specs.collect();
    specs.push(WorkerSpec::new("whole", "http://127.0.0.1:1"));
    let cfg = RoutingConfig { encode_policy: policy, ..RoutingConfig::default() };
    Router::new(cfg, specs).unwrap()
}

fn image(key: u128) -> ImageUse {
    ImageUse { key, tokens: 1000, end: 2000 }
}

fn pick(r: &Router, images: &[ImageUse]) -> usize {
    r.select_encoder(&EncodeRequest { images }).expect("an encoder").worker()
}

#[test]
fn an_image_returns_to_the_encoder_that_computed_it_until_its_queue_outweighs_it() {
    let r = encoders(3, EncodePolicy::Residency);
    let a = [image(1)];
    r.images_sent(2, &a);
    assert_eq!(pick(&r, &a), 2, "affinity");
    // Work queued on the holder: one image's worth still beats encoding it again elsewhere...
    let one = Load { prefill_tokens: 0, decode_tokens: 0, image_tokens: 1000 };
    let _g1 = r.begin(2, one);
    assert_eq!(pick(&r, &a), 2);
    // ...two do not (queue weight 1: 2 × 0.35 × 1000 > (0.35 + 0.25) × 1000).
    let _g2 = r.begin(2, one);
    assert_ne!(pick(&r, &a), 2, "spread");
    assert_ne!(pick(&r, &a), 3, "never the whole-request worker");
}

#[test]
fn a_fallback_goes_to_the_encoder_with_fewest_requests() {
    let r = encoders(2, EncodePolicy::Residency);
    let _g = r.begin(0, Load::default());
    assert_eq!(pick(&r, &[]), 1);
}

#[test]
fn round_robin_takes_turns_and_the_hash_ring_is_stable_per_image() {
    let r = encoders(3, EncodePolicy::RoundRobin);
    let picks: Vec<usize> = (0..6).map(|_| pick(&r, &[image(1)])).collect();
    assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
    let r = encoders(3, EncodePolicy::HashRing);
    let first = pick(&r, &[image(7)]);
    assert!((0..10).all(|_| pick(&r, &[image(7)]) == first));
    let spread: std::collections::HashSet<usize> = (0..64u128).map(|k| pick(&r, &[image(k)])).collect();
    assert_eq!(spread.len(), 3, "images spread over the ring");
}

#[test]
fn no_encoder_no_choice() {
    let r = encoders(0, EncodePolicy::Residency);
    assert!(r.select_encoder(&EncodeRequest { images: &[image(1)] }).is_none());
}

#[test]
fn a_new_image_goes_to_the_idle_encoder_holding_the_fewest_images() {
    let r = encoders(3, EncodePolicy::Residency);
    r.images_sent(0, &[image(1), image(2)]);
    r.images_sent(1, &[image(3)]);
    for _ in 0..10 {
        assert_eq!(pick(&r, &[image(9)]), 2);
    }
}

#[test]
fn round_robin_rotates_each_role_on_its_own() {
    let specs = [Role::Prefill, Role::Prefill, Role::Decode, Role::Decode]
        .iter()
        .enumerate()
        .map(|(i, &role)| WorkerSpec::new(format!("w{i}"), "http://127.0.0.1:1").with_role(role))
        .collect();
    let cfg = RoutingConfig { policy: mmrouter_core::routing::PolicyKind::RoundRobin, ..RoutingConfig::default() };
    let r = Router::new(cfg, specs).unwrap();
    let req = mmrouter_core::routing::SelectRequest {
        blocks: &[],
        block_size: 16,
        prompt_tokens: 10,
        decode_tokens: 1,
        images: Vec::new(),
        unseen: false,
    };
    let mut prefill = Vec::new();
    for _ in 0..4 {
        prefill.push(r.select_for(&req, Role::Prefill).unwrap().worker());
        r.select_for(&req, Role::Decode).unwrap();
    }
    assert_eq!(prefill, [0, 1, 0, 1], "a decode pick between does not reset the prefill rotation");
}
