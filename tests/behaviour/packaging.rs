//! The container files, checked without Docker (no daemon runs where the tests do).
//!
//! * The Dockerfile's Rust stages run in a scratch directory: `COPY` from the build context (as
//!   `.dockerignore` filters it) or from another stage, `WORKDIR`, `ARG`/`ENV`, and `RUN` through `sh`
//!   with `cargo build` replaced by a shim. At each `cargo build` the shim records the files there and
//!   asks cargo itself, with the same arguments, whether it accepts the workspace: resolved offline
//!   from the lock file, every member's manifest and every declared target found. It stops cargo at
//!   the first compilation, so nothing is compiled. Besides cargo's verdict the test checks, by name,
//!   each member's `Cargo.toml` and each target its manifest declares. The runtime stage is read, not
//!   run: what it copies must exist, and its command must parse.
//! * docker-compose.yml: the build context, every host path it mounts, and every command run in the
//!   image parse with the binary's own command line (`mmrouter::cli::args::Cli`); a `--config` they
//!   name, traced to the host file mounted or copied there, loads.
//!
//! `MMROUTER_TEST_DOCKERFILE=PATH` checks another Dockerfile (an older one, to see it fail).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;
use mmrouter::cli::args::Cli;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// One Dockerfile instruction: its keyword (upper case), the rest of its line(s), and a heredoc body.
#[derive(Clone, Debug)]
struct Instr {
    line: usize,
    op: String,
    args: String,
    heredoc: Option<String>,
}

#[derive(Clone, Debug)]
struct Stage {
    name: String,
    image: String,
    instrs: Vec<Instr>,
}

/// The stages of a Dockerfile: comments dropped, `\` continuations joined, `<<EOF` heredocs read.
fn stages(text: &str) -> Vec<Stage> {
    let mut out: Vec<Stage> = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((i, first)) = lines.next() {
        if first.trim().is_empty() || first.trim_start().starts_with('#') {
            continue;
        }
        let mut full = first.trim_end().to_string();
        while full.ends_with('\\') {
            full.pop();
            match lines.next() {
                Some((_, l)) if l.trim_start().starts_with('#') => {}
                Some((_, l)) => full.push_str(l.trim_end()),
                None => break,
            }
        }
        let (op, args) = full.trim().split_once(char::is_whitespace).unwrap_or((full.trim(), ""));
        let heredoc = heredoc_tag(args).map(|tag| {
            let body: Vec<&str> = lines.by_ref().map(|(_, l)| l).take_while(|l| l.trim() != tag).collect();
            body.join("\n") + "\n"
        });
        let instr = Instr { line: i + 1, op: op.to_uppercase(), args: args.trim().to_string(), heredoc };
        if instr.op == "FROM" {
            let words: Vec<&str> = instr.args.split_whitespace().filter(|w| !w.starts_with("--")).collect();
            let name = match words.as_slice() {
                [_, as_, name] if as_.eq_ignore_ascii_case("as") => name.to_string(),
                _ => out.len().to_string(),
            };
            out.push(Stage { name, image: words.first().unwrap_or(&"").to_string(), instrs: Vec::new() });
        } else if let Some(stage) = out.last_mut() {
            stage.instrs.push(instr);
        }
    }
    out
}

fn heredoc_tag(args: &str) -> Option<String> {
    let rest = args.split("<<").nth(1)?;
    let tag: String = rest.trim_start_matches('-').chars().filter(|c| !matches!(c, '\'' | '"')).collect();
    tag.split_whitespace().next().map(str::to_string)
}

/// `.dockerignore` as Docker reads it (the subset used: `**`, `*`, directories; no `!` exceptions).
struct Ignore(Vec<Vec<String>>);

impl Ignore {
    fn load(root: &Path) -> Ignore {
        let text = std::fs::read_to_string(root.join(".dockerignore")).unwrap_or_default();
        let patterns = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| {
                assert!(!l.starts_with('!'), ".dockerignore: `{l}`: exceptions are beyond this test's reader");
                l.trim_matches('/').split('/').map(str::to_string).collect()
            })
            .collect();
        Ignore(patterns)
    }

    /// Whether `rel` (or a directory above it) is excluded from the build context.
    fn excludes(&self, rel: &Path) -> bool {
        let parts: Vec<String> = rel
            .components()
            .filter(|c| !matches!(c, std::path::Component::CurDir))
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        (1..=parts.len()).any(|n| self.0.iter().any(|p| matches(p, &parts[..n])))
    }
}

fn matches(pattern: &[String], path: &[String]) -> bool {
    match (pattern.first().map(String::as_str), path.first()) {
        (None, None) => true,
        (Some("**"), _) => matches(&pattern[1..], path) || (!path.is_empty() && matches(pattern, &path[1..])),
        (Some(p), Some(name)) => glob(p, name) && matches(&pattern[1..], &path[1..]),
        _ => false,
    }
}

/// `*` within one path component.
fn glob(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, tail)) => {
            name.starts_with(head)
                && (0..=name.len() - head.len())
                    .any(|i| name.is_char_boundary(head.len() + i) && glob(tail, &name[head.len() + i..]))
        }
    }
}

/// The Dockerfile's Rust stages run in a scratch directory; what went wrong, in words.
struct Sim {
    ignore: Ignore,
    stages: Vec<Stage>,
    scratch: tempfile::TempDir,
    shim: PathBuf,
    roots: BTreeMap<String, PathBuf>,
    workdirs: BTreeMap<String, String>,
    problems: Vec<String>,
}

/// `cargo build` → the snapshot and cargo's verdict; any other cargo command runs as itself.
const CARGO_SHIM: &str = r#"#!/bin/sh
if [ "$1" != build ]; then exec "$REAL_CARGO" "$@"; fi
n=$(ls "$SNAPS" | grep -c '\.files$')
find . -path ./target -prune -o -type f -print | sed 's|^\./||' | sort > "$SNAPS/$n.files"
pwd > "$SNAPS/$n.cwd"
rm -f "$SNAPS/compiling"
if RUSTC_WRAPPER="$STOP_AT_COMPILE" "$REAL_CARGO" "$@" --offline 2> "$SNAPS/$n.err" || [ -e "$SNAPS/compiling" ]; then
    exit 0
fi
cat "$SNAPS/$n.err" >&2
exit 101
"#;

/// `RUSTC_WRAPPER`: rustc's own queries pass, the first compilation ends the build (cargo got there).
const STOP_AT_COMPILE: &str = r#"#!/bin/sh
case " $* " in
  *" --crate-name ___ "*) ;;
  *" --crate-name "*) touch "$SNAPS/compiling"; exit 1 ;;
esac
exec "$@"
"#;

impl Sim {
    fn new(dockerfile: &str) -> Sim {
        let scratch = tempfile::tempdir().unwrap();
        let shim = scratch.path().join("bin");
        std::fs::create_dir_all(shim.join("snaps")).unwrap();
        for (name, text) in [("cargo", CARGO_SHIM), ("stop-at-compile", STOP_AT_COMPILE)] {
            std::fs::write(shim.join(name), text).unwrap();
            let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
            std::fs::set_permissions(shim.join(name), mode).unwrap();
        }
        let stages = stages(dockerfile);
        let (roots, workdirs, problems) = Default::default();
        Sim { ignore: Ignore::load(&repo()), stages, scratch, shim, roots, workdirs, problems }
    }

    /// Runs every stage on a Rust image (and the stages they build on).
    fn run(&mut self) {
        for i in 0..self.stages.len() {
            if self.stages[i].image.starts_with("rust") {
                self.stage(i);
            }
        }
    }

    fn stage(&mut self, i: usize) -> PathBuf {
        let stage = self.stages[i].clone();
        if let Some(root) = self.roots.get(&stage.name) {
            return root.clone();
        }
        let root = self.scratch.path().join(format!("stage-{i}"));
        std::fs::create_dir_all(&root).unwrap();
        if let Some(base) = self.stages[..i].iter().position(|s| s.name == stage.image) {
            copy_tree(&self.stage(base), &root, &|_| false);
        }
        let (mut cwd, mut env) = ("/".to_string(), BTreeMap::new());
        for instr in &stage.instrs {
            match instr.op.as_str() {
                "WORKDIR" => cwd = join(&cwd, &instr.args),
                "ARG" | "ENV" => {
                    let (k, v) = instr.args.split_once(['=', ' ']).unwrap_or((&instr.args, ""));
                    env.insert(k.trim().to_string(), v.trim().trim_matches('"').to_string());
                }
                "COPY" | "ADD" => self.copy(&root, &cwd, instr),
                // Only a Rust stage's scripts run here (a runtime stage's apt-get must not).
                "RUN" if stage.image.starts_with("rust") => {
                    self.run_script(&root.join(cwd.trim_start_matches('/')), &env, instr)
                }
                _ => {}
            }
            std::fs::create_dir_all(root.join(cwd.trim_start_matches('/'))).unwrap();
        }
        self.workdirs.insert(stage.name.clone(), cwd);
        self.roots.insert(stage.name, root.clone());
        root
    }

    fn copy(&mut self, root: &Path, cwd: &str, instr: &Instr) {
        let words: Vec<&str> = instr.args.split_whitespace().collect();
        let from = words.iter().find_map(|w| w.strip_prefix("--from="));
        let paths: Vec<&str> = words.iter().copied().filter(|w| !w.starts_with("--")).collect();
        let Some((dest, sources)) = paths.split_last() else { return };
        let dest_dir = dest.ends_with('/') || sources.len() > 1;
        let dest = root.join(join(cwd, dest).trim_start_matches('/'));
        for src in sources {
            let (host, filter) = match from {
                Some(stage) => match self.stages.iter().position(|s| s.name == stage) {
                    Some(i) => (self.stage(i).join(src.trim_start_matches('/')), None),
                    None => {
                        self.problems.push(format!("Dockerfile:{}: COPY --from={stage}: no such stage", instr.line));
                        continue;
                    }
                },
                None => (repo().join(src), Some(Path::new(src).to_path_buf())),
            };
            let ignored = filter.as_deref().is_some_and(|rel| rel != Path::new(".") && self.ignore.excludes(rel));
            if !host.exists() || ignored {
                let why = if ignored { "excluded by .dockerignore" } else { "not there" };
                self.problems.push(format!("Dockerfile:{}: COPY {src}: {why}", instr.line));
                continue;
            }
            if host.is_dir() {
                let skip = |rel: &Path| filter.as_ref().is_some_and(|base| self.ignore.excludes(&base.join(rel)));
                copy_tree(&host, &dest, &skip);
            } else {
                let to = if dest_dir { dest.join(host.file_name().unwrap()) } else { dest.clone() };
                std::fs::create_dir_all(to.parent().unwrap()).unwrap();
                std::fs::copy(&host, &to).unwrap();
            }
        }
    }

    fn run_script(&mut self, cwd: &Path, env: &BTreeMap<String, String>, instr: &Instr) {
        let script = instr.heredoc.clone().unwrap_or_else(|| instr.args.clone());
        let path = format!("{}:{}", self.shim.display(), std::env::var("PATH").unwrap_or_default());
        let out = Command::new("sh")
            .args(["-c", &script])
            .current_dir(cwd)
            .envs(env)
            .env("PATH", path)
            .env("REAL_CARGO", real_cargo())
            .env("SNAPS", self.shim.join("snaps"))
            .env("STOP_AT_COMPILE", self.shim.join("stop-at-compile"))
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("CARGO_BUILD_TARGET_DIR")
            .env_remove("RUSTC_WORKSPACE_WRAPPER")
            .output()
            .unwrap();
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            self.problems.push(format!("Dockerfile:{}: RUN fails: {}", instr.line, err.trim()));
        }
    }

    /// The tree at each `cargo build`: every member's manifest and declared target there.
    fn check_snapshots(&mut self) {
        let (snaps, builds) = (self.shim.join("snaps"), self.builds());
        for n in 0..builds {
            let list = read(&snaps.join(format!("{n}.files")));
            let files: Vec<&str> = list.lines().collect();
            let mut required = required_files();
            if n + 1 == builds {
                required.extend(sources().into_iter().map(|f| vec![f]));
            }
            for missing in required.into_iter().filter(|alts| !alts.iter().any(|f| files.contains(&f.as_str()))) {
                self.problems.push(format!("cargo build #{}: {} is not there", n + 1, missing.join(" or ")));
            }
        }
    }

    fn builds(&self) -> usize {
        (0..).take_while(|n| self.shim.join(format!("snaps/{n}.files")).exists()).count()
    }
}

/// The cargo running the tests (never the shim, which is first on the scripts' PATH).
fn real_cargo() -> PathBuf {
    std::env::var_os("CARGO").map(PathBuf::from).unwrap_or_else(|| {
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path).map(|d| d.join("cargo")).find(|c| c.is_file()).expect("cargo on PATH")
    })
}

fn join(cwd: &str, path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{}/{path}", cwd.trim_end_matches('/'))
    }
}

/// Copies the contents of `from` into `to`, leaving out what `skip` (given the relative path) says.
fn copy_tree(from: &Path, to: &Path, skip: &dyn Fn(&Path) -> bool) {
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        std::fs::create_dir_all(to.join(&rel)).unwrap();
        for entry in std::fs::read_dir(from.join(&rel)).unwrap() {
            let entry = entry.unwrap();
            let child = rel.join(entry.file_name());
            if skip(&child) || entry.file_name() == ".git" {
                continue;
            }
            if entry.file_type().unwrap().is_dir() {
                todo.push(child);
            } else {
                std::fs::copy(entry.path(), to.join(&child)).unwrap();
            }
        }
    }
}

/// The workspace's members, from the root manifest.
fn members() -> Vec<String> {
    let manifest: toml::Table = toml::from_str(&read(&repo().join("Cargo.toml"))).unwrap();
    let list = manifest["workspace"]["members"].as_array().expect("[workspace] members");
    list.iter().map(|m| m.as_str().unwrap().trim_start_matches("./").to_string()).collect()
}

/// What cargo needs of each member before it builds anything, as alternatives: its manifest, the lock
/// file, and each target its manifest declares (a declared `[[bench]]` without its file is an error
/// even when only the library is built).
fn required_files() -> Vec<Vec<String>> {
    let mut out = vec![vec!["Cargo.lock".to_string()]];
    for member in members() {
        let at = |f: &str| if member == "." { f.to_string() } else { format!("{member}/{f}") };
        out.push(vec![at("Cargo.toml")]);
        let manifest: toml::Table = toml::from_str(&read(&repo().join(at("Cargo.toml")))).unwrap();
        for alts in declared_targets(&manifest) {
            out.push(alts.iter().map(|f| at(f)).collect());
        }
    }
    out
}

/// What the last build must see besides: each member's sources, and its `build.rs`, which cargo
/// finds by name (without it the build quietly runs without its build script).
fn sources() -> Vec<String> {
    let mut out = Vec::new();
    for member in members() {
        let at = |f: &str| if member == "." { f.to_string() } else { format!("{member}/{f}") };
        if repo().join(at("build.rs")).is_file() {
            out.push(at("build.rs"));
        }
        let mut todo = vec![at("src")];
        while let Some(dir) = todo.pop() {
            for entry in std::fs::read_dir(repo().join(&dir)).into_iter().flatten().flatten() {
                let rel = format!("{dir}/{}", entry.file_name().to_string_lossy());
                if entry.path().is_dir() {
                    todo.push(rel);
                } else {
                    out.push(rel);
                }
            }
        }
    }
    out
}

fn declared_targets(manifest: &toml::Table) -> Vec<Vec<String>> {
    let package = manifest["package"]["name"].as_str().unwrap_or_default();
    let path = |t: &toml::Value| t.get("path").and_then(|p| p.as_str()).map(str::to_string);
    let mut out = Vec::new();
    if let Some(build) = manifest["package"].get("build").and_then(|b| b.as_str()) {
        out.push(vec![build.to_string()]);
    }
    match manifest.get("lib") {
        Some(lib) => out.push(vec![path(lib).unwrap_or_else(|| "src/lib.rs".into())]),
        None if manifest.get("bin").is_none() => out.push(vec!["src/lib.rs".into(), "src/main.rs".into()]),
        None => {}
    }
    for (kind, dir) in [("bin", "src/bin"), ("bench", "benches"), ("test", "tests"), ("example", "examples")] {
        for t in manifest.get(kind).and_then(|v| v.as_array()).into_iter().flatten() {
            let name = t.get("name").and_then(|n| n.as_str()).unwrap_or_default();
            let mut alts = vec![format!("{dir}/{name}.rs"), format!("{dir}/{name}/main.rs")];
            if kind == "bin" && name == package {
                alts.push("src/main.rs".into());
            }
            out.push(path(t).map_or(alts, |p| vec![p]));
        }
    }
    out
}

fn dockerfile() -> (String, String) {
    let path = std::env::var("MMROUTER_TEST_DOCKERFILE").map_or_else(|_| repo().join("Dockerfile"), PathBuf::from);
    (path.display().to_string(), read(&path))
}

/// Everything wrong with a Dockerfile's build, in words.
fn dockerfile_problems(text: &str) -> Vec<String> {
    let mut sim = Sim::new(text);
    sim.run();
    if sim.builds() == 0 {
        sim.problems.push("no Rust stage runs `cargo build`".into());
    }
    sim.check_snapshots();
    sim.problems.extend(runtime_stage_problems(&sim));
    sim.problems
}

/// The last stage, read: the binary it copies is the one the build made, what it copies from the
/// context exists, and its command parses.
fn runtime_stage_problems(sim: &Sim) -> Vec<String> {
    let mut problems = Vec::new();
    let last = sim.stages.last().expect("a stage");
    for instr in last.instrs.iter().filter(|i| i.op == "COPY") {
        let words: Vec<&str> = instr.args.split_whitespace().collect();
        let Some(src) = words.iter().find(|w| !w.starts_with("--")) else { continue };
        match words.iter().find_map(|w| w.strip_prefix("--from=")) {
            Some(stage) => {
                let want = format!("{}/target/release/mmrouter", sim.workdirs.get(stage).map_or("?", |w| w.as_str()));
                if *src != want {
                    problems
                        .push(format!("Dockerfile:{}: COPY --from={stage} {src}: the build makes {want}", instr.line));
                }
            }
            None if !repo().join(src).exists() => {
                problems.push(format!("Dockerfile:{}: COPY {src}: not there", instr.line))
            }
            None => {}
        }
    }
    let json = |op: &str| last.instrs.iter().rev().find(|i| i.op == op).map(|i| json_list(&i.args));
    match (json("ENTRYPOINT"), json("CMD")) {
        (Some(Ok(entry)), Some(Ok(cmd))) if entry == ["mmrouter"] => {
            problems.extend(command_problems("Dockerfile CMD", &cmd, &image_paths(last)));
        }
        other => problems.push(format!("Dockerfile: expected ENTRYPOINT [\"mmrouter\"] and a JSON CMD, got {other:?}")),
    }
    problems
}

fn json_list(text: &str) -> Result<Vec<String>, String> {
    serde_json::from_str(text).map_err(|e| format!("{text}: not a JSON list of strings ({e})"))
}

/// Container path → host path for what the runtime stage copies from the build context.
fn image_paths(stage: &Stage) -> Vec<(String, PathBuf)> {
    let copies = stage.instrs.iter().filter(|i| i.op == "COPY" && !i.args.contains("--from="));
    copies
        .filter_map(|i| {
            let words: Vec<&str> = i.args.split_whitespace().filter(|w| !w.starts_with("--")).collect();
            match words.as_slice() {
                [src, dest] => Some((dest.to_string(), repo().join(src))),
                _ => None,
            }
        })
        .collect()
}

/// A command the image runs must parse with the binary's own parser; a `--config` it names, traced to
/// the host file mounted or copied there, must load.
fn command_problems(what: &str, args: &[String], mounts: &[(String, PathBuf)]) -> Vec<String> {
    let argv = std::iter::once("mmrouter".to_string()).chain(args.iter().cloned());
    if let Err(e) = Cli::try_parse_from(argv) {
        return vec![format!("{what} {args:?} does not parse: {}", e.render())];
    }
    let Some(config) = args.iter().position(|a| a == "--config").and_then(|i| args.get(i + 1)) else { return vec![] };
    let host = mounts.iter().find_map(|(inside, host)| {
        let rest = config.strip_prefix(inside.trim_end_matches('/')).filter(|r| r.is_empty() || r.starts_with('/'))?;
        Some(if rest.is_empty() { host.clone() } else { host.join(rest.trim_start_matches('/')) })
    });
    match host {
        None => vec![format!("{what}: --config {config} is neither mounted nor copied into the image")],
        Some(file) => match mmrouter::config::Settings::load(&file) {
            Ok(_) => vec![],
            Err(e) => vec![format!("{what}: --config {config} ({}): {e:#}", file.display())],
        },
    }
}

#[test]
fn the_dockerfile_builds_every_workspace_member() {
    let (path, text) = dockerfile();
    let problems = dockerfile_problems(&text);
    assert!(problems.is_empty(), "{path}:\n{}", problems.join("\n"));
}

/// The skeleton stage's check of the members it derived names exactly the workspace's members (the
/// root package aside), so a new member cannot be left out of it.
#[test]
fn the_skeleton_check_names_every_workspace_member() {
    let (path, text) = dockerfile();
    let line =
        text.lines().find(|l| l.trim_start().starts_with("for member in ")).expect("the skeleton's member check");
    let named: Vec<&str> =
        line.trim_start()["for member in ".len()..].split(';').next().unwrap().split_whitespace().collect();
    let mut want: Vec<String> = members().into_iter().filter(|m| m != ".").collect();
    want.sort();
    let mut named: Vec<String> = named.into_iter().map(str::to_owned).collect();
    named.sort();
    assert_eq!(named, want, "{path}: the skeleton's member check against Cargo.toml's [workspace] members");
}

/// The reader finds what it must: a dependency stage that lists members by hand and forgets some.
#[test]
fn a_dockerfile_missing_a_member_or_a_stub_fails() {
    let text = "FROM rust:1 AS builder\nWORKDIR /src\nCOPY Cargo.toml Cargo.lock ./\n\
                COPY crates/core/Cargo.toml crates/core/Cargo.toml\n\
                RUN mkdir -p src && : > src/lib.rs && echo 'fn main() {}' > src/main.rs \\\n    && cargo build --release --locked -p mmrouter\n\
                FROM debian:bookworm-slim\nCOPY --from=builder /src/target/release/mmrouter /usr/local/bin/\nCOPY nothing/here /x\n\
                ENTRYPOINT [\"mmrouter\"]\nCMD [\"serve\", \"--listen\"]\n";
    let problems = dockerfile_problems(text).join("\n");
    for want in [
        "crates/kv-events/Cargo.toml is not there",
        "crates/core/src/lib.rs is not there",
        "crates/core/benches/index.rs or crates/core/benches/index/main.rs is not there",
        "RUN fails",
        "COPY nothing/here: not there",
        "does not parse",
    ] {
        assert!(problems.contains(want), "no `{want}` in:\n{problems}");
    }
}

#[test]
fn the_dockerignore_reader_matches_as_docker_does() {
    let ignore = Ignore(vec![vec!["**".into(), "target".into()], vec!["*.profraw".into()], vec!["bench".into()]]);
    for (path, excluded) in [
        ("target/release/x", true),
        ("crates/core/target", true),
        ("a.profraw", true),
        ("src/a.profraw", false),
        ("bench/run.sh", true),
        ("crates/bench.rs", false),
        ("src/main.rs", false),
    ] {
        assert_eq!(ignore.excludes(Path::new(path)), excluded, "{path}");
    }
}

/// docker-compose.yml, as far as this test reads it: each service's `build`, `image`, `command` (a
/// JSON-style list) and `volumes` (`./host:/container[:mode]`).
#[derive(Debug, Default)]
struct Service {
    name: String,
    build: Option<String>,
    image: Option<String>,
    command: Option<Result<Vec<String>, String>>,
    volumes: Vec<String>,
}

fn services(text: &str) -> Vec<Service> {
    let mut out: Vec<Service> = Vec::new();
    let (mut in_services, mut key) = (false, String::new());
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let indent = line.len() - line.trim_start().len();
        let body = line.trim();
        if body.is_empty() || body.starts_with('#') {
            continue;
        }
        if indent == 0 {
            in_services = body == "services:";
            continue;
        }
        let Some(service) = out.last_mut().filter(|_| in_services && indent > 2) else {
            if in_services && indent == 2 {
                out.push(Service { name: body.trim_end_matches(':').to_string(), ..Default::default() });
            }
            continue;
        };
        if indent == 4 {
            let (k, v) = body.split_once(':').unwrap_or((body, ""));
            key = k.to_string();
            let mut value = v.trim().to_string();
            while value.matches('[').count() > value.matches(']').count() {
                value.push_str(lines.next().unwrap_or("]").trim());
            }
            match k {
                "build" => service.build = Some(value),
                "image" => service.image = Some(value),
                "command" => service.command = Some(json_list(&value)),
                _ => {}
            }
        } else if key == "volumes" {
            if let Some(v) = body.strip_prefix("- ") {
                service.volumes.push(v.trim().to_string());
            }
        }
    }
    out
}

fn compose_problems(text: &str) -> Vec<String> {
    let services = services(text);
    let mut problems = Vec::new();
    let built: Vec<&str> = services.iter().filter(|s| s.build.is_some()).filter_map(|s| s.image.as_deref()).collect();
    let runtime = stages(&read(&repo().join("Dockerfile"))).pop().expect("a runtime stage");
    for s in &services {
        if let Some(context) = &s.build {
            if !repo().join(context).join("Dockerfile").exists() {
                problems.push(format!("{}: build: {context} has no Dockerfile", s.name));
            }
        }
        let mut mounts = Vec::new();
        for v in &s.volumes {
            let (host, inside) = v.split_once(':').unwrap_or((v, ""));
            let inside = inside.split(':').next().unwrap_or_default();
            if host.starts_with('.') && !repo().join(host).exists() {
                problems.push(format!("{}: volume {host} is not in the repository", s.name));
            }
            mounts.push((inside.to_string(), repo().join(host)));
        }
        mounts.extend(image_paths(&runtime));
        match (&s.command, s.image.as_deref().is_some_and(|i| built.contains(&i))) {
            (Some(Err(e)), _) => problems.push(format!("{}: command {e}", s.name)),
            (Some(Ok(cmd)), true) => problems.extend(command_problems(&s.name, cmd, &mounts)),
            _ => {}
        }
    }
    problems
}

#[test]
fn docker_compose_paths_exist_and_its_commands_parse() {
    let text = read(&repo().join("docker-compose.yml"));
    let services = services(&text);
    let commands = services.iter().filter(|s| s.command.is_some()).count();
    assert!(commands >= 3, "the reader found {commands} commands in: {services:#?}");
    let problems = compose_problems(&text);
    assert!(problems.is_empty(), "docker-compose.yml:\n{}", problems.join("\n"));
    // The reader catches what it must.
    let broken = text.replace("\"--block-size\"", "\"--blocksize\"").replace("./config/compose/", "./config/nowhere/");
    let problems = compose_problems(&broken).join("\n");
    assert!(problems.contains("does not parse") && problems.contains("--blocksize"), "{problems}");
    assert!(problems.contains("volume ./config/nowhere/mmrouter.toml is not in the repository"), "{problems}");
}
