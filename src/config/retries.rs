//! `[retries]`: attempts per request and the retry budget's shape (the budget itself is the upstream
//! room's, `upstream::retry`).

use serde::Deserialize;

/// `[retries]` section of the configuration.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Upstream attempts per request, the first included (1 = never retry).
    pub max_attempts: u32,
    /// Retries may be at most this fraction of the requests in the window.
    pub budget_ratio: f64,
    /// Retries always allowed per second of window, whatever the traffic (a quiet proxy can retry).
    pub budget_min_per_sec: f64,
    /// Length of the sliding window the budget is computed over.
    pub budget_window_secs: u64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig { max_attempts: 3, budget_ratio: 0.2, budget_min_per_sec: 1.0, budget_window_secs: 10 }
    }
}

/// Why a `[retries]` section is refused; the message names the key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RetryConfigError {
    #[error("{key} must be between {min} and {max} (got {value})")]
    OutOfRange { key: &'static str, min: u64, max: u64, value: u64 },
    #[error("{key} must be a finite number >= 0 (got {value})")]
    InvalidNumber { key: &'static str, value: f64 },
}

impl RetryConfigError {
    /// Stable snake_case label.
    pub fn label(&self) -> &'static str {
        match self {
            RetryConfigError::OutOfRange { .. } => "out_of_range",
            RetryConfigError::InvalidNumber { .. } => "invalid_number",
        }
    }
}

impl RetryConfig {
    /// Refuses values the budget cannot honour.
    pub fn validate(&self) -> Result<(), RetryConfigError> {
        let ranges = [
            ("retries.max_attempts", u64::from(self.max_attempts), 1, 16),
            ("retries.budget_window_secs", self.budget_window_secs, 1, 3600),
        ];
        for (key, value, min, max) in ranges {
            if !(min..=max).contains(&value) {
                return Err(RetryConfigError::OutOfRange { key, min, max, value });
            }
        }
        for (key, value) in
            [("retries.budget_ratio", self.budget_ratio), ("retries.budget_min_per_sec", self.budget_min_per_sec)]
        {
            if !value.is_finite() || value < 0.0 {
                return Err(RetryConfigError::InvalidNumber { key, value });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bad_values_name_their_key() {
        assert_eq!(RetryConfig::default().validate(), Ok(()));
        let bad = |c: RetryConfig| c.validate().unwrap_err();
        let e = bad(RetryConfig { max_attempts: 0, ..Default::default() });
        assert_eq!(e.label(), "out_of_range");
        assert_eq!(e.to_string(), "retries.max_attempts must be between 1 and 16 (got 0)");
        let e = bad(RetryConfig { budget_ratio: -1.0, ..Default::default() });
        assert_eq!(e.label(), "invalid_number");
        assert!(e.to_string().contains("retries.budget_ratio"));
        let e = bad(RetryConfig { budget_min_per_sec: f64::NAN, ..Default::default() });
        assert!(e.to_string().contains("retries.budget_min_per_sec"));
        let e = bad(RetryConfig { budget_window_secs: 0, ..Default::default() });
        assert!(e.to_string().contains("retries.budget_window_secs"));
    }
}
