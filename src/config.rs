//! The one TOML configuration file (`config/mmrouter.toml` is the documented example).
//!
//! Every section rejects unknown keys, and every invalid value is reported with the key that holds it,
//! so a typo never silently becomes a default.

use std::net::SocketAddr;
use std::path::Path;

use serde::Deserialize;

use crate::media::MediaConfig;
use crate::routing::RoutingConfig;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub model: ModelConfig,
    #[serde(default)]
    pub workers: Vec<WorkerConfig>,
    #[serde(default)]
    pub routing: RoutingConfig,
    #[serde(default)]
    pub media: MediaConfig,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address the proxy listens on.
    pub listen: String,
    /// Largest request body accepted; larger bodies get an OpenAI-shaped 413 and nothing is forwarded.
    pub max_body_bytes: usize,
    /// Upstream TCP connect timeout.
    pub connect_timeout_ms: u64,
    /// From dispatch to the worker's response headers (covers queueing and prefill).
    pub first_byte_timeout_ms: u64,
    /// From dispatch to the end of the response body, streams included.
    pub total_timeout_ms: u64,
    /// How often each worker's `/health` is polled; 0 disables active checks.
    pub health_interval_ms: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:8080".into(),
            max_body_bytes: 64 * 1024 * 1024,
            connect_timeout_ms: 2_000,
            first_byte_timeout_ms: 120_000,
            total_timeout_ms: 1_800_000,
            health_interval_ms: 2_000,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// A bundled profile name (`qwen3-vl`, `qwen2.5-vl`) or the path of an HF model directory.
    pub dir: String,
    /// Model identity used to seed block hashes; defaults to `dir`. Workers sharing a cache must agree.
    pub name: Option<String>,
    /// Accounting family override (e.g. `qwen3_vl`); auto-detected from the HF files when absent.
    pub family: Option<String>,
    /// KV block size of the pool (vLLM `--block-size`).
    pub block_size: u32,
    /// Mirrors the workers' `--mm-processor-kwargs`; applied on top of `preprocessor_config.json`.
    pub processor_kwargs: serde_json::Map<String, serde_json::Value>,
    /// Request `model` values that name LoRA adapters: they seed block hashes differently.
    pub lora_adapters: Vec<String>,
    /// false: never account images; requests with images route on their text prefix only.
    pub exact_accounting: bool,
    /// Decode tokens assumed for load when the request sets no `max_tokens`.
    pub default_decode_tokens: u32,
    /// The workers' `--max-model-len`; only request-wide accounting families (Nemotron Omni) need it.
    pub max_model_len: Option<u32>,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            dir: "qwen3-vl".into(),
            name: None,
            family: None,
            block_size: 16,
            processor_kwargs: Default::default(),
            lora_adapters: Vec::new(),
            exact_accounting: true,
            default_decode_tokens: 256,
            max_model_len: None,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerConfig {
    pub name: String,
    /// Base URL, e.g. `http://10.0.0.7:8000` (no trailing `/v1`).
    pub url: String,
}

impl Config {
    /// Reads and validates a config file; the error names the file and the offending key.
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text =
            std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("cannot read config {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| anyhow::anyhow!("config {}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> anyhow::Result<Config> {
        // toml's error text already names the key and the line for type errors and unknown keys.
        let cfg: Config = toml::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        let s = &self.server;
        s.listen
            .parse::<SocketAddr>()
            .map_err(|_| anyhow::anyhow!("server.listen: '{}' is not an address like 127.0.0.1:8080", s.listen))?;
        if s.max_body_bytes == 0 {
            anyhow::bail!("server.max_body_bytes must be > 0");
        }
        for (key, v) in [
            ("server.connect_timeout_ms", s.connect_timeout_ms),
            ("server.first_byte_timeout_ms", s.first_byte_timeout_ms),
            ("server.total_timeout_ms", s.total_timeout_ms),
        ] {
            if v == 0 {
                anyhow::bail!("{key} must be > 0");
            }
        }
        if s.first_byte_timeout_ms > s.total_timeout_ms {
            anyhow::bail!("server.first_byte_timeout_ms must not exceed server.total_timeout_ms");
        }
        let m = &self.model;
        if m.dir.trim().is_empty() {
            anyhow::bail!("model.dir must name a bundled profile or an HF model directory");
        }
        if m.block_size == 0 || m.block_size > 4096 {
            anyhow::bail!("model.block_size must be in 1..=4096 (got {})", m.block_size);
        }
        if let Some(f) = &m.family {
            f.parse::<crate::accounting::Family>()
                .map_err(|_| anyhow::anyhow!("model.family: unknown family '{f}'"))?;
        }
        if self.workers.is_empty() {
            anyhow::bail!("workers: at least one [[workers]] entry is required");
        }
        let mut seen = std::collections::HashSet::new();
        for (i, w) in self.workers.iter().enumerate() {
            if w.name.trim().is_empty() {
                anyhow::bail!("workers[{i}].name must not be empty");
            }
            if !seen.insert(w.name.as_str()) {
                anyhow::bail!("workers[{i}].name: duplicate worker name '{}'", w.name);
            }
            let u = url::Url::parse(&w.url)
                .map_err(|e| anyhow::anyhow!("workers[{i}].url: '{}' is not a URL ({e})", w.url))?;
            if !matches!(u.scheme(), "http" | "https") || u.host_str().is_none() {
                anyhow::bail!("workers[{i}].url: '{}' must be an http(s) URL with a host", w.url);
            }
        }
        self.routing.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        self.media.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: &str = "[[workers]]\nname = \"a\"\nurl = \"http://127.0.0.1:1\"\n";

    #[test]
    fn minimal_config_gets_defaults() {
        let c = Config::parse(MIN).unwrap();
        assert_eq!(c.model.dir, "qwen3-vl");
        assert_eq!(c.model.block_size, 16);
        assert_eq!(c.workers.len(), 1);
    }

    #[test]
    fn every_invalid_value_names_its_key() {
        let cases = [
            ("[server]\nlisten = \"nope\"\n", "server.listen"),
            ("[server]\nmax_body_bytes = 0\n", "server.max_body_bytes"),
            ("[server]\nconnect_timeout_ms = 0\n", "server.connect_timeout_ms"),
            ("[model]\nblock_size = 0\n", "model.block_size"),
            ("[model]\nfamily = \"nonsense\"\n", "model.family"),
            ("[model]\nbogus = 1\n", "bogus"),
            ("[server]\nlisten = 5\n", "listen"),
        ];
        for (extra, key) in cases {
            let err = Config::parse(&format!("{extra}{MIN}")).unwrap_err().to_string();
            assert!(err.contains(key), "error for {extra:?} should name {key}: {err}");
        }
        let err = Config::parse("").unwrap_err().to_string();
        assert!(err.contains("workers"), "{err}");
        let dup = format!("{MIN}{MIN}");
        assert!(Config::parse(&dup).unwrap_err().to_string().contains("duplicate"));
        let bad_url = "[[workers]]\nname = \"a\"\nurl = \"ftp://x\"\n";
        assert!(Config::parse(bad_url).unwrap_err().to_string().contains("workers[0].url"));
    }

    #[test]
    fn bundled_example_config_is_valid() {
        let text = include_str!("../config/mmrouter.toml");
        Config::parse(text).unwrap();
    }
}
