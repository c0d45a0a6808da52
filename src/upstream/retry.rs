//! When a failed upstream attempt is tried again on the next candidate, and how many retries the
//! proxy may spend.
//!
//! A retry happens only before anything of the response has reached the client: the request body is
//! held as `Bytes` and nothing was relayed, so sending it to another worker cannot duplicate or
//! corrupt what the client sees. Attempts per request are bounded (`retries.max_attempts`), and all
//! retries together draw on a budget (Finagle's retry budget): over a sliding window, retries may be
//! at most `budget_ratio` of the requests plus a small floor (`budget_min_per_sec` × window), so
//! during an outage of every worker the proxy adds at most that share of load instead of multiplying
//! it by the attempt count.

use std::collections::VecDeque;
use std::sync::Mutex;
#[cfg(test)]
use std::time::Duration;
use std::time::Instant;

use crate::config::RetryConfig;
use axum::http::StatusCode;

/// Why an attempt is tried again on the next candidate (`mmrouter_upstream_retries_total{reason}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryReason {
    ConnectError,
    Timeout,
    /// The connection failed after the request was sent, before a response head.
    TransportError,
    /// The worker answered 5xx.
    ServerError,
    /// The worker answered 429.
    RateLimited,
}

impl RetryReason {
    pub fn label(self) -> &'static str {
        match self {
            RetryReason::ConnectError => "connect_error",
            RetryReason::Timeout => "timeout",
            RetryReason::TransportError => "transport_error",
            RetryReason::ServerError => "server_error",
            RetryReason::RateLimited => "rate_limited",
        }
    }

    /// A worker's answer that the next candidate may do better on.
    pub fn of_status(status: StatusCode) -> Option<RetryReason> {
        if status == StatusCode::TOO_MANY_REQUESTS {
            Some(RetryReason::RateLimited)
        } else if status.is_server_error() {
            Some(RetryReason::ServerError)
        } else {
            None
        }
    }
}

/// One-second buckets of (requests, retries) over the window, oldest first.
struct Buckets {
    start: Instant,
    slots: VecDeque<(u64, u64, u64)>, // (second since start, requests, retries)
}

/// The proxy-wide retry budget.
pub struct RetryBudget {
    ratio: f64,
    floor: f64,
    window: u64,
    buckets: Mutex<Buckets>,
}

impl RetryBudget {
    pub fn new(cfg: &RetryConfig) -> RetryBudget {
        RetryBudget {
            ratio: cfg.budget_ratio,
            floor: cfg.budget_min_per_sec * cfg.budget_window_secs as f64,
            window: cfg.budget_window_secs,
            buckets: Mutex::new(Buckets { start: Instant::now(), slots: VecDeque::new() }),
        }
    }

    /// A request arrived (its first attempt): it earns `ratio` of a retry.
    pub fn deposit(&self) {
        self.deposit_at(Instant::now());
    }

    /// Takes one retry from the budget; false when the window's retries are used up.
    pub fn try_withdraw(&self) -> bool {
        self.try_withdraw_at(Instant::now())
    }

    fn deposit_at(&self, now: Instant) {
        self.with_current(now, |b| b.1 += 1);
    }

    fn try_withdraw_at(&self, now: Instant) -> bool {
        let (ratio, floor) = (self.ratio, self.floor);
        let mut b = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let sec = self.trim(&mut b, now);
        let (requests, retries) = b.slots.iter().fold((0, 0), |(q, r), s| (q + s.1, r + s.2));
        if (retries + 1) as f64 > floor + ratio * requests as f64 {
            return false;
        }
        Self::current(&mut b, sec).2 += 1;
        true
    }

    fn with_current(&self, now: Instant, f: impl FnOnce(&mut (u64, u64, u64))) {
        let mut b = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let sec = self.trim(&mut b, now);
        f(Self::current(&mut b, sec));
    }

    /// Drops the buckets that left the window; returns the current second.
    fn trim(&self, b: &mut Buckets, now: Instant) -> u64 {
        let sec = now.saturating_duration_since(b.start).as_secs();
        while b.slots.front().is_some_and(|s| s.0 + self.window <= sec) {
            b.slots.pop_front();
        }
        sec
    }

    fn current(b: &mut Buckets, sec: u64) -> &mut (u64, u64, u64) {
        if b.slots.back().is_none_or(|s| s.0 != sec) {
            b.slots.push_back((sec, 0, 0));
        }
        b.slots.back_mut().expect("just pushed")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_are_bounded_by_the_ratio_plus_the_floor() {
        let cfg = RetryConfig { budget_ratio: 0.2, budget_min_per_sec: 0.0, ..Default::default() };
        let b = RetryBudget::new(&cfg);
        let t0 = Instant::now();
        let mut granted = 0;
        for _ in 0..100 {
            b.deposit_at(t0);
            // Every request wants two retries (an outage everywhere).
            granted += usize::from(b.try_withdraw_at(t0)) + usize::from(b.try_withdraw_at(t0));
        }
        assert_eq!(granted, 20, "20 % of 100 requests");
        // With a floor of 1/s over 10 s, a quiet proxy still gets 10 retries.
        let quiet = RetryBudget::new(&RetryConfig { budget_ratio: 0.0, ..Default::default() });
        let granted = (0..50).filter(|_| quiet.try_withdraw_at(t0)).count();
        assert_eq!(granted, 10);
    }

    #[test]
    fn the_window_slides() {
        let cfg =
            RetryConfig { budget_ratio: 0.0, budget_min_per_sec: 0.5, budget_window_secs: 4, ..Default::default() };
        let b = RetryBudget::new(&cfg);
        let t0 = Instant::now();
        assert_eq!((0..5).filter(|_| b.try_withdraw_at(t0)).count(), 2);
        assert!(!b.try_withdraw_at(t0 + Duration::from_secs(3)), "still inside the window");
        assert!(b.try_withdraw_at(t0 + Duration::from_secs(4)), "the first second left the window");
    }

    #[test]
    fn statuses_that_are_retried() {
        assert_eq!(RetryReason::of_status(StatusCode::TOO_MANY_REQUESTS), Some(RetryReason::RateLimited));
        assert_eq!(RetryReason::of_status(StatusCode::BAD_GATEWAY), Some(RetryReason::ServerError));
        assert_eq!(RetryReason::of_status(StatusCode::BAD_REQUEST), None);
        assert_eq!(RetryReason::of_status(StatusCode::OK), None);
    }
}
