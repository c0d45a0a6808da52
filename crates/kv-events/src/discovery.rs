//! Parsers for the engines' KV-event discovery endpoints. Pure functions: the caller performs the HTTP
//! GET and hands over the body.
//!
//! * **vLLM** (0.33) `GET /kv_event_sources`: the resolved publisher per data-parallel rank, useful with
//!   ephemeral ports (`tcp://*:0`). Snapshots answer either a bare array or `{"sources": [...]}`; each entry
//!   has `data_parallel_rank`, `endpoint`, `replay_endpoint` (nullable) and `topic`. Endpoints may carry a
//!   wildcard host (`0.0.0.0`, `*`), which is replaced by the worker's host.
//! * **SGLang** `GET /server_info` (or `/get_server_info`): a `kv_events` object with `publisher`,
//!   `endpoint_host`, `endpoint_port_base`, `topic`, `block_size`, `dp_size` and optionally
//!   `replay_endpoint_port_base`, `load_endpoint_port_base`, `load_topic`. It is absent when events are off,
//!   the page size is ≤ 0 or the endpoint is not TCP. Rank `r` uses `port_base + r`.
//!
//! Unknown fields are ignored everywhere.
//!
//! **Trust.** A discovery document comes from the worker, not from the operator, so it must not point
//! the router anywhere else: publisher and replay endpoints must be on the worker's own host (wildcards
//! are replaced by it) or on a host the caller allows, otherwise the document is refused
//! (`foreign_host`); `ipc://` endpoints are accepted only when the worker host is a loopback name.
//! Documents naming more than [`MAX_DATA_PARALLEL`] ranks are refused (`too_many_ranks`).
//! vLLM 0.32–0.34 answer an object keyed by rank (`{"0": {"endpoint": …}, …}`); the array and
//! `{"sources": [...]}` shapes are accepted too.

use serde_json::Value;

use crate::endpoint::{self, Endpoint, EndpointError};
use crate::feed::FeedConfig;

/// The most data-parallel ranks (feeds per worker) a discovery document may name.
pub const MAX_DATA_PARALLEL: u32 = 64;

/// Why a discovery document could not be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DiscoveryError {
    /// The body is not JSON.
    #[error("discovery body is not JSON: {0}")]
    Json(String),
    /// The JSON does not have the documented shape.
    #[error("unexpected discovery document: {0}")]
    Shape(&'static str),
    /// An endpoint in the document is unusable.
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// The document names more than [`MAX_DATA_PARALLEL`] ranks (or a rank at or beyond it).
    #[error("discovery document names {0} ranks, more than {MAX_DATA_PARALLEL}")]
    TooManyRanks(u64),
    /// An endpoint's host is neither the worker's host nor an allowed one.
    #[error("endpoint `{0}` is not on the worker's host")]
    ForeignHost(String),
}

impl DiscoveryError {
    /// Snake_case label for metrics: `not_json`, `bad_shape`, `bad_endpoint`, `too_many_ranks` or
    /// `foreign_host`.
    pub fn label(&self) -> &'static str {
        match self {
            DiscoveryError::Json(_) => "not_json",
            DiscoveryError::Shape(_) => "bad_shape",
            DiscoveryError::Endpoint(_) => "bad_endpoint",
            DiscoveryError::TooManyRanks(_) => "too_many_ranks",
            DiscoveryError::ForeignHost(_) => "foreign_host",
        }
    }
}

fn parse_json(body: &[u8]) -> Result<Value, DiscoveryError> {
    serde_json::from_slice(body).map_err(|e| DiscoveryError::Json(e.to_string()))
}

fn u32_field(
    obj: &serde_json::Map<String, Value>,
    key: &str,
    what: &'static str,
) -> Result<Option<u32>, DiscoveryError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().and_then(|v| u32::try_from(v).ok()).map(Some).ok_or(DiscoveryError::Shape(what)),
    }
}

fn str_field<'a>(
    obj: &'a serde_json::Map<String, Value>,
    key: &str,
    what: &'static str,
) -> Result<Option<&'a str>, DiscoveryError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(DiscoveryError::Shape(what)),
    }
}

/// Parses the body of vLLM's `GET /kv_event_sources` into one [`FeedConfig`] per rank, sorted by rank.
/// Endpoints must be on `worker_host` or one of `allowed_hosts` (see the module docs).
pub fn parse_vllm_kv_event_sources(
    body: &[u8],
    worker_host: &str,
    allowed_hosts: &[String],
) -> Result<Vec<FeedConfig>, DiscoveryError> {
    vllm_kv_event_sources(&parse_json(body)?, worker_host, allowed_hosts)
}

/// Same as [`parse_vllm_kv_event_sources`], from parsed JSON.
pub fn vllm_kv_event_sources(
    doc: &Value,
    worker_host: &str,
    allowed_hosts: &[String],
) -> Result<Vec<FeedConfig>, DiscoveryError> {
    let entries = vllm_entries(doc)?;
    if entries.len() > MAX_DATA_PARALLEL as usize {
        return Err(DiscoveryError::TooManyRanks(entries.len() as u64));
    }
    let mut feeds = Vec::with_capacity(entries.len());
    for (index, (key_rank, entry)) in entries.into_iter().enumerate() {
        let default_rank = key_rank.unwrap_or(u32::try_from(index).unwrap_or(u32::MAX));
        if let Some(cfg) = vllm_entry(entry, default_rank, worker_host, allowed_hosts)? {
            feeds.push(cfg);
        }
    }
    feeds.sort_by_key(|f| f.dp_rank);
    Ok(feeds)
}

/// The source entries of any accepted shape, with the rank given by an object key.
fn vllm_entries(doc: &Value) -> Result<Vec<(Option<u32>, &Value)>, DiscoveryError> {
    const SHAPE: &str = "expected an array, {\"sources\": [...]} or an object keyed by rank";
    match doc {
        Value::Array(entries) => Ok(entries.iter().map(|e| (None, e)).collect()),
        Value::Object(obj) => match obj.get("sources") {
            Some(Value::Array(entries)) => Ok(entries.iter().map(|e| (None, e)).collect()),
            Some(_) => Err(DiscoveryError::Shape(SHAPE)),
            None if obj.is_empty() => Err(DiscoveryError::Shape(SHAPE)),
            // vLLM 0.32–0.34: {"0": {...}, "1": {...}}, the key is the rank.
            None => obj
                .iter()
                .map(|(k, v)| k.parse::<u32>().map(|r| (Some(r), v)).map_err(|_| DiscoveryError::Shape(SHAPE)))
                .collect(),
        },
        _ => Err(DiscoveryError::Shape(SHAPE)),
    }
}

fn vllm_entry(
    entry: &Value,
    default_rank: u32,
    worker_host: &str,
    allowed_hosts: &[String],
) -> Result<Option<FeedConfig>, DiscoveryError> {
    let Value::Object(obj) = entry else {
        return Err(DiscoveryError::Shape("source entry is not an object"));
    };
    if str_field(obj, "transport", "transport is not a string")?.is_some_and(|t| t != "zmq") {
        return Ok(None);
    }
    let Some(ep) = str_field(obj, "endpoint", "endpoint is not a string")? else {
        return Ok(None); // no publisher for this rank
    };
    let rank = u32_field(obj, "data_parallel_rank", "data_parallel_rank is not a u32")?.unwrap_or(default_rank);
    if rank >= MAX_DATA_PARALLEL {
        return Err(DiscoveryError::TooManyRanks(u64::from(rank) + 1));
    }
    let replay = str_field(obj, "replay_endpoint", "replay_endpoint is not a string")?;
    let topic = str_field(obj, "topic", "topic is not a string")?.unwrap_or("");
    let mut cfg = FeedConfig::from_engine_config(worker_host, ep, replay, topic)?;
    cfg.dp_rank = rank;
    check_host(&cfg.endpoint, worker_host, allowed_hosts)?;
    if let Some(r) = &cfg.replay_endpoint {
        check_host(r, worker_host, allowed_hosts)?;
    }
    Ok(Some(cfg))
}

fn same_host(a: &str, b: &str) -> bool {
    let strip = |h: &str| h.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(h).to_owned();
    strip(a).eq_ignore_ascii_case(&strip(b))
}

/// Refuses an endpoint that would make the router connect somewhere the worker does not live.
fn check_host(ep: &str, worker_host: &str, allowed_hosts: &[String]) -> Result<(), DiscoveryError> {
    let ok = match Endpoint::parse(ep)? {
        Endpoint::Tcp { host, .. } => {
            same_host(&host, worker_host) || allowed_hosts.iter().any(|a| same_host(&host, a))
        }
        // A path on the router's machine: only meaningful when the worker is local.
        Endpoint::Ipc(_) => ["localhost", "127.0.0.1", "::1"].iter().any(|l| same_host(worker_host, l)),
    };
    if ok {
        Ok(())
    } else {
        Err(DiscoveryError::ForeignHost(ep.to_owned()))
    }
}

/// SGLang's `kv_events` discovery object, resolved into feeds.
#[derive(Clone, Debug, PartialEq)]
pub struct SglangKvEvents {
    /// One feed per DP rank (`0..dp_size`).
    pub feeds: Vec<FeedConfig>,
    /// Event block size (`page_size × dcp_size`), if reported.
    pub block_size: Option<u32>,
    /// Load-publisher endpoints per rank (`LoadStat` PUB streams; not decoded by this crate).
    pub load_endpoints: Vec<String>,
    /// Topic of the load stream (`"load"`), if reported.
    pub load_topic: Option<String>,
}

/// Parses the body of SGLang's `GET /server_info`. `Ok(None)` when it has no usable `kv_events` object
/// (absent, or the publisher is not `zmq`). `endpoint_host` must be `worker_host` (or a wildcard) or one of
/// `allowed_hosts`.
pub fn parse_sglang_server_info(
    body: &[u8],
    worker_host: &str,
    allowed_hosts: &[String],
) -> Result<Option<SglangKvEvents>, DiscoveryError> {
    let doc = parse_json(body)?;
    let Value::Object(obj) = &doc else {
        return Err(DiscoveryError::Shape("server_info is not an object"));
    };
    match obj.get("kv_events") {
        None | Some(Value::Null) => Ok(None),
        Some(kv) => sglang_kv_events(kv, worker_host, allowed_hosts),
    }
}

/// Resolves SGLang's `kv_events` object itself. `Ok(None)` when the publisher is not `zmq`.
pub fn sglang_kv_events(
    kv: &Value,
    worker_host: &str,
    allowed_hosts: &[String],
) -> Result<Option<SglangKvEvents>, DiscoveryError> {
    let Value::Object(obj) = kv else {
        return Err(DiscoveryError::Shape("kv_events is not an object"));
    };
    if str_field(obj, "publisher", "publisher is not a string")?.is_some_and(|p| p != "zmq") {
        return Ok(None);
    }
    let host = str_field(obj, "endpoint_host", "endpoint_host is not a string")?
        .ok_or(DiscoveryError::Shape("endpoint_host missing"))?;
    let host = if endpoint::is_wildcard_host(host) { worker_host } else { host };
    if !same_host(host, worker_host) && !allowed_hosts.iter().any(|a| same_host(host, a)) {
        return Err(DiscoveryError::ForeignHost(host.to_owned()));
    }
    let base = u32_field(obj, "endpoint_port_base", "endpoint_port_base is not a port")?
        .ok_or(DiscoveryError::Shape("endpoint_port_base missing"))?;
    let replay_base = u32_field(obj, "replay_endpoint_port_base", "replay_endpoint_port_base is not a port")?;
    let load_base = u32_field(obj, "load_endpoint_port_base", "load_endpoint_port_base is not a port")?;
    let dp_size = u32_field(obj, "dp_size", "dp_size is not a u32")?.unwrap_or(1).max(1);
    if dp_size > MAX_DATA_PARALLEL {
        return Err(DiscoveryError::TooManyRanks(u64::from(dp_size)));
    }
    let topic = str_field(obj, "topic", "topic is not a string")?.unwrap_or("");
    let port = |base: u32, rank: u32| -> Result<u16, DiscoveryError> {
        match base.checked_add(rank).and_then(|p| u16::try_from(p).ok()) {
            Some(0) | None => Err(DiscoveryError::Shape("port out of range")),
            Some(p) => Ok(p),
        }
    };
    let mut feeds = Vec::with_capacity(dp_size as usize);
    let mut load_endpoints = Vec::new();
    for rank in 0..dp_size {
        let mut cfg = FeedConfig::new(endpoint::tcp_endpoint(host, port(base, rank)?)).with_topic(topic);
        cfg.dp_rank = rank;
        cfg.replay_endpoint =
            replay_base.map(|b| port(b, rank).map(|p| endpoint::tcp_endpoint(host, p))).transpose()?;
        feeds.push(cfg);
        if let Some(b) = load_base {
            load_endpoints.push(endpoint::tcp_endpoint(host, port(b, rank)?));
        }
    }
    Ok(Some(SglangKvEvents {
        feeds,
        block_size: u32_field(obj, "block_size", "block_size is not a u32")?,
        load_endpoints,
        load_topic: str_field(obj, "load_topic", "load_topic is not a string")?.map(str::to_owned),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_bare_array() {
        let body =
            br#"[{"data_parallel_rank": 0, "endpoint": "tcp://10.0.0.1:5557", "replay_endpoint": null, "topic": ""}]"#;
        let feeds = parse_vllm_kv_event_sources(body, "worker-a", &["10.0.0.1".into()]).unwrap();
        assert_eq!(feeds.len(), 1);
        assert_eq!(feeds[0].endpoint, "tcp://10.0.0.1:5557");
        assert_eq!(feeds[0].replay_endpoint, None);
        assert_eq!(feeds[0].topic, "");
        assert_eq!(feeds[0].dp_rank, 0);
    }

    #[test]
    fn vllm_envelope_with_wildcards_sorted_by_rank() {
        let body = br#"{"sources": [
            {"data_parallel_rank": 1, "endpoint": "tcp://0.0.0.0:41002", "replay_endpoint": null,
             "topic": "kv-events", "extra": {"x": 1}},
            {"data_parallel_rank": 0, "endpoint": "tcp://*:41001", "replay_endpoint": "tcp://0.0.0.0:41003",
             "topic": "kv-events"}
        ], "version": 2}"#;
        let feeds = parse_vllm_kv_event_sources(body, "10.1.1.1", &[]).unwrap();
        assert_eq!(feeds.iter().map(|f| f.dp_rank).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(feeds[0].endpoint, "tcp://10.1.1.1:41001");
        assert_eq!(feeds[0].replay_endpoint.as_deref(), Some("tcp://10.1.1.1:41003"));
        assert_eq!(feeds[1].endpoint, "tcp://10.1.1.1:41002");
        assert_eq!(feeds[1].topic, "kv-events");
    }

    #[test]
    fn vllm_ipv6_worker_host_and_skips() {
        let body = br#"[{"endpoint": "tcp://[::]:5557"}, {"data_parallel_rank": 1, "endpoint": null},
                        {"data_parallel_rank": 2, "transport": "nats", "endpoint": "nats://x"}]"#;
        let feeds = parse_vllm_kv_event_sources(body, "fd00::2", &[]).unwrap();
        assert_eq!(feeds.len(), 1);
        assert_eq!(feeds[0].endpoint, "tcp://[fd00::2]:5557");
    }

    #[test]
    fn vllm_errors() {
        let err = |b: &[u8]| parse_vllm_kv_event_sources(b, "h", &[]).unwrap_err().label();
        assert_eq!(err(b"not json"), "not_json");
        assert_eq!(err(b"{}"), "bad_shape");
        assert_eq!(err(b"[1]"), "bad_shape");
        assert_eq!(err(br#"[{"endpoint": 5}]"#), "bad_shape");
        assert_eq!(err(br#"[{"endpoint": "tcp://*:0"}]"#), "bad_endpoint");
        assert_eq!(err(br#"[{"endpoint": "inproc://x"}]"#), "bad_endpoint");
        assert_eq!(err(br#"[{"endpoint": "tcp://h:1", "data_parallel_rank": -1}]"#), "bad_shape");
    }

    #[test]
    fn sglang_server_info() {
        let body = br#"{"model_path": "m", "page_size": 16, "kv_events": {
            "publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": 5557, "topic": "kv",
            "block_size": 32, "dp_size": 2, "replay_endpoint_port_base": 6557,
            "load_endpoint_port_base": 7557, "load_topic": "load", "future_field": true}}"#;
        let kv = parse_sglang_server_info(body, "10.0.0.9", &[]).unwrap().unwrap();
        assert_eq!(kv.block_size, Some(32));
        assert_eq!(kv.feeds.len(), 2);
        assert_eq!(kv.feeds[1].endpoint, "tcp://10.0.0.9:5558");
        assert_eq!(kv.feeds[1].replay_endpoint.as_deref(), Some("tcp://10.0.0.9:6558"));
        assert_eq!(kv.feeds[1].dp_rank, 1);
        assert_eq!(kv.feeds[0].topic, "kv");
        assert_eq!(kv.load_endpoints, vec!["tcp://10.0.0.9:7557", "tcp://10.0.0.9:7558"]);
        assert_eq!(kv.load_topic.as_deref(), Some("load"));
    }

    #[test]
    fn sglang_minimal_and_absent() {
        let body = br#"{"kv_events": {"endpoint_host": "worker-3", "endpoint_port_base": 5557}}"#;
        let kv = parse_sglang_server_info(body, "WORKER-3", &[]).unwrap().unwrap();
        assert_eq!(kv.feeds.len(), 1);
        assert_eq!(kv.feeds[0].endpoint, "tcp://worker-3:5557");
        assert_eq!(kv.feeds[0].replay_endpoint, None);
        assert_eq!(kv.block_size, None);
        assert!(kv.load_endpoints.is_empty());
        assert_eq!(parse_sglang_server_info(br#"{"page_size": 1}"#, "h", &[]).unwrap(), None);
        assert_eq!(parse_sglang_server_info(br#"{"kv_events": null}"#, "h", &[]).unwrap(), None);
        let null_pub = br#"{"kv_events": {"publisher": "null", "endpoint_host": "h", "endpoint_port_base": 1}}"#;
        assert_eq!(parse_sglang_server_info(null_pub, "h", &[]).unwrap(), None);
    }

    #[test]
    fn sglang_errors() {
        let err = |b: &[u8]| parse_sglang_server_info(b, "h", &[]).unwrap_err().label();
        assert_eq!(err(b"[]"), "bad_shape");
        assert_eq!(err(br#"{"kv_events": 1}"#), "bad_shape");
        assert_eq!(err(br#"{"kv_events": {"endpoint_port_base": 1}}"#), "bad_shape");
        assert_eq!(err(br#"{"kv_events": {"endpoint_host": "h"}}"#), "bad_shape");
        assert_eq!(
            err(br#"{"kv_events": {"endpoint_host": "h", "endpoint_port_base": 65535, "dp_size": 2}}"#),
            "bad_shape"
        );
        assert_eq!(err(b"{"), "not_json");
    }

    #[test]
    fn vllm_object_keyed_by_rank() {
        // vLLM 0.32–0.34's shape: the key is the rank.
        let body = br#"{"1": {"endpoint": "tcp://*:5558", "replay_endpoint": null, "topic": "kv"},
                         "0": {"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5600", "topic": "kv"}}"#;
        let feeds = parse_vllm_kv_event_sources(body, "10.0.0.7", &[]).unwrap();
        assert_eq!(feeds.iter().map(|f| f.dp_rank).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(feeds[0].endpoint, "tcp://10.0.0.7:5557");
        assert_eq!(feeds[0].replay_endpoint.as_deref(), Some("tcp://10.0.0.7:5600"));
        assert_eq!(feeds[1].endpoint, "tcp://10.0.0.7:5558");
        assert_eq!(feeds[1].replay_endpoint, None);
        let err = parse_vllm_kv_event_sources(br#"{"zero": {"endpoint": "tcp://*:1"}}"#, "h", &[]).unwrap_err();
        assert_eq!(err.label(), "bad_shape");
    }

    #[test]
    fn vllm_032_document_as_served() {
        // Captured from vLLM 0.32.0 (CPU build) started with endpoint `tcp://[::ffff:127.0.0.1]:18501`,
        // the spelling that makes it bind loopback only: the mapped address is the worker's IPv4 host.
        let body = include_bytes!("../fixtures/vllm-0.32-kv_event_sources.json");
        let feeds = parse_vllm_kv_event_sources(body, "127.0.0.1", &[]).unwrap();
        assert_eq!(feeds.len(), 1);
        assert_eq!(feeds[0].endpoint, "tcp://127.0.0.1:18501");
        assert_eq!(feeds[0].replay_endpoint.as_deref(), Some("tcp://127.0.0.1:18601"));
        assert_eq!((feeds[0].dp_rank, feeds[0].topic.as_str()), (0, ""));
        let err = parse_vllm_kv_event_sources(body, "10.0.0.9", &[]).unwrap_err();
        assert_eq!(err.label(), "foreign_host");
    }

    #[test]
    fn rank_bounds() {
        let entries: Vec<String> = (0..=MAX_DATA_PARALLEL)
            .map(|r| format!(r#"{{"data_parallel_rank": {r}, "endpoint": "tcp://*:{}"}}"#, 5000 + r))
            .collect();
        let body = format!("[{}]", entries.join(","));
        let err = |b: &[u8]| parse_vllm_kv_event_sources(b, "h", &[]).unwrap_err().label();
        assert_eq!(err(body.as_bytes()), "too_many_ranks");
        let body = format!("[{}]", entries[..MAX_DATA_PARALLEL as usize].join(","));
        assert_eq!(parse_vllm_kv_event_sources(body.as_bytes(), "h", &[]).unwrap().len(), 64);
        assert_eq!(err(br#"{"64": {"endpoint": "tcp://*:1"}}"#), "too_many_ranks");
        assert_eq!(err(br#"[{"data_parallel_rank": 4000000000, "endpoint": "tcp://*:1"}]"#), "too_many_ranks");
        let sglang = br#"{"kv_events": {"endpoint_host": "*", "endpoint_port_base": 1000, "dp_size": 65}}"#;
        assert_eq!(parse_sglang_server_info(sglang, "h", &[]).unwrap_err().label(), "too_many_ranks");
    }

    #[test]
    fn foreign_hosts_are_refused_unless_allowed() {
        let err =
            |b: &[u8], allowed: &[String]| parse_vllm_kv_event_sources(b, "10.0.0.7", allowed).unwrap_err().label();
        let body = br#"[{"endpoint": "tcp://169.254.169.254:80"}]"#;
        assert_eq!(err(body, &[]), "foreign_host");
        assert_eq!(parse_vllm_kv_event_sources(body, "10.0.0.7", &["169.254.169.254".into()]).unwrap().len(), 1);
        assert_eq!(err(br#"[{"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://evil:1"}]"#, &[]), "foreign_host");
        assert_eq!(err(br#"[{"endpoint": "ipc:///run/x.sock"}]"#, &[]), "foreign_host");
        let ipc = parse_vllm_kv_event_sources(br#"[{"endpoint": "ipc:///run/x.sock"}]"#, "localhost", &[]).unwrap();
        assert_eq!(ipc[0].endpoint, "ipc:///run/x.sock");
        let v6 = parse_vllm_kv_event_sources(br#"[{"endpoint": "tcp://[FD00::2]:5557"}]"#, "fd00::2", &[]).unwrap();
        assert_eq!(v6.len(), 1);
        let sglang = br#"{"kv_events": {"endpoint_host": "other", "endpoint_port_base": 5557}}"#;
        assert_eq!(parse_sglang_server_info(sglang, "worker", &[]).unwrap_err().label(), "foreign_host");
        assert!(parse_sglang_server_info(sglang, "worker", &["other".into()]).unwrap().is_some());
    }
}
