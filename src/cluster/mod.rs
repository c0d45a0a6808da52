//! The cluster room: several router replicas that route as one (`[cluster]`).
//!
//! * [`bootstrap`]: a starting replica grafts a peer's index state (`snapshot`, served by [`http`])
//!   or replays the engines' rings, before `/health` reports ready;
//! * [`bookings`] over [`nats`]: each replica's bookings (request admitted on a worker, first byte,
//!   end) and dispatch records (pending and approximate blocks) reach the others, which weigh them as
//!   remote load and index entries. The core's `routing::Link` is the seam: the proxy knows nothing
//!   of any of this. The Responses store's `ResponsePeers` is the same seam for stored response ids.
//!
//! Must not know: the proxy (a request's path) and the ops room.

mod bookings;
mod bootstrap;
mod checks;
mod http;
mod nats;
mod snapshot;

use std::future::Future;
use std::sync::Arc;

use crate::config::Settings;
use crate::pools::Pools;
use crate::state::AppState;

pub use http::routes;

/// Starts the replica's cluster side, if `[cluster]` is set: call before the feeds start, so they
/// hold their live batches for the bootstrap. Returns the bootstrap, to spawn once the feeds exist:
/// it resumes the feeds it finds, and one that ran first (nothing to ask takes no time) found none,
/// leaving every batch held and the index without events.
pub fn start(cfg: &Settings, state: &Arc<AppState>) -> Option<impl Future<Output = ()> + Send + 'static> {
    let settings = cfg.cluster.clone()?;
    state.pools.bootstrap.begin();
    let pools = state.pools.clone();
    if let Some(conn) = settings.nats.clone() {
        let (outbox, outgoing) = bookings::Outbox::new(settings.replica_id.clone(), state.observe.clone());
        link_pools(&pools, &outbox);
        state.responses.set_peers(outbox.clone());
        let nats = nats::Nats::new(settings.clone(), pools.clone(), state.observe.clone(), outbox)
            .with_responses(state.responses.clone());
        tokio::spawn(Arc::new(nats).run(conn, outgoing));
    }
    let boot = bootstrap::Bootstrapper {
        settings,
        pools,
        observe: state.observe.clone(),
        admin_key: cfg.auth.admin_keys.first().cloned(),
    };
    Some(boot.run())
}

/// Gives every pool's router the link to the cluster (again for pools a reload created).
fn link_pools(pools: &Pools, outbox: &Arc<bookings::Outbox>) {
    for pool in pools.list().iter() {
        if !pool.router.has_link() {
            pool.router.set_link(outbox.link(&pool.name));
        }
    }
}
