//! The `mmrouter` command: `serve`, `demo`, `count`, `render`, `doctor`, and the dev tools `sim`,
//! `loadgen`, `workload` (each a library crate of the workspace). This binary only parses arguments
//! (`mmrouter::cli::args`, in the library so tests parse commands with the same parser) and dispatches.

use std::process::ExitCode;

use clap::Parser;
use mmrouter::cli::args::{Cli, Cmd};

/// Small, short-lived allocations dominate the request path (headers, bodies, JSON); mimalloc's
/// thread-local free lists serve them for less CPU than glibc's arenas.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // `serve` picks its log format from its config file, once read.
    if !matches!(cli.cmd, Cmd::Serve(_)) {
        mmrouter::observe::logging::init(false);
    }
    let result = match cli.cmd {
        Cmd::Count { model_dir, family, processor_kwargs, sizes, files, json } => {
            mmrouter::cli::count::run_count(&mmrouter::cli::count::CountArgs {
                model_dir: &model_dir,
                family: family.as_deref(),
                processor_kwargs: processor_kwargs.as_deref(),
                sizes: &sizes,
                files: &files,
                json,
            })
        }
        Cmd::Doctor {
            config,
            model_dir,
            workers,
            block_size,
            engine,
            kv_events,
            timeout_secs,
            deadline_secs,
            json,
        } => {
            let args = mmrouter::cli::doctor::DoctorArgs {
                config,
                model_dir,
                workers,
                block_size,
                engine,
                kv_events,
                limits: mmrouter::cli::doctor::Limits {
                    timeout: std::time::Duration::from_secs(timeout_secs),
                    deadline: std::time::Duration::from_secs(deadline_secs),
                },
                json,
            };
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .map_err(anyhow::Error::from)
                .and_then(|rt| rt.block_on(mmrouter::cli::doctor::run(&args)).map(i32::from))
        }
        Cmd::Workload(opts) => mmrouter_loadgen::generate_workload(&opts).map(|n| {
            eprintln!("wrote {n} requests");
            0
        }),
        cmd => run_on_runtime(cmd).map(|()| 0),
    };
    match result {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Runs an async subcommand on a multi-threaded runtime.
fn run_on_runtime(cmd: Cmd) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let result = rt.block_on(run(cmd));
    // Serving has drained by now: work left on the blocking pool (a big prompt's planning) must not
    // hold the exit past the drain deadline.
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    result
}

async fn run(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Serve(args) => mmrouter::cli::serve::run(args, shutdown_signal()).await,
        Cmd::Demo { port, workers, models } => {
            mmrouter::cli::demo::run(port, workers, &models, shutdown_signal()).await
        }
        Cmd::Sim(opts) => mmrouter_sim::run_exact(*opts, shutdown_signal()).await,
        Cmd::Render { model_dir, request, completion } => {
            mmrouter::cli::render::run(&model_dir, &request, completion).await
        }
        Cmd::Loadgen(opts) => {
            let report = mmrouter_loadgen::run(opts).await?;
            mmrouter::cli::print_quietly(&format!("{}\n", report.table()))?;
            Ok(())
        }
        Cmd::Count { .. } | Cmd::Doctor { .. } | Cmd::Workload(_) => unreachable!("handled without this runtime"),
    }
}

/// Resolves on SIGTERM or Ctrl-C. The handlers are installed here, at the call, not when the future is
/// first polled: a SIGTERM that arrives while the server is still starting must not kill the process.
fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        async move {
            match (term, int) {
                (Ok(mut term), Ok(mut int)) => tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} },
                _ => tokio::signal::ctrl_c().await.unwrap_or(()),
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}
