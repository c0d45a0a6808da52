//! Video intake and accounting against the committed clips (`tests/fixtures/video/`): the container
//! probe gives what OpenCV's reader reported for each clip (`clips.json`, written by `gen_clips.py`), and
//! each clip's expansion — every token id of its run, Qwen3-VL's timestamps included — equals the ids
//! vLLM 0.32's own renderer produced for it (`goldens.json`, written by `oracle.py`), under the engines'
//! default video settings and under `--media-io-kwargs '{"video": {"fps": 4}}'`. A clip the router cannot
//! size exactly (AVI, WebM, one frame) must be an error with a label, never a count.

use std::path::PathBuf;

use base64::Engine;
use mmrouter_core::accounting::video::{VideoCounter, VideoFrames, VideoIo};
use mmrouter_core::accounting::Family;
use mmrouter_core::media::{Intake, MediaConfig, VideoInfo, VideoSource};
use mmrouter_core::prompt::PromptModel;
use serde_json::{Map, Value};

fn dir() -> PathBuf {
    crate::fixtures().join("video")
}

fn json(name: &str) -> Value {
    serde_json::from_slice(&std::fs::read(dir().join(name)).unwrap()).unwrap()
}

fn data_url(name: &str) -> String {
    let path = dir().join("clips").join(name);
    if name.ends_with(".jpeg-list") {
        return format!("data:video/jpeg;base64,{}", std::fs::read_to_string(path).unwrap());
    }
    let mime = match name.rsplit('.').next().unwrap() {
        "mov" => "video/quicktime",
        "avi" => "video/x-msvideo",
        "webm" => "video/webm",
        _ => "video/mp4",
    };
    format!("data:{mime};base64,{}", base64::engine::general_purpose::STANDARD.encode(std::fs::read(path).unwrap()))
}

fn intake(name: &str) -> Result<VideoInfo, String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let intake = Intake::new(MediaConfig::default()).unwrap();
    let url = data_url(name);
    let report = rt.block_on(intake.process_media(&[], &[&url]));
    report.media.map(|(_, mut videos)| videos.remove(0)).map_err(|e| e.label().to_owned())
}

#[test]
fn the_probe_reads_what_opencv_reads_or_says_why_not() {
    for clip in json("clips.json")["clips"].as_array().unwrap() {
        let name = clip["name"].as_str().unwrap();
        let got = intake(name);
        match name.rsplit('.').next().unwrap() {
            "mp4" | "mov" => {
                let info = got.unwrap_or_else(|e| panic!("{name}: {e}"));
                let cv = &clip["opencv"];
                let VideoSource::Container { frames, fps, .. } = info.frames else { panic!("{name}: not a container") };
                assert_eq!(frames, cv["frame_count"].as_u64().unwrap(), "{name}: frame count");
                assert_eq!(fps, cv["fps"].as_f64().unwrap(), "{name}: fps, to the last bit");
                assert_eq!(
                    (info.width as u64, info.height as u64),
                    (cv["width"].as_u64().unwrap(), cv["height"].as_u64().unwrap()),
                    "{name}"
                );
            }
            "avi" | "webm" => assert_eq!(got.unwrap_err(), "video_container", "{name}"),
            _ => assert!(matches!(got.unwrap().frames, VideoSource::FrameList { frames: 5 }), "{name}"),
        }
    }
}

fn counter(family: Family, profile: &str, io: VideoIo) -> VideoCounter {
    let path = crate::fixtures().join("../../config/models").join(profile).join("preprocessor_config.json");
    let processor: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    VideoCounter::new(family, &processor, &Map::new(), io).unwrap()
}

/// The clip's expansion as token ids: each run part's literal token, or its text tokenized on its own.
fn run_ids(model: &PromptModel, counter: &VideoCounter, info: &VideoInfo) -> Result<Vec<u32>, String> {
    let frames = match info.frames {
        VideoSource::Container { frames, fps, .. } => VideoFrames::Container { frames, fps },
        VideoSource::FrameList { frames } => VideoFrames::FrameList { frames },
    };
    let tokens = counter.count(info.width, info.height, frames).map_err(|e| e.label().to_owned())?;
    let mut ids = Vec::new();
    for part in tokens.run() {
        let one = match model.token_id(&part.text) {
            Some(id) => vec![id],
            None => model.encode(&part.text).unwrap(),
        };
        for _ in 0..part.repeat {
            ids.extend_from_slice(&one);
        }
    }
    Ok(ids)
}

#[test]
fn every_clip_expands_to_the_ids_of_vllms_renderer() {
    let goldens = json("goldens.json");
    let mut checked = 0;
    for (family, profile) in [(Family::Qwen2Vl, "qwen2.5-vl"), (Family::Qwen3Vl, "qwen3-vl")] {
        let model = PromptModel::bundled(profile).unwrap();
        let key = if family == Family::Qwen2Vl { "qwen2_5_vl" } else { "qwen3_vl" };
        for (setting, io) in [
            ("default", VideoIo { fps: None, num_frames: None }),
            ("fps4", VideoIo { fps: Some(4.0), num_frames: None }),
        ] {
            let counter = counter(family, profile, io);
            for row in goldens["renders"][format!("{key}/{setting}")].as_array().unwrap() {
                let name = row["name"].as_str().unwrap();
                if name == "image_then_video" {
                    continue;
                }
                let ours = intake(name).and_then(|info| run_ids(&model, &counter, &info));
                let what = format!("{key}/{setting} {name}");
                if row["outcome"] != "ok" {
                    assert!(
                        ours.is_err(),
                        "{what}: vLLM refuses it ({}), the router must not count it",
                        row["message"]
                    );
                    continue;
                }
                match ours {
                    Ok(ids) => {
                        let span = &row["video_spans"][0];
                        let (at, len) =
                            (span["offset"].as_u64().unwrap() as usize, span["length"].as_u64().unwrap() as usize);
                        let want: Vec<u32> = row["ids"].as_array().unwrap()[at..at + len]
                            .iter()
                            .map(|v| v.as_u64().unwrap() as u32)
                            .collect();
                        assert_eq!(ids, want, "{what}: the video's run");
                        checked += 1;
                    }
                    // A counted fallback is allowed only where the container cannot be read exactly.
                    Err(label) => assert_eq!(label, "video_container", "{what}"),
                }
            }
        }
    }
    assert_eq!(checked, 4 * 9, "every mp4/mov clip and the frame list, for both families and settings");
}
