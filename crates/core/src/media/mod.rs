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
//! Layout: [`data_url`] (bounded base64), [`probe`] (header size, limited decode fallback), [`guard`]
//! (SSRF policy + checking DNS resolver), [`fetch`] (bounded HTTP read with manual redirects),
//! [`budget`] (the request-wide byte budget both readers charge), [`cache`] (URL → identity, TTL'd),
//! [`intake`] (concurrency, per-request limits, deadline, per-image timings).

mod budget;
mod cache;
mod config;
mod data_url;
mod fetch;
mod guard;
mod intake;
mod probe;

pub use config::{MediaConfig, Orientation};
pub use data_url::decode_data_url;
pub use intake::{Intake, IntakeReport, ProbeTiming};
pub use probe::probe_bytes;

/// An image's identity: BLAKE3 of its raw (encoded) bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImageDigest(pub [u8; 32]);

impl ImageDigest {
    pub fn of(bytes: &[u8]) -> ImageDigest {
        ImageDigest(*blake3::hash(bytes).as_bytes())
    }

    /// The key block hashing uses: the digest's first 16 bytes, big-endian.
    pub fn key(&self) -> u128 {
        let mut head = [0u8; 16];
        head.copy_from_slice(&self.0[..16]);
        u128::from_be_bytes(head)
    }

    /// 64 lowercase hex digits: the `uuid` vLLM is given, and its KV events' identifier.
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl std::fmt::Debug for ImageDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ImageDigest({})", self.hex())
    }
}

/// The block-hash key of an image named `identifier` in a worker's KV events: the router's own
/// digests (64 hex digits) map back to their [`ImageDigest::key`]; any other name (a trusted client
/// uuid, an engine's own hash) is keyed by a hash of the name, as the router keys it when it routes.
pub fn image_key(identifier: &str) -> u128 {
    let hex = identifier.as_bytes();
    if hex.len() == 64 && hex.iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b)) {
        if let Ok(key) = u128::from_str_radix(&identifier[..32], 16) {
            return key;
        }
    }
    xxhash_rust::xxh3::xxh3_128(identifier.as_bytes())
}

/// What the later stages need to know about one image.
#[derive(Clone, Debug)]
pub struct ImageInfo {
    /// BLAKE3 of the raw (encoded) image bytes.
    pub digest: ImageDigest,
    /// Width as the model sees it (stored size unless `orientation = "exif"`).
    pub width: u32,
    /// Height as the model sees it.
    pub height: u32,
    /// `jpeg`, `png`, `gif`, `webp` or `bmp`.
    pub format: &'static str,
    /// Length of the raw image bytes.
    pub bytes: usize,
    /// Where the bytes came from.
    pub source: Source,
}

/// Where an image's bytes came from (the `source` label of the probe-duration histogram).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    DataUrl,
    Http,
}

impl Source {
    /// The metric label value.
    pub fn label(self) -> &'static str {
        match self {
            Source::DataUrl => "data_url",
            Source::Http => "http",
        }
    }
}

/// Every way intake can fail. [`label`](MediaError::label) is the stable fallback reason.
#[derive(Debug, thiserror::Error)]
pub enum MediaError {
    /// More image parts than `media.max_images`.
    #[error("request has {count} images, more than media.max_images = {limit}")]
    TooManyImages { count: usize, limit: usize },
    /// One image is over `media.max_image_bytes`.
    #[error("image is {size} bytes or more, over media.max_image_bytes = {limit}")]
    ImageTooLarge { size: u64, limit: usize },
    /// The images of one request together are over `media.max_total_bytes`.
    #[error("images of the request exceed media.max_total_bytes = {limit}")]
    TotalTooLarge { limit: usize },
    /// The header claims more pixels than `media.max_pixels` (decompression-bomb guard).
    #[error("image header claims {width}x{height}, over media.max_pixels = {limit}")]
    TooManyPixels { width: u64, height: u64, limit: u64 },
    /// Not `data:`, `http:` or `https:`, or not a parseable URL.
    #[error("invalid image URL: {0}")]
    InvalidUrl(String),
    /// A `data:` URL that is not `data:image/…;base64,…` with valid base64.
    #[error("invalid data URL: {0}")]
    InvalidDataUrl(String),
    /// The SSRF guard refused the URL, a redirect target or every resolved address.
    #[error("fetch blocked: {0}")]
    FetchBlocked(String),
    /// Network or HTTP failure.
    #[error("fetch failed: {0}")]
    FetchFailed(String),
    /// The fallback decoder hit its `Limits` (size or memory): treated like an oversized image.
    #[error("image decode limit exceeded: {0}")]
    DecodeLimit(String),
    /// `media.fetch_timeout_ms`, `media.connect_timeout_ms` or `media.deadline_ms` ran out.
    #[error("fetch timed out after {after_ms} ms ({limit})")]
    FetchTimeout { after_ms: u64, limit: &'static str },
    /// Neither the header nor a full decode gave usable dimensions.
    #[error("could not probe image size: {0}")]
    ProbeFailed(String),
    /// The header-less fallback decode failed.
    #[error("could not decode image: {0}")]
    DecodeFailed(String),
    /// Not one of JPEG, PNG, GIF, WebP, BMP.
    #[error("unsupported image format: {0}")]
    UnsupportedFormat(String),
}

impl MediaError {
    /// Stable snake_case label (the Prometheus `reason` value).
    pub fn label(&self) -> &'static str {
        match self {
            MediaError::TooManyImages { .. } => "too_many_images",
            MediaError::ImageTooLarge { .. }
            | MediaError::TotalTooLarge { .. }
            | MediaError::TooManyPixels { .. }
            | MediaError::DecodeLimit(_) => "too_large",
            MediaError::InvalidUrl(_) => "invalid_url",
            MediaError::InvalidDataUrl(_) => "invalid_data_url",
            MediaError::FetchBlocked(_) => "fetch_blocked",
            MediaError::FetchFailed(_) => "fetch_failed",
            MediaError::FetchTimeout { .. } => "fetch_timeout",
            MediaError::ProbeFailed(_) => "probe_failed",
            MediaError::DecodeFailed(_) => "decode_failed",
            MediaError::UnsupportedFormat(_) => "unsupported_format",
        }
    }

    /// True for policy refusals (the proxy answers 400 when `media.reject_blocked_urls` is set).
    pub fn is_blocked(&self) -> bool {
        matches!(self, MediaError::FetchBlocked(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_keys_and_identifiers_agree() {
        let d = ImageDigest::of(b"an image");
        assert_eq!(d.hex().len(), 64);
        assert_eq!(image_key(&d.hex()), d.key(), "the router's uuid maps back to its key");
        assert_ne!(image_key("client-chosen-id"), d.key());
        assert_eq!(image_key("client-chosen-id"), image_key("client-chosen-id"));
        // Upper-case hex is not ours (we write lower case): keyed as a name.
        assert_ne!(image_key(&d.hex().to_uppercase()), d.key());
    }

    #[test]
    fn labels_are_the_design_contract() {
        let cases: Vec<(MediaError, &str)> = vec![
            (MediaError::FetchBlocked("x".into()), "fetch_blocked"),
            (MediaError::FetchFailed("x".into()), "fetch_failed"),
            (MediaError::FetchTimeout { after_ms: 1, limit: "media.fetch_timeout_ms" }, "fetch_timeout"),
            (MediaError::ImageTooLarge { size: 2, limit: 1 }, "too_large"),
            (MediaError::TotalTooLarge { limit: 1 }, "too_large"),
            (MediaError::TooManyPixels { width: 1, height: 1, limit: 0 }, "too_large"),
            (MediaError::DecodeLimit("x".into()), "too_large"),
            (MediaError::ProbeFailed("x".into()), "probe_failed"),
            (MediaError::DecodeFailed("x".into()), "decode_failed"),
            (MediaError::UnsupportedFormat("x".into()), "unsupported_format"),
            (MediaError::TooManyImages { count: 2, limit: 1 }, "too_many_images"),
            (MediaError::InvalidDataUrl("x".into()), "invalid_data_url"),
            (MediaError::InvalidUrl("x".into()), "invalid_url"),
        ];
        for (err, label) in cases {
            assert_eq!(err.label(), label, "{err}");
        }
    }
}
