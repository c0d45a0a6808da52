//! [`Intake`]: all images of one request, concurrently, under one deadline and the per-request
//! limits; the probe-duration histogram is recorded here for every image.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::try_join_all;
use xxhash_rust::xxh3::{xxh3_128, Xxh3};

use crate::media::cache::UrlCache;
use crate::media::data_url;
use crate::media::fetch::Fetcher;
use crate::media::guard::Guard;
use crate::media::probe::{probe_bytes, probe_header, HEADER_PROBE_BYTES};
use crate::media::{ImageInfo, ImageRef, MediaConfig, MediaError, Orientation, Source};

/// The request-wide byte budget (`media.max_total_bytes`), shared by the concurrent images.
pub(crate) struct Budget {
    used: AtomicUsize,
    limit: usize,
}

impl Budget {
    fn new(limit: usize) -> Budget {
        Budget { used: AtomicUsize::new(0), limit }
    }

    /// Charges `n` bytes; fails once the request as a whole is over the limit.
    pub(crate) fn take(&self, n: usize) -> Result<(), MediaError> {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(n).filter(|&total| total <= self.limit)
            })
            .map(|_| ())
            .map_err(|_| MediaError::TotalTooLarge { limit: self.limit })
    }
}

/// Image intake for the proxy: the HTTP client, the SSRF guard and the URL cache.
/// Cheap to clone and share (one `Arc`).
#[derive(Clone)]
pub struct Intake {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: MediaConfig,
    fetcher: Fetcher,
    cache: UrlCache,
}

impl Intake {
    /// Validates `cfg` and builds the client; the error names the config key.
    pub fn new(cfg: MediaConfig) -> Result<Intake, String> {
        cfg.validate()?;
        let guard = Arc::new(Guard::new(&cfg)?);
        let fetcher = Fetcher::new(&cfg, guard)?;
        let cache = UrlCache::new(Duration::from_secs(cfg.url_cache_ttl_secs), cfg.url_cache_entries);
        Ok(Intake { inner: Arc::new(Inner { cfg, fetcher, cache }) })
    }

    /// The configuration in force.
    pub fn config(&self) -> &MediaConfig {
        &self.inner.cfg
    }

    /// `media.reject_blocked_urls`: answer 400 for a [`MediaError::FetchBlocked`] instead of
    /// falling back.
    pub fn reject_blocked_urls(&self) -> bool {
        self.inner.cfg.reject_blocked_urls
    }

    /// Probes and hashes every image, concurrently, under `media.deadline_ms`. All or nothing:
    /// the first failure cancels the other fetches and is returned.
    pub async fn process(&self, images: &[ImageRef<'_>]) -> Result<Vec<ImageInfo>, MediaError> {
        let cfg = &self.inner.cfg;
        if images.len() > cfg.max_images {
            return Err(MediaError::TooManyImages { count: images.len(), limit: cfg.max_images });
        }
        let budget = Budget::new(cfg.max_total_bytes);
        let all = try_join_all(images.iter().map(|image| self.one(&image.url, &budget)));
        tokio::time::timeout(Duration::from_millis(cfg.deadline_ms), all)
            .await
            .unwrap_or(Err(MediaError::FetchTimeout { after_ms: cfg.deadline_ms, limit: "media.deadline_ms" }))
    }

    async fn one(&self, url: &str, budget: &Budget) -> Result<ImageInfo, MediaError> {
        let started = Instant::now();
        let scheme = url.split_once(':').map(|(s, _)| s.to_ascii_lowercase());
        let (source, result) = match scheme.as_deref() {
            Some("data") => (Source::DataUrl, self.take_data_url(url, budget).await),
            Some("http") | Some("https") => (Source::Http, self.fetch_http(url, budget).await),
            _ => {
                let shown: String = url.chars().take(64).collect();
                return Err(MediaError::InvalidUrl(format!("'{shown}' is not a data: or http(s): URL")));
            }
        };
        metrics::histogram!(crate::metrics::IMAGE_PROBE_DURATION_SECONDS, "source" => source.label())
            .record(started.elapsed().as_secs_f64());
        result
    }

    /// Decodes in chunks, hashing everything and keeping only the header prefix; the whole image
    /// is materialised only if the prefix cannot be probed (or for EXIF orientation).
    async fn take_data_url(&self, url: &str, budget: &Budget) -> Result<ImageInfo, MediaError> {
        let cfg = &self.inner.cfg;
        let parsed = data_url::parse(url)?;
        let len = parsed.decoded_len;
        if len > cfg.max_image_bytes {
            return Err(MediaError::ImageTooLarge { size: len as u64, limit: cfg.max_image_bytes });
        }
        budget.take(len)?;
        let mut hasher = Xxh3::new();
        let mut prefix = Vec::with_capacity(len.min(HEADER_PROBE_BYTES));
        parsed.decode_chunks(|chunk| {
            hasher.update(chunk);
            let room = HEADER_PROBE_BYTES - prefix.len();
            prefix.extend_from_slice(&chunk[..chunk.len().min(room)]);
            Ok(())
        })?;
        let hash = hasher.digest128();
        let header = probe_header(&prefix, cfg)?;
        let (width, height, format) = match header {
            Some(dims) if cfg.orientation == Orientation::Stored => dims,
            _ if prefix.len() == len => self.probe_off_thread(prefix).await?,
            _ => {
                let full = data_url::decode_data_url(url, cfg.max_image_bytes)?;
                self.probe_off_thread(full).await?
            }
        };
        Ok(ImageInfo { hash, width, height, format, bytes: len, source: Source::DataUrl })
    }

    async fn fetch_http(&self, url: &str, budget: &Budget) -> Result<ImageInfo, MediaError> {
        let inner = &self.inner;
        if let Some(hit) = inner.cache.get(url) {
            return Ok(hit);
        }
        let timeout = Duration::from_millis(inner.cfg.fetch_timeout_ms);
        let bytes =
            tokio::time::timeout(timeout, inner.fetcher.fetch(url, &inner.cfg, budget)).await.map_err(|_| {
                MediaError::FetchTimeout { after_ms: inner.cfg.fetch_timeout_ms, limit: "media.fetch_timeout_ms" }
            })??;
        let hash = xxh3_128(&bytes);
        let len = bytes.len();
        let (width, height, format) = match probe_header(&bytes, &inner.cfg)? {
            Some(dims) if inner.cfg.orientation == Orientation::Stored => dims,
            _ => self.probe_off_thread(bytes).await?,
        };
        let info = ImageInfo { hash, width, height, format, bytes: len, source: Source::Http };
        inner.cache.insert(url, info.clone());
        Ok(info)
    }

    /// The slow path (a limited decode, or EXIF parsing) runs on the blocking pool so a large
    /// image cannot stall the proxy's async workers.
    async fn probe_off_thread(&self, bytes: Vec<u8>) -> Result<(u32, u32, &'static str), MediaError> {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || probe_bytes(&bytes, &inner.cfg))
            .await
            .map_err(|e| MediaError::ProbeFailed(format!("probe task failed: {e}")))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_is_shared_and_overflow_safe() {
        let b = Budget::new(10);
        b.take(6).unwrap();
        assert_eq!(b.take(5).unwrap_err().label(), "too_large");
        let b = Budget::new(10);
        b.take(1).unwrap();
        assert!(b.take(usize::MAX).is_err());
        b.take(9).unwrap(); // a refused charge is not kept
    }
}
