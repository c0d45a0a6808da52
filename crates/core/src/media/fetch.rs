//! Bounded HTTP(S) fetch of one image behind the SSRF guard.
//!
//! * Redirects are followed by hand (the client's policy is `none`) so that every hop is re-checked
//!   by the guard and counted against `max_redirects`.
//! * `Range: bytes=0-<limit>` is sent, and a 206 covering the whole file is used; a server that
//!   ignores it (200) is read as a stream and cut off one byte past the limit, so a lying or missing
//!   `Content-Length` never makes us read more than the limit.
//! * The whole body is read (up to the limit) because the identity is a hash of all of it; the
//!   header is probed while the first 64 KiB arrive, so an unsupported format or a bomb header
//!   stops the download early.

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderValue, ACCEPT, CONTENT_RANGE, LOCATION, RANGE};
use reqwest::StatusCode;
use url::Url;

use crate::media::budget::Budget;
use crate::media::config::MediaConfig;
use crate::media::error::MediaError;
use crate::media::guard::{Guard, GuardedResolver, ResolvedToBlocked};
use crate::media::probe::{probe_header, HEADER_PROBE_BYTES};

const USER_AGENT: &str = concat!("mmrouter/", env!("CARGO_PKG_VERSION"), " (image probe)");

/// A reqwest client wired to the guard, plus the per-image limits.
pub(crate) struct Fetcher {
    client: reqwest::Client,
    guard: Arc<Guard>,
    max_redirects: usize,
    max_bytes: usize,
    connect_timeout_ms: u64,
}

impl Fetcher {
    pub(crate) fn new(cfg: &MediaConfig, guard: Arc<Guard>) -> Result<Fetcher, String> {
        let client = crate::http_client_builder()
            .redirect(reqwest::redirect::Policy::none())
            // A proxy would connect on our behalf and bypass the resolver's checks.
            .no_proxy()
            .user_agent(USER_AGENT)
            .connect_timeout(Duration::from_millis(cfg.connect_timeout_ms))
            .dns_resolver(Arc::new(GuardedResolver(Arc::clone(&guard))))
            .build()
            .map_err(|e| format!("media: cannot build the HTTP client: {e}"))?;
        Ok(Fetcher {
            client,
            guard,
            max_redirects: cfg.max_redirects,
            max_bytes: cfg.max_image_bytes,
            connect_timeout_ms: cfg.connect_timeout_ms,
        })
    }

    /// Fetches `url`, following at most `max_redirects` guarded redirects; every byte read is
    /// charged to `budget`.
    pub(crate) async fn fetch(&self, url: &str, cfg: &MediaConfig, budget: &Budget) -> Result<Vec<u8>, MediaError> {
        self.fetch_as(url, cfg, budget, false).await
    }

    /// [`Fetcher::fetch`]; a video is cut at `media.max_video_bytes` instead of the image limit and
    /// no image header is looked for in it.
    pub(crate) async fn fetch_as(
        &self,
        url: &str,
        cfg: &MediaConfig,
        budget: &Budget,
        video: bool,
    ) -> Result<Vec<u8>, MediaError> {
        let max_bytes = if video { cfg.max_video_bytes } else { self.max_bytes };
        let mut url = Url::parse(url).map_err(|e| MediaError::InvalidUrl(format!("{e}: {url}")))?;
        let mut hops = 0usize;
        loop {
            self.guard.check(&url).await?;
            let response = self
                .client
                .get(url.clone())
                .header(RANGE, format!("bytes=0-{max_bytes}"))
                .header(ACCEPT, HeaderValue::from_static("image/*"))
                .send()
                .await
                .map_err(|e| self.map_reqwest(e))?;
            let status = response.status();
            if status.is_redirection() {
                if hops == self.max_redirects {
                    return Err(MediaError::FetchFailed(format!(
                        "more than media.max_redirects = {} redirects",
                        self.max_redirects
                    )));
                }
                hops += 1;
                url = redirect_target(&url, response.headers().get(LOCATION))?;
                continue;
            }
            return self.read_body(response, cfg, budget, video).await;
        }
    }

    async fn read_body(
        &self,
        mut response: reqwest::Response,
        cfg: &MediaConfig,
        budget: &Budget,
        video: bool,
    ) -> Result<Vec<u8>, MediaError> {
        let max_bytes = if video { cfg.max_video_bytes } else { self.max_bytes };
        let too_large = |size: u64| match video {
            false => MediaError::ImageTooLarge { size, limit: max_bytes },
            true => MediaError::VideoTooLarge { size, limit: max_bytes },
        };
        match response.status() {
            StatusCode::OK => {}
            StatusCode::PARTIAL_CONTENT => {
                let range = response.headers().get(CONTENT_RANGE);
                if let Some((end, total)) = content_range(range)? {
                    if total > max_bytes as u64 {
                        return Err(too_large(total));
                    }
                    if end.checked_add(1) != Some(total) {
                        return Err(MediaError::FetchFailed(format!("206 covers bytes 0-{end} of {total} only")));
                    }
                }
            }
            other => return Err(MediaError::FetchFailed(format!("HTTP {other}"))),
        }
        // The declared length is only a hint for the first allocation and an early refusal;
        // the byte count below is what bounds the read.
        let declared = response.content_length();
        if let Some(len) = declared.filter(|&l| l > max_bytes as u64) {
            return Err(too_large(len));
        }
        let initial = declared.unwrap_or(0).min(HEADER_PROBE_BYTES as u64) as usize;
        let mut body = Vec::with_capacity(initial);
        let mut header_known = video;
        while let Some(chunk) = response.chunk().await.map_err(|e| self.map_reqwest(e))? {
            let new_len = body.len().saturating_add(chunk.len());
            if new_len > max_bytes {
                return Err(too_large(new_len as u64));
            }
            budget.take(chunk.len())?;
            body.extend_from_slice(&chunk);
            if !header_known && body.len() <= HEADER_PROBE_BYTES + chunk.len() {
                header_known = probe_header(&body, cfg)?.is_some();
            }
        }
        Ok(body)
    }

    /// reqwest errors → typed reasons; the guard's resolver refusal is found in the source chain.
    fn map_reqwest(&self, e: reqwest::Error) -> MediaError {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        let mut chain = String::new();
        while let Some(err) = source {
            if let Some(blocked) = err.downcast_ref::<ResolvedToBlocked>() {
                return MediaError::FetchBlocked(blocked.to_string());
            }
            if !chain.is_empty() {
                chain.push_str(": ");
            }
            chain.push_str(&err.to_string());
            source = err.source();
        }
        if e.is_timeout() {
            return MediaError::FetchTimeout { after_ms: self.connect_timeout_ms, limit: "media.connect_timeout_ms" };
        }
        MediaError::FetchFailed(chain)
    }
}

/// For a 206: `Ok(Some((end, total)))` from `bytes 0-end/total`, `Ok(None)` when the total is
/// unknown (`/*`); a part not starting at 0 is an error.
fn content_range(value: Option<&HeaderValue>) -> Result<Option<(u64, u64)>, MediaError> {
    let bad = |why: &str| MediaError::FetchFailed(format!("206 with {why} Content-Range"));
    let text = value.and_then(|v| v.to_str().ok()).ok_or_else(|| bad("no"))?;
    let spec = text.trim().strip_prefix("bytes ").ok_or_else(|| bad("a non-byte"))?;
    let (range, total) = spec.split_once('/').ok_or_else(|| bad("a malformed"))?;
    let (start, end) = range.split_once('-').ok_or_else(|| bad("a malformed"))?;
    let start: u64 = start.trim().parse().map_err(|_| bad("a malformed"))?;
    let end: u64 = end.trim().parse().map_err(|_| bad("a malformed"))?;
    if start != 0 || end < start {
        return Err(bad("an offset"));
    }
    if total.trim() == "*" {
        return Ok(None);
    }
    let total: u64 = total.trim().parse().map_err(|_| bad("a malformed"))?;
    Ok(Some((end, total)))
}

fn redirect_target(base: &Url, location: Option<&HeaderValue>) -> Result<Url, MediaError> {
    let location = location
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| MediaError::FetchFailed("redirect without a usable Location".into()))?;
    base.join(location).map_err(|e| MediaError::FetchFailed(format!("bad redirect Location '{location}': {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(s: &str) -> Result<Option<(u64, u64)>, MediaError> {
        content_range(Some(&HeaderValue::from_str(s).unwrap()))
    }

    #[test]
    fn content_range_parsing() {
        assert_eq!(range("bytes 0-99/100").unwrap(), Some((99, 100)));
        assert_eq!(range("bytes 0-99/*").unwrap(), None);
        assert_eq!(range("bytes 0-100/5000").unwrap(), Some((100, 5000)));
        assert!(range("bytes 10-99/100").is_err());
        assert!(range("items 0-1/2").is_err());
        assert!(range("bytes x-1/2").is_err());
        assert!(content_range(None).is_err());
    }

    #[test]
    fn relative_redirects_resolve_against_the_current_url() {
        let base = Url::parse("http://a.test/x/y.png").unwrap();
        let next = redirect_target(&base, Some(&HeaderValue::from_static("../z.png"))).unwrap();
        assert_eq!(next.as_str(), "http://a.test/z.png");
        assert!(redirect_target(&base, None).is_err());
    }
}
