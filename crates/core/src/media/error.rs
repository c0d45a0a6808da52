//! Every way intake can fail, each with the stable snake_case label that becomes the request's
//! fallback `reason` (and the Prometheus label): one type, so every reader and check reports alike.

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
    /// A decoder reading the headers hit its `Limits` (size or metadata memory): treated like an
    /// oversized image.
    #[error("image decode limit exceeded: {0}")]
    DecodeLimit(String),
    /// `media.fetch_timeout_ms`, `media.connect_timeout_ms` or `media.deadline_ms` ran out.
    #[error("fetch timed out after {after_ms} ms ({limit})")]
    FetchTimeout { after_ms: u64, limit: &'static str },
    /// The headers gave no usable dimensions (too short, zero sizes).
    #[error("could not probe image size: {0}")]
    ProbeFailed(String),
    /// A decoder could not read the headers `imagesize` did not follow.
    #[error("could not decode image: {0}")]
    DecodeFailed(String),
    /// Not one of JPEG, PNG, GIF, WebP, BMP.
    #[error("unsupported image format: {0}")]
    UnsupportedFormat(String),
    /// A file of a format we read that the engines' loader (Pillow) would not open or load, told from
    /// its headers (a BMP compression or layout it refuses, pixel data short of the declared size).
    #[error("the engines' image loader refuses it: {0}")]
    EngineRefuses(String),
    /// The process-wide budget of bytes that probes hold at once (`media.decode_budget_mb`) stayed
    /// full for as long as a probe may wait.
    #[error("decode budget: {needed} bytes did not fit in media.decode_budget_mb = {limit} bytes in flight within {waited_ms} ms")]
    DecodeBudget { needed: usize, limit: usize, waited_ms: u64 },
    /// One video is over `media.max_video_bytes`.
    #[error("video is {size} bytes or more, over media.max_video_bytes = {limit}")]
    VideoTooLarge { size: u64, limit: usize },
    /// A container whose frame count the router cannot read as the engine's opencv does (WebM/Matroska,
    /// AVI, fragmented MP4, several video tracks, an unknown format).
    #[error("video container: {0}")]
    VideoContainer(String),
    /// The clip's timeline is not one frame per sample at one rate (an edit list, a variable frame
    /// rate, a display matrix that turns the frames).
    #[error("video timeline: {0}")]
    VideoTimeline(String),
    /// A sample-entry codec outside the probed list.
    #[error("video codec '{0}' is not one the router sizes")]
    VideoCodec(String),
    /// Malformed or truncated container boxes, or samples the file does not hold.
    #[error("invalid video: {0}")]
    VideoInvalid(String),
    /// A `video/jpeg` frame list whose frames differ in size (the engine cannot stack them), or with no
    /// frame.
    #[error("video frame list: {0}")]
    VideoFrames(String),
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
            // The same class as a format we do not read: the engine cannot open it either.
            MediaError::UnsupportedFormat(_) | MediaError::EngineRefuses(_) => "unsupported_format",
            MediaError::DecodeBudget { .. } => "decode_budget",
            MediaError::VideoTooLarge { .. } => "too_large",
            MediaError::VideoContainer(_) => "video_container",
            MediaError::VideoTimeline(_) => "video_timeline",
            MediaError::VideoCodec(_) => "video_codec",
            MediaError::VideoInvalid(_) => "video_invalid",
            MediaError::VideoFrames(_) => "video_frames",
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
            (MediaError::EngineRefuses("x".into()), "unsupported_format"),
            (MediaError::DecodeBudget { needed: 2, limit: 1, waited_ms: 0 }, "decode_budget"),
            (MediaError::TooManyImages { count: 2, limit: 1 }, "too_many_images"),
            (MediaError::InvalidDataUrl("x".into()), "invalid_data_url"),
            (MediaError::InvalidUrl("x".into()), "invalid_url"),
            (MediaError::VideoTooLarge { size: 2, limit: 1 }, "too_large"),
            (MediaError::VideoContainer("x".into()), "video_container"),
            (MediaError::VideoTimeline("x".into()), "video_timeline"),
            (MediaError::VideoCodec("x".into()), "video_codec"),
            (MediaError::VideoInvalid("x".into()), "video_invalid"),
            (MediaError::VideoFrames("x".into()), "video_frames"),
        ];
        for (err, label) in cases {
            assert_eq!(err.label(), label, "{err}");
        }
    }
}
