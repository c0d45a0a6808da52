//! What intake knows about one image once it is read: its identity, its size as the model sees it, its
//! format and where its bytes came from. Every later stage reads images through [`ImageInfo`] only.

use crate::keys::ImageDigest;

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
    /// Its EXIF orientation swaps width and height (only looked at when `report_transposed` is set).
    pub transposed: bool,
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
