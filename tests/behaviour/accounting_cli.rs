//! The `count` subcommand's rows and JSON shape, on sizes and on probed files.

use std::path::PathBuf;

use mmrouter::cli::count::{count_rows, render_json, render_table, run_count, CountArgs, CountRow};
use mmrouter_core::accounting::Counter;
use serde_json::{json, Map, Value};

fn qwen_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let pp = json!({"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2, "min_pixels": 3136, "max_pixels": 12_845_056});
    std::fs::write(dir.path().join("preprocessor_config.json"), pp.to_string()).unwrap();
    std::fs::write(dir.path().join("config.json"), json!({"model_type": "qwen2_5_vl"}).to_string()).unwrap();
    dir
}

/// A PNG header is enough for the prober.
fn png(dir: &std::path::Path, w: u32, h: u32) -> PathBuf {
    let mut bytes = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
    bytes.extend_from_slice(&w.to_be_bytes());
    bytes.extend_from_slice(&h.to_be_bytes());
    bytes.extend_from_slice(&[8, 2, 0, 0, 0, 0, 0, 0, 0]);
    let path = dir.join(format!("{w}x{h}.png"));
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn rows_follow_input_order_and_report_reasons() {
    let dir = qwen_dir();
    let counter = Counter::from_model_dir(dir.path(), None, &Map::new()).unwrap();
    let sizes: Vec<String> = ["640x480", "0x5", "40x8001", "bogus"].map(String::from).to_vec();
    let files = vec![png(dir.path(), 1920, 1080), dir.path().join("missing.png")];
    let rows = count_rows(&counter, &sizes, &files);
    let brief: Vec<_> =
        rows.iter().map(|r| (r.width, r.height, r.feature_tokens, r.expansion_tokens, r.error.as_deref())).collect();
    assert_eq!(
        brief,
        vec![
            (Some(640), Some(480), Some(391), Some(391), None),
            (Some(0), Some(5), None, None, Some("zero_size")),
            (Some(40), Some(8001), None, None, Some("aspect_ratio")),
            (None, None, None, None, Some("invalid_size")),
            (Some(1920), Some(1080), Some(2691), Some(2691), None),
            (None, None, None, None, Some("probe_failed")),
        ]
    );
    assert_eq!(rows[0].source, "640x480");
    assert!(rows[4].source.ends_with("1920x1080.png"));

    let json: Value = serde_json::from_str(&render_json(&rows).unwrap()).unwrap();
    let list = json.as_array().unwrap();
    assert_eq!(list.len(), 6);
    for obj in list {
        let mut keys: Vec<_> = obj.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        assert_eq!(keys, ["error", "expansion_tokens", "feature_tokens", "height", "source", "width"]);
    }
    assert_eq!(list[0]["feature_tokens"], 391);
    assert_eq!(list[0]["error"], Value::Null);
    assert_eq!(list[5]["width"], Value::Null);

    let table = render_table(&counter, &rows);
    assert!(table.starts_with("family: qwen2_vl\n"));
    assert_eq!(table.lines().count(), 2 + rows.len());
    assert!(table.contains("aspect_ratio"));
}

#[test]
fn exit_code_reflects_failures() {
    let dir = qwen_dir();
    fn args<'a>(model_dir: &'a str, sizes: &'a [String], json: bool) -> CountArgs<'a> {
        CountArgs { model_dir, family: None, processor_kwargs: None, sizes, files: &[], json }
    }
    let ok = run_count(&args(dir.path().to_str().unwrap(), &["28x28".to_string()], true)).unwrap();
    assert_eq!(ok, 0);
    let failed = run_count(&args(dir.path().to_str().unwrap(), &["0x28".to_string()], false)).unwrap();
    assert_eq!(failed, 1);
    let missing = tempfile::tempdir().unwrap();
    assert!(run_count(&args(missing.path().to_str().unwrap(), &[], true)).is_err());
}

#[test]
fn rows_serialize_with_null_tokens_on_failure() {
    let row = CountRow {
        source: "x".into(),
        width: None,
        height: None,
        feature_tokens: None,
        expansion_tokens: None,
        error: Some("probe_failed".into()),
    };
    let v = serde_json::to_value(&row).unwrap();
    assert_eq!(
        v,
        json!({"source": "x", "width": null, "height": null, "feature_tokens": null, "expansion_tokens": null, "error": "probe_failed"})
    );
}
