//! OpenTelemetry traces (docs/tracing.md): an OTLP/HTTP collector on 127.0.0.1 that decodes what it
//! receives with the official protos (`opentelemetry-proto`, prost), and the `traceparent` each
//! simulated worker received (echoed by the sim as `x-sim-traceparent`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

use crate::harness::*;

/// Spans received, with the `service.name` each came under.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<(String, Span)>>>,
}

impl Collector {
    /// A collector on an ephemeral loopback port: its base URL.
    async fn start(&self) -> String {
        let spans = self.spans.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |headers: HeaderMap, body: Bytes| {
                let spans = spans.clone();
                async move {
                    assert_eq!(headers["content-type"], "application/x-protobuf");
                    assert_eq!(headers["authorization"], "Bearer collector-key", "the configured header");
                    let req = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf export");
                    let mut got = spans.lock().unwrap();
                    for rs in req.resource_spans {
                        let service = rs.resource.as_ref().map(|r| string_attr(&r.attributes, "service.name"));
                        for ss in rs.scope_spans {
                            for s in ss.spans {
                                got.push((service.clone().flatten().unwrap_or_default(), s));
                            }
                        }
                    }
                    StatusCode::OK
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}")
    }

    /// The spans of `trace_id`, once its server span has arrived (within 10 s).
    async fn trace(&self, trace_id: &[u8]) -> Vec<Span> {
        for _ in 0..200 {
            let got: Vec<Span> = self
                .spans
                .lock()
                .unwrap()
                .iter()
                .filter(|(_, s)| s.trace_id == trace_id)
                .map(|(_, s)| s.clone())
                .collect();
            if got.iter().any(|s| s.kind == SpanKind::Server as i32) {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("no server span of trace {} arrived", hex(trace_id));
    }

    fn count(&self, trace_id: &[u8]) -> usize {
        self.spans.lock().unwrap().iter().filter(|(_, s)| s.trace_id == trace_id).count()
    }
}

fn string_attr(attrs: &[opentelemetry_proto::tonic::common::v1::KeyValue], key: &str) -> Option<String> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(i) => Some(i.to_string()),
        _ => None,
    })
}

fn attr(s: &Span, key: &str) -> Option<String> {
    string_attr(&s.attributes, key)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// (trace id, parent span id, flags) of a `traceparent`.
fn parts(tp: &str) -> (Vec<u8>, Vec<u8>, String) {
    let p: Vec<&str> = tp.split('-').collect();
    assert_eq!((p.len(), p[0]), (4, "00"), "{tp}");
    (unhex(p[1]), unhex(p[2]), p[3].to_owned())
}

fn one<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    let found: Vec<&Span> = spans.iter().filter(|s| s.name == name).collect();
    assert_eq!(found.len(), 1, "one {name} span in {:?}", spans.iter().map(|s| &s.name).collect::<Vec<_>>());
    found[0]
}

/// A chat with `traceparent` (if any): the answer's headers.
async fn traced_chat(url: &str, body: Vec<u8>, traceparent: Option<&str>) -> reqwest::Response {
    let mut req = client().post(format!("{url}/v1/chat/completions")).header("content-type", "application/json");
    if let Some(tp) = traceparent {
        req = req.header("traceparent", tp).header("tracestate", "vendor=opaque");
    }
    let r = req.body(body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    r
}

fn tracing_toml(endpoint: &str, ratio: f64) -> String {
    format!(
        "[media]\nmax_pixels = 1000000\n[tracing]\notlp_endpoint = {endpoint:?}\nsample_ratio = {ratio}\n\
         service_name = \"router-under-test\"\nheaders = {{ authorization = \"Bearer collector-key\" }}\n"
    )
}

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// A chat with an image under a client's sampled context: the server span is the client span's child,
/// plan (intake, account, render), select, the upstream attempt and relay are its children with the
/// route, worker and predicted tokens; the worker was given the attempt span as its parent. A
/// fallback starts a trace of its own and carries its reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chats_spans_nest_under_the_client_and_the_worker_gets_the_attempt_span() {
    let collector = Collector::default();
    let endpoint = collector.start().await;
    let c = cluster_with(sims(1, fast).await, &tracing_toml(&endpoint, 1.0)).await;
    let small = png_data_url(64, 64, 10);
    let body = chat_body(&[small], "Describe it.", false);
    let tp = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let r = traced_chat(&c.url, body.clone(), Some(&tp)).await;
    assert_eq!(header(&r, "x-mmrouter-route"), "exact");
    let (trace, parent, flags) = parts(header(&r, "x-sim-traceparent"));
    assert_eq!((hex(&trace).as_str(), flags.as_str()), (CLIENT_TRACE, "01"), "the client's trace, sampled");
    assert_ne!(hex(&parent), CLIENT_SPAN, "the worker's parent is our attempt, not the client");

    let spans = collector.trace(&trace).await;
    let server = one(&spans, "POST /v1/chat/completions");
    assert_eq!((server.kind, hex(&server.parent_span_id)), (SpanKind::Server as i32, CLIENT_SPAN.to_owned()));
    assert_eq!(server.trace_state, "vendor=opaque");
    let worker = c.sims[0].name().to_owned();
    assert_eq!(attr(server, "mmrouter.route").as_deref(), Some("exact"));
    assert_eq!(attr(server, "mmrouter.worker"), Some(worker.clone()));
    assert_eq!(attr(server, "http.response.status_code").as_deref(), Some("200"));
    let predicted = attr(server, "mmrouter.predicted_cached_tokens").expect("predicted cached tokens");
    assert!(attr(server, "gen_ai.usage.input_tokens").is_some(), "the worker's usage");
    let cached = attr(server, "gen_ai.usage.cache_read.input_tokens").expect("the worker's cached tokens");
    assert_eq!((predicted.as_str(), cached.as_str()), ("0", "0"), "a new prompt on a new worker");
    assert!(attr(server, "mmrouter.prompt_tokens").unwrap().parse::<u32>().unwrap() > 64, "an image's tokens");
    assert_eq!(attr(server, "mmrouter.fallback_reason"), None);
    let children = |p: &Span| -> Vec<String> {
        let mut v: Vec<String> =
            spans.iter().filter(|s| s.parent_span_id == p.span_id).map(|s| s.name.clone()).collect();
        v.sort();
        v
    };
    assert_eq!(children(server), ["plan", "relay", "select", "upstream"]);
    let plan = one(&spans, "plan");
    assert_eq!(children(plan), ["account", "intake", "render"]);
    let upstream = one(&spans, "upstream");
    assert_eq!(upstream.span_id, parent, "the worker's traceparent names the attempt span");
    assert_eq!(upstream.kind, SpanKind::Client as i32);
    assert_eq!(attr(upstream, "mmrouter.worker"), Some(worker));
    assert_eq!(attr(upstream, "http.response.status_code").as_deref(), Some("200"));
    let (select, relay) = (one(&spans, "select"), one(&spans, "relay"));
    // In time order, inside the server span.
    assert!(server.start_time_unix_nano <= plan.start_time_unix_nano);
    assert!(plan.end_time_unix_nano <= select.end_time_unix_nano);
    assert_eq!(select.end_time_unix_nano, upstream.start_time_unix_nano);
    assert!(upstream.end_time_unix_nano <= relay.start_time_unix_nano);
    assert!(relay.end_time_unix_nano <= server.end_time_unix_nano);
    let services = collector.spans.lock().unwrap().iter().map(|(s, _)| s.clone()).collect::<Vec<_>>();
    assert!(services.iter().all(|s| s == "router-under-test"));

    // The same chat again: the worker's cached tokens (its usage) are the ones predicted.
    let again = "00-11112222333344445555666677778888-1111222233334444-01";
    let r = traced_chat(&c.url, body, Some(again)).await;
    let (trace, _, _) = parts(header(&r, "x-sim-traceparent"));
    let spans = collector.trace(&trace).await;
    let server = one(&spans, "POST /v1/chat/completions");
    let predicted: u64 = attr(server, "mmrouter.predicted_cached_tokens").unwrap().parse().unwrap();
    let cached: u64 = attr(server, "gen_ai.usage.cache_read.input_tokens").unwrap().parse().unwrap();
    assert!(predicted > 64 && predicted == cached, "predicted {predicted}, the worker cached {cached}");

    // Over the pixel limit: a text-prefix fallback, no client context, so a trace of its own.
    let large = png_data_url(1200, 1000, 41);
    let r = traced_chat(&c.url, chat_body(&[large], "Describe it.", false), None).await;
    assert_eq!(header(&r, "x-mmrouter-route"), "text_prefix");
    let (trace, parent, flags) = parts(header(&r, "x-sim-traceparent"));
    assert_ne!(hex(&trace), CLIENT_TRACE);
    assert_eq!(flags, "01", "ratio 1.0 samples every trace started here");
    let spans = collector.trace(&trace).await;
    let server = one(&spans, "POST /v1/chat/completions");
    assert!(server.parent_span_id.is_empty(), "a root span");
    assert_eq!(attr(server, "mmrouter.route").as_deref(), Some("text_prefix"));
    let reason = attr(server, "mmrouter.fallback_reason").expect("a fallback reason");
    assert_eq!(attr(one(&spans, "plan"), "mmrouter.fallback_reason"), Some(reason));
    assert_eq!(one(&spans, "upstream").span_id, parent);

    // Delivered spans are counted (the exporter counts after the collector's answer).
    for _ in 0..100 {
        let m = metrics_text(&c.url).await;
        if metric(&m, "mmrouter_trace_spans_exported_total", "") >= spans.len() as f64 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("mmrouter_trace_spans_exported_total did not count the delivered spans");
}

/// Without `[tracing]`: the client's valid context reaches the worker as it was sent, an invalid one
/// does not, and none is made up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracing_off_passes_the_clients_context_on_unchanged() {
    let c = cluster_with(sims(1, fast).await, "").await;
    let tp = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let r = traced_chat(&c.url, chat_body(&[], "Hello.", false), Some(&tp)).await;
    assert_eq!(header(&r, "x-sim-traceparent"), tp);
    let r = traced_chat(&c.url, chat_body(&[], "Hello.", false), Some("00-xyz-00f067aa0ba902b7-01")).await;
    assert!(r.headers().get("x-sim-traceparent").is_none(), "garbage is not propagated");
    let r = traced_chat(&c.url, chat_body(&[], "Hello.", false), None).await;
    assert!(r.headers().get("x-sim-traceparent").is_none());
    let m = metrics_text(&c.url).await;
    assert_eq!(metric(&m, "mmrouter_trace_spans_exported_total", ""), 0.0);
}

/// Sampled out (ratio 0, or a client's unsampled context): nothing exported, but the worker still
/// gets a context (unsampled) in the same trace; a client's sampled context is kept (parent-based).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sampled_out_request_exports_nothing_but_still_propagates() {
    let collector = Collector::default();
    let endpoint = collector.start().await;
    let c = cluster_with(sims(1, fast).await, &tracing_toml(&endpoint, 0.0)).await;
    let r = traced_chat(&c.url, chat_body(&[], "Hello.", false), None).await;
    let (started, _, flags) = parts(header(&r, "x-sim-traceparent"));
    assert_eq!(flags, "00");
    let unsampled = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-00");
    let r = traced_chat(&c.url, chat_body(&[], "Hello again.", false), Some(&unsampled)).await;
    let (trace, parent, flags) = parts(header(&r, "x-sim-traceparent"));
    assert_eq!((hex(&trace).as_str(), flags.as_str()), (CLIENT_TRACE, "00"));
    assert_ne!(hex(&parent), CLIENT_SPAN);

    let sampled_trace = "0af7651916cd43dd8448eb211c80319c";
    let sampled = format!("00-{sampled_trace}-b7ad6b7169203331-01");
    traced_chat(&c.url, chat_body(&[], "Hello, sampled.", false), Some(&sampled)).await;
    assert!(!collector.trace(&unhex(sampled_trace)).await.is_empty(), "a sampled client context is kept");
    // Spans leave in the order their requests ended: the earlier ones would be here by now.
    assert_eq!(collector.count(&started), 0);
    assert_eq!(collector.count(&unhex(CLIENT_TRACE)), 0);
}
