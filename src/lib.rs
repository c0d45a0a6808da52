//! mmrouter, the server: an OpenAI-compatible proxy that routes each request to the worker whose KV
//! cache already holds most of its prompt, images included. See ARCHITECTURE.md for the map.
//!
//! This crate is the HTTP layer over `mmrouter-core` (the pipeline: parse, intake, account, plan,
//! select), in rooms: [`config`] (file → validated settings), `front` (connections, access log, auth,
//! admission), `proxy` (a request's phases over one context), `upstream` (clients, retries, relay),
//! `pools` (pools, workers, feeds, health checks, reload), [`observe`] (every metric, log formats),
//! `ops` (admin API, `/health`, `/metrics`, `/v1/models`), [`server`] (composes them) and [`cli`]
//! (`demo`, `count`, `render`). Only what another crate uses is public.

pub mod cli;
mod cluster;
pub mod config;
mod error;
mod front;
pub mod observe;
mod ops;
mod picker;
mod pools;
mod proxy;
pub mod server;
mod state;
mod upstream;
