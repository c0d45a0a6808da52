//! Per-script encoding throughput of `mmrouter-tokenize` and `tokenizers` (a quick diagnostic; the
//! benchmark of record is `cargo bench --bench encode`).
//!
//! `cargo run --release --example throughput [KB per document] [documents per kind]`

#[path = "../tests/tokenize/common/corpus.rs"]
mod corpus;

use std::io::Read;
use std::time::Instant;

type Gen = fn(&mut corpus::Rng, &mut String);

fn main() {
    let gz = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/models/qwen-tokenizer.json.gz")).unwrap();
    let mut json = Vec::new();
    flate2::read::GzDecoder::new(&gz[..]).read_to_end(&mut json).unwrap();
    let t = Instant::now();
    let fast = mmrouter_tokenize::FastTokenizer::from_json(&json).unwrap();
    let fast_load = t.elapsed();
    let t = Instant::now();
    let hf = tokenizers::Tokenizer::from_bytes(&json).unwrap();
    println!("load: mmrouter-tokenize {fast_load:?}, tokenizers {:?}", t.elapsed());
    let kb: usize = std::env::args().nth(1).and_then(|v| v.parse().ok()).unwrap_or(10);
    let n_docs: usize = std::env::args().nth(2).and_then(|v| v.parse().ok()).unwrap_or(200);
    let kinds: [(&str, Gen); 7] = [
        ("prose", corpus::prose),
        ("code", corpus::code),
        ("cjk", corpus::cjk),
        ("scripts", corpus::other_script),
        ("emoji", corpus::emoji),
        ("non-nfc", corpus::non_nfc),
        ("junk", corpus::junk),
    ];
    for (name, gen) in kinds {
        let mut r = corpus::Rng::new(9);
        let docs: Vec<String> = (0..n_docs)
            .map(|_| {
                let mut s = String::new();
                while s.len() < kb * 1000 {
                    gen(&mut r, &mut s);
                }
                s
            })
            .collect();
        let bytes: usize = docs.iter().map(String::len).sum();
        let t = Instant::now();
        let mut tokens = 0;
        let mut out = Vec::new();
        for d in &docs {
            out.clear();
            fast.encode_into(d, &mut out);
            tokens += out.len();
        }
        let tf = t.elapsed();
        let t = Instant::now();
        for d in &docs {
            std::hint::black_box(hf.encode_fast(d.as_str(), false).unwrap());
        }
        let th = t.elapsed();
        println!(
            "{name:8} {:5.2} bytes/token  mmrouter-tokenize {:6.2} M tok/s ({:5.0} ns/tok)  tokenizers {:5.3} M tok/s  ratio {:5.1}x",
            bytes as f64 / tokens as f64,
            tokens as f64 / tf.as_secs_f64() / 1e6,
            tf.as_nanos() as f64 / tokens as f64,
            tokens as f64 / th.as_secs_f64() / 1e6,
            th.as_secs_f64() / tf.as_secs_f64()
        );
    }
}
