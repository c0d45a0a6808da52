//! Workers from DNS, validated: `[discovery]` and the `[[workers]]` entries that name a DNS source
//! (`dns` + `port` for A/AAAA records, `dns_srv` for SRV records) instead of one `url`. Such an entry
//! is a template: its other keys apply to every worker its name resolves to, each named
//! `{entry}@{address}:{port}` (docs/dns.md).

use std::net::SocketAddr;
use std::time::Duration;

use super::discovery::DiscoverySection;
use super::file::WorkerSection;
use super::settings::{DiscoverySettings, DnsEntry, DnsLookup, EventSource, WorkerSettings};

/// The longest entry name: `{entry}@[v6 address]:port` must stay within a worker name's 128 bytes.
pub const MAX_DNS_ENTRY_NAME_BYTES: usize = 72;

impl Default for DiscoverySettings {
    fn default() -> Self {
        DiscoverySection::default().settings().expect("defaults are valid")
    }
}

impl DiscoverySection {
    /// The section validated (entries are added by the pools' build).
    pub fn settings(&self) -> anyhow::Result<DiscoverySettings> {
        if !(100..=86_400_000).contains(&self.interval_ms) {
            anyhow::bail!("discovery.interval_ms must be in 100..=86400000 (got {})", self.interval_ms);
        }
        if !(10..=60_000).contains(&self.timeout_ms) {
            anyhow::bail!("discovery.timeout_ms must be in 10..=60000 (got {})", self.timeout_ms);
        }
        if !(1..=1024).contains(&self.max_addresses) {
            anyhow::bail!("discovery.max_addresses must be in 1..=1024 (got {})", self.max_addresses);
        }
        let nameserver =
            match &self.nameserver {
                None => None,
                Some(ns) => Some(ns.parse::<SocketAddr>().map_err(|_| {
                    anyhow::anyhow!("discovery.nameserver: '{ns}' is not an address like 10.96.0.10:53")
                })?),
            };
        Ok(DiscoverySettings {
            interval: Duration::from_millis(self.interval_ms),
            nameserver,
            timeout: Duration::from_millis(self.timeout_ms),
            max_addresses: self.max_addresses,
            entries: Vec::new(),
        })
    }
}

impl WorkerSection {
    /// Whether this entry names a DNS source rather than one URL.
    pub fn is_dns(&self) -> bool {
        self.dns.is_some() || self.dns_srv.is_some()
    }
}

/// A `[[workers]]` entry with `dns` or `dns_srv`, validated into a [`DnsEntry`] of `pool`. `at`
/// names the entry in errors. `worker_settings` validates the template (a stand-in URL).
pub fn dns_entry(
    pool: &str,
    at: &str,
    w: &WorkerSection,
    worker_settings: impl Fn(&str, &WorkerSection) -> anyhow::Result<WorkerSettings>,
) -> anyhow::Result<DnsEntry> {
    if w.name.len() > MAX_DNS_ENTRY_NAME_BYTES || w.name.contains('@') {
        anyhow::bail!("{at}.name: a DNS entry's name must be at most {MAX_DNS_ENTRY_NAME_BYTES} bytes, without '@'");
    }
    if !w.url.is_empty() {
        anyhow::bail!("{at}: set url, or dns / dns_srv, not both");
    }
    let lookup = match (&w.dns, &w.dns_srv, w.port) {
        (Some(host), None, Some(port)) if port > 0 => DnsLookup::Addresses { host: dns_name(at, "dns", host)?, port },
        (Some(_), None, _) => anyhow::bail!("{at}.port: dns needs the workers' port (1..=65535)"),
        (None, Some(name), None) => DnsLookup::Srv { name: dns_name(at, "dns_srv", name)? },
        (None, Some(_), Some(_)) => anyhow::bail!("{at}.port: dns_srv records carry the port; remove port"),
        _ => anyhow::bail!("{at}: set dns or dns_srv, not both"),
    };
    let scheme = w.scheme.clone().unwrap_or_else(|| "http".into());
    if !matches!(scheme.as_str(), "http" | "https") {
        anyhow::bail!("{at}.scheme: '{scheme}' is not http or https");
    }
    match w.kv_events.as_deref() {
        None | Some("discover") => {}
        Some(_) => anyhow::bail!(
            "{at}.kv_events: a DNS entry's workers each have their own publisher: use kv_events = \"discover\""
        ),
    }
    let stand_in = WorkerSection { url: format!("{scheme}://127.0.0.1:1"), dns: None, dns_srv: None, ..w.clone() };
    let template = worker_settings(at, &stand_in)?;
    debug_assert!(matches!(template.events, None | Some(EventSource::Discover)));
    Ok(DnsEntry { pool: pool.to_owned(), name: w.name.clone(), lookup, scheme, template })
}

/// A DNS name as written: letters, digits, `-`, `_`, `.`, at most 253 bytes.
fn dns_name(at: &str, key: &str, name: &str) -> anyhow::Result<String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if name.is_empty() || name.len() > 253 || !name.chars().all(ok) {
        anyhow::bail!("{at}.{key}: '{name}' is not a DNS name");
    }
    Ok(name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::super::settings::Settings;
    use super::*;

    fn err(text: &str) -> String {
        format!("{:#}", Settings::parse(text).unwrap_err())
    }

    #[test]
    fn dns_entries_are_templates_of_their_pool() {
        let s = Settings::parse(
            "[discovery]\ninterval_ms = 500\nnameserver = \"127.0.0.1:5353\"\n\
             [[workers]]\nname = \"vllm\"\ndns = \"vllm.default.svc\"\nport = 8000\nkv_events = \"discover\"\n\
             [[workers]]\nname = \"more\"\ndns_srv = \"_http._tcp.more\"\n",
        )
        .unwrap();
        assert!(s.pools[0].workers.is_empty(), "DNS entries become workers at run time");
        let d = &s.discovery;
        assert_eq!((d.interval, d.nameserver), (Duration::from_millis(500), Some("127.0.0.1:5353".parse().unwrap())));
        let lookups: Vec<_> = d.entries.iter().map(|e| (e.pool.as_str(), e.name.as_str(), &e.lookup)).collect();
        assert_eq!(
            lookups,
            [
                ("qwen3-vl", "vllm", &DnsLookup::Addresses { host: "vllm.default.svc".into(), port: 8000 }),
                ("qwen3-vl", "more", &DnsLookup::Srv { name: "_http._tcp.more".into() }),
            ]
        );
        assert_eq!(d.entries[0].template.events, Some(EventSource::Discover));
    }

    #[test]
    fn every_invalid_dns_entry_names_its_key() {
        let w = "[[workers]]\nname = \"v\"\n";
        let cases = [
            (format!("{w}dns = \"v\"\n"), "workers[0].port"),
            (format!("{w}dns = \"v\"\nport = 0\n"), "workers[0].port"),
            (format!("{w}dns_srv = \"v\"\nport = 80\n"), "workers[0].port"),
            (format!("{w}dns = \"v\"\ndns_srv = \"v\"\n"), "set dns or dns_srv, not both"),
            (format!("{w}url = \"http://h:1\"\ndns = \"v\"\nport = 1\n"), "set url, or dns / dns_srv"),
            (format!("{w}dns = \"bad name!\"\nport = 1\n"), "workers[0].dns"),
            (format!("{w}dns = \"v\"\nport = 1\nscheme = \"ftp\"\n"), "workers[0].scheme"),
            (format!("{w}dns = \"v\"\nport = 1\nkv_events = \"tcp://h:5557\"\n"), "workers[0].kv_events"),
            ("[[workers]]\nname = \"a@b\"\ndns = \"v\"\nport = 1\n".into(), "workers[0].name"),
            (format!("{w}url = \"http://h:1\"\nport = 1\n"), "workers[0]: dns, dns_srv, port and scheme"),
            (format!("[discovery]\nnameserver = \"dns.local\"\n{w}url = \"http://h:1\"\n"), "discovery.nameserver"),
            (format!("[discovery]\ninterval_ms = 0\n{w}url = \"http://h:1\"\n"), "discovery.interval_ms"),
            (format!("[discovery]\nmax_addresses = 0\n{w}url = \"http://h:1\"\n"), "discovery.max_addresses"),
            // The pool's role rules count the templates: a lone prefill entry is refused.
            (format!("{w}dns = \"v\"\nport = 1\nrole = \"prefill\"\n"), "no decode worker"),
        ];
        for (text, want) in cases {
            let e = err(&text);
            assert!(e.contains(want), "{text}: {e}");
        }
        let disagg = "[[workers]]\nname = \"p\"\ndns = \"p\"\nport = 1\nrole = \"prefill\"\n\
                      [[workers]]\nname = \"d\"\nurl = \"http://h:1\"\nrole = \"decode\"\n";
        assert_eq!(Settings::parse(disagg).unwrap().discovery.entries[0].template.spec.role.label(), "prefill");
    }
}
