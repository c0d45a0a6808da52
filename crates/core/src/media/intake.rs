//! [`Intake`]: all images of one request, concurrently, under one deadline and the per-request
//! limits; the probe-duration histogram is recorded here for every image. A probe that needs the
//! whole image reserves its worst case in the process-wide decode budget first.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::try_join_all;

use crate::keys::ImageDigest;
use crate::media::budget::{worst_case, Budget, DecodeBudget, Reservation, DECODE_WAIT};
use crate::media::cache::UrlCache;
use crate::media::config::{MediaConfig, Orientation};
use crate::media::data_url;
use crate::media::error::MediaError;
use crate::media::fetch::Fetcher;
use crate::media::guard::Guard;
use crate::media::image::{ImageInfo, Source};
use crate::media::probe::{probe_bytes, probe_header, transposes, HEADER_PROBE_BYTES};
use crate::media::resent::{Lookup, ResentImages};
use crate::media::video::{self, VideoInfo};

/// How long reading and probing one image took (the `mmrouter_image_probe_duration_seconds` sample).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeTiming {
    pub source: Source,
    pub elapsed: Duration,
}

/// What intake of one request produced: every image or the first failure, and the timing of every
/// image that finished (failed ones included; those cancelled by another's failure are not).
#[derive(Debug)]
pub struct IntakeReport {
    pub images: Result<Vec<ImageInfo>, MediaError>,
    pub probes: Vec<ProbeTiming>,
}

/// What intake of a request with videos produced: every image and video, or the first failure, and
/// the timing of every item that finished.
#[derive(Debug)]
pub struct MediaReport {
    pub media: Result<(Vec<ImageInfo>, Vec<VideoInfo>), MediaError>,
    pub probes: Vec<ProbeTiming>,
}

/// Image intake for the proxy: the HTTP client, the SSRF guard and the URL cache.
/// Cheap to clone and share (one `Arc`).
#[derive(Clone)]
pub struct Intake {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: MediaConfig,
    guard: Arc<Guard>,
    fetcher: Fetcher,
    cache: UrlCache,
    resent: ResentImages,
    /// Shared by every intake of the process (see [`DecodeBudget::global`]).
    decode_budget: Arc<DecodeBudget>,
    decode_wait: Duration,
}

impl Intake {
    /// Validates `cfg` and builds the client; the error names the config key.
    pub fn new(cfg: MediaConfig) -> Result<Intake, String> {
        Intake::with_decode_budget(cfg, DecodeBudget::global(), DECODE_WAIT)
    }

    /// [`Intake::new`] over another decode budget, with another wait for room in it.
    pub(crate) fn with_decode_budget(
        cfg: MediaConfig,
        decode_budget: Arc<DecodeBudget>,
        decode_wait: Duration,
    ) -> Result<Intake, String> {
        cfg.validate()?;
        let guard = Arc::new(Guard::new(&cfg)?);
        let fetcher = Fetcher::new(&cfg, Arc::clone(&guard))?;
        let cache = UrlCache::new(Duration::from_secs(cfg.url_cache_ttl_secs), cfg.url_cache_entries);
        let resent = ResentImages::new(cfg.data_url_memo_mb.saturating_mul(1 << 20));
        let inner = Inner { cfg, guard, fetcher, cache, resent, decode_budget, decode_wait };
        Ok(Intake { inner: Arc::new(inner) })
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

    /// The SSRF guard's verdict on every URL without fetching any (scheme, address, port, and the
    /// addresses each name resolves to): for requests the router forwards without reading all their
    /// images, whose URLs the worker would otherwise fetch unchecked. `data:` URLs pass.
    pub async fn screen(&self, urls: &[&str]) -> Result<(), MediaError> {
        for url in urls {
            match scheme(url).as_deref() {
                Some("data") => continue,
                Some("http" | "https") => {}
                _ => return Err(not_fetchable(url)),
            }
            let parsed = url::Url::parse(url).map_err(|e| MediaError::InvalidUrl(format!("{e}: {url}")))?;
            self.inner.guard.check(&parsed).await?;
        }
        Ok(())
    }

    /// Probes and hashes every image (by URL, in request order), concurrently, under
    /// `media.deadline_ms`. All or nothing: the first failure cancels the other fetches and is returned.
    pub async fn process(&self, urls: &[&str]) -> IntakeReport {
        let probes = Mutex::new(Vec::with_capacity(urls.len()));
        let images = self.process_all(urls, &probes).await;
        IntakeReport { images, probes: probes.into_inner().unwrap_or_else(|e| e.into_inner()) }
    }

    async fn process_all(&self, urls: &[&str], probes: &Mutex<Vec<ProbeTiming>>) -> Result<Vec<ImageInfo>, MediaError> {
        self.process_both(urls, &[], probes).await.map(|(images, _)| images)
    }

    /// [`Intake::process`] for a request with videos too: every image and video read and sized,
    /// concurrently, under one byte budget and one deadline; all or nothing.
    pub async fn process_media(&self, images: &[&str], videos: &[&str]) -> MediaReport {
        let probes = Mutex::new(Vec::with_capacity(images.len() + videos.len()));
        let media = self.process_both(images, videos, &probes).await;
        MediaReport { media, probes: probes.into_inner().unwrap_or_else(|e| e.into_inner()) }
    }

    async fn process_both(
        &self,
        images: &[&str],
        videos: &[&str],
        probes: &Mutex<Vec<ProbeTiming>>,
    ) -> Result<(Vec<ImageInfo>, Vec<VideoInfo>), MediaError> {
        let cfg = &self.inner.cfg;
        let count = images.len() + videos.len();
        if count > cfg.max_images {
            return Err(MediaError::TooManyImages { count, limit: cfg.max_images });
        }
        let budget = Budget::new(cfg.max_total_bytes);
        let images = try_join_all(images.iter().map(|url| self.timed(url, &budget, probes)));
        let videos = try_join_all(videos.iter().map(|url| self.timed_video(url, &budget, probes)));
        let all = futures_util::future::try_join(images, videos);
        tokio::time::timeout(Duration::from_millis(cfg.deadline_ms), all)
            .await
            .unwrap_or(Err(MediaError::FetchTimeout { after_ms: cfg.deadline_ms, limit: "media.deadline_ms" }))
    }

    async fn timed_video(
        &self,
        url: &str,
        budget: &Budget,
        probes: &Mutex<Vec<ProbeTiming>>,
    ) -> Result<VideoInfo, MediaError> {
        let started = Instant::now();
        let (source, result) = match scheme(url).as_deref() {
            Some("data") => (Source::DataUrl, self.read_video_data_url(url, budget).await),
            Some("http") | Some("https") => (Source::Http, self.fetch_video(url, budget).await),
            _ => return Err(not_fetchable(url)),
        };
        let timing = ProbeTiming { source, elapsed: started.elapsed() };
        probes.lock().unwrap_or_else(|e| e.into_inner()).push(timing);
        result
    }

    /// A video data URL: a JPEG frame list, or a file decoded whole (its sample tables may be at its
    /// end) under a reservation in the decode budget, refused over `media.max_video_bytes` before
    /// anything is allocated.
    async fn read_video_data_url(&self, url: &str, budget: &Budget) -> Result<VideoInfo, MediaError> {
        let cfg = &self.inner.cfg;
        if video::is_frame_list(url) {
            return video::read_frame_list(url, cfg, |n| budget.take(n));
        }
        let parsed = data_url::parse_as(url, "video")?;
        let len = parsed.decoded_len;
        if len > cfg.max_video_bytes {
            return Err(MediaError::VideoTooLarge { size: len as u64, limit: cfg.max_video_bytes });
        }
        budget.take(len)?;
        let held = self.reserve(len).await?;
        let bytes = data_url::decode_parsed(parsed, cfg.max_video_bytes)?;
        let info = video::probe_file(&bytes, cfg, Source::DataUrl);
        drop((bytes, held));
        info
    }

    /// A video URL: fetched whole under the guard, cut at `media.max_video_bytes`.
    async fn fetch_video(&self, url: &str, budget: &Budget) -> Result<VideoInfo, MediaError> {
        let inner = &self.inner;
        let held = self.reserve(inner.cfg.max_video_bytes).await?;
        let timeout = Duration::from_millis(inner.cfg.fetch_timeout_ms);
        let fetch = inner.fetcher.fetch_as(url, &inner.cfg, budget, true);
        let bytes = tokio::time::timeout(timeout, fetch).await.map_err(|_| MediaError::FetchTimeout {
            after_ms: inner.cfg.fetch_timeout_ms,
            limit: "media.fetch_timeout_ms",
        })??;
        let info = video::probe_file(&bytes, &inner.cfg, Source::Http);
        drop((bytes, held));
        info
    }

    async fn timed(
        &self,
        url: &str,
        budget: &Budget,
        probes: &Mutex<Vec<ProbeTiming>>,
    ) -> Result<ImageInfo, MediaError> {
        let started = Instant::now();
        let (source, result) = self.one(url, budget).await?;
        let timing = ProbeTiming { source, elapsed: started.elapsed() };
        probes.lock().unwrap_or_else(|e| e.into_inner()).push(timing);
        result
    }

    /// The image's source, and its info or failure; `Err` only for a URL that is not data/http(s).
    async fn one(&self, url: &str, budget: &Budget) -> Result<(Source, Result<ImageInfo, MediaError>), MediaError> {
        match scheme(url).as_deref() {
            Some("data") => Ok((Source::DataUrl, self.take_data_url(url, budget).await)),
            Some("http") | Some("https") => Ok((Source::Http, self.fetch_http(url, budget).await)),
            _ => Err(not_fetchable(url)),
        }
    }

    /// A data URL sent before (see `resent.rs`) is not read again; another is read and, at its
    /// second sighting, kept.
    async fn take_data_url(&self, url: &str, budget: &Budget) -> Result<ImageInfo, MediaError> {
        let resent = &self.inner.resent;
        match resent.lookup(url) {
            Lookup::Hit(info) => {
                budget.take(info.bytes)?;
                Ok(info)
            }
            Lookup::Again(key) => {
                let info = self.read_data_url(url, budget).await?;
                resent.keep(key, url, &info);
                Ok(info)
            }
            Lookup::New(key) => {
                let info = self.read_data_url(url, budget).await?;
                key.into_iter().for_each(|k| resent.note(k));
                Ok(info)
            }
        }
    }

    /// Decodes in chunks, hashing everything and keeping only the header prefix; the whole image
    /// is materialised only if the prefix cannot be probed (or for EXIF orientation).
    async fn read_data_url(&self, url: &str, budget: &Budget) -> Result<ImageInfo, MediaError> {
        let cfg = &self.inner.cfg;
        let parsed = data_url::parse(url)?;
        let len = parsed.decoded_len;
        if len > cfg.max_image_bytes {
            return Err(MediaError::ImageTooLarge { size: len as u64, limit: cfg.max_image_bytes });
        }
        budget.take(len)?;
        let mut hasher = blake3::Hasher::new();
        let mut prefix = Vec::with_capacity(len.min(HEADER_PROBE_BYTES));
        parsed.decode_chunks(|chunk| {
            hasher.update(chunk);
            let room = HEADER_PROBE_BYTES - prefix.len();
            prefix.extend_from_slice(&chunk[..chunk.len().min(room)]);
            Ok(())
        })?;
        let digest = ImageDigest(*hasher.finalize().as_bytes());
        let header = probe_header(&prefix, cfg)?;
        // EXIF sits in the file's first segments, which the prefix holds.
        let transposed = cfg.report_transposed && transposes(&prefix, cfg);
        let (width, height, format) = match header {
            Some(dims) if cfg.orientation == Orientation::Stored => dims,
            _ if prefix.len() == len => self.probe_off_thread(prefix).await?,
            _ => {
                // Reserved before the whole image exists.
                let held = self.reserve(len).await?;
                let full = data_url::decode_data_url(url, cfg.max_image_bytes)?;
                self.probe_reserved(full, held).await?
            }
        };
        Ok(ImageInfo { digest, width, height, format, bytes: len, source: Source::DataUrl, transposed })
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
        let digest = ImageDigest::of(&bytes);
        let len = bytes.len();
        let transposed = inner.cfg.report_transposed && transposes(&bytes, &inner.cfg);
        let (width, height, format) = match probe_header(&bytes, &inner.cfg)? {
            Some(dims) if inner.cfg.orientation == Orientation::Stored => dims,
            _ => self.probe_off_thread(bytes).await?,
        };
        let info = ImageInfo { digest, width, height, format, bytes: len, source: Source::Http, transposed };
        inner.cache.insert(url, info.clone());
        Ok(info)
    }

    /// Room in the decode budget for probing a whole image of `len` bytes.
    async fn reserve(&self, len: usize) -> Result<Reservation, MediaError> {
        let inner = &self.inner;
        inner.decode_budget.reserve(worst_case(len), inner.cfg.decode_budget_bytes(), inner.decode_wait).await
    }

    /// The slow path (the whole image: a BMP's pixel data checked, a header `imagesize` does not
    /// follow, EXIF parsing) under a reservation in the decode budget.
    async fn probe_off_thread(&self, bytes: Vec<u8>) -> Result<(u32, u32, &'static str), MediaError> {
        let held = self.reserve(bytes.len()).await?;
        self.probe_reserved(bytes, held).await
    }

    /// Runs on the blocking pool so a large image cannot stall the proxy's async workers; the
    /// reservation goes with the work, so it is held until the work ends even if the request is
    /// cancelled meanwhile.
    async fn probe_reserved(&self, bytes: Vec<u8>, held: Reservation) -> Result<(u32, u32, &'static str), MediaError> {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || {
            let probed = probe_bytes(&bytes, &inner.cfg);
            drop((bytes, held));
            probed
        })
        .await
        .map_err(|e| MediaError::ProbeFailed(format!("probe task failed: {e}")))?
    }
}

/// A URL's scheme, lower-cased (`None` without a `:`).
fn scheme(url: &str) -> Option<String> {
    url.split_once(':').map(|(s, _)| s.to_ascii_lowercase())
}

/// Any scheme but `data:` and `http(s):` (`file:`, `gopher:`, `ftp:`, …) is a policy refusal, like a
/// blocked address: a worker's own loader might open it. A string without a scheme is not a URL.
fn not_fetchable(url: &str) -> MediaError {
    let shown: String = url.chars().take(64).collect();
    match scheme(url) {
        Some(s) => MediaError::FetchBlocked(format!("scheme '{s}' is not data: or http(s): '{shown}'")),
        None => MediaError::InvalidUrl(format!("'{shown}' is not a data: or http(s): URL")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::bmp::tests::bmp;
    use base64::Engine;

    const MIB: usize = 1 << 20;

    /// A small config whose decode budget holds exactly one image's probe.
    fn tight() -> MediaConfig {
        let cfg = MediaConfig { max_image_bytes: MIB, max_total_bytes: 16 * MIB, ..MediaConfig::default() };
        MediaConfig { decode_budget_mb: worst_case(MIB).div_ceil(MIB), ..cfg }
    }

    fn bmp_url(side: i32) -> String {
        let row = (side as usize * 3).div_ceil(4) * 4;
        let file = bmp(side, side, 24, 0, &vec![7; row * side as usize]);
        format!("data:image/bmp;base64,{}", base64::engine::general_purpose::STANDARD.encode(file))
    }

    #[tokio::test]
    async fn a_full_decode_budget_is_a_counted_fallback() {
        let budget = Arc::new(DecodeBudget::default());
        let intake = Intake::with_decode_budget(tight(), Arc::clone(&budget), Duration::ZERO).unwrap();
        let url = bmp_url(20);
        assert_eq!(intake.process(&[&url]).await.images.unwrap()[0].width, 20);
        // Another request's probe holds the budget: this one may not wait, and falls back.
        let other = budget.reserve(worst_case(MIB), tight().decode_budget_bytes(), Duration::ZERO).await.unwrap();
        let err = intake.process(&[&url]).await.images.unwrap_err();
        assert_eq!(err.label(), "decode_budget", "{err}");
        drop(other);
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_decode_budget_is_shared_by_concurrent_requests_of_every_intake() {
        let budget = Arc::new(DecodeBudget::default());
        let wait = Duration::from_secs(60);
        let intakes: Vec<Intake> =
            (0..2).map(|_| Intake::with_decode_budget(tight(), Arc::clone(&budget), wait).unwrap()).collect();
        // Held by "another request": no intake over the same budget finds room...
        let other = budget.reserve(worst_case(MIB), tight().decode_budget_bytes(), wait).await.unwrap();
        for _ in 0..2 {
            let impatient = Intake::with_decode_budget(tight(), Arc::clone(&budget), Duration::ZERO).unwrap();
            let err = impatient.process(&[&bmp_url(9)]).await.images.unwrap_err();
            assert_eq!(err.label(), "decode_budget");
        }
        // ...and eight requests of two images each, on two intakes, wait for it, then take turns.
        let urls: Vec<String> = (10..18).map(bmp_url).collect();
        let tasks: Vec<_> = urls
            .iter()
            .enumerate()
            .map(|(i, url)| {
                let (intake, url) = (intakes[i % 2].clone(), url.clone());
                tokio::spawn(async move { intake.process(&[&url, &url]).await.images })
            })
            .collect();
        tokio::task::yield_now().await;
        assert_eq!(budget.used(), worst_case(MIB), "nothing fits beside a whole budget's reservation");
        drop(other);
        for (i, task) in tasks.into_iter().enumerate() {
            let images = task.await.unwrap().unwrap();
            assert_eq!(images[1].width, 10 + i as u32);
        }
        assert_eq!(budget.used(), 0, "every reservation is given back");
    }
}
