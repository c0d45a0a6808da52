//! A worker's availability: one state machine fed by both the active health checks and the outcome of
//! every request sent to it (passive outlier detection).
//!
//! ```text
//!            failures ≥ threshold                 back-off over
//! Healthy ─────────────────────────► Ejected ───────────────────► HalfOpen ── probe ok / check ok ──► Healthy
//!    ▲  ▲                              ▲                               │
//!    │  └───── check ok ─── Down       └────────── probe failed ───────┘   (back-off doubles, capped)
//!    │                       ▲
//!    └──── (any state) ──────┴── health check failed
//! ```
//!
//! * **Healthy** takes full traffic.
//! * **Ejected until T** takes none; its index entries are kept, so it comes back with its cache
//!   (unless it was ejected for refusing connections: it likely restarted, see [`Failure::Connect`]).
//! * **HalfOpen** (T passed) admits exactly one request at a time, the probe; its success (or a passing
//!   health check) makes the worker healthy again, its failure ejects it for twice as long.
//! * **Down**: its `/health` failed. Only a passing check brings it back (as before this module).
//!
//! Ejection triggers on `consecutive_failures` failures in a row, or on a failure rate of at least
//! `failure_rate` over the last `failure_window` outcomes (a worker failing 30 % of its requests
//! rarely fails 5 in a row). Never more than `max_ejected_percent` of the pool is ejected at once
//! (at least one worker may be), so ejection cannot empty the pool because of an outage everywhere.

use std::time::{Duration, Instant};

use serde::Deserialize;

/// `[ejection]` section of the configuration.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EjectionConfig {
    /// Failures in a row that eject a worker; 0 disables this trigger.
    pub consecutive_failures: u32,
    /// Failure fraction over the last `failure_window` outcomes that ejects a worker; 0 disables.
    pub failure_rate: f64,
    /// Outcomes the failure rate is computed over (the window must be full), 1..=64.
    pub failure_window: u32,
    /// First ejection's length; each ejection in a row (a failed probe) doubles it.
    pub base_ejection_ms: u64,
    /// Cap on the ejection length.
    pub max_ejection_ms: u64,
    /// At most this share of the pool is ejected at once (at least one worker always may be).
    pub max_ejected_percent: u32,
}

impl Default for EjectionConfig {
    fn default() -> Self {
        EjectionConfig {
            consecutive_failures: 5,
            failure_rate: 0.25,
            failure_window: 20,
            base_ejection_ms: 30_000,
            max_ejection_ms: 300_000,
            max_ejected_percent: 50,
        }
    }
}

/// Why an ejection configuration is refused; the message names the key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EjectionError {
    #[error("{key} must be between {min} and {max} (got {value})")]
    OutOfRange { key: &'static str, min: f64, max: f64, value: f64 },
    #[error("ejection.max_ejection_ms must be >= ejection.base_ejection_ms")]
    CapBelowBase,
}

impl EjectionError {
    /// Stable snake_case label.
    pub fn label(&self) -> &'static str {
        match self {
            EjectionError::OutOfRange { .. } => "out_of_range",
            EjectionError::CapBelowBase => "cap_below_base",
        }
    }
}

impl EjectionConfig {
    pub fn validate(&self) -> Result<(), EjectionError> {
        let checks: [(&'static str, f64, f64, f64); 5] = [
            ("ejection.failure_rate", self.failure_rate, 0.0, 1.0),
            ("ejection.failure_window", f64::from(self.failure_window), 1.0, 64.0),
            ("ejection.base_ejection_ms", self.base_ejection_ms as f64, 1.0, 86_400_000.0),
            ("ejection.max_ejection_ms", self.max_ejection_ms as f64, 1.0, 86_400_000.0),
            ("ejection.max_ejected_percent", f64::from(self.max_ejected_percent), 0.0, 100.0),
        ];
        for (key, value, min, max) in checks {
            if !value.is_finite() || value < min || value > max {
                return Err(EjectionError::OutOfRange { key, min, max, value });
            }
        }
        if self.max_ejection_ms < self.base_ejection_ms {
            return Err(EjectionError::CapBelowBase);
        }
        Ok(())
    }

    /// How many of `pool` workers may be ejected at once.
    pub fn max_ejected(&self, pool: usize) -> usize {
        (pool * self.max_ejected_percent as usize / 100).max(1)
    }

    /// The `n`-th ejection in a row (1-based) lasts base × 2^(n-1), capped.
    fn ejection_length(&self, n: u32) -> Duration {
        let factor = 1u64 << n.saturating_sub(1).min(20);
        Duration::from_millis(self.base_ejection_ms.saturating_mul(factor).min(self.max_ejection_ms))
    }
}

/// A worker's availability, as exported (`mmrouter_worker_state{state}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Availability {
    Healthy,
    Ejected,
    HalfOpen,
    Down,
}

impl Availability {
    pub const ALL: [Availability; 4] =
        [Availability::Healthy, Availability::Ejected, Availability::HalfOpen, Availability::Down];

    pub fn label(self) -> &'static str {
        match self {
            Availability::Healthy => "healthy",
            Availability::Ejected => "ejected",
            Availability::HalfOpen => "half_open",
            Availability::Down => "down",
        }
    }
}

/// What went wrong with one request to a worker (before or after its first byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The worker refused or did not accept the connection: ejected at once, and its index entries
    /// forgotten (a worker that stopped listening has most likely restarted with an empty cache).
    Connect,
    /// A 5xx, a timeout, a transport error, a body cut mid-way.
    Error,
}

/// A state change worth logging and counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    /// Ejected for this long; `clear_index`: forget its cached blocks.
    Ejected { length: Duration, clear_index: bool },
    /// Back to full traffic after a successful probe.
    Recovered,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Healthy,
    Ejected { until: Instant },
    HalfOpen { probing: bool },
    Down,
}

/// The state machine of one worker (see the module docs). Time is passed in, so tests drive it.
#[derive(Debug)]
pub(crate) struct Outlier {
    mode: Mode,
    /// Failures in a row.
    consecutive: u32,
    /// The last outcomes, newest in bit 0 (1 = failure), and how many of the bits are filled.
    recent: u64,
    filled: u32,
    /// Ejections in a row (a failed probe adds one; recovery resets): the back-off exponent.
    ejections: u32,
}

impl Outlier {
    pub(crate) fn new() -> Outlier {
        Outlier { mode: Mode::Healthy, consecutive: 0, recent: 0, filled: 0, ejections: 0 }
    }

    pub(crate) fn is_healthy(&self) -> bool {
        self.mode == Mode::Healthy
    }

    pub(crate) fn availability(&self, now: Instant) -> Availability {
        match self.mode {
            Mode::Healthy => Availability::Healthy,
            Mode::Ejected { until } if now < until => Availability::Ejected,
            Mode::Ejected { .. } | Mode::HalfOpen { .. } => Availability::HalfOpen,
            Mode::Down => Availability::Down,
        }
    }

    /// May a request be sent now? (A half-open worker: only if no probe is out.)
    pub(crate) fn selectable(&self, now: Instant) -> bool {
        match self.mode {
            Mode::Healthy => true,
            Mode::Ejected { until } => now >= until,
            Mode::HalfOpen { probing } => !probing,
            Mode::Down => false,
        }
    }

    /// Claims the right to send one request now. `Some(true)`: it is the half-open probe (the caller
    /// must resolve it with [`Self::succeeded`] / [`Self::failed`] or give it back with
    /// [`Self::release_probe`]); `Some(false)`: a normal request; `None`: not admitted.
    pub(crate) fn admit(&mut self, now: Instant) -> Option<bool> {
        match self.mode {
            Mode::Healthy => Some(false),
            Mode::Ejected { until } if now >= until => {
                self.mode = Mode::HalfOpen { probing: true };
                Some(true)
            }
            Mode::HalfOpen { probing: false } => {
                self.mode = Mode::HalfOpen { probing: true };
                Some(true)
            }
            Mode::Ejected { .. } | Mode::HalfOpen { probing: true } | Mode::Down => None,
        }
    }

    /// A probe ended without an answer either way (the client went away): the next request probes.
    pub(crate) fn release_probe(&mut self) {
        if self.mode == (Mode::HalfOpen { probing: true }) {
            self.mode = Mode::HalfOpen { probing: false };
        }
    }

    /// A request got a good answer. `probe`: it was the half-open worker's probe.
    pub(crate) fn succeeded(&mut self, probe: bool) -> Option<Transition> {
        match self.mode {
            Mode::Healthy => {
                self.consecutive = 0;
                self.push(false);
                None
            }
            Mode::HalfOpen { .. } | Mode::Ejected { .. } if probe => {
                self.recover();
                Some(Transition::Recovered)
            }
            // A late answer to a request sent before the ejection says nothing about the worker now.
            _ => None,
        }
    }

    /// A request failed. `may_eject`: the pool's ejection cap leaves room for one more; `probe`: it
    /// was the half-open worker's probe.
    pub(crate) fn failed(
        &mut self,
        failure: Failure,
        cfg: &EjectionConfig,
        may_eject: bool,
        probe: bool,
        now: Instant,
    ) -> Option<Transition> {
        match self.mode {
            Mode::Healthy => {
                self.consecutive = self.consecutive.saturating_add(1);
                self.push(true);
                if failure == Failure::Connect {
                    Some(self.eject(cfg, now, true))
                } else if may_eject && self.tripped(cfg) {
                    Some(self.eject(cfg, now, false))
                } else {
                    None
                }
            }
            // A failed probe: back out, for longer. The pool cap does not apply: it is already out.
            Mode::HalfOpen { .. } | Mode::Ejected { .. } if probe => {
                Some(self.eject(cfg, now, failure == Failure::Connect))
            }
            // Requests sent before the ejection failing late must not stretch the back-off.
            _ => None,
        }
    }

    /// The active health check's verdict. Returns true if the worker became healthy or down.
    pub(crate) fn checked(&mut self, ok: bool, now: Instant) -> bool {
        match (ok, self.availability(now)) {
            (false, Availability::Down) => false,
            (false, _) => {
                self.mode = Mode::Down;
                true
            }
            // A passing check ends a half-open period (it stands for the probe) or a down period; an
            // ejection's back-off runs its course (a worker answering 500s usually passes `/health`).
            (true, Availability::HalfOpen) | (true, Availability::Down) => {
                self.recover();
                true
            }
            (true, _) => false,
        }
    }

    fn recover(&mut self) {
        self.mode = Mode::Healthy;
        self.ejections = 0;
        self.consecutive = 0;
        self.recent = 0;
        self.filled = 0;
    }

    fn eject(&mut self, cfg: &EjectionConfig, now: Instant, clear_index: bool) -> Transition {
        self.ejections = self.ejections.saturating_add(1);
        let length = cfg.ejection_length(self.ejections);
        self.mode = Mode::Ejected { until: now + length };
        // A fresh record after the ejection: the old failures must not trip the next probe period.
        self.consecutive = 0;
        self.recent = 0;
        self.filled = 0;
        Transition::Ejected { length, clear_index }
    }

    fn tripped(&self, cfg: &EjectionConfig) -> bool {
        if cfg.consecutive_failures > 0 && self.consecutive >= cfg.consecutive_failures {
            return true;
        }
        let window = cfg.failure_window.clamp(1, 64);
        if cfg.failure_rate <= 0.0 || self.filled < window {
            return false;
        }
        let mask = if window == 64 { u64::MAX } else { (1u64 << window) - 1 };
        let failures = (self.recent & mask).count_ones();
        f64::from(failures) >= cfg.failure_rate * f64::from(window)
    }

    fn push(&mut self, failure: bool) {
        self.recent = (self.recent << 1) | u64::from(failure);
        self.filled = (self.filled + 1).min(64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> EjectionConfig {
        EjectionConfig { base_ejection_ms: 1_000, max_ejection_ms: 4_000, ..EjectionConfig::default() }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn defaults_are_valid_and_bad_values_name_their_key() {
        assert_eq!(EjectionConfig::default().validate(), Ok(()));
        let bad = |f: fn(&mut EjectionConfig)| {
            let mut c = EjectionConfig::default();
            f(&mut c);
            c.validate().expect_err("refused")
        };
        assert!(bad(|c| c.failure_rate = 1.5).to_string().contains("ejection.failure_rate"));
        assert!(bad(|c| c.failure_rate = f64::NAN).to_string().contains("ejection.failure_rate"));
        assert!(bad(|c| c.failure_window = 0).to_string().contains("ejection.failure_window"));
        assert!(bad(|c| c.failure_window = 65).to_string().contains("ejection.failure_window"));
        assert!(bad(|c| c.base_ejection_ms = 0).to_string().contains("ejection.base_ejection_ms"));
        assert!(bad(|c| c.max_ejected_percent = 101).to_string().contains("ejection.max_ejected_percent"));
        assert_eq!(bad(|c| c.max_ejection_ms = 10).label(), "cap_below_base");
    }

    #[test]
    fn consecutive_failures_eject_and_the_back_off_doubles_up_to_the_cap() {
        let (c, t0) = (cfg(), Instant::now());
        let mut o = Outlier::new();
        for _ in 0..4 {
            assert_eq!(o.failed(Failure::Error, &c, true, false, t0), None);
        }
        assert_eq!(o.succeeded(false), None, "a success resets the run");
        for _ in 0..4 {
            assert_eq!(o.failed(Failure::Error, &c, true, false, t0), None);
        }
        let t = o.failed(Failure::Error, &c, true, false, t0);
        assert_eq!(t, Some(Transition::Ejected { length: ms(1_000), clear_index: false }));
        assert_eq!(o.availability(t0), Availability::Ejected);
        assert!(!o.selectable(t0 + ms(999)));
        assert_eq!(o.admit(t0 + ms(999)), None);
        // Back-off over: half-open, one probe at a time.
        let t1 = t0 + ms(1_000);
        assert_eq!(o.availability(t1), Availability::HalfOpen);
        assert!(o.selectable(t1));
        assert_eq!(o.admit(t1), Some(true));
        assert!(!o.selectable(t1));
        assert_eq!(o.admit(t1), None, "only one probe");
        // The probe fails: ejected twice as long, then four times, then capped.
        let lengths: Vec<_> = [2_000, 4_000, 4_000]
            .iter()
            .scan(t1, |now, _| {
                let t = o.failed(Failure::Error, &c, false, true, *now);
                let Some(Transition::Ejected { length, .. }) = t else { panic!("{t:?}") };
                *now += length;
                assert_eq!(o.admit(*now), Some(true));
                Some(length.as_millis() as u64)
            })
            .collect();
        assert_eq!(lengths, vec![2_000, 4_000, 4_000]);
        assert_eq!(o.succeeded(true), Some(Transition::Recovered));
        assert_eq!(o.availability(t1), Availability::Healthy);
        // Recovery reset the exponent.
        for _ in 0..5 {
            o.failed(Failure::Error, &c, true, false, t1);
        }
        assert_eq!(o.availability(t1), Availability::Ejected);
        assert_eq!(o.admit(t1 + ms(1_000)), Some(true));
    }

    #[test]
    fn a_failure_rate_ejects_without_failures_in_a_row() {
        let (c, now) = (cfg(), Instant::now());
        let mut o = Outlier::new();
        // 1 failure in 4: 25 % over a full window of 20 → ejected at the 20th outcome.
        let mut ejected_at = None;
        for i in 0..40 {
            let t = if i % 4 == 3 { o.failed(Failure::Error, &c, true, false, now) } else { o.succeeded(false) };
            if t.is_some() {
                ejected_at = Some(i);
                break;
            }
        }
        assert_eq!(ejected_at, Some(19));
        // Below the rate: never.
        let mut o = Outlier::new();
        for i in 0..200 {
            let t = if i % 5 == 4 { o.failed(Failure::Error, &c, true, false, now) } else { o.succeeded(false) };
            assert_eq!(t, None, "20 % is under the 25 % threshold");
        }
    }

    #[test]
    fn the_pool_cap_holds_back_ejection_but_not_a_connect_failure() {
        let (c, now) = (cfg(), Instant::now());
        let mut o = Outlier::new();
        for _ in 0..10 {
            assert_eq!(o.failed(Failure::Error, &c, false, false, now), None);
        }
        assert_eq!(o.availability(now), Availability::Healthy);
        let t = o.failed(Failure::Connect, &c, false, false, now);
        assert_eq!(t, Some(Transition::Ejected { length: ms(1_000), clear_index: true }));
        assert_eq!(c.max_ejected(3), 1);
        assert_eq!(c.max_ejected(10), 5);
        assert_eq!(EjectionConfig { max_ejected_percent: 0, ..c }.max_ejected(10), 1);
    }

    #[test]
    fn health_checks_feed_the_same_state() {
        let (c, t0) = (cfg(), Instant::now());
        let mut o = Outlier::new();
        assert!(o.checked(false, t0));
        assert_eq!(o.availability(t0), Availability::Down);
        assert_eq!(o.admit(t0), None);
        assert!(!o.checked(false, t0));
        assert!(o.checked(true, t0));
        assert_eq!(o.availability(t0), Availability::Healthy);
        // A passing check does not cut an ejection short…
        for _ in 0..5 {
            o.failed(Failure::Error, &c, true, false, t0);
        }
        assert!(!o.checked(true, t0 + ms(10)));
        assert_eq!(o.availability(t0 + ms(10)), Availability::Ejected);
        // …but stands for the probe once half-open.
        assert!(o.checked(true, t0 + ms(1_000)));
        assert_eq!(o.availability(t0 + ms(1_000)), Availability::Healthy);
    }

    #[test]
    fn late_outcomes_of_requests_sent_before_the_ejection_change_nothing() {
        let (c, t0) = (cfg(), Instant::now());
        let mut o = Outlier::new();
        o.failed(Failure::Connect, &c, true, false, t0);
        // In-flight requests failing after the ejection do not stretch the back-off…
        for _ in 0..10 {
            assert_eq!(o.failed(Failure::Error, &c, true, false, t0), None);
        }
        // …nor does a late success end it.
        assert_eq!(o.succeeded(false), None);
        let t1 = t0 + ms(1_000);
        assert_eq!(o.availability(t1), Availability::HalfOpen, "the first back-off, not a longer one");
        assert_eq!(o.admit(t1), Some(true));
        assert_eq!(o.succeeded(false), None, "only the probe's answer counts");
        assert_eq!(o.succeeded(true), Some(Transition::Recovered));
    }

    #[test]
    fn a_released_probe_lets_the_next_request_probe() {
        let (c, t0) = (cfg(), Instant::now());
        let mut o = Outlier::new();
        o.failed(Failure::Connect, &c, true, false, t0);
        let t1 = t0 + ms(1_000);
        assert_eq!(o.admit(t1), Some(true));
        o.release_probe();
        assert_eq!(o.availability(t1), Availability::HalfOpen);
        assert_eq!(o.admit(t1), Some(true));
        assert_eq!(o.succeeded(true), Some(Transition::Recovered));
        assert_eq!(o.admit(t1), Some(false));
    }
}
