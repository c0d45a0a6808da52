//! Behaviour tests of the `mmrouter` binary and proxy through real sockets: simulated workers and a
//! proxy on 127.0.0.1 ephemeral ports (`harness`), the OpenAI SDK and promtool against it, and the
//! command line. One test binary.

mod accounting_cli;
mod admin;
mod affinity;
mod architecture;
mod cli;
mod cluster;
mod cluster_security;
mod cluster_trust;
mod conn;
mod count_cli;
mod demo_fields;
mod deploy;
mod disagg;
mod dns;
mod doctor;
mod faults;
mod gate;
mod harness;
mod health_checks;
mod hostile_feeds;
mod image_bombs;
mod kv_events;
mod limits;
mod lora;
mod metrics_format;
mod openai_sdk;
mod packaging;
mod picker;
mod pools;
mod proxy;
mod readme;
mod reload;
mod responses;
mod serve_flags;
mod surface;
mod tracing;
mod video;
