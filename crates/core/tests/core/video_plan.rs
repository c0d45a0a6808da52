//! Whole chats with videos planned by the pipeline, against vLLM 0.32's own renderer: for each chat of
//! `tests/fixtures/video/goldens.json` (the chats `oracle.py` rendered: a text part and a `video_url`
//! data URL per committed clip, and an image before a video), on both bundled Qwen profiles, under the
//! engines' default video settings and `--media-io-kwargs '{"video": {"fps": 4}}'` (here the pool's
//! `media_io_kwargs`), the exact plan's ids are the renderer's ids token for token and its spans the
//! renderer's `mm_placeholders`; what the router cannot size (AVI, WebM) or the engine refuses (one
//! frame) is a text-prefix fallback carrying nothing of any image or video. Also: the uuid splice of a
//! video part, and request-level media kwargs (refused unless the pool trusts them, then counted).

use base64::Engine;
use mmrouter_core::media::MediaConfig;
use mmrouter_core::model::{ModelSource, ModelSpec};
use mmrouter_core::pipeline::{splice_uuids, Pipeline, PipelineConfig, Planned, Route};
use mmrouter_core::request::{Endpoint, MediaKind, Request};
use serde_json::{json, Map, Value};

fn dir() -> std::path::PathBuf {
    crate::fixtures().join("video")
}

fn goldens() -> Value {
    serde_json::from_slice(&std::fs::read(dir().join("goldens.json")).unwrap()).unwrap()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// `oracle.py`'s `video_url`/`image_url`: the committed file as a data URL.
fn inline(v: &Value) -> Value {
    match v {
        Value::String(s) if s.starts_with("clip:") => {
            let name = &s[5..];
            let path = dir().join("clips").join(name);
            if name.ends_with(".jpeg-list") {
                return format!("data:video/jpeg;base64,{}", std::fs::read_to_string(path).unwrap()).into();
            }
            let mime = match name.rsplit('.').next().unwrap() {
                "mov" => "video/quicktime",
                "avi" => "video/x-msvideo",
                "webm" => "video/webm",
                _ => "video/mp4",
            };
            format!("data:{mime};base64,{}", b64(&std::fs::read(path).unwrap())).into()
        }
        Value::String(s) if s.starts_with("image:") => {
            let bytes = std::fs::read(crate::fixtures().join("images").join(&s[6..])).unwrap();
            format!("data:image/jpeg;base64,{}", b64(&bytes)).into()
        }
        Value::Array(items) => items.iter().map(inline).collect(),
        Value::Object(map) => map.iter().map(|(k, v)| (k.clone(), inline(v))).collect::<Map<_, _>>().into(),
        other => other.clone(),
    }
}

fn pipeline(profile: &'static str, media_io: Value, trust: bool) -> Pipeline {
    let mut model = ModelSpec::new(ModelSource::Bundled(profile));
    model.media_io_kwargs = media_io.as_object().cloned().unwrap_or_default();
    model.trust_request_mm_kwargs = trust;
    Pipeline::new(&PipelineConfig { model, media: MediaConfig::default() }).unwrap()
}

fn plan(p: &Pipeline, body: &[u8]) -> Planned {
    let req = Request::parse(Endpoint::Chat, body).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(p.plan_with(&req, true)).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn spans(v: &Value) -> Vec<(u32, u32)> {
    v.as_array().map_or(Vec::new(), |a| {
        a.iter().map(|s| (s["offset"].as_u64().unwrap() as u32, s["length"].as_u64().unwrap() as u32)).collect()
    })
}

const PROFILES: [(&str, &str); 2] = [("qwen2.5-vl", "qwen2_5_vl"), ("qwen3-vl", "qwen3_vl")];

#[test]
fn every_golden_chat_plans_to_the_renderers_ids_and_spans_or_falls_back_whole() {
    let g = goldens();
    let (mut exact, mut fallbacks) = (0, 0);
    for (profile, key) in PROFILES {
        for (setting, io) in [("default", json!({})), ("fps4", json!({"video": {"fps": 4}}))] {
            let p = pipeline(profile, io, false);
            let rows = g["renders"][format!("{key}/{setting}")].as_array().unwrap();
            for (chat, row) in g["chats"].as_array().unwrap().iter().zip(rows) {
                let name = chat["name"].as_str().unwrap();
                assert_eq!(row["name"], name);
                let what = format!("{key}/{setting} {name}");
                let body = serde_json::to_vec(&json!({"model": "m", "messages": inline(&chat["messages"])})).unwrap();
                let planned = plan(&p, &body);
                let (plan, trace) = (&planned.plan, planned.trace.as_ref().unwrap());
                let unreadable = name.ends_with(".avi") || name.ends_with(".webm");
                if row["outcome"] == "ok" && !unreadable {
                    assert_eq!(plan.route, Route::Exact, "{what}: {:?}", plan.route);
                    let want = ids(&row["ids"]);
                    assert_eq!(trace.ids, want, "{what}: the prompt's ids");
                    assert_eq!(plan.prompt_tokens as usize, want.len(), "{what}");
                    let got: Vec<(u32, u32)> = trace.spans.iter().map(|s| (s.offset, s.len)).collect();
                    let mut golden: Vec<(u32, u32)> = spans(&row["image_spans"]);
                    golden.extend(spans(&row["video_spans"]));
                    golden.sort_unstable();
                    assert_eq!(got, golden, "{what}: spans, images and videos in prompt order");
                    assert_eq!(plan.images.len(), plan.spans.len(), "{what}");
                    let videos: Vec<_> = plan.images.iter().filter_map(|i| i.video.as_ref()).collect();
                    assert_eq!(videos.len(), 1, "{what}");
                    let video = plan.images.iter().zip(&plan.spans).find(|(i, _)| i.video.is_some()).unwrap();
                    assert_eq!(video.0.tokens, video.1.len, "{what}: the video's run is its span");
                    let pads = video.0.video.as_ref().map(|v| v.groups * v.tokens_per_group).unwrap();
                    assert_eq!(video.0.feature_tokens, pads, "{what}");
                    let pad = want.iter().filter(|&&id| id == 151656).count() as u32;
                    assert_eq!(pads, pad, "{what}: feature tokens are the <|video_pad|> tokens");
                    exact += 1;
                    continue;
                }
                let reason = if unreadable { "video_container" } else { "video_too_short" };
                assert_eq!(plan.route, Route::TextPrefix { reason }, "{what}");
                assert!(plan.images.is_empty() && plan.spans.is_empty() && trace.spans.is_empty(), "{what}");
                assert_eq!(plan.exact_image_tokens(), 0, "{what}");
                assert!(!plan.prompt_exact, "{what}");
                // The text prefix ends where the engine's first media run starts.
                let first = spans(&row["image_spans"]).into_iter().chain(spans(&row["video_spans"])).map(|s| s.0).min();
                if let Some(first) = first {
                    let golden = ids(&row["ids"]);
                    assert_eq!(&trace.ids[..first as usize], &golden[..first as usize], "{what}");
                    assert_eq!(plan.text_blocks, Some(first as usize / 16), "{what}: text blocks before the video");
                }
                fallbacks += 1;
            }
        }
    }
    // Per profile and setting: nine clips, the frame list and the image-then-video chat exact; AVI,
    // WebM and the one-frame clip fall back.
    assert_eq!((exact, fallbacks), (4 * 10, 4 * 3));
}

/// The chat `oracle.py` rendered with an image before a video, its video swapped for another clip.
fn image_then(clip: &str) -> Vec<u8> {
    let messages = json!([
        {"role": "system", "content": "You compare media."},
        {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "image:red.jpg"}},
            {"type": "text", "text": "Same colours as"},
            {"type": "video_url", "video_url": {"url": format!("clip:{clip}")}}
        ]}
    ]);
    serde_json::to_vec(&json!({"model": "m", "messages": inline(&messages)})).unwrap()
}

#[test]
fn a_video_the_router_cannot_size_makes_the_whole_request_a_text_prefix_fallback() {
    let g = goldens();
    for (profile, key) in PROFILES {
        let p = pipeline(profile, json!({}), false);
        let row = g["renders"][format!("{key}/default")].as_array().unwrap().last().unwrap().clone();
        assert_eq!(row["name"], "image_then_video");
        let image_at = spans(&row["image_spans"])[0].0 as usize;
        for clip in ["v10_64x48_10fps_20f.avi", "v11_64x48_10fps_20f.webm"] {
            let planned = plan(&p, &image_then(clip));
            let (plan, trace) = (&planned.plan, planned.trace.as_ref().unwrap());
            assert_eq!(plan.route, Route::TextPrefix { reason: "video_container" }, "{key} {clip}");
            // Nothing of the image that was read and counted survives: no spans, no image tokens.
            assert!(plan.images.is_empty() && plan.spans.is_empty(), "{key} {clip}");
            assert_eq!(plan.exact_image_tokens(), 0);
            assert_eq!(plan.text_blocks, Some(image_at / 16), "{key} {clip}: the prefix stops at the image");
            assert_eq!(&trace.ids[..image_at], &ids(&row["ids"])[..image_at], "{key} {clip}");
            // The affinity tail holds both placeholders, and the blocks up to the video's.
            assert_eq!(plan.first_image_block(), image_at / 16);
        }
        // The same chat with the MP4 is exact (the golden), so it was the video that failed it.
        assert_eq!(plan(&p, &image_then("v02_100x60_24fps_30f.mp4")).plan.route, Route::Exact);
    }
}

#[test]
fn a_video_part_gets_the_routers_uuid_and_no_other_byte_changes() {
    let clip = std::fs::read(dir().join("clips/v01_64x48_10fps_20f.mp4")).unwrap();
    let url = format!("data:video/mp4;base64,{}", b64(&clip));
    let digest = blake3::hash(&clip).to_hex().to_string();
    let p = pipeline("qwen3-vl", json!({}), false);
    let text = r#"{"type":"text","text":"What happens?"}"#;
    for (uuid, value) in [("", format!(r#"{{"url":"{url}"}}"#)), (r#","uuid":"evil""#, format!(r#""{url}""#))] {
        let part = format!(r#"{{"type":"video_url","video_url":{value}{uuid}}}"#);
        let body = format!(r#"{{"model":"m","messages":[{{"role":"user","content":[{text},{part}]}}]}}"#);
        let req = Request::parse(Endpoint::Chat, body.as_bytes()).unwrap();
        assert_eq!(req.images.len(), 1);
        assert_eq!(req.images[0].kind, MediaKind::Video);
        assert_eq!(&body.as_bytes()[req.images[0].image_url_span.clone()], value.as_bytes());
        let planned = plan(&p, body.as_bytes());
        assert_eq!(planned.plan.route, Route::Exact);
        assert_eq!(planned.plan.images[0].hash, digest);
        let spliced = String::from_utf8(splice_uuids(body.as_bytes(), &planned.plan.images)).unwrap();
        let want = match uuid {
            "" => body.replacen(&value, &format!(r#"{value},"uuid":"{digest}""#), 1),
            _ => body.replacen(r#""uuid":"evil""#, &format!(r#""uuid":"{digest}""#), 1),
        };
        assert_eq!(spliced, want, "only the uuid is written");
        let parsed: Value = serde_json::from_str(&spliced).unwrap();
        assert_eq!(parsed["messages"][0]["content"][1]["uuid"], digest.as_str());
    }
}

#[test]
fn request_media_kwargs_are_counted_only_where_the_engines_trust_them() {
    let g = goldens();
    let clip = "v01_64x48_10fps_20f.mp4";
    let chat = g["chats"].as_array().unwrap().iter().find(|c| c["name"] == clip).unwrap();
    let body = |extra: Value| {
        let mut body = json!({"model": "m", "messages": inline(&chat["messages"])});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        serde_json::to_vec(&body).unwrap()
    };
    let fps4 = json!({"media_io_kwargs": {"video": {"fps": 4}}});
    for (profile, key) in PROFILES {
        let untrusted = pipeline(profile, json!({}), false);
        let planned = plan(&untrusted, &body(fps4.clone()));
        assert_eq!(planned.plan.route, Route::TextPrefix { reason: "request_mm_kwargs" }, "{key}");
        let kw = json!({"mm_processor_kwargs": {"fps": 1}});
        assert_eq!(plan(&untrusted, &body(kw.clone())).plan.route, Route::TextPrefix { reason: "request_mm_kwargs" });
        // Empty kwargs change nothing.
        assert_eq!(plan(&untrusted, &body(json!({"media_io_kwargs": {}}))).plan.route, Route::Exact);

        let trusted = pipeline(profile, json!({}), true);
        let planned = plan(&trusted, &body(fps4.clone()));
        assert_eq!(planned.plan.route, Route::Exact, "{key}");
        let want = g["renders"][format!("{key}/fps4")].as_array().unwrap().iter().find(|r| r["name"] == clip).unwrap();
        assert_eq!(planned.trace.unwrap().ids, ids(&want["ids"]), "{key}: the request's fps counted as the engine's");
        assert!(planned.plan.images_rehashed, "vLLM names media with request kwargs differently");
        assert_eq!(plan(&trusted, &body(kw)).plan.route, Route::TextPrefix { reason: "processor_kwargs" });
        let unknown = json!({"media_io_kwargs": {"video": {"frames_indices": [0]}}});
        assert_eq!(plan(&trusted, &body(unknown)).plan.route, Route::TextPrefix { reason: "media_io_kwargs" });
    }
}

#[test]
fn a_pool_setting_the_router_does_not_model_falls_back_without_reading_the_video() {
    let p = pipeline("qwen2.5-vl", json!({"video": {"frames_indices": [0]}}), false);
    let body = json!({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi"},
        {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}
    ]}]});
    let planned = plan(&p, &serde_json::to_vec(&body).unwrap());
    assert_eq!(planned.plan.route, Route::TextPrefix { reason: "media_io_kwargs" });
    assert!(planned.probes.is_empty(), "nothing read");
}
