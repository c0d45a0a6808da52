//! Property tests (proptest) over data-URL decoding and probing: no panic, results within the
//! limits, and — measured with a counting allocator — no allocation above the limits: over-limit
//! inputs are refused before a decode buffer exists, and bomb headers before any pixel buffer.
//!
//! The committed corpus in `tests/fixtures/fuzz_corpus/` is replayed first with its expected
//! outcomes (`expected.txt`); proptest's own failure seeds are persisted next to it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::PathBuf;

use crate::media_common::{fixture, gif_header, png_header, rle8_bomb, FIXTURES};
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use base64::Engine;
use mmrouter_core::media::{decode_data_url, probe_bytes, MediaConfig, MediaError};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

/// Counts live heap bytes per thread, and the peak since the last reset.
struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn track(delta: isize) {
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: delegates every call to `System` unchanged; the bookkeeping allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            track(layout.size() as isize);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        track(-(layout.size() as isize));
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            track(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Runs `f` and returns its result with the most heap it held at once (bytes, this thread).
fn peak_alloc<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.with(|l| l.get());
    PEAK.with(|p| p.set(base));
    let out = f();
    let peak = PEAK.with(|p| p.get());
    (out, (peak - base).max(0) as usize)
}

const LIMIT: usize = 4096;
/// The decoder's own working memory (a 4 KiB character chunk and a 3 KiB output chunk live on the
/// stack; this is room for error strings and the like).
const SLACK: usize = 16 * 1024;

fn corpus_dir() -> PathBuf {
    crate::fixtures().join("fuzz_corpus")
}

fn outcome_of_decode(url: &str) -> String {
    match decode_data_url(url, LIMIT) {
        Ok(bytes) => format!("ok {}", bytes.len()),
        Err(e) => e.label().to_string(),
    }
}

fn outcome_of_probe(bytes: &[u8]) -> String {
    match probe_bytes(bytes, &MediaConfig::default()) {
        Ok((w, h, f)) => format!("ok {w}x{h} {f}"),
        Err(e) => e.label().to_string(),
    }
}

#[test]
fn committed_corpus_replays_with_expected_outcomes() {
    let dir = corpus_dir();
    let manifest = std::fs::read_to_string(dir.join("expected.txt")).unwrap();
    let mut seen = 0;
    for line in manifest.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let (file, expected) = line.split_once(' ').unwrap();
        let bytes = std::fs::read(dir.join(file)).unwrap();
        let (got, peak) = if file.starts_with("data_url/") {
            let url = String::from_utf8(bytes).unwrap();
            peak_alloc(|| outcome_of_decode(&url))
        } else {
            peak_alloc(|| outcome_of_probe(&bytes))
        };
        assert_eq!(got, expected, "{file}");
        assert!(peak <= LIMIT + SLACK, "{file}: peak allocation {peak} bytes");
        seen += 1;
    }
    assert!(seen >= 20, "corpus too small: {seen}");
}

#[test]
fn bombs_are_refused_without_allocating_their_pixels() {
    let cfg = MediaConfig::default();
    for bomb in [png_header(100_000, 100_000), gif_header(65_535, 65_535)] {
        let (res, peak) = peak_alloc(|| probe_bytes(&bomb, &cfg));
        assert!(matches!(res, Err(MediaError::TooManyPixels { .. })), "{res:?}");
        assert!(peak < 64 * 1024, "bomb probe allocated {peak} bytes");
    }
}

/// Issue 45: a 1 080-byte RLE8 BMP declaring 11 000 × 11 000 (under the pixel cap) was decoded in full,
/// 363 MB. Now it is judged from its headers and stream: refused (Pillow cannot load it) or counted
/// (its stream fills the image), and neither holds a pixel.
#[test]
fn rle_bmp_bombs_are_judged_without_expanding_them() {
    let cfg = MediaConfig::default();
    let bomb = rle8_bomb(11_000, false);
    assert_eq!(bomb.len(), 1080);
    let (res, peak) = peak_alloc(|| probe_bytes(&bomb, &cfg));
    assert_eq!(res.unwrap_err().label(), "unsupported_format");
    assert!(peak < 64 * 1024, "bomb probe allocated {peak} bytes");
    let (res, peak) = peak_alloc(|| probe_bytes(&rle8_bomb(11_000, true), &cfg));
    assert_eq!(res.unwrap(), (11_000, 11_000, "bmp"));
    assert!(peak < 64 * 1024, "filled bomb probe allocated {peak} bytes");
}

#[test]
fn over_limit_data_url_is_refused_before_decoding() {
    let raw = vec![7u8; 1 << 20];
    let url = format!("data:image/png;base64,{}", STANDARD.encode(&raw));
    let (res, peak) = peak_alloc(|| decode_data_url(&url, LIMIT));
    assert!(matches!(res, Err(MediaError::ImageTooLarge { .. })));
    assert!(peak < SLACK, "refusal allocated {peak} bytes");
    // The same URL within the limit allocates about its decoded size, not the encoded one.
    let (res, peak) = peak_alloc(|| decode_data_url(&url, raw.len()));
    assert_eq!(res.unwrap().len(), raw.len());
    assert!(peak <= raw.len() + SLACK, "decode allocated {peak} bytes");
    // ...and the counter does see that allocation (the bounds above are not vacuous).
    assert!(peak >= raw.len(), "allocator counted only {peak} bytes");
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "../../tests/fixtures/fuzz_corpus/media_fuzz.proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

/// Encodes `raw` in one of the accepted spellings, with whitespace sprinkled at `breaks`.
fn spell(raw: &[u8], variant: u8, breaks: &[usize]) -> String {
    let text = match variant % 4 {
        0 => STANDARD.encode(raw),
        1 => STANDARD_NO_PAD.encode(raw),
        2 => URL_SAFE.encode(raw),
        _ => URL_SAFE_NO_PAD.encode(raw),
    };
    let mut out = String::with_capacity(text.len() + breaks.len() * 2);
    for (i, c) in text.chars().enumerate() {
        if breaks.contains(&i) {
            out.push_str(if i % 2 == 0 { "\n" } else { " \t" });
        }
        out.push(c);
    }
    out
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn arbitrary_payloads_never_panic_or_exceed_the_limit(payload in ".{0,6000}") {
        let url = format!("data:image/png;base64,{payload}");
        let (res, peak) = peak_alloc(|| decode_data_url(&url, LIMIT));
        if let Ok(bytes) = &res {
            prop_assert!(bytes.len() <= LIMIT);
        }
        prop_assert!(peak <= LIMIT + SLACK, "peak {}", peak);
    }

    #[test]
    fn arbitrary_headers_never_panic(url in "(?i:data:)?[a-z/+;=,. -]{0,40}[A-Za-z0-9+/=_-]{0,64}") {
        let _ = decode_data_url(&url, LIMIT);
    }

    #[test]
    fn every_spelling_round_trips_and_over_limit_is_refused_early(
        raw in proptest::collection::vec(any::<u8>(), 1..(2 * LIMIT)),
        variant in 0u8..4,
        breaks in proptest::collection::vec(0usize..12_000, 0..8),
    ) {
        let url = format!("data:image/jpeg;base64,{}", spell(&raw, variant, &breaks));
        let (res, peak) = peak_alloc(|| decode_data_url(&url, LIMIT));
        if raw.len() <= LIMIT {
            prop_assert_eq!(res.unwrap(), raw);
            prop_assert!(peak <= LIMIT + SLACK);
        } else {
            let refused_early = matches!(res, Err(MediaError::ImageTooLarge { .. }));
            prop_assert!(refused_early);
            prop_assert!(peak < SLACK, "refusal allocated {}", peak);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic_when_probed(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let cfg = MediaConfig { max_pixels: 1_000_000, ..MediaConfig::default() };
        if let Ok((w, h, _)) = probe_bytes(&bytes, &cfg) {
            prop_assert!(u64::from(w) * u64::from(h) <= cfg.max_pixels);
        }
    }
}

proptest! {
    // Mutated real images may reach the (debug-build) decoder: fewer cases.
    #![proptest_config(config(48))]

    #[test]
    fn mutated_fixtures_never_panic_and_stay_within_limits(
        which in 0usize..FIXTURES.len(),
        cut in 0.0f64..1.0,
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
    ) {
        let cfg = MediaConfig { max_pixels: 1_000_000, ..MediaConfig::default() };
        let mut bytes = fixture(FIXTURES[which].0);
        let keep = ((bytes.len() as f64) * cut) as usize + 1;
        bytes.truncate(keep.min(bytes.len()));
        for (at, value) in &flips {
            let i = at.index(bytes.len());
            bytes[i] = *value;
        }
        let (res, peak) = peak_alloc(|| probe_bytes(&bytes, &cfg));
        if let Ok((w, h, _)) = res {
            prop_assert!(u64::from(w) * u64::from(h) <= cfg.max_pixels);
        }
        // No pixel is decoded: a decoder reading headers is held to its max_alloc (16 MiB).
        prop_assert!(peak <= 80 * 1024 * 1024, "peak {}", peak);
    }
}
