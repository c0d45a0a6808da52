//! `[tracing]`: OpenTelemetry traces exported over OTLP/HTTP (docs/tracing.md). Off unless
//! `otlp_endpoint` is set; the client's W3C trace context is passed to the workers either way.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

/// `[tracing]` section of the configuration.
#[derive(Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TracingConfig {
    /// The collector's OTLP/HTTP endpoint (`http://collector:4318`: spans go to `…/v1/traces`; a URL
    /// already ending in `/v1/traces` is used as it is). Unset: no span is exported.
    pub otlp_endpoint: Option<String>,
    /// Share of the traces started here that are exported (0.0–1.0); a client's `traceparent`
    /// decides for its own request (parent-based).
    pub sample_ratio: f64,
    /// Headers sent with every export (authentication): secrets, never logged or printed.
    pub headers: BTreeMap<String, String>,
    /// The `service.name` resource attribute.
    pub service_name: String,
    /// Spans waiting for export at most; beyond, a request's spans are dropped and counted.
    pub max_queue: usize,
    /// One export request's time limit.
    pub timeout_ms: u64,
}

impl Default for TracingConfig {
    fn default() -> Self {
        TracingConfig {
            otlp_endpoint: None,
            sample_ratio: 1.0,
            headers: BTreeMap::new(),
            service_name: "mmrouter".into(),
            max_queue: 8_192,
            timeout_ms: 10_000,
        }
    }
}

/// Header values are secrets: only their names are shown.
impl std::fmt::Debug for TracingConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TracingConfig")
            .field("otlp_endpoint", &self.otlp_endpoint)
            .field("sample_ratio", &self.sample_ratio)
            .field("headers", &self.headers.keys().map(|k| (k, "***")).collect::<Vec<_>>())
            .field("service_name", &self.service_name)
            .field("max_queue", &self.max_queue)
            .field("timeout_ms", &self.timeout_ms)
            .finish()
    }
}

impl TracingConfig {
    /// The URL spans are posted to, when tracing is on.
    pub fn traces_url(&self) -> Option<String> {
        let base = self.otlp_endpoint.as_deref()?.trim_end_matches('/');
        Some(if base.ends_with("/v1/traces") { base.to_owned() } else { format!("{base}/v1/traces") })
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// Refuses what the exporter cannot honour; the message names the key (never a header's value).
    pub fn validate(&self) -> anyhow::Result<()> {
        if let Some(url) = self.traces_url() {
            let parsed = url::Url::parse(&url).map_err(|e| anyhow::anyhow!("tracing.otlp_endpoint: {e}"))?;
            if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
                anyhow::bail!("tracing.otlp_endpoint must be an http(s) URL like http://127.0.0.1:4318");
            }
        }
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            anyhow::bail!("tracing.sample_ratio must be between 0.0 and 1.0 (got {})", self.sample_ratio);
        }
        if self.service_name.is_empty() || self.service_name.len() > 256 {
            anyhow::bail!("tracing.service_name must be 1 to 256 bytes");
        }
        if !(16..=1_000_000).contains(&self.max_queue) {
            anyhow::bail!("tracing.max_queue must be between 16 and 1000000 (got {})", self.max_queue);
        }
        if !(100..=120_000).contains(&self.timeout_ms) {
            anyhow::bail!("tracing.timeout_ms must be between 100 and 120000 (got {})", self.timeout_ms);
        }
        for (name, value) in &self.headers {
            if axum::http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                anyhow::bail!("tracing.headers: '{name}' is not a header name");
            }
            if axum::http::HeaderValue::from_str(value).is_err() {
                anyhow::bail!("tracing.headers.{name}: the value is not a valid header value");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_by_default_and_the_traces_path_is_added_once() {
        let mut c = TracingConfig::default();
        assert!(c.validate().is_ok());
        assert_eq!(c.traces_url(), None);
        c.otlp_endpoint = Some("http://127.0.0.1:4318/".into());
        assert_eq!(c.traces_url().unwrap(), "http://127.0.0.1:4318/v1/traces");
        c.otlp_endpoint = Some("http://127.0.0.1:4318/v1/traces".into());
        assert_eq!(c.traces_url().unwrap(), "http://127.0.0.1:4318/v1/traces");
    }

    #[test]
    fn bad_values_name_their_key_and_never_show_a_secret() {
        let bad = |f: fn(&mut TracingConfig)| {
            let mut c = TracingConfig::default();
            f(&mut c);
            c.validate().unwrap_err().to_string()
        };
        assert!(bad(|c| c.sample_ratio = 1.5).contains("tracing.sample_ratio"));
        assert!(bad(|c| c.otlp_endpoint = Some("ftp://x".into())).contains("tracing.otlp_endpoint"));
        assert!(bad(|c| c.max_queue = 1).contains("tracing.max_queue"));
        let e = bad(|c| {
            c.headers.insert("authorization".into(), "Bearer top\nsecret".into());
        });
        assert!(e.contains("tracing.headers.authorization") && !e.contains("top"), "{e}");
        let mut c = TracingConfig::default();
        c.headers.insert("authorization".into(), "Bearer topsecret".into());
        assert!(!format!("{c:?}").contains("topsecret"));
    }
}
