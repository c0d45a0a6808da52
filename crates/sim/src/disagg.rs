//! Disaggregated serving as the simulated engine plays it (docs/disaggregated.md): which leg a request
//! is, given the sim's `--role` and the request's top-level fields ([`leg`]); the `kv_transfer_params`
//! a vLLM 0.32 prefill engine with the NIXL connector answers ([`Handoff`]); and the
//! `ec_transfer_params` of an E/PD encoder ([`ec_transfer_params`]).
//!
//! A role only changes what a request carrying its leg's fields does: without them every role but
//! `encode` serves the request whole, as a vLLM engine with a KV connector does.

use std::net::{IpAddr, Ipv4Addr};

use serde_json::{json, Map, Value};

use crate::error::SimError;
use crate::options::Role;
use crate::prompt::SimImage;

/// vLLM's NIXL side-channel port (`VLLM_NIXL_SIDE_CHANNEL_PORT`): what a prefill engine reports as
/// `remote_port`. The sim opens nothing there; a decode sim never connects to it.
pub(crate) const NIXL_SIDE_CHANNEL_PORT: u16 = 5600;
/// Qwen-VL's spatial merge: 2×2 patches per encoder token (the `image_grid_thw` metadata's unit).
const SPATIAL_MERGE: u32 = 2;

/// What a request asks of this engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Leg {
    /// A whole request (aggregated serving).
    Whole,
    /// vLLM prefill (`do_remote_decode`): prefilled, answered whole with one token and the handoff.
    VllmPrefill,
    /// vLLM decode (`do_remote_prefill`): the prompt's uncached tokens pulled, not computed.
    VllmDecode,
    /// SGLang prefill: served as asked; its room is marked done once prefilled.
    SglangPrefill { room: u64 },
    /// SGLang decode: waits for the prefill's room, pulls the uncached tokens, decodes.
    SglangDecode(Bootstrap),
    /// E/PD encoder: the images encoded, nothing prefilled.
    Encode,
}

impl Leg {
    /// The leg's prompt KV comes from another engine rather than from this one's compute.
    pub(crate) fn pulls_kv(&self) -> bool {
        matches!(self, Self::VllmDecode | Self::SglangDecode(_))
    }
}

/// Where an SGLang decode leg finds its prefill's bootstrap server, and which room is its request's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Bootstrap {
    /// Always a loopback address ([`leg`] refuses others).
    pub ip: IpAddr,
    pub port: u16,
    pub room: u64,
}

/// The leg `body` asks of an engine in `role`, refusing malformed transfer fields with 400.
pub(crate) fn leg(role: Role, body: &Value) -> Result<Leg, SimError> {
    let kv = kv_transfer_params(body)?;
    let flag = |name: &'static str| kv.map_or(Ok(false), |kv| flag(kv, name));
    let (remote_decode, remote_prefill) = (flag("do_remote_decode")?, flag("do_remote_prefill")?);
    if remote_decode && remote_prefill {
        return Err(bad("`do_remote_decode` and `do_remote_prefill` cannot both be true"));
    }
    match role {
        Role::Both => Ok(Leg::Whole),
        Role::Encode => Ok(Leg::Encode),
        Role::Prefill if remote_decode => Ok(Leg::VllmPrefill),
        Role::Decode if remote_prefill => {
            check_remote_prefill(kv.unwrap_or(&Map::new()))?;
            Ok(Leg::VllmDecode)
        }
        Role::Prefill => Ok(room(body)?.map_or(Leg::Whole, |room| Leg::SglangPrefill { room })),
        Role::Decode => Ok(bootstrap(body)?.map_or(Leg::Whole, Leg::SglangDecode)),
    }
}

fn bad(reason: &str) -> SimError {
    SimError::BadRequest { message: format!("kv_transfer_params: {reason}"), param: Some("kv_transfer_params") }
}

/// The request's `kv_transfer_params`: a JSON object or absent (pydantic's `dict | None`).
fn kv_transfer_params(body: &Value) -> Result<Option<&Map<String, Value>>, SimError> {
    match body.get("kv_transfer_params") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(kv)) => Ok(Some(kv)),
        Some(_) => Err(SimError::BadRequest {
            message: "Input should be a valid dictionary".to_owned(),
            param: Some("kv_transfer_params"),
        }),
    }
}

fn flag(kv: &Map<String, Value>, name: &'static str) -> Result<bool, SimError> {
    match kv.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(bad(&format!("`{name}` must be a boolean"))),
    }
}

/// What vLLM's NIXL connector reads of a decode leg's parameters, typed as the prefill writes them.
fn check_remote_prefill(kv: &Map<String, Value>) -> Result<(), SimError> {
    let string = |name: &str| kv.get(name).is_some_and(Value::is_string);
    for name in ["remote_engine_id", "remote_host"] {
        if !string(name) {
            return Err(bad(&format!("`{name}` must be a string when `do_remote_prefill` is true")));
        }
    }
    if u16::try_from(kv.get("remote_port").and_then(Value::as_u64).unwrap_or(u64::MAX)).is_err() {
        return Err(bad("`remote_port` must be a port number when `do_remote_prefill` is true"));
    }
    if !kv.get("remote_block_ids").is_some_and(block_ids) {
        return Err(bad("`remote_block_ids` must be a list of block ids (or of lists, one per KV cache group)"));
    }
    for name in ["remote_num_tokens", "remote_prefill_cached_tokens"] {
        if kv.get(name).is_some_and(|v| !v.is_null() && !v.is_u64()) {
            return Err(bad(&format!("`{name}` must be a non-negative integer")));
        }
    }
    if kv.get("remote_request_id").is_some_and(|v| !v.is_null() && !v.is_string()) {
        return Err(bad("`remote_request_id` must be a string"));
    }
    Ok(())
}

/// `[1, 2, …]` or `[[1, 2], [3]]`: vLLM's block ids, flat or per KV cache group.
fn block_ids(v: &Value) -> bool {
    let Some(ids) = v.as_array() else { return false };
    let flat = |ids: &[Value]| ids.iter().all(Value::is_u64);
    flat(ids) || ids.iter().all(|group| group.as_array().is_some_and(|g| flat(g)))
}

/// SGLang's `bootstrap_room`, a u64, when the request carries one.
fn room(body: &Value) -> Result<Option<u64>, SimError> {
    match body.get("bootstrap_room") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| field("bootstrap_room", "must be a non-negative 64-bit integer")),
    }
}

fn field(field: &'static str, reason: &str) -> SimError {
    SimError::InvalidField { field, reason: reason.to_owned() }
}

/// SGLang's decode-leg fields, all three or none; a host off this machine is refused.
fn bootstrap(body: &Value) -> Result<Option<Bootstrap>, SimError> {
    let Some(room) = room(body)? else { return Ok(None) };
    let host = body
        .get("bootstrap_host")
        .and_then(Value::as_str)
        .ok_or_else(|| field("bootstrap_host", "must be a string beside `bootstrap_room`"))?;
    let port = body
        .get("bootstrap_port")
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0)
        .ok_or_else(|| field("bootstrap_port", "must be a port number beside `bootstrap_room`"))?;
    let ip = loopback(host).ok_or_else(|| SimError::BootstrapHostRefused { host: host.to_owned() })?;
    Ok(Some(Bootstrap { ip, port, room }))
}

/// `host` as a loopback address, or `None` when it names anything else. No name is resolved but
/// `localhost`, so no request can make the sim look anything up or reach another machine.
pub(crate) fn loopback(host: &str) -> Option<IpAddr> {
    if host.eq_ignore_ascii_case("localhost") {
        return Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    bare.parse::<IpAddr>().ok().filter(IpAddr::is_loopback)
}

/// What a vLLM prefill engine hands its decode engine (NIXL, pull mode).
pub(crate) struct Handoff<'a> {
    pub engine_id: &'a str,
    /// The prefill's response id (vLLM's `remote_request_id`).
    pub request_id: &'a str,
    /// The prefill's block ids of the prompt, one KV cache group.
    pub block_ids: Vec<u64>,
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
}

impl Handoff<'_> {
    /// vLLM 0.32's `kv_transfer_params` of a finished prefill, field for field.
    pub(crate) fn json(&self) -> Value {
        json!({
            "do_remote_prefill": true,
            "do_remote_decode": false,
            "remote_block_ids": [self.block_ids],
            "remote_engine_id": self.engine_id,
            "remote_request_id": self.request_id,
            "remote_host": "127.0.0.1",
            "remote_port": NIXL_SIDE_CHANNEL_PORT,
            "tp_size": 1,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": self.prompt_tokens,
            "remote_blocks_expiry_time": null,
            "transfer_mode": "pull",
            "remote_prefill_cached_tokens": self.cached_tokens,
        })
    }
}

/// An E/PD encoder's `ec_transfer_params`: one entry per image, keyed by its engine name (mm_hash).
pub(crate) fn ec_transfer_params(images: &[SimImage]) -> Value {
    let entries = images.iter().map(|image| {
        let [t, h, w] = grid_thw(image.feature_tokens, image.width, image.height);
        let entry = json!({"item_indices": [0], "metadata": {"image_grid_thw": [t, h, w]}});
        (image.identifier.clone(), entry)
    });
    Value::Object(entries.collect())
}

/// Qwen-VL's `image_grid_thw` for an image of `feature_tokens` encoder tokens: the patch grid (both
/// sides multiples of the 2×2 merge, `h·w = 4·tokens`) whose shape is closest to the image's. The sim
/// keeps no grid; this is metadata for whoever reads it, exact when the resize kept the aspect.
pub(crate) fn grid_thw(feature_tokens: u32, width: u32, height: u32) -> [u32; 3] {
    let tokens = feature_tokens.max(1);
    let aspect = f64::from(height.max(1)) / f64::from(width.max(1));
    let distance = |rows: u32| (f64::from(rows) / f64::from(tokens / rows) / aspect).ln().abs();
    let rows = (1..=tokens)
        .take_while(|r| u64::from(*r) * u64::from(*r) <= u64::from(tokens) * 64)
        .filter(|r| tokens.is_multiple_of(*r))
        .min_by(|a, b| distance(*a).total_cmp(&distance(*b)))
        .unwrap_or(1);
    [1, rows * SPATIAL_MERGE, tokens / rows * SPATIAL_MERGE]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_params() -> Value {
        json!({"do_remote_prefill": true, "do_remote_decode": false, "remote_engine_id": "e",
               "remote_block_ids": [[1, 2]], "remote_host": "127.0.0.1", "remote_port": 5600,
               "remote_request_id": "r", "remote_num_tokens": 40})
    }

    #[test]
    fn legs_follow_role_and_fields() {
        let prefill = json!({"kv_transfer_params": {"do_remote_decode": true, "remote_engine_id": null}});
        assert_eq!(leg(Role::Prefill, &prefill).expect("prefill"), Leg::VllmPrefill);
        assert_eq!(leg(Role::Both, &prefill).expect("both ignores it"), Leg::Whole);
        assert_eq!(leg(Role::Decode, &prefill).expect("decode: no remote prefill"), Leg::Whole);
        let decode = json!({"kv_transfer_params": decode_params()});
        assert_eq!(leg(Role::Decode, &decode).expect("decode"), Leg::VllmDecode);
        assert_eq!(leg(Role::Prefill, &json!({})).expect("plain"), Leg::Whole);
        assert_eq!(leg(Role::Encode, &json!({})).expect("encode"), Leg::Encode);
        let sglang = json!({"bootstrap_host": "127.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 7});
        assert_eq!(leg(Role::Prefill, &sglang).expect("sglang prefill"), Leg::SglangPrefill { room: 7 });
        let want = Bootstrap { ip: IpAddr::V4(Ipv4Addr::LOCALHOST), port: 8998, room: 7 };
        assert_eq!(leg(Role::Decode, &sglang).expect("sglang decode"), Leg::SglangDecode(want));
        assert!(Leg::VllmDecode.pulls_kv() && !Leg::VllmPrefill.pulls_kv());
    }

    #[test]
    fn malformed_decode_params_are_refused_naming_the_field() {
        let cases = [
            ("remote_engine_id", json!(5)),
            ("remote_host", Value::Null),
            ("remote_port", json!(70_000)),
            ("remote_block_ids", json!([["a"]])),
            ("remote_num_tokens", json!(-1)),
            ("do_remote_decode", json!(true)),
        ];
        for (name, value) in cases {
            let mut kv = decode_params();
            kv[name] = value;
            let err = leg(Role::Decode, &json!({"kv_transfer_params": kv})).expect_err(name);
            assert_eq!(err.label(), "bad_request", "{name}");
            assert!(err.to_string().contains("kv_transfer_params"), "{err}");
        }
        let err = leg(Role::Decode, &json!({"kv_transfer_params": [1]})).expect_err("a list");
        assert_eq!(err.to_string(), "Input should be a valid dictionary");
        let err = leg(Role::Prefill, &json!({"kv_transfer_params": {"do_remote_decode": "yes"}})).expect_err("string");
        assert!(err.to_string().contains("do_remote_decode"), "{err}");
        assert!(block_ids(&json!([1, 2])) && block_ids(&json!([[1], []])) && !block_ids(&json!(3)));
    }

    #[test]
    fn bootstrap_hosts_are_loopback_only() {
        for host in ["127.0.0.1", "127.8.9.1", "::1", "[::1]", "localhost", "LOCALHOST"] {
            assert!(loopback(host).is_some(), "{host}");
        }
        for host in ["10.0.0.1", "0.0.0.0", "example.com", "192.168.1.1", "", "::"] {
            assert!(loopback(host).is_none(), "{host}");
        }
        let far = json!({"bootstrap_host": "10.1.2.3", "bootstrap_port": 8998, "bootstrap_room": 1});
        assert_eq!(leg(Role::Decode, &far).expect_err("refused").label(), "bootstrap_host_refused");
        let no_port = json!({"bootstrap_host": "127.0.0.1", "bootstrap_room": 1});
        assert_eq!(leg(Role::Decode, &no_port).expect_err("no port").label(), "invalid_field");
        let negative = json!({"bootstrap_room": -1});
        assert_eq!(leg(Role::Prefill, &negative).expect_err("negative").label(), "invalid_field");
    }

    #[test]
    fn handoff_has_vllm_fields() {
        let h =
            Handoff { engine_id: "e", request_id: "r", block_ids: vec![3, 4], prompt_tokens: 20, cached_tokens: 16 };
        let v = h.json();
        let keys: Vec<&str> = v.as_object().expect("object").keys().map(String::as_str).collect();
        assert_eq!(keys.len(), 14, "{keys:?}");
        assert_eq!(v["remote_block_ids"], json!([[3, 4]]));
        assert_eq!((v["remote_num_tokens"].as_u64(), v["remote_prefill_cached_tokens"].as_u64()), (Some(20), Some(16)));
        assert_eq!((v["transfer_mode"].as_str(), v["remote_blocks_expiry_time"].is_null()), (Some("pull"), true));
    }

    #[test]
    fn grid_matches_tokens_and_shape() {
        // 300 encoder tokens of a 640×480 image: 1200 patches, the grid wider than tall.
        let [t, h, w] = grid_thw(300, 640, 480);
        assert_eq!((t, h * w), (1, 1200));
        assert!(w > h, "landscape: {h}x{w}");
        assert_eq!(grid_thw(256, 512, 512), [1, 32, 32]);
        assert_eq!(grid_thw(7, 10, 1000), [1, 14, 2], "tall image: a tall grid");
        let params = ec_transfer_params(&[SimImage {
            identifier: "u1".into(),
            feature_tokens: 64,
            width: 256,
            height: 256,
            ..SimImage::default()
        }]);
        assert_eq!(params, json!({"u1": {"item_indices": [0], "metadata": {"image_grid_thw": [1, 16, 16]}}}));
    }
}
