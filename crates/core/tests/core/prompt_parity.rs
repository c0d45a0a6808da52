//! Loading model files: the bundled profiles, HF directories, which template renders a request, and
//! how failures are typed. (Token-for-token parity with vLLM is `parity.rs`; the Jinja environment
//! against Python jinja2 is a unit test of `prompt::env`.)

use mmrouter_core::prompt::{PromptError, PromptModel};
use mmrouter_core::request::{Endpoint, Request};
use serde_json::Value;

/// Renders a chat request given as JSON (through the real parse).
fn render(model: &PromptModel, request: &Value) -> Result<String, PromptError> {
    let body = serde_json::to_vec(request).unwrap();
    model.render_chat(&Request::parse(Endpoint::Chat, &body).unwrap(), &Default::default())
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
    // A request with tools renders with the tokenizer's template, as vLLM resolves it…
    let with_tools = serde_json::json!({"messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "f"}}]});
    assert!(render(&PromptModel::from_dir(dir.path()).unwrap(), &with_tools).unwrap().contains("<tools>"));
    // A template that loops over content gets parts (vLLM's "openai" content format)…
    write(
        "chat_template.jinja",
        b"{{ eos_token }}|{% for m in messages %}{% for c in m.content %}{{ c.type }},{% endfor %}{% endfor %}\n",
    );
    assert_eq!(render(&PromptModel::from_dir(dir.path()).unwrap(), &request).unwrap(), "<|im_end|>|image,text,");
    // …one that does not gets a string, image placeholders first (vLLM's "string" format).
    write("chat_template.jinja", b"{% for m in messages %}[{{ m.content }}]{% endfor %}");
    assert_eq!(render(&PromptModel::from_dir(dir.path()).unwrap(), &request).unwrap(), "[hi]");
    // …and `chat_template.jinja` is the tokenizer's template too (transformers loads it in place of the
    // config's), so with one a request with tools renders with it as well.
    assert_eq!(render(&PromptModel::from_dir(dir.path()).unwrap(), &with_tools).unwrap(), "[hi]");

    let empty = tempfile::tempdir().unwrap();
    let err = PromptModel::from_dir(empty.path()).unwrap_err();
    assert_eq!(err.label(), "model_load_failed");
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
}

#[test]
fn template_errors_and_bad_requests_are_typed() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("tokenizer.json.gz"),
        PromptModel::bundled_file("qwen3-vl", "tokenizer.json.gz").unwrap(),
    )
    .unwrap();
    std::fs::write(dir.path().join("chat_template.jinja"), b"{{ raise_exception('roles must alternate') }}").unwrap();
    let raising = PromptModel::from_dir(dir.path()).unwrap();
    let err = render(&raising, &serde_json::json!({"messages": [{"role": "user", "content": "x"}]})).unwrap_err();
    assert_eq!(err.label(), "template_failed");
    assert!(err.to_string().contains("roles must alternate"), "{err}");

    let model = PromptModel::bundled("qwen3-vl").unwrap();

    let both = serde_json::json!({"messages": [{"role": "user", "content": "x"}],
        "add_generation_prompt": true, "continue_final_message": true});
    assert_eq!(render(&model, &both).unwrap_err().label(), "invalid_request");
    let no_messages = serde_json::json!({"prompt": "x"});
    assert_eq!(render(&model, &no_messages).unwrap_err().label(), "invalid_request");
}
