//! Token-for-token parity with vLLM, family by family, on the real chat templates, tokenizers and
//! processors (`tests/fixtures/parity/`, provenance in each `PROVENANCE.json`).
//!
//! The expected ids are vLLM's own: `tests/fixtures/parity/tools/oracle.py` posts each chat of
//! `chats.json` to vLLM 0.32's GPU-less render server (`vllm launch render`) on the family's files and
//! commits the `token_ids` the engine would prefill and each image's `mm_placeholders` range
//! (`expected/vllm/<family>.json`). Here every chat goes through the router's own pipeline (parse →
//! intake → account → plan, with tracing on): where vLLM renders the chat, the router's plan must be
//! exact and its ids and image spans equal; where vLLM rejects it, the router must not claim an exact
//! prompt — it routes by load or on a text prefix, with a reason.

use std::path::PathBuf;

use base64::Engine;
use mmrouter_core::media::MediaConfig;
use mmrouter_core::model::{ModelSource, ModelSpec};
use mmrouter_core::pipeline::{Pipeline, PipelineConfig, Planned, Route};
use mmrouter_core::prompt::PromptModel;
use mmrouter_core::request::{Endpoint, Request};
use serde_json::Value;

fn parity_dir() -> PathBuf {
    crate::fixtures().join("parity")
}

fn read_json(path: PathBuf) -> Value {
    serde_json::from_slice(&std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

/// The corpus request `name`, with each `asset:<file>` URL replaced by a data URL of that image.
fn body(name: &str) -> Vec<u8> {
    let corpus = read_json(parity_dir().join("chats.json"));
    let chat = corpus["chats"].as_array().unwrap().iter().find(|c| c["name"] == name).expect("chat in corpus");
    let mut request = chat["request"].clone();
    inline_assets(&mut request);
    serde_json::to_vec(&request).unwrap()
}

fn inline_assets(v: &mut Value) {
    match v {
        Value::String(s) if s.starts_with("asset:") => {
            let file = &s["asset:".len()..];
            let bytes = std::fs::read(crate::fixtures().join("images").join(file)).unwrap();
            let mime = match file.rsplit('.').next() {
                Some("jpg") => "image/jpeg",
                Some(ext) => &format!("image/{ext}"),
                None => "application/octet-stream",
            };
            *s = format!("data:{mime};base64,{}", base64::engine::general_purpose::STANDARD.encode(bytes));
        }
        Value::Array(items) => items.iter_mut().for_each(inline_assets),
        Value::Object(map) => map.values_mut().for_each(inline_assets),
        _ => {}
    }
}

fn pipeline(source: ModelSource) -> Pipeline {
    let cfg = PipelineConfig { model: ModelSpec::new(source), media: MediaConfig::default() };
    Pipeline::new(&cfg).expect("pipeline loads")
}

fn plan(rt: &tokio::runtime::Runtime, p: &Pipeline, body: &[u8]) -> Planned {
    let request = Request::parse(Endpoint::Chat, body).unwrap();
    rt.block_on(p.plan_with(&request, true)).expect("no policy rejection")
}

/// Checks every chat of `expected/vllm/<family>.json` against the pipeline; returns how many were exact.
fn check_family(family: &str, p: &Pipeline) -> usize {
    let expected = read_json(parity_dir().join("expected").join("vllm").join(format!("{family}.json")));
    check_expected(family, &expected, &corpus_names(), &body, p)
}

/// Checks each chat of `expected` (whose names must be `names`, in order: else the file is stale)
/// against the pipeline, the request bodies from `body`; returns how many were exact.
fn check_expected(
    family: &str,
    expected: &Value,
    names_want: &[String],
    body: &dyn Fn(&str) -> Vec<u8>,
    p: &Pipeline,
) -> usize {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let chats = expected["chats"].as_array().unwrap();
    assert_eq!(names(chats), names_want, "{family}: expected ids are stale; rerun the oracle");
    let mut failures = Vec::new();
    let mut exact = 0;
    for chat in chats {
        let name = chat["name"].as_str().unwrap();
        let planned = plan(&rt, p, &body(name));
        match check_chat(chat, &planned) {
            Ok(true) => exact += 1,
            Ok(false) => {}
            Err(why) => failures.push(format!("{name}: {why}")),
        }
    }
    assert!(failures.is_empty(), "{family}: {} chat(s) differ:\n{}", failures.len(), failures.join("\n"));
    let accepted = chats.iter().filter(|c| c["outcome"] == "ok").count();
    assert_eq!(exact, accepted, "{family}: every chat vLLM renders is exact");
    exact
}

/// `Ok(true)`: exact and equal to vLLM; `Ok(false)`: vLLM rejects it and the router does not claim it.
fn check_chat(chat: &Value, planned: &Planned) -> Result<bool, String> {
    let trace = planned.trace.as_ref().expect("trace requested");
    let plan = &planned.plan;
    if chat["outcome"] != "ok" {
        return match plan.prompt_exact {
            true => Err(format!("vLLM rejects it ({}: {}) but the plan is exact", chat["outcome"], chat["message"])),
            false => Ok(false),
        };
    }
    let want: Vec<u32> = serde_json::from_value(chat["ids"].clone()).unwrap();
    if !plan.prompt_exact || trace.ids != want {
        return Err(format!(
            "route {} exact {} ({:?})\n  got text {:?}\n  want {} ids, got {}{}",
            plan.route.label(),
            plan.prompt_exact,
            plan.reason(),
            trace.text.as_deref().unwrap_or("<none>"),
            want.len(),
            trace.ids.len(),
            first_difference(&want, &trace.ids)
        ));
    }
    let want_spans: Vec<(u64, u64)> = chat["image_spans"]
        .as_array()
        .map(|s| s.iter().map(|x| (x["offset"].as_u64().unwrap(), x["length"].as_u64().unwrap())).collect())
        .unwrap_or_default();
    let spans: Vec<(u64, u64)> = trace.spans.iter().map(|s| (u64::from(s.offset), u64::from(s.len))).collect();
    if spans != want_spans {
        return Err(format!("image spans {spans:?}, vLLM's mm_placeholders {want_spans:?}"));
    }
    let route = if want_spans.is_empty() { Route::NoMedia } else { Route::Exact };
    match plan.route == route {
        true => Ok(true),
        false => Err(format!("route {}, want {}", plan.route.label(), route.label())),
    }
}

fn names(chats: &[Value]) -> Vec<String> {
    chats.iter().map(|c| c["name"].as_str().unwrap().to_owned()).collect()
}

fn corpus_names() -> Vec<String> {
    names(read_json(parity_dir().join("chats.json"))["chats"].as_array().unwrap())
}

fn first_difference(want: &[u32], got: &[u32]) -> String {
    match want.iter().zip(got).position(|(a, b)| a != b) {
        Some(i) => format!(" (first difference at {i}: want {} got {})", want[i], got[i]),
        None => String::new(),
    }
}

#[test]
fn qwen3_vl_is_token_exact() {
    assert_bundled_template_is_published("qwen3-vl", "qwen3_vl");
    assert_eq!(check_family("qwen3_vl", &pipeline(ModelSource::Bundled("qwen3-vl"))), 46);
}

#[test]
fn qwen2_5_vl_is_token_exact() {
    assert_bundled_template_is_published("qwen2.5-vl", "qwen2_5_vl");
    assert_eq!(check_family("qwen2_5_vl", &pipeline(ModelSource::Bundled("qwen2.5-vl"))), 46);
}

#[test]
fn gemma3_is_token_exact() {
    let dir = parity_dir().join("models").join("gemma3");
    assert_eq!(check_family("gemma3", &pipeline(ModelSource::Dir(dir))), 38);
}

#[test]
fn llava_1_5_is_token_exact() {
    let dir = parity_dir().join("models").join("llava_1_5");
    assert_eq!(check_family("llava_1_5", &pipeline(ModelSource::Dir(dir))), 46);
}

#[test]
fn llama4_is_token_exact() {
    let dir = parity_dir().join("models").join("llama4");
    assert_eq!(check_family("llama4", &pipeline(ModelSource::Dir(dir))), 45);
}

#[test]
fn internvl3_is_token_exact() {
    let dir = parity_dir().join("models").join("internvl3");
    assert_eq!(check_family("internvl3", &pipeline(ModelSource::Dir(dir))), 46);
}

/// The Mistral corpus: the parity chats, then `mistral/chats_extra.json` (tool ids, role orders).
fn mistral_chats() -> Vec<Value> {
    let mut chats = read_json(parity_dir().join("chats.json"))["chats"].as_array().unwrap().clone();
    chats.extend(read_json(parity_dir().join("mistral").join("chats_extra.json"))["chats"].as_array().unwrap().clone());
    chats
}

fn mistral_body(name: &str) -> Vec<u8> {
    let chats = mistral_chats();
    let chat = chats.iter().find(|c| c["name"] == name).expect("chat in the Mistral corpus");
    let mut request = chat["request"].clone();
    inline_assets(&mut request);
    serde_json::to_vec(&request).unwrap()
}

/// A Mistral-format directory holding `tekken.json` as the oracle served it: mistral_common's
/// `tekken_240911.json`, with `meta.tokenizer`'s version and image section where they differ.
fn mistral_dir(expected: &Value) -> tempfile::TempDir {
    let gz = std::fs::read(parity_dir().join("mistral").join("tekken_240911.json.gz")).unwrap();
    let mut json = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut json).unwrap();
    let meta = &expected["meta"]["tokenizer"];
    let dir = tempfile::tempdir().unwrap();
    if meta.get("reconstructed").is_some() {
        let mut tekken: Value = serde_json::from_slice(&json).unwrap();
        tekken["config"]["version"] = meta["config"]["version"].clone();
        tekken["image"] = meta["image"].clone();
        json = serde_json::to_vec(&tekken).unwrap();
    }
    std::fs::write(dir.path().join("tekken.json"), json).unwrap();
    dir
}

fn check_mistral(family: &str) -> usize {
    let expected = read_json(parity_dir().join("mistral").join("expected").join(format!("{family}.json")));
    let dir = mistral_dir(&expected);
    // No tokenizer.json beside tekken.json: `auto` resolves to Mistral mode, as vLLM serves it.
    let p = pipeline(ModelSource::Dir(dir.path().to_path_buf()));
    check_expected(family, &expected, &names(&mistral_chats()), &mistral_body, &p)
}

#[test]
fn pixtral_12b_mistral_mode_is_token_exact() {
    assert_eq!(check_mistral("pixtral_12b"), 52);
}

#[test]
fn mistral_small_3_1_mistral_mode_is_token_exact() {
    assert_eq!(check_mistral("mistral_small_3_1"), 53);
}

/// The bundled profiles carry the checkpoints' published templates (the fixture copies, with provenance).
fn assert_bundled_template_is_published(profile: &str, family: &str) {
    let config: Value =
        serde_json::from_slice(PromptModel::bundled_file(profile, "tokenizer_config.json").unwrap()).unwrap();
    let published =
        std::fs::read_to_string(parity_dir().join("models").join(family).join("chat_template.jinja")).unwrap();
    assert_eq!(config["chat_template"].as_str(), Some(published.as_str()), "{profile}");
}

/// SmolVLM: only its template is obtainable (no tokenizer on a registry), so the rendered text is
/// checked, with the special tokens transformers passes it.
#[test]
fn smolvlm_renders_the_same_text() {
    let expected = read_json(parity_dir().join("expected").join("smolvlm.json"));
    let dir = tempfile::tempdir().unwrap();
    let template = std::fs::read(parity_dir().join("models").join("smolvlm").join("chat_template.jinja")).unwrap();
    std::fs::write(dir.path().join("chat_template.jinja"), &template).unwrap();
    // As the checkpoint ships it: the special tokens, and the same template in the tokenizer's config
    // (which vLLM uses for requests with tools).
    let mut config = expected["meta"]["special_tokens_passed_to_template"].clone();
    config["chat_template"] = String::from_utf8(template.clone()).unwrap().into();
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    std::fs::write(
        dir.path().join("tokenizer.json.gz"),
        PromptModel::bundled_file("qwen3-vl", "tokenizer.json.gz").unwrap(),
    )
    .unwrap();
    let model = PromptModel::from_dir(dir.path()).unwrap();
    let mut checked = 0;
    for chat in expected["chats"].as_array().unwrap() {
        let name = chat["name"].as_str().unwrap();
        let body = body(name);
        let rendered = model.render_chat(&Request::parse(Endpoint::Chat, &body).unwrap(), &Default::default());
        match (chat["outcome"].as_str(), rendered) {
            (Some("ok"), Ok(text)) => assert_eq!(Some(text.as_str()), chat["text"].as_str(), "{name}"),
            (Some("ok"), Err(e)) => panic!("{name}: {e}"),
            (_, Ok(text)) => panic!("{name}: vLLM rejects it but it rendered {text:?}"),
            (_, Err(_)) => {}
        }
        checked += 1;
    }
    assert_eq!(checked, 36);
}
