//! Workers from DNS: a task that resolves each DNS worker entry every `discovery.interval_ms` and
//! makes its pool's workers follow the answer — a new address joins through the admin API's
//! transactional add (its checks, its feeds, KV-event discovery), a vanished one is drained and
//! removed once idle (the admin API's removal).
//!
//! A discovered worker is owned by its entry: named `{entry}@{address}:{port}`, added and removed
//! only here. The admin API may drain one (it stays out of rotation until its address leaves DNS) or
//! remove one (it comes back at the next resolution while its address is listed); a reload's worker
//! changes never touch them (they are in no file's worker list), and a reload that adds, changes or
//! removes DNS entries is followed at the next resolution.
//!
//! What an answer does:
//! * records: the workers are exactly those addresses (at most `max_addresses`, the first by address;
//!   the rest dropped and counted `truncated`);
//! * a timeout, SERVFAIL, a refused query, an unreachable nameserver: nothing changes (`failed`) — a
//!   resolver's hiccup never drains a pool;
//! * an authoritative "no such name" or "no records" (`empty`): the set is kept the first time, and
//!   drained when the next resolution says the same (a Service scaled to zero, a Consul service with no
//!   healthy instance), so one stray answer cannot empty a pool.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;

use hickory_resolver::config::{NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::NetError;
use hickory_resolver::proto::rr::RData;
use hickory_resolver::TokioResolver;

use super::list::Pools;
use super::workers::ChangeError;
use crate::config::{DiscoverySettings, DnsEntry, DnsLookup, WorkerSettings};

/// An empty answer drains an entry's workers only when this many resolutions in a row give it.
const EMPTY_ROUNDS_TO_DRAIN: u32 = 2;

/// What one resolution of an entry gave.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// These addresses (sorted, unique, bounded).
    Found(Vec<SocketAddr>),
    /// The name exists with no such records, or does not exist (an authoritative answer).
    Empty,
    /// No answer (timeout, server failure, network): the set is kept.
    Failed(String),
}

/// `mmrouter_dns_resolutions_total`'s `outcome` label.
fn outcome(answer: &Answer, truncated: bool) -> &'static str {
    match answer {
        Answer::Found(_) if truncated => "truncated",
        Answer::Found(_) => "ok",
        Answer::Empty => "empty",
        Answer::Failed(_) => "failed",
    }
}

/// One entry's state between resolutions.
#[derive(Default)]
struct Owned {
    /// The workers this entry added and has not retired, with the settings they were added with.
    workers: BTreeMap<String, WorkerSettings>,
    /// Empty answers in a row.
    empty_rounds: u32,
}

/// The changes that bring an entry's workers to `target`.
#[derive(Debug, Default, PartialEq)]
struct Plan {
    /// Names to drain and remove (gone from DNS, or to be replaced by new settings).
    remove: Vec<String>,
    add: Vec<WorkerSettings>,
}

/// Diffs `owned` against `target`; `present(name)`: the pool still has that worker (a rebuilt pool or
/// an admin removal lost it: it is added again).
fn plan(
    owned: &BTreeMap<String, WorkerSettings>,
    target: &BTreeMap<String, WorkerSettings>,
    present: impl Fn(&str) -> bool,
) -> Plan {
    let mut p = Plan::default();
    for (name, was) in owned {
        match target.get(name) {
            None => p.remove.push(name.clone()),
            Some(now) if now != was && present(name) => p.remove.push(name.clone()),
            Some(_) => {}
        }
    }
    for (name, now) in target {
        if owned.get(name) != Some(now) || !present(name) {
            p.add.push(now.clone());
        }
    }
    p
}

/// The workers an answer asks for, by name.
fn targets(entry: &DnsEntry, addrs: &[SocketAddr]) -> BTreeMap<String, WorkerSettings> {
    addrs.iter().map(|&a| entry.worker(a)).map(|w| (w.spec.name.clone(), w)).collect()
}

/// Sorted, unique, at most `max`; whether some were dropped.
fn bounded(mut addrs: Vec<SocketAddr>, max: usize) -> (Vec<SocketAddr>, bool) {
    addrs.sort();
    addrs.dedup();
    let truncated = addrs.len() > max;
    addrs.truncate(max);
    (addrs, truncated)
}

/// Starts the resolution loop (it does nothing while no pool has DNS entries; a reload may add some).
pub fn spawn_dns(pools: &Arc<Pools>, discovery: &DiscoverySettings) {
    let weak = Arc::downgrade(pools);
    let settings = discovery.clone();
    tokio::spawn(async move {
        let mut watch = Watch { settings, resolver: None, state: BTreeMap::new() };
        loop {
            let Some(pools) = weak.upgrade() else { return };
            let entries = pools.changes().discovery.entries.clone();
            if !entries.is_empty() && watch.resolver.is_none() {
                watch.resolver = build_resolver(&watch.settings)
                    .inspect_err(|e| tracing::error!("DNS workers: cannot set up the resolver: {e}"))
                    .ok();
            }
            watch.round(&pools, &entries).await;
            drop(pools);
            tokio::time::sleep(watch.settings.interval).await;
        }
    });
}

/// The resolution loop's state.
struct Watch {
    settings: DiscoverySettings,
    /// Built when there is a first entry to resolve.
    resolver: Option<TokioResolver>,
    /// By (pool, entry name).
    state: BTreeMap<(String, String), Owned>,
}

/// The resolver: the configured nameserver, or the system's.
fn build_resolver(d: &DiscoverySettings) -> Result<TokioResolver, NetError> {
    let mut builder = match d.nameserver {
        Some(ns) => {
            let mut server = NameServerConfig::udp_and_tcp(ns.ip());
            for c in &mut server.connections {
                c.port = ns.port();
            }
            let config = ResolverConfig::from_name_servers(vec![server]);
            TokioResolver::builder_with_config(config, TokioRuntimeProvider::default())
        }
        None => TokioResolver::builder_tokio()?,
    };
    let opts = builder.options_mut();
    opts.timeout = d.timeout;
    opts.attempts = 1;
    builder.build()
}

impl Watch {
    /// One resolution of every entry, and the changes each answer asks for.
    async fn round(&mut self, pools: &Arc<Pools>, entries: &[DnsEntry]) {
        // Entries a reload removed (or whose pool it removed): their workers go.
        let keys: BTreeSet<(String, String)> = entries.iter().map(|e| (e.pool.clone(), e.name.clone())).collect();
        let gone: Vec<_> = self.state.keys().filter(|k| !keys.contains(*k)).cloned().collect();
        for key in gone {
            if let Some(owned) = self.state.remove(&key) {
                retire_all(pools, owned.workers.keys());
                pools.observe.dns_workers(&format!("{}/{}", key.0, key.1), 0);
            }
        }
        let Some(r) = &self.resolver else { return };
        // Each round asks the nameserver again: the interval is the refresh, not the records' TTL.
        r.clear_cache();
        let d = &self.settings;
        for entry in entries {
            let answer = match tokio::time::timeout(d.timeout, resolve(r, &entry.lookup)).await {
                Ok(a) => a,
                Err(_) => Answer::Failed(format!("no answer within {:?}", d.timeout)),
            };
            let owned = self.state.entry((entry.pool.clone(), entry.name.clone())).or_default();
            owned.follow(pools, entry, answer, d.max_addresses);
        }
    }
}

impl Owned {
    /// Applies one answer to this entry's workers.
    fn follow(&mut self, pools: &Arc<Pools>, entry: &DnsEntry, answer: Answer, max: usize) {
        let label = entry.label();
        let (answer, truncated) = match answer {
            Answer::Found(a) => {
                let (a, t) = bounded(a, max);
                (Answer::Found(a), t)
            }
            other => (other, false),
        };
        pools.observe.dns_resolution(&label, outcome(&answer, truncated));
        if truncated {
            tracing::warn!(entry = %label, max, "DNS workers: more addresses than discovery.max_addresses; the first kept");
        }
        let Some(target) = self.target(entry, answer) else { return };
        let pool = pools.list().iter().find(|p| p.name == entry.pool).cloned();
        let present = |name: &str| pool.as_ref().is_some_and(|p| p.router.lookup(name).is_some());
        let changes = plan(&self.workers, &target, present);
        self.apply(pools, entry, changes);
        pools.observe.dns_workers(&label, self.workers.len());
    }

    /// The workers `answer` asks for; `None`: keep them as they are.
    fn target(&mut self, entry: &DnsEntry, answer: Answer) -> Option<BTreeMap<String, WorkerSettings>> {
        match answer {
            Answer::Found(addrs) => {
                self.empty_rounds = 0;
                Some(targets(entry, &addrs))
            }
            Answer::Empty => {
                self.empty_rounds += 1;
                let confirmed = self.empty_rounds >= EMPTY_ROUNDS_TO_DRAIN;
                if !confirmed && !self.workers.is_empty() {
                    tracing::warn!(entry = %entry.label(), "DNS workers: no records; kept until the next answer agrees");
                }
                confirmed.then(BTreeMap::new)
            }
            Answer::Failed(why) => {
                tracing::warn!(entry = %entry.label(), "DNS workers: resolution failed, workers kept: {why}");
                None
            }
        }
    }

    /// Retires, then adds (a replaced worker's successor takes its name once the old one drains).
    fn apply(&mut self, pools: &Arc<Pools>, entry: &DnsEntry, changes: Plan) {
        retire_all(pools, changes.remove.iter());
        for name in &changes.remove {
            self.workers.remove(name);
        }
        for w in changes.add {
            // Discovered workers follow DNS: the pool's role rules were checked on the entry's template.
            match pools.add_worker(&entry.pool, &w, true) {
                Ok(_) => {
                    tracing::info!(entry = %entry.label(), worker = %w.spec.name, "DNS workers: worker added");
                    self.workers.insert(w.spec.name.clone(), w);
                }
                Err(e) => {
                    pools.observe.dns_resolution(&entry.label(), "refused");
                    tracing::warn!(entry = %entry.label(), worker = %w.spec.name, "DNS workers: not added: {e}");
                }
            }
        }
    }
}

/// Drains each named worker and removes it once idle (a worker already gone is fine).
fn retire_all<'a>(pools: &Arc<Pools>, names: impl Iterator<Item = &'a String>) {
    for name in names {
        match pools.remove_worker(name, true) {
            Ok(()) => tracing::info!(worker = %name, "DNS workers: address gone, worker draining"),
            Err(ChangeError::NotFound(_)) => {}
            Err(e) => tracing::warn!(worker = %name, "DNS workers: not removed: {e}"),
        }
    }
}

/// Resolves one entry.
async fn resolve(r: &TokioResolver, lookup: &DnsLookup) -> Answer {
    match lookup {
        DnsLookup::Addresses { host, port } => match r.lookup_ip(host.as_str()).await {
            Ok(ips) => Answer::Found(ips.iter().map(|ip| SocketAddr::new(ip, *port)).collect()),
            Err(e) => failed(e),
        },
        DnsLookup::Srv { name } => resolve_srv(r, name).await,
    }
}

/// SRV records, then each target's addresses on the record's port. A target that does not resolve
/// contributes nothing; one that fails fails the whole answer (a partial set would drain workers).
async fn resolve_srv(r: &TokioResolver, name: &str) -> Answer {
    let records = match r.srv_lookup(name).await {
        Ok(l) => l,
        Err(e) => return failed(e),
    };
    let srv = records.answers().iter().filter_map(|rec| match &rec.data {
        RData::SRV(s) if s.port > 0 => Some((s.target.to_ascii(), s.port)),
        _ => None,
    });
    let mut by_target: BTreeMap<String, BTreeSet<u16>> = BTreeMap::new();
    for (target, port) in srv {
        by_target.entry(target).or_default().insert(port);
    }
    let mut addrs = Vec::new();
    for (target, ports) in by_target {
        match r.lookup_ip(target.as_str()).await {
            Ok(ips) => addrs.extend(ips.iter().flat_map(|ip| ports.iter().map(move |&p| SocketAddr::new(ip, p)))),
            Err(e) if e.is_no_records_found() => {}
            Err(e) => return Answer::Failed(format!("target {target}: {e}")),
        }
    }
    if addrs.is_empty() {
        return Answer::Empty;
    }
    Answer::Found(addrs)
}

fn failed(e: NetError) -> Answer {
    if e.is_no_records_found() {
        Answer::Empty
    } else {
        Answer::Failed(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Settings;

    fn entry(toml_entry: &str) -> DnsEntry {
        let text = format!("[[workers]]\nname = \"vllm\"\n{toml_entry}");
        Settings::parse(&text).unwrap().discovery.entries.remove(0)
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn discovered_workers_are_named_by_entry_and_address() {
        let e = entry("dns = \"vllm.default.svc\"\nport = 8000\nkv_events = \"discover\"\nrole = \"decode\"\n[[workers]]\nname = \"p\"\nurl = \"http://127.0.0.1:1\"\nrole = \"prefill\"\n");
        let w = e.worker(addr("10.0.0.5:8000"));
        assert_eq!((w.spec.name.as_str(), w.spec.url.as_str()), ("vllm@10.0.0.5:8000", "http://10.0.0.5:8000"));
        assert_eq!(w.spec.role, mmrouter_core::routing::Role::Decode);
        assert_eq!(w.events, Some(crate::config::EventSource::Discover));
        let v6 = e.worker(addr("[fd00::7]:8000"));
        assert_eq!((v6.spec.name.as_str(), v6.spec.url.as_str()), ("vllm@[fd00::7]:8000", "http://[fd00::7]:8000"));
        let https = entry("dns_srv = \"_http._tcp.vllm\"\nscheme = \"https\"\n").worker(addr("10.0.0.6:9000"));
        assert_eq!(https.spec.url, "https://10.0.0.6:9000");
    }

    #[test]
    fn the_plan_adds_new_addresses_and_removes_vanished_ones() {
        let e = entry("dns = \"vllm\"\nport = 8000\n");
        let owned = targets(&e, &[addr("10.0.0.1:8000"), addr("10.0.0.2:8000")]);
        let target = targets(&e, &[addr("10.0.0.2:8000"), addr("10.0.0.3:8000")]);
        let p = plan(&owned, &target, |_| true);
        assert_eq!(p.remove, ["vllm@10.0.0.1:8000"]);
        let added: Vec<_> = p.add.iter().map(|w| w.spec.name.as_str()).collect();
        assert_eq!(added, ["vllm@10.0.0.3:8000"]);
        // The same answer again changes nothing.
        assert_eq!(plan(&target, &target, |_| true), Plan::default());
        // Nothing listed: everything goes.
        assert_eq!(plan(&owned, &BTreeMap::new(), |_| true).remove.len(), 2);
    }

    #[test]
    fn a_lost_worker_is_added_again_and_a_changed_template_replaces() {
        let e = entry("dns = \"vllm\"\nport = 8000\n");
        let owned = targets(&e, &[addr("10.0.0.1:8000")]);
        // A rebuilt pool (or an admin removal) lost it: added again, nothing to remove.
        let p = plan(&owned, &owned, |_| false);
        assert_eq!((p.remove.len(), p.add.len()), (0, 1));
        // A reload changed the entry's keys: the worker is replaced under its name.
        let changed =
            targets(&entry("dns = \"vllm\"\nport = 8000\nkv_events = \"discover\"\n"), &[addr("10.0.0.1:8000")]);
        let p = plan(&owned, &changed, |_| true);
        assert_eq!((p.remove, p.add), (vec!["vllm@10.0.0.1:8000".to_owned()], changed.into_values().collect()));
    }

    #[test]
    fn answers_are_bounded_sorted_and_labelled() {
        let many: Vec<SocketAddr> = (0..10u8).rev().map(|i| SocketAddr::from(([10, 0, 0, i], 80))).collect();
        let (kept, truncated) = bounded(many.iter().chain(&many).copied().collect(), 4);
        assert!(truncated);
        assert_eq!(kept, (0..4u8).map(|i| SocketAddr::from(([10, 0, 0, i], 80))).collect::<Vec<_>>());
        assert_eq!(
            bounded(many.clone(), 10),
            (
                {
                    let mut s = many.clone();
                    s.sort();
                    s
                },
                false
            )
        );
        assert_eq!(outcome(&Answer::Found(vec![]), true), "truncated");
        assert_eq!(outcome(&Answer::Empty, false), "empty");
        assert_eq!(outcome(&Answer::Failed("x".into()), false), "failed");
    }

    #[test]
    fn the_admin_api_cannot_add_a_dns_entry() {
        let w: crate::config::WorkerSection =
            serde_json::from_str(r#"{"name": "v", "dns": "v", "port": 8000}"#).unwrap();
        let e = crate::config::worker_settings("worker", &w).unwrap_err().to_string();
        assert!(e.contains("belong to a config file's DNS entries"), "{e}");
    }
}
