//! The bundled profiles' chat templates and tokenizers against Python: rendered text must be
//! byte-identical to jinja2 configured as transformers does, and ids identical to Python
//! `tokenizers` (fixtures from tests/fixtures/gen_prompt_goldens.py).

use mmrouter_core::prompt::{PromptError, PromptModel};
use mmrouter_core::request::{Endpoint, Request};
use serde_json::Value;

/// Renders a chat request given as JSON (through the real parse).
fn render(model: &PromptModel, request: &Value) -> Result<String, PromptError> {
    let body = serde_json::to_vec(request).unwrap();
    model.render_chat(&Request::parse(Endpoint::Chat, &body).unwrap())
}

fn goldens() -> Value {
    let path = crate::fixtures().join("prompt_goldens.json");
    serde_json::from_slice(&std::fs::read(path).expect("read goldens")).expect("parse goldens")
}

fn check_profile(profile: &str) {
    let model = PromptModel::bundled(profile).expect("bundled profile loads");
    let goldens = goldens();
    let cases: Vec<&Value> = goldens["cases"].as_array().unwrap().iter().filter(|c| c["profile"] == profile).collect();
    assert!(cases.len() >= 12, "{profile}: only {} cases", cases.len());
    let mut failures = Vec::new();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let want_text = case["text"].as_str().unwrap();
        let want_ids: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
        match render(&model, &case["request"]) {
            Err(e) => failures.push(format!("{name}: render failed: {e}")),
            Ok(text) if text != want_text => {
                failures.push(format!("{name}: text differs\n  want {want_text:?}\n  got  {text:?}"))
            }
            Ok(text) => {
                let ids = model.encode(&text).unwrap();
                if ids != want_ids {
                    failures.push(format!("{name}: ids differ\n  want {want_ids:?}\n  got  {ids:?}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{profile}:\n{}", failures.join("\n"));
}

#[test]
fn qwen3_vl_matches_python() {
    check_profile("qwen3-vl");
}

#[test]
fn qwen2_5_vl_matches_python() {
    check_profile("qwen2.5-vl");
}

#[test]
fn qwen2_5_vl_lacks_the_four_newer_added_tokens() {
    let q3 = PromptModel::bundled("qwen3-vl").unwrap();
    let q25 = PromptModel::bundled("qwen2.5-vl").unwrap();
    for (literal, id) in
        [("<tool_response>", 151665), ("</tool_response>", 151666), ("<think>", 151667), ("</think>", 151668)]
    {
        assert_eq!(q3.token_id(literal), Some(id), "{literal}");
        assert_eq!(q25.token_id(literal), None, "{literal}");
    }
    for (literal, id) in [("<|image_pad|>", 151655), ("<|vision_start|>", 151652), ("<|im_end|>", 151645)] {
        assert_eq!(q3.token_id(literal), Some(id));
        assert_eq!(q25.token_id(literal), Some(id));
    }
}

#[test]
fn bundled_profiles_are_embedded() {
    // Nothing is read from disk: the files come out of the binary.
    assert_eq!(PromptModel::bundled_names(), ["qwen3-vl", "qwen2.5-vl"]);
    for (name, model_type, patch) in [("qwen3-vl", "qwen3_vl", 16), ("qwen2.5-vl", "qwen2_5_vl", 14)] {
        let config: Value = serde_json::from_slice(PromptModel::bundled_file(name, "config.json").unwrap()).unwrap();
        assert_eq!(config["model_type"], model_type);
        assert_eq!(config["image_token_id"], 151655);
        assert_eq!(config["vision_config"]["patch_size"], patch);
        let pre: Value =
            serde_json::from_slice(PromptModel::bundled_file(name, "preprocessor_config.json").unwrap()).unwrap();
        assert_eq!(pre["patch_size"], patch);
        assert_eq!(pre["merge_size"], 2);
        assert!(PromptModel::bundled_file(name, "tokenizer_config.json").is_some());
        assert!(PromptModel::bundled_file(name, "nope.json").is_none());
        assert!(PromptModel::bundled(name).is_ok());
    }
    let err = PromptModel::bundled("llava").unwrap_err();
    assert_eq!(err.label(), "model_load_failed");
    assert!(err.to_string().contains("qwen3-vl"), "{err}");
}

#[test]
fn from_dir_loads_an_hf_directory_and_prefers_the_processor_template() {
    let dir = tempfile::tempdir().unwrap();
    let write = |file: &str, bytes: &[u8]| std::fs::write(dir.path().join(file), bytes).unwrap();
    write("tokenizer.json.gz", PromptModel::bundled_file("qwen3-vl", "tokenizer.json.gz").unwrap());
    write("tokenizer_config.json", PromptModel::bundled_file("qwen3-vl", "tokenizer_config.json").unwrap());
    let request = serde_json::json!({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}, {"type": "text", "text": "hi"}]}]});

    let from_dir = PromptModel::from_dir(dir.path()).unwrap();
    let bundled = PromptModel::bundled("qwen3-vl").unwrap();
    assert_eq!(render(&from_dir, &request).unwrap(), render(&bundled, &request).unwrap());

    write("chat_template.json", br#"{"chat_template": "J{{ messages | length }}"}"#);
    assert_eq!(render(&PromptModel::from_dir(dir.path()).unwrap(), &request).unwrap(), "J1");
    write("chat_template.jinja", b"{{ eos_token }}|{{ messages[0].content[0].type }}\n");
    assert_eq!(render(&PromptModel::from_dir(dir.path()).unwrap(), &request).unwrap(), "<|im_end|>|image");

    let empty = tempfile::tempdir().unwrap();
    let err = PromptModel::from_dir(empty.path()).unwrap_err();
    assert_eq!(err.label(), "model_load_failed");
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
}

#[test]
fn template_errors_and_bad_requests_are_typed() {
    let model = PromptModel::bundled("qwen3-vl").unwrap();
    let bad_role = serde_json::json!({"messages": [{"role": "wizard", "content": "x"}]});
    let err = render(&model, &bad_role).unwrap_err();
    assert_eq!(err.label(), "template_failed");
    assert!(err.to_string().contains("unsupported message role: wizard"), "{err}");

    let both = serde_json::json!({"messages": [{"role": "user", "content": "x"}],
        "add_generation_prompt": true, "continue_final_message": true});
    assert_eq!(render(&model, &both).unwrap_err().label(), "invalid_request");
    let no_messages = serde_json::json!({"prompt": "x"});
    assert_eq!(render(&model, &no_messages).unwrap_err().label(), "invalid_request");
}
