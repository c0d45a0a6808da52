//! Choosing the **encode worker** of a disaggregated pool's encoder stage (E/PD): the engine that runs
//! the vision encoder for a request's images and hands the embeddings to prefill.
//!
//! An encoder-only engine keeps what it computed in its own caches (processed pixels, encoder outputs),
//! and which encoder computed which image is exactly what the router's content hashes know: the
//! residency model (`residency.rs`) fed by the exact route's dispatches. Per encode worker,
//!
//! ```text
//! cost = Σ over the request's images  tokens × (image_encoder_weight × (1 − encoder-cache confidence)
//!                                              + image_preprocess_weight × (1 − processor-cache confidence))
//!      + image_encoder_weight × encode_queue_weight × encoder tokens in flight there
//! ```
//!
//! so an image goes back to the encoder that likely still holds it (affinity), unless that encoder's
//! queue costs more than computing the image again elsewhere (spread); an image no encoder holds goes
//! to the least busy one. A fallback plan names no image (the mission's rule): its encode leg goes to
//! the encoder with the fewest requests in flight.
//! Peers pick encoders round-robin (vllm-router), at random (llm-d) or by a hash ring (SMG).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::policy::argmin_random_tie;
use super::residency::{Held, ImageUse};
use super::worker::{Role, Worker};

/// How the encoder stage picks an encode worker (`[routing] encode_policy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EncodePolicy {
    /// By the residency model, the encoder's cost and its load (the default; see the module docs).
    #[default]
    Residency,
    /// In turn (vllm-router's choice), for comparison.
    RoundRobin,
    /// By a rendezvous hash of the first image's identity over the encoders' names (SMG's hash ring),
    /// for comparison; a request without known images goes to the least loaded.
    HashRing,
}

impl EncodePolicy {
    pub fn label(self) -> &'static str {
        match self {
            EncodePolicy::Residency => "encode_residency",
            EncodePolicy::RoundRobin => "encode_round_robin",
            EncodePolicy::HashRing => "encode_hash_ring",
        }
    }
}

/// How the encode cost weighs its terms (from `[routing]`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct EncodeWeights {
    pub encoder: f64,
    pub preprocess: f64,
    pub queue: f64,
}

/// One request's encoder work as selection sees it.
pub struct EncodeRequest<'a> {
    /// The exact plan's images to encode (their identities and encoder tokens); empty on a fallback
    /// route, which names none: its encoder is the least busy.
    pub images: &'a [ImageUse],
}

impl EncodeRequest<'_> {
    /// Encoder tokens of the request's images (0 for a fallback: the router does not know them).
    pub fn tokens(&self) -> u32 {
        self.images.iter().map(|i| i.tokens).fold(0u32, u32::saturating_add)
    }
}

/// Per eligible encode worker, its cost (NaN for the others) and the encoder tokens it likely holds of
/// the request's images (what `/debug/route` shows as its credit).
pub(crate) fn costs(workers: &[Arc<Worker>], req: &EncodeRequest<'_>, w: EncodeWeights) -> (Vec<f64>, Vec<f64>) {
    let now = Instant::now();
    let mut costs = Vec::with_capacity(workers.len());
    let mut held_tokens = Vec::with_capacity(workers.len());
    for worker in workers {
        if worker.role() != Role::Encode || !worker.selectable(now) {
            costs.push(f64::NAN);
            held_tokens.push(0.0);
            continue;
        }
        let inflight = worker.total_inflight();
        if req.images.is_empty() {
            // A fallback names no image and the router does not know its tokens: the least busy
            // encoder, by requests, then by the encoder tokens queued there.
            costs.push(inflight.requests as f64 + inflight.image_tokens as f64 * 1e-9);
            held_tokens.push(0.0);
            continue;
        }
        let held = worker.images_held(req.images);
        let queued = inflight.image_tokens as f64;
        // Equal costs (an image no encoder holds, every encoder idle) go to the encoder holding the
        // fewest images, so new images spread evenly and each encoder's cache keeps its share whole.
        let tie_break = worker.images_resident() as f64 * 1e-6;
        costs.push(work(req, &held, w) + w.encoder * w.queue * queued + tie_break);
        held_tokens.push(req.images.iter().zip(&held).map(|(i, h)| f64::from(i.tokens) * h.encoder).sum());
    }
    (costs, held_tokens)
}

/// The request's own encoder work on a worker holding `held` of its images.
fn work(req: &EncodeRequest<'_>, held: &[Held], w: EncodeWeights) -> f64 {
    let per_image = req
        .images
        .iter()
        .zip(held)
        .map(|(i, h)| f64::from(i.tokens) * (w.encoder * (1.0 - h.encoder) + w.preprocess * (1.0 - h.processor)));
    per_image.sum()
}

/// The eligible encode worker `policy` picks (`costs` NaN for the others), if any.
pub(crate) fn pick(
    policy: EncodePolicy,
    workers: &[Arc<Worker>],
    req: &EncodeRequest<'_>,
    costs: &[f64],
    turn: &AtomicUsize,
) -> Option<usize> {
    let eligible: Vec<usize> = (0..costs.len()).filter(|&i| !costs[i].is_nan()).collect();
    if eligible.is_empty() {
        return None;
    }
    match (policy, req.images.first()) {
        (EncodePolicy::RoundRobin, _) => Some(eligible[turn.fetch_add(1, Ordering::Relaxed) % eligible.len()]),
        (EncodePolicy::HashRing, Some(image)) => {
            let score =
                |i: &usize| xxhash_rust::xxh3::xxh3_64_with_seed(workers[*i].name().as_bytes(), image.key as u64);
            eligible.iter().copied().max_by_key(|i| score(i))
        }
        (EncodePolicy::HashRing, None) => {
            let loads: Vec<f64> = (0..costs.len())
                .map(|i| if costs[i].is_nan() { f64::NAN } else { workers[i].total_inflight().image_tokens as f64 })
                .collect();
            argmin_random_tie(&loads, &mut rand::rng())
        }
        (EncodePolicy::Residency, _) => argmin_random_tie(costs, &mut rand::rng()),
    }
}
