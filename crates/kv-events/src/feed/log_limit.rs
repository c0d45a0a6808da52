//! Rate-limited logging of what a publisher can trigger at will: refused input and resets.
//!
//! A hostile or broken publisher can make every message a refusal; one log line each once produced 214 MB
//! of log in 20 s. The first occurrence of each kind is logged with its details, later ones are counted
//! and summarised in at most one line per [`SUMMARY_INTERVAL`].

use std::time::Duration;

use tokio::time::Instant;

/// Minimum time between two summary lines of one feed.
pub(crate) const SUMMARY_INTERVAL: Duration = Duration::from_secs(10);

/// What to do with one occurrence.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// First of its kind: log it in full.
    Log,
    /// Suppressed; the summary of what was suppressed since the last one is due now.
    Summary(Vec<(&'static str, u64)>),
    /// Suppressed, nothing to log.
    Quiet,
}

#[derive(Debug)]
pub(crate) struct LogLimit {
    seen: Vec<&'static str>,
    suppressed: Vec<(&'static str, u64)>,
    last_summary: Instant,
}

impl LogLimit {
    pub(crate) fn new() -> Self {
        LogLimit { seen: Vec::new(), suppressed: Vec::new(), last_summary: Instant::now() }
    }

    /// Records one occurrence of `kind` at `now`.
    pub(crate) fn record(&mut self, kind: &'static str, now: Instant) -> Verdict {
        if !self.seen.contains(&kind) {
            self.seen.push(kind);
            return Verdict::Log;
        }
        match self.suppressed.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += 1,
            None => self.suppressed.push((kind, 1)),
        }
        if now.duration_since(self.last_summary) < SUMMARY_INTERVAL {
            return Verdict::Quiet;
        }
        self.last_summary = now;
        Verdict::Summary(std::mem::take(&mut self.suppressed))
    }
}

/// Logs one refusal or reset through `limit`: `detail` runs only for the first of its kind.
pub(crate) fn warn(limit: &mut LogLimit, endpoint: &str, kind: &'static str, detail: impl FnOnce()) {
    match limit.record(kind, Instant::now()) {
        Verdict::Log => detail(),
        Verdict::Summary(counts) => {
            tracing::warn!(endpoint, suppressed = ?counts, "kv event feed: more refusals or resets (repeats suppressed)")
        }
        Verdict::Quiet => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_of_each_kind_then_one_summary_per_interval() {
        let mut l = LogLimit::new();
        let t0 = Instant::now();
        assert_eq!(l.record("a", t0), Verdict::Log);
        assert_eq!(l.record("b", t0), Verdict::Log);
        for _ in 0..1000 {
            assert_eq!(l.record("a", t0 + Duration::from_secs(1)), Verdict::Quiet);
        }
        assert_eq!(l.record("b", t0 + Duration::from_secs(2)), Verdict::Quiet);
        assert_eq!(l.record("a", t0 + SUMMARY_INTERVAL), Verdict::Summary(vec![("a", 1001), ("b", 1)]));
        assert_eq!(l.record("a", t0 + SUMMARY_INTERVAL + Duration::from_secs(1)), Verdict::Quiet);
        assert_eq!(l.record("a", t0 + 2 * SUMMARY_INTERVAL), Verdict::Summary(vec![("a", 2)]));
    }
}
