//! Seeded multimodal chat workload generator (`mmrouter workload`).
//!
//! Writes a JSONL file, one request per line:
//! `{"path": "/v1/chat/completions", "conversation": 3, "turn": 1, "body": {…OpenAI chat request…}}`.
//! The same options and seed always produce the same bytes.
//!
//! Shape of the default (`--shape mixed`) workload, chosen to exercise KV-aware routing of images:
//! * `--conversations` multi-turn conversations of `--turns` turns. Each request carries the whole
//!   history (system prompt, earlier user turns, synthetic assistant answers), so turn k+1 extends
//!   turn k's prompt, as real clients resend it.
//! * A few long shared system prompts (several hundred tokens each; [`super::texts`]).
//! * The first user turn carries 1–`--max-images` images (uniform); later turns are text only but
//!   keep the first turn's images in the history.
//! * round(`--fallback-fraction` × all images) of the images, at random, are photos of 24–34 MP
//!   ([`FALLBACK_MIN_PIXELS`] and up): a worker serves them, and a router whose `media.max_pixels` is
//!   below that (`bench/run.sh` sets 16 MP) does not account them, so its text-prefix fallback runs on
//!   requests a real worker answers (an image the engine itself refuses would only measure a 400).
//!   Each other image is, with probability `--shared-image-fraction`, one of a shared pool (every
//!   real photo from `--images-dir` plus `--shared-pool` synthetic camera images) reused across
//!   conversations; otherwise a synthetic image unique to this conversation.
//! * Synthetic images are small valid PNGs with realistic camera geometries (4032×3024, 1920×1080,
//!   …): only their header and bytes matter to the router and the simulator.
//! * With probability `--same-text-fraction` a conversation's first question is one of a few common
//!   texts, so several requests have the same text and different images.
//! * Lines interleave conversations at random while keeping each conversation's turns in order;
//!   the load generator preserves that per-conversation order.
//!
//! `--shape text` and `--shape single-image` write `--conversations` identical one-turn requests
//! (a short text chat, or one incompressible PNG of about `--image-bytes` bytes): what a router sees
//! when every request repeats (its caches hit). Real traffic is new text, which the other shapes write:
//! * `--shape unique-text`: `--conversations` one-shot prompts of about `--prompt-tokens` tokens of
//!   prose, every one different (no shared system prompt either).
//! * `--shape multi-turn`: `--conversations` text conversations of `--turns` turns behind a shared
//!   system prompt; each request resends the history and adds one new turn (the previous answer and a
//!   new user message, about `--turn-tokens` new tokens in all; the first turn's user message alone).
//!
//! `--shape shared-images` isolates image reuse from text reuse: `--conversations` one-turn requests,
//! each a system prompt of its own (about `--turn-tokens` tokens of prose), then one of `--images`
//! images, then a question of its own, so no two requests share text before the image (at most the
//! chat template's first few tokens, less than a KV block) while each image is asked about by about
//! `--conversations` / `--images` of them. The images are the `--images-dir` photos (path order, at
//! most `--images`) completed with synthetic camera images; every image gets the same number of
//! requests (±1), in a seeded random order, so the same image recurs throughout the run.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::fs;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use base64::Engine;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use super::error::LoadgenError;
use super::png;
use super::texts;

/// Which kind of workload to write.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WorkloadShape {
    /// Multi-turn multimodal conversations (the module doc).
    #[default]
    Mixed,
    /// Identical one-turn text chats.
    Text,
    /// Identical one-turn chats with one image of about `--image-bytes`.
    SingleImage,
    /// One-shot prompts of about `--prompt-tokens` tokens, every one different.
    UniqueText,
    /// Text conversations resending their history, one new turn of about `--turn-tokens` per request.
    MultiTurn,
    /// One-turn requests about `--images` shared images, each with its own system prompt and question.
    SharedImages,
}

/// Options of `mmrouter workload`.
#[derive(clap::Args, Clone, Debug)]
pub struct WorkloadOptions {
    /// RNG seed: the same options and seed give the same file.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Number of conversations (or of requests for the one-turn shapes).
    #[arg(long, default_value_t = 32)]
    pub conversations: usize,
    /// Turns per conversation.
    #[arg(long, default_value_t = 3)]
    pub turns: usize,
    /// Directory of real photos (PNG/JPEG/WebP) added to the shared image pool.
    #[arg(long)]
    pub images_dir: Option<PathBuf>,
    /// Output JSONL file.
    #[arg(long)]
    pub out: PathBuf,
    /// Fraction of images above a router pixel limit (24–34 MP photos; see the module doc).
    #[arg(long, default_value_t = 0.1)]
    pub fallback_fraction: f64,
    /// Fraction of (accountable) images drawn from the pool shared across conversations.
    #[arg(long, default_value_t = 0.3)]
    pub shared_image_fraction: f64,
    /// Fraction of conversations whose first question is a text shared with others.
    #[arg(long, default_value_t = 0.25)]
    pub same_text_fraction: f64,
    /// Synthetic images in the shared pool (besides the real photos).
    #[arg(long, default_value_t = 4)]
    pub shared_pool: usize,
    /// Most images on a first turn (at least 1).
    #[arg(long, default_value_t = 3)]
    pub max_images: usize,
    /// `model` of every request.
    #[arg(long, default_value = "qwen3-vl")]
    pub model: String,
    /// `max_tokens` of every request.
    #[arg(long, default_value_t = 32)]
    pub max_tokens: u32,
    /// Send non-streaming requests (default: `stream: true` with usage in the last chunk).
    #[arg(long)]
    pub no_stream: bool,
    /// Workload shape.
    #[arg(long, value_enum, default_value_t)]
    pub shape: WorkloadShape,
    /// Approximate PNG size of the `single-image` shape.
    #[arg(long, default_value_t = 150_000)]
    pub image_bytes: usize,
    /// Approximate prompt length (tokens) of the `unique-text` shape.
    #[arg(long, default_value_t = 2000)]
    pub prompt_tokens: usize,
    /// Approximate new tokens per request of the `multi-turn` shape (the system prompt of each
    /// `shared-images` request).
    #[arg(long, default_value_t = 200)]
    pub turn_tokens: usize,
    /// Distinct images of the `shared-images` shape.
    #[arg(long, default_value_t = DEFAULT_SHARED_IMAGES)]
    pub images: usize,
}

/// `--images` by default: a handful, each asked about by several requests of a default-sized run.
const DEFAULT_SHARED_IMAGES: usize = 8;

impl WorkloadOptions {
    /// Defaults for `out` (what `mmrouter workload --out FILE` gives).
    pub fn with_out(out: PathBuf) -> WorkloadOptions {
        WorkloadOptions {
            seed: 1,
            conversations: 32,
            turns: 3,
            images_dir: None,
            out,
            fallback_fraction: 0.1,
            shared_image_fraction: 0.3,
            same_text_fraction: 0.25,
            shared_pool: 4,
            max_images: 3,
            model: "qwen3-vl".into(),
            max_tokens: 32,
            no_stream: false,
            shape: WorkloadShape::Mixed,
            image_bytes: 150_000,
            prompt_tokens: 2000,
            turn_tokens: 200,
            images: DEFAULT_SHARED_IMAGES,
        }
    }

    fn validate(&self) -> Result<(), LoadgenError> {
        let fraction = |option: &'static str, v: f64| {
            if (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(LoadgenError::InvalidOption { option, reason: format!("{v} is not within 0..=1") })
            }
        };
        fraction("fallback-fraction", self.fallback_fraction)?;
        fraction("shared-image-fraction", self.shared_image_fraction)?;
        fraction("same-text-fraction", self.same_text_fraction)?;
        let positive = |option: &'static str, v: usize| {
            if v == 0 {
                Err(LoadgenError::InvalidOption { option, reason: "must be at least 1".into() })
            } else {
                Ok(())
            }
        };
        positive("conversations", self.conversations)?;
        positive("turns", self.turns)?;
        positive("max-images", self.max_images)?;
        positive("prompt-tokens", self.prompt_tokens)?;
        positive("turn-tokens", self.turn_tokens)?;
        positive("images", self.images)?;
        if self.image_bytes > 64 << 20 {
            return Err(LoadgenError::InvalidOption {
                option: "image-bytes",
                reason: format!("{} exceeds 64 MiB", self.image_bytes),
            });
        }
        Ok(())
    }
}

/// Writes the workload file `opts.out`; returns the number of requests written.
pub fn generate_workload(opts: &WorkloadOptions) -> anyhow::Result<usize> {
    Ok(generate(opts)?)
}

fn generate(opts: &WorkloadOptions) -> Result<usize, LoadgenError> {
    opts.validate()?;
    let lines = match opts.shape {
        WorkloadShape::Mixed => mixed(opts)?,
        WorkloadShape::Text | WorkloadShape::SingleImage => one_turn(opts),
        WorkloadShape::UniqueText => unique_text(opts),
        WorkloadShape::MultiTurn => multi_turn(opts),
        WorkloadShape::SharedImages => shared_images(opts)?,
    };
    let write_err = |source| LoadgenError::Write { path: opts.out.clone(), source };
    let file = fs::File::create(&opts.out).map_err(write_err)?;
    let mut w = BufWriter::new(file);
    for line in &lines {
        serde_json::to_writer(&mut w, line).map_err(|e| write_err(e.into()))?;
        w.write_all(b"\n").map_err(write_err)?;
    }
    w.flush().map_err(write_err)?;
    Ok(lines.len())
}

/// Camera geometries of synthetic images (landscape and portrait phones, webcams, screenshots).
const CAMERA_GEOMETRIES: &[(u32, u32)] = &[
    (4032, 3024),
    (3024, 4032),
    (1920, 1080),
    (1080, 1920),
    (1280, 720),
    (1024, 768),
    (2048, 1536),
    (800, 600),
    (640, 480),
];

/// Geometries of the fallback images: a 24 MP camera both ways up and a 34 MP panorama. Every
/// camera geometry above stays below [`FALLBACK_MIN_PIXELS`].
const FALLBACK_GEOMETRIES: &[(u32, u32)] = &[(6000, 4000), (4000, 6000), (8192, 4096)];

/// The fewest pixels of a fallback image: a router limit `media.max_pixels` below this makes them fall back.
pub const FALLBACK_MIN_PIXELS: u64 = 24_000_000;

fn data_url(mime: &str, bytes: &[u8]) -> String {
    format!("data:{mime};base64,{}", base64::engine::general_purpose::STANDARD.encode(bytes))
}

fn random_rgb(rng: &mut StdRng) -> [u8; 3] {
    [rng.random(), rng.random(), rng.random()]
}

/// A data URL of a synthetic PNG with one of `geometries`.
fn synthetic(rng: &mut StdRng, geometries: &[(u32, u32)], tag: &str) -> String {
    let (w, h) = geometries[rng.random_range(0..geometries.len())];
    data_url("image/png", &png::solid(w, h, random_rgb(rng), tag))
}

/// Data URLs of the PNG/JPEG/WebP files of `dir`, in path order.
fn real_photos(dir: &Path) -> Result<Vec<String>, LoadgenError> {
    let read_err = |source| LoadgenError::Read { path: dir.to_path_buf(), source };
    let mut files = BTreeMap::new();
    for entry in fs::read_dir(dir).map_err(read_err)? {
        let path = entry.map_err(read_err)?.path();
        let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
        let mime = match ext.as_deref() {
            Some("png") => "image/png",
            Some("jpg" | "jpeg") => "image/jpeg",
            Some("webp") => "image/webp",
            _ => continue,
        };
        // Sorted by path so the pool order (and so the workload) does not depend on the directory order.
        files.insert(path, mime);
    }
    if files.is_empty() {
        return Err(LoadgenError::NoImages { path: dir.to_path_buf() });
    }
    files
        .into_iter()
        .map(|(path, mime)| {
            let bytes = fs::read(&path).map_err(|source| LoadgenError::Read { path: path.clone(), source })?;
            Ok(data_url(mime, &bytes))
        })
        .collect()
}

fn line(conversation: usize, turn: usize, body: Value) -> Value {
    json!({"path": "/v1/chat/completions", "conversation": conversation, "turn": turn, "body": body})
}

fn body(opts: &WorkloadOptions, messages: Value) -> Value {
    let mut b = json!({
        "model": opts.model,
        "messages": messages,
        "max_tokens": opts.max_tokens,
        "temperature": 0,
    });
    if !opts.no_stream {
        b["stream"] = json!(true);
        b["stream_options"] = json!({"include_usage": true});
    }
    b
}

fn pick<'a>(rng: &mut StdRng, items: &[&'a str]) -> &'a str {
    items[rng.random_range(0..items.len())]
}

fn mixed(opts: &WorkloadOptions) -> Result<Vec<Value>, LoadgenError> {
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let mut pool = match &opts.images_dir {
        Some(dir) => real_photos(dir)?,
        None => Vec::new(),
    };
    for i in 0..opts.shared_pool {
        pool.push(synthetic(&mut rng, CAMERA_GEOMETRIES, &format!("seed {} shared {i}", opts.seed)));
    }

    // Exactly round(fraction × images) fallback images at random slots, so that small benchmark
    // workloads still exercise the fallback path as often as asked.
    let n_images: Vec<usize> = (0..opts.conversations).map(|_| rng.random_range(1..=opts.max_images)).collect();
    let total: usize = n_images.iter().sum();
    let n_fallback = ((opts.fallback_fraction * total as f64).round() as usize).min(total);
    let fallback: HashSet<usize> = rand::seq::index::sample(&mut rng, total, n_fallback).into_iter().collect();

    // Each conversation's requests in turn order, built first; then interleaved.
    let mut conversations: Vec<VecDeque<Value>> = Vec::with_capacity(opts.conversations);
    let mut slot = 0usize;
    for (conv, &n_images) in n_images.iter().enumerate() {
        let system = pick(&mut rng, texts::SYSTEM_PROMPTS);
        let mut content = Vec::with_capacity(n_images + 1);
        for i in 0..n_images {
            let tag = format!("seed {} conversation {conv} image {i}", opts.seed);
            let is_fallback = fallback.contains(&slot);
            slot += 1;
            let url = if is_fallback {
                synthetic(&mut rng, FALLBACK_GEOMETRIES, &tag)
            } else if !pool.is_empty() && rng.random_bool(opts.shared_image_fraction) {
                pool[rng.random_range(0..pool.len())].clone()
            } else {
                synthetic(&mut rng, CAMERA_GEOMETRIES, &tag)
            };
            content.push(json!({"type": "image_url", "image_url": {"url": url}}));
        }
        let question = if rng.random_bool(opts.same_text_fraction) {
            pick(&mut rng, texts::COMMON_QUESTIONS).to_string()
        } else {
            let q = pick(&mut rng, texts::QUESTIONS);
            let d = pick(&mut rng, texts::DETAILS);
            format!("{q} ({d}; case {conv:04}-{:04})", rng.random_range(0..10_000u32))
        };
        content.push(json!({"type": "text", "text": question}));

        let mut messages =
            vec![json!({"role": "system", "content": system}), json!({"role": "user", "content": content})];
        let mut turns = VecDeque::with_capacity(opts.turns);
        for turn in 0..opts.turns {
            if turn > 0 {
                let n = rng.random_range(2..=5);
                let answer: Vec<&str> = (0..n).map(|_| pick(&mut rng, texts::ANSWER_SENTENCES)).collect();
                messages.push(json!({"role": "assistant", "content": answer.join(" ")}));
                messages.push(json!({"role": "user", "content": pick(&mut rng, texts::FOLLOW_UPS)}));
            }
            turns.push_back(line(conv, turn, body(opts, Value::Array(messages.clone()))));
        }
        conversations.push(turns);
    }

    Ok(interleave(&mut rng, conversations))
}

/// The conversations' lines interleaved at random, each conversation's in order.
fn interleave(rng: &mut StdRng, mut conversations: Vec<VecDeque<Value>>) -> Vec<Value> {
    let mut out = Vec::with_capacity(conversations.iter().map(VecDeque::len).sum());
    let mut active: Vec<usize> = (0..conversations.len()).collect();
    while !active.is_empty() {
        let slot = rng.random_range(0..active.len());
        let conv = active[slot];
        match conversations[conv].pop_front() {
            Some(l) => out.push(l),
            None => {
                active.swap_remove(slot);
            }
        }
    }
    out
}

fn one_turn(opts: &WorkloadOptions) -> Vec<Value> {
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let text = "Describe this in one short sentence.";
    let content = match opts.shape {
        WorkloadShape::SingleImage => {
            // Square RGB noise: about 3 bytes per pixel after (failed) compression.
            let side = ((opts.image_bytes / 3) as f64).sqrt().max(1.0) as u32;
            let url = data_url("image/png", &png::noise(side, side, &mut rng));
            json!([{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}])
        }
        _ => json!(text),
    };
    let messages = json!([
        {"role": "system", "content": texts::SYSTEM_PROMPTS[0]},
        {"role": "user", "content": content},
    ]);
    let b = body(opts, messages);
    (0..opts.conversations).map(|i| line(i, 0, b.clone())).collect()
}

fn unique_text(opts: &WorkloadOptions) -> Vec<Value> {
    let mut rng = StdRng::seed_from_u64(opts.seed);
    (0..opts.conversations)
        .map(|i| {
            let messages = json!([{"role": "user", "content": texts::prose(&mut rng, opts.prompt_tokens)}]);
            line(i, 0, body(opts, messages))
        })
        .collect()
}

fn multi_turn(opts: &WorkloadOptions) -> Vec<Value> {
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let conversations = (0..opts.conversations)
        .map(|conv| {
            let system = pick(&mut rng, texts::SYSTEM_PROMPTS);
            let first = texts::prose(&mut rng, opts.turn_tokens);
            let mut messages =
                vec![json!({"role": "system", "content": system}), json!({"role": "user", "content": first})];
            let mut turns = VecDeque::with_capacity(opts.turns);
            for turn in 0..opts.turns {
                if turn > 0 {
                    let half = (opts.turn_tokens / 2).max(1);
                    messages.push(json!({"role": "assistant", "content": texts::prose(&mut rng, half)}));
                    messages.push(json!({"role": "user", "content": texts::prose(&mut rng, half)}));
                }
                turns.push_back(line(conv, turn, body(opts, Value::Array(messages.clone()))));
            }
            turns
        })
        .collect();
    interleave(&mut rng, conversations)
}

/// `--shape shared-images` (the module doc).
fn shared_images(opts: &WorkloadOptions) -> Result<Vec<Value>, LoadgenError> {
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let images = image_set(opts, &mut rng)?;
    // Every image equally often (±1), shuffled: recurrences spread over the whole run.
    let mut order: Vec<usize> = (0..opts.conversations).map(|i| i % images.len()).collect();
    rand::seq::SliceRandom::shuffle(order.as_mut_slice(), &mut rng);
    let lines = order
        .into_iter()
        .enumerate()
        .map(|(i, image)| {
            let system = texts::prose(&mut rng, opts.turn_tokens);
            let question =
                format!("{} ({}; request {i:05})", pick(&mut rng, texts::QUESTIONS), pick(&mut rng, texts::DETAILS));
            let content = json!([
                {"type": "image_url", "image_url": {"url": images[image]}},
                {"type": "text", "text": question},
            ]);
            let messages = json!([{"role": "system", "content": system}, {"role": "user", "content": content}]);
            line(i, 0, body(opts, messages))
        })
        .collect();
    Ok(lines)
}

/// The `shared-images` images: the `--images-dir` photos, then synthetic camera images, `--images` in all.
fn image_set(opts: &WorkloadOptions, rng: &mut StdRng) -> Result<Vec<String>, LoadgenError> {
    let mut images = match &opts.images_dir {
        Some(dir) => real_photos(dir)?,
        None => Vec::new(),
    };
    images.truncate(opts.images);
    for i in images.len()..opts.images {
        images.push(synthetic(rng, CAMERA_GEOMETRIES, &format!("seed {} shared image {i}", opts.seed)));
    }
    Ok(images)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_validated() {
        let mut o = WorkloadOptions::with_out("x".into());
        o.fallback_fraction = 1.5;
        assert_eq!(generate(&o).map_err(|e| e.label()).err(), Some("invalid_option"));
        let mut o = WorkloadOptions::with_out("x".into());
        o.turns = 0;
        assert_eq!(generate(&o).map_err(|e| e.label()).err(), Some("invalid_option"));
    }

    #[test]
    fn empty_images_dir_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut o = WorkloadOptions::with_out(dir.path().join("w.jsonl"));
        o.images_dir = Some(dir.path().to_path_buf());
        assert_eq!(generate(&o).map_err(|e| e.label()).err(), Some("no_images"));
    }

    #[test]
    fn single_image_shape_has_about_the_asked_size() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut o = WorkloadOptions::with_out(dir.path().join("w.jsonl"));
        o.shape = WorkloadShape::SingleImage;
        o.conversations = 2;
        let lines = generated(&o);
        assert_eq!(lines.len(), 2);
        let url = lines[0]["body"]["messages"][1]["content"][0]["image_url"]["url"].as_str().expect("url");
        let b64 = url.strip_prefix("data:image/png;base64,").expect("png data url");
        let bytes = base64::engine::general_purpose::STANDARD.decode(b64).expect("base64");
        assert!((145_000..160_000).contains(&bytes.len()), "{} bytes", bytes.len());
        assert_eq!(lines[0]["body"], lines[1]["body"]);
    }

    /// Generates `o`'s file and returns its lines.
    fn generated(o: &WorkloadOptions) -> Vec<Value> {
        generate(o).expect("generate");
        let text = fs::read_to_string(&o.out).expect("read");
        text.lines().map(|l| serde_json::from_str(l).expect("json")).collect()
    }

    fn qwen() -> mmrouter_tokenize::FastTokenizer {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/models/qwen-tokenizer.json.gz");
        let gz = fs::read(path).expect("bundled tokenizer");
        let mut json = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut json).expect("gunzip");
        mmrouter_tokenize::FastTokenizer::from_json(&json).expect("qwen tokenizer")
    }

    #[test]
    fn unique_text_has_about_the_asked_tokens_and_never_repeats() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tok = qwen();
        for target in [500, 2000, 8000] {
            let mut o = WorkloadOptions::with_out(dir.path().join(format!("u{target}.jsonl")));
            o.shape = WorkloadShape::UniqueText;
            o.conversations = 20;
            o.prompt_tokens = target;
            let lines = generated(&o);
            let texts: Vec<&str> =
                lines.iter().map(|l| l["body"]["messages"][0]["content"].as_str().expect("one user message")).collect();
            let distinct: HashSet<&str> = texts.iter().copied().collect();
            assert_eq!(distinct.len(), texts.len(), "every prompt differs");
            let mean = texts.iter().map(|t| tok.encode(t).len()).sum::<usize>() as f64 / texts.len() as f64;
            assert!((mean / target as f64 - 1.0).abs() < 0.1, "{target}: mean {mean} tokens");
        }
    }

    #[test]
    fn shared_images_share_images_but_no_text_before_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut o = WorkloadOptions::with_out(dir.path().join("s.jsonl"));
        o.shape = WorkloadShape::SharedImages;
        o.conversations = 40;
        o.images = 5;
        let lines = generated(&o);
        assert_eq!(lines.len(), 40);
        let mut per_image: BTreeMap<String, usize> = BTreeMap::new();
        let (mut systems, mut questions) = (HashSet::new(), HashSet::new());
        for (i, l) in lines.iter().enumerate() {
            assert_eq!((l["conversation"].as_u64(), l["turn"].as_u64()), (Some(i as u64), Some(0)));
            let messages = l["body"]["messages"].as_array().expect("messages");
            assert_eq!(messages.len(), 2);
            let parts = messages[1]["content"].as_array().expect("parts");
            assert_eq!((parts[0]["type"].as_str(), parts[1]["type"].as_str()), (Some("image_url"), Some("text")));
            *per_image.entry(parts[0]["image_url"]["url"].as_str().expect("url").to_owned()).or_default() += 1;
            systems.insert(messages[0]["content"].as_str().expect("system").to_owned());
            questions.insert(parts[1]["text"].as_str().expect("question").to_owned());
        }
        assert_eq!(per_image.len(), 5);
        assert!(per_image.values().all(|&n| n == 8), "{:?}", per_image.values().collect::<Vec<_>>());
        assert_eq!((systems.len(), questions.len()), (40, 40), "every request's text is its own");
        // Distinct from their first words on: no text prefix is shared before the image.
        let starts: HashSet<String> =
            systems.iter().map(|s| s.split_whitespace().take(4).collect::<Vec<_>>().join(" ")).collect();
        assert_eq!(starts.len(), 40);
    }

    #[test]
    fn shared_images_recur_across_the_run() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut o = WorkloadOptions::with_out(dir.path().join("s.jsonl"));
        o.shape = WorkloadShape::SharedImages;
        o.conversations = 60;
        o.images = 3;
        let urls: Vec<String> = generated(&o)
            .iter()
            .map(|l| l["body"]["messages"][1]["content"][0]["image_url"]["url"].as_str().expect("url").to_owned())
            .collect();
        // Every image appears in each third of the run, not in one block.
        for third in urls.chunks(20) {
            let distinct: HashSet<&String> = third.iter().collect();
            assert_eq!(distinct.len(), 3);
        }
        let again: Vec<Value> = generated(&o);
        let again: Vec<&str> = again
            .iter()
            .map(|l| l["body"]["messages"][1]["content"][0]["image_url"]["url"].as_str().expect("url"))
            .collect();
        assert_eq!(again, urls, "the seed decides");
        o.images = 0;
        assert_eq!(generate(&o).map_err(|e| e.to_string()).err().as_deref(), Some("--images: must be at least 1"));
    }

    #[test]
    fn multi_turn_resends_history_with_one_new_turn() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut o = WorkloadOptions::with_out(dir.path().join("m.jsonl"));
        o.shape = WorkloadShape::MultiTurn;
        o.conversations = 3;
        o.turns = 4;
        let lines = generated(&o);
        assert_eq!(lines.len(), 12);
        let tok = qwen();
        for conv in 0..3 {
            let turns: Vec<&Value> = lines.iter().filter(|l| l["conversation"] == conv).collect();
            for (k, pair) in turns.windows(2).enumerate() {
                assert_eq!(pair[0]["turn"], k, "in order");
                let (before, after) = (pair[0]["body"]["messages"].as_array(), pair[1]["body"]["messages"].as_array());
                let (before, after) = (before.expect("messages"), after.expect("messages"));
                assert_eq!(&after[..before.len()], &before[..], "history resent unchanged");
                assert_eq!(after.len(), before.len() + 2);
                let new: usize =
                    after[before.len()..].iter().map(|m| tok.encode(m["content"].as_str().expect("text")).len()).sum();
                assert!((170..=230).contains(&new), "one new turn of ~200 tokens: {new}");
            }
        }
    }
}
