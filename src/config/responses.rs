//! `[responses]`: how the router remembers which worker stored each Responses API answer (vLLM keeps
//! stored responses in the memory of the engine that produced them), and how it looks for one it does
//! not know. The store itself is the pools room's (`pools::responses`).

use std::time::Duration;

use serde::Deserialize;

/// `[responses]` section of the configuration.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResponsesConfig {
    /// Response ids remembered (least recently used forgotten first).
    pub max_ids: usize,
    /// An id not used for this long is forgotten (an engine's store is not persistent either).
    pub ttl_secs: u64,
    /// An unknown id is asked of the pool's workers (`GET /v1/responses/{id}`) within this time.
    pub probe_timeout_ms: u64,
    /// At most this many workers are asked at once for an unknown id.
    pub probe_concurrency: usize,
}

impl Default for ResponsesConfig {
    fn default() -> Self {
        ResponsesConfig { max_ids: 100_000, ttl_secs: 86_400, probe_timeout_ms: 2_000, probe_concurrency: 16 }
    }
}

impl ResponsesConfig {
    pub fn ttl(&self) -> Duration {
        Duration::from_secs(self.ttl_secs)
    }

    pub fn probe_timeout(&self) -> Duration {
        Duration::from_millis(self.probe_timeout_ms)
    }

    /// Refuses values outside what the store and the probe can honour; the message names the key.
    pub fn validate(&self) -> anyhow::Result<()> {
        let ranges = [
            ("responses.max_ids", self.max_ids as u64, 16, 100_000_000),
            ("responses.ttl_secs", self.ttl_secs, 1, 30 * 86_400),
            ("responses.probe_timeout_ms", self.probe_timeout_ms, 10, 60_000),
            ("responses.probe_concurrency", self.probe_concurrency as u64, 1, 256),
        ];
        for (key, value, min, max) in ranges {
            if !(min..=max).contains(&value) {
                anyhow::bail!("{key} must be between {min} and {max} (got {value})");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_name_their_key() {
        ResponsesConfig::default().validate().unwrap();
        let bad = ResponsesConfig { max_ids: 0, ..Default::default() };
        assert!(bad.validate().unwrap_err().to_string().contains("responses.max_ids"));
        let bad = ResponsesConfig { probe_concurrency: 0, ..Default::default() };
        assert!(bad.validate().unwrap_err().to_string().contains("responses.probe_concurrency"));
    }
}
