//! Runs one per-request operation N times, for counting its CPU instructions deterministically with
//! callgrind (criterion's wall-clock figures swing ±30 % on a shared 2-core machine):
//!
//! ```sh
//! cargo build --release -p mmrouter-core --example plan_cost
//! for n in 100 200; do valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/examples/plan_cost image_chat $n 2>&1 | grep refs; done
//! ```
//! Instructions per request = (refs(200) − refs(100)) / 100, which cancels the start-up cost.
//! Operations: `parse_image_chat`, `text_chat`, `image_chat` (parse + `Pipeline::plan`), `select`.

use base64::Engine;
use mmrouter_core::media::MediaConfig;
use mmrouter_core::model::{ModelSource, ModelSpec};
use mmrouter_core::pipeline::{Pipeline, PipelineConfig};
use mmrouter_core::request::{Endpoint, Request};
use mmrouter_core::routing::{Router, RoutingConfig, SelectRequest, WorkerSpec};

fn chat(parts: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "model": "Qwen/Qwen3-VL-8B-Instruct",
        "messages": [
            {"role": "system", "content": "You are a careful visual assistant."},
            {"role": "user", "content": parts}
        ]
    }))
    .unwrap()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let op = args.next().unwrap_or_else(|| "text_chat".into());
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(100);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let photo = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/images/rocket.jpg")).unwrap();
    let url = format!("data:image/jpeg;base64,{}", base64::engine::general_purpose::STANDARD.encode(&photo));
    let text = "The quick brown fox jumps over the lazy dog while the router plans its prompt. ".repeat(25);
    let image_body =
        chat(serde_json::json!([{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]));
    let text_body = chat(serde_json::json!(text));
    let cfg = PipelineConfig { model: ModelSpec::new(ModelSource::Bundled("qwen3-vl")), media: MediaConfig::default() };
    let pipeline = Pipeline::new(&cfg).unwrap();
    let specs = (0..8).map(|i| WorkerSpec::new(format!("w{i}"), format!("http://127.0.0.1:{}", 9000 + i)));
    let router = Router::new(RoutingConfig::default(), specs.collect()).unwrap();
    let blocks: Vec<u64> = (0..400u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect();
    router.record(3, &blocks);
    let mut sink = 0usize;
    for _ in 0..n {
        sink += match op.as_str() {
            "parse_image_chat" => Request::parse(Endpoint::Chat, &image_body).unwrap().images.len(),
            "text_chat" | "image_chat" => {
                let body = if op == "text_chat" { &text_body } else { &image_body };
                let request = Request::parse(Endpoint::Chat, body).unwrap();
                rt.block_on(pipeline.plan(&request)).unwrap().plan.blocks.len()
            }
            "select" => {
                let req = SelectRequest {
                    blocks: &blocks,
                    block_size: 16,
                    prompt_tokens: 6400,
                    decode_tokens: 256,
                    images: Vec::new(),
                    unseen: false,
                };
                router.select(&req).map_or(0, |d| d.worker())
            }
            other => panic!("unknown operation {other}"),
        };
    }
    println!("{op} x{n}: {sink}");
}
