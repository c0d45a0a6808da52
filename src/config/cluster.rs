//! `[cluster]`: several router replicas that route as one (see docs/operations.md, "Running several replicas").
//! Without the section a router is alone and nothing of this applies. The key names are a contract.

use std::time::Duration;

use serde::Deserialize;

use super::nats::{NatsKeys, NatsSettings, SecretKeys};

/// The section as written.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSection {
    /// This replica's name among its peers (default: hostname-pid).
    pub replica_id: Option<String>,
    /// The NATS server the replicas share in-flight state through (`nats://host:4222`); absent: none
    /// shared (a warm start from peers still works).
    pub nats_url: Option<String>,
    /// Subject prefix of the replicas' messages (`<prefix>.bookings`, `<prefix>.dispatch`); replicas
    /// of different clusters on one NATS use different prefixes. Default `mmrouter`.
    pub subject_prefix: Option<String>,
    /// Other replicas' base URLs (`http://host:port`) to fetch a snapshot from at start.
    pub peers: Vec<String>,
    /// `host:port` whose A/AAAA records are the replicas (a headless Service); each is asked like a
    /// `peers` entry (this replica skips itself by its `replica_id`).
    pub peers_dns: Option<String>,
    /// Longest wait from start to ready: snapshot, graft and replay together; after it the replica
    /// serves with what it has and `/health` says so. Default 30 000.
    pub bootstrap_timeout_ms: Option<u64>,
    /// One peer's snapshot request: connect and the first byte, then between two chunks. Default 5 000.
    pub peer_timeout_ms: Option<u64>,
    /// How often each replica announces itself and its live bookings. Default 1 000.
    pub heartbeat_ms: Option<u64>,
    /// A replica not heard from for this long has its bookings dropped. Default 5 000 (≥ 2 heartbeats).
    pub booking_ttl_ms: Option<u64>,
    /// NATS authentication (one method at most): user and password, token, user NKey seed, or a
    /// `.creds` file. Each secret inline, from `*_env` (a variable's name) or `*_file` (a path).
    pub nats_user: Option<String>,
    pub nats_password: Option<String>,
    pub nats_password_env: Option<String>,
    pub nats_password_file: Option<String>,
    pub nats_token: Option<String>,
    pub nats_token_env: Option<String>,
    pub nats_token_file: Option<String>,
    pub nats_nkey_seed: Option<String>,
    pub nats_nkey_seed_env: Option<String>,
    pub nats_nkey_seed_file: Option<String>,
    pub nats_creds_file: Option<String>,
    /// TLS to the NATS server: required (also by `tls://` or any file below), the CA to verify it
    /// with, and a client certificate and key for servers that verify clients (mTLS).
    pub nats_tls_required: Option<bool>,
    pub nats_tls_ca_file: Option<String>,
    pub nats_tls_cert_file: Option<String>,
    pub nats_tls_key_file: Option<String>,
    /// Another replica's word on a worker's load counts up to this floor plus `peer_load_ratio` ×
    /// this replica's own in-flight tokens on that worker; the rest is refused. Default 4 096.
    pub peer_load_floor_tokens: Option<u64>,
    /// How many times this replica's own traffic another replica may claim (load on a worker, index
    /// keys written per window). Default 4.
    pub peer_load_ratio: Option<f64>,
    /// Most other replicas heard from at once; messages of more are refused. Default 64.
    pub max_peers: Option<usize>,
    /// Most live bookings one other replica may hold here (its own `max_inflight_requests`).
    /// Default 1 024.
    pub max_peer_bookings: Option<usize>,
}

/// `[cluster]`, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterSettings {
    pub replica_id: String,
    /// The NATS connection (URL without credentials, authentication, TLS); none: nothing shared.
    pub nats: Option<NatsSettings>,
    pub subject_prefix: String,
    pub peers: Vec<String>,
    pub peers_dns: Option<String>,
    pub bootstrap_timeout: Duration,
    pub peer_timeout: Duration,
    pub heartbeat: Duration,
    pub booking_ttl: Duration,
    pub quotas: PeerQuotas,
}

/// What one other replica may weigh here: bounds an honest replica stays within.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PeerQuotas {
    pub load_floor_tokens: u64,
    pub ratio: f64,
    pub max_peers: usize,
    pub max_bookings: usize,
}

impl Default for PeerQuotas {
    fn default() -> PeerQuotas {
        PeerQuotas { load_floor_tokens: 4_096, ratio: 4.0, max_peers: 64, max_bookings: 1_024 }
    }
}

impl ClusterSection {
    /// Validates the section; errors name the key.
    pub fn settings(&self) -> anyhow::Result<ClusterSettings> {
        let replica_id = match &self.replica_id {
            Some(id) => id.clone(),
            None => default_replica_id(),
        };
        if replica_id.is_empty() || replica_id.len() > 128 || !replica_id.chars().all(is_token_char) {
            anyhow::bail!("cluster.replica_id must be 1-128 characters of [A-Za-z0-9._-], got {replica_id:?}");
        }
        let nats = match &self.nats_url {
            Some(url) => Some(self.nats_keys(url).settings()?),
            None => {
                anyhow::ensure!(self.nats_keys("").is_unset(), "cluster.nats_* keys need cluster.nats_url");
                None
            }
        };
        let subject_prefix = self.subject_prefix.clone().unwrap_or_else(|| "mmrouter".into());
        let subject_ok = !subject_prefix.is_empty()
            && subject_prefix.split('.').all(|t| !t.is_empty() && t.chars().all(is_token_char));
        anyhow::ensure!(subject_ok, "cluster.subject_prefix must be dot-separated [A-Za-z0-9_-] tokens");
        for (i, peer) in self.peers.iter().enumerate() {
            let ok = url::Url::parse(peer).is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some());
            anyhow::ensure!(ok, "cluster.peers[{i}] must be an http(s) base URL, got {peer:?}");
        }
        if let Some(dns) = &self.peers_dns {
            let ok = dns.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
            anyhow::ensure!(ok, "cluster.peers_dns must be host:port, got {dns:?}");
        }
        let ms = |key: &str, v: Option<u64>, default: u64| -> anyhow::Result<Duration> {
            let v = v.unwrap_or(default);
            anyhow::ensure!((1..=86_400_000).contains(&v), "cluster.{key} must be in 1..=86400000 ms, got {v}");
            Ok(Duration::from_millis(v))
        };
        let heartbeat = ms("heartbeat_ms", self.heartbeat_ms, 1_000)?;
        let booking_ttl = ms("booking_ttl_ms", self.booking_ttl_ms, 5_000)?;
        anyhow::ensure!(booking_ttl >= heartbeat * 2, "cluster.booking_ttl_ms must be at least 2 × heartbeat_ms");
        Ok(ClusterSettings {
            replica_id,
            nats,
            subject_prefix,
            peers: self.peers.iter().map(|p| p.trim_end_matches('/').to_owned()).collect(),
            peers_dns: self.peers_dns.clone(),
            bootstrap_timeout: ms("bootstrap_timeout_ms", self.bootstrap_timeout_ms, 30_000)?,
            peer_timeout: ms("peer_timeout_ms", self.peer_timeout_ms, 5_000)?,
            heartbeat,
            booking_ttl,
            quotas: self.quotas()?,
        })
    }

    fn quotas(&self) -> anyhow::Result<PeerQuotas> {
        let d = PeerQuotas::default();
        let q = PeerQuotas {
            load_floor_tokens: self.peer_load_floor_tokens.unwrap_or(d.load_floor_tokens),
            ratio: self.peer_load_ratio.unwrap_or(d.ratio),
            max_peers: self.max_peers.unwrap_or(d.max_peers),
            max_bookings: self.max_peer_bookings.unwrap_or(d.max_bookings),
        };
        anyhow::ensure!(q.load_floor_tokens <= 1 << 32, "cluster.peer_load_floor_tokens must be at most 2^32");
        anyhow::ensure!((0.0..=1000.0).contains(&q.ratio), "cluster.peer_load_ratio must be in 0..=1000");
        anyhow::ensure!((1..=4096).contains(&q.max_peers), "cluster.max_peers must be in 1..=4096");
        anyhow::ensure!((1..=1 << 20).contains(&q.max_bookings), "cluster.max_peer_bookings must be in 1..=1048576");
        Ok(q)
    }

    /// The `nats_*` keys, for [`NatsKeys::settings`].
    fn nats_keys(&self, url: &str) -> NatsKeys {
        let secret = |inline: &Option<String>, env: &Option<String>, file: &Option<String>| SecretKeys {
            inline: inline.clone(),
            env: env.clone(),
            file: file.clone(),
        };
        NatsKeys {
            url: url.to_owned(),
            user: self.nats_user.clone(),
            password: secret(&self.nats_password, &self.nats_password_env, &self.nats_password_file),
            token: secret(&self.nats_token, &self.nats_token_env, &self.nats_token_file),
            nkey_seed: secret(&self.nats_nkey_seed, &self.nats_nkey_seed_env, &self.nats_nkey_seed_file),
            creds_file: self.nats_creds_file.clone(),
            tls_required: self.nats_tls_required,
            tls_ca_file: self.nats_tls_ca_file.clone(),
            tls_cert_file: self.nats_tls_cert_file.clone(),
            tls_key_file: self.nats_tls_key_file.clone(),
        }
    }
}

fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// hostname-pid, as the contract says (a pod's hostname is its name).
fn default_replica_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().chars().filter(|&c| is_token_char(c)).collect::<String>())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "mmrouter".into());
    format!("{host}-{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> anyhow::Result<ClusterSettings> {
        toml::from_str::<ClusterSection>(text)?.settings()
    }

    #[test]
    fn defaults_and_contract_keys() {
        let s = parse("nats_url = \"nats://127.0.0.1:4222\"\npeers = [\"http://r2:8080/\"]").unwrap();
        assert!(s.replica_id.ends_with(&format!("-{}", std::process::id())), "{}", s.replica_id);
        assert_eq!(s.peers, ["http://r2:8080"]);
        assert_eq!(s.subject_prefix, "mmrouter");
        assert_eq!((s.heartbeat, s.booking_ttl), (Duration::from_secs(1), Duration::from_secs(5)));
        assert_eq!(s.bootstrap_timeout, Duration::from_secs(30));
        let s = parse("replica_id = \"r1\"\npeers_dns = \"mmrouter-peers.ns.svc:8080\"").unwrap();
        assert_eq!((s.replica_id.as_str(), s.peers_dns.as_deref()), ("r1", Some("mmrouter-peers.ns.svc:8080")));
    }

    #[test]
    fn errors_name_the_key() {
        for (text, key) in [
            ("nats_url = \"http://x:1\"", "cluster.nats_url"),
            ("nats_token = \"t\"", "cluster.nats_url"),
            ("peer_load_ratio = -1.0", "cluster.peer_load_ratio"),
            ("max_peers = 0", "cluster.max_peers"),
            ("peers = [\"r2:8080\"]", "cluster.peers[0]"),
            ("peers_dns = \"svc\"", "cluster.peers_dns"),
            ("replica_id = \"a b\"", "cluster.replica_id"),
            ("subject_prefix = \"a..b\"", "cluster.subject_prefix"),
            ("heartbeat_ms = 0", "cluster.heartbeat_ms"),
            ("heartbeat_ms = 3000", "cluster.booking_ttl_ms"),
        ] {
            let e = parse(text).expect_err(text).to_string();
            assert!(e.contains(key), "{text}: {e}");
        }
        assert!(parse("nats = \"x\"").is_err(), "unknown keys are refused");
    }
}
