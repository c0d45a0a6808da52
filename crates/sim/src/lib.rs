//! `mmrouter sim`: a stand-in vLLM worker, good enough to measure routing without a GPU.
//!
//! It answers OpenAI `/v1/chat/completions` and `/v1/completions` (streamed or not) with a
//! deterministic text — `n` choices, `logprobs`, tool calls and JSON output (`response_format`) in
//! vLLM's shapes, and vLLM's 400 `BadRequestError` for what vLLM's validators refuse — and vLLM 0.32's
//! Responses API (`responses`: whole and streamed, its store behind `--responses-store`, a
//! `previous_response_id` continuing the stored conversation) and `/tokenize`, `/detokenize`; keeps a paged
//! prefix KV cache shaped like vLLM's (`cache`) and its image processor and encoder caches
//! (`mm_cache`), reports `usage.prompt_tokens_details.cached_tokens`,
//! delays answers by a timing model ([`timing`]: prefill, image preprocessing and encoding), exposes
//! vLLM-named `/metrics` (`exposition`) and injects faults on request (error rate, added delay,
//! streams cut mid-way, drifted usage). Every response carries `x-sim-body-sha256` (the SHA-256 of the
//! exact body bytes received) so tests can prove a proxy forwarded the bytes unchanged, and
//! `x-sim-body-framing` (`length` when the request came with a Content-Length, else `chunked`).
//!
//! The server knows no chat template or tokenizer: a [`Prompter`] turns a request into a token count
//! and chained block keys. `ExactPrompter` is the real one: the router's own core pipeline
//! (template + tokenizer + image expansion + block hashing) as ground truth, so figures measured
//! against sims are self-consistent with the router, not independent of it. [`WordPrompter`] is the
//! crude fallback some tests use.
//!
//! With `--kv-events` it also publishes the KV-cache events a vLLM (or SGLang) worker publishes over
//! ZeroMQ (see [`KvEventsFormat`]): a `BlockStored` for the blocks each admission newly
//! caches, a `BlockRemoved` for each eviction, a replay ROUTER, and faults (dropped batches, late
//! publication, a restart that resets the sequence), so the router's precise mode can be tested end to
//! end.
//!
//! With `--role` it plays one leg of disaggregated serving (`disagg`): a vLLM prefill engine that
//! answers one token and the NIXL `kv_transfer_params`, a decode engine that pulls the prompt's KV
//! (`--transfer-us-per-token`) instead of computing it, an E/PD encoder (`ec_transfer_params`,
//! `--ec-shared-storage`: `ec_storage`), and SGLang's prefill and decode legs, which meet through
//! a bootstrap endpoint (`bootstrap`).
//!
//! A dev tool: it depends on `mmrouter-core`, never the other way round.
//!
//! Layout: `options` and `error` (what a sim is told and how it refuses), `prompt` (the [`Prompter`]
//! seam), `handle` (start and stop), `server` (the HTTP answers), `disagg`, `bootstrap` and
//! `ec_storage` (the disaggregated legs), `params` (a request's answer fields,
//! checked as vLLM checks them), `answer` (each choice's tokens and JSON), `schema` (an instance of a
//! JSON schema), `cache`, `mm_cache`, [`timing`],
//! `events`, `exposition`, `stats`; `ExactPrompter` and [`WordPrompter`] in `exact` and `prompter`.
//! This file only re-exports: the modules import each other by the defining file, never through here.

mod answer;
mod bootstrap;
mod cache;
mod disagg;
mod ec_storage;
mod error;
mod events;
mod exact;
mod exposition;
mod handle;
mod lora;
mod lora_loaded;
mod mm_cache;
mod options;
mod params;
mod prompt;
mod prompter;
mod responses;
mod schema;
mod server;
mod stats;
pub mod timing;
mod tokenize;

pub use error::SimError;
pub use exact::{engine_image_id, run_exact, spawn_exact};
pub use handle::{spawn, SimHandle};
pub use mmrouter_core::routing::residency::processor_item_bytes;
pub use options::{KvEventsFormat, Role, SimOptions, DEFAULT_MODEL};
pub use prompt::{Prompter, SimImage, SimPrompt};
pub use prompter::WordPrompter;
pub use stats::SimStats;
pub use timing::ttft;
