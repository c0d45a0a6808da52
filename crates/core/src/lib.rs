//! mmrouter-core: the router's pipeline, free of HTTP serving, CLI parsing and metrics recording.
//!
//! One module per stage, in request order:
//!
//! ```text
//! request ─► media ─► accounting ─► [gate] ─► plan/prompt ─► routing
//! parse      intake    account                 plan           select
//! ```
//!
//! [`pipeline`] runs parse-to-plan for one request and holds the gate (all images accounted, or a
//! text-prefix plan with a reason); [`routing`] ranks the workers. Everything that happens is
//! reported as values ([`pipeline::Planned`], [`routing::Decision`], [`media::ProbeTiming`]); the
//! server's observe stage turns them into metrics. See ARCHITECTURE.md for the crate map.
//!
//! The block keys both sides of routing compute (from a plan, from a worker's KV events) are in
//! `keys`, a leaf that imports nothing of the crate, so `plan`, `media` and `routing` share them
//! without knowing each other.

pub mod accounting;
mod generations;
mod keys;
pub mod media;
pub mod model;
pub mod pipeline;
pub mod plan;
pub mod prompt;
pub mod request;
pub mod routing;

/// A reqwest client builder with the rustls crypto provider installed.
///
/// reqwest is built without a bundled provider (the default, aws-lc, is a long C build); every client
/// in the process — upstream, health checks, image fetches, tests — is made through this so the ring
/// provider is installed first.
pub fn http_client_builder() -> reqwest::ClientBuilder {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Err means another provider is already installed, which serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
    reqwest::Client::builder()
}
