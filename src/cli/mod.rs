//! The subcommands besides `serve`: `demo` (a router and simulated workers in one process), `count`
//! (image-token counts), `render` (the prompt the router computes for a request file) and `doctor`
//! (a live deployment checked against the router's own view). A room above
//! the others: it may use any of them.

pub mod count;
pub mod demo;
pub mod doctor;
pub mod render;
