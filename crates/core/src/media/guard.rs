//! SSRF guard for image URLs, on by default.
//!
//! Layers, each applied to the first URL and to every redirect target:
//! 1. scheme `http`/`https` only;
//! 2. host names that are internal by convention (`localhost`, cloud metadata, Kubernetes) refused;
//! 3. every address, an IP literal's (this covers decimal/octal/hex spellings such as
//!    `http://2130706433/`: the `url` crate normalises them to the address that reqwest will connect
//!    to, and that is what is checked) or each address a name resolves to (step 5), is judged by one
//!    rule, [`Guard::check_address`]: inside `allow_cidrs` → accepted on any port; in a blocked range
//!    (or not public-and-allowed) → refused; otherwise accepted on the scheme's default port only;
//! 4. explicit non-default ports are therefore refused unless the host is exempt or its addresses are
//!    inside `allow_cidrs`;
//! 5. names resolved and refused if **any** address fails step 3;
//! 6. the HTTP client's own resolver ([`GuardedResolver`]) drops blocked addresses from every
//!    resolution, so the address a connection uses is always one that was checked (no DNS-rebinding
//!    window between step 5 and the connect).
//!
//! IPv6 addresses that embed an IPv4 address (mapped `::ffff:0:0/96`, compatible `::/96`, NAT64
//! `64:ff9b::/96`, 6to4 `2002::/16`) are judged by the embedded address; Teredo is refused outright.
//!
//! Exceptions: `allow_hosts` entries (`name` or `name:port`) skip the checks for that host, and
//! `allow_cidrs` ranges make their addresses acceptable (literal or resolved, any port).
//! `allow_private = true` disables the guard except for the scheme check. `allow_public = false` narrows
//! it the other way: only `allow_cidrs` addresses and `allow_hosts` names may be fetched (the simulator
//! runs this way, loopback only, so a test can never make it fetch from outside the machine).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use url::{Host, Url};

use crate::media::allow::{host_key, parse_allowed_host, parse_cidr, AllowedHost};
use crate::media::config::MediaConfig;
use crate::media::error::MediaError;

/// Names that point inside the deployment by convention (compared lower-case, trailing dot removed).
const BLOCKED_NAMES: &[&str] = &[
    "localhost",
    "localhost.localdomain",
    "ip6-localhost",
    "ip6-loopback",
    "metadata",
    "metadata.google.internal",
    "metadata.goog",
    "kubernetes.default",
    "kubernetes.default.svc",
];

const BLOCKED_V4: &[(&str, &str)] = &[
    ("0.0.0.0/8", "this-network"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "carrier-grade NAT"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"),
    ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.0.2.0/24", "documentation"),
    ("192.88.99.0/24", "6to4 relay anycast"),
    ("192.168.0.0/16", "private"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation"),
    ("203.0.113.0/24", "documentation"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved/broadcast"),
];

const BLOCKED_V6: &[(&str, &str)] = &[
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("64:ff9b:1::/48", "local-use NAT64"),
    ("100::/64", "discard-only"),
    ("2001::/32", "Teredo"),
    ("2001:2::/48", "benchmarking"),
    ("2001:10::/28", "ORCHID"),
    ("2001:20::/28", "ORCHIDv2"),
    ("2001:db8::/32", "documentation"),
    ("3fff::/20", "documentation"),
    ("fc00::/7", "unique-local"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local"),
    ("ff00::/8", "multicast"),
];

fn nets(table: &[(&str, &'static str)]) -> Vec<(IpNet, &'static str)> {
    table.iter().filter_map(|(cidr, why)| cidr.parse().ok().map(|n| (n, *why))).collect()
}

/// The IPv4 address an IPv6 address stands for, where the prefix defines one.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let o = ip.octets();
    let tail = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    match s {
        // ::ffff:a.b.c.d (mapped) and ::a.b.c.d (compatible; `::` and `::1` are listed first)
        [0, 0, 0, 0, 0, 0xffff, _, _] | [0, 0, 0, 0, 0, 0, _, _] => Some(tail),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(tail),
        [0x2002, _, _, _, _, _, _, _] => Some(Ipv4Addr::new(o[2], o[3], o[4], o[5])),
        _ => None,
    }
}

/// The policy, built once per [`crate::media::Intake`].
#[derive(Debug)]
pub(crate) struct Guard {
    disabled: bool,
    /// Addresses outside every blocked range are acceptable (`media.allow_public`).
    allow_public: bool,
    allow_hosts: Vec<AllowedHost>,
    allow_cidrs: Vec<IpNet>,
    blocked_v4: Vec<(IpNet, &'static str)>,
    blocked_v6: Vec<(IpNet, &'static str)>,
}

/// What the URL-level check decided.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Exempt host, an allowed literal or a disabled guard: no further checks.
    Allowed,
    /// A host name whose resolved addresses must still be checked.
    ResolveAndCheck { host: String, port: u16, explicit_port: bool },
}

impl Guard {
    pub(crate) fn new(cfg: &MediaConfig) -> Result<Guard, String> {
        let allow_cidrs = cfg
            .allow_cidrs
            .iter()
            .map(|c| parse_cidr(c).ok_or_else(|| format!("media.allow_cidrs: invalid CIDR '{c}'")))
            .collect::<Result<_, _>>()?;
        let allow_hosts = cfg
            .allow_hosts
            .iter()
            .map(|h| parse_allowed_host(h).ok_or_else(|| format!("media.allow_hosts: invalid host '{h}'")))
            .collect::<Result<_, _>>()?;
        Ok(Guard {
            disabled: cfg.allow_private,
            allow_public: cfg.allow_public,
            allow_hosts,
            allow_cidrs,
            blocked_v4: nets(BLOCKED_V4),
            blocked_v6: nets(BLOCKED_V6),
        })
    }

    /// Why `ip` is in a blocked range, if it is (ignores the exceptions).
    pub(crate) fn blocked_range(&self, ip: IpAddr) -> Option<&'static str> {
        match ip {
            IpAddr::V4(v4) => {
                self.blocked_v4.iter().find(|(net, _)| net.contains(&IpAddr::V4(v4))).map(|(_, why)| *why)
            }
            IpAddr::V6(v6) => self
                .blocked_v6
                .iter()
                .find(|(net, _)| net.contains(&IpAddr::V6(v6)))
                .map(|(_, why)| *why)
                .or_else(|| embedded_v4(v6).and_then(|v4| self.blocked_range(IpAddr::V4(v4)))),
        }
    }

    fn in_allowed_cidr(&self, ip: IpAddr) -> bool {
        let embedded = match ip {
            IpAddr::V6(v6) => embedded_v4(v6).map(IpAddr::V4),
            IpAddr::V4(_) => None,
        };
        self.allow_cidrs.iter().any(|net| net.contains(&ip) || embedded.is_some_and(|e| net.contains(&e)))
    }

    /// May a connection go to `ip`?
    pub(crate) fn ip_allowed(&self, ip: IpAddr) -> bool {
        self.disabled || self.in_allowed_cidr(ip) || (self.allow_public && self.blocked_range(ip).is_none())
    }

    /// Is this host name exempt from address filtering (any port)? Used by the resolver, which
    /// does not see ports; the port part of an entry is enforced by [`Guard::check_url`].
    fn name_exempt(&self, name: &str) -> bool {
        let key = name.trim_end_matches('.').to_ascii_lowercase();
        self.disabled || self.allow_hosts.iter().any(|a| a.host == key)
    }

    /// Checks scheme, host and port of `url` (the first URL or a redirect target).
    pub(crate) fn check_url(&self, url: &Url) -> Result<Verdict, MediaError> {
        let blocked = |why: String| MediaError::FetchBlocked(format!("{why} ({url})"));
        if !matches!(url.scheme(), "http" | "https") {
            return Err(blocked(format!("scheme '{}' is not http(s)", url.scheme())));
        }
        let host = url.host().ok_or_else(|| MediaError::InvalidUrl(format!("no host in {url}")))?;
        let port = url.port_or_known_default().ok_or_else(|| MediaError::InvalidUrl(format!("no port for {url}")))?;
        if self.disabled {
            return Ok(Verdict::Allowed);
        }
        let key = host_key(host.clone());
        if self.allow_hosts.iter().any(|a| a.host == key && a.port.is_none_or(|p| p == port)) {
            return Ok(Verdict::Allowed);
        }
        let explicit_port = url.port().is_some();
        let ip = match host {
            Host::Ipv4(v4) => IpAddr::V4(v4),
            Host::Ipv6(v6) => IpAddr::V6(v6),
            Host::Domain(_) => {
                if BLOCKED_NAMES.contains(&key.as_str()) || key.ends_with(".localhost") {
                    return Err(blocked(format!("host name '{key}' is internal")));
                }
                return Ok(Verdict::ResolveAndCheck { host: key, port, explicit_port });
            }
        };
        self.check_address(ip, explicit_port.then_some(port)).map_err(blocked)?;
        Ok(Verdict::Allowed)
    }

    /// The one rule for an address, whether the URL names it literally or a name resolved to it, so
    /// `allow_cidrs` and the port rule mean the same for both. `explicit_port`: a non-default port,
    /// accepted only inside `allow_cidrs` (an internal service on a public address is still internal).
    fn check_address(&self, ip: IpAddr, explicit_port: Option<u16>) -> Result<(), String> {
        if self.in_allowed_cidr(ip) {
            return Ok(());
        }
        if let Some(why) = self.blocked_range(ip) {
            return Err(format!("address {ip} is {why}"));
        }
        if !self.allow_public {
            return Err(format!("address {ip} is not in media.allow_cidrs"));
        }
        match explicit_port {
            Some(port) => {
                Err(format!("non-default port {port} on {ip} (only media.allow_cidrs addresses may use one)"))
            }
            None => Ok(()),
        }
    }

    /// Steps 1–5 for one URL (the first or a redirect target).
    pub(crate) async fn check(&self, url: &Url) -> Result<(), MediaError> {
        match self.check_url(url)? {
            Verdict::Allowed => Ok(()),
            Verdict::ResolveAndCheck { host, port, explicit_port } => {
                self.check_resolved(&host, port, explicit_port).await
            }
        }
    }

    /// Step 5: resolves `host` and refuses it if any address fails [`Guard::check_address`].
    pub(crate) async fn check_resolved(&self, host: &str, port: u16, explicit_port: bool) -> Result<(), MediaError> {
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| MediaError::FetchFailed(format!("cannot resolve '{host}': {e}")))?
            .collect();
        if addrs.is_empty() {
            return Err(MediaError::FetchFailed(format!("'{host}' has no addresses")));
        }
        for addr in &addrs {
            if let Err(why) = self.check_address(addr.ip(), explicit_port.then_some(port)) {
                return Err(MediaError::FetchBlocked(format!("'{host}' resolves to {}: {why}", addr.ip())));
            }
        }
        Ok(())
    }
}

/// Error the resolver returns when every address of a name was filtered out; fetch maps it to
/// `fetch_blocked` by finding it in the error's source chain.
#[derive(Debug, thiserror::Error)]
#[error("every address of '{0}' is in a blocked range")]
pub(crate) struct ResolvedToBlocked(pub(crate) String);

/// reqwest DNS resolver that only hands out addresses the guard accepts.
pub(crate) struct GuardedResolver(pub(crate) Arc<Guard>);

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let guard = Arc::clone(&self.0);
        let host = name.as_str().to_string();
        Box::pin(async move {
            let exempt = guard.name_exempt(&host);
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await?
                .filter(|a| exempt || guard.ip_allowed(a.ip()))
                .collect();
            if addrs.is_empty() {
                return Err(Box::new(ResolvedToBlocked(host)) as _);
            }
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(allow_cidrs: &[&str], allow_hosts: &[&str]) -> Guard {
        Guard::new(&MediaConfig {
            allow_cidrs: allow_cidrs.iter().map(|s| s.to_string()).collect(),
            allow_hosts: allow_hosts.iter().map(|s| s.to_string()).collect(),
            ..MediaConfig::default()
        })
        .unwrap()
    }

    fn check(g: &Guard, url: &str) -> Result<Verdict, MediaError> {
        g.check_url(&Url::parse(url).unwrap())
    }

    const DENIED: &[&str] = &[
        "0.0.0.0",
        "10.1.2.3",
        "100.64.0.1",
        "100.127.255.254",
        "127.0.0.1",
        "127.255.255.254",
        "169.254.169.254",
        "172.16.0.1",
        "172.31.255.255",
        "192.0.0.8",
        "192.0.2.1",
        "192.168.1.1",
        "198.18.0.1",
        "198.51.100.7",
        "203.0.113.9",
        "224.0.0.251",
        "239.255.255.250",
        "240.0.0.1",
        "255.255.255.255",
        "::",
        "::1",
        "fc00::1",
        "fd12:3456::1",
        "fe80::1",
        "ff02::1",
        "2001:db8::1",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
        "::ffff:10.0.0.1",
        "::127.0.0.1",
        "64:ff9b::a00:1",
        "2002:c0a8:0101::1",
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",
    ];

    #[test]
    fn every_denied_range_is_blocked_by_default() {
        let g = guard(&[], &[]);
        for ip in DENIED {
            let addr: IpAddr = ip.parse().unwrap();
            assert!(g.blocked_range(addr).is_some(), "{ip} not in a blocked range");
            assert!(!g.ip_allowed(addr), "{ip}");
            let host = if addr.is_ipv6() { format!("[{ip}]") } else { ip.to_string() };
            let err = check(&g, &format!("http://{host}/a.png")).unwrap_err();
            assert_eq!(err.label(), "fetch_blocked", "{ip}");
        }
    }

    #[test]
    fn public_literals_are_judged_as_a_name_resolving_to_them_would_be() {
        let g = guard(&[], &[]);
        for ip in ["8.8.8.8", "1.1.1.1", "2606:4700::1111", "::ffff:8.8.8.8", "100.128.0.1"] {
            let addr: IpAddr = ip.parse().unwrap();
            assert!(g.ip_allowed(addr), "{ip}");
        }
        // Public on the default port: accepted, as a public name is; a non-default port only inside
        // allow_cidrs, as for a name.
        assert_eq!(check(&g, "http://8.8.8.8/").unwrap(), Verdict::Allowed);
        assert_eq!(check(&g, "http://[2606:4700::1111]/").unwrap(), Verdict::Allowed);
        assert_eq!(check(&g, "http://8.8.8.8:8443/").unwrap_err().label(), "fetch_blocked");
        assert_eq!(check(&guard(&["8.8.8.0/24"], &[]), "http://8.8.8.8:8443/").unwrap(), Verdict::Allowed);
    }

    #[test]
    fn allow_public_false_admits_only_the_allowed_ranges() {
        let g = Guard::new(&MediaConfig {
            allow_public: false,
            allow_cidrs: vec!["127.0.0.0/8".into(), "::1/128".into()],
            ..MediaConfig::default()
        })
        .unwrap();
        for ip in ["8.8.8.8", "2606:4700::1111", "169.254.169.254", "10.0.0.1", "::ffff:8.8.8.8"] {
            assert!(!g.ip_allowed(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["127.0.0.1", "127.0.0.2", "::1", "::ffff:127.0.0.1"] {
            assert!(g.ip_allowed(ip.parse().unwrap()), "{ip}");
        }
        assert!(check(&g, "http://8.8.8.8/").is_err());
        assert_eq!(check(&g, "http://127.0.0.2:9/").unwrap(), Verdict::Allowed);
    }

    #[test]
    fn alternative_ipv4_spellings_are_normalised_then_blocked() {
        let g = guard(&[], &[]);
        for url in [
            "http://2130706433/",
            "http://0177.0.0.1/",
            "http://0x7f.0.0.1/",
            "http://0x7f000001/",
            "http://127.1/",
            "http://017700000001/",
            "http://[::ffff:7f00:1]/",
        ] {
            assert_eq!(check(&g, url).unwrap_err().label(), "fetch_blocked", "{url}");
        }
        let g = guard(&["127.0.0.0/8"], &[]);
        for url in ["http://2130706433:8080/", "http://0177.0.0.1/", "http://[::ffff:127.0.0.1]/"] {
            assert_eq!(check(&g, url).unwrap(), Verdict::Allowed, "{url}");
        }
    }

    #[test]
    fn names_ports_and_schemes() {
        let g = guard(&[], &[]);
        for url in [
            "http://localhost/",
            "http://LOCALHOST./",
            "http://metadata.google.internal/computeMetadata/v1/",
            "http://app.localhost/",
            "ftp://cdn.example.com/",
            "gopher://cdn.example.com/",
            "file:///etc/passwd",
        ] {
            assert_eq!(check(&g, url).unwrap_err().label(), "fetch_blocked", "{url}");
        }
        assert_eq!(
            check(&g, "https://CDN.example.com./x.png").unwrap(),
            Verdict::ResolveAndCheck { host: "cdn.example.com".into(), port: 443, explicit_port: false }
        );
        // A name's port is judged with its addresses (step 5), as a literal's is.
        assert_eq!(
            check(&g, "http://cdn.example.com:8080/").unwrap(),
            Verdict::ResolveAndCheck { host: "cdn.example.com".into(), port: 8080, explicit_port: true }
        );
        assert!(check(&g, "http://cdn.example.com:80/").is_ok());
    }

    #[test]
    fn allow_hosts_entries_match_host_and_optional_port() {
        let g = guard(&[], &["localhost", "media.internal:8080", "[::1]:9000"]);
        assert_eq!(check(&g, "http://localhost:1234/").unwrap(), Verdict::Allowed);
        assert_eq!(check(&g, "http://media.internal:8080/").unwrap(), Verdict::Allowed);
        // Another port is not exempt: the name is judged by its addresses, like any other.
        assert_eq!(
            check(&g, "http://media.internal:8081/").unwrap(),
            Verdict::ResolveAndCheck { host: "media.internal".into(), port: 8081, explicit_port: true }
        );
        assert_eq!(check(&g, "http://[::1]:9000/").unwrap(), Verdict::Allowed);
        assert!(check(&g, "http://[::1]:9001/").is_err());
        assert!(g.name_exempt("LocalHost."));
        assert!(!g.name_exempt("example.com"));
    }

    #[test]
    fn disabled_guard_allows_private_but_not_other_schemes() {
        let g = Guard::new(&MediaConfig { allow_private: true, ..MediaConfig::default() }).unwrap();
        assert_eq!(check(&g, "http://10.0.0.1:8080/").unwrap(), Verdict::Allowed);
        assert!(check(&g, "gopher://10.0.0.1/").is_err());
    }

    #[tokio::test]
    async fn names_resolving_to_blocked_addresses_are_refused_at_both_layers() {
        use reqwest::dns::Resolve;
        // `localhost` resolves to loopback on every machine (hosts file, no network).
        let g = Arc::new(guard(&[], &[]));
        let err = g.check_resolved("localhost", 80, false).await.unwrap_err();
        assert_eq!(err.label(), "fetch_blocked");
        let resolver = GuardedResolver(Arc::clone(&g));
        match resolver.resolve("localhost".parse().unwrap()).await {
            Ok(_) => panic!("resolver handed out a loopback address"),
            Err(e) => assert!(e.downcast_ref::<ResolvedToBlocked>().is_some(), "{e}"),
        }

        // allow_cidrs opens both layers; an allow_hosts name is exempt in the resolver (the
        // URL-level check already matched its port, and skips step 5 for it).
        // ... on any port, as for the literal `http://127.0.0.1:8080/`.
        let loopback = Arc::new(guard(&["127.0.0.0/8", "::1/128"], &[]));
        loopback.check_resolved("localhost", 80, false).await.unwrap();
        loopback.check_resolved("localhost", 8080, true).await.unwrap();
        assert_eq!(check(&loopback, "http://127.0.0.1:8080/").unwrap(), Verdict::Allowed);
        for allowed in [guard(&["127.0.0.0/8", "::1/128"], &[]), guard(&[], &["localhost"])] {
            let g = Arc::new(allowed);
            let resolver = GuardedResolver(Arc::clone(&g));
            let addrs: Vec<SocketAddr> = match resolver.resolve("localhost".parse().unwrap()).await {
                Ok(addrs) => addrs.collect(),
                Err(e) => panic!("{e}"),
            };
            assert!(addrs.iter().all(|a| a.ip().is_loopback()), "{addrs:?}");
            assert!(!addrs.is_empty());
        }
    }
}
