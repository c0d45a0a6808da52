//! The operator room: the admin API ([`admin`]), `/health` ([`health`]), `/metrics` ([`metrics`]) and
//! `/v1/models` ([`models`]) — the HTTP faces of the pools and the observer.
//!
//! Architecture invariant: ops reads and changes pools only through the pools room's operations; it
//! never reaches into a request's path.

mod admin;
mod health;
mod metrics;
mod models;

pub use admin::routes as admin_routes;
pub use health::health_page;
pub use metrics::{metrics_page, metrics_text};
pub use models::{model, models};
