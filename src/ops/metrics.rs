//! `GET /metrics`: the Prometheus exposition, rendered by the observer from each pool's router and its
//! feeds' samples.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};

use crate::observe::PoolSample;
use crate::state::AppState;

pub async fn metrics_page(State(st): State<Arc<AppState>>) -> Response {
    ([("content-type", "text/plain; version=0.0.4; charset=utf-8")], metrics_text(&st)).into_response()
}

/// The exposition `/metrics` serves.
pub fn metrics_text(st: &AppState) -> String {
    let pools = st.pools();
    let samples: Vec<PoolSample<'_>> = pools
        .iter()
        .map(|p| PoolSample { name: &p.name, router: &p.router, feeds: p.feeds().iter().map(|f| f.sample()).collect() })
        .collect();
    st.observe.render(&samples)
}
