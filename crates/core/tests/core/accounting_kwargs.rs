//! Processor kwargs: server kwargs over the files, request kwargs over the server, unknown keys and
//! missing fields refused with the right reason.

use mmrouter_core::accounting::{Counter, Family};
use serde_json::{json, Map, Value};

fn map(v: Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap_or_default()
}

fn qwen25(server: Value) -> Result<Counter, mmrouter_core::accounting::AccountingError> {
    let pp = json!({
        "image_processor_type": "Qwen2VLImageProcessor", "patch_size": 14, "merge_size": 2,
        "temporal_patch_size": 2, "min_pixels": 3136, "max_pixels": 12_845_056
    });
    let cfg = json!({"model_type": "qwen2_5_vl", "image_token_id": 151655});
    Counter::from_json(&pp, &cfg, None, &map(server))
}

fn tokens(c: &Counter, w: u32, h: u32) -> Option<u32> {
    c.count(w, h).ok().map(|t| t.feature_tokens)
}

#[test]
fn server_kwargs_apply_and_request_kwargs_override_them() {
    let file_only = qwen25(json!({})).unwrap();
    assert_eq!(tokens(&file_only, 1920, 1080), Some(2691));
    // The class-default budget (1,003,520) as a server override gives the smaller count.
    let server = qwen25(json!({"max_pixels": 1_003_520})).unwrap();
    assert_eq!(tokens(&server, 1920, 1080), Some(1222));
    let request = server.with_request_kwargs(&map(json!({"max_pixels": 12_845_056}))).unwrap();
    assert_eq!(tokens(&request, 1920, 1080), Some(2691));
    // `size` works as well, and the base counter is unchanged.
    let sized = server.with_request_kwargs(&map(json!({"size": {"shortest_edge": 3136, "longest_edge": 12_845_056}})));
    assert_eq!(sized.ok().and_then(|c| tokens(&c, 1920, 1080)), Some(2691));
    assert_eq!(tokens(&server, 1920, 1080), Some(1222));
}

#[test]
fn unknown_kwargs_are_refused_at_both_levels() {
    let err = qwen25(json!({"do_resize": false})).unwrap_err();
    assert_eq!(err.label(), "processor_kwargs");
    assert!(err.to_string().contains("do_resize"), "{err}");
    let c = qwen25(json!({})).unwrap();
    let err = c.with_request_kwargs(&map(json!({"fps": 2}))).unwrap_err();
    assert_eq!(err.label(), "processor_kwargs");
    assert!(err.to_string().contains("fps") && err.to_string().contains("request"), "{err}");
    let err = c.with_request_kwargs(&map(json!({"max_pixels": "lots"}))).unwrap_err();
    assert_eq!(err.label(), "processor_kwargs");
    // Empty request kwargs are a no-op.
    assert_eq!(c.with_request_kwargs(&Map::new()).ok().and_then(|c| tokens(&c, 640, 480)), Some(391));
}

#[test]
fn family_specific_overrides_change_counts() {
    let phi =
        Counter::from_json(&json!({"num_crops": 16}), &json!({"model_type": "phi3_v"}), None, &Map::new()).unwrap();
    assert_eq!(tokens(&phi, 1, 1), Some(2509));
    let phi4 = phi.with_request_kwargs(&map(json!({"num_crops": 4}))).unwrap();
    assert_eq!(tokens(&phi4, 1, 1), Some(757));

    let gemma = Counter::from_json(
        &json!({"do_pan_and_scan": null, "pan_and_scan_min_crop_size": null}),
        &json!({"model_type": "gemma3", "mm_tokens_per_image": 256}),
        None,
        &Map::new(),
    )
    .unwrap();
    assert_eq!(tokens(&gemma, 640, 480), Some(256));
    let pas = gemma.with_request_kwargs(&map(json!({"do_pan_and_scan": true}))).unwrap();
    assert_eq!(tokens(&pas, 640, 480), Some(768));
    assert_eq!(pas.count(640, 480).map(|t| t.expansion_tokens), Ok(None));

    let internvl = Counter::from_json(
        &json!({"size": {"height": 448, "width": 448}, "min_patches": 1, "max_patches": 12, "crop_to_patches": true}),
        &json!({"model_type": "internvl", "vision_config": {"image_size": 448, "patch_size": 14}, "downsample_ratio": 0.5}),
        None,
        &map(json!({"max_patches": 6})),
    )
    .unwrap();
    assert_eq!(tokens(&internvl, 640, 480), Some(7 * 256));
    let one = internvl.with_request_kwargs(&map(json!({"crop_to_patches": false}))).unwrap();
    assert_eq!(tokens(&one, 640, 480), Some(256));
}

#[test]
fn tokenizer_mode_selects_mistral_rounding_at_server_level_only() {
    let pp = json!({"image_processor_type": "PixtralImageProcessor", "patch_size": 14, "size": {"longest_edge": 1540}});
    let cfg = json!({"model_type": "mistral3", "vision_config": {"patch_size": 14}, "spatial_merge_size": 2});
    let hf = Counter::from_json(&pp, &cfg, None, &Map::new()).unwrap();
    let mc = Counter::from_json(&pp, &cfg, None, &map(json!({"tokenizer_mode": "mistral"}))).unwrap();
    assert_eq!(hf.count(4800, 963).map(|t| t.expansion_tokens), Ok(Some(616)));
    assert_eq!(mc.count(4800, 963).map(|t| t.expansion_tokens), Ok(Some(672)));
    let err = hf.with_request_kwargs(&map(json!({"tokenizer_mode": "mistral"}))).unwrap_err();
    assert_eq!(err.label(), "processor_kwargs");
    let err = Counter::from_json(&pp, &cfg, None, &map(json!({"tokenizer_mode": "slow"}))).unwrap_err();
    assert_eq!(err.label(), "processor_kwargs");
    // The key is Pixtral-only.
    assert_eq!(qwen25(json!({"tokenizer_mode": "mistral"})).unwrap_err().label(), "processor_kwargs");
}

#[test]
fn missing_fields_are_errors_that_name_field_and_file() {
    let pp = json!({"merge_size": 2, "min_pixels": 3136, "max_pixels": 12_845_056});
    let err = Counter::from_json(&pp, &json!({"model_type": "qwen2_5_vl"}), None, &Map::new()).unwrap_err();
    assert_eq!(err.label(), "config_missing_field");
    let msg = err.to_string();
    assert!(msg.contains("patch_size") && msg.contains("preprocessor_config.json"), "{msg}");

    let pp = json!({"patch_size": 14, "merge_size": 2, "min_pixels": 3136});
    let err = Counter::from_json(&pp, &json!({"model_type": "qwen2_5_vl"}), None, &Map::new()).unwrap_err();
    assert!(err.to_string().contains("max_pixels"), "{err}");

    let err =
        Counter::from_json(&json!({"num_crops": 4}), &json!({"model_type": "gemma3"}), None, &Map::new()).unwrap_err();
    assert_eq!(err.label(), "config_missing_field");
    assert!(err.to_string().contains("mm_tokens_per_image") && err.to_string().contains("config.json"), "{err}");
}

#[test]
fn model_dirs_detect_or_override_the_family() {
    let dir = tempfile::tempdir().unwrap();
    let err = Counter::from_model_dir(dir.path(), None, &Map::new()).unwrap_err();
    assert_eq!(err.label(), "config_file");
    std::fs::write(dir.path().join("preprocessor_config.json"), r#"{"num_crops": 4}"#).unwrap();
    std::fs::write(dir.path().join("config.json"), r#"{"model_type": "something_new"}"#).unwrap();
    let err = Counter::from_model_dir(dir.path(), None, &Map::new()).unwrap_err();
    assert_eq!(err.label(), "unsupported_model");
    let c = Counter::from_model_dir(dir.path(), Some("phi3_v".parse::<Family>().unwrap()), &Map::new()).unwrap();
    assert_eq!(c.family(), Family::Phi3V);
    assert_eq!(tokens(&c, 640, 480), Some(757));
}

#[test]
fn placeholders_per_family() {
    let c = qwen25(json!({})).unwrap();
    assert_eq!(c.placeholder(), "<|image_pad|>");
    let run = c.count(640, 480).unwrap().run().unwrap();
    assert_eq!(run.len(), 1);
    assert_eq!((run[0].text.as_ref(), run[0].repeat), ("<|image_pad|>", 391));
}
