//! The subcommands besides `serve`: `demo` (a router and simulated workers in one process), `count`
//! (image-token counts) and `render` (the prompt the router computes for a request file). A room above
//! the others: it may use any of them.

pub mod count;
pub mod demo;
pub mod render;
