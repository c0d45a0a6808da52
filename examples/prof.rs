use std::time::Instant;
fn main() {
    let model = mmrouter::prompt::PromptModel::bundled("qwen3-vl").unwrap();
    let text = "The quick brown fox jumps over the lazy dog while the router plans its prompt. ".repeat(25);
    let req = serde_json::json!({"model":"m","messages":[{"role":"system","content":"You are a careful visual assistant."},{"role":"user","content":text}]});
    let n = 2000;
    let t = Instant::now(); let mut s = String::new();
    for _ in 0..n { s = model.render_chat(&req).unwrap(); }
    println!("render {:?}", t.elapsed() / n);
    let t = Instant::now(); let mut ids = vec![];
    for _ in 0..n { ids = model.encode(&s).unwrap(); }
    println!("encode {:?} ({} tokens)", t.elapsed() / n, ids.len());
    let photo = std::fs::read("tests/fixtures/images/rocket.jpg").unwrap();
    let t = Instant::now();
    for _ in 0..n { std::hint::black_box(imagesize::blob_size(&photo[..65536.min(photo.len())]).ok()); }
    println!("imagesize {:?} -> {:?}", t.elapsed() / n, imagesize::blob_size(&photo[..65536]));
    use base64::Engine;
    let url = base64::engine::general_purpose::STANDARD.encode(&photo);
    let t = Instant::now();
    for _ in 0..n { std::hint::black_box(base64::engine::general_purpose::STANDARD.decode(&url).unwrap()); }
    println!("b64 {:?}", t.elapsed() / n);
    let durl = format!("data:image/jpeg;base64,{url}");
    let t = Instant::now();
    for _ in 0..n { std::hint::black_box(mmrouter::media::decode_data_url(&durl, 1<<24).unwrap()); }
    println!("decode_data_url {:?}", t.elapsed() / n);
    let cfg = mmrouter::media::MediaConfig::default();
    let t = Instant::now();
    for _ in 0..200 { std::hint::black_box(mmrouter::media::probe_bytes(&photo, &cfg).unwrap()); }
    println!("probe_bytes {:?}", t.elapsed() / 200);
}
