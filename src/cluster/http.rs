//! `GET /admin/cluster/snapshot`: this replica's index state for a starting peer, streamed frame by
//! frame (`snapshot`). Under `/admin/`, so it needs an admin key when keys are set (loopback only
//! without). A replica still bootstrapping answers 503: its own state is not whole yet.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;

use super::snapshot;
use crate::error::ApiError;
use crate::observe::CLUSTER_SNAPSHOT_BYTES_TOTAL;
use crate::state::AppState;

/// The cluster's admin routes (mounted under the admin API's loopback-or-key guard).
pub fn routes() -> axum::Router<Arc<AppState>> {
    axum::Router::new().route(super::bootstrap::SNAPSHOT_PATH, axum::routing::get(snapshot_page))
}

async fn snapshot_page(State(st): State<Arc<AppState>>) -> Response {
    let Some(replica) = st.replica_id.clone() else {
        let msg = "this router has no [cluster] section: it serves no snapshot";
        return ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", "not_clustered", msg).into_response();
    };
    if !st.pools.bootstrap.state().ready() {
        let msg = "this replica is still bootstrapping its own state";
        return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "bootstrapping", msg).into_response();
    }
    // A few frames in flight: the writer waits for a slow peer instead of buffering the state.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let (pools, observe) = (st.pools(), st.observe.clone());
    tokio::spawn(async move {
        let sent = snapshot::write(replica, pools, tx).await;
        observe.cluster_count(CLUSTER_SNAPSHOT_BYTES_TOTAL, ("direction", "sent"), sent);
    });
    let body = Body::from_stream(tokio_stream_from(rx).map(Ok::<_, std::convert::Infallible>));
    ([(header::CONTENT_TYPE, "application/x-mmrouter-snapshot")], body).into_response()
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<bytes::Bytes>,
) -> impl futures_util::Stream<Item = bytes::Bytes> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
