//! The bodies of disaggregated serving's legs (docs/disaggregated.md): the received body with a few
//! top-level members replaced, every other member's bytes as received. The object is read once into
//! its members (`RawValue`s borrowed from the body, so images and messages are never re-serialised),
//! the replaced members dropped and the leg's own appended.
//!
//! And the one thing a leg brings back that the router relays to another engine: the prefill's
//! `kv_transfer_params`, checked for size and shape first (a worker's answer is untrusted input: it
//! must not smuggle a megabyte, or anything vLLM would not write, into the decode engine's request).

use std::borrow::Cow;
use std::fmt;

use bytes::{BufMut, Bytes, BytesMut};
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

/// The largest `kv_transfer_params` relayed: vLLM's hold a block-id list per KV group (a 32k-token
/// prompt at block size 16 is 2 048 ids, ~12 KB of JSON) and a few scalars.
pub const MAX_KV_TRANSFER_PARAMS: usize = 64 * 1024;
/// The largest prefill answer read (one token, the usage, the params).
pub const MAX_PREFILL_ANSWER: usize = 256 * 1024;

/// What the prefill and encode legs must not carry from the client's request: sampling of more than
/// one token, streaming, and the client's own transfer parameters (never trusted).
const ONE_TOKEN_DROPPED: &[&str] =
    &["stream", "stream_options", "max_tokens", "max_completion_tokens", "min_tokens", "n", "kv_transfer_params"];

/// Why a leg's body could not be built, or a worker's transfer parameters were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LegError {
    #[error("the request body is not a JSON object")]
    NotAnObject,
    #[error("the prefill answer is not JSON with an object `kv_transfer_params`")]
    NoParams,
    #[error("the prefill's kv_transfer_params are {0} bytes (at most {MAX_KV_TRANSFER_PARAMS})")]
    ParamsTooLarge(usize),
    #[error("the prefill's kv_transfer_params.{0} is not what vLLM writes there")]
    ParamsShape(&'static str),
}

impl LegError {
    /// Stable snake_case label (the metric reason).
    pub fn label(&self) -> &'static str {
        match self {
            LegError::NotAnObject => "not_an_object",
            LegError::NoParams => "no_kv_transfer_params",
            LegError::ParamsTooLarge(_) => "kv_transfer_params_too_large",
            LegError::ParamsShape(_) => "kv_transfer_params_shape",
        }
    }
}

/// The prefill leg (vLLM NIXL, pull mode): one token, not streamed, the KV cache kept for decode.
pub fn prefill_body(body: &[u8]) -> Result<Bytes, LegError> {
    let members = Members::parse(body)?;
    let had_completion_cap = members.has("max_completion_tokens");
    let mut add: Vec<(&str, Cow<'_, str>)> = vec![
        ("kv_transfer_params", Cow::Borrowed(PREFILL_PARAMS)),
        ("max_tokens", Cow::Borrowed("1")),
        ("stream", Cow::Borrowed("false")),
        ("n", Cow::Borrowed("1")),
    ];
    if had_completion_cap {
        add.push(("max_completion_tokens", Cow::Borrowed("1")));
    }
    Ok(members.rewrite(ONE_TOKEN_DROPPED, &add))
}

/// What vLLM's proxies send the prefill engine: "compute, and keep the blocks for a remote decode".
const PREFILL_PARAMS: &str = r#"{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}"#;

/// The encode leg (vLLM E/PD): one token, not streamed (the encoder answers empty content; what
/// matters is the embeddings it stores).
pub fn encode_body(body: &[u8]) -> Result<Bytes, LegError> {
    let members = Members::parse(body)?;
    let add = [("max_tokens", Cow::Borrowed("1")), ("stream", Cow::Borrowed("false")), ("n", Cow::Borrowed("1"))];
    Ok(members.rewrite(ONE_TOKEN_DROPPED, &add))
}

/// The decode leg (vLLM NIXL): the client's request as sent, with the prefill's checked parameters.
pub fn decode_body(body: &[u8], params: &RawValue) -> Result<Bytes, LegError> {
    let members = Members::parse(body)?;
    Ok(members.rewrite(&["kv_transfer_params"], &[("kv_transfer_params", Cow::Borrowed(params.get()))]))
}

/// Either leg of SGLang P/D: the client's request with the prefill's bootstrap address and the
/// request's room (both legs get the same three).
pub fn sglang_body(body: &[u8], host: &str, port: u16, room: u64) -> Result<Bytes, LegError> {
    let members = Members::parse(body)?;
    let host = serde_json::to_string(host).expect("a string serialises");
    let add = [
        ("bootstrap_host", Cow::Owned(host)),
        ("bootstrap_port", Cow::Owned(port.to_string())),
        ("bootstrap_room", Cow::Owned(room.to_string())),
    ];
    Ok(members.rewrite(&["bootstrap_host", "bootstrap_port", "bootstrap_room", "kv_transfer_params"], &add))
}

/// A body made for a plain aggregated send without the client's transfer parameters (a P/D pool's
/// fallback: the decode worker computes the prompt itself).
pub fn without_params(body: &[u8]) -> Result<Bytes, LegError> {
    Ok(Members::parse(body)?
        .rewrite(&["kv_transfer_params", "bootstrap_host", "bootstrap_port", "bootstrap_room"], &[]))
}

/// The `kv_transfer_params` of a prefill answer, checked: a JSON object of at most
/// [`MAX_KV_TRANSFER_PARAMS`] bytes whose known members have the types vLLM writes (unknown members
/// of a later vLLM pass through, bounded by the size).
pub fn kv_transfer_params(answer: &[u8]) -> Result<Box<RawValue>, LegError> {
    #[derive(serde::Deserialize)]
    struct Answer<'a> {
        #[serde(borrow)]
        kv_transfer_params: Option<&'a RawValue>,
    }
    let answer: Answer<'_> = serde_json::from_slice(answer).map_err(|_| LegError::NoParams)?;
    let raw = answer.kv_transfer_params.ok_or(LegError::NoParams)?;
    if raw.get().len() > MAX_KV_TRANSFER_PARAMS {
        return Err(LegError::ParamsTooLarge(raw.get().len()));
    }
    let value: serde_json::Value = serde_json::from_str(raw.get()).map_err(|_| LegError::NoParams)?;
    check_params(&value)?;
    Ok(raw.to_owned())
}

/// Each member vLLM writes, with its type (`null` allowed where vLLM writes it).
fn check_params(v: &serde_json::Value) -> Result<(), LegError> {
    use serde_json::Value as V;
    let obj = v.as_object().ok_or(LegError::NoParams)?;
    for (key, value) in obj {
        let ok = match key.as_str() {
            "do_remote_prefill" | "do_remote_decode" => value.is_boolean(),
            "remote_engine_id" | "remote_request_id" | "transfer_mode" => value.is_string() || value.is_null(),
            "remote_host" => value.as_str().is_some_and(plausible_host) || value.is_null(),
            "remote_port" => value.as_u64().is_some_and(|p| p <= 65_535) || value.is_null(),
            "remote_block_ids" => block_ids(value) || value.is_null(),
            "tp_size" | "dcp_size" | "pp_size" | "remote_num_tokens" | "remote_prefill_cached_tokens" => {
                value.as_u64().is_some() || value.is_null()
            }
            "remote_blocks_expiry_time" => value.is_number() || value.is_null(),
            // A later vLLM's members pass through, bounded by the size.
            _ => true,
        };
        if !ok {
            return Err(LegError::ParamsShape(known_key(key)));
        }
    }
    match obj.get("do_remote_prefill") {
        Some(V::Bool(true)) => Ok(()),
        _ => Err(LegError::ParamsShape("do_remote_prefill")),
    }
}

/// `[[id, …], …]` (one list per KV-cache group) or a flat `[id, …]` (vLLM before groups).
fn block_ids(v: &serde_json::Value) -> bool {
    let Some(outer) = v.as_array() else { return false };
    let id = |x: &serde_json::Value| x.as_u64().is_some();
    outer.iter().all(|g| id(g) || g.as_array().is_some_and(|ids| ids.iter().all(id)))
}

/// A host name or IP literal as a side channel is configured: no scheme, path, spaces or controls.
fn plausible_host(h: &str) -> bool {
    !h.is_empty() && h.len() <= 253 && h.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.:[]_".contains(&b))
}

/// The member's name as a `'static` label for the error (unknown keys are not checked by type).
fn known_key(key: &str) -> &'static str {
    const KNOWN: &[&str] = &[
        "do_remote_prefill",
        "do_remote_decode",
        "remote_engine_id",
        "remote_request_id",
        "transfer_mode",
        "remote_host",
        "remote_port",
        "remote_block_ids",
        "tp_size",
        "dcp_size",
        "pp_size",
        "remote_num_tokens",
        "remote_prefill_cached_tokens",
        "remote_blocks_expiry_time",
    ];
    KNOWN.iter().find(|k| **k == key).copied().unwrap_or("unknown")
}

/// A JSON object's top-level members in order, each value the received bytes.
struct Members<'a> {
    members: Vec<(Cow<'a, str>, &'a RawValue)>,
}

impl<'a> Members<'a> {
    fn parse(body: &'a [u8]) -> Result<Members<'a>, LegError> {
        let mut de = serde_json::Deserializer::from_slice(body);
        let members = de.deserialize_map(MembersVisitor).map_err(|_| LegError::NotAnObject)?;
        de.end().map_err(|_| LegError::NotAnObject)?;
        Ok(Members { members })
    }

    fn has(&self, key: &str) -> bool {
        self.members.iter().any(|(k, _)| k == key)
    }

    /// The object without the members named in `drop`, with `add` appended (values as JSON text).
    fn rewrite(&self, drop: &[&str], add: &[(&str, Cow<'_, str>)]) -> Bytes {
        let kept = self.members.iter().filter(|(k, _)| !drop.contains(&k.as_ref()));
        let size: usize = self.members.iter().map(|(k, v)| k.len() + v.get().len() + 4).sum::<usize>()
            + add.iter().map(|(k, v)| k.len() + v.len() + 4).sum::<usize>();
        let mut out = BytesMut::with_capacity(size + 2);
        out.put_u8(b'{');
        let mut first = true;
        let mut member = |out: &mut BytesMut, key: &str, value: &str| {
            if !std::mem::take(&mut first) {
                out.put_u8(b',');
            }
            out.extend_from_slice(serde_json::to_string(key).expect("a string serialises").as_bytes());
            out.put_u8(b':');
            out.extend_from_slice(value.as_bytes());
        };
        for (k, v) in kept {
            member(&mut out, k, v.get());
        }
        for (k, v) in add {
            member(&mut out, k, v);
        }
        out.put_u8(b'}');
        out.freeze()
    }
}

struct MembersVisitor;

impl<'de> Visitor<'de> for MembersVisitor {
    type Value = Vec<(Cow<'de, str>, &'de RawValue)>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members: Vec<(Cow<'de, str>, &'de RawValue)> = Vec::new();
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            let value: &'de RawValue = map.next_value()?;
            // JSON parsers keep the last of duplicate members: so do we.
            members.retain(|(k, _)| *k != key);
            members.push((key, value));
        }
        Ok(members)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The refusal of an answer's parameters (a `RawValue` cannot be compared).
    fn refusal(answer: &[u8]) -> Option<LegError> {
        kv_transfer_params(answer).err()
    }

    fn json(b: &Bytes) -> serde_json::Value {
        serde_json::from_slice(b).expect("valid JSON")
    }

    #[test]
    fn prefill_leg_is_one_unstreamed_token_with_the_remote_decode_flag() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,
            "stream_options":{"include_usage":true},"max_tokens":50,"min_tokens":3,"n":2,
            "kv_transfer_params":{"do_remote_prefill":true,"remote_host":"10.0.0.1"}}"#;
        let leg = json(&prefill_body(body).unwrap());
        assert_eq!(leg["max_tokens"], 1);
        assert_eq!(leg["stream"], false);
        assert_eq!(leg["n"], 1);
        assert!(leg.get("stream_options").is_none() && leg.get("min_tokens").is_none());
        assert!(leg.get("max_completion_tokens").is_none(), "added only when the client capped it");
        assert_eq!(leg["kv_transfer_params"]["do_remote_decode"], true);
        assert_eq!(leg["kv_transfer_params"]["remote_host"], serde_json::Value::Null, "the client's params dropped");
        assert_eq!(leg["messages"][0]["content"], "hi");
        let capped = json(&prefill_body(br#"{"max_completion_tokens":9,"messages":[]}"#).unwrap());
        assert_eq!((capped["max_completion_tokens"].clone(), capped["max_tokens"].clone()), (1.into(), 1.into()));
    }

    #[test]
    fn members_keep_their_received_bytes() {
        // Odd spacing, escapes and number spellings inside values survive byte for byte.
        let messages = r#"[ {"role" : "user", "content": [{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"},"uuid":"x\u00e9"}] } ]"#;
        let body = format!(r#"{{"model":"m", "messages": {messages}, "temperature": 1.0e0, "stream": true}}"#);
        let leg = prefill_body(body.as_bytes()).unwrap();
        let text = std::str::from_utf8(&leg).unwrap();
        assert!(text.contains(&format!(r#""messages":{messages}"#)), "{text}");
        assert!(text.contains(r#""temperature":1.0e0"#), "{text}");
    }

    #[test]
    fn decode_leg_carries_the_prefills_params_and_the_clients_sampling() {
        let params = RawValue::from_string(r#"{"do_remote_prefill":true,"remote_block_ids":[[1,2]]}"#.into()).unwrap();
        let body = br#"{"model":"m","stream":true,"max_tokens":50,"kv_transfer_params":{"evil":1}}"#;
        let leg = json(&decode_body(body, &params).unwrap());
        assert_eq!((leg["stream"].clone(), leg["max_tokens"].clone()), (true.into(), 50.into()));
        assert_eq!(leg["kv_transfer_params"]["remote_block_ids"][0][1], 2);
        assert!(leg["kv_transfer_params"].get("evil").is_none());
    }

    #[test]
    fn sglang_legs_name_the_bootstrap_room() {
        let leg = json(&sglang_body(br#"{"model":"m","bootstrap_room":1}"#, "127.0.0.1", 8998, 42).unwrap());
        assert_eq!(leg["bootstrap_host"], "127.0.0.1");
        assert_eq!((leg["bootstrap_port"].clone(), leg["bootstrap_room"].clone()), (8998.into(), 42.into()));
    }

    #[test]
    fn non_objects_are_refused() {
        for body in [&b"[1]"[..], b"{", b"{} x", b"\"s\""] {
            assert_eq!(prefill_body(body), Err(LegError::NotAnObject), "{:?}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn params_from_vllm_pass_and_odd_ones_are_refused() {
        let vllm = r#"{"id":"c","kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,
            "remote_block_ids":[[50,51,52]],"remote_engine_id":"e1","remote_request_id":"chatcmpl-1",
            "remote_host":"127.0.0.1","remote_port":5601,"tp_size":1,"dcp_size":1,"pp_size":1,
            "remote_num_tokens":140,"remote_blocks_expiry_time":null,"transfer_mode":"pull",
            "remote_prefill_cached_tokens":0}}"#;
        let raw = kv_transfer_params(vllm.as_bytes()).unwrap();
        assert!(raw.get().contains("\"remote_port\":5601"));
        let bad = |params: &str| refusal(format!(r#"{{"kv_transfer_params":{params}}}"#).as_bytes());
        assert_eq!(bad(r#"{"do_remote_prefill":true,"remote_port":"x"}"#), Some(LegError::ParamsShape("remote_port")));
        assert_eq!(
            bad(r#"{"do_remote_prefill":true,"remote_host":"http://a/b c"}"#),
            Some(LegError::ParamsShape("remote_host"))
        );
        assert_eq!(bad(r#"{"do_remote_prefill":false}"#), Some(LegError::ParamsShape("do_remote_prefill")));
        assert_eq!(bad("[1]"), Some(LegError::NoParams));
        assert_eq!(refusal(b"{}"), Some(LegError::NoParams));
        let big = format!(r#"{{"do_remote_prefill":true,"remote_block_ids":[[{}]]}}"#, vec!["1"; 40_000].join(","));
        assert!(matches!(bad(&big), Some(LegError::ParamsTooLarge(_))));
    }
}
