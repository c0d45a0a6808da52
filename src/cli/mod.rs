//! The command line ([`args`]: every subcommand's flags) and the subcommands: `serve` (the proxy from a
//! file or from flags), `demo` (a router and simulated workers in one process), `count`
//! (image-token counts), `render` (the prompt the router computes for a request file) and `doctor`
//! (a live deployment checked against the router's own view). A room above
//! the others: it may use any of them.

pub mod args;
pub mod count;
pub mod demo;
pub mod doctor;
pub mod render;
pub mod serve;

use std::io::Write as _;

/// Writes a command's report to stdout; a reader that has gone (`mmrouter doctor --json | head`) is
/// no error and no panic, as for any Unix filter.
pub fn print_quietly(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}
