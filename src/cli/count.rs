//! `mmrouter count`: image-token counts for `WxH` sizes and image files — and video files (`.mp4`,
//! `.mov`, … by extension: a video's frame size, its `<|video_pad|>` tokens as `feature_tokens` and its
//! whole run, Qwen3-VL's timestamps included, as `expansion_tokens`, under the engines' default video
//! settings) — as a table or as the JSON contract (one array, one object per input, sizes first, then
//! files, in input order).
//!
//! The rows are computed by [`count_rows`] and rendered separately, so tests see the exact rows.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use mmrouter_core::accounting::video::{VideoCounter, VideoFrames};
use mmrouter_core::accounting::{Counter, Family};
use mmrouter_core::media::{probe_video, MediaConfig, VideoSource};
use mmrouter_core::model::ModelSource;
use mmrouter_core::prompt::PromptModel;
use serde::Serialize;
use serde_json::Map;

/// Reason label when a `--size` argument is not `WxH`.
pub const INVALID_SIZE: &str = "invalid_size";
/// Reason label when an image file's header cannot be read.
pub const PROBE_FAILED: &str = "probe_failed";

/// One input's result (the `--json` contract).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CountRow {
    pub source: String,
    pub width: Option<u32>,
    pub height: Option<u32>,
    pub feature_tokens: Option<u32>,
    pub expansion_tokens: Option<u32>,
    /// Reason label on failure (both token fields are then null).
    pub error: Option<String>,
}

/// `mmrouter count`'s arguments.
#[derive(Clone, Copy, Debug)]
pub struct CountArgs<'a> {
    /// A bundled profile name or an HF model directory.
    pub model_dir: &'a str,
    /// Accounting family override (auto-detected when absent).
    pub family: Option<&'a str>,
    /// `--processor-kwargs` JSON.
    pub processor_kwargs: Option<&'a str>,
    pub sizes: &'a [String],
    pub files: &'a [PathBuf],
    pub json: bool,
}

/// Runs the subcommand for a bundled profile name or an HF model directory: prints the rows and
/// returns the exit code (0 when every input was counted, 1 when any input failed). A model whose
/// counter cannot be built is an `Err`.
pub fn run_count(args: &CountArgs<'_>) -> anyhow::Result<i32> {
    let CountArgs { model_dir, family, processor_kwargs, sizes, files, json } = *args;
    let family = family
        .map(|f| f.parse::<Family>().map_err(|_| anyhow::anyhow!("--family: unknown family '{f}'")))
        .transpose()?;
    let source = ModelSource::parse(model_dir).map_err(|e| anyhow::anyhow!("--model-dir: {e}"))?;
    let kwargs = parse_kwargs(processor_kwargs)?;
    let counter = source
        .load_counter(family, &kwargs)
        .with_context(|| format!("loading the image-token counter for --model-dir {model_dir}"))?;
    let video = match files.iter().any(|f| is_video(f)) {
        true => Some(VideoCount {
            counter: source.load_video_counter(counter.family(), &kwargs, &Map::new()),
            model: source.load_prompt().context("loading the tokenizer for video runs")?,
        }),
        false => None,
    };
    let rows = count_rows_with(&counter, video.as_ref(), sizes, files);
    let out = if json { render_json(&rows)? } else { render_table(&counter, &rows) };
    super::print_quietly(&out)?;
    Ok(if rows.iter().any(|r| r.error.is_some()) { 1 } else { 0 })
}

/// `--processor-kwargs`: a JSON object (the same keys as the workers' `--mm-processor-kwargs` and the
/// config's `processor_kwargs`), or none.
fn parse_kwargs(json: Option<&str>) -> anyhow::Result<Map<String, serde_json::Value>> {
    match json {
        None => Ok(Map::new()),
        Some(text) => match serde_json::from_str(text) {
            Ok(serde_json::Value::Object(map)) => Ok(map),
            Ok(_) => anyhow::bail!("--processor-kwargs: expected a JSON object, e.g. '{{\"max_pixels\": 1003520}}'"),
            Err(e) => anyhow::bail!("--processor-kwargs: invalid JSON: {e}"),
        },
    }
}

/// Counts every input: sizes first, then files, in order (a video file fails `video_unsupported`).
pub fn count_rows(counter: &Counter, sizes: &[String], files: &[PathBuf]) -> Vec<CountRow> {
    count_rows_with(counter, None, sizes, files)
}

/// What counting a video file needs: the model's video counter (or why it has none) and its
/// tokenizer (a Qwen3-VL timestamp is text tokenized on its own).
pub struct VideoCount {
    pub counter: Result<VideoCounter, mmrouter_core::accounting::AccountingError>,
    pub model: PromptModel,
}

/// [`count_rows`], video files counted with `video`.
pub fn count_rows_with(
    counter: &Counter,
    video: Option<&VideoCount>,
    sizes: &[String],
    files: &[PathBuf],
) -> Vec<CountRow> {
    let size_rows = sizes.iter().map(|s| row(counter, s.clone(), parse_size(s).map_err(|_| INVALID_SIZE)));
    let file_rows = files.iter().map(|f| match is_video(f) {
        true => video_row(video, f),
        false => row(counter, f.display().to_string(), probe_file(f).map_err(|_| PROBE_FAILED)),
    });
    size_rows.chain(file_rows).collect()
}

/// A video file, by its extension.
fn is_video(path: &Path) -> bool {
    let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    matches!(ext.as_deref(), Some("mp4" | "m4v" | "mov" | "webm" | "mkv" | "avi"))
}

/// One video file: probed from its container (no frame decoded), counted, its run's tokens.
fn video_row(video: Option<&VideoCount>, path: &Path) -> CountRow {
    let source = path.display().to_string();
    let mut out =
        CountRow { source, width: None, height: None, feature_tokens: None, expansion_tokens: None, error: None };
    let counted = (|| -> Result<(), String> {
        let video = video.ok_or("video_unsupported")?;
        let counter = video.counter.as_ref().map_err(|e| e.label().to_owned())?;
        let bytes = std::fs::read(path).map_err(|_| PROBE_FAILED.to_owned())?;
        let info = probe_video(&bytes, &MediaConfig::default()).map_err(|e| e.label().to_owned())?;
        (out.width, out.height) = (Some(info.width), Some(info.height));
        let frames = match info.frames {
            VideoSource::Container { frames, fps, .. } => VideoFrames::Container { frames, fps },
            VideoSource::FrameList { frames } => VideoFrames::FrameList { frames },
        };
        let tokens = counter.count(info.width, info.height, frames).map_err(|e| e.label().to_owned())?;
        let mut run = 0u32;
        for part in tokens.run() {
            let len = match video.model.token_id(&part.text) {
                Some(_) => 1,
                None => video.model.encode(&part.text).map_err(|e| e.label().to_owned())?.len() as u32,
            };
            run = run.saturating_add(len.saturating_mul(part.repeat));
        }
        (out.feature_tokens, out.expansion_tokens) = (Some(tokens.feature_tokens()), Some(run));
        Ok(())
    })();
    out.error = counted.err();
    out
}

fn row(counter: &Counter, source: String, size: Result<(u32, u32), &'static str>) -> CountRow {
    let failed = |width, height, error: &str| CountRow {
        source: source.clone(),
        width,
        height,
        feature_tokens: None,
        expansion_tokens: None,
        error: Some(error.to_string()),
    };
    let (w, h) = match size {
        Ok(wh) => wh,
        Err(label) => return failed(None, None, label),
    };
    match counter.count(w, h) {
        Ok(t) => CountRow {
            source,
            width: Some(w),
            height: Some(h),
            feature_tokens: Some(t.feature_tokens),
            expansion_tokens: t.expansion_tokens,
            error: None,
        },
        Err(e) => failed(Some(w), Some(h), e.label()),
    }
}

/// `"640x480"` (or `X`) → `(640, 480)`.
pub fn parse_size(s: &str) -> Result<(u32, u32), String> {
    let (w, h) = s.trim().split_once(['x', 'X']).ok_or_else(|| format!("{s:?} is not WIDTHxHEIGHT"))?;
    let side = |v: &str| v.trim().parse::<u32>().map_err(|e| format!("{s:?}: {e}"));
    Ok((side(w)?, side(h)?))
}

/// Stored pixel size from the file header (no EXIF rotation, as vLLM).
pub fn probe_file(path: &Path) -> Result<(u32, u32), String> {
    let size = imagesize::size(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let w = u32::try_from(size.width).map_err(|_| format!("{}: width too large", path.display()))?;
    let h = u32::try_from(size.height).map_err(|_| format!("{}: height too large", path.display()))?;
    Ok((w, h))
}

/// The `--json` output: one array, followed by a newline.
pub fn render_json(rows: &[CountRow]) -> anyhow::Result<String> {
    let mut out = serde_json::to_string_pretty(rows).context("serializing count rows")?;
    out.push('\n');
    Ok(out)
}

/// A readable table for people.
pub fn render_table(counter: &Counter, rows: &[CountRow]) -> String {
    let cell = |v: Option<u32>| v.map_or_else(|| "-".to_string(), |n| n.to_string());
    let body: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            [
                r.source.clone(),
                cell(r.width),
                cell(r.height),
                cell(r.feature_tokens),
                cell(r.expansion_tokens),
                r.error.clone().unwrap_or_default(),
            ]
        })
        .collect();
    let header = ["source", "width", "height", "feature", "expansion", "error"].map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for line in &body {
        for (w, c) in widths.iter_mut().zip(line) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = format!("family: {}\n", counter.family().label());
    for line in std::iter::once(&header).chain(&body) {
        let mut text = String::new();
        for (i, (c, w)) in line.iter().zip(widths).enumerate() {
            // Text columns left-aligned, numbers right-aligned.
            let _ = match i {
                0 | 5 => write!(text, "{c:<w$}  "),
                _ => write!(text, "{c:>w$}  "),
            };
        }
        out.push_str(text.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_strictly() {
        assert_eq!(parse_size("640x480"), Ok((640, 480)));
        assert_eq!(parse_size(" 1X2 "), Ok((1, 2)));
        assert!(parse_size("640*480").is_err());
        assert!(parse_size("-1x5").is_err());
        assert!(parse_size("x5").is_err());
    }

    #[test]
    fn video_files_are_counted_with_their_whole_run() {
        let clips = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/video/clips");
        let source = ModelSource::Bundled("qwen3-vl");
        let counter = source.load_counter(None, &Map::new()).unwrap();
        let video = VideoCount {
            counter: source.load_video_counter(counter.family(), &Map::new(), &Map::new()),
            model: source.load_prompt().unwrap(),
        };
        let files = ["v01_64x48_10fps_20f.mp4", "v10_64x48_10fps_20f.avi"].map(|f| Path::new(clips).join(f));
        let rows = count_rows_with(&counter, Some(&video), &[], &files);
        // tests/fixtures/video/goldens.json, qwen3_vl/default: the clip's video span is 56 tokens,
        // two groups of 20 pads, each with its timestamp (6 tokens) and vision markers.
        assert_eq!((rows[0].width, rows[0].height), (Some(64), Some(48)));
        assert_eq!(
            (rows[0].feature_tokens, rows[0].expansion_tokens, rows[0].error.as_deref()),
            (Some(40), Some(56), None)
        );
        assert_eq!(rows[1].error.as_deref(), Some("video_container"));
        assert_eq!(count_rows(&counter, &[], &files[..1])[0].error.as_deref(), Some("video_unsupported"));
    }

    #[test]
    fn missing_files_fail_to_probe() {
        assert!(probe_file(Path::new("/nonexistent/mmrouter.png")).is_err());
    }
}
