//! mmrouter, the server: an OpenAI-compatible proxy that routes each request to the worker whose KV
//! cache already holds most of its prompt, images included. See ARCHITECTURE.md for the map.
//!
//! This crate is the HTTP layer over `mmrouter-core` (the pipeline: parse, intake, account, plan,
//! select): [`server`] (routes, state), [`proxy`] (the request's path), [`upstream`] (forward and
//! relay), [`retry`] (retry policy and budget), [`observe`] (every metric), [`health`], [`config`] (file → validated settings),
//! [`error`] (OpenAI-shaped errors), and the `demo`, `count` and `render` subcommands. The client
//! side: [`conn`] (accept loop, timeouts, caps, drain) and the front door [`front`] ([`access`],
//! [`auth`], [`admission`]); [`logging`] sets up the log format.

pub mod access;
pub mod admin;
pub mod admission;
pub mod auth;
pub mod bodies;
pub mod config;
pub mod conn;
pub mod count;
pub mod demo;
pub mod error;
pub mod events;
pub mod front;
pub mod health;
pub mod logging;
pub mod observe;
pub mod proxy;
pub mod reload;
pub mod render;
pub mod retry;
pub mod server;
pub mod state;
pub mod upstream;
