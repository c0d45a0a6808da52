//! What `mmrouter doctor` found: one line per check and worker, printed as a table (a fix hint under
//! each failed line) or as JSON for automation.

use std::fmt::Write as _;

/// A check's outcome. `Skip` is neither: the check does not apply (an engine without the endpoint,
/// a worker without KV events) or an earlier failure makes it meaningless.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Fail,
    Skip,
}

/// One check of one worker.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Line {
    pub pool: String,
    pub worker: String,
    pub check: &'static str,
    pub status: Status,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

/// The lines of one worker, in the order the checks ran.
pub struct Checks {
    pool: String,
    worker: String,
    pub lines: Vec<Line>,
    /// The names the worker's `/v1/models` served, once read (a pool's legs are compared on them).
    pub served: Option<Vec<String>>,
}

impl Checks {
    pub fn new(pool: &str, worker: &str) -> Checks {
        Checks { pool: pool.to_owned(), worker: worker.to_owned(), lines: Vec::new(), served: None }
    }

    fn push(&mut self, check: &'static str, status: Status, detail: String, hint: Option<String>) {
        self.lines.push(Line { pool: self.pool.clone(), worker: self.worker.clone(), check, status, detail, hint });
    }

    pub fn ok(&mut self, check: &'static str, detail: impl Into<String>) {
        self.push(check, Status::Ok, detail.into(), None);
    }

    pub fn fail(&mut self, check: &'static str, detail: impl Into<String>, hint: impl Into<String>) {
        self.push(check, Status::Fail, detail.into(), Some(hint.into()));
    }

    pub fn skip(&mut self, check: &'static str, detail: impl Into<String>) {
        self.push(check, Status::Skip, detail.into(), None);
    }

    /// `Ok` or `Fail` on `passed`.
    pub fn check(&mut self, check: &'static str, passed: bool, detail: String, hint: impl FnOnce() -> String) {
        if passed {
            self.ok(check, detail);
        } else {
            self.fail(check, detail, hint());
        }
    }
}

pub fn failed(lines: &[Line]) -> usize {
    lines.iter().filter(|l| l.status == Status::Fail).count()
}

/// Aligned columns; each failed line is followed by its fix hint.
pub fn table(lines: &[Line]) -> String {
    let width = |f: fn(&Line) -> usize, title: &str| lines.iter().map(f).max().unwrap_or(0).max(title.len());
    let (pw, ww, cw) =
        (width(|l| l.pool.len(), "pool"), width(|l| l.worker.len(), "worker"), width(|l| l.check.len(), "check"));
    let mut out = format!("{:pw$}  {:ww$}  {:cw$}  {:6}  detail\n", "pool", "worker", "check", "result");
    for l in lines {
        let status = match l.status {
            Status::Ok => "ok",
            Status::Fail => "FAIL",
            Status::Skip => "skip",
        };
        let _ = writeln!(out, "{:pw$}  {:ww$}  {:cw$}  {status:6}  {}", l.pool, l.worker, l.check, l.detail);
        if let (Status::Fail, Some(hint)) = (l.status, &l.hint) {
            let _ = writeln!(out, "{:indent$}fix: {hint}", "", indent = pw + ww + cw + 14);
        }
    }
    let failed = failed(lines);
    let _ = writeln!(out, "{} checks, {failed} failed", lines.len());
    out
}

pub fn json(lines: &[Line]) -> serde_json::Value {
    serde_json::json!({ "ok": failed(lines) == 0, "failed": failed(lines), "checks": lines })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_line_carries_its_hint_and_counts() {
        let mut c = Checks::new("p", "w");
        c.ok("reachable", "/health 200");
        c.fail("block_size", "worker 64, pool 32", "start the worker with --block-size 32");
        c.skip("render_text", "no render endpoint");
        let text = table(&c.lines);
        let row = text.lines().find(|l| l.contains("block_size")).expect("a block_size row");
        assert_eq!(
            row.split_whitespace().take(5).collect::<Vec<_>>(),
            ["p", "w", "block_size", "FAIL", "worker"],
            "{text}"
        );
        assert!(text.contains("fix: start the worker with --block-size 32"), "{text}");
        assert!(text.ends_with("3 checks, 1 failed\n"), "{text}");
        let j = json(&c.lines);
        assert_eq!((j["ok"].as_bool(), j["failed"].as_u64()), (Some(false), Some(1)));
        assert_eq!(j["checks"][1]["status"], "fail");
        assert!(j["checks"][0].get("hint").is_none());
    }
}
