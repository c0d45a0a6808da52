//! Stage **intake** as the gate sees it: every image and video of the request read and probed, or the
//! fallback reason — and, under `media.reject_blocked_urls`, the refusal of any URL the SSRF guard blocks,
//! whatever else happens to the request (a request that falls back is forwarded with its URLs, which
//! the worker would fetch).

use crate::media::{ImageInfo, Intake, MediaConfig, MediaError, ProbeTiming, VideoInfo};
use crate::pipeline::error::{Fallback, LoadError, Rejection};
use crate::request::Request;

/// One media item read, in request order.
pub(super) enum Media {
    Image(ImageInfo),
    Video(VideoInfo),
}

/// The media of one request (or why the plan has none), and one timing per item read.
pub(super) type Images = (Result<Vec<Media>, Fallback>, Vec<ProbeTiming>);

/// Image intake with the pipeline's settings for it.
pub(super) struct ImageReader {
    intake: Intake,
    /// Off: never fetch; requests with images are text-prefix plans by configuration.
    exact_accounting: bool,
    reject_blocked_urls: bool,
}

/// Why intake has no images for the plan: an image failed, or reading was skipped (the label).
enum Unread {
    Media(MediaError),
    Skipped(Fallback),
}

impl Unread {
    fn label(&self) -> Fallback {
        match self {
            Unread::Media(e) => e.label(),
            Unread::Skipped(reason) => reason,
        }
    }
}

impl ImageReader {
    pub(super) fn new(media: &MediaConfig, exact_accounting: bool) -> Result<ImageReader, LoadError> {
        Ok(ImageReader {
            intake: Intake::new(media.clone()).map_err(LoadError::Media)?,
            exact_accounting,
            reject_blocked_urls: media.reject_blocked_urls,
        })
    }

    /// Every image and video read and probed, or the fallback reason (`skip`: the videos cannot be
    /// counted, so nothing is read); a blocked URL is a [`Rejection`] when `reject_blocked_urls` is set.
    pub(super) async fn read(&self, req: &Request<'_>, skip: Option<Fallback>) -> Result<Images, Rejection> {
        let urls: Vec<&str> = req.images.iter().map(|i| i.url.as_ref()).collect();
        let (read, probes) = match skip {
            Some(reason) if req.media_issue.is_none() && self.exact_accounting => {
                (Err(Unread::Skipped(reason)), Vec::new())
            }
            _ => self.read_images(req, &urls).await,
        };
        match read {
            Ok(infos) => Ok((Ok(infos), probes)),
            Err(Unread::Media(e)) if e.is_blocked() && self.reject_blocked_urls => Err(Rejection::BlockedImageUrl(e)),
            Err(unread) => {
                if self.reject_blocked_urls {
                    // Not every URL was checked by a fetch: screen them all before forwarding.
                    match self.intake.screen(&urls).await {
                        Err(e) if e.is_blocked() => return Err(Rejection::BlockedImageUrl(e)),
                        _ => {}
                    }
                }
                Ok((Err(unread.label()), probes))
            }
        }
    }

    /// Reads every image and video (each fetch under the SSRF guard), or says why not.
    async fn read_images(&self, req: &Request<'_>, urls: &[&str]) -> (Result<Vec<Media>, Unread>, Vec<ProbeTiming>) {
        if let Some(issue) = &req.media_issue {
            return (Err(Unread::Skipped(issue.label())), Vec::new());
        }
        if urls.is_empty() {
            return (Ok(Vec::new()), Vec::new());
        }
        if !self.exact_accounting {
            // Exact accounting off: never fetch; the request is a text-prefix plan by configuration.
            return (Err(Unread::Skipped("exact_disabled")), Vec::new());
        }
        if !req.has_videos() {
            let report = self.intake.process(urls).await;
            return (
                report.images.map(|v| v.into_iter().map(Media::Image).collect()).map_err(Unread::Media),
                report.probes,
            );
        }
        let (mut images, mut videos) = (Vec::new(), Vec::new());
        for (part, url) in req.images.iter().zip(urls) {
            match part.is_video() {
                true => videos.push(*url),
                false => images.push(*url),
            }
        }
        let report = self.intake.process_media(&images, &videos).await;
        let media = report.media.map(|(images, videos)| {
            let (mut images, mut videos) = (images.into_iter(), videos.into_iter());
            // Back in request order; intake returns each kind in the order asked.
            let media = req.images.iter().map(|part| match part.is_video() {
                true => videos.next().map(Media::Video),
                false => images.next().map(Media::Image),
            });
            media.collect::<Option<Vec<Media>>>()
        });
        match media {
            Ok(Some(media)) => (Ok(media), report.probes),
            Ok(None) => (Err(Unread::Skipped("placeholder_mismatch")), report.probes),
            Err(e) => (Err(Unread::Media(e)), report.probes),
        }
    }
}
