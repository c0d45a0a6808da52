//! The README's shell examples run as written against the demo the README starts (issue 46 item 2).
//!
//! The rule, applied to every fenced `sh` block of README.md, in order:
//! * the block with an `mmrouter demo …` line starts the demo: the test runs the binary with that
//!   line's arguments and `--port 0` in place of the README's port (an ephemeral port on 127.0.0.1,
//!   read back from the demo's banner);
//! * a block whose commands are all `curl` (shell variable assignments and here-documents allowed
//!   beside them) runs against that demo: its text goes to `bash -euo pipefail` in the repository root,
//!   with `127.0.0.1:8080` and `localhost:8080` replaced by the demo's address and every `curl` through
//!   a wrapper that fails unless the answer's status is 2xx;
//! * every other block (install, build, `serve` in front of your own workers, containers) cannot run
//!   here and is skipped — printed with its first command, never silently — and a skipped block that
//!   holds a `curl` command fails the test, so no example escapes by sitting beside one that cannot run.
//!
//! Nothing leaves 127.0.0.1: proxies are unset for the commands, and the demo's workers are its own.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A fenced block: its info string, the line it starts on, its text.
struct Block {
    lang: String,
    line: usize,
    text: String,
}

fn fenced_blocks(markdown: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in markdown.lines().enumerate() {
        let fence = line.trim_start().starts_with("```");
        match (&mut open, fence) {
            (None, true) => {
                let lang = line.trim_start().trim_start_matches('`').trim().to_owned();
                open = Some(Block { lang, line: i + 1, text: String::new() });
            }
            (Some(_), true) => blocks.push(open.take().unwrap()),
            (Some(b), false) => {
                b.text.push_str(line);
                b.text.push('\n');
            }
            (None, false) => {}
        }
    }
    assert!(open.is_none(), "README.md has an unclosed code fence");
    blocks
}

/// A block's commands: comment and blank lines dropped, `\`-continued lines joined, here-document
/// bodies skipped (they are a command's input, not commands).
fn commands(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut heredoc: Option<String> = None;
    for line in text.lines() {
        if let Some(end) = &heredoc {
            if line.trim() == end {
                heredoc = None;
            }
            continue;
        }
        let trimmed = line.trim();
        if current.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        if let Some(at) = trimmed.find("<<") {
            let word = trimmed[at + 2..].trim_start_matches('-').trim();
            let word: String =
                word.chars().filter(|c| *c != '\'' && *c != '"').take_while(|c| !c.is_whitespace()).collect();
            if !word.is_empty() {
                heredoc = Some(word);
            }
        }
        match trimmed.strip_suffix('\\') {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                out.push(std::mem::take(&mut current));
            }
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// `NAME=value` (a shell variable assignment, setting up a later command).
fn is_assignment(command: &str) -> bool {
    let name: String = command.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
    !name.is_empty() && !name.starts_with(|c: char| c.is_ascii_digit()) && command[name.len()..].starts_with('=')
}

fn first_word(command: &str) -> &str {
    command.split_whitespace().next().unwrap_or("")
}

/// The demo's arguments from an `mmrouter demo …` line, its trailing comment dropped and its port
/// replaced by 0.
fn demo_args(command: &str) -> Vec<String> {
    let without_comment = command.split(" #").next().unwrap();
    let words: Vec<&str> = without_comment.split_whitespace().collect();
    assert_eq!(&words[..2], ["mmrouter", "demo"], "{command}");
    let mut args = Vec::new();
    let mut rest = words[2..].iter();
    while let Some(w) = rest.next() {
        if *w == "--port" {
            rest.next();
        } else if !w.starts_with("--port=") {
            args.push((*w).to_owned());
        }
    }
    args.extend(["--port".to_owned(), "0".to_owned()]);
    args
}

/// The demo process, stopped when dropped.
struct Demo {
    child: Child,
    addr: String,
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_demo(args: &[String]) -> Demo {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mmrouter"))
        .arg("demo")
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the demo starts");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            println!("demo: {line}");
            let _ = tx.send(line);
        }
    });
    let mut demo = Demo { child, addr: String::new() };
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while demo.addr.is_empty() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = rx.recv_timeout(left).expect("the demo prints the address it listens on");
        if let Some(rest) = line.split("http://127.0.0.1:").nth(1) {
            let port: String = rest.chars().take_while(char::is_ascii_digit).collect();
            demo.addr = format!("127.0.0.1:{port}");
        }
    }
    demo
}

/// `curl` as the README's commands call it, failing unless the status is 2xx (curl's own `-f`
/// lets 1xx/3xx through and drops the body an error would be read from).
const PRELUDE: &str = r#"set -euo pipefail
curl() {
  local body code
  body=$(mktemp)
  code=$(command curl -sS --max-time 60 -o "$body" -w '%{http_code}' "$@") || { cat "$body"; rm -f "$body"; return 1; }
  cat "$body"
  rm -f "$body"
  echo
  case "$code" in
    2??) echo "[readme test] HTTP $code" >&2 ;;
    *) echo "[readme test] HTTP $code: not 2xx" >&2; return 1 ;;
  esac
}
"#;

/// Runs `script` (the README's text, port substituted) through the wrapper: (success, stdout, stderr).
fn run_script(script: &str, root: &Path) -> (bool, String, String) {
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!("{PRELUDE}{script}"))
        .current_dir(root)
        .env_remove("http_proxy")
        .env_remove("HTTP_PROXY")
        .env_remove("https_proxy")
        .env_remove("HTTPS_PROXY")
        .env_remove("all_proxy")
        .env_remove("ALL_PROXY")
        .env("no_proxy", "127.0.0.1,localhost")
        .output()
        .expect("bash runs");
    let stdout: String = String::from_utf8_lossy(&out.stdout).chars().take(2000).collect();
    (out.status.success(), stdout, String::from_utf8_lossy(&out.stderr).into_owned())
}

fn run_block(block: &Block, addr: &str, root: &Path) {
    let script = block.text.replace("127.0.0.1:8080", addr).replace("localhost:8080", addr);
    let (ok, stdout, stderr) = run_script(&script, root);
    println!("README.md:{} ran (ok: {ok}):\n{stdout}\n{stderr}", block.line);
    assert!(
        ok,
        "README.md:{}: the example fails against the demo the README starts:\n{script}\nstdout: {stdout}\nstderr: {stderr}",
        block.line
    );
}

fn curl_available() -> bool {
    let ok = Command::new("curl").arg("--version").output().map(|o| o.status.success()).unwrap_or(false);
    if !ok {
        assert!(std::env::var_os("CI").is_none(), "curl missing: CI needs it for the README test");
        eprintln!("skipping the README examples: no curl on PATH");
    }
    ok
}

#[test]
fn the_readmes_examples_run_against_the_demo_it_starts() {
    if !curl_available() {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let blocks: Vec<Block> = fenced_blocks(&readme).into_iter().filter(|b| b.lang == "sh").collect();

    let mut demo: Option<Demo> = None;
    let mut ran = 0;
    for block in &blocks {
        let cmds = commands(&block.text);
        if let Some(line) = cmds.iter().find(|c| c.starts_with("mmrouter demo")) {
            assert!(demo.is_none(), "README.md:{}: a second `mmrouter demo` block", block.line);
            assert_eq!(cmds.len(), 1, "README.md:{}: the demo's block holds the demo alone: {cmds:?}", block.line);
            demo = Some(start_demo(&demo_args(line)));
            continue;
        }
        let curls = cmds.iter().filter(|c| first_word(c) == "curl").count();
        let setup = cmds.iter().filter(|c| is_assignment(c)).count();
        if curls > 0 && curls + setup == cmds.len() {
            let demo = demo.as_ref().unwrap_or_else(|| {
                panic!("README.md:{}: a curl example before the README starts the demo", block.line)
            });
            run_block(block, &demo.addr, root);
            ran += 1;
        } else {
            assert_eq!(
                curls, 0,
                "README.md:{}: a curl example in a block with commands the test cannot run; give it its own block:\n{}",
                block.line, block.text
            );
            println!("README.md:{}: skipped (not curl against the demo): {}", block.line, first_word(&cmds[0]));
        }
    }
    let demo = demo.expect("README.md starts no demo (`mmrouter demo` in an sh block)");
    assert!(ran > 0, "README.md has no curl example to run against the demo");

    // The check has teeth: the example the issue found (`"model": "m"`, which the default two-pool
    // demo answers 404 `model_not_found`) fails through the same wrapper.
    let rejected = format!(
        "curl -s http://{}/debug/route -H 'content-type: application/json' \\\n  -d '{{\"model\":\"m\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}]}}'\n",
        demo.addr
    );
    let (ok, stdout, _) = run_script(&rejected, root);
    assert!(!ok, "an example the demo answers 404 must fail the README test: {stdout}");
    assert!(stdout.contains("model_not_found"), "{stdout}");
}

/// The rule itself, on a README that breaks it: the example the issue found (`"model": "m"` on the
/// two-pool demo) must fail, and a curl hidden among other commands must not be skipped quietly.
#[test]
fn the_rule_classifies_blocks() {
    let md = "```sh\nmmrouter demo   # the demo\n```\n\n```sh\n# text\nIMG=$(base64 -w0 x.jpg)\ncurl -s http://127.0.0.1:8080/v1/models\ncurl -si http://127.0.0.1:8080/x -d @- <<EOF\n{\"a\": \"$IMG\"}\nEOF\n```\n\n```sh\ncargo install --path .\ncurl -s localhost:8080/health\n```\n";
    let blocks = fenced_blocks(md);
    assert_eq!(blocks.len(), 3);
    assert_eq!(demo_args(&commands(&blocks[0].text)[0]), ["--port", "0"]);
    assert_eq!(demo_args("mmrouter demo --port 8080 --model qwen3-vl"), ["--model", "qwen3-vl", "--port", "0"]);
    let c = commands(&blocks[1].text);
    assert_eq!(c.len(), 3, "{c:?}");
    assert!(is_assignment(&c[0]) && first_word(&c[1]) == "curl" && first_word(&c[2]) == "curl");
    let c = commands(&blocks[2].text);
    assert_eq!(c.iter().filter(|c| first_word(c) == "curl").count(), 1);
    assert_eq!(first_word(&c[0]), "cargo");
    assert_eq!(commands("curl a \\\n  -d b\n").len(), 1);
}
