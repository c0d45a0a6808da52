//! The pools room: the model pools and their workers over time — the pool list ([`list`]) and each
//! [`Pool`] ([`pool`]), worker changes ([`workers`]) and reloads ([`reload`]), the workers' KV-event
//! feeds ([`feeds`], [`discovery`]), workers from DNS ([`dns`]), active health checks ([`health`]) and
//! what each worker serves ([`served`]: its LoRA adapters), and which worker stored each Responses API
//! answer ([`responses`]).
//!
//! Architecture invariant: no axum and no app state here — pools know the config, the observer and the
//! core's routers and pipelines; a feed holds its pool's router weakly. The HTTP side of these
//! operations (admin API, `/health`) is the ops room's.

mod bootstrap;
mod discovery;
mod dns;
mod engine_metrics;
mod feeds;
mod health;
mod list;
mod lora_load;
mod page;
mod pool;
mod reload;
mod responses;
mod served;
mod workers;

pub use bootstrap::BootstrapState;
pub use discovery::{discover_now, resolve, Refusals};
pub use dns::spawn_dns;
pub use feeds::EventExport;
pub use health::spawn_checks;
pub use list::Pools;
pub use lora_load::{LoadError, Requester};
pub use pool::Pool;
pub use reload::{reload_file, spawn_watch};
pub use responses::{valid_id as valid_response_id, ResponsePeers, ResponseStore};
pub use workers::ChangeError;
