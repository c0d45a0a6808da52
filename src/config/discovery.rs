//! `[discovery]`: how the `[[workers]]` entries that name a DNS source (`dns` + `port`, `dns_srv`)
//! are resolved. Validated in [`super::dns`]; the entries themselves are [`super::settings::DnsEntry`].

use serde::Deserialize;

/// `[discovery]`: how the DNS worker entries are resolved.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DiscoverySection {
    /// How often each DNS entry is resolved again.
    pub interval_ms: u64,
    /// The nameserver asked, `ip:port`; absent: the system's (`/etc/resolv.conf`).
    pub nameserver: Option<String>,
    /// One resolution may take this long (all its queries); past it, it failed and the set is kept.
    pub timeout_ms: u64,
    /// Workers one entry may have at most; beyond, the first ones by address are kept and the rest
    /// counted (`outcome="truncated"`).
    pub max_addresses: usize,
}

impl Default for DiscoverySection {
    fn default() -> Self {
        DiscoverySection { interval_ms: 10_000, nameserver: None, timeout_ms: 5_000, max_addresses: 256 }
    }
}
