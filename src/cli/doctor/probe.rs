//! The doctor's built-in probe chats: plain text, one image, and tools — each unique to the run (a
//! nonce leads the user turn), so the worker stores fresh blocks and publishes them.

use base64::Engine as _;
use serde_json::{json, Value};

/// A small real photograph (160×120 after the Qwen processors' resize rules: a few hundred tokens).
const PROBE_IMAGE: &[u8] = include_bytes!("../../../tests/fixtures/images/horse.png");

/// One probe: its name (the suffix of its report lines) and its body, as a client sends it.
pub struct Probe {
    pub name: &'static str,
    pub body: Vec<u8>,
}

/// The probes for `model`, unique to `nonce`.
pub fn probes(model: &str, nonce: &str) -> Vec<Probe> {
    let text = format!(
        "Probe {nonce}. Summarise in one sentence why a router that knows which worker already holds a \
         prompt in its KV cache sends repeated prompts there, and what happens to latency when it does."
    );
    let image = format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(PROBE_IMAGE));
    let chat = |messages: Value, extra: &[(&str, Value)]| {
        let mut body = json!({ "model": model, "messages": messages, "max_tokens": 1, "temperature": 0 });
        for (k, v) in extra {
            body[*k] = v.clone();
        }
        serde_json::to_vec(&body).expect("a JSON value serialises")
    };
    vec![
        Probe { name: "text", body: chat(json!([{ "role": "user", "content": text }]), &[]) },
        Probe {
            name: "image",
            body: chat(
                json!([{ "role": "user", "content": [
                    { "type": "text", "text": format!("Probe {nonce}. What animal is in this picture?") },
                    { "type": "image_url", "image_url": { "url": image } },
                ]}]),
                &[],
            ),
        },
        Probe {
            name: "tools",
            body: chat(
                json!([{ "role": "user", "content": format!("Probe {nonce}. What is the weather in Paris?") }]),
                // "none": the worker renders the tools into the prompt without needing a tool-call parser.
                &[("tools", weather_tool()), ("tool_choice", json!("none"))],
            ),
        },
    ]
}

fn weather_tool() -> Value {
    json!([{ "type": "function", "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": { "type": "object", "properties": { "city": { "type": "string" } }, "required": ["city"] },
    }}])
}
