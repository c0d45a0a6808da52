//! Pure helpers for ZeroMQ endpoint strings as engines configure and report them.
//!
//! * Engines usually **bind** a wildcard address (`tcp://*:5557`, `tcp://0.0.0.0:5557`, `tcp://[::]:5557`);
//!   a subscriber must connect to the worker's host instead: [`connectable`].
//! * With data parallelism, vLLM and SGLang run one publisher per rank and offset the **TCP port** by the
//!   rank, for both the PUB and the replay endpoint: [`offset_port`]. (vLLM also renames `inproc://x` to
//!   `inproc://x_dp<r>`, which is unreachable from another process and therefore rejected here.)

use std::fmt;

/// Why an endpoint string cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    /// Not `tcp://host:port` or `ipc://path`.
    #[error("unsupported endpoint `{0}` (expected tcp://host:port or ipc://path)")]
    Unsupported(String),
    /// The port is missing, not a number, or out of range.
    #[error("bad port in endpoint `{0}`")]
    BadPort(String),
    /// Port 0 (an ephemeral bind) cannot be connected to; ask the worker for the resolved port instead.
    #[error("endpoint `{0}` uses port 0 (ephemeral); discover the resolved port instead")]
    EphemeralPort(String),
    /// Port offsetting only works for TCP.
    #[error("cannot offset the port of non-TCP endpoint `{0}` by a data-parallel rank")]
    NotTcp(String),
}

/// A parsed endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `tcp://host:port`; `host` is kept without IPv6 brackets.
    Tcp {
        /// Host name or address (IPv6 without brackets).
        host: String,
        /// TCP port.
        port: u16,
    },
    /// `ipc://path`.
    Ipc(String),
}

impl Endpoint {
    /// Parses `tcp://host:port` or `ipc://path`.
    pub fn parse(s: &str) -> Result<Self, EndpointError> {
        if let Some(path) = s.strip_prefix("ipc://") {
            if path.is_empty() {
                return Err(EndpointError::Unsupported(s.to_owned()));
            }
            return Ok(Endpoint::Ipc(path.to_owned()));
        }
        let Some(rest) = s.strip_prefix("tcp://") else {
            return Err(EndpointError::Unsupported(s.to_owned()));
        };
        let (host, port) = rest.rsplit_once(':').ok_or_else(|| EndpointError::BadPort(s.to_owned()))?;
        let port: u16 = port.parse().map_err(|_| EndpointError::BadPort(s.to_owned()))?;
        let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        if host.is_empty() {
            return Err(EndpointError::Unsupported(s.to_owned()));
        }
        Ok(Endpoint::Tcp { host: host.to_owned(), port })
    }

    /// Whether the host is a bind wildcard (`*`, `0.0.0.0`, `::`).
    pub fn is_wildcard(&self) -> bool {
        matches!(self, Endpoint::Tcp { host, .. } if is_wildcard_host(host))
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Tcp { host, port } if host.contains(':') => write!(f, "tcp://[{host}]:{port}"),
            Endpoint::Tcp { host, port } => write!(f, "tcp://{host}:{port}"),
            Endpoint::Ipc(path) => write!(f, "ipc://{path}"),
        }
    }
}

/// Whether `host` is a bind wildcard.
pub fn is_wildcard_host(host: &str) -> bool {
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    matches!(host, "*" | "0.0.0.0" | "::" | "0:0:0:0:0:0:0:0" | "")
}

/// Formats `tcp://host:port`, bracketing IPv6 hosts.
pub fn tcp_endpoint(host: &str, port: u16) -> String {
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    Endpoint::Tcp { host: host.to_owned(), port }.to_string()
}

/// Turns an endpoint as the engine configured or reported it into one a subscriber can connect to:
/// a wildcard host is replaced by `worker_host`; port 0 is rejected.
pub fn connectable(endpoint: &str, worker_host: &str) -> Result<String, EndpointError> {
    match Endpoint::parse(endpoint)? {
        Endpoint::Tcp { port: 0, .. } => Err(EndpointError::EphemeralPort(endpoint.to_owned())),
        Endpoint::Tcp { host, port } if is_wildcard_host(&host) => Ok(tcp_endpoint(worker_host, port)),
        // vLLM binds only endpoints containing `::` (or `*`), so operators spell an IPv4 bind address
        // as `[::ffff:a.b.c.d]`: that is the IPv4 host, and must compare equal to the worker's.
        Endpoint::Tcp { host, port } => {
            match host.parse::<std::net::Ipv6Addr>().ok().and_then(|a| a.to_ipv4_mapped()) {
                Some(v4) => Ok(tcp_endpoint(&v4.to_string(), port)),
                None => Ok(Endpoint::Tcp { host, port }.to_string()),
            }
        }
        ep => Ok(ep.to_string()),
    }
}

/// Offsets the TCP port of `endpoint` by `rank`, as vLLM and SGLang do for data-parallel publishers.
pub fn offset_port(endpoint: &str, rank: u32) -> Result<String, EndpointError> {
    match Endpoint::parse(endpoint)? {
        Endpoint::Tcp { port: 0, .. } => Err(EndpointError::EphemeralPort(endpoint.to_owned())),
        Endpoint::Tcp { host, port } => {
            let port = u32::from(port)
                .checked_add(rank)
                .and_then(|p| u16::try_from(p).ok())
                .ok_or_else(|| EndpointError::BadPort(endpoint.to_owned()))?;
            Ok(Endpoint::Tcp { host, port }.to_string())
        }
        Endpoint::Ipc(_) if rank == 0 => Ok(endpoint.to_owned()),
        Endpoint::Ipc(_) => Err(EndpointError::NotTcp(endpoint.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display() {
        assert_eq!(Endpoint::parse("tcp://10.0.0.1:5557").unwrap().to_string(), "tcp://10.0.0.1:5557");
        assert_eq!(Endpoint::parse("tcp://[::1]:5557").unwrap(), Endpoint::Tcp { host: "::1".into(), port: 5557 });
        assert_eq!(Endpoint::parse("tcp://[::1]:5557").unwrap().to_string(), "tcp://[::1]:5557");
        assert_eq!(Endpoint::parse("ipc:///tmp/kv").unwrap(), Endpoint::Ipc("/tmp/kv".into()));
        for bad in ["inproc://x", "tcp://host", "tcp://host:abc", "tcp://host:70000", "tcp://:1", "udp://a:1", "ipc://"]
        {
            assert!(Endpoint::parse(bad).is_err(), "{bad}");
        }
        assert!(Endpoint::parse("tcp://*:5557").unwrap().is_wildcard());
        assert!(!Endpoint::parse("tcp://a:5557").unwrap().is_wildcard());
    }

    #[test]
    fn wildcard_substitution() {
        assert_eq!(connectable("tcp://*:5557", "w1").unwrap(), "tcp://w1:5557");
        assert_eq!(connectable("tcp://0.0.0.0:5557", "10.1.2.3").unwrap(), "tcp://10.1.2.3:5557");
        assert_eq!(connectable("tcp://[::]:5557", "fd00::1").unwrap(), "tcp://[fd00::1]:5557");
        assert_eq!(connectable("tcp://collector:5557", "w1").unwrap(), "tcp://collector:5557");
        assert_eq!(connectable("tcp://[::ffff:127.0.0.1]:5557", "w1").unwrap(), "tcp://127.0.0.1:5557");
        assert_eq!(connectable("tcp://[fd00::7]:5557", "w1").unwrap(), "tcp://[fd00::7]:5557");
        assert_eq!(connectable("ipc:///tmp/x", "w1").unwrap(), "ipc:///tmp/x");
        assert_eq!(connectable("tcp://*:0", "w1"), Err(EndpointError::EphemeralPort("tcp://*:0".into())));
    }

    #[test]
    fn port_offsets() {
        assert_eq!(offset_port("tcp://w:5557", 0).unwrap(), "tcp://w:5557");
        assert_eq!(offset_port("tcp://w:5557", 3).unwrap(), "tcp://w:5560");
        assert_eq!(offset_port("tcp://[::1]:5557", 1).unwrap(), "tcp://[::1]:5558");
        assert!(matches!(offset_port("tcp://w:65535", 1), Err(EndpointError::BadPort(_))));
        assert!(matches!(offset_port("tcp://w:0", 1), Err(EndpointError::EphemeralPort(_))));
        assert_eq!(offset_port("ipc:///tmp/x", 0).unwrap(), "ipc:///tmp/x");
        assert!(matches!(offset_port("ipc:///tmp/x", 1), Err(EndpointError::NotTcp(_))));
    }
}
