//! `mmrouter serve`: the proxy from a config file, from flags alone (one pool: `--model-dir`,
//! `--worker`, or `--prefill`/`--decode`/`--encode` by role), or from a file whose keys the flags override ([`ConfigFlags`]). A file served without
//! pool flags is re-read on SIGHUP, `POST /admin/reload` and `server.watch_config_ms`, as before; with
//! pool flags nothing is re-read, since a reload of the file alone would drop them.

use std::future::Future;
use std::path::{Path, PathBuf};

use anyhow::anyhow;
use toml::Table;

use super::args::ServeArgs;
use crate::config::{ConfigFlags, Settings};

/// The file `serve` reads when given neither `--config` nor pool flags.
pub const DEFAULT_CONFIG: &str = "config/mmrouter.toml";

/// The header of `--print-config`'s output.
const PRINTED_HEADER: &str = "# mmrouter serve --config THIS_FILE serves the same router.\n\
                              # Every key, with its default: config/mmrouter.toml in the repository.\n";

/// Serves until `shutdown` resolves, or prints the config and returns (`--print-config`).
pub async fn run(args: ServeArgs, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let flags = flags(&args);
    let file = args.config.clone().or_else(|| (!flags.set_pool()).then(|| PathBuf::from(DEFAULT_CONFIG)));
    if args.print_config {
        let (text, _) = config_text(file.as_deref(), &flags)?;
        super::print_quietly(&format!("{PRINTED_HEADER}{text}"))?;
        return Ok(());
    }
    match file {
        Some(path) if !flags.set_pool() => serve_file(path, &flags, shutdown).await,
        file => serve_flags(file.as_deref(), &flags, shutdown).await,
    }
}

fn flags(args: &ServeArgs) -> ConfigFlags {
    ConfigFlags {
        model_dir: args.model_dir.clone(),
        workers: args.workers.clone(),
        prefill: args.prefill.clone(),
        decode: args.decode.clone(),
        encode: args.encode.clone(),
        worker_dns: args.worker_dns.clone(),
        worker_srv: args.worker_srv.clone(),
        bootstrap_port: args.bootstrap_port,
        kv_events: args.kv_events.clone(),
        engine: args.engine,
        block_size: args.block_size,
        listen: args.listen.clone(),
        ext_proc_listen: args.ext_proc_listen.clone(),
    }
}

/// The config file the flags amount to over `file`'s, as TOML, and validated.
fn config_text(file: Option<&Path>, flags: &ConfigFlags) -> anyhow::Result<(String, Settings)> {
    let doc = file.map(read_table).transpose()?;
    let text = flags.to_toml(doc)?;
    let settings = Settings::parse(&text).map_err(|e| match file {
        Some(path) => anyhow!("config {} with the flags: {e}", path.display()),
        None => anyhow!("the flags' config: {e}"),
    })?;
    Ok((text, settings))
}

fn read_table(path: &Path) -> anyhow::Result<Table> {
    let text = std::fs::read_to_string(path).map_err(|e| anyhow!("cannot read config {}: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| anyhow!("config {}: {e}", path.display()))
}

/// The file alone, reloadable: exactly what `serve --config` always did.
/// `--listen` and `--ext-proc-listen` apply over it.
async fn serve_file(
    path: PathBuf,
    flags: &ConfigFlags,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let mut cfg = Settings::load(&path)?;
    crate::observe::logging::init(cfg.server.conn.log_json);
    if let Some(l) = &flags.listen {
        cfg.server.listen = l.parse().map_err(|_| anyhow!("--listen: '{l}' is not an address like 127.0.0.1:8080"))?;
    }
    if let Some(a) = &flags.ext_proc_listen {
        let addr = a.parse().map_err(|_| anyhow!("--ext-proc-listen: '{a}' is not an address like 127.0.0.1:9002"))?;
        cfg.server.ext_proc_listen = Some(addr);
    }
    let listener = tokio::net::TcpListener::bind(cfg.server.listen)
        .await
        .map_err(|e| anyhow!("server.listen {}: {e}", cfg.server.listen))?;
    tracing::info!("mmrouter listening on http://{}", listener.local_addr()?);
    crate::server::serve_file(cfg, path, listener, shutdown).await
}

/// One pool from the flags (over the file's keys, if a file was given).
async fn serve_flags(
    file: Option<&Path>,
    flags: &ConfigFlags,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (_, cfg) = config_text(file, flags)?;
    crate::observe::logging::init(cfg.server.conn.log_json);
    if cfg.server.watch_config.is_some() {
        anyhow::bail!(
            "server.watch_config_ms: a router given --model-dir/--worker/--prefill/--decode/--encode/--block-size does not re-read its file \
             (the flags would be lost); serve the output of --print-config with --config instead"
        );
    }
    let listener = tokio::net::TcpListener::bind(cfg.server.listen)
        .await
        .map_err(|e| anyhow!("cannot listen on {} (--listen): {e}", cfg.server.listen))?;
    tracing::info!("mmrouter listening on http://{}", listener.local_addr()?);
    for w in &cfg.pools[0].workers {
        tracing::info!("pool {}: {} = {} ({})", cfg.pools[0].name, w.spec.name, w.spec.url, w.spec.role.label());
    }
    crate::server::serve_fixed(cfg, listener, shutdown).await
}
