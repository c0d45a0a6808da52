//! The code's shape, checked from its own text: the import graph between the files of every crate in the
//! workspace has no cycles, and each room of the server keeps its "must not know" line of ARCHITECTURE.md.
//! An edge is any reference from one file to an item of another: each `use` (re-exports included), each
//! `crate::`/`super::`/`self::` path, a relative path into a child module. A `mod child;` declaration alone
//! is not one: a parent that declares a child the child may use; a parent that also *uses* that child (a
//! `pub use` re-export too) closes a cycle — so inside a directory module, files import each other by the
//! defining file's path, never through the parent's re-exports. A reader of the source, not of rustc:
//! comments and literals are skipped, use trees expanded, paths resolved to the file defining the longest
//! module prefix.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One file's module path and the spans of the inline modules (`mod tests { … }`) it holds.
struct SourceFile {
    module: Vec<String>,
    text: String,
    inline: Vec<(usize, usize, Vec<String>)>,
}

/// Files by path, and module paths to the file that defines them, for one crate.
#[derive(Default)]
struct Crate {
    files: BTreeMap<PathBuf, SourceFile>,
    modules: BTreeMap<Vec<String>, PathBuf>,
}

/// `(from, to)` → the first line in `from` that makes the edge, for the report.
type Edges = BTreeMap<(PathBuf, PathBuf), String>;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn members() -> Vec<PathBuf> {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let value: toml::Value = toml::from_str(&manifest).unwrap();
    let list = value["workspace"]["members"].as_array().expect("workspace.members").clone();
    list.iter().map(|m| root().join(m.as_str().unwrap())).collect()
}

/// Source with comments and the insides of string and char literals blanked (lengths kept, so offsets
/// stay valid for inline-module spans).
fn blank(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = b.to_vec();
    let mut i = 0;
    let wipe = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in out.iter_mut().take(to.min(b.len())).skip(from) {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                let end = src[i..].find('\n').map_or(b.len(), |e| i + e);
                wipe(&mut out, i, end);
                i = end;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let end = src[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
                wipe(&mut out, i, end);
                i = end;
            }
            b'r' if matches!(b.get(i + 1), Some(b'"') | Some(b'#')) && (i == 0 || !is_ident(b[i - 1])) => {
                let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
                if b.get(i + 1 + hashes) != Some(&b'"') {
                    i += 1;
                    continue;
                }
                let close = format!("\"{}", "#".repeat(hashes));
                let start = i + 2 + hashes;
                let end = src[start..].find(&close).map_or(b.len(), |e| start + e + close.len());
                wipe(&mut out, start, end - close.len());
                i = end;
            }
            b'"' => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                wipe(&mut out, i + 1, j);
                i = j + 1;
            }
            b'\'' => {
                // A char literal ('x', '\n', '\u{..}') or a lifetime ('a): only the former is blanked.
                if b.get(i + 1) == Some(&b'\\') {
                    let end = src[i + 2..].find('\'').map_or(b.len(), |e| i + 2 + e + 1);
                    wipe(&mut out, i + 1, end - 1);
                    i = end;
                } else if let Some(c) = src[i + 1..].chars().next() {
                    let after = i + 1 + c.len_utf8();
                    if b.get(after) == Some(&b'\'') {
                        wipe(&mut out, i + 1, after);
                        i = after + 1;
                    } else {
                        i += 1;
                    }
                } else {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    String::from_utf8(out).unwrap_or_else(|_| src.to_string())
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// `mod NAME;` declarations and `mod NAME { … }` spans.
fn mod_items(text: &str) -> (Vec<String>, Vec<(usize, usize, String)>) {
    let b = text.as_bytes();
    let (mut decl, mut inline) = (Vec::new(), Vec::new());
    let mut from = 0;
    while let Some(at) = text[from..].find("mod ") {
        let i = from + at;
        from = i + 4;
        if i > 0 && is_ident(b[i - 1]) {
            continue;
        }
        let rest = &text[i + 4..];
        let name: String = rest.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if name.is_empty() {
            continue;
        }
        let after = rest.trim_start()[name.len()..].trim_start();
        // A `#[path = "…"]` module is a file borrowed from elsewhere (a test corpus of another crate):
        // not one of this crate's modules.
        let borrowed = text[..i].trim_end().trim_end_matches("pub").trim_end().ends_with(']')
            && text[..i].rfind("#[path").is_some_and(|p| !text[p..i].contains(';'));
        if after.starts_with(';') && borrowed {
            continue;
        }
        if after.starts_with(';') {
            decl.push(name);
        } else if after.starts_with('{') {
            let open = i + 4 + rest.find('{').unwrap();
            let mut depth = 0;
            let mut end = b.len();
            for (j, &c) in b.iter().enumerate().skip(open) {
                depth += match c {
                    b'{' => 1,
                    b'}' => -1,
                    _ => 0,
                };
                if depth == 0 {
                    end = j;
                    break;
                }
            }
            inline.push((open, end, name));
        }
    }
    (decl, inline)
}

fn load_crate(root_file: &Path) -> Crate {
    let mut krate = Crate::default();
    let mut todo = vec![(root_file.to_path_buf(), Vec::<String>::new())];
    while let Some((path, module)) = todo.pop() {
        let text = blank(&std::fs::read_to_string(&path).unwrap());
        let (decl, inline) = mod_items(&text);
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let dir = if module.is_empty() || name == "mod" {
            path.parent().unwrap().to_path_buf()
        } else {
            path.parent().unwrap().join(&name)
        };
        for child in decl {
            let flat = dir.join(format!("{child}.rs"));
            let file = if flat.exists() { flat } else { dir.join(&child).join("mod.rs") };
            let mut m = module.clone();
            m.push(child);
            todo.push((file, m));
        }
        // Inline modules nest by span; each one's path is its file's module plus the enclosing names.
        let mut spans: Vec<(usize, usize, Vec<String>)> = Vec::new();
        for (open, end, name) in inline {
            let mut m = spans
                .iter()
                .filter(|(o, e, _)| *o < open && end <= *e)
                .max_by_key(|(o, _, _)| *o)
                .map_or(module.clone(), |(_, _, m)| m.clone());
            m.push(name);
            krate.modules.insert(m.clone(), path.clone());
            spans.push((open, end, m));
        }
        krate.modules.insert(module.clone(), path.clone());
        krate.files.insert(path, SourceFile { module, text, inline: spans });
    }
    krate
}

/// Expands a use tree (`a::{b, c::{d, self}}`) into its paths.
fn expand(tree: &str) -> Vec<Vec<String>> {
    fn go(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
        let tree = tree.trim();
        if let Some(open) = tree.find('{') {
            let head: Vec<String> = split_path(&tree[..open]);
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            let mut p = prefix.to_vec();
            p.extend(head);
            let (mut depth, mut start) = (0, 0);
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        go(&p, &inner[start..i], out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            go(&p, &inner[start..], out);
        } else {
            let mut p = prefix.to_vec();
            let segs = split_path(tree.split(" as ").next().unwrap_or(""));
            for s in segs {
                if s != "self" || p.is_empty() {
                    p.push(s);
                }
            }
            if !p.is_empty() {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    go(&[], tree, &mut out);
    out
}

fn split_path(s: &str) -> Vec<String> {
    s.split("::").map(str::trim).filter(|x| !x.is_empty() && *x != "*").map(String::from).collect()
}

/// Every path in the text with where it starts: use trees and free `crate::`/`super::`/`self::` paths.
fn paths(text: &str) -> Vec<(usize, Vec<String>)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find("use ") {
        let i = from + at;
        from = i + 4;
        if i > 0 && is_ident(b[i - 1]) {
            continue;
        }
        let end = text[i..].find(';').map_or(text.len(), |e| i + e);
        for p in expand(&text[i + 4..end]) {
            out.push((i, p));
        }
    }
    for key in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(at) = text[from..].find(key) {
            let i = from + at;
            from = i + key.len();
            if i > 0 && (is_ident(b[i - 1]) || b[i - 1] == b':') {
                continue;
            }
            let len =
                text[i..].find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(text.len() - i);
            let path = split_path(&text[i..i + len]);
            // `crate::{a, b}` outside a `use` (a `pub(crate)` is not a path either): nothing to resolve.
            if path.len() > 1 {
                out.push((i, path));
            }
        }
    }
    out
}

fn resolve(krate: &Crate, here: &[String], path: &[String]) -> Option<PathBuf> {
    let mut abs: Vec<String> = match path.first().map(String::as_str) {
        Some("crate") => Vec::new(),
        Some("super") | Some("self") => here.to_vec(),
        _ => {
            // A relative path: only a child module declared here (`use child::X`) counts.
            let mut m = here.to_vec();
            m.push(path.first()?.clone());
            krate.modules.contains_key(&m).then_some(())?;
            here.to_vec()
        }
    };
    let mut rest = path;
    if matches!(path.first().map(String::as_str), Some("crate") | Some("self")) {
        rest = &path[1..];
    }
    while let Some("super") = rest.first().map(String::as_str) {
        abs.pop();
        rest = &rest[1..];
    }
    abs.extend(rest.iter().cloned());
    (0..=abs.len()).rev().find_map(|n| krate.modules.get(&abs[..n]).cloned())
}

fn edges(krate: &Crate) -> Edges {
    let mut edges = Edges::new();
    for (path, file) in &krate.files {
        for (at, p) in paths(&file.text) {
            let here = file
                .inline
                .iter()
                .filter(|(o, e, _)| *o < at && at < *e)
                .max_by_key(|(o, _, _)| *o)
                .map_or(&file.module, |(_, _, m)| m);
            if let Some(to) = resolve(krate, here, &p) {
                if &to != path {
                    edges.entry((path.clone(), to)).or_insert(p.join("::"));
                }
            }
        }
    }
    edges
}

/// Strongly connected components of more than one file (Tarjan, iterative enough for a source tree).
fn cycles(edges: &Edges) -> Vec<Vec<PathBuf>> {
    let mut next: BTreeMap<&PathBuf, Vec<&PathBuf>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        next.entry(from).or_default().push(to);
        next.entry(to).or_default();
    }
    struct T<'a> {
        next: &'a BTreeMap<&'a PathBuf, Vec<&'a PathBuf>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on: BTreeSet<&'a PathBuf>,
        out: Vec<Vec<PathBuf>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a PathBuf) {
        let n = t.index.len();
        t.index.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        t.on.insert(v);
        for &w in &t.next[v] {
            if !t.index.contains_key(w) {
                visit(t, w);
                let l = t.low[w].min(t.low[v]);
                t.low.insert(v, l);
            } else if t.on.contains(w) {
                let l = t.index[w].min(t.low[v]);
                t.low.insert(v, l);
            }
        }
        if t.low[v] == t.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                scc.push(w.clone());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                t.out.push(scc);
            }
        }
    }
    let mut t = T {
        next: &next,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in next.keys() {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    t.out
}

fn crates() -> Vec<(PathBuf, Crate)> {
    let mut out = Vec::new();
    for member in members() {
        for root_file in ["src/lib.rs", "src/main.rs"] {
            let f = member.join(root_file);
            if f.exists() {
                out.push((f.clone(), load_crate(&f)));
            }
        }
    }
    out
}

fn rel(p: &Path) -> String {
    p.strip_prefix(root()).unwrap_or(p).display().to_string()
}

#[test]
fn no_file_of_any_crate_is_in_an_import_cycle() {
    let mut report = String::new();
    let mut files = 0;
    for (root_file, krate) in crates() {
        files += krate.files.len();
        let edges = edges(&krate);
        for scc in cycles(&edges) {
            report.push_str(&format!("cycle in {}:\n", rel(&root_file)));
            let set: BTreeSet<_> = scc.iter().collect();
            for ((from, to), why) in &edges {
                if set.contains(from) && set.contains(to) {
                    report.push_str(&format!("  {} -> {}  ({why})\n", rel(from), rel(to)));
                }
            }
        }
    }
    assert!(files > 100, "the reader found only {files} files: the module walk is broken");
    assert!(report.is_empty(), "import cycles:\n{report}");
}

/// The reader finds what it must: a re-export by the parent plus a `super::` back into it, a use tree; and
/// nothing in comments, strings, char literals or a test module's `use super::*`.
#[test]
fn the_cycle_reader_sees_use_trees_super_paths_and_re_exports() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::write(
        src.join("lib.rs"),
        "mod a;\nmod b;\n// use crate::c; in a comment\nconst S: &str = \"crate::b\";\n",
    )
    .unwrap();
    std::fs::write(src.join("a/mod.rs"), "mod inner;\npub use inner::U;\npub struct T;\n").unwrap();
    std::fs::write(src.join("a/inner.rs"), "use super::T;\npub struct U;\nfn f() -> char { '\"' }\n").unwrap();
    std::fs::write(src.join("b.rs"), "use crate::{a::{self}, b};\n#[cfg(test)]\nmod tests { use super::*; }\n")
        .unwrap();
    let krate = load_crate(&src.join("lib.rs"));
    let found = cycles(&edges(&krate));
    assert_eq!(found.len(), 1, "{:?}", found);
    let names: BTreeSet<_> = found[0].iter().map(|p| p.strip_prefix(src).unwrap().display().to_string()).collect();
    assert_eq!(names, BTreeSet::from(["a/mod.rs".to_string(), "a/inner.rs".to_string()]));
    let e = edges(&krate);
    assert!(e.contains_key(&(src.join("b.rs"), src.join("a/mod.rs"))), "{e:?}");
    assert!(!e.keys().any(|(f, _)| f == &src.join("lib.rs")), "{e:?}");
}

/// The room of a server file: its first path component under `src/` (`proxy`, `front`, …; `state`,
/// `server`, `error` for the single files).
fn room(p: &Path) -> String {
    let rel = p.strip_prefix(root().join("src")).unwrap_or(p);
    let first = rel.components().next().map(|c| c.as_os_str().to_string_lossy().to_string()).unwrap_or_default();
    first.trim_end_matches(".rs").to_string()
}

/// Each room and the rooms it may import from (itself always): ARCHITECTURE.md's "must not know" lines.
const ROOMS: &[(&str, &[&str])] = &[
    ("config", &[]),
    ("observe", &[]),
    ("error", &[]),
    ("upstream", &["config", "error"]),
    ("front", &["config", "observe", "error"]),
    ("pools", &["config", "observe"]),
    ("state", &["config", "front", "observe", "pools", "upstream"]),
    ("proxy", &["state", "pools", "upstream", "front", "observe", "config", "error"]),
    ("ops", &["state", "pools", "front", "observe", "config", "error"]),
    ("cluster", &["state", "pools", "observe", "config", "error"]),
    ("picker", &["state", "proxy", "upstream", "observe", "config", "error"]),
];

#[test]
fn each_room_of_the_server_imports_only_what_it_may_know() {
    let (lib, krate) = crates().into_iter().find(|(f, _)| f == &root().join("src/lib.rs")).expect("the server crate");
    let mut wrong = Vec::new();
    for ((from, to), why) in edges(&krate) {
        let (a, b) = (room(&from), room(&to));
        if a == b || b == "lib" {
            continue;
        }
        match ROOMS.iter().find(|(r, _)| *r == a) {
            Some((_, may)) if !may.contains(&b.as_str()) => {
                wrong.push(format!("{} -> {} ({why}): {a} must not know {b}", rel(&from), rel(&to)))
            }
            // `server.rs`, `cli/`, `lib.rs` compose the rest: they may import any room.
            _ => {}
        }
    }
    for (path, file) in &krate.files {
        if matches!(room(path).as_str(), "pools" | "picker") && file.text.contains("axum::") {
            wrong.push(format!("{}: the {} room uses axum", rel(path), room(path)));
        }
        // The picker sends nothing itself: the proxy's relay (and the upstream `Relay`) are not its.
        if room(path) == "picker" && (file.text.contains("relay::") || file.text.contains("Relay")) {
            wrong.push(format!("{}: the picker room uses the proxy's relay", rel(path)));
        }
    }
    assert!(krate.files.len() > 30, "{}: {} files", rel(&lib), krate.files.len());
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Parameters of every `fn` in `text`, by name, `self` excluded.
fn signatures(text: &str) -> Vec<(String, Vec<String>)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find("fn ") {
        let i = from + at;
        from = i + 3;
        if i > 0 && is_ident(b[i - 1]) {
            continue;
        }
        let name: String = text[i + 3..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let Some(open) = text[i..].find('(').map(|o| i + o) else { continue };
        let (mut depth, mut start, mut params) = (0i32, open + 1, Vec::new());
        for j in open..b.len() {
            let arrow = b[j] == b'>' && j > 0 && b[j - 1] == b'-';
            match b[j] {
                b'(' | b'[' | b'{' | b'<' => depth += 1,
                b')' | b']' | b'}' => depth -= 1,
                b'>' if !arrow => depth -= 1,
                b',' if depth == 1 => {
                    params.push(text[start..j].trim().to_string());
                    start = j + 1;
                }
                _ => {}
            }
            if depth == 0 {
                params.push(text[start..j].trim().to_string());
                break;
            }
        }
        params.retain(|p| {
            !p.is_empty() && !p.trim_start_matches(['&', ' ']).trim_start_matches("mut ").starts_with("self")
        });
        out.push((name, params));
    }
    out
}

#[test]
fn no_server_function_takes_more_than_four_arguments_besides_self_and_the_context() {
    let (_, krate) = crates().into_iter().find(|(f, _)| f == &root().join("src/lib.rs")).expect("the server crate");
    let mut long = Vec::new();
    for (path, file) in &krate.files {
        for (name, params) in signatures(&file.text) {
            let counted: Vec<_> =
                params.iter().filter(|p| !p.ends_with(": &mut Ctx") && !p.ends_with(": Ctx")).collect();
            if counted.len() > 4 {
                long.push(format!("{}: fn {name} takes {}", rel(path), counted.len()));
            }
        }
    }
    assert!(long.is_empty(), "{}", long.join("\n"));
    let probe = signatures("fn f(&self, a: impl Fn(u8, u8) -> u8, b: HashMap<K, V>, ctx: &mut Ctx) {}");
    assert_eq!(probe[0].1.len(), 3, "{probe:?}");
}
