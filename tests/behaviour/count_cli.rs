//! `mmrouter count --json` on the bundled Qwen profiles: the golden counts for every golden size, and the
//! sizes Pillow reports for the real photos.

use std::process::Command;

use serde_json::Value;

fn run_count(args: &[String]) -> (i32, Vec<Value>) {
    let out = Command::new(env!("CARGO_BIN_EXE_mmrouter")).arg("count").args(args).output().unwrap();
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("bad JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));
    (out.status.code().unwrap_or(-1), rows)
}

#[test]
fn bundled_profiles_match_the_golden_counts() {
    let golden: Value =
        serde_json::from_str(include_str!("../fixtures/image_tokens.json")).expect("golden file parses");
    for (bundled, profile) in [("qwen3-vl", "qwen3_vl"), ("qwen2.5-vl", "qwen2_5_vl")] {
        let p = &golden["profiles"][profile];
        let field = p["counts"].as_str().unwrap();
        let cases = p["cases"].as_array().unwrap();
        let mut args = vec!["--model-dir".to_owned(), bundled.to_owned(), "--json".to_owned()];
        for c in cases {
            args.push("--size".into());
            args.push(format!("{}x{}", c[0], c[1]));
        }
        let (code, rows) = run_count(&args);
        assert_eq!(rows.len(), cases.len());
        let mut errors = 0;
        for (c, row) in cases.iter().zip(&rows) {
            if c[2].is_null() {
                errors += 1;
                assert!(row["error"].is_string(), "{bundled} {c}: expected an error, got {row}");
                assert!(row[field].is_null());
            } else {
                assert_eq!(row[field], c[2], "{bundled} {c}: {row}");
                assert!(row["error"].is_null());
            }
        }
        // Exit code 1 exactly when some input failed.
        assert_eq!(code, if errors > 0 { 1 } else { 0 }, "{bundled}");
    }
}

#[test]
fn real_photos_are_probed_to_their_stored_size() {
    // (file, width, height) as Pillow reports them (stored size; EXIF orientation not applied).
    let photos = [
        ("rocket.jpg", 640, 427),
        ("grace_hopper.jpg", 512, 600),
        ("chelsea.png", 451, 300),
        ("coffee.png", 600, 400),
        ("horse.png", 400, 328),
        ("no_time_for_that_tiny.gif", 14, 25),
        ("alien1.gif", 80, 71),
        ("red.jpg", 32, 32),
        ("rocket_lossless.webp", 640, 427),
        ("rocket_lossy_alpha.webp", 640, 427),
        ("rocket_exif_rot6.jpg", 640, 427),
    ];
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/images");
    let mut args = vec!["--model-dir".to_owned(), "qwen3-vl".to_owned(), "--json".to_owned()];
    args.extend(photos.iter().map(|(f, _, _)| format!("{dir}/{f}")));
    let (code, rows) = run_count(&args);
    assert_eq!(code, 0);
    for ((file, w, h), row) in photos.iter().zip(&rows) {
        assert!(row["source"].as_str().unwrap().ends_with(file));
        assert_eq!((row["width"].as_u64().unwrap(), row["height"].as_u64().unwrap()), (*w, *h), "{file}");
        // Same size → same count as the size form.
        let (_, by_size) =
            run_count(&["--model-dir".into(), "qwen3-vl".into(), "--json".into(), "--size".into(), format!("{w}x{h}")]);
        assert_eq!(row["expansion_tokens"], by_size[0]["expansion_tokens"], "{file}");
        assert!(row["feature_tokens"].as_u64().unwrap() > 0);
    }
}

#[test]
fn processor_kwargs_mirror_the_pool_mistral_rounding_included() {
    let golden: Value =
        serde_json::from_str(include_str!("../fixtures/image_tokens.json")).expect("golden file parses");
    let p = &golden["profiles"]["mistral_small_3_1"];
    let dir = tempfile::tempdir().unwrap();
    for (file, key) in [("preprocessor_config.json", "preprocessor_config"), ("config.json", "config")] {
        std::fs::write(dir.path().join(file), p[key].to_string()).unwrap();
    }
    let cases = p["cases"].as_array().unwrap();
    let field = p["counts"].as_str().unwrap();
    let count = |kwargs: Option<&str>| {
        let mut args = vec!["--model-dir".to_owned(), dir.path().display().to_string(), "--json".to_owned()];
        if let Some(k) = kwargs {
            args.extend(["--processor-kwargs".to_owned(), k.to_owned()]);
        }
        for c in cases {
            args.extend(["--size".to_owned(), format!("{}x{}", c[0], c[1])]);
        }
        run_count(&args).1
    };
    // As vLLM --tokenizer-mode mistral serves it: every golden case.
    let rows = count(Some(r#"{"tokenizer_mode": "mistral"}"#));
    assert_eq!(rows.len(), cases.len());
    for (c, row) in cases.iter().zip(&rows) {
        if c[2].is_null() {
            assert!(row["error"].is_string(), "{c}: {row}");
        } else {
            assert_eq!(row[field], c[2], "{c}: {row}");
        }
    }
    // The HF files alone imply HF rounding: some golden sizes then count differently.
    let hf = count(None);
    let differ = cases.iter().zip(&hf).filter(|(c, row)| row[field] != c[2]).count();
    assert!(differ > 0, "the kwargs changed nothing: the test would not see a missing flag");
}

#[test]
fn processor_kwargs_must_be_a_json_object() {
    for bad in ["[1]", "{not json", "3"] {
        let out = Command::new(env!("CARGO_BIN_EXE_mmrouter"))
            .args(["count", "--model-dir", "qwen3-vl", "--size", "64x64", "--processor-kwargs", bad])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bad}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("--processor-kwargs"), "{bad}");
    }
    // A Qwen pixel budget changes the count as the workers' --mm-processor-kwargs would.
    let args = |k: &str| -> Vec<String> {
        ["--model-dir", "qwen3-vl", "--json", "--size", "1920x1080", "--processor-kwargs", k]
            .iter()
            .map(|s| s.to_string())
            .collect()
    };
    let default = run_count(&args("{}")).1;
    let small = run_count(&args(r#"{"max_pixels": 200704}"#)).1;
    let tokens = |rows: &[Value]| rows[0]["expansion_tokens"].as_u64().unwrap();
    assert!(tokens(&small) < tokens(&default), "{small:?} vs {default:?}");
}
