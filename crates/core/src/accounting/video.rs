//! Video-token accounting for Qwen2-VL / Qwen2.5-VL and Qwen3-VL, as vLLM 0.32 with transformers 5.19
//! counts a clip: the loader's frame sampling (`vllm/multimodal/video.py`, `Qwen2VLVideoBackend` /
//! `Qwen3VLVideoBackend.compute_frames_index_to_sample`, fps from the engines' `--media-io-kwargs`,
//! default 2), the HF video processor's resize (Qwen2: the image `smart_resize` with the video
//! processor's pixel bounds; Qwen3: the temporal-volume `smart_resize`) and temporal patches of two
//! frames, and the prompt: Qwen2.5-VL one run of `<|video_pad|>`; Qwen3-VL per group of two frames
//! `<{t:.1f} seconds>` (tokenized on its own) `<|vision_start|>` pads `<|vision_end|>`, `t` the mean
//! of the group's source indices ÷ source fps.
//!
//! A `video/jpeg` frame list is not sampled: vLLM keeps its first `num_frames` (32) frames, at
//! `fps` (1) for timestamps. What the engine refuses, or what the router cannot know, is an error
//! with a label — never an estimate.

use std::borrow::Cow;

use serde_json::{Map, Value};

use super::error::AccountingError;
use super::num::{exact, mul, py_round, to_u32, to_u64};
use super::{Family, RunPart};

pub(super) const VIDEO_PAD: &str = "<|video_pad|>";
const VISION_START: &str = "<|vision_start|>";
const VISION_END: &str = "<|vision_end|>";

/// The token a family's chat template writes for a video (replaced by the video's run), where the
/// router knows it: `<|video_pad|>` for Qwen2-VL / Qwen2.5-VL and Qwen3-VL.
pub fn placeholder(family: Family) -> Option<&'static str> {
    matches!(family, Family::Qwen2Vl | Family::Qwen3Vl).then_some(VIDEO_PAD)
}

/// Both Qwen samplers cap the target rate and the frame count (`_MAX_FPS`, `_MAX_FRAMES`).
const LOADER_MAX_FPS: f64 = 30.0;
const LOADER_MAX_FRAMES: u64 = 768;

/// The engines' video settings (`--media-io-kwargs '{"video": {…}}'`), the ones that change a count.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VideoIo {
    /// Target sampling rate of a container (the loaders' default is 2); a frame list's rate (default 1).
    pub fps: Option<f64>,
    /// Frames a `video/jpeg` list keeps (default 32; -1 keeps all). The Qwen loaders ignore it for files.
    pub num_frames: Option<i64>,
}

impl VideoIo {
    /// The `video` object of a `media_io_kwargs` value (engine flag or request field): only `fps` and
    /// `num_frames` are modelled; any other key is an error naming it.
    pub fn parse(kwargs: &Map<String, Value>) -> Result<VideoIo, AccountingError> {
        let mut io = VideoIo { fps: None, num_frames: None };
        let Some(video) = kwargs.get("video") else {
            return Ok(io);
        };
        let bad = |key: &str, detail: &str| AccountingError::MediaIoKwargs { key: key.into(), detail: detail.into() };
        let video = video.as_object().ok_or_else(|| bad("video", "must be an object"))?;
        for (key, value) in video {
            match key.as_str() {
                "fps" => {
                    io.fps = Some(value.as_f64().filter(|f| f.is_finite()).ok_or_else(|| bad(key, "not a number"))?)
                }
                "num_frames" => io.num_frames = Some(value.as_i64().ok_or_else(|| bad(key, "not an integer"))?),
                _ => return Err(bad(key, "not modelled: the count would be a guess")),
            }
        }
        Ok(io)
    }

    /// `self` with a request's settings on top, as vLLM merges them: setting one of `fps` and
    /// `num_frames` drops the engine's value of the other.
    pub fn merged(self, request: VideoIo) -> VideoIo {
        match (request.fps, request.num_frames) {
            (Some(_), None) => VideoIo { fps: request.fps, num_frames: None },
            (None, Some(_)) => VideoIo { fps: None, num_frames: request.num_frames },
            (None, None) => self,
            _ => request,
        }
    }
}

/// How the engine receives a video: a file's count and rate, or a frame list's length.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum VideoFrames {
    Container { frames: u64, fps: f64 },
    FrameList { frames: u64 },
}

/// The count of one video, with what decided it.
#[derive(Clone, Debug, PartialEq)]
pub struct VideoTokens {
    /// Frames the processor receives (after sampling).
    pub frames: u32,
    /// Temporal groups (`grid_t`): frames padded to a multiple of the temporal patch, halved.
    pub groups: u32,
    /// Video-pad tokens per group.
    pub tokens_per_group: u32,
    /// Resized frame size.
    pub resized: (u32, u32),
    /// Qwen3-VL: each group's timestamp text; empty for Qwen2.5-VL.
    pub timestamps: Vec<String>,
}

impl VideoTokens {
    /// Tokens that receive the video's embedding.
    pub fn feature_tokens(&self) -> u32 {
        self.groups.saturating_mul(self.tokens_per_group)
    }

    /// The run replacing the video's `<|video_pad|>` placeholder, as literal token texts (a timestamp is
    /// tokenized on its own, as vLLM's `get_video_repl` does).
    pub fn run(&self) -> Vec<RunPart> {
        if self.timestamps.is_empty() {
            return vec![RunPart { text: Cow::Borrowed(VIDEO_PAD), repeat: self.feature_tokens() }];
        }
        let mut run = Vec::with_capacity(4 * self.timestamps.len());
        for ts in &self.timestamps {
            run.push(RunPart { text: Cow::Owned(ts.clone()), repeat: 1 });
            run.push(RunPart { text: Cow::Borrowed(VISION_START), repeat: 1 });
            run.push(RunPart { text: Cow::Borrowed(VIDEO_PAD), repeat: self.tokens_per_group });
            run.push(RunPart { text: Cow::Borrowed(VISION_END), repeat: 1 });
        }
        run
    }
}

/// One model's video counting parameters, from its video processor config.
#[derive(Clone, Debug, PartialEq)]
pub struct VideoCounter {
    qwen3: bool,
    patch: u64,
    temporal: u64,
    merge: u64,
    min_pixels: u64,
    max_pixels: u64,
    min_frames: u64,
    max_frames: u64,
    /// Qwen3-VL's processor rate, used when it samples again (every frame was loaded).
    processor_fps: f64,
    io: VideoIo,
}

impl VideoCounter {
    /// From the video processor's dict — `video_preprocessor_config.json`, else (as transformers
    /// falls back) `preprocessor_config.json` — and the engines' video `media_io_kwargs`. Server
    /// `mm_processor_kwargs` for video are not modelled.
    pub fn new(
        family: Family,
        processor: &Value,
        server_kwargs: &Map<String, Value>,
        io: VideoIo,
    ) -> Result<VideoCounter, AccountingError> {
        let qwen3 = match family {
            Family::Qwen2Vl => false,
            Family::Qwen3Vl => true,
            other => {
                return Err(AccountingError::VideoUnsupported {
                    detail: format!("the router does not count video for {} yet", other.label()),
                })
            }
        };
        if let Some(key) = server_kwargs.keys().next() {
            return Err(AccountingError::ProcessorKwargs {
                source_name: "model.processor_kwargs",
                key: key.clone(),
                detail: "not modelled for video".into(),
            });
        }
        let p = processor.as_object().ok_or_else(|| invalid("the video processor config is not an object"))?;
        for key in ["cap_pixels_per_frame", "do_sample_frames", "num_frames"] {
            if p.get(key).is_some_and(|v| !v.is_null()) {
                return Err(invalid(&format!("`{key}` in the video processor config is not modelled")));
            }
        }
        let int = |key: &str, default: u64| -> Result<u64, AccountingError> {
            match p.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(v) => {
                    v.as_u64().filter(|&n| n > 0).ok_or_else(|| invalid(&format!("`{key}` is not a positive integer")))
                }
            }
        };
        let (default_min, default_max) =
            if qwen3 { (128 * 32 * 32, 32 * 32 * 768) } else { (128 * 28 * 28, 28 * 28 * 768) };
        let size = p.get("size").and_then(Value::as_object);
        let edge = |key: &str| size.and_then(|s| s.get(key)).and_then(Value::as_u64);
        // Qwen2VLVideoProcessor maps `min_pixels`/`max_pixels` onto the size edges; Qwen3's does not.
        let (min_pixels, max_pixels) = if qwen3 {
            (edge("shortest_edge").unwrap_or(default_min), edge("longest_edge").unwrap_or(default_max))
        } else {
            let min = p.get("min_pixels").and_then(Value::as_u64).or(edge("shortest_edge")).unwrap_or(default_min);
            let max = p.get("max_pixels").and_then(Value::as_u64).or(edge("longest_edge")).unwrap_or(default_max);
            (min, max)
        };
        if min_pixels == 0 || max_pixels == 0 {
            return Err(invalid("a size edge of 0"));
        }
        let processor_fps = match p.get("fps") {
            None | Some(Value::Null) => 2.0,
            Some(v) => v.as_f64().filter(|f| *f > 0.0).ok_or_else(|| invalid("`fps` is not a positive number"))?,
        };
        Ok(VideoCounter {
            qwen3,
            patch: int("patch_size", if qwen3 { 16 } else { 14 })?,
            temporal: int("temporal_patch_size", 2)?,
            merge: int("merge_size", 2)?,
            min_pixels,
            max_pixels,
            min_frames: int("min_frames", 4)?,
            max_frames: int("max_frames", 768)?,
            processor_fps,
            io,
        })
    }

    /// The engines' video settings this counter applies.
    pub fn io(&self) -> VideoIo {
        self.io
    }

    /// This counter under other video settings (a trusted request's `media_io_kwargs`).
    pub fn with_io(&self, io: VideoIo) -> VideoCounter {
        VideoCounter { io, ..self.clone() }
    }

    /// Tokens of one video of `width × height` frames.
    pub fn count(&self, width: u32, height: u32, frames: VideoFrames) -> Result<VideoTokens, AccountingError> {
        super::num::nonzero(width, height)?;
        let (indices, source_fps) = self.sampled(frames)?;
        let n = indices.len() as u64;
        // Qwen3-VL's resize refuses fewer frames than a temporal patch; Qwen2's pads one frame.
        if n == 0 || (self.qwen3 && n < self.temporal) {
            return Err(AccountingError::VideoTooShort { frames: n });
        }
        let (h, w) = if self.qwen3 {
            self.resize_qwen3(width, height, n)?
        } else {
            let budget = super::qwen::Budget {
                factor: self.patch * self.merge,
                min_pixels: self.min_pixels,
                max_pixels: self.max_pixels,
                frames: 1,
            };
            budget.resize(width, height, u64::from(height), u64::from(width))?
        };
        let groups = n.div_ceil(self.temporal);
        let per = (h / self.patch) * (w / self.patch) / (self.merge * self.merge);
        let timestamps = match self.qwen3 {
            true => timestamps(&indices, source_fps, self.temporal as usize),
            false => Vec::new(),
        };
        let total = mul(groups, per, "video tokens")?;
        to_u32(total, "video tokens")?;
        Ok(VideoTokens {
            frames: to_u32(n, "frames")?,
            groups: to_u32(groups, "groups")?,
            tokens_per_group: to_u32(per, "tokens per group")?,
            resized: (to_u32(w, "resized width")?, to_u32(h, "resized height")?),
            timestamps,
        })
    }

    /// The source indices of the frames the processor receives, and the rate its timestamps use.
    fn sampled(&self, frames: VideoFrames) -> Result<(Vec<u64>, f64), AccountingError> {
        match frames {
            VideoFrames::FrameList { frames } => {
                let kept = match self.io.num_frames.unwrap_or(32) {
                    0 => {
                        return Err(AccountingError::MediaIoKwargs {
                            key: "num_frames".into(),
                            detail: "0: the engine refuses it".into(),
                        })
                    }
                    n if n < 0 => frames,
                    n => frames.min(n as u64),
                };
                Ok(((0..kept).collect(), self.io.fps.unwrap_or(1.0)))
            }
            VideoFrames::Container { frames, fps } if self.qwen3 => self.sample_qwen3(frames, fps),
            VideoFrames::Container { frames, fps } => Ok((self.sample_qwen2(frames, fps)?, fps)),
        }
    }

    /// `Qwen2VLVideoBackend.compute_frames_index_to_sample`: `total / fps * target` frames, clamped,
    /// floored to a multiple of the temporal patch, at `torch.arange(0, total, total / n)` in float32
    /// (the tail clamped; frames are read once each, so repeated indices count once).
    fn sample_qwen2(&self, total: u64, fps: f64) -> Result<Vec<u64>, AccountingError> {
        if fps <= 0.0 {
            return Err(AccountingError::VideoUnsupported { detail: "Qwen2-VL needs a known source fps".into() });
        }
        let tp = self.temporal;
        let max_frames = (self.max_frames.min(LOADER_MAX_FRAMES).min(total) / tp) * tp;
        let target = self.io.fps.unwrap_or(2.0).min(LOADER_MAX_FPS);
        let n = exact(total, "frames")? / fps * target;
        let n = n.max(self.min_frames as f64).min(max_frames as f64).min(total as f64);
        let n = (n / tp as f64).floor() as u64 * tp;
        if n == 0 {
            // vLLM 0.32 divides by zero here (HTTP 500).
            return Err(AccountingError::VideoTooShort { frames: total });
        }
        let step = total as f64 / n as f64;
        let len = (total as f64 / step).ceil() as u64;
        let mut out: Vec<u64> = Vec::with_capacity(len as usize);
        for i in 0..len {
            let v = ((i as f64) * step) as f32;
            let idx = (v as i64).clamp(0, total as i64 - 1) as u64;
            if out.last() != Some(&idx) {
                out.push(idx);
            }
        }
        Ok(out)
    }

    /// `Qwen3VLVideoBackend.compute_frames_index_to_sample`, then — when that loaded every frame — the
    /// HF processor sampling again at its own rate (vLLM passes `do_sample_frames` then).
    fn sample_qwen3(&self, total: u64, fps: f64) -> Result<(Vec<u64>, f64), AccountingError> {
        let fps = if fps > 0.0 { fps } else { 24.0 };
        let target = self.io.fps.unwrap_or(2.0).min(LOADER_MAX_FPS);
        let loaded = qwen3_count(total, fps, target, self.min_frames, self.max_frames.min(LOADER_MAX_FRAMES));
        let n = match loaded == total {
            true => qwen3_count(total, fps, self.processor_fps, self.min_frames, self.max_frames),
            false => loaded,
        };
        Ok((linspace_round(total, n), fps))
    }

    /// transformers' Qwen3-VL `smart_resize` over the temporal volume (small sides scaled up first).
    fn resize_qwen3(&self, width: u32, height: u32, frames: u64) -> Result<(u64, u64), AccountingError> {
        let factor = self.patch * self.merge;
        let (mut h, mut w) = (u64::from(height), u64::from(width));
        if h < factor || w < factor {
            let scale = (factor as f64 / h as f64).max(factor as f64 / w as f64);
            h = to_u64((h as f64 * scale).trunc(), "scaled height")?;
            w = to_u64((w as f64 * scale).trunc(), "scaled width")?;
        }
        let (hf, wf, f) = (exact(h, "height")?, exact(w, "width")?, factor as f64);
        if hf.max(wf) / hf.min(wf) > 200.0 {
            return Err(AccountingError::AspectRatio { width, height, limit: 200 });
        }
        let mut hb = mul(to_u64(py_round(hf / f), "height")?, factor, "height")?;
        let mut wb = mul(to_u64(py_round(wf / f), "width")?, factor, "width")?;
        let tp = self.temporal;
        let t_bar = mul(to_u64(py_round(frames as f64 / tp as f64), "frames")?, tp, "frames")?;
        let volume = exact(mul(mul(frames, h, "volume")?, w, "volume")?, "volume")?;
        let area = mul(mul(t_bar, hb, "area")?, wb, "area")?;
        if area > self.max_pixels {
            let beta = (volume / self.max_pixels as f64).sqrt();
            hb = factor.max(mul(to_u64((hf / beta / f).floor(), "height")?, factor, "height")?);
            wb = factor.max(mul(to_u64((wf / beta / f).floor(), "width")?, factor, "width")?);
        } else if area < self.min_pixels {
            let beta = (self.min_pixels as f64 / volume).sqrt();
            hb = mul(to_u64((hf * beta / f).ceil(), "height")?, factor, "height")?;
            wb = mul(to_u64((wf * beta / f).ceil(), "width")?, factor, "width")?;
        }
        Ok((hb, wb))
    }
}

fn invalid(detail: &str) -> AccountingError {
    AccountingError::ConfigInvalidField {
        file: "video_preprocessor_config.json",
        field: "video processor".into(),
        detail: detail.into(),
    }
}

/// `int(total / fps * target)` clamped to `[min_frames, max_frames]` and to `total`.
fn qwen3_count(total: u64, fps: f64, target: f64, min_frames: u64, max_frames: u64) -> u64 {
    let n = (total as f64 / fps * target).trunc().max(0.0) as u64;
    n.max(min_frames).min(max_frames).min(total)
}

/// `np.linspace(0, total - 1, n).round().astype(int)`: numpy's linspace (step form, the last value
/// set exactly) and round half to even.
fn linspace_round(total: u64, n: u64) -> Vec<u64> {
    let stop = (total - 1) as f64;
    match n {
        0 => Vec::new(),
        1 => vec![0],
        _ => {
            let step = stop / (n - 1) as f64;
            let mut out: Vec<u64> = (0..n - 1).map(|i| py_round(i as f64 * step) as u64).collect();
            out.push(stop as u64);
            out
        }
    }
}

/// Qwen3-VL's group timestamps: indices padded with the last to a multiple of `merge`, each ÷ fps,
/// the mean of each group, formatted `<{:.1f} seconds>` as Python does (round half to even on the
/// binary value).
fn timestamps(indices: &[u64], fps: f64, merge: usize) -> Vec<String> {
    let mut idx = indices.to_vec();
    while !idx.len().is_multiple_of(merge) {
        idx.push(*indices.last().unwrap_or(&0));
    }
    let secs: Vec<f64> = idx.iter().map(|&i| i as f64 / fps).collect();
    secs.chunks(merge).map(|g| format!("<{:.1} seconds>", (g[0] + g[merge - 1]) / 2.0)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn counter(family: Family, io: VideoIo) -> VideoCounter {
        let cfg = match family {
            Family::Qwen3Vl => json!({"size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16}),
            _ => json!({"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14}),
        };
        VideoCounter::new(family, &cfg, &Map::new(), io).unwrap()
    }

    const DEFAULT: VideoIo = VideoIo { fps: None, num_frames: None };

    #[test]
    fn python_formats_ties_to_even() {
        // f"{0.25:.1f}" == "0.2", f"{0.75:.1f}" == "0.8", f"{1.25:.1f}" == "1.2", f"{0.35:.1f}" == "0.3"
        assert_eq!(timestamps(&[0, 5], 10.0, 2), vec!["<0.2 seconds>"]);
        assert_eq!(timestamps(&[5, 10], 10.0, 2), vec!["<0.8 seconds>"]);
        assert_eq!(timestamps(&[10, 15], 10.0, 2), vec!["<1.2 seconds>"]);
        assert_eq!(format!("{:.1}", 0.35f64), "0.3");
    }

    #[test]
    fn qwen2_sampling_is_torch_arange_in_float32() {
        let c = counter(Family::Qwen2Vl, DEFAULT);
        assert_eq!(c.sample_qwen2(20, 10.0).unwrap(), vec![0, 5, 10, 15]);
        assert_eq!(c.sample_qwen2(3, 10.0).unwrap(), vec![0, 1]);
        assert_eq!(c.sample_qwen2(1, 10.0).unwrap_err().label(), "video_too_short");
        assert_eq!(c.sample_qwen2(300, 30.0).unwrap().len(), 20);
    }

    #[test]
    fn unmodelled_settings_are_refused_by_name() {
        let mut kw = Map::new();
        kw.insert("video".into(), json!({"fps": 4, "frames_indices": [0]}));
        assert_eq!(VideoIo::parse(&kw).unwrap_err().label(), "media_io_kwargs");
        kw.insert("video".into(), json!({"fps": 4}));
        assert_eq!(VideoIo::parse(&kw).unwrap().fps, Some(4.0));
        let cfg = json!({"cap_pixels_per_frame": true});
        assert_eq!(
            VideoCounter::new(Family::Qwen3Vl, &cfg, &Map::new(), DEFAULT).unwrap_err().label(),
            "config_invalid_field"
        );
        assert_eq!(
            VideoCounter::new(Family::Gemma3, &json!({}), &Map::new(), DEFAULT).unwrap_err().label(),
            "video_unsupported"
        );
        let engine = VideoIo { fps: Some(4.0), num_frames: Some(8) };
        assert_eq!(
            engine.merged(VideoIo { fps: None, num_frames: Some(3) }),
            VideoIo { fps: None, num_frames: Some(3) }
        );
    }

    #[test]
    fn qwen3_runs_carry_a_timestamp_per_group() {
        let t =
            counter(Family::Qwen3Vl, DEFAULT).count(64, 48, VideoFrames::Container { frames: 20, fps: 10.0 }).unwrap();
        assert_eq!((t.frames, t.groups), (4, 2));
        assert_eq!(t.run().len(), 8);
        assert_eq!(t.run()[0].text, "<0.3 seconds>");
    }
}
