//! The `[media]` configuration section: limits, fetch timeouts, SSRF exceptions, URL cache.

use serde::Deserialize;

/// Which dimensions to report for images carrying an EXIF orientation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Orientation {
    /// The stored (encoded) size. vLLM does not apply EXIF orientation, so this matches its
    /// token counts.
    #[default]
    Stored,
    /// Width and height swapped for EXIF orientations 5–8 (a backend that transposes first).
    Exif,
}

/// `[media]` settings. Every key has a production default.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MediaConfig {
    /// Largest raw (decoded) image, bytes.
    pub max_image_bytes: usize,
    /// Largest raw video (a data URL's decoded bytes, a fetched file), bytes. A video is read whole
    /// (its sample tables may sit at its end) under the decode budget; a longer one is cut at this
    /// limit and its request falls back (`too_large`).
    pub max_video_bytes: usize,
    /// Most image and video parts in one request.
    pub max_images: usize,
    /// Largest sum of raw image bytes read for one request.
    pub max_total_bytes: usize,
    /// Largest width × height a header may claim (decompression-bomb guard).
    pub max_pixels: u64,
    /// Total time for one fetch, redirects and body included.
    pub fetch_timeout_ms: u64,
    /// Time to establish one connection.
    pub connect_timeout_ms: u64,
    /// Redirect hops followed per image; each target is re-checked by the guard.
    pub max_redirects: usize,
    /// Host names (optionally `host:port`) exempt from the SSRF guard.
    pub allow_hosts: Vec<String>,
    /// Address ranges exempt from the SSRF guard (CIDR or a single address).
    pub allow_cidrs: Vec<String>,
    /// Turns the SSRF guard off entirely (trusted networks only).
    pub allow_private: bool,
    /// Public addresses may be fetched; false: only `allow_cidrs` / `allow_hosts` (an allowlist).
    pub allow_public: bool,
    /// Answer 400 for a blocked URL (default) so no worker is ever asked to fetch it; false forwards it
    /// by text-prefix routing, for operators who trust their workers' own guards.
    pub reject_blocked_urls: bool,
    /// Keep a client's own image-part `uuid` (vLLM then trusts that name across every tenant of the
    /// worker). Off: uuids are replaced by content hashes on the exact route, and a request whose uuid
    /// cannot be replaced is answered 400.
    pub trust_client_uuids: bool,
    /// How long a fetched URL's identity and size are reused; 0 disables the cache.
    pub url_cache_ttl_secs: u64,
    /// Most URLs the cache holds.
    pub url_cache_entries: usize,
    /// MiB of data-URL text kept so an image sent again is not decoded and hashed again (kept at
    /// its second sighting, compared byte for byte); 0 disables.
    pub data_url_memo_mb: usize,
    /// Stored or EXIF-oriented dimensions.
    pub orientation: Orientation,
    /// Deadline for all images of one request together.
    pub deadline_ms: u64,
    /// MiB that image probes may hold at once across all requests of the process (each whole image
    /// probed and a decoder's copy of it; no pixels are ever decoded). A probe waits up to 2 s for
    /// room, then its request falls back with reason `decode_budget`.
    pub decode_budget_mb: usize,
    /// Also report whether an image's EXIF orientation transposes it (not a config key: the pipeline
    /// sets it in Mistral tokenizer mode, where the worker sizes an image both ways).
    #[serde(skip)]
    pub report_transposed: bool,
}

impl Default for MediaConfig {
    fn default() -> Self {
        MediaConfig {
            max_image_bytes: 20 * 1024 * 1024,
            max_video_bytes: 32 * 1024 * 1024,
            max_images: 16,
            max_total_bytes: 64 * 1024 * 1024,
            // Pillow's DecompressionBombError threshold: larger images fail in vLLM anyway.
            max_pixels: 178_956_970,
            fetch_timeout_ms: 10_000,
            connect_timeout_ms: 3_000,
            max_redirects: 3,
            allow_hosts: Vec::new(),
            allow_cidrs: Vec::new(),
            allow_private: false,
            allow_public: true,
            reject_blocked_urls: true,
            trust_client_uuids: false,
            url_cache_ttl_secs: 300,
            url_cache_entries: 4096,
            data_url_memo_mb: 64,
            orientation: Orientation::Stored,
            deadline_ms: 15_000,
            decode_budget_mb: 256,
            report_transposed: false,
        }
    }
}

impl MediaConfig {
    /// `decode_budget_mb` in bytes.
    pub(crate) fn decode_budget_bytes(&self) -> usize {
        self.decode_budget_mb.saturating_mul(1 << 20)
    }

    /// Checks every value; the message names the offending key.
    pub fn validate(&self) -> Result<(), String> {
        let positive: [(&str, u64); 9] = [
            ("max_image_bytes", self.max_image_bytes as u64),
            ("max_video_bytes", self.max_video_bytes as u64),
            ("max_images", self.max_images as u64),
            ("max_total_bytes", self.max_total_bytes as u64),
            ("max_pixels", self.max_pixels),
            ("fetch_timeout_ms", self.fetch_timeout_ms),
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("deadline_ms", self.deadline_ms),
            ("decode_budget_mb", self.decode_budget_mb as u64),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(format!("media.{key}: must be greater than 0"));
            }
        }
        if self.max_total_bytes < self.max_image_bytes {
            return Err(format!(
                "media.max_total_bytes: {} is smaller than media.max_image_bytes = {}",
                self.max_total_bytes, self.max_image_bytes
            ));
        }
        let one_image = crate::media::budget::worst_case(self.max_image_bytes);
        if self.decode_budget_bytes() < one_image {
            return Err(format!(
                "media.decode_budget_mb: {} MiB cannot hold the probe of one image of media.max_image_bytes = {} \
                 (needs {} MiB)",
                self.decode_budget_mb,
                self.max_image_bytes,
                one_image.div_ceil(1 << 20)
            ));
        }
        if self.url_cache_ttl_secs > 0 && self.url_cache_entries == 0 {
            return Err(
                "media.url_cache_entries: must be greater than 0 while media.url_cache_ttl_secs > 0".to_string()
            );
        }
        for cidr in &self.allow_cidrs {
            crate::media::allow::parse_cidr(cidr).ok_or_else(|| format!("media.allow_cidrs: invalid CIDR '{cidr}'"))?;
        }
        for host in &self.allow_hosts {
            crate::media::allow::parse_allowed_host(host)
                .ok_or_else(|| format!("media.allow_hosts: invalid host '{host}'"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        MediaConfig::default().validate().unwrap();
    }

    #[test]
    fn errors_name_the_key() {
        let cfg = MediaConfig { allow_cidrs: vec!["10.0.0.0/33".into()], ..MediaConfig::default() };
        assert_eq!(cfg.validate().unwrap_err(), "media.allow_cidrs: invalid CIDR '10.0.0.0/33'");
        let cfg = MediaConfig { allow_hosts: vec!["cdn.example.com:99999".into()], ..MediaConfig::default() };
        assert!(cfg.validate().unwrap_err().starts_with("media.allow_hosts"));
        let cfg = MediaConfig { max_images: 0, ..MediaConfig::default() };
        assert!(cfg.validate().unwrap_err().starts_with("media.max_images"));
        // The decode budget must hold at least one image's probe.
        let cfg = MediaConfig { decode_budget_mb: 40, ..MediaConfig::default() };
        assert!(cfg.validate().unwrap_err().starts_with("media.decode_budget_mb: 40 MiB"), "{:?}", cfg.validate());
        let cfg = MediaConfig { decode_budget_mb: 0, ..MediaConfig::default() };
        assert!(cfg.validate().unwrap_err().starts_with("media.decode_budget_mb"));
    }

    #[test]
    fn deserializes_partial_sections_and_rejects_unknown_keys() {
        let cfg: MediaConfig = serde_json::from_str(r#"{"orientation":"exif","allow_cidrs":["127.0.0.1"]}"#).unwrap();
        assert_eq!(cfg.orientation, Orientation::Exif);
        assert_eq!(cfg.max_images, MediaConfig::default().max_images);
        assert!(serde_json::from_str::<MediaConfig>(r#"{"max_imagez":1}"#).is_err());
    }
}
