//! The endpoint-picker room: mmrouter behind a gateway. A gRPC server speaking Envoy's external
//! processing protocol as the Gateway API Inference Extension's endpoint-picker protocol specifies
//! (proposal 004): the gateway sends each request's head and body, the router runs the proxy's
//! phases up to select and names the worker (`x-gateway-destination-endpoint` and `envoy.lb`
//! metadata); the gateway forwards the request and streams the response back through here, so the
//! load, the drift metric and the index stay as true as in proxy mode. Also the gRPC health service
//! (`liveness`, `readiness`, the ext_proc service). docs/gateway.md.
//!
//! A second front door over the same pipeline: it knows the proxy's phases, never axum or the
//! proxy's relay; the proxy knows nothing of gRPC.

mod envoy;
mod exchange;

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use futures_util::Stream;
use tonic::{Request, Response, Status, Streaming};
use tonic_health::ServingStatus;

use crate::config::Settings;
use crate::state::AppState;
use exchange::{Exchange, Shared};

/// The ext_proc service.
pub struct Picker {
    shared: Arc<Shared>,
}

type Answers = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalProcessor for Picker {
    type ProcessStream = Answers;

    async fn process(&self, request: Request<Streaming<ProcessingRequest>>) -> Result<Response<Answers>, Status> {
        let inbound = request.into_inner();
        let exchange = Exchange::new(self.shared.clone());
        // One answer per message, in order; the exchange (and what it holds) is dropped with the stream.
        let answers =
            futures_util::stream::unfold((inbound, exchange, false), |(mut inbound, mut ex, failed)| async move {
                if failed {
                    return None;
                }
                let message = inbound.message().await.ok().flatten()?;
                let answer = ex.handle(message).await;
                let failed = answer.is_err();
                Some((answer, (inbound, ex, failed)))
            });
        Ok(Response::new(Box::pin(answers)))
    }
}

/// Serves the picker and gRPC health on `listener` until `shutdown` resolves.
pub async fn serve(
    cfg: &Settings,
    state: Arc<AppState>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let s = &cfg.server;
    let shared = Arc::new(Shared {
        st: state,
        fallbacks: s.ext_proc_fallbacks,
        max_body_bytes: s.max_body_bytes,
        inflight: AtomicUsize::new(0),
        max_inflight: s.conn.max_inflight_requests,
        retry_after_secs: s.conn.shed_retry_after_secs,
    });
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_service_status("liveness", ServingStatus::Serving).await;
    let ready = is_ready(&shared.st);
    report_readiness(&reporter, ready).await;
    tokio::spawn(follow_readiness(Arc::downgrade(&shared.st), reporter, ready));
    let picker =
        ExternalProcessorServer::new(Picker { shared }).max_decoding_message_size(s.max_body_bytes + (1 << 20));
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .add_service(health)
        .add_service(picker)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await?;
    Ok(())
}

/// How often the gRPC health follows the router's readiness.
const READINESS_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// Whether the picker should get requests: as `/health` says, not while the router drains or a
/// replica's bootstrap is not whole.
fn is_ready(st: &AppState) -> bool {
    !st.draining.is_on() && st.pools.bootstrap.state().ready()
}

/// `readiness` and the ext_proc service's health: NOT_SERVING when not ready, so a gateway
/// health-checking the picker stops sending it requests before the process goes (liveness stays
/// SERVING).
async fn report_readiness(reporter: &tonic_health::server::HealthReporter, ready: bool) {
    let status = if ready { ServingStatus::Serving } else { ServingStatus::NotServing };
    reporter.set_service_status("readiness", status).await;
    if ready {
        reporter.set_serving::<ExternalProcessorServer<Picker>>().await;
    } else {
        reporter.set_not_serving::<ExternalProcessorServer<Picker>>().await;
    }
}

/// Follows readiness changes; ends with the app state (held weakly: it does not keep a stopped
/// server's state alive).
async fn follow_readiness(
    st: std::sync::Weak<AppState>,
    reporter: tonic_health::server::HealthReporter,
    mut last: bool,
) {
    loop {
        tokio::time::sleep(READINESS_EVERY).await;
        let Some(st) = st.upgrade() else { return };
        let ready = is_ready(&st);
        if ready != last {
            report_readiness(&reporter, ready).await;
            last = ready;
        }
    }
}

/// Binds `server.ext_proc_listen` when set and serves the picker there in the background; the bound
/// address.
pub async fn spawn(cfg: &Settings, state: &Arc<AppState>) -> anyhow::Result<Option<SocketAddr>> {
    let Some(addr) = cfg.server.ext_proc_listen else { return Ok(None) };
    let listener =
        tokio::net::TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("server.ext_proc_listen {addr}: {e}"))?;
    let bound = listener.local_addr()?;
    let (cfg, state) = (cfg.clone(), state.clone());
    tokio::spawn(async move {
        if let Err(e) = serve(&cfg, state, listener, std::future::pending()).await {
            tracing::error!("endpoint picker stopped: {e}");
        }
    });
    tracing::info!("endpoint picker (ext_proc) listening on {bound}");
    Ok(Some(bound))
}
