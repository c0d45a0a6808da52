//! Image intake (pipeline stage `intake`): find the image parts of a chat request, get each image's
//! bytes (bounded base64 decode for `data:` URLs, a bounded fetch behind an SSRF guard for
//! `http(s)://` URLs), read its stored width × height from the header and hash its raw bytes. The
//! image parts themselves are found by the request parser, in the same pass that reads the rest of
//! the body; intake takes their URLs.
//!
//! Everything the later stages need per image is an [`ImageInfo`]; every way this can fail is a
//! [`MediaError`] whose [`label`](MediaError::label) becomes the fallback `reason`. One failed image
//! fails the whole request (the gate routes it on its text prefix), so [`Intake::process`] is
//! all-or-nothing.
//!
//! **Identity: BLAKE3 of the raw bytes.** The digest is the image's name everywhere: its hex is the
//! `uuid` the proxy writes into image parts on the exact route to vLLM (which then uses it verbatim as the
//! image's identifier in its processor, encoder and prefix caches and in its KV events), and its first
//! 16 bytes are the image key in the router's block keys, so event `extra_keys` map straight onto the
//! router's blocks. It must be cryptographic: a uuid is a cache key shared by every tenant of a worker,
//! and collisions of a fast non-cryptographic hash can be built on purpose. BLAKE3 (pure Rust, SIMD) hashes
//! a 150 KB image in tens of microseconds.
//!
//! Layout: [`image`] (what is known of one image), [`error`] (the failures and their labels),
//! [`config`] (`[media]`), [`data_url`] (bounded base64), [`probe`] (size from the headers; no pixel
//! is ever decoded), [`bmp`] (a BMP as the engines' Pillow opens and loads it, judged without
//! expanding it), [`allow`] (the guard's configured exceptions), [`guard`] (SSRF policy + checking DNS
//! resolver), [`fetch`] (bounded HTTP read with manual redirects), [`budget`] (the request-wide byte
//! budget both readers charge, and the process-wide decode budget every whole-image probe reserves
//! first), [`cache`] (URL → identity, TTL'd), [`resent`] (data URLs sent again:
//! kept text → identity, compared whole), [`intake`] (concurrency, per-request
//! limits, deadline, per-image timings). This file only re-exports: the children import each other by
//! the defining file, never through here.

mod allow;
mod bmp;
mod budget;
mod cache;
mod config;
mod data_url;
mod error;
mod fetch;
mod guard;
mod image;
mod intake;
mod mp4;
mod probe;
mod resent;
mod video;

pub use config::{MediaConfig, Orientation};
pub use data_url::decode_data_url;
pub use error::MediaError;
pub use image::{ImageInfo, Source};
pub use intake::{Intake, IntakeReport, MediaReport, ProbeTiming};
pub use probe::probe_bytes;
pub use video::{probe_video, VideoInfo, VideoSource};

/// Intake names each image by its digest; the type lives with the block keys derived from it.
pub use crate::keys::ImageDigest;
