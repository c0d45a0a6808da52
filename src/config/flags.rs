//! `mmrouter serve`'s config flags as the file's keys. The flags become TOML — over the file's own
//! TOML when there is one, each flag replacing its key — and that text goes through the file's
//! loader, so what `--print-config` shows, saved and served with `--config`, is the same router.

use mmrouter_core::model::ModelSource;
use mmrouter_core::routing::{Engine, Role};
use toml::{Table, Value};

use super::build::check_worker_url;
use super::roles::engine_label;

/// The flags that stand for config keys; `None` or empty leaves the file's key as written.
#[derive(Clone, Debug, Default)]
pub struct ConfigFlags {
    /// `[model] dir`.
    pub model_dir: Option<String>,
    /// Replaces `[[workers]]`: these URLs, named `worker-0`, `worker-1`, … (role `both`).
    pub workers: Vec<String>,
    /// With `workers`, replace `[[workers]]`: disaggregated workers, named by their role (`prefill-0`,
    /// `decode-0`, `encode-0`, …).
    pub prefill: Vec<String>,
    pub decode: Vec<String>,
    pub encode: Vec<String>,
    /// With `workers`, replace `[[workers]]`: DNS entries (`NAME:PORT`, A/AAAA records), named
    /// `dns-0`, … (docs/dns.md).
    pub worker_dns: Vec<String>,
    /// DNS entries with SRV records, named `srv-0`, ….
    pub worker_srv: Vec<String>,
    /// `bootstrap_port` of each `prefill` worker (SGLang).
    pub bootstrap_port: Option<u16>,
    /// `kv_events` of each flag worker: `discover` or one publisher endpoint (one worker).
    pub kv_events: Option<String>,
    /// `engine` of each flag worker.
    pub engine: Option<Engine>,
    /// `[model] block_size`.
    pub block_size: Option<u32>,
    /// `[server] listen`.
    pub listen: Option<String>,
    /// `[server] ext_proc_listen`.
    pub ext_proc_listen: Option<String>,
}

impl ConfigFlags {
    /// Whether the flags describe the pool (`--listen` alone does not: the file is the config).
    pub fn set_pool(&self) -> bool {
        self.model_dir.is_some() || self.has_workers() || self.block_size.is_some()
    }

    /// Whether a worker flag (`--worker`, `--prefill`, `--decode`, `--encode`, `--worker-dns`,
    /// `--worker-srv`) is given.
    fn has_workers(&self) -> bool {
        self.urls().next().is_some() || !self.worker_dns.is_empty() || !self.worker_srv.is_empty()
    }

    /// `--worker-dns NAME:PORT`, split.
    fn dns_names(&self) -> anyhow::Result<Vec<(&str, u16)>> {
        self.worker_dns
            .iter()
            .map(|v| split_port(v).ok_or_else(|| anyhow::anyhow!("--worker-dns: '{v}' is not NAME:PORT")))
            .collect()
    }

    /// Every flag worker: its flag, name, URL and role, in the order they are listed.
    fn urls(&self) -> impl Iterator<Item = (&'static str, String, &String, Role)> {
        let lists = [("worker", &self.workers, Role::Both), ("prefill", &self.prefill, Role::Prefill)]
            .into_iter()
            .chain([("decode", &self.decode, Role::Decode), ("encode", &self.encode, Role::Encode)]);
        lists.flat_map(|(flag, urls, role)| {
            urls.iter().enumerate().map(move |(i, url)| (flag, format!("{flag}-{i}"), url, role))
        })
    }

    /// The config file the flags amount to over `file` (its TOML), or alone (`None`: then
    /// `--model-dir` and one `--worker` at least are needed).
    pub fn to_toml(&self, file: Option<Table>) -> anyhow::Result<String> {
        self.check()?;
        let mut doc = match file {
            Some(doc) => doc,
            None => self.require_pool()?,
        };
        if self.set_pool() && doc.contains_key("pools") {
            anyhow::bail!(
                "--model-dir, --worker (--prefill, --decode, --encode) and --block-size describe the one pool of a \
                 file without [[pools]]; this file has [[pools]]: set the pools' keys in the file"
            );
        }
        if let Some(dir) = &self.model_dir {
            section(&mut doc, "model")?.insert("dir".into(), dir.clone().into());
        }
        if let Some(n) = self.block_size {
            section(&mut doc, "model")?.insert("block_size".into(), i64::from(n).into());
        }
        if self.has_workers() {
            doc.insert("workers".into(), Value::Array(self.worker_entries()));
        }
        if let Some(listen) = &self.listen {
            section(&mut doc, "server")?.insert("listen".into(), listen.clone().into());
        }
        if let Some(addr) = &self.ext_proc_listen {
            section(&mut doc, "server")?.insert("ext_proc_listen".into(), addr.clone().into());
        }
        toml::to_string(&doc).map_err(|e| anyhow::anyhow!("the config as TOML: {e}"))
    }

    /// Each flag on its own, so an error names the flag rather than the key it becomes.
    fn check(&self) -> anyhow::Result<()> {
        if let Some(dir) = &self.model_dir {
            ModelSource::parse(dir).map_err(|e| anyhow::anyhow!("--model-dir: {e}"))?;
        }
        for (flag, _, url, _) in self.urls() {
            check_worker_url(url).map_err(|e| anyhow::anyhow!("--{flag}: {e}"))?;
        }
        self.dns_names()?;
        if self.bootstrap_port.is_some() && self.prefill.is_empty() {
            anyhow::bail!("--bootstrap-port is the port of the --prefill workers' bootstrap server: give --prefill");
        }
        match self.kv_events.as_deref() {
            None | Some("discover") => {}
            Some(_) if self.urls().count() > 1 || !self.worker_dns.is_empty() || !self.worker_srv.is_empty() => {
                anyhow::bail!("--kv-events ENDPOINT names one publisher: give one --worker, or --kv-events discover")
            }
            Some(ep) => {
                mmrouter_kv_events::endpoint::Endpoint::parse(ep).map_err(|e| {
                    anyhow::anyhow!(
                        "--kv-events: '{ep}' is neither discover nor a ZMQ endpoint like tcp://host:5557 ({e})"
                    )
                })?;
            }
        }
        if let Some(n) = self.block_size.filter(|n| !(1..=4096).contains(n)) {
            anyhow::bail!("--block-size must be in 1..=4096 (got {n})");
        }
        if let Some(l) = self.listen.as_deref().filter(|l| l.parse::<std::net::SocketAddr>().is_err()) {
            anyhow::bail!("--listen: '{l}' is not an address like 127.0.0.1:8080");
        }
        if let Some(a) = self.ext_proc_listen.as_deref().filter(|a| a.parse::<std::net::SocketAddr>().is_err()) {
            anyhow::bail!("--ext-proc-listen: '{a}' is not an address like 127.0.0.1:9002");
        }
        Ok(())
    }

    /// Without a file the flags are the whole config: a model and its workers.
    fn require_pool(&self) -> anyhow::Result<Table> {
        if self.model_dir.is_none() {
            anyhow::bail!(
                "--model-dir: give the model the workers serve (a bundled profile like qwen3-vl, or an HF \
                 model directory), or a config file with --config"
            );
        }
        if !self.has_workers() {
            anyhow::bail!(
                "--worker: give at least one worker base URL (--worker http://HOST:PORT, or --prefill and --decode \
                 for disaggregated serving), or a config file with --config"
            );
        }
        Ok(Table::new())
    }

    fn worker_entries(&self) -> Vec<Value> {
        let entry = |(_, name, url, role): (&str, String, &String, Role)| {
            let mut w = Table::new();
            w.insert("name".into(), name.into());
            w.insert("url".into(), url.clone().into());
            if let Some(engine) = self.engine {
                w.insert("engine".into(), engine_label(engine).into());
            }
            // `both` is the default: a file of aggregated workers prints as it always did.
            if role != Role::Both {
                w.insert("role".into(), role.label().into());
            }
            if let Some(port) = self.bootstrap_port.filter(|_| role == Role::Prefill) {
                w.insert("bootstrap_port".into(), i64::from(port).into());
            }
            if let Some(events) = &self.kv_events {
                w.insert("kv_events".into(), events.clone().into());
            }
            Value::Table(w)
        };
        let mut out: Vec<Value> = self.urls().map(entry).collect();
        out.extend(self.dns_entries());
        out
    }

    /// `--worker-dns` and `--worker-srv` as `[[workers]]` DNS entries.
    fn dns_entries(&self) -> Vec<Value> {
        let dns = self.dns_names().unwrap_or_default().into_iter().enumerate().map(|(i, (name, port))| {
            let mut w = Table::new();
            w.insert("name".into(), format!("dns-{i}").into());
            w.insert("dns".into(), name.into());
            w.insert("port".into(), i64::from(port).into());
            w
        });
        let srv = self.worker_srv.iter().enumerate().map(|(i, name)| {
            let mut w = Table::new();
            w.insert("name".into(), format!("srv-{i}").into());
            w.insert("dns_srv".into(), name.clone().into());
            w
        });
        let with_keys = |mut w: Table| {
            if let Some(engine) = self.engine {
                w.insert("engine".into(), engine_label(engine).into());
            }
            if let Some(events) = &self.kv_events {
                w.insert("kv_events".into(), events.clone().into());
            }
            Value::Table(w)
        };
        dns.chain(srv).map(with_keys).collect()
    }
}

/// `NAME:PORT`, the port in 1..=65535.
fn split_port(v: &str) -> Option<(&str, u16)> {
    let (name, port) = v.rsplit_once(':')?;
    Some((name, port.parse::<u16>().ok().filter(|p| *p > 0)?))
}

/// The file's `[name]` table, created when absent.
fn section<'a>(doc: &'a mut Table, name: &str) -> anyhow::Result<&'a mut Table> {
    doc.entry(name)
        .or_insert_with(|| Value::Table(Table::new()))
        .as_table_mut()
        .ok_or_else(|| anyhow::anyhow!("{name}: expected a table ([{name}]) in the config file"))
}

#[cfg(test)]
mod tests {
    use super::super::settings::{EventSource, Settings};
    use super::*;

    fn table(text: &str) -> Option<Table> {
        Some(toml::from_str(text).unwrap())
    }

    fn flags(dir: &str, workers: &[&str]) -> ConfigFlags {
        ConfigFlags {
            model_dir: Some(dir.into()),
            workers: workers.iter().map(|w| w.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn flags_alone_are_a_one_pool_file() {
        let f = ConfigFlags {
            kv_events: Some("discover".into()),
            listen: Some("0.0.0.0:9000".into()),
            ext_proc_listen: Some("127.0.0.1:9002".into()),
            ..flags("qwen3-vl", &["http://127.0.0.1:8001", "http://127.0.0.1:8002"])
        };
        let text = f.to_toml(None).unwrap();
        let c = Settings::parse(&text).unwrap();
        assert_eq!(c.server.listen.to_string(), "0.0.0.0:9000");
        assert_eq!(c.server.ext_proc_listen.map(|a| a.to_string()).as_deref(), Some("127.0.0.1:9002"));
        let names: Vec<_> = c.pools[0].workers.iter().map(|w| (w.spec.name.as_str(), w.spec.url.as_str())).collect();
        assert_eq!(names, [("worker-0", "http://127.0.0.1:8001"), ("worker-1", "http://127.0.0.1:8002")]);
        assert!(c.pools[0].workers.iter().all(|w| w.events == Some(EventSource::Discover)));
        assert_eq!(c.pools[0].pipeline.model.name, "qwen3-vl");
    }

    /// The rule: each flag replaces its key (the whole `[[workers]]` list for `--worker`); every other
    /// key of the file stays as written.
    #[test]
    fn flags_override_the_files_keys_and_keep_the_rest() {
        let file = "[server]\nlisten = \"127.0.0.1:7000\"\nmax_connections = 7\n[model]\ndir = \"qwen2.5-vl\"\nblock_size = 32\n\
                    [[workers]]\nname = \"a\"\nurl = \"http://127.0.0.1:1\"\n[[workers]]\nname = \"b\"\nurl = \"http://127.0.0.1:2\"\n";
        let c = Settings::parse(&flags("qwen3-vl", &["http://127.0.0.1:3"]).to_toml(table(file)).unwrap()).unwrap();
        assert_eq!(c.pools[0].pipeline.model.name, "qwen3-vl");
        assert_eq!(c.pools[0].pipeline.model.block_size, 32);
        assert_eq!(c.pools[0].workers.len(), 1);
        assert_eq!(c.pools[0].workers[0].spec.url, "http://127.0.0.1:3");
        assert_eq!((c.server.listen.port(), c.server.conn.max_connections), (7000, Some(7)));
        // No flag: the file as written.
        assert_eq!(
            Settings::parse(&ConfigFlags::default().to_toml(table(file)).unwrap()).unwrap(),
            Settings::parse(file).unwrap()
        );
    }

    /// Role flags add to `--worker`'s list, each worker named by its flag: names stay unique.
    #[test]
    fn role_flags_are_workers_named_by_their_role() {
        let f = ConfigFlags {
            prefill: vec!["http://p:1".into(), "http://p:2".into()],
            decode: vec!["http://d:1".into()],
            encode: vec!["http://e:1".into()],
            ..flags("qwen3-vl", &["http://w:1"])
        };
        let c = Settings::parse(&f.to_toml(None).unwrap()).unwrap();
        let got: Vec<_> =
            c.pools[0].workers.iter().map(|w| (w.spec.name.as_str(), w.spec.url.as_str(), w.spec.role)).collect();
        let want = [
            ("worker-0", "http://w:1", Role::Both),
            ("prefill-0", "http://p:1", Role::Prefill),
            ("prefill-1", "http://p:2", Role::Prefill),
            ("decode-0", "http://d:1", Role::Decode),
            ("encode-0", "http://e:1", Role::Encode),
        ];
        assert_eq!(got, want);
        // SGLang P/D: the prefill workers' bootstrap port, on them only.
        let sglang = ConfigFlags {
            engine: Some(Engine::Sglang),
            bootstrap_port: Some(8998),
            prefill: vec!["http://p:1".into()],
            decode: vec!["http://d:1".into()],
            ..flags("qwen3-vl", &[])
        };
        let c = Settings::parse(&sglang.to_toml(None).unwrap()).unwrap();
        let ports: Vec<_> = c.pools[0].workers.iter().map(|w| w.spec.bootstrap_port).collect();
        assert_eq!(ports, [Some(8998), None]);
    }

    #[test]
    fn each_bad_flag_is_named() {
        let one = || flags("qwen3-vl", &["http://127.0.0.1:1"]);
        let cases = [
            (ConfigFlags { model_dir: Some("/nonexistent/model".into()), ..one() }, "--model-dir"),
            (ConfigFlags { workers: vec!["ftp://x".into()], ..one() }, "--worker"),
            (ConfigFlags { kv_events: Some("http://x".into()), ..one() }, "--kv-events"),
            (
                ConfigFlags {
                    kv_events: Some("tcp://127.0.0.1:5557".into()),
                    ..flags("qwen3-vl", &["http://a:1", "http://b:1"])
                },
                "--kv-events",
            ),
            (ConfigFlags { block_size: Some(0), ..one() }, "--block-size"),
            (ConfigFlags { listen: Some("localhost".into()), ..one() }, "--listen"),
            (ConfigFlags { ext_proc_listen: Some("localhost".into()), ..one() }, "--ext-proc-listen"),
            (ConfigFlags { model_dir: None, ..one() }, "--model-dir"),
            (ConfigFlags { workers: Vec::new(), ..one() }, "--worker"),
            (ConfigFlags { prefill: vec!["ftp://x".into()], ..one() }, "--prefill"),
            (ConfigFlags { decode: vec!["nope".into()], ..one() }, "--decode"),
            (ConfigFlags { encode: vec!["http://".into()], ..one() }, "--encode"),
            (ConfigFlags { bootstrap_port: Some(8998), ..one() }, "--bootstrap-port"),
            (
                ConfigFlags {
                    kv_events: Some("tcp://127.0.0.1:5557".into()),
                    decode: vec!["http://d:1".into()],
                    ..one()
                },
                "--kv-events",
            ),
        ];
        for (f, name) in cases {
            let err = f.to_toml(None).unwrap_err().to_string();
            assert!(err.starts_with(name), "{f:?}: {err}");
        }
        let pools =
            "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\nworkers = [{ name = \"a\", url = \"http://127.0.0.1:1\" }]\n";
        assert!(one().to_toml(table(pools)).unwrap_err().to_string().contains("[[pools]]"));
        let listen_only = ConfigFlags { listen: Some("127.0.0.1:0".into()), ..Default::default() };
        assert!(listen_only.to_toml(table(pools)).is_ok(), "--listen applies to any file");
    }
}

#[cfg(test)]
mod dns_flag_tests {
    use super::super::settings::{DnsLookup, EventSource, Settings};
    use super::*;

    #[test]
    fn dns_flags_are_dns_entries() {
        let f = ConfigFlags {
            model_dir: Some("qwen3-vl".into()),
            worker_dns: vec!["vllm-headless.default.svc:8000".into()],
            worker_srv: vec!["_http._tcp.vllm.default.svc".into()],
            kv_events: Some("discover".into()),
            ..Default::default()
        };
        let c = Settings::parse(&f.to_toml(None).unwrap()).unwrap();
        let entries: Vec<_> = c.discovery.entries.iter().map(|e| (e.name.as_str(), &e.lookup)).collect();
        assert_eq!(
            entries,
            [
                ("dns-0", &DnsLookup::Addresses { host: "vllm-headless.default.svc".into(), port: 8000 }),
                ("srv-0", &DnsLookup::Srv { name: "_http._tcp.vllm.default.svc".into() }),
            ]
        );
        assert!(c.discovery.entries.iter().all(|e| e.template.events == Some(EventSource::Discover)));
        for (bad, want) in [("vllm", "--worker-dns: 'vllm' is not NAME:PORT"), ("vllm:0", "is not NAME:PORT")] {
            let f =
                ConfigFlags { model_dir: Some("qwen3-vl".into()), worker_dns: vec![bad.into()], ..Default::default() };
            let e = f.to_toml(None).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        let endpoint = ConfigFlags { kv_events: Some("tcp://127.0.0.1:5557".into()), ..f };
        assert!(endpoint.to_toml(None).unwrap_err().to_string().contains("--kv-events ENDPOINT names one publisher"));
    }
}
