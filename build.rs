//! Sets `MMROUTER_VERSION` for `mmrouter --version`: the crate version, plus the git commit when built
//! from a checkout of this repository (or named by `MMROUTER_GIT_COMMIT`, for builds without `.git`:
//! a container, a source archive). No git, no repository: the version alone.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=MMROUTER_GIT_COMMIT");
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    let commit = std::env::var("MMROUTER_GIT_COMMIT").ok().filter(|c| !c.trim().is_empty()).or_else(git_commit);
    match commit {
        Some(c) => println!("cargo:rustc-env=MMROUTER_VERSION={version} (commit {})", c.trim()),
        None => println!("cargo:rustc-env=MMROUTER_VERSION={version}"),
    }
}

/// HEAD's short hash, if the manifest directory is the top of a git work tree (not a copy vendored
/// inside another repository, whose commit would be someone else's).
fn git_commit() -> Option<String> {
    let dir = std::env::var("CARGO_MANIFEST_DIR").ok()?;
    let top = git(&dir, &["rev-parse", "--show-toplevel"])?;
    if Path::new(&top).canonicalize().ok()? != Path::new(&dir).canonicalize().ok()? {
        return None;
    }
    // Rebuild when HEAD moves. Only paths that exist: cargo treats a missing one as always changed,
    // which would rebuild the crate on every build.
    let mut watch = vec!["HEAD".to_owned(), "logs/HEAD".to_owned()];
    watch.extend(git(&dir, &["symbolic-ref", "-q", "HEAD"]));
    for name in watch {
        if let Some(path) = git(&dir, &["rev-parse", "--path-format=absolute", "--git-path", &name]) {
            if Path::new(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    git(&dir, &["rev-parse", "--short=12", "HEAD"])
}

fn git(dir: &str, args: &[&str]) -> Option<String> {
    let out = Command::new("git").arg("-C").arg(dir).args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !text.is_empty()).then_some(text)
}
