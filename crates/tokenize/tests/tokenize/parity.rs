//! Parity with Hugging Face `tokenizers` 0.23.2 (`encode_fast(text, false)`) on the Qwen3 tokenizer.
//!
//! Corpus sizes scale with `MMROUTER_TOKENIZE_PARITY_MB` (default: 8 in release builds, 1 in debug builds,
//! where `tokenizers` itself is slow). Run the full suite with
//! `cargo test --release -p mmrouter-tokenize --test tokenize parity`.

use std::sync::OnceLock;

use crate::common::corpus::{self, Mix, Rng};
use crate::common::{hf_ids, qwen_json, shrink};
use mmrouter_tokenize::FastTokenizer;

struct Both {
    fast: FastTokenizer,
    hf: tokenizers::Tokenizer,
}

fn both() -> &'static Both {
    static B: OnceLock<Both> = OnceLock::new();
    B.get_or_init(|| {
        let json = qwen_json();
        Both {
            fast: FastTokenizer::from_json(&json).expect("qwen tokenizer is supported"),
            hf: tokenizers::Tokenizer::from_bytes(&json).expect("hf loads qwen"),
        }
    })
}

/// Megabytes of generated corpus to check.
fn budget_mb() -> f64 {
    std::env::var("MMROUTER_TOKENIZE_PARITY_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) { 1.0 } else { 8.0 })
}

/// Compares every document; on failure prints shrunk counter-examples and panics.
fn check(name: &str, fast: &FastTokenizer, hf: &tokenizers::Tokenizer, docs: &[String]) {
    let mut bad = Vec::new();
    let (mut bytes, mut tokens) = (0usize, 0usize);
    for (i, d) in docs.iter().enumerate() {
        let want = hf_ids(hf, d);
        let got = fast.encode(d);
        bytes += d.len();
        tokens += want.len();
        if got != want {
            bad.push(i);
        }
    }
    for &i in bad.iter().take(5) {
        if docs[i].len() > 20_000 {
            let (a, b) = (fast.encode(&docs[i]), hf_ids(hf, &docs[i]));
            let at = a.iter().zip(&b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
            eprintln!("[{name}] doc {i} ({} bytes) differs from token {at} on (too long to shrink)", docs[i].len());
            continue;
        }
        let small = shrink(&docs[i], |s| fast.encode(s) != hf_ids(hf, s));
        eprintln!(
            "[{name}] doc {i} differs; shrunk input {small:?}\n  hf:   {:?}\n  fast: {:?}",
            hf_ids(hf, &small),
            fast.encode(&small)
        );
    }
    eprintln!("[{name}] {} documents, {bytes} bytes, {tokens} tokens, {} differences", docs.len(), bad.len());
    assert!(bad.is_empty(), "[{name}] {} of {} documents differ", bad.len(), docs.len());
}

#[test]
fn generated_corpus() {
    let b = both();
    let total = (budget_mb() * 1e6) as usize;
    let docs = corpus::documents(0xC0FFEE, total, 200, 40_000, Mix::Adversarial);
    check("generated", &b.fast, &b.hf, &docs);
}

#[test]
fn realistic_corpus() {
    let b = both();
    let total = (budget_mb() * 0.25e6) as usize;
    let docs = corpus::documents(0xBE7C4, total, 2_000, 60_000, Mix::Realistic);
    check("realistic", &b.fast, &b.hf, &docs);
}

/// Text files found on the machine (licenses, package docs, Python sources), when present.
/// Long documents cut into parts encoded in parallel (what an idle router does with a long prompt):
/// the same ids as `tokenizers` on the whole text. Every document is long enough to be cut.
#[test]
fn long_texts_encoded_in_parts() {
    let b = both();
    let total = (budget_mb() * 0.5e6) as usize;
    for (seed, mix) in [(0x5117, Mix::Realistic), (0x5118, Mix::Adversarial)] {
        let docs = corpus::documents(seed, total, 20_000, 120_000, mix);
        let bad: Vec<usize> =
            (0..docs.len()).filter(|&i| b.fast.encode_split(&docs[i]) != hf_ids(&b.hf, &docs[i])).collect();
        // The corpus has no added tokens: each document is one segment, cut at `first_cut`.
        let cut = docs.iter().filter(|d| FastTokenizer::first_cut(d).is_some()).count();
        eprintln!("[parts, {mix:?}] {} documents, {cut} cut, {} differ", docs.len(), bad.len());
        assert!(cut * 10 >= docs.len() * 9, "only {cut} of {} documents were cut", docs.len());
        assert!(!docs.is_empty() && bad.is_empty(), "documents {bad:?} differ when encoded in parts");
    }
}

#[test]
fn system_texts() {
    let b = both();
    let cap = (budget_mb() * 0.5e6) as usize;
    let mut files = Vec::new();
    for dir in ["/usr/share/common-licenses", "/usr/share/doc", "/usr/lib/python3.11", "/usr/local/lib/python3.11"] {
        collect_files(std::path::Path::new(dir), &mut files, 3);
    }
    files.sort();
    let mut docs = Vec::new();
    let mut total = 0;
    let mut r = Rng::new(7);
    for f in files {
        if total >= cap {
            break;
        }
        // Spread the budget over many files rather than the first few.
        if !r.chance(0.5) {
            continue;
        }
        if let Ok(bytes) = std::fs::read(&f) {
            if bytes.len() > 300_000 {
                continue;
            }
            if let Ok(s) = String::from_utf8(bytes) {
                total += s.len();
                docs.push(s);
            }
        }
    }
    if docs.is_empty() {
        eprintln!("no system text files found; skipping");
        return;
    }
    check("system", &b.fast, &b.hf, &docs);
}

fn collect_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>, depth: usize) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() && depth > 0 {
            collect_files(&p, out, depth - 1);
        } else if ft.is_file() {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let ext_ok = name.ends_with(".py")
                || name.ends_with(".txt")
                || name.ends_with(".md")
                || name == "copyright"
                || !name.contains('.');
            if ext_ok {
                out.push(p);
            }
        }
    }
}

/// Every code point, in several contexts that exercise each alternative of the split regex.
#[test]
fn every_code_point_in_context() {
    let b = both();
    let mut docs = Vec::new();
    let mut doc = String::new();
    for cp in 0..0x11_0000u32 {
        let Some(c) = char::from_u32(cp) else { continue };
        // Planes 3-16 are mostly unassigned or private use (uniform classes): sample them, except
        // for the tags and variation selectors of plane 14.
        let step = if cfg!(debug_assertions) { 256 } else { 32 };
        if cp >= 0x3_0000 && !(0xE_0000..0xE_0200).contains(&cp) && cp % step != 0 {
            continue;
        }
        if cfg!(debug_assertions) && cp >= 0x800 && cp % 4 != 0 {
            continue;
        }
        doc.push_str(&format!("a{c}b {c}{c} 1{c}2 '{c} !{c}\n{c} \t{c}x{c}\u{3000}"));
        if doc.len() > 4000 {
            docs.push(std::mem::take(&mut doc));
        }
    }
    docs.push(doc);
    check("code points", &b.fast, &b.hf, &docs);
}

/// All short strings over an alphabet of "interesting" characters.
#[test]
fn exhaustive_short_strings() {
    let b = both();
    let alphabet: &[&str] = &[" ", "\t", "\n", "\r", "\u{a0}", "a", "S", "1", "!", "'", "\u{17f}", "\u{301}", "中"];
    let max_len = if cfg!(debug_assertions) { 3 } else { 5 };
    let mut docs = Vec::new();
    let mut idx = vec![0usize; max_len];
    for len in 1..=max_len {
        idx.iter_mut().for_each(|i| *i = 0);
        loop {
            let s: String = idx[..len].iter().map(|&i| alphabet[i]).collect();
            docs.push(s);
            // next combination
            let mut k = 0;
            while k < len {
                idx[k] += 1;
                if idx[k] < alphabet.len() {
                    break;
                }
                idx[k] = 0;
                k += 1;
            }
            if k == len {
                break;
            }
        }
    }
    check("exhaustive", &b.fast, &b.hf, &docs);
}

/// Property-style: random strings from a weighted pool of tricky pieces.
#[test]
fn random_strings() {
    let b = both();
    let pool: &[&str] = &[
        " ",
        " ",
        "  ",
        "\t",
        "\n",
        "\r\n",
        "\r",
        "\u{a0}",
        "\u{3000}",
        "\u{2028}",
        "\u{85}",
        "\x0b",
        "a",
        "b",
        "Z",
        "hello",
        " world",
        "'",
        "'s",
        "'S",
        "'\u{17f}",
        "'ll",
        "'LL",
        "'Re",
        "'ve",
        "'d",
        "'m",
        "'t",
        "1",
        "42",
        "\u{663}",
        "\u{ff11}",
        "\u{b2}",
        "!",
        "?!",
        "...",
        "-",
        "_",
        "(",
        "\"",
        "#",
        "\u{2014}",
        "\u{301}",
        "\u{323}",
        "\u{302}",
        "e",
        "\u{e9}",
        "\u{1100}",
        "\u{1161}",
        "\u{11a8}",
        "\u{ac00}",
        "\u{f900}",
        "\u{212b}",
        "中",
        "文",
        "の",
        "한",
        "\u{627}",
        "\u{64e}",
        "\u{5d0}",
        "\u{5b8}",
        "\u{915}",
        "\u{94d}",
        "\u{93c}",
        "\u{e01}",
        "\u{e48}",
        "😀",
        "👍🏽",
        "\u{200d}",
        "\u{fe0f}",
        "\u{1f1fa}",
        "\u{200b}",
        "\u{feff}",
        "\u{0}",
        "\u{1b}",
        "\u{7f}",
        "\u{fffd}",
        "<|im_start|>",
        "<|im_end|>",
        "<|image_pad|>",
        "<think>",
        "</think>",
        "<|",
        "|>",
        "<",
        ">",
        "\u{10ffff}",
        "\u{e000}",
        "\u{2f800}",
    ];
    let n = if cfg!(debug_assertions) { 3_000 } else { 100_000 };
    let mut r = Rng::new(0xDEC0DE);
    let mut docs = Vec::with_capacity(n);
    for _ in 0..n {
        let len = r.range(0, 24);
        let mut s = String::new();
        for _ in 0..len {
            if r.chance(0.05) {
                s.push(r.char_in(0, 0x10FFFF));
            } else {
                s.push_str(r.pick(pool));
            }
        }
        docs.push(s);
    }
    check("random", &b.fast, &b.hf, &docs);
}

#[test]
fn token_to_id_matches_hf() {
    let b = both();
    let vocab = b.hf.get_vocab(true);
    let mut r = Rng::new(3);
    let entries: Vec<(&String, &u32)> = vocab.iter().collect();
    for _ in 0..20_000 {
        let (tok, id) = entries[r.below(entries.len())];
        assert_eq!(b.fast.token_to_id(tok), Some(*id), "{tok:?}");
    }
    for t in ["<|im_start|>", "<|image_pad|>", "</think>", "Ġthe", "Ċ", "ĠĠ", "a"] {
        assert_eq!(b.fast.token_to_id(t), b.hf.token_to_id(t), "{t:?}");
    }
    for t in ["", " ", "not a token at all", "<|im_start", "中文字符不存在"] {
        assert_eq!(b.fast.token_to_id(t), b.hf.token_to_id(t), "{t:?}");
    }
}

#[test]
fn encode_into_appends() {
    let b = both();
    let mut out = vec![7];
    b.fast.encode_into("Hello<|im_end|>", &mut out);
    let mut want = vec![7];
    want.extend(hf_ids(&b.hf, "Hello<|im_end|>"));
    assert_eq!(out, want);
    assert!(b.fast.encode("").is_empty());
}

/// White-space runs long enough to overflow `fancy-regex`'s backtracking stack (release builds only:
/// each case makes `tokenizers` run BPE over a megabyte-long piece).
#[test]
fn huge_whitespace_runs() {
    if cfg!(debug_assertions) {
        eprintln!("skipped in debug builds");
        return;
    }
    let b = both();
    let mut docs = Vec::new();
    for ws in [" ", "\u{3000}"] {
        for k in [999_998, 999_999] {
            for (pre, post) in [("x", "a b"), ("", "!\n\n\t tail")] {
                docs.push(format!("{pre}{}{post}", ws.repeat(k)));
            }
        }
    }
    docs.push(format!("\n{}\t1<|im_end|> after", " ".repeat(1_000_005)));
    check("huge whitespace", &b.fast, &b.hf, &docs);
}
