//! The configuration, in two forms (ripgrep's low-level → high-level arguments are the model):
//!
//! * [`ConfigFile`] ([`file`]): the TOML file as written (`config/mmrouter.toml` is the documented
//!   example). Every section rejects unknown keys, so a typo never silently becomes a default.
//! * [`Settings`] ([`settings`]): the same, validated once ([`build`]) into typed values (addresses,
//!   durations, the model source, the family). Everything at run time is built from a `Settings`;
//!   `demo` and the tests build one directly instead of writing TOML.
//! * [`ConfigFlags`] ([`flags`]): `serve`'s flags, as the file's keys they replace (TOML again, so
//!   `--print-config` shows a file that serves the same router).
//!
//! Every invalid value is reported with the key that holds it. Architecture invariant: this room imports
//! nothing of the crate — every other room may read its settings.

mod build;
mod cluster;
mod discovery;
mod dns;
mod file;
mod flags;
mod kv_events;
mod nats;
mod responses;
mod retries;
mod roles;
mod settings;
mod tracing;

pub use build::{check_worker_name, check_worker_url, worker_settings, MAX_WORKER_NAME_BYTES};
pub use cluster::{ClusterSection, ClusterSettings, PeerQuotas};
pub use discovery::DiscoverySection;
pub use file::{AuthSection, ConfigFile, LoadLoraAdapter, ModelSection, PoolSection, ServerSection, WorkerSection};
pub use flags::ConfigFlags;
pub use kv_events::KvEventsSection;
pub use nats::{NatsAuth, NatsSettings, NatsTls, Secret};
pub use responses::ResponsesConfig;
pub use retries::{RetryConfig, RetryConfigError};
pub use roles::{check_roles, engine_label, Member, RolesError};
pub use settings::{
    discovered_name, AuthSettings, ConnSettings, DiscoverySettings, DnsEntry, DnsLookup, EventSource, PoolSettings,
    ServerSettings, Settings, UpstreamAuth, WorkerSettings,
};
pub use tracing::TracingConfig;

#[cfg(test)]
mod tests {
    use super::*;
    use mmrouter_core::model::ModelSource;
    use mmrouter_core::routing::Engine;
    use std::time::Duration;

    const MIN: &str = "[[workers]]\nname = \"a\"\nurl = \"http://127.0.0.1:1\"\n";

    #[test]
    fn minimal_config_gets_defaults() {
        let c = Settings::parse(MIN).unwrap();
        assert_eq!(c.pools[0].pipeline.model.source, ModelSource::Bundled("qwen3-vl"));
        assert_eq!(c.pools[0].pipeline.model.name, "qwen3-vl");
        assert_eq!(c.pools[0].pipeline.model.block_size, 16);
        assert_eq!(c.pools[0].workers.len(), 1);
        assert_eq!(c.server.health_interval, Some(Duration::from_secs(2)));
    }

    #[test]
    fn every_invalid_value_names_its_key() {
        let cases = [
            ("[server]\nlisten = \"nope\"\n", "server.listen"),
            ("[server]\nmax_body_bytes = 0\n", "server.max_body_bytes"),
            ("[server]\nconnect_timeout_ms = 0\n", "server.connect_timeout_ms"),
            ("[server]\nupstream_idle_timeout_ms = 0\n", "server.upstream_idle_timeout_ms"),
            ("[retries]\nmax_attempts = 0\n", "retries.max_attempts"),
            ("[retries]\nbudget_ratio = -0.5\n", "retries.budget_ratio"),
            ("[retries]\nbogus = 1\n", "bogus"),
            ("[routing.ejection]\nfailure_rate = 2.0\n", "routing.ejection.failure_rate"),
            ("[routing.ejection]\nfailure_window = 0\n", "routing.ejection.failure_window"),
            ("[routing.ejection]\nbase_ejection_ms = 10\nmax_ejection_ms = 5\n", "routing.ejection.max_ejection_ms"),
            ("[model]\nblock_size = 0\n", "model.block_size"),
            ("[model]\nfamily = \"nonsense\"\n", "model.family"),
            ("[model]\ndir = \"/nonexistent/model\"\n", "model.dir"),
            ("[model]\nchat_template_content_format = \"xml\"\n", "model.chat_template_content_format"),
            ("[model]\nchat_template = \"/nonexistent/t.jinja\"\n", "model.chat_template"),
            ("[model]\nbogus = 1\n", "bogus"),
            ("[server]\nlisten = 5\n", "listen"),
            ("[kv_events]\nmax_message_bytes = 100\n", "kv_events.max_message_bytes"),
            ("[kv_events]\nmax_replay_buffer_bytes = 4294967296\n", "kv_events.max_replay_buffer_bytes"),
            ("[kv_events]\ndiscovery_max_bytes = 0\n", "kv_events.discovery_max_bytes"),
            ("[kv_events]\ndiscovery_allow_hosts = [\"\"]\n", "kv_events.discovery_allow_hosts"),
            ("[kv_events]\nmax_frames = 8\n", "max_frames"),
        ];
        for (extra, key) in cases {
            let err = Settings::parse(&format!("{extra}{MIN}")).unwrap_err().to_string();
            assert!(err.contains(key), "error for {extra:?} should name {key}: {err}");
        }
        let err = Settings::parse("").unwrap_err().to_string();
        assert!(err.contains("workers"), "{err}");
        let dup = format!("{MIN}{MIN}");
        assert!(Settings::parse(&dup).unwrap_err().to_string().contains("duplicate"));
        let bad_url = "[[workers]]\nname = \"a\"\nurl = \"ftp://x\"\n";
        assert!(Settings::parse(bad_url).unwrap_err().to_string().contains("workers[0].url"));
        for (extra, key) in [
            ("kv_events = \"http://x\"\n", "workers[0].kv_events"),
            ("kv_events_replay = \"tcp://127.0.0.1:5558\"\n", "workers[0].kv_events_replay"),
            ("data_parallel_size = 0\n", "workers[0].data_parallel_size"),
            ("data_parallel_size = 65\n", "workers[0].data_parallel_size"),
            ("engine = \"tgi\"\n", "engine"),
        ] {
            let err = Settings::parse(&format!("{MIN}{extra}")).unwrap_err().to_string();
            assert!(err.contains(key), "error for {extra:?} should name {key}: {err}");
        }
    }

    #[test]
    fn worker_names_are_bounded_and_printable() {
        let with_name = |name: &str| {
            let quoted = toml::Value::String(name.to_owned()).to_string();
            format!("[[workers]]\nname = {quoted}\nurl = \"http://127.0.0.1:1\"\n")
        };
        for bad in ["", "   ", "a\u{7}b", " padded", "x\ny"] {
            let err = Settings::parse(&with_name(bad)).unwrap_err().to_string();
            assert!(err.contains("workers[0].name"), "{bad:?}: {err}");
        }
        let long = "w".repeat(MAX_WORKER_NAME_BYTES + 1);
        assert!(Settings::parse(&with_name(&long)).unwrap_err().to_string().contains("at most 128 bytes"));
        for good in ["w", "gpu-07.rack_3:8000", "wörker 1", &"w".repeat(MAX_WORKER_NAME_BYTES)] {
            Settings::parse(&with_name(good)).unwrap_or_else(|e| panic!("{good:?}: {e}"));
        }
    }

    #[test]
    fn workers_may_publish_kv_events() {
        let text = format!(
            "{MIN}engine = \"sglang\"\nkv_events = \"tcp://127.0.0.1:5557\"\nkv_events_replay = \"tcp://127.0.0.1:5600\"\ndata_parallel_size = 2\n[[workers]]\nname = \"b\"\nurl = \"http://127.0.0.1:2\"\nkv_events = \"discover\"\n"
        );
        let c = Settings::parse(&text).unwrap();
        assert_eq!(c.pools[0].workers[0].spec.engine, Engine::Sglang);
        let want = EventSource::Endpoints {
            endpoint: "tcp://127.0.0.1:5557".into(),
            replay: Some("tcp://127.0.0.1:5600".into()),
            topic: String::new(),
            data_parallel_size: 2,
        };
        assert_eq!(c.pools[0].workers[0].events, Some(want));
        assert_eq!(c.pools[0].workers[1].events, Some(EventSource::Discover));
        assert_eq!(c.pools[0].workers[1].spec.engine, Engine::Vllm);
    }

    fn worker(name: &str, extra: &str) -> String {
        format!("[[workers]]\nname = \"{name}\"\nurl = \"http://127.0.0.1:1\"\n{extra}")
    }

    #[test]
    fn workers_have_roles() {
        use mmrouter_core::routing::Role;
        let text = [
            worker("p", "role = \"prefill\"\nengine = \"sglang\"\nbootstrap_port = 8998\n"),
            worker("d", "role = \"decode\"\nengine = \"sglang\"\n"),
            worker("a", ""),
        ]
        .concat();
        let c = Settings::parse(&text).unwrap();
        let got: Vec<_> = c.pools[0].workers.iter().map(|w| (w.spec.role, w.spec.bootstrap_port)).collect();
        assert_eq!(got, [(Role::Prefill, Some(8998)), (Role::Decode, None), (Role::Both, None)]);
        let epd = [
            worker("e", "role = \"encode\"\n"),
            worker("p", "role = \"prefill\"\n"),
            worker("d", "role = \"decode\"\n"),
        ];
        assert_eq!(Settings::parse(&epd.concat()).unwrap().pools[0].workers[0].spec.role, Role::Encode);
    }

    #[test]
    fn each_bad_role_setting_names_its_key() {
        let decode = worker("d", "role = \"decode\"\n");
        let cases = [
            (worker("a", "role = \"prefil\"\n"), "role: 'prefil' is not both, prefill, decode or encode"),
            (
                worker("p", "role = \"prefill\"\nengine = \"sglang\"\n") + &decode,
                "workers[0].bootstrap_port is required",
            ),
            (
                worker("p", "role = \"prefill\"\nbootstrap_port = 8998\n") + &decode,
                "workers[0].bootstrap_port is only for",
            ),
            (worker("a", "engine = \"sglang\"\nbootstrap_port = 8998\n"), "workers[0].bootstrap_port is only for"),
            (
                worker("p", "role = \"prefill\"\nengine = \"sglang\"\nbootstrap_port = 0\n") + &decode,
                "workers[0].bootstrap_port must be a port",
            ),
            (worker("a", "bootstrap_port = 70000\n"), "bootstrap_port"),
            (
                worker("e", "role = \"encode\"\nengine = \"sglang\"\n"),
                "workers[0].role = \"encode\" needs engine = \"vllm\"",
            ),
            // The pool's rules, naming the pool (the model's name for the one pool of a file).
            (worker("p", "role = \"prefill\"\n"), "workers: pool 'qwen3-vl' has prefill workers but no decode"),
            (worker("a", "") + &decode, "pool 'qwen3-vl' has decode workers but no prefill"),
            (worker("e", "role = \"encode\"\n"), "pool 'qwen3-vl' has encode workers but neither"),
            (worker("p", "role = \"prefill\"\nengine = \"sglang\"\nbootstrap_port = 1\n") + &decode, "mixes engines"),
        ];
        for (text, want) in cases {
            let err = Settings::parse(&text).unwrap_err().to_string();
            assert!(err.contains(want), "{text:?}: {err}");
        }
        let pools = "[[pools]]\nname = \"vl\"\nmodels = [\"m\"]\n[[pools.workers]]\nname = \"p\"\nurl = \"http://127.0.0.1:1\"\nrole = \"prefill\"\n";
        let err = Settings::parse(pools).unwrap_err().to_string();
        assert!(err.contains("pools[0].workers: pool 'vl' has prefill workers but no decode"), "{err}");
    }

    #[test]
    fn routing_takes_the_encoder_stage_keys() {
        use mmrouter_core::routing::EncodePolicy;
        let c = Settings::parse(&format!("[routing]\nencode_queue_weight = 0.5\nencode_policy = \"hash_ring\"\n{MIN}"))
            .unwrap();
        assert_eq!(
            (c.pools[0].routing.encode_queue_weight, c.pools[0].routing.encode_policy),
            (0.5, EncodePolicy::HashRing)
        );
        let err = Settings::parse(&format!("[routing]\nencode_queue_weight = -1.0\n{MIN}")).unwrap_err().to_string();
        assert!(err.contains("routing.encode_queue_weight"), "{err}");
        let err = Settings::parse(&format!("[routing]\nencode_policy = \"random\"\n{MIN}")).unwrap_err().to_string();
        assert!(err.contains("encode_policy"), "{err}");
    }

    #[test]
    fn health_interval_zero_disables_checks() {
        let c = Settings::parse(&format!("[server]\nhealth_interval_ms = 0\n{MIN}")).unwrap();
        assert_eq!(c.server.health_interval, None);
    }

    #[test]
    fn bundled_example_config_is_valid() {
        let text = include_str!("../../config/mmrouter.toml");
        Settings::parse(text).unwrap();
    }

    #[test]
    fn the_documented_example_config_is_valid() {
        let c = Settings::parse(include_str!("../../config/mmrouter.toml")).expect("config/mmrouter.toml parses");
        assert_eq!(c.pools.len(), 1);
        assert!(c.pools[0].models.is_empty(), "without [[pools]] the one pool serves any model");
    }
}
