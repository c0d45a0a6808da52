//! Behaviour of `generate_workload`: determinism and the shape of the conversations it writes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;

use base64::Engine;
use mmrouter_loadgen::{generate_workload, WorkloadOptions};
use serde_json::Value;

fn images_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/images")
}

fn generate(dir: &tempfile::TempDir, name: &str, edit: impl FnOnce(&mut WorkloadOptions)) -> (usize, String) {
    let mut o = WorkloadOptions::with_out(dir.path().join(name));
    o.images_dir = Some(images_dir());
    edit(&mut o);
    let n = generate_workload(&o).expect("generate");
    (n, std::fs::read_to_string(&o.out).expect("read workload"))
}

fn lines(text: &str) -> Vec<Value> {
    text.lines().map(|l| serde_json::from_str(l).expect("each line is JSON")).collect()
}

/// `(width, height)` of a data-URL image, from its header.
fn dimensions(url: &str) -> (u32, u32) {
    let (_, b64) = url.split_once(";base64,").expect("base64 data url");
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).expect("base64");
    image::ImageReader::new(std::io::Cursor::new(bytes))
        .with_guessed_format()
        .expect("format")
        .into_dimensions()
        .expect("dimensions")
}

fn image_urls(message: &Value) -> Vec<String> {
    match message["content"].as_array() {
        Some(parts) => parts
            .iter()
            .filter(|p| p["type"] == "image_url")
            .map(|p| p["image_url"]["url"].as_str().expect("url string").to_string())
            .collect(),
        None => Vec::new(),
    }
}

#[test]
fn same_seed_same_file_other_seed_other_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (n1, a) = generate(&dir, "a.jsonl", |_| {});
    let (n2, b) = generate(&dir, "b.jsonl", |_| {});
    let (_, c) = generate(&dir, "c.jsonl", |o| o.seed = 2);
    assert_eq!(n1, n2);
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn conversations_have_the_promised_shape() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (n, text) = generate(&dir, "w.jsonl", |o| {
        o.conversations = 60;
        o.turns = 3;
    });
    let lines = lines(&text);
    assert_eq!(n, 180);
    assert_eq!(lines.len(), 180);

    let mut next_turn: HashMap<u64, u64> = HashMap::new();
    let mut first_images: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for l in &lines {
        assert_eq!(l["path"], "/v1/chat/completions");
        let conv = l["conversation"].as_u64().expect("conversation id");
        let turn = l["turn"].as_u64().expect("turn");
        // Turns of one conversation appear in order.
        let expected = next_turn.entry(conv).or_insert(0);
        assert_eq!(turn, *expected, "conversation {conv}");
        *expected += 1;

        let body = &l["body"];
        assert_eq!(body["model"], "qwen3-vl");
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"]["include_usage"], true);
        assert!(body["max_tokens"].as_u64().is_some());
        let messages = body["messages"].as_array().expect("messages");
        // system + (user, assistant) per earlier turn + this user turn; roles alternate.
        assert_eq!(messages.len() as u64, 2 + 2 * turn);
        assert_eq!(messages[0]["role"], "system");
        assert!(messages[0]["content"].as_str().expect("system text").len() > 1000, "long system prompt");
        for (i, m) in messages.iter().enumerate().skip(1) {
            assert_eq!(m["role"], if i % 2 == 1 { "user" } else { "assistant" });
        }
        // Images only in the first user message, kept in every later turn.
        let images = image_urls(&messages[1]);
        assert!((1..=3).contains(&images.len()), "{} images", images.len());
        assert!(messages.iter().skip(2).all(|m| image_urls(m).is_empty()));
        match first_images.get(&conv) {
            Some(first) => assert_eq!(first, &images, "conversation {conv} resends its images"),
            None => {
                first_images.insert(conv, images);
            }
        }
    }
    assert_eq!(first_images.len(), 60);

    // Fallback fraction (photos above a router pixel limit) near the default 0.1 over all first-turn images.
    let all: Vec<&String> = first_images.values().flatten().collect();
    let fallbacks = all
        .iter()
        .filter(|u| {
            let (w, h) = dimensions(u);
            u64::from(w) * u64::from(h) >= mmrouter_loadgen::FALLBACK_MIN_PIXELS
        })
        .count();
    let expected = (0.1 * all.len() as f64).round() as usize;
    assert_eq!(fallbacks, expected, "{fallbacks} of {} images are fallbacks", all.len());

    // Some images are shared across conversations, and real photos (JPEG/WebP) appear.
    let mut owners: HashMap<&String, HashSet<u64>> = HashMap::new();
    for (conv, urls) in &first_images {
        for u in urls {
            owners.entry(u).or_default().insert(*conv);
        }
    }
    assert!(owners.values().any(|c| c.len() > 1), "no image shared across conversations");
    assert!(all.iter().any(|u| u.starts_with("data:image/jpeg;") || u.starts_with("data:image/webp;")));

    // Some first questions have the same text with different images.
    let mut by_text: HashMap<String, HashSet<Vec<String>>> = HashMap::new();
    for l in lines.iter().filter(|l| l["turn"] == 0) {
        let parts = l["body"]["messages"][1]["content"].as_array().expect("parts");
        let text = parts.iter().find(|p| p["type"] == "text").expect("a text part")["text"].to_string();
        by_text.entry(text).or_default().insert(image_urls(&l["body"]["messages"][1]));
    }
    assert!(by_text.values().any(|imgs| imgs.len() > 1), "no same-text, different-image requests");
}

#[test]
fn fallback_fraction_follows_the_option() {
    let dir = tempfile::tempdir().expect("tempdir");
    let count = |fraction: f64, name: &str| {
        let (_, text) = generate(&dir, name, |o| {
            o.conversations = 80;
            o.turns = 1;
            o.fallback_fraction = fraction;
            o.images_dir = None;
        });
        let urls: Vec<String> = lines(&text).iter().flat_map(|l| image_urls(&l["body"]["messages"][1])).collect();
        let fallbacks = urls
            .iter()
            .filter(|u| {
                let (w, h) = dimensions(u);
                u64::from(w) * u64::from(h) >= mmrouter_loadgen::FALLBACK_MIN_PIXELS
            })
            .count();
        (fallbacks, urls.len())
    };
    assert_eq!(count(0.0, "none.jsonl").0, 0);
    let (all, n) = count(1.0, "all.jsonl");
    assert_eq!(all, n);
    let (half, n) = count(0.5, "half.jsonl");
    assert_eq!(half, (n as f64 / 2.0).round() as usize, "{half} of {n}");
    let (some, n) = count(0.1, "tenth.jsonl");
    assert_eq!(some, (n as f64 / 10.0).round() as usize, "{some} of {n}");
}

#[test]
fn non_streaming_option_drops_stream_fields() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, text) = generate(&dir, "w.jsonl", |o| {
        o.no_stream = true;
        o.conversations = 2;
    });
    for l in lines(&text) {
        assert!(l["body"].get("stream").is_none());
        assert!(l["body"].get("stream_options").is_none());
    }
}

/// FNV-1a (64 bit): a stable digest of a workload file without a hashing dependency.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// A change to the default options.
type Edit = fn(&mut WorkloadOptions);

/// The existing shapes write the same bytes for the same seed and options as before the
/// `shared-images` shape was added: benchmark workloads stay comparable across versions.
#[test]
fn existing_shapes_are_byte_identical_to_their_goldens() {
    use mmrouter_loadgen::WorkloadShape;
    let dir = tempfile::tempdir().expect("tempdir");
    let cases: [(&str, Edit, u64); 5] = [
        ("mixed-photos", |_| {}, 0x0ad96d01536ce432),
        ("mixed-synthetic", |o| o.images_dir = None, 0xb552071e0c97ddda),
        (
            "unique-text",
            |o| {
                o.shape = WorkloadShape::UniqueText;
                o.conversations = 4;
            },
            0x398a7c47526d4dfc,
        ),
        (
            "multi-turn",
            |o| {
                o.shape = WorkloadShape::MultiTurn;
                o.conversations = 3;
            },
            0xe6375e54d3f14e24,
        ),
        (
            "single-image",
            |o| {
                o.shape = WorkloadShape::SingleImage;
                o.conversations = 2;
                o.image_bytes = 3000;
            },
            0xb2f18c3852c3b684,
        ),
    ];
    let mut got = Vec::new();
    for (name, edit, _) in cases {
        let (_, text) = generate(&dir, &format!("{name}.jsonl"), edit);
        got.push((name, fnv1a(text.as_bytes())));
    }
    let expected: Vec<(&str, u64)> = cases.iter().map(|(name, _, digest)| (*name, *digest)).collect();
    assert_eq!(got, expected);
    // Readable anchors of the default workload's first line, should a digest ever need explaining.
    let (_, text) = generate(&dir, "anchor.jsonl", |_| {});
    let first: Value = serde_json::from_str(text.lines().next().expect("a line")).expect("json");
    assert_eq!((first["conversation"].as_u64(), first["turn"].as_u64()), (Some(22), Some(0)));
    let question = &first["body"]["messages"][1]["content"][1]["text"];
    assert_eq!(question, "What is in this picture? Describe it in detail.");
}

#[test]
fn shared_images_use_the_photos_then_synthetic_camera_images() {
    use mmrouter_loadgen::WorkloadShape;
    let dir = tempfile::tempdir().expect("tempdir");
    let photos = std::fs::read_dir(images_dir())
        .expect("fixtures")
        .filter(|e| {
            let name = e.as_ref().expect("entry").file_name().to_string_lossy().to_ascii_lowercase();
            [".png", ".jpg", ".jpeg", ".webp"].iter().any(|ext| name.ends_with(ext))
        })
        .count();
    let (n, text) = generate(&dir, "shared.jsonl", |o| {
        o.shape = WorkloadShape::SharedImages;
        o.images = photos + 2;
        o.conversations = 3 * (photos + 2);
    });
    assert_eq!(n, 3 * (photos + 2));
    let mut urls: HashMap<String, usize> = HashMap::new();
    for l in lines(&text) {
        let messages = l["body"]["messages"].as_array().expect("messages");
        assert_eq!(messages[0]["role"], "system");
        for url in image_urls(&messages[1]) {
            *urls.entry(url).or_default() += 1;
        }
    }
    assert_eq!(urls.len(), photos + 2, "every image asked about");
    assert!(urls.values().all(|&k| k == 3), "each image three times");
    let real = urls.keys().filter(|u| u.starts_with("data:image/jpeg;") || u.starts_with("data:image/webp;")).count();
    assert!(real > 0, "real photos among them");
    // Synthetic images carry their tag in a PNG text chunk.
    let synthetic = urls
        .keys()
        .filter(|u| {
            let (_, b64) = u.split_once(";base64,").expect("data url");
            let bytes = base64::engine::general_purpose::STANDARD.decode(b64).expect("base64");
            bytes.windows(12).any(|w| w == b"shared image")
        })
        .count();
    assert_eq!(synthetic, 2, "synthetic camera images complete the set");
}
