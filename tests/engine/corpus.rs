//! The suite's chats: text, one and two images, an image in the history of a multi-turn chat, tools,
//! a long prompt. Each carries a nonce so that every run (and every engine start) stores fresh blocks.

use base64::Engine as _;
use serde_json::{json, Value};

pub fn image(file: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/images").join(file);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mime = if file.ends_with(".jpg") { "image/jpeg" } else { "image/png" };
    format!("data:{mime};base64,{}", base64::engine::general_purpose::STANDARD.encode(bytes))
}

pub fn nonce() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    format!("{:x}-{}", t, N.fetch_add(1, Ordering::Relaxed))
}

fn part(url: &str) -> Value {
    json!({ "type": "image_url", "image_url": { "url": url } })
}

fn text(t: &str) -> Value {
    json!({ "type": "text", "text": t })
}

pub fn body(model: &str, messages: Value, extra: &[(&str, Value)]) -> Vec<u8> {
    let mut b = json!({ "model": model, "messages": messages, "max_tokens": 2, "temperature": 0 });
    for (k, v) in extra {
        b[*k] = v.clone();
    }
    serde_json::to_vec(&b).unwrap()
}

/// `(name, body)` of every chat of the corpus, for `model`.
pub fn chats(model: &str) -> Vec<(&'static str, Vec<u8>)> {
    let n = nonce();
    let long: String = (0..120).map(|i| format!("item {i} of case {n};")).collect::<Vec<_>>().join(" ");
    let tools = json!([{ "type": "function", "function": { "name": "get_weather", "description": "Weather of a city",
        "parameters": { "type": "object", "properties": { "city": { "type": "string" } }, "required": ["city"] } } }]);
    vec![
        ("text", body(model, json!([{ "role": "user", "content": format!("Case {n}: say hello in French.") }]), &[])),
        (
            "system_and_long_text",
            body(
                model,
                json!([{ "role": "system", "content": "You are terse." }, { "role": "user", "content": long }]),
                &[],
            ),
        ),
        (
            "one_image",
            body(
                model,
                json!([{ "role": "user", "content": [text(&format!("Case {n}: what is this?")), part(&image("horse.png"))] }]),
                &[],
            ),
        ),
        (
            "two_images",
            body(
                model,
                json!([{ "role": "user", "content": [
                    part(&image("red.jpg")), text(&format!("Case {n}: compare with")), part(&image("grace_hopper.jpg"))] }]),
                &[],
            ),
        ),
        (
            "image_in_history",
            body(
                model,
                json!([
                    { "role": "user", "content": [part(&image("chelsea.png")), text(&format!("Case {n}: name the animal."))] },
                    { "role": "assistant", "content": "A cat." },
                    { "role": "user", "content": "And its colour?" }
                ]),
                &[],
            ),
        ),
        (
            "tools",
            body(
                model,
                json!([{ "role": "user", "content": format!("Case {n}: weather in Paris?") }]),
                &[("tools", tools), ("tool_choice", json!("none"))],
            ),
        ),
    ]
}
