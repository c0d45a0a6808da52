//! mmrouter: an OpenAI-compatible proxy that routes each request to the worker whose KV cache
//! already holds most of its prompt, images included. See ARCHITECTURE.md for the map.
//!
//! Pipeline, one module per stage: `media` (intake) → `accounting` (account) → `plan`/`prompt`
//! (plan) → `routing` (select) → `upstream` (forward) → `metrics` (observe); `pipeline` holds the
//! gate and the `RoutePlan`, `server` the request's path.

pub mod accounting;
pub mod cli;
pub mod config;
pub mod demo;
pub mod error;
pub mod loadgen;
pub mod media;
pub mod metrics;
pub mod pipeline;
pub mod plan;
pub mod prompt;
pub mod routing;
pub mod server;
pub mod sim;
pub mod sim_prompter;
pub mod upstream;

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
