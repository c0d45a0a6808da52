//! # mmrouter-kv-events
//!
//! Consume the KV-cache events that vLLM and SGLang workers publish over ZeroMQ, for a KV-cache-aware
//! router.
//!
//! * [`decode`]: msgpack payload → typed [`EventBatch`] / [`KvEvent`], for every engine version's wire
//!   shape (positional arrays and tagged maps).
//! * [`feed`]: one subscription per publisher (worker × data-parallel rank): ZMQ SUB through the crate's own
//!   bounded ZMTP client (every frame size-checked before allocation), sequence tracking,
//!   gap replay through the engine's ROUTER, restart / resync detection, reconnects. Emits
//!   [`FeedEvent`]s on a bounded channel and keeps counters the caller can turn into metrics.
//! * [`endpoint`]: pure helpers for endpoint strings (wildcard host substitution, data-parallel port
//!   offsets).
//! * [`discovery`]: parsers for vLLM's `GET /kv_event_sources` and SGLang's `GET /server_info` `kv_events`
//!   object. The caller performs the HTTP request.
//!
//! The crate deliberately has no HTTP client, CLI or metrics recorder dependency. Without its default
//! `feed` feature it is only the decoder (msgpack, no sockets or runtime).
//!
//! ```no_run
//! use mmrouter_kv_events::{spawn_feed, FeedConfig, FeedEvent, KvEvent};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // vLLM started with --kv-events-config '{"endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5600",...}'
//! // and --data-parallel-size 2:
//! let rank0 = FeedConfig::from_engine_config("10.0.0.7", "tcp://*:5557", Some("tcp://*:5600"), "")?;
//! for cfg in rank0.expand_data_parallel(2)? {
//!     let (handle, mut events) = spawn_feed(cfg)?;
//!     tokio::spawn(async move {
//!         let _handle = handle; // dropping the handle stops the feed
//!         while let Some(ev) = events.recv().await {
//!             match ev {
//!                 FeedEvent::Batch { batch, .. } => {
//!                     for event in batch.events {
//!                         if let KvEvent::BlockStored(stored) = event {
//!                             if stored.is_main_attention() && stored.is_device_tier() && !stored.is_remote() {
//!                                 // index stored.token_ids / stored.block_hashes ...
//!                             }
//!                         }
//!                     }
//!                 }
//!                 FeedEvent::Reset { reason } => { /* drop this worker's blocks; count reason.label() */ }
//!                 FeedEvent::Malformed { error, .. } => { /* count error.label() */ }
//!                 FeedEvent::Synced => { /* a resumed feed (hold_until_resumed) caught up */ }
//!             }
//!         }
//!     });
//! }
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

pub mod decode;
#[cfg(feature = "feed")]
pub mod discovery;
pub mod endpoint;
#[cfg(feature = "feed")]
mod feed;
#[cfg(feature = "feed")]
mod zmtp;

pub use decode::{decode_batch, BlockRemoved, BlockStored, DecodeError, EngineHash, EventBatch, ExtraKey, KvEvent};
#[cfg(feature = "feed")]
pub use feed::{
    spawn_feed, FeedConfig, FeedConfigError, FeedEvent, FeedHandle, FeedStats, FrameError, Malformed, ResetReason,
    ZmtpError,
};
