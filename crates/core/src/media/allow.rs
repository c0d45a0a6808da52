//! The SSRF guard's exceptions as written in the configuration: `allow_cidrs` entries (a CIDR or an
//! address) and `allow_hosts` entries (`name[:port]`), parsed and normalised like a URL host. Shared by
//! config validation (which rejects bad entries at load) and the guard (which applies them).

use std::net::IpAddr;

use ipnet::IpNet;
use url::{Host, Url};

/// Parses an `allow_cidrs` entry: a CIDR or a single address.
pub(crate) fn parse_cidr(s: &str) -> Option<IpNet> {
    let s = s.trim();
    s.parse::<IpNet>().ok().or_else(|| s.parse::<IpAddr>().ok().map(IpNet::from))
}

/// One `allow_hosts` entry, normalised like a URL host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AllowedHost {
    pub host: String,
    pub port: Option<u16>,
}

/// Parses `name`, `name:port`, `1.2.3.4[:port]` or `[v6][:port]`.
pub(crate) fn parse_allowed_host(s: &str) -> Option<AllowedHost> {
    let s = s.trim();
    if s.is_empty() || s.contains('/') || s.contains('@') {
        return None;
    }
    // Let the URL parser normalise it exactly as it normalises request URLs.
    let url = Url::parse(&format!("http://{s}/")).ok()?;
    let host = host_key(url.host()?);
    if url.path() != "/" || url.query().is_some() {
        return None;
    }
    // `Url::port` hides 80; the entry's text says whether a port was written.
    let written_port = s.rsplit_once(':').is_some_and(|(h, p)| {
        !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && (!h.contains(':') || h.ends_with(']'))
    });
    let port = if written_port { Some(url.port_or_known_default()?) } else { None };
    Some(AllowedHost { host, port })
}

/// The comparable form of a URL host: lower case, no trailing dot, IPv6 without brackets.
pub(crate) fn host_key(host: Host<&str>) -> String {
    match host {
        Host::Domain(d) => d.trim_end_matches('.').to_ascii_lowercase(),
        Host::Ipv4(ip) => ip.to_string(),
        Host::Ipv6(ip) => ip.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_host_parsing() {
        assert_eq!(
            parse_allowed_host("Example.COM:80"),
            Some(AllowedHost { host: "example.com".into(), port: Some(80) })
        );
        assert_eq!(parse_allowed_host("example.com").unwrap().port, None);
        assert_eq!(parse_allowed_host("[::1]").unwrap().port, None);
        for bad in ["", "a b", "http://x", "x/y", "x:99999", "u@x"] {
            assert!(parse_allowed_host(bad).is_none(), "{bad}");
        }
        assert!(parse_cidr("10.0.0.0/8").is_some());
        assert!(parse_cidr("127.0.0.1").is_some());
        assert!(parse_cidr("::1").is_some());
        assert!(parse_cidr("10.0.0.0/33").is_none());
    }
}
