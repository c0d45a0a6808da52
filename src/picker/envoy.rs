//! The endpoint-picker protocol's messages (gateway-api-inference-extension, proposal 004) over Envoy's
//! ext_proc types: what is read from a `ProcessingRequest` and how each answer is built. Pure
//! functions, no state.

use std::collections::HashMap;

use envoy_types::pb::envoy::config::core::v3::{HeaderMap as EnvoyHeaders, HeaderValue, HeaderValueOption, Metadata};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, ImmediateResponse,
    ProcessingResponse, TrailersResponse,
};
use envoy_types::pb::google::protobuf::{value, Struct, Value};
use tonic::codegen::http::{HeaderMap, HeaderName, HeaderValue as HttpValue};

/// The header (and `envoy.lb` metadata key) naming the picked endpoints, `ip:port[,ip:port…]`.
pub const DESTINATION: &str = "x-gateway-destination-endpoint";
/// The metadata key (or, for a gateway that sets it as a response header, the header) naming the
/// endpoint that served.
pub const SERVED: &str = "x-gateway-destination-endpoint-served";
/// The metadata namespace of both.
pub const NAMESPACE: &str = "envoy.lb";

/// A request or response head as Envoy sends it: pseudo-headers (`:method`, `:path`, `:status`) apart.
#[derive(Debug, Default)]
pub struct Head {
    pub pseudo: HashMap<String, String>,
    pub headers: HeaderMap,
}

/// Reads Envoy's header list; a header that is not valid HTTP is left out (Envoy sends none such).
pub fn head(map: Option<&EnvoyHeaders>) -> Head {
    let mut out = Head::default();
    for h in map.map_or(&[][..], |m| &m.headers[..]) {
        let value = if h.raw_value.is_empty() { h.value.as_bytes() } else { &h.raw_value[..] };
        if let Some(p) = h.key.strip_prefix(':') {
            out.pseudo.insert(p.to_owned(), String::from_utf8_lossy(value).into_owned());
        } else if let (Ok(k), Ok(v)) = (HeaderName::from_bytes(h.key.as_bytes()), HttpValue::from_bytes(value)) {
            out.headers.append(k, v);
        }
    }
    out
}

/// `envoy.lb`'s `x-gateway-destination-endpoint-served`, when the gateway forwarded it.
pub fn served_in(metadata: Option<&Metadata>) -> Option<String> {
    let ns = metadata?.filter_metadata.get(NAMESPACE)?;
    match ns.fields.get(SERVED)?.kind.as_ref()? {
        value::Kind::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

/// One header to set, overwriting any of that name.
fn set(key: &str, value: &str) -> HeaderValueOption {
    let header = HeaderValue { key: key.to_owned(), raw_value: value.as_bytes().to_vec(), ..Default::default() };
    // `append_action` 2: OVERWRITE_IF_EXISTS_OR_ADD (the default, 0, appends).
    HeaderValueOption { header: Some(header), append_action: 2, ..Default::default() }
}

/// The answer to a request body: the endpoints in the header and in `envoy.lb` (the same value, as
/// the protocol asks), and the body replaced when the router changed it (`content-length` with it).
pub fn picked(endpoints: &str, body: Option<Vec<u8>>) -> ProcessingResponse {
    let mut headers = vec![set(DESTINATION, endpoints)];
    let body_mutation = body.map(|b| {
        headers.push(set("content-length", &b.len().to_string()));
        BodyMutation { mutation: Some(body_mutation::Mutation::Body(b)) }
    });
    let common = CommonResponse {
        header_mutation: Some(HeaderMutation { set_headers: headers, ..Default::default() }),
        body_mutation,
        ..Default::default()
    };
    ProcessingResponse {
        response: Some(Response::RequestBody(BodyResponse { response: Some(common) })),
        dynamic_metadata: Some(lb_metadata(endpoints)),
        ..Default::default()
    }
}

/// `{"envoy.lb": {"x-gateway-destination-endpoint": endpoints}}`.
fn lb_metadata(endpoints: &str) -> Struct {
    let inner = Struct { fields: HashMap::from([(DESTINATION.to_owned(), string(endpoints))]) };
    let outer = Value { kind: Some(value::Kind::StructValue(inner)) };
    Struct { fields: HashMap::from([(NAMESPACE.to_owned(), outer)]) }
}

fn string(s: &str) -> Value {
    Value { kind: Some(value::Kind::StringValue(s.to_owned())) }
}

/// The router answers the client itself (503 no endpoint, 429 shed, 4xx a refused request): an
/// OpenAI-shaped JSON body, `details` its code.
pub fn immediate(status: u16, body: Vec<u8>, code: &str, retry_after: Option<u64>) -> ProcessingResponse {
    let mut headers = vec![set("content-type", "application/json")];
    if let Some(secs) = retry_after {
        headers.push(set("retry-after", &secs.to_string()));
    }
    let answer = ImmediateResponse {
        status: Some(HttpStatus { code: i32::from(status) }),
        headers: Some(HeaderMutation { set_headers: headers, ..Default::default() }),
        body,
        details: format!("mmrouter_{code}"),
        ..Default::default()
    };
    ProcessingResponse { response: Some(Response::ImmediateResponse(answer)), ..Default::default() }
}

/// Continue with the request head unchanged (the body decides).
pub fn request_headers() -> ProcessingResponse {
    ProcessingResponse { response: Some(Response::RequestHeaders(HeadersResponse::default())), ..Default::default() }
}

/// Continue with the response head, adding `x-mmrouter-route` / `x-mmrouter-worker` as the proxy does.
pub fn response_headers(set_headers: &[(&str, &str)]) -> ProcessingResponse {
    let set_headers = set_headers.iter().map(|(k, v)| set(k, v)).collect();
    let common = CommonResponse {
        header_mutation: Some(HeaderMutation { set_headers, ..Default::default() }),
        ..Default::default()
    };
    let answer = HeadersResponse { response: Some(common) };
    ProcessingResponse { response: Some(Response::ResponseHeaders(answer)), ..Default::default() }
}

/// Continue with a response body chunk unchanged.
pub fn response_body() -> ProcessingResponse {
    ProcessingResponse { response: Some(Response::ResponseBody(BodyResponse::default())), ..Default::default() }
}

/// Continue with trailers unchanged.
pub fn trailers(response: bool) -> ProcessingResponse {
    let t = TrailersResponse::default();
    let response = if response { Response::ResponseTrailers(t) } else { Response::RequestTrailers(t) };
    ProcessingResponse { response: Some(response), ..Default::default() }
}

/// A worker's base URL as the protocol names an endpoint: `host:port` (an IP, for an
/// original-destination cluster; IPv6 in brackets), the scheme's port when none is written.
pub fn endpoint_of(url: &str) -> Option<String> {
    let u = url::Url::parse(url).ok()?;
    let port = u.port_or_known_default()?;
    match u.host()? {
        url::Host::Ipv6(ip) => Some(format!("[{ip}]:{port}")),
        host => Some(format!("{host}:{port}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_from_worker_urls() {
        assert_eq!(endpoint_of("http://10.0.0.7:8000").as_deref(), Some("10.0.0.7:8000"));
        assert_eq!(endpoint_of("http://10.0.0.7").as_deref(), Some("10.0.0.7:80"));
        assert_eq!(endpoint_of("https://[::1]:9000/").as_deref(), Some("[::1]:9000"));
        assert_eq!(endpoint_of("not a url"), None);
    }

    #[test]
    fn header_and_metadata_carry_the_same_endpoints() {
        let r = picked("10.0.0.1:8000,10.0.0.2:8000", Some(b"{}".to_vec()));
        let Some(Response::RequestBody(b)) = &r.response else { panic!("a request-body answer") };
        let common = b.response.as_ref().unwrap();
        let set = &common.header_mutation.as_ref().unwrap().set_headers;
        let dest = set.iter().find(|h| h.header.as_ref().unwrap().key == DESTINATION).unwrap();
        assert_eq!(dest.header.as_ref().unwrap().raw_value, b"10.0.0.1:8000,10.0.0.2:8000");
        let len = set.iter().find(|h| h.header.as_ref().unwrap().key == "content-length").unwrap();
        assert_eq!(len.header.as_ref().unwrap().raw_value, b"2");
        let md = r.dynamic_metadata.as_ref().unwrap();
        let Some(value::Kind::StructValue(lb)) = &md.fields[NAMESPACE].kind else { panic!("envoy.lb") };
        assert_eq!(lb.fields[DESTINATION].kind, Some(value::Kind::StringValue("10.0.0.1:8000,10.0.0.2:8000".into())));
        // No body change: no body mutation, no content-length.
        let r = picked("10.0.0.1:8000", None);
        let Some(Response::RequestBody(b)) = &r.response else { panic!() };
        assert!(b.response.as_ref().unwrap().body_mutation.is_none());
        assert_eq!(b.response.as_ref().unwrap().header_mutation.as_ref().unwrap().set_headers.len(), 1);
    }

    #[test]
    fn heads_and_served_metadata_are_read() {
        let h =
            |k: &str, v: &str| HeaderValue { key: k.into(), raw_value: v.as_bytes().to_vec(), ..Default::default() };
        let map = EnvoyHeaders { headers: vec![h(":path", "/v1/chat/completions"), h("x-a", "1"), h("bad name", "x")] };
        let head = head(Some(&map));
        assert_eq!(head.pseudo["path"], "/v1/chat/completions");
        assert_eq!(head.headers.len(), 1);
        let lb = Struct { fields: HashMap::from([(SERVED.to_owned(), string("127.0.0.1:9"))]) };
        let md = Metadata { filter_metadata: HashMap::from([(NAMESPACE.to_owned(), lb)]), ..Default::default() };
        assert_eq!(served_in(Some(&md)).as_deref(), Some("127.0.0.1:9"));
        assert_eq!(served_in(None), None);
    }

    #[test]
    fn immediate_answers_carry_status_and_retry_after() {
        let r = immediate(429, b"{}".to_vec(), "shed", Some(1));
        let Some(Response::ImmediateResponse(i)) = &r.response else { panic!() };
        assert_eq!(i.status.as_ref().unwrap().code, 429);
        assert_eq!(i.headers.as_ref().unwrap().set_headers.len(), 2);
    }
}
