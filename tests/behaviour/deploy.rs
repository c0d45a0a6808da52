//! The Kubernetes manifests in `deploy/`, checked without a cluster against what the router relies on,
//! as `packaging.rs` checks the Dockerfile.
//!
//! Every YAML document under `deploy/` must parse and name its `apiVersion`, `kind` and
//! `metadata.name`. Each kustomization that sets a `namespace` is one deployment: its resources,
//! followed through the kustomizations they name, are checked together. In each, for every
//! container running the router:
//! * its `args` parse with the binary's own command line (`mmrouter::cli::args::Cli`), and the
//!   `--config` they name, traced through the volume mounts to a ConfigMap key, loads with the
//!   binary's own loader (`Settings::parse`), each `*_file` secret it names traced to a Secret's key
//!   (written to a scratch file for the load). DNS entries are not resolved at load time;
//! * the listeners (`[server] listen`, `ext_proc_listen` or `--ext-proc-listen`) bind every interface
//!   on declared container ports; the probes hit `/health` (readiness: the bootstrap-aware answer),
//!   a listener's TCP port or the picker's gRPC health, on those ports; the grace period covers the
//!   drain;
//! * each DNS worker entry names a headless Service of this namespace whose port (the SRV name's port
//!   name, or the entry's port) reaches the workers' container port, `peers_dns` a headless Service
//!   over the router's own pods on its listen port, and `nats_url` a Service with that port; the
//!   workers' `--block-size` equals `[model] block_size`, and with `kv_events = "discover"` their
//!   `--kv-events-config` binds a declared port.
//!
//! And for the rest: every Service's selector picks pods and its target ports name their container
//! ports; every Secret a pod names (volume, `secretKeyRef`) exists with its keys unless `optional`;
//! an InferencePool's `endpointPickerRef` names the picker's Service and its gRPC port, and its
//! selector and target ports name the workers the picker resolves; an HTTPRoute's backends and parents
//! exist and it routes only paths the picker picks; an Envoy configuration (a ConfigMap's `envoy*.yaml`)
//! sends the buffered body to a Service reaching the picker over HTTP/2 and routes the picked paths to
//! an original-destination cluster reading its header; a PodDisruptionBudget leaves a pod to evict.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::Parser;
use mmrouter::cli::args::{Cli, Cmd};
use mmrouter::config::{DnsLookup, Settings};
use serde_json::{Map, Value};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One YAML document of a file under `deploy/`.
#[derive(Clone, Debug)]
struct Doc {
    file: PathBuf,
    value: Value,
}

impl Doc {
    fn kind(&self) -> &str {
        self.value["kind"].as_str().unwrap_or("")
    }
    fn name(&self) -> &str {
        self.value["metadata"]["name"].as_str().unwrap_or("")
    }
    fn at(&self) -> String {
        format!("{} {}/{}", rel(&self.file), self.kind(), self.name())
    }
}

fn rel(p: &Path) -> String {
    p.strip_prefix(repo()).unwrap_or(p).display().to_string()
}

/// YAML as JSON values (what Kubernetes does with it): keys as strings, scalars typed by YAML 1.2.
fn to_json(y: &yaml_rust2::Yaml) -> Result<Value, String> {
    use yaml_rust2::Yaml;
    Ok(match y {
        Yaml::Null => Value::Null,
        Yaml::Boolean(b) => Value::Bool(*b),
        Yaml::Integer(i) => Value::from(*i),
        Yaml::Real(r) => r.parse::<f64>().map(Value::from).map_err(|e| format!("{r}: {e}"))?,
        Yaml::String(s) => Value::String(s.clone()),
        Yaml::Array(a) => Value::Array(a.iter().map(to_json).collect::<Result<_, _>>()?),
        Yaml::Hash(h) => {
            let mut m = Map::new();
            for (k, v) in h {
                let key = match k {
                    Yaml::String(s) => s.clone(),
                    Yaml::Integer(i) => i.to_string(),
                    Yaml::Boolean(b) => b.to_string(),
                    other => return Err(format!("a key that is not a scalar: {other:?}")),
                };
                m.insert(key, to_json(v)?);
            }
            Value::Object(m)
        }
        Yaml::Alias(_) | Yaml::BadValue => return Err(format!("unsupported YAML node {y:?}")),
    })
}

/// Every YAML file under `dir`, sorted.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(yaml_files(&path));
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path.canonicalize().unwrap_or(path));
        }
    }
    out.sort();
    out
}

/// Every document of every file; problems for what does not parse or lacks its identity.
fn read_docs(files: &[PathBuf]) -> (Vec<Doc>, Vec<String>) {
    let (mut docs, mut problems) = (Vec::new(), Vec::new());
    for file in files {
        let text = std::fs::read_to_string(file).unwrap();
        let yaml = match yaml_rust2::YamlLoader::load_from_str(&text) {
            Ok(y) => y,
            Err(e) => {
                problems.push(format!("{}: not YAML: {e}", rel(file)));
                continue;
            }
        };
        for (i, y) in yaml.iter().enumerate() {
            match to_json(y) {
                Ok(Value::Null) => {}
                Ok(value) => docs.push(Doc { file: file.clone(), value }),
                Err(e) => problems.push(format!("{} document {i}: {e}", rel(file))),
            }
        }
    }
    for d in &docs {
        let kustomization = d.kind() == "Kustomization";
        if d.value["apiVersion"].as_str().is_none_or(str::is_empty) || d.kind().is_empty() {
            problems.push(format!("{}: a document without apiVersion or kind", rel(&d.file)));
        } else if d.name().is_empty() && !kustomization {
            problems.push(format!("{}: {} without metadata.name", rel(&d.file), d.kind()));
        }
        if d.value["metadata"]["namespace"].is_string() {
            problems.push(format!("{}: metadata.namespace is set; the kustomization sets it", d.at()));
        }
    }
    (docs, problems)
}

/// One kustomization with a namespace: the documents it applies.
struct Deployment {
    root: PathBuf,
    namespace: String,
    docs: Vec<Doc>,
}

/// The deployments the kustomizations under `deploy/` make, and problems: a resource that is not
/// there, a manifest no kustomization applies.
fn deployments(docs: &[Doc]) -> (Vec<Deployment>, Vec<String>) {
    let mut problems = Vec::new();
    let mut applied = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for k in docs.iter().filter(|d| d.kind() == "Kustomization") {
        applied.insert(k.file.clone());
        let Some(ns) = k.value["namespace"].as_str() else { continue };
        let mut files = Vec::new();
        collect(k, docs, &mut files, &mut problems);
        applied.extend(files.iter().cloned());
        let set = docs.iter().filter(|d| files.contains(&d.file) && d.kind() != "Kustomization").cloned().collect();
        out.push(Deployment { root: k.file.clone(), namespace: ns.to_owned(), docs: set });
    }
    for d in docs.iter().filter(|d| !applied.contains(&d.file)) {
        problems.push(format!("{}: no kustomization applies it", d.at()));
    }
    (out, problems)
}

/// The manifest files a kustomization applies, through the directories it names.
fn collect(k: &Doc, docs: &[Doc], files: &mut Vec<PathBuf>, problems: &mut Vec<String>) {
    let dir = k.file.parent().unwrap();
    for r in k.value["resources"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        let path = dir.join(r);
        let path = path.canonicalize().unwrap_or(path);
        if path.is_dir() {
            match docs.iter().find(|d| d.kind() == "Kustomization" && d.file.parent() == Some(path.as_path())) {
                Some(inner) => collect(inner, docs, files, problems),
                None => {
                    problems.push(format!("{}: resource {r}: a directory without kustomization.yaml", rel(&k.file)))
                }
            }
        } else if path.is_file() {
            files.push(path);
        } else {
            problems.push(format!("{}: resource {r} is not there", rel(&k.file)));
        }
    }
}

fn pod_spec(d: &Doc) -> Option<&Value> {
    matches!(d.kind(), "Deployment" | "StatefulSet" | "DaemonSet").then(|| &d.value["spec"]["template"]["spec"])
}

fn pod_labels(d: &Doc) -> &Value {
    &d.value["spec"]["template"]["metadata"]["labels"]
}

fn arr(v: &Value) -> &[Value] {
    v.as_array().map_or(&[], Vec::as_slice)
}

/// Whether every `selector` label is among `labels` (an empty selector selects nothing here).
fn selects(selector: &Value, labels: &Value) -> bool {
    let Some(sel) = selector.as_object().filter(|s| !s.is_empty()) else { return false };
    sel.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// A container port by number or name.
fn container_port(container: &Value, port: &Value) -> Option<u16> {
    arr(&container["ports"]).iter().find_map(|p| {
        let number = p["containerPort"].as_u64()?;
        let hit = port.as_u64() == Some(number) || (port.is_string() && p["name"] == *port);
        hit.then_some(number as u16)
    })
}

/// A port of any container of the pod, by number or name.
fn pod_port(spec: &Value, port: &Value) -> Option<u16> {
    arr(&spec["containers"]).iter().find_map(|c| container_port(c, port))
}

impl Deployment {
    fn all(&self, kind: &str) -> impl Iterator<Item = &Doc> {
        let kind = kind.to_owned();
        self.docs.iter().filter(move |d| d.kind() == kind)
    }
    fn get(&self, kind: &str, name: &str) -> Option<&Doc> {
        self.docs.iter().find(|d| d.kind() == kind && d.name() == name)
    }
    /// The workloads whose pods `selector` picks.
    fn selected(&self, selector: &Value) -> Vec<&Doc> {
        self.docs.iter().filter(|d| pod_spec(d).is_some() && selects(selector, pod_labels(d))).collect()
    }
    fn at(&self) -> String {
        rel(&self.root)
    }
}

/// Everything wrong with the manifests under `deploy/`, in words.
fn problems_in(dir: &Path) -> Vec<String> {
    let (docs, mut problems) = read_docs(&yaml_files(dir));
    let (sets, more) = deployments(&docs);
    problems.extend(more);
    if sets.is_empty() {
        problems.push(format!("{}: no kustomization with a namespace", rel(dir)));
    }
    for set in &sets {
        problems.extend(set_problems(set));
    }
    problems
}

fn set_problems(set: &Deployment) -> Vec<String> {
    let mut p = Vec::new();
    for w in set.docs.iter().filter(|d| pod_spec(d).is_some()) {
        p.extend(workload_problems(set, w));
    }
    for s in set.all("Service") {
        p.extend(service_problems(set, s));
    }
    for b in set.all("PodDisruptionBudget") {
        p.extend(pdb_problems(set, b));
    }
    let routers: Vec<Router> = set.docs.iter().filter_map(|w| router_of(set, w, &mut p)).collect();
    if routers.is_empty() {
        p.push(format!("{}: no container runs `mmrouter serve`", set.at()));
    }
    for r in &routers {
        p.extend(router_problems(set, r));
    }
    for pool in set.all("InferencePool") {
        p.extend(pool_problems(set, pool, &routers));
    }
    for route in set.all("HTTPRoute") {
        p.extend(route_problems(set, route));
    }
    for cm in set.all("ConfigMap") {
        for (key, text) in cm.value["data"].as_object().into_iter().flatten() {
            if key.starts_with("envoy") && (key.ends_with(".yaml") || key.ends_with(".yml")) {
                p.extend(envoy_problems(set, cm, text.as_str().unwrap_or(""), &routers));
            }
        }
    }
    p
}

/// A workload's own consistency: its selector picks its pods, the Secrets it names exist.
fn workload_problems(set: &Deployment, w: &Doc) -> Vec<String> {
    let mut p = Vec::new();
    if !selects(&w.value["spec"]["selector"]["matchLabels"], pod_labels(w)) {
        p.push(format!("{}: spec.selector does not pick its own pod template", w.at()));
    }
    let spec = pod_spec(w).unwrap();
    for v in arr(&spec["volumes"]) {
        if let Some(name) = v["secret"]["secretName"].as_str() {
            let keys: Vec<&str> = arr(&v["secret"]["items"]).iter().filter_map(|i| i["key"].as_str()).collect();
            let optional = v["secret"]["optional"] == true;
            p.extend(secret_problems(set, w, name, &keys, optional));
        }
    }
    for c in arr(&spec["containers"]) {
        for e in arr(&c["env"]) {
            let r = &e["valueFrom"]["secretKeyRef"];
            if let (Some(name), Some(key)) = (r["name"].as_str(), r["key"].as_str()) {
                p.extend(secret_problems(set, w, name, &[key], r["optional"] == true));
            }
        }
    }
    p
}

fn secret_problems(set: &Deployment, w: &Doc, name: &str, keys: &[&str], optional: bool) -> Vec<String> {
    match set.get("Secret", name) {
        None if optional => vec![],
        None => vec![format!("{}: Secret {name} is not among the manifests", w.at())],
        Some(s) => keys
            .iter()
            .filter(|k| secret_value(s, k).is_none())
            .map(|k| format!("{}: Secret {name} has no key {k}", w.at()))
            .collect(),
    }
}

fn secret_value(secret: &Doc, key: &str) -> Option<String> {
    if let Some(v) = secret.value["stringData"][key].as_str() {
        return Some(v.to_owned());
    }
    use base64::Engine;
    let b64 = secret.value["data"][key].as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    String::from_utf8(bytes).ok()
}

/// A Service's selector picks pods, and each target port is one of their container ports.
fn service_problems(set: &Deployment, s: &Doc) -> Vec<String> {
    let selected = set.selected(&s.value["spec"]["selector"]);
    if selected.is_empty() {
        return vec![format!("{}: its selector picks no pod of these manifests", s.at())];
    }
    let mut p = Vec::new();
    for port in arr(&s.value["spec"]["ports"]) {
        let target = if port["targetPort"].is_null() { &port["port"] } else { &port["targetPort"] };
        for w in &selected {
            if pod_port(pod_spec(w).unwrap(), target).is_none() {
                p.push(format!("{}: targetPort {target} is no container port of {}", s.at(), w.at()));
            }
        }
    }
    p
}

fn pdb_problems(set: &Deployment, b: &Doc) -> Vec<String> {
    let selected = set.selected(&b.value["spec"]["selector"]["matchLabels"]);
    let Some(w) = selected.first() else { return vec![format!("{}: its selector picks no pod", b.at())] };
    let replicas = w.value["spec"]["replicas"].as_u64().unwrap_or(1);
    match b.value["spec"]["minAvailable"].as_u64() {
        Some(min) if min >= replicas => {
            vec![format!("{}: minAvailable {min} of {replicas} replicas: no pod may ever be evicted", b.at())]
        }
        _ => vec![],
    }
}

/// A container running `mmrouter serve`, with the settings it would run with.
struct Router<'a> {
    workload: &'a Doc,
    container: &'a Value,
    settings: Settings,
}

/// The router container of `w`, if it runs one: its args parsed, its config loaded.
fn router_of<'a>(set: &'a Deployment, w: &'a Doc, p: &mut Vec<String>) -> Option<Router<'a>> {
    let spec = pod_spec(w)?;
    let container = arr(&spec["containers"]).iter().find(|c| c["args"].get(0) == Some(&Value::from("serve")))?;
    let args: Vec<String> = arr(&container["args"]).iter().map(|a| a.as_str().unwrap_or("").to_owned()).collect();
    let argv = std::iter::once("mmrouter".to_owned()).chain(args.iter().cloned());
    let serve = match Cli::try_parse_from(argv) {
        Ok(Cli { cmd: Cmd::Serve(s), .. }) => s,
        Ok(_) => unreachable!("args start with serve"),
        Err(e) => {
            p.push(format!("{}: args {args:?} do not parse: {}", w.at(), e.render()));
            return None;
        }
    };
    let Some(config) = serve.config.clone() else {
        p.push(format!("{}: serve without --config", w.at()));
        return None;
    };
    let text = match mounted_text(set, spec, container, &config) {
        Ok(t) => t,
        Err(e) => {
            p.push(format!("{}: --config {}: {e}", w.at(), config.display()));
            return None;
        }
    };
    let scratch = tempfile::tempdir().unwrap();
    let loaded = with_secret_files(set, spec, container, &text, scratch.path())
        .and_then(|t| Settings::parse(&t).map_err(|e| format!("{e:#}")));
    let mut settings = match loaded {
        Ok(s) => s,
        Err(e) => {
            p.push(format!("{}: --config {} does not load: {e}", w.at(), config.display()));
            return None;
        }
    };
    // As `serve --config` applies them over the file.
    if let Some(l) = &serve.listen {
        match l.parse() {
            Ok(addr) => settings.server.listen = addr,
            Err(_) => p.push(format!("{}: --listen {l} is not an address", w.at())),
        }
    }
    if let Some(a) = &serve.ext_proc_listen {
        match a.parse() {
            Ok(addr) => settings.server.ext_proc_listen = Some(addr),
            Err(_) => p.push(format!("{}: --ext-proc-listen {a} is not an address", w.at())),
        }
    }
    Some(Router { workload: w, container, settings })
}

/// The file at `path` inside the container: a ConfigMap's or Secret's key mounted there.
fn mounted_text(set: &Deployment, spec: &Value, container: &Value, path: &Path) -> Result<String, String> {
    for m in arr(&container["volumeMounts"]) {
        let Some(rest) = m["mountPath"].as_str().and_then(|mp| path.strip_prefix(mp).ok()) else { continue };
        let file = rest.to_str().unwrap_or("");
        let volume = arr(&spec["volumes"]).iter().find(|v| v["name"] == m["name"]).ok_or("no such volume")?;
        let (kind, source, name_key) = if volume["configMap"].is_object() {
            ("ConfigMap", &volume["configMap"], "name")
        } else if volume["secret"].is_object() {
            ("Secret", &volume["secret"], "secretName")
        } else {
            return Err(format!("volume {} is neither a ConfigMap nor a Secret", m["name"]));
        };
        let name = source[name_key].as_str().unwrap_or("");
        // With `items`, only those keys are there, at their paths.
        let key = match source["items"].as_array() {
            Some(items) => items.iter().find(|i| i["path"] == file).and_then(|i| i["key"].as_str()),
            None => Some(file),
        }
        .ok_or_else(|| format!("{kind} {name}'s items put nothing at {file}"))?;
        let doc = set.get(kind, name).ok_or_else(|| format!("{kind} {name} is not among the manifests"))?;
        let value = match kind {
            "ConfigMap" => doc.value["data"][key].as_str().map(str::to_owned),
            _ => secret_value(doc, key),
        };
        return value.ok_or_else(|| format!("{kind} {name} has no key {key}"));
    }
    Err("not under any volume mount".into())
}

/// The config text with each `*_file` key's path replaced by a scratch copy of the file mounted there
/// (the Secret's value), so that the binary's loader reads what the pod would.
fn with_secret_files(
    set: &Deployment,
    spec: &Value,
    container: &Value,
    text: &str,
    scratch: &Path,
) -> Result<String, String> {
    let mut doc: toml::Table = toml::from_str(text).map_err(|e| format!("{e}"))?;
    let mut n = 0;
    let mut rewrite = |table: &mut toml::Table| -> Result<(), String> {
        for (k, v) in table.iter_mut().filter(|(k, _)| k.ends_with("_file")) {
            let Some(path) = v.as_str() else { continue };
            let content =
                mounted_text(set, spec, container, Path::new(path)).map_err(|e| format!("{k} {path}: {e}"))?;
            n += 1;
            let copy = scratch.join(format!("secret-{n}"));
            std::fs::write(&copy, content).unwrap();
            *v = toml::Value::String(copy.display().to_string());
        }
        Ok(())
    };
    for (_, section) in doc.iter_mut() {
        if let Some(t) = section.as_table_mut() {
            rewrite(t)?;
        }
    }
    Ok(toml::to_string(&doc).unwrap())
}

/// The router container against its config: listeners, probes, drain, DNS names, workers.
fn router_problems(set: &Deployment, r: &Router) -> Vec<String> {
    let mut p = Vec::new();
    let at = r.workload.at();
    let spec = pod_spec(r.workload).unwrap();
    let server = &r.settings.server;
    let listeners: Vec<(&str, SocketAddr)> = std::iter::once(("server.listen", server.listen))
        .chain(server.ext_proc_listen.map(|a| ("ext_proc_listen", a)))
        .collect();
    for (what, addr) in &listeners {
        if !addr.ip().is_unspecified() {
            p.push(format!("{at}: {what} {addr} is not reachable from other pods (use 0.0.0.0)"));
        }
        if container_port(r.container, &Value::from(addr.port())).is_none() {
            p.push(format!("{at}: {what} port {} is not a container port", addr.port()));
        }
    }
    let http = server.listen.port();
    let grpc = server.ext_proc_listen.map(|a| a.port());
    for kind in ["readinessProbe", "livenessProbe", "startupProbe"] {
        let probe = &r.container[kind];
        if probe.is_null() {
            if kind != "startupProbe" {
                p.push(format!("{at}: no {kind}"));
            }
            continue;
        }
        p.extend(probe_problems(&at, kind, probe, r.container, http, grpc));
    }
    let readiness = &r.container["readinessProbe"]["httpGet"]["path"];
    if readiness != "/health" {
        p.push(format!("{at}: readinessProbe must be GET /health (503 while bootstrapping or draining)"));
    }
    let grace = spec["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
    let drain = server.conn.drain_delay + server.conn.drain_timeout;
    if grace < drain.as_secs() {
        p.push(format!("{at}: terminationGracePeriodSeconds {grace} < drain_delay + drain_timeout ({drain:?})"));
    }
    let sc = &r.container["securityContext"];
    if sc["readOnlyRootFilesystem"] != true || spec["securityContext"]["runAsNonRoot"] != true {
        p.push(format!("{at}: expected runAsNonRoot and readOnlyRootFilesystem"));
    }
    p.extend(dns_problems(set, r));
    p.extend(cluster_problems(set, r));
    p
}

fn probe_problems(at: &str, kind: &str, probe: &Value, c: &Value, http: u16, grpc: Option<u16>) -> Vec<String> {
    let mut p = Vec::new();
    if let Some(get) = probe.get("httpGet") {
        if get["path"] != "/health" {
            p.push(format!("{at}: {kind} GET {}: the router's probe path is /health", get["path"]));
        }
        if container_port(c, &get["port"]) != Some(http) {
            p.push(format!("{at}: {kind} port {} is not server.listen's ({http})", get["port"]));
        }
    } else if let Some(tcp) = probe.get("tcpSocket") {
        let port = container_port(c, &tcp["port"]);
        if port.is_none() || (port != Some(http) && port != grpc) {
            p.push(format!("{at}: {kind} tcpSocket port {} is no listener's", tcp["port"]));
        }
    } else if let Some(g) = probe.get("grpc") {
        let service = g["service"].as_str().unwrap_or("");
        if grpc.is_none() || g["port"].as_u64().map(|n| n as u16) != grpc {
            p.push(format!("{at}: {kind} grpc port {} is not the picker's ({grpc:?})", g["port"]));
        }
        if !["", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"].contains(&service) {
            p.push(format!("{at}: {kind} grpc service {service:?} is not one the picker's health serves"));
        }
    } else {
        p.push(format!("{at}: {kind} is neither httpGet, tcpSocket nor grpc"));
    }
    p
}

/// `svc`, `svc.ns`, `svc.ns.svc` or `svc.ns.svc.cluster.local`: the Service and namespace it names.
fn service_name<'a>(host: &'a str, namespace: &'a str) -> Result<&'a str, String> {
    let host = host.trim_end_matches('.');
    let labels: Vec<&str> = host.split('.').collect();
    let ns = labels.get(1).copied().unwrap_or(namespace);
    if ns != namespace {
        return Err(format!("{host} names namespace {ns}, the kustomization applies to {namespace}"));
    }
    match labels.get(2..) {
        None | Some([] | ["svc"] | ["svc", "cluster", "local"]) => Ok(labels[0]),
        Some(_) => Err(format!("{host} is not a Service's name in the cluster")),
    }
}

/// Each DNS worker entry names a headless Service that reaches the workers on the entry's port.
fn dns_problems(set: &Deployment, r: &Router) -> Vec<String> {
    let mut p = Vec::new();
    let at = r.workload.at();
    for e in &r.settings.discovery.entries {
        let (host, port_ref) = match &e.lookup {
            DnsLookup::Srv { name } => {
                match name.split_once("._tcp.").and_then(|(port, h)| Some((port.strip_prefix('_')?, h))) {
                    Some((port_name, host)) => (host, Value::from(port_name)),
                    None => {
                        p.push(format!("{at}: workers {}: {name} is not _<port name>._tcp.<service>", e.name));
                        continue;
                    }
                }
            }
            DnsLookup::Addresses { host, port } => (host.as_str(), Value::from(*port)),
        };
        let svc = match service_name(host, &set.namespace) {
            Ok(s) => s,
            Err(why) => {
                p.push(format!("{at}: workers {}: {why}", e.name));
                continue;
            }
        };
        match headless_target(set, svc, &port_ref) {
            Err(why) => p.push(format!("{at}: workers {}: {why}", e.name)),
            Ok(workers) => {
                for (w, port) in workers {
                    p.extend(worker_problems(r, w, port));
                }
            }
        }
    }
    p
}

/// The workloads a headless Service's port reaches, each with the container port: for an SRV name
/// the port is the Service port's name, for A records the port the pods listen on.
fn headless_target<'a>(set: &'a Deployment, svc: &str, port: &Value) -> Result<Vec<(&'a Doc, u16)>, String> {
    let s = set.get("Service", svc).ok_or_else(|| format!("no Service {svc} among the manifests"))?;
    if s.value["spec"]["clusterIP"] != "None" {
        return Err(format!("Service {svc} is not headless (clusterIP: None): DNS would answer its virtual IP"));
    }
    let ports = arr(&s.value["spec"]["ports"]);
    let target = match port {
        Value::String(name) => {
            let sp = ports
                .iter()
                .find(|sp| sp["name"] == *name)
                .ok_or_else(|| format!("Service {svc} has no port named {name}"))?;
            if sp["targetPort"].is_null() {
                sp["port"].clone()
            } else {
                sp["targetPort"].clone()
            }
        }
        n => n.clone(),
    };
    let selected = set.selected(&s.value["spec"]["selector"]);
    if selected.is_empty() {
        return Err(format!("Service {svc} selects no pod"));
    }
    selected
        .into_iter()
        .map(|w| match pod_port(pod_spec(w).unwrap(), &target) {
            Some(n) => Ok((w, n)),
            None => Err(format!("Service {svc}: port {target} is no container port of {}", w.at())),
        })
        .collect()
}

/// The value of `--flag=value` or `--flag value` in a container's command line.
fn flag<'a>(c: &'a Value, name: &str) -> Option<&'a str> {
    let words: Vec<&str> = arr(&c["command"]).iter().chain(arr(&c["args"])).filter_map(Value::as_str).collect();
    words.iter().enumerate().find_map(|(i, w)| match w.strip_prefix(name) {
        Some(v) if v.starts_with('=') => Some(&v[1..]),
        Some("") => words.get(i + 1).copied(),
        _ => None,
    })
}

/// A worker workload against the router's pool: block size, and KV events where discovered.
fn worker_problems(r: &Router, w: &Doc, port: u16) -> Vec<String> {
    let mut p = Vec::new();
    let at = format!("{} → {}", r.workload.at(), w.at());
    let Some(c) =
        arr(&pod_spec(w).unwrap()["containers"]).iter().find(|c| container_port(c, &Value::from(port)).is_some())
    else {
        return vec![format!("{at}: no container listens on {port}")];
    };
    if let Some(p_flag) = flag(c, "--port") {
        if p_flag.parse() != Ok(port) {
            p.push(format!("{at}: the engine's --port {p_flag} is not the Service's port {port}"));
        }
    }
    let want = r.settings.pools[0].pipeline.model.block_size;
    match flag(c, "--block-size").map(str::parse::<u32>) {
        Some(Ok(n)) if n == want => {}
        got => p.push(format!("{at}: the engine's --block-size {got:?} is not [model] block_size {want}")),
    }
    let discover = r
        .settings
        .discovery
        .entries
        .iter()
        .any(|e| matches!(e.template.events, Some(mmrouter::config::EventSource::Discover)));
    if discover {
        p.extend(kv_events_problems(&at, c));
    }
    p
}

/// vLLM's `--kv-events-config`: on, ZMQ, bound (`*` or `::`: vLLM connects out otherwise) on a declared port.
fn kv_events_problems(at: &str, c: &Value) -> Vec<String> {
    let Some(text) = flag(c, "--kv-events-config") else {
        return vec![format!("{at}: kv_events = \"discover\" but the engine has no --kv-events-config")];
    };
    let cfg: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return vec![format!("{at}: --kv-events-config is not JSON: {e}")],
    };
    let mut p = Vec::new();
    if cfg["enable_kv_cache_events"] != true || cfg["publisher"] != "zmq" {
        p.push(format!("{at}: --kv-events-config must enable events with publisher zmq"));
    }
    for key in ["endpoint", "replay_endpoint"] {
        let Some(ep) = cfg[key].as_str() else { continue };
        let bound = ep.contains('*') || ep.contains("::");
        let port = ep.rsplit(':').next().and_then(|n| n.parse::<u16>().ok());
        if !bound {
            p.push(format!("{at}: {key} {ep} does not bind (vLLM binds only with * or ::)"));
        }
        if port.is_none_or(|n| container_port(c, &Value::from(n)).is_none()) {
            p.push(format!("{at}: {key} {ep}'s port is not a container port"));
        }
    }
    p
}

/// `[cluster]`: peers_dns names a headless Service over the router's own pods on its listen port,
/// nats_url a Service with that port.
fn cluster_problems(set: &Deployment, r: &Router) -> Vec<String> {
    let Some(c) = &r.settings.cluster else { return vec![] };
    let mut p = Vec::new();
    let at = r.workload.at();
    if let Some(peers) = &c.peers_dns {
        let (host, port) = peers.rsplit_once(':').unwrap_or((peers, ""));
        let port = port.parse::<u16>().unwrap_or(0);
        if port != r.settings.server.listen.port() {
            p.push(format!("{at}: peers_dns port {port} is not server.listen's"));
        }
        match service_name(host, &set.namespace).and_then(|svc| headless_target(set, svc, &Value::from(port))) {
            Err(why) => p.push(format!("{at}: peers_dns: {why}")),
            Ok(ws) if !ws.iter().any(|(w, _)| w.name() == r.workload.name()) || ws.len() != 1 => {
                p.push(format!("{at}: peers_dns must select this router's pods only"));
            }
            Ok(_) => {}
        }
    }
    if let Some(nats) = &c.nats {
        let rest = nats.url.split_once("://").map_or(nats.url.as_str(), |(_, r)| r);
        let (host, port) = rest.trim_end_matches('/').rsplit_once(':').unwrap_or((rest, "4222"));
        let port: u64 = port.parse().unwrap_or(0);
        match service_name(host, &set.namespace)
            .and_then(|svc| set.get("Service", svc).ok_or(format!("no Service {svc}")))
        {
            Err(why) => p.push(format!("{at}: nats_url: {why}")),
            Ok(s) if !arr(&s.value["spec"]["ports"]).iter().any(|sp| sp["port"].as_u64() == Some(port)) => {
                p.push(format!("{at}: nats_url: Service {} has no port {port}", s.name()));
            }
            Ok(_) => {}
        }
    }
    p
}

/// An InferencePool names the picker (a router with ext_proc on) through its Service's gRPC port,
/// and the same workers, on the same port, as the picker resolves.
fn pool_problems(set: &Deployment, pool: &Doc, routers: &[Router]) -> Vec<String> {
    let mut p = Vec::new();
    let at = pool.at();
    let epp = &pool.value["spec"]["endpointPickerRef"];
    let kind = epp["kind"].as_str().unwrap_or("Service");
    let name = epp["name"].as_str().unwrap_or("");
    let Some(svc) = set.get(kind, name) else { return vec![format!("{at}: endpointPickerRef names no {kind} {name}")] };
    let port = epp["port"]["number"].as_u64();
    let Some(sp) = arr(&svc.value["spec"]["ports"]).iter().find(|sp| sp["port"].as_u64() == port) else {
        return vec![format!("{at}: Service {name} has no port {port:?}")];
    };
    let target = if sp["targetPort"].is_null() { &sp["port"] } else { &sp["targetPort"] };
    let pickers: Vec<&Router> =
        routers.iter().filter(|r| selects(&svc.value["spec"]["selector"], pod_labels(r.workload))).collect();
    if pickers.is_empty() {
        p.push(format!("{at}: Service {name} selects no router"));
    }
    for r in &pickers {
        let grpc = r.settings.server.ext_proc_listen.map(|a| a.port());
        if grpc.is_none() || container_port(r.container, target) != grpc {
            p.push(format!(
                "{at}: Service {name} port {port:?} does not reach {}'s ext_proc listener ({grpc:?})",
                r.workload.at()
            ));
        }
    }
    let workers = set.selected(&pool.value["spec"]["selector"]["matchLabels"]);
    if workers.is_empty() {
        p.push(format!("{at}: its selector picks no pod"));
    }
    let targets: Vec<u64> =
        arr(&pool.value["spec"]["targetPorts"]).iter().filter_map(|t| t["number"].as_u64()).collect();
    for w in &workers {
        for t in &targets {
            if pod_port(pod_spec(w).unwrap(), &Value::from(*t)).is_none() {
                p.push(format!("{at}: targetPort {t} is no container port of {}", w.at()));
            }
        }
    }
    // The picker must pick among those same endpoints: its DNS entries resolve to them.
    for r in &pickers {
        for e in &r.settings.discovery.entries {
            let reached = match &e.lookup {
                DnsLookup::Srv { name } => name.split_once("._tcp.").and_then(|(pn, h)| {
                    let svc = service_name(h, &set.namespace).ok()?;
                    headless_target(set, svc, &Value::from(pn.trim_start_matches('_'))).ok()
                }),
                DnsLookup::Addresses { host, port } => service_name(host, &set.namespace)
                    .ok()
                    .and_then(|svc| headless_target(set, svc, &Value::from(*port)).ok()),
            };
            let same = reached.is_some_and(|ws| {
                ws.iter().all(|(w, port)| {
                    workers.iter().any(|x| x.name() == w.name()) && targets.contains(&u64::from(*port))
                })
            });
            if !same {
                p.push(format!(
                    "{at}: {}'s workers {} are not the pool's pods and target ports",
                    r.workload.at(),
                    e.name
                ));
            }
        }
    }
    p
}

/// An Envoy bootstrap in a ConfigMap (docs/gateway.md's setup): its ext_proc filter sends the whole
/// body to a cluster whose address is a Service reaching the picker's gRPC port over HTTP/2; the
/// routes send only the picked paths to an original-destination cluster reading the picker's header,
/// and the picker lists no fallbacks for it.
fn envoy_problems(set: &Deployment, cm: &Doc, text: &str, routers: &[Router]) -> Vec<String> {
    let at = cm.at();
    let env = match yaml_rust2::YamlLoader::load_from_str(text)
        .map_err(|e| e.to_string())
        .and_then(|y| y.first().map(to_json).unwrap_or(Ok(Value::Null)))
    {
        Ok(v) => v,
        Err(e) => return vec![format!("{at}: Envoy's config is not YAML: {e}")],
    };
    let mut p = Vec::new();
    let clusters = arr(&env["static_resources"]["clusters"]);
    let cluster = |name: &Value| clusters.iter().find(|c| c["name"] == *name);
    for l in arr(&env["static_resources"]["listeners"]) {
        for f in arr(&l["filter_chains"]).iter().flat_map(|c| arr(&c["filters"])) {
            let hcm = &f["typed_config"];
            for filter in arr(&hcm["http_filters"]).iter().filter(|h| h["name"] == "envoy.filters.http.ext_proc") {
                let cfg = &filter["typed_config"];
                if cfg["processing_mode"]["request_body_mode"] != "BUFFERED" {
                    p.push(format!("{at}: ext_proc request_body_mode must be BUFFERED (the body decides the worker)"));
                }
                let Some(c) = cluster(&cfg["grpc_service"]["envoy_grpc"]["cluster_name"]) else {
                    p.push(format!("{at}: the ext_proc filter's cluster is not defined"));
                    continue;
                };
                p.extend(picker_cluster_problems(set, &at, c, routers));
            }
            let routes = arr(&hcm["route_config"]["virtual_hosts"]).iter().flat_map(|v| arr(&v["routes"]));
            for r in routes {
                let path = r["match"]["path"].as_str().unwrap_or("(a prefix)");
                if !PICKED_PATHS.contains(&path) {
                    p.push(format!("{at}: routes {path}, the picker picks only {PICKED_PATHS:?}"));
                }
                let target = cluster(&r["route"]["cluster"]);
                let by_header = target.is_some_and(|c| {
                    c["type"] == "ORIGINAL_DST"
                        && c["original_dst_lb_config"]["use_http_header"] == true
                        && c["original_dst_lb_config"]["http_header_name"] == "x-gateway-destination-endpoint"
                });
                if !by_header {
                    p.push(format!(
                        "{at}: route {path} must go to an ORIGINAL_DST cluster reading x-gateway-destination-endpoint"
                    ));
                }
            }
        }
    }
    p
}

/// The ext_proc cluster: HTTP/2, each endpoint a Service of this namespace whose port reaches a
/// router's ext_proc listener, that router listing no fallbacks (one ip:port for ORIGINAL_DST).
fn picker_cluster_problems(set: &Deployment, at: &str, c: &Value, routers: &[Router]) -> Vec<String> {
    let mut p = Vec::new();
    let h2 = &c["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"];
    if !h2["explicit_http_config"]["http2_protocol_options"].is_object() {
        p.push(format!("{at}: the picker's cluster must speak HTTP/2 (gRPC)"));
    }
    let endpoints = arr(&c["load_assignment"]["endpoints"]).iter().flat_map(|e| arr(&e["lb_endpoints"]));
    for e in endpoints {
        let addr = &e["endpoint"]["address"]["socket_address"];
        let (host, port) = (addr["address"].as_str().unwrap_or(""), addr["port_value"].as_u64());
        let svc = match service_name(host, &set.namespace)
            .and_then(|s| set.get("Service", s).ok_or(format!("no Service {s}")))
        {
            Ok(s) => s,
            Err(why) => {
                p.push(format!("{at}: the picker's cluster: {why}"));
                continue;
            }
        };
        let sp = arr(&svc.value["spec"]["ports"]).iter().find(|sp| sp["port"].as_u64() == port);
        let target = sp.map(|sp| if sp["targetPort"].is_null() { &sp["port"] } else { &sp["targetPort"] });
        let picked: Vec<&Router> =
            routers.iter().filter(|r| selects(&svc.value["spec"]["selector"], pod_labels(r.workload))).collect();
        let reaches = |r: &&Router| {
            let grpc = r.settings.server.ext_proc_listen.map(|a| a.port());
            grpc.is_some() && target.and_then(|t| container_port(r.container, t)) == grpc
        };
        if picked.is_empty() || !picked.iter().all(reaches) {
            p.push(format!("{at}: the picker's cluster {host}:{port:?} does not reach a router's ext_proc listener"));
        }
        for r in picked.iter().filter(|r| r.settings.server.ext_proc_fallbacks > 0) {
            p.push(format!(
                "{at}: {} lists ext_proc_fallbacks; an ORIGINAL_DST cluster reads one ip:port",
                r.workload.at()
            ));
        }
    }
    p
}

/// The paths the picker picks (docs/gateway.md); any other it answers 404.
const PICKED_PATHS: [&str; 2] = ["/v1/chat/completions", "/v1/completions"];

fn route_problems(set: &Deployment, route: &Doc) -> Vec<String> {
    let mut p = Vec::new();
    let at = route.at();
    for parent in arr(&route.value["spec"]["parentRefs"]) {
        let name = parent["name"].as_str().unwrap_or("");
        if set.get("Gateway", name).is_none() {
            p.push(format!("{at}: parentRef {name} is no Gateway among the manifests"));
        }
    }
    for rule in arr(&route.value["spec"]["rules"]) {
        let to_pool = arr(&rule["backendRefs"]).iter().any(|b| b["kind"] == "InferencePool");
        for b in arr(&rule["backendRefs"]).iter().filter(|b| b["kind"] == "InferencePool") {
            let name = b["name"].as_str().unwrap_or("");
            if set.get("InferencePool", name).is_none() {
                p.push(format!("{at}: backendRef InferencePool {name} is not among the manifests"));
            }
        }
        for m in arr(&rule["matches"]).iter().filter(|_| to_pool) {
            let path = m["path"]["value"].as_str().unwrap_or("/");
            if m["path"]["type"] != "Exact" || !PICKED_PATHS.contains(&path) {
                p.push(format!("{at}: routes {path} to the picker, which picks only {PICKED_PATHS:?}"));
            }
        }
    }
    p
}

#[test]
fn every_manifest_agrees_with_the_router() {
    let dir = std::env::var("MMROUTER_TEST_DEPLOY").map_or_else(|_| repo().join("deploy"), PathBuf::from);
    let problems = problems_in(&dir);
    assert!(problems.is_empty(), "{}:\n{}", dir.display(), problems.join("\n"));
}

/// One edit of a manifest: the file (its path's end), the text replaced, the replacement.
type Edit<'a> = (&'a str, &'a str, &'a str);

/// A copy of `deploy/` with `edits` applied, and what the check says of it.
fn problems_after(edits: &[Edit]) -> String {
    let copy = tempfile::tempdir().unwrap();
    let src = repo().join("deploy");
    for file in yaml_files(&src) {
        let to = copy.path().join(file.strip_prefix(&src).unwrap());
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        let mut text = std::fs::read_to_string(&file).unwrap();
        for (name, from, with) in edits.iter().filter(|(name, _, _)| file.ends_with(name)) {
            assert!(text.contains(from), "{name} has no {from:?}");
            text = text.replacen(from, with, 1);
        }
        std::fs::write(to, text).unwrap();
    }
    problems_in(copy.path()).join("\n")
}

/// The check finds disagreements: each edit below breaks one thing the router relies on.
#[test]
fn manifests_that_disagree_with_the_router_fail() {
    let cases: [(&[Edit], &str); 23] = [
        (
            &[("proxy/router.yaml", "listen = \"0.0.0.0:8080\"", "listen = \"0.0.0.0:8081\"")],
            "port 8081 is not a container port",
        ),
        (
            &[("proxy/router.yaml", "listen = \"0.0.0.0:8080\"", "listen = \"127.0.0.1:8080\"")],
            "not reachable from other pods",
        ),
        (&[("proxy/router.yaml", "path: /health", "path: /healthz")], "the router's probe path is /health"),
        (&[("proxy/router.yaml", "\"--config\"", "\"--confg\"")], "do not parse"),
        (&[("proxy/router.yaml", "block_size = 16", "block_sise = 16")], "does not load"),
        (&[("proxy/router.yaml", "_http._tcp.vllm.mmrouter", "_grpc._tcp.vllm.mmrouter")], "no port named grpc"),
        (&[("proxy/router.yaml", "vllm.mmrouter.svc", "vllm.default.svc")], "names namespace default"),
        (&[("common/vllm.yaml", "clusterIP: None", "clusterIP: 10.0.0.9")], "not headless"),
        (&[("common/vllm.yaml", "--block-size=16", "--block-size=32")], "is not [model] block_size 16"),
        (&[("common/secrets.yaml", "  admin-keys: |", "  admins: |")], "Secret mmrouter-keys has no key admin-keys"),
        (
            &[("picker/picker.yaml", "\"0.0.0.0:9002\"", "\"0.0.0.0:9003\"")],
            "ext_proc_listen port 9003 is not a container port",
        ),
        (&[("gateway-api/gateway.yaml", "      number: 9002", "      number: 8080")], "does not reach"),
        (
            &[("gateway-api/gateway.yaml", "    - number: 8000", "    - number: 8001")],
            "targetPort 8001 is no container port",
        ),
        (&[("gateway-api/gateway.yaml", "value: /v1/completions", "value: /v1/embeddings")], "which picks only"),
        (
            &[("common/vllm.yaml", "\"endpoint\":\"tcp://*:5557\"", "\"endpoint\":\"tcp://10.0.0.7:5557\"")],
            "does not bind",
        ),
        (
            &[("proxy/router.yaml", "terminationGracePeriodSeconds: 150", "terminationGracePeriodSeconds: 60")],
            "< drain_delay",
        ),
        (&[("proxy/router.yaml", "peers_dns = \"mmrouter-peers.", "peers_dns = \"vllm.")], "peers_dns"),
        (
            &[("common/nats.yaml", "    - name: client\n      port: 4222", "    - name: client\n      port: 4223")],
            "has no port 4222",
        ),
        (
            &[(
                "proxy/router.yaml",
                "readinessProbe:\n            httpGet:",
                "readinessProbe:\n            tcpSocket:",
            )],
            "readinessProbe must be GET /health",
        ),
        (&[("picker/envoy.yaml", "request_body_mode: BUFFERED", "request_body_mode: STREAMED")], "must be BUFFERED"),
        (
            &[("picker/envoy.yaml", "port_value: 9002", "port_value: 8080")],
            "does not reach a router's ext_proc listener",
        ),
        (&[("picker/envoy.yaml", "match: {path: /v1/completions}", "match: {prefix: /}")], "routes (a prefix)"),
        (&[("picker/picker.yaml", "ext_proc_fallbacks = 0", "ext_proc_fallbacks = 1")], "lists ext_proc_fallbacks"),
    ];
    for (edits, want) in cases {
        let problems = problems_after(edits);
        assert!(problems.contains(want), "{edits:?}: no `{want}` in:\n{problems}");
    }
    assert_eq!(problems_after(&[]), "", "the unedited copy");
}
