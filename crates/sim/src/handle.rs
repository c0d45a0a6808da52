//! Starting and stopping a simulated worker: bind and serve in a background task ([`spawn`]), serve until
//! a signal ([`run`]), and the [`SimHandle`] that reports on it and stops it (gracefully, then by cutting
//! streams, then by aborting).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;

use crate::bootstrap;
use crate::events;
use crate::options::{Role, SimOptions};
use crate::prompt::Prompter;
use crate::server;
use crate::stats::SimStats;

/// A running simulated worker. Dropping it or calling [`SimHandle::shutdown`] stops it: new
/// connections are refused at once, in-flight answers get a short grace period, then are cut.
pub struct SimHandle {
    /// The bound address (the real port when `--port 0`).
    pub addr: SocketAddr,
    state: Arc<server::AppState>,
    task: Option<tokio::task::JoinHandle<()>>,
    /// The event sockets' tasks; dropped (aborted, sockets closed) with the handle.
    events: Option<events::Sockets>,
    /// SGLang prefill's bootstrap endpoint (`--bootstrap-port`): its bound port and its server task.
    bootstrap: Option<(u16, Aborted)>,
}

/// A task aborted when this is dropped.
struct Aborted(tokio::task::JoinHandle<()>);

impl Drop for Aborted {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// In-flight answers may finish within this time after a shutdown request…
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// …then they are cut, and the server task is aborted if still alive after this.
const SHUTDOWN_CUT: Duration = Duration::from_secs(1);

impl SimHandle {
    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The worker's name (`--name`).
    pub fn name(&self) -> &str {
        &self.state.opts.name
    }

    /// A snapshot of the worker's counters.
    pub fn stats(&self) -> SimStats {
        self.state.stats()
    }

    /// The worker's `--role`.
    pub fn role(&self) -> Role {
        self.state.opts.role
    }

    /// The bound SGLang bootstrap port (the real port when `--bootstrap-port 0`), if one was asked for.
    pub fn bootstrap_port(&self) -> Option<u16> {
        self.bootstrap.as_ref().map(|(port, _)| *port)
    }

    /// The bound KV-event PUB endpoint (`tcp://127.0.0.1:PORT`, the real port), if events are on.
    pub fn kv_events_endpoint(&self) -> Option<&str> {
        self.events.as_ref().map(|e| e.endpoint.as_str())
    }

    /// The bound replay ROUTER endpoint, if one was asked for.
    pub fn kv_events_replay_endpoint(&self) -> Option<&str> {
        self.events.as_ref().and_then(|e| e.replay_endpoint.as_deref())
    }

    /// Subscriptions the PUB has received so far (monotonic). Once a subscriber's subscription is
    /// counted, every later batch reaches it: tests wait for this instead of sleeping.
    pub fn kv_event_subscriptions(&self) -> u64 {
        self.events.as_ref().map_or(0, events::Sockets::subscriptions)
    }

    /// Changes `--error-rate` while running (clamped to 0..1): a worker that starts or stops failing.
    pub fn set_error_rate(&self, rate: f64) {
        self.state.set_error_rate(rate);
    }

    /// Changes `--kv-events-drop-rate` while running (clamped to 0..1).
    pub fn set_kv_events_drop_rate(&self, rate: f64) {
        self.state.set_kv_events_drop_rate(rate);
    }

    /// Stops the server and waits (bounded) until it is gone.
    pub async fn shutdown(mut self) {
        if let Some(task) = self.task.take() {
            stop(self.state.clone(), task).await;
        }
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        let Some(task) = self.task.take() else { return };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(stop(self.state.clone(), task));
            }
            Err(_) => {
                self.state.begin_stop();
                self.state.cut_streams();
                task.abort();
            }
        }
    }
}

async fn stop(state: Arc<server::AppState>, mut task: tokio::task::JoinHandle<()>) {
    state.begin_stop();
    if tokio::time::timeout(SHUTDOWN_GRACE, &mut task).await.is_ok() {
        return;
    }
    state.cut_streams();
    if tokio::time::timeout(SHUTDOWN_CUT, &mut task).await.is_err() {
        task.abort();
    }
}

/// Binds `opts.host:opts.port` and serves in a background task.
pub async fn spawn(opts: SimOptions, prompter: Arc<dyn Prompter>) -> anyhow::Result<SimHandle> {
    opts.validate()?;
    if let (Role::Encode, Some(dir)) = (opts.role, &opts.ec_shared_storage) {
        // As vLLM's ECExampleConnector, the producer creates its storage directory.
        std::fs::create_dir_all(dir).with_context(|| format!("sim: cannot create {}", dir.display()))?;
    }
    let listener = tokio::net::TcpListener::bind((opts.host.as_str(), opts.port))
        .await
        .with_context(|| format!("sim: cannot bind {}:{}", opts.host, opts.port))?;
    let addr = listener.local_addr().context("sim: no local address")?;
    let (publisher, sockets) = match &opts.kv_events {
        Some(endpoint) => {
            let (publisher, sockets) = events::start(endpoint, &opts).await?;
            (Some(publisher), Some(sockets))
        }
        None => (None, None),
    };
    let bootstrap_listener = match opts.bootstrap_port {
        Some(port) => Some(
            tokio::net::TcpListener::bind((opts.host.as_str(), port))
                .await
                .with_context(|| format!("sim: cannot bind the bootstrap port {}:{port}", opts.host))?,
        ),
        None => None,
    };
    let bootstrap_port = match &bootstrap_listener {
        Some(l) => Some(l.local_addr().context("sim: no bootstrap address")?.port()),
        None => None,
    };
    let bound = sockets
        .as_ref()
        .map(|s| server::Bound { endpoint: &s.endpoint, replay_endpoint: s.replay_endpoint.as_deref() });
    let state = Arc::new(server::AppState::new(opts, prompter, publisher, bound.as_ref(), bootstrap_port));
    let bootstrap = bootstrap_listener.zip(bootstrap_port).map(|(listener, port)| {
        let app = bootstrap::router(state.rooms.clone());
        let stopping = state.stopping();
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stopping).await {
                tracing::warn!(error = %e, "sim bootstrap server ended with an error");
            }
        });
        (port, Aborted(task))
    });
    let app = server::router(
        state.clone(),
        crate::responses::routes().merge(crate::tokenize::routes()).merge(crate::lora::routes()),
    );
    let stopping = state.stopping();
    let task = tokio::spawn(async move {
        let serve = axum::serve(listener, app).with_graceful_shutdown(stopping);
        if let Err(e) = serve.await {
            tracing::warn!(error = %e, "sim server ended with an error");
        }
    });
    tracing::info!(name = %state.opts.name, %addr, role = state.opts.role.as_str(), "simulated worker listening");
    Ok(SimHandle { addr, state, task: Some(task), events: sockets, bootstrap })
}

/// `mmrouter sim`: serves until `shutdown` resolves (e.g. Ctrl-C), then stops gracefully.
pub async fn run(
    opts: SimOptions,
    prompter: Arc<dyn Prompter>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let handle = spawn(opts, prompter).await?;
    let mut banner = format!("mmrouter sim `{}` listening on {}\n", handle.name(), handle.url());
    if handle.role() != Role::Both {
        banner.push_str(&format!("mmrouter sim `{}` role: {}\n", handle.name(), handle.role().as_str()));
    }
    if let Some(port) = handle.bootstrap_port() {
        banner.push_str(&format!("mmrouter sim `{}` bootstrap on port {port}\n", handle.name()));
    }
    if let Some(endpoint) = handle.kv_events_endpoint() {
        let replay = handle.kv_events_replay_endpoint().unwrap_or("none");
        banner.push_str(&format!(
            "mmrouter sim `{}` publishing KV events on {endpoint} (replay: {replay})\n",
            handle.name()
        ));
    }
    // A reader that has gone (`mmrouter sim | head -1`) is no reason to stop serving, nor to panic.
    let mut out = std::io::stdout().lock();
    let _ = std::io::Write::write_all(&mut out, banner.as_bytes()).and_then(|()| std::io::Write::flush(&mut out));
    drop(out);
    shutdown.await;
    handle.shutdown().await;
    Ok(())
}
