//! Stage **account**: every image and video of the request turned into its token count and its
//! expansion in the prompt (a token run, or text for image families whose expansion merges with its
//! neighbours), with its identity for the block keys and its plan entry — or the first failure's label.

use std::sync::Arc;

use crate::accounting::video::{VideoCounter, VideoFrames, VideoTokens};
use crate::accounting::{AccountingError, ImageTokens, RequestContext, RunPart, TextExpansion};
use crate::keys::{image_key, ImageDigest};
use crate::media::{ImageInfo, VideoInfo, VideoSource};
use crate::pipeline::counter::ImageCounter;
use crate::pipeline::error::Fallback;
use crate::pipeline::output::{PlannedImage, PlannedVideo, UuidSplice};
use crate::pipeline::read::Media;
use crate::plan::{ChatTokens, PlanError};
use crate::request::{ImagePart, MediaKind, Request};

/// What accounting needs from the pipeline, borrowed for one request.
pub(super) struct Accounting<'p> {
    /// `Err` when the model has no accounting profile: its label is the fallback reason.
    pub counter: &'p Result<Arc<dyn ImageCounter>, AccountingError>,
    pub max_model_len: Option<u32>,
    pub trust_client_uuids: bool,
    /// The request's video counter (the pool's, under a trusted request's kwargs); `None` without videos.
    pub video: Option<&'p VideoCounter>,
}

impl Accounting<'_> {
    /// All images and videos of the request in request order, or the first failure's label.
    pub(super) fn account(
        &self,
        req: &Request<'_>,
        tokens: &Result<Arc<ChatTokens>, PlanError>,
        media: Vec<Media>,
    ) -> Result<Vec<Accounted>, Fallback> {
        let (mut infos, mut videos) = (Vec::new(), Vec::new());
        for m in media {
            match m {
                Media::Image(i) => infos.push(i),
                Media::Video(v) => videos.push(v),
            }
        }
        let images = self.account_images(req, tokens, infos)?;
        let videos = match videos.is_empty() {
            true => Vec::new(),
            false => self.account_videos(req, videos)?,
        };
        // Back in request order: each kind's items are in request order.
        let (mut images, mut videos) = (images.into_iter(), videos.into_iter());
        req.images
            .iter()
            .map(|part| match part.kind {
                MediaKind::Image => images.next(),
                MediaKind::Video => videos.next(),
            })
            .collect::<Option<Vec<Accounted>>>()
            .ok_or("placeholder_mismatch")
    }

    /// Every video counted by the request's video counter.
    fn account_videos(&self, req: &Request<'_>, videos: Vec<VideoInfo>) -> Result<Vec<Accounted>, Fallback> {
        let counter = self.video.ok_or("video_unsupported")?;
        let parts = req.images.iter().filter(|p| p.is_video());
        let trust = self.trust_client_uuids;
        videos
            .into_iter()
            .zip(parts)
            .map(|(info, part)| {
                let frames = match info.frames {
                    VideoSource::Container { frames, fps, .. } => VideoFrames::Container { frames, fps },
                    VideoSource::FrameList { frames } => VideoFrames::FrameList { frames },
                };
                let tokens = counter.count(info.width, info.height, frames).map_err(|e| e.label())?;
                Accounted::video(&info, tokens, part, trust)
            })
            .collect()
    }

    /// Every image of the request (in order), or the first failure's label.
    fn account_images(
        &self,
        req: &Request<'_>,
        tokens: &Result<Arc<ChatTokens>, PlanError>,
        infos: Vec<ImageInfo>,
    ) -> Result<Vec<Accounted>, Fallback> {
        if infos.is_empty() {
            return Ok(Vec::new());
        }
        let counter = self.counter.as_ref().map_err(|e| e.label())?;
        // Placeholders beyond the images' are text the user typed (they stay one token each).
        let text_tokens =
            tokens.as_ref().ok().map(|t| (t.ids.len() - t.placeholders.len().min(infos.len())).min(u32::MAX as usize));
        let ctx = RequestContext { max_model_len: self.max_model_len, text_tokens: text_tokens.map(|n| n as u32) };
        let request_kwargs = req.field("mm_processor_kwargs").and_then(|v| v.as_object());
        let sizes: Vec<(u32, u32)> = infos.iter().map(|i| (i.width, i.height)).collect();
        let counts = counter.count_request(&sizes, &ctx, request_kwargs).map_err(|e| e.label())?;
        if counts.len() != infos.len() {
            return Err("placeholder_mismatch");
        }
        check_transposed(counter.as_ref(), &infos, &counts, &ctx)?;
        let trust = self.trust_client_uuids;
        infos
            .into_iter()
            .zip(counts)
            .zip(req.images.iter().filter(|p| !p.is_video()))
            .map(|((info, tokens), part)| Accounted::new(info, tokens, part, trust))
            .collect()
    }
}

/// An image flagged as transposed (Mistral tokenizer mode only) must give the same run at either
/// orientation: mistral_common sizes it as stored, vLLM's own processor as EXIF shows it.
fn check_transposed(
    counter: &dyn ImageCounter,
    infos: &[ImageInfo],
    counts: &[ImageTokens],
    ctx: &RequestContext,
) -> Result<(), Fallback> {
    for (info, count) in infos.iter().zip(counts).filter(|(i, _)| i.transposed) {
        let turned = counter.count_request(&[(info.height, info.width)], ctx, None).map_err(|e| e.label())?;
        if turned.first() != Some(count) {
            return Err(AccountingError::ExifTransposed { width: info.width, height: info.height }.label());
        }
    }
    Ok(())
}

/// How an accounted image enters the prompt.
pub(super) enum Expansion {
    /// A token run replacing the placeholder token.
    Tokens(Vec<RunPart>),
    /// Text replacing the placeholder before tokenization.
    Text(TextExpansion),
}

/// One image or video that passed accounting: its identity, its expansion, and its plan entry.
pub(super) struct Accounted {
    pub kind: MediaKind,
    pub hash: u128,
    pub expansion: Expansion,
    pub planned: PlannedImage,
}

/// A media item's identity: its content digest, written as its `uuid` — or, when trusted, the
/// client's own uuid, left as sent.
fn identity(digest: &ImageDigest, part: &ImagePart<'_>, trust: bool) -> (String, u128, Option<UuidSplice>) {
    match (&part.uuid, trust) {
        (Some(client), true) => (client.clone(), image_key(client), None),
        _ => {
            let splice = UuidSplice { image_url: part.image_url_span.clone(), existing: part.uuid_span.clone() };
            (digest.hex(), digest.key(), Some(splice))
        }
    }
}

/// Tokens a placeholder run expands to (`overflow`: no engine takes that many).
fn run_len(run: &[RunPart]) -> Result<u32, Fallback> {
    run.iter().map(|p| p.repeat).try_fold(0u32, |a, r| a.checked_add(r)).ok_or("overflow")
}

impl Accounted {
    /// A video: its run (Qwen3-VL's timestamps included) replaces its `<|video_pad|>` placeholder, and
    /// its feature tokens are what the encoder computes, like an image's.
    fn video(info: &VideoInfo, tokens: VideoTokens, part: &ImagePart<'_>, trust: bool) -> Result<Accounted, Fallback> {
        let run = tokens.run();
        let len = run_len(&run)?;
        let (hash, key, splice) = identity(&info.digest, part, trust);
        let planned = PlannedImage {
            hash,
            splice,
            width: info.width,
            height: info.height,
            feature_tokens: tokens.feature_tokens(),
            tokens: len,
            video: Some(PlannedVideo {
                format: info.format(),
                frames: tokens.frames,
                groups: tokens.groups,
                tokens_per_group: tokens.tokens_per_group,
                resized: tokens.resized,
                timestamps: tokens.timestamps,
            }),
        };
        Ok(Accounted { kind: MediaKind::Video, hash: key, expansion: Expansion::Tokens(run), planned })
    }

    /// The image's identity is its content digest, written as its `uuid` — or, when trusted, the
    /// client's own uuid, left as sent.
    fn new(info: ImageInfo, tokens: ImageTokens, part: &ImagePart<'_>, trust: bool) -> Result<Accounted, Fallback> {
        let (expansion, len) = match (tokens.run(), tokens.text_expansion()) {
            (Some(run), _) => {
                let len = run_len(&run)?;
                (Expansion::Tokens(run), len)
            }
            // The image's own tokens; the merged newlines around them belong to the text.
            (None, Some(text)) => (Expansion::Text(text.clone()), text.embed_count),
            (None, None) => return Err("expansion_unknown"),
        };
        let (hash, key, splice) = identity(&info.digest, part, trust);
        let planned = PlannedImage {
            hash,
            splice,
            width: info.width,
            height: info.height,
            feature_tokens: tokens.feature_tokens,
            tokens: len,
            video: None,
        };
        Ok(Accounted { kind: MediaKind::Image, hash: key, expansion, planned })
    }
}
