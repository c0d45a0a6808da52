//! What a router tells the other replicas of a cluster, and what they tell it: the seam between
//! selection and whatever carries it (the server's `cluster` room, over NATS). The core knows nothing
//! of the carrier.
//!
//! * [`Link`]: this replica's decisions, in order — a booking (a request admitted on a worker, before
//!   it is dispatched), its first byte and its end, and the blocks each dispatch records. A router
//!   without a link (a lone replica) calls nothing.
//! * Every other replica's bookings reach a worker as its *remote* load (`Worker::add_remote`,
//!   `Worker::release_remote`); selection weighs local + remote in-flight load, so replicas that
//!   choose a millisecond apart see each other's choice once the message lands. Their dispatch
//!   records enter the index as they would here ([`super::Router::apply_remote_dispatch`]), and the
//!   images they sent enter the workers' image-residency models ([`super::Router::apply_remote_images`]),
//!   and what their engines counted in fallback prefixes the unseen-token map
//!   ([`super::Router::apply_remote_unseen`]).

use super::index::Source;
use super::load::Load;
use super::residency::ImageUse;

/// Receives this replica's bookings and dispatch records (see the module docs). Implementations must
/// not block: they are called on the request's path.
pub trait Link: Send + Sync {
    /// A request was admitted on the worker named `worker` with `load`; returns the booking's id
    /// (unique per replica).
    fn book(&self, worker: &str, load: Load) -> u64;
    /// The booking's first response byte arrived: its prefill load is released.
    fn first_byte(&self, booking: u64);
    /// The booking ended (response done, failed or cancelled).
    fn finish(&self, booking: u64);
    /// `blocks` were recorded for `worker` with `source` (`Pending` or `Approximate`) at dispatch.
    fn dispatched(&self, worker: &str, blocks: &[u64], source: Source);
    /// The exact route sent `images` to `worker` (its engine now likely caches them).
    fn images_sent(&self, worker: &str, images: &[ImageUse]) {
        let _ = (worker, images);
    }
    /// A fallback's prefix ending at block `key` held `tokens` more than its plan counted (see
    /// `unseen`): a conversation's next turn may reach another replica.
    fn unseen_learnt(&self, key: u64, tokens: u32) {
        let _ = (key, tokens);
    }
}
