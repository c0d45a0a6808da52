//! `[kv_events]`: the bounds on what a worker's event publisher and discovery document may send.

use serde::Deserialize;

/// `[kv_events]`: what the router accepts from the workers' KV-event publishers and their discovery
/// documents. A worker (or anyone on its network path) is untrusted input: every bound is enforced before
/// allocating, and a publisher that breaks one is disconnected and counted.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KvEventsSection {
    /// Largest event message (all its frames together); a larger one disconnects the publisher.
    pub max_message_bytes: usize,
    /// Live batches held while a replay runs, in bytes; beyond it the replay is abandoned (resync).
    pub max_replay_buffer_bytes: usize,
    /// Largest discovery document (`/kv_event_sources`, `/server_info`) read from a worker.
    pub discovery_max_bytes: usize,
    /// Publisher hosts a discovery document may name besides the worker's own host.
    pub discovery_allow_hosts: Vec<String>,
}

impl Default for KvEventsSection {
    fn default() -> Self {
        KvEventsSection {
            max_message_bytes: 8 * 1024 * 1024,
            max_replay_buffer_bytes: 32 * 1024 * 1024,
            discovery_max_bytes: 1024 * 1024,
            discovery_allow_hosts: Vec::new(),
        }
    }
}

impl KvEventsSection {
    pub fn validate(&self) -> anyhow::Result<()> {
        // Below a few KiB no real batch fits; above 1 GiB one feed alone could exhaust a router's memory.
        const RANGE: std::ops::RangeInclusive<usize> = 4096..=1 << 30;
        for (key, v) in [
            ("max_message_bytes", self.max_message_bytes),
            ("max_replay_buffer_bytes", self.max_replay_buffer_bytes),
            ("discovery_max_bytes", self.discovery_max_bytes),
        ] {
            if !RANGE.contains(&v) {
                anyhow::bail!("kv_events.{key} must be in 4096..=1073741824 (got {v})");
            }
        }
        if let Some(h) = self.discovery_allow_hosts.iter().find(|h| h.trim().is_empty() || h.contains('/')) {
            anyhow::bail!("kv_events.discovery_allow_hosts: '{h}' is not a host name or address");
        }
        Ok(())
    }
}
