//! Stage **observe**: every metric name mmrouter exports ([`names`]: a dashboard contract, see the
//! design's table), the [`Observer`] that records them, and the log formats ([`logging`]).
//!
//! * A proxied request is recorded **once, when its response has ended** ([`record`], pingora's
//!   `logging` phase), from the plain [`RequestRecord`] the proxy fills from its per-request context.
//! * The front door records its own refusals as they happen (shed, auth, client timeouts), and the
//!   event feeds their lag ([`recorder`]).
//! * A scrape ([`scrape`]) renders the recorders with the gauges read from what it is handed: each
//!   pool's router and its feeds' counters as plain [`FeedSample`]s.
//!
//! **A worker's series live and die with it.** Every series labelled `worker` is kept in that worker's
//! own recorder ([`series`]), not the proxy's: dropping a recorder forgets all of its series, so removed
//! workers leave nothing in `/metrics`.
//!
//! * A request's spans ([`spans`]) are built from the same record at the same point, and exported over
//!   OTLP by one task of its own ([`trace`]) when `[tracing]` names a collector.
//!
//! Architecture invariant: this room imports nothing of the crate; it records and renders what it is
//! handed.

mod cache;
pub mod logging;
mod names;
mod record;
mod recorder;
mod scrape;
mod series;
mod spans;
mod trace;

pub use names::*;
pub use record::{Attempt, AttemptStatus, Ending, Leg, LegKind, LegOutcome, RequestRecord};
pub use recorder::Observer;
pub use scrape::{FeedSample, PoolSample};
pub use spans::export_trace;
pub use trace::{RequestTrace, TraceExport, TraceParent, Tracer, TRACEPARENT, TRACESTATE};
