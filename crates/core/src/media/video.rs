//! What intake knows about one video once it is read — its identity, and what the engine's loader sees
//! (frame count, source frame rate, frame size) — and how that is read from the bytes without
//! decoding a frame: an MP4/MOV from its sample tables (`mp4.rs`), a vLLM `data:video/jpeg;base64,
//! <f1>,<f2>,…` frame list from each frame's image header.
//!
//! vLLM loads every video but a `video/jpeg` list with opencv whatever its media type says, so the
//! container is told by its bytes, not by the URL.

use crate::keys::ImageDigest;
use crate::media::config::MediaConfig;
use crate::media::data_url;
use crate::media::error::MediaError;
use crate::media::image::Source;
use crate::media::mp4;
use crate::media::probe::probe_bytes;

/// Frames a `video/jpeg` list may hold before the router stops reading it (vLLM keeps the first
/// `num_frames`, 32 by default; 768 is the most any Qwen sampler takes).
pub(crate) const MAX_LISTED_FRAMES: usize = 768;

/// How the engine receives the video's frames.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum VideoSource {
    /// A container opencv opens: its frame count and frame rate, which the model's sampler reads.
    Container { container: &'static str, frames: u64, fps: f64 },
    /// vLLM's JPEG frame list: the frames as listed (the rate is the engine's `media_io_kwargs` `fps`).
    FrameList { frames: u64 },
}

/// What the later stages need to know about one video.
#[derive(Clone, Debug)]
pub struct VideoInfo {
    /// BLAKE3 of the raw bytes (a frame list: of its base64 text).
    pub digest: ImageDigest,
    pub width: u32,
    pub height: u32,
    pub frames: VideoSource,
    /// Length of the raw bytes.
    pub bytes: usize,
    pub source: Source,
}

impl VideoInfo {
    /// The container's name (`mp4`, `mov`) or `jpeg_list`.
    pub fn format(&self) -> &'static str {
        match self.frames {
            VideoSource::Container { container, .. } => container,
            VideoSource::FrameList { .. } => "jpeg_list",
        }
    }
}

/// A video file's size, frames and rate as the engine's opencv loader reads them (a local file, e.g.
/// for `mmrouter count`), refused over `media.max_video_bytes`.
pub fn probe_video(bytes: &[u8], cfg: &MediaConfig) -> Result<VideoInfo, MediaError> {
    if bytes.len() > cfg.max_video_bytes {
        return Err(MediaError::VideoTooLarge { size: bytes.len() as u64, limit: cfg.max_video_bytes });
    }
    probe_file(bytes, cfg, Source::DataUrl)
}

/// Sizes a whole video file as the engine's opencv loader would open it.
pub(crate) fn probe_file(bytes: &[u8], cfg: &MediaConfig, source: Source) -> Result<VideoInfo, MediaError> {
    let (container, probed) = match container_of(bytes) {
        Container::IsoBmff(name) => (name, mp4::probe(bytes)?),
        Container::Other(what) => {
            return Err(MediaError::VideoContainer(format!(
                "{what}: the router cannot read the frame count opencv derives for it"
            )))
        }
    };
    check_pixels(probed.width, probed.height, cfg)?;
    Ok(VideoInfo {
        digest: ImageDigest::of(bytes),
        width: probed.width,
        height: probed.height,
        frames: VideoSource::Container { container, frames: probed.frames, fps: probed.fps },
        bytes: bytes.len(),
        source,
    })
}

enum Container {
    IsoBmff(&'static str),
    Other(&'static str),
}

fn container_of(bytes: &[u8]) -> Container {
    if mp4::is_iso_bmff(bytes) {
        // QuickTime's brand, else an ISO file; opencv reads both through FFmpeg's one demuxer.
        let mov = bytes.get(4..12) == Some(b"ftypqt  ") || bytes.get(4..8) != Some(b"ftyp");
        return Container::IsoBmff(if mov { "mov" } else { "mp4" });
    }
    match bytes {
        // Matroska has no frame count: FFmpeg derives one from the duration and a guessed rate.
        [0x1a, 0x45, 0xdf, 0xa3, ..] => Container::Other("WebM/Matroska"),
        [b'R', b'I', b'F', b'F', _, _, _, _, b'A', b'V', b'I', b' ', ..] => Container::Other("AVI"),
        _ => Container::Other("an unknown container"),
    }
}

fn check_pixels(width: u32, height: u32, cfg: &MediaConfig) -> Result<(), MediaError> {
    if u64::from(width) * u64::from(height) > cfg.max_pixels {
        return Err(MediaError::TooManyPixels { width: width.into(), height: height.into(), limit: cfg.max_pixels });
    }
    Ok(())
}

/// True for vLLM's JPEG frame list (`data:video/jpeg;base64,<f1>,<f2>,…`).
pub(crate) fn is_frame_list(url: &str) -> bool {
    data_url::media_type(url).as_deref() == Some("video/jpeg")
}

/// Reads a `video/jpeg` frame list: each frame's header probed, every frame of one size (the engine
/// stacks them), the bytes charged to `take` as they are decoded. The identity is the list's text.
pub(crate) fn read_frame_list(
    url: &str,
    cfg: &MediaConfig,
    mut take: impl FnMut(usize) -> Result<(), MediaError>,
) -> Result<VideoInfo, MediaError> {
    let payload = url.split_once(',').map(|(_, p)| p).ok_or_else(|| MediaError::InvalidDataUrl("no payload".into()))?;
    if payload.len() > cfg.max_video_bytes.saturating_mul(4).div_ceil(3) {
        return Err(MediaError::VideoTooLarge { size: payload.len() as u64, limit: cfg.max_video_bytes });
    }
    let mut size = None;
    let mut frames = 0u64;
    for part in payload.split(',') {
        frames += 1;
        if frames as usize > MAX_LISTED_FRAMES {
            return Err(MediaError::VideoFrames(format!("more than {MAX_LISTED_FRAMES} frames")));
        }
        let frame = data_url::decode_data_url(&format!("data:image/jpeg;base64,{part}"), cfg.max_image_bytes)?;
        take(frame.len())?;
        let (w, h, _) = probe_bytes(&frame, cfg)?;
        match size {
            None => size = Some((w, h)),
            Some(s) if s == (w, h) => {}
            Some((w0, h0)) => {
                return Err(MediaError::VideoFrames(format!("frame {frames} is {w}x{h}, the first {w0}x{h0}")))
            }
        }
    }
    let (width, height) = size.ok_or_else(|| MediaError::VideoFrames("no frame".into()))?;
    Ok(VideoInfo {
        digest: ImageDigest::of(payload.as_bytes()),
        width,
        height,
        frames: VideoSource::FrameList { frames },
        bytes: payload.len(),
        source: Source::DataUrl,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::mp4::tests::Clip;

    #[test]
    fn containers_are_told_by_their_bytes() {
        let cfg = MediaConfig::default();
        let info = probe_file(&Clip::default().bytes(), &cfg, Source::DataUrl).unwrap();
        assert_eq!((info.width, info.height, info.format()), (64, 48, "mp4"));
        assert_eq!(info.frames, VideoSource::Container { container: "mp4", frames: 20, fps: 10.0 });
        let webm = [0x1a, 0x45, 0xdf, 0xa3, 0, 0, 0, 0];
        assert_eq!(probe_file(&webm, &cfg, Source::DataUrl).unwrap_err().label(), "video_container");
        let avi = b"RIFF\0\0\0\0AVI LIST";
        assert_eq!(probe_file(avi, &cfg, Source::DataUrl).unwrap_err().label(), "video_container");
        assert_eq!(probe_file(b"hello world!", &cfg, Source::DataUrl).unwrap_err().label(), "video_container");
    }

    #[test]
    fn a_frame_list_needs_frames_of_one_size() {
        use base64::Engine;
        let cfg = MediaConfig::default();
        let enc = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let red =
            enc(&std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/images/red.jpg")).unwrap());
        let rocket = enc(&std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/images/rocket.jpg"
        ))
        .unwrap());
        let url = format!("data:video/jpeg;base64,{red},{red},{red}");
        assert!(is_frame_list(&url));
        let mut taken = 0;
        let info = read_frame_list(&url, &cfg, |n| {
            taken += n;
            Ok(())
        })
        .unwrap();
        assert_eq!((info.width, info.height, info.frames), (32, 32, VideoSource::FrameList { frames: 3 }));
        assert!(taken > 0);
        let mixed = format!("data:video/jpeg;base64,{red},{rocket}");
        assert_eq!(read_frame_list(&mixed, &cfg, |_| Ok(())).unwrap_err().label(), "video_frames");
    }
}
