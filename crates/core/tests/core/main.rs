//! Behaviour tests of mmrouter-core: accounting against the reference processors' goldens, image
//! intake (data URLs, local HTTP servers, the SSRF guard, fuzzing), the request parse, prompt
//! rendering parity, planning and routing. One test binary; servers bind 127.0.0.1 only.

mod accounting_golden;
mod accounting_kwargs;
mod accounting_props;
/// The seeded multilingual corpus of mmrouter-tokenize's own parity tests, shared rather than copied.
#[path = "../../../tokenize/tests/tokenize/common/corpus.rs"]
mod corpus;
mod encode;
mod media_common;
mod media_data_url;
mod media_fuzz;
mod media_http;
mod media_probes;
mod media_ssrf;
mod parity;
mod plan;
mod prompt_parity;
mod request_parse;
mod responses;
mod routing;
mod tokenize_parity;
mod video;
mod video_bounds;
mod video_plan;

use std::path::PathBuf;

/// The workspace's shared test data (`tests/fixtures` at the repository root).
pub fn fixtures() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures"))
}
