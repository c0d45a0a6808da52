//! The engines' own multimodal-cache counters: after each passing health check of a vLLM worker its
//! `/metrics` is read (bounded) for `vllm:mm_cache_queries` and `vllm:mm_cache_hits` (images looked up
//! in its processor cache / found there), which the router mirrors per worker, so operators see on
//! their own fleet what the image-affinity term achieves. Nothing routes on them: they are aggregate
//! counters, naming no image.
//!
//! A disaggregated engine's KV-transfer counters are read from the same page (prompt tokens received
//! from another engine, NIXL transfers and their time), so `/metrics` shows the transfer as the engine
//! reports it beside the router's own leg timings.
//!
//! An engine serving LoRA adapters shows which it runs and queues now in the gauge
//! `vllm:lora_requests_info{running_lora_adapters="a,b",waiting_lora_adapters="c",max_lora="N"}` (one
//! series per label set ever seen, each valued at the time it was last set: the newest is now's). Its
//! adapters are kept on the worker as active (`routing::adapters`), which the `kv` cost prefers for an
//! adapter's requests. Bounded: a name over [`served::MAX_NAME`] bytes, or more names than
//! `max(max_lora, 1)` in running plus waiting (at most [`MAX_ACTIVE`]), and the reading is ignored.
//!
//! A worker's page is not trusted: a reading is mirrored only if it could be an engine's. Refused
//! (counted by reason, the last good reading kept): a value that is not a number, not finite,
//! negative, or over [`MAX_PLAUSIBLE`]; more hits than queries; hits fewer than last time while the
//! queries are not (an engine restart resets both, and shows as fewer queries).

use mmrouter_core::routing::{EngineKvTransfer, EngineMmCache, Worker};

use super::page::read_page;
use super::served;
use crate::observe::Observer;

/// Most active adapters taken from one reading (`max_lora` is the engine's slot count, each of
/// running and waiting bounded by it).
pub const MAX_ACTIVE: usize = 64;

/// A `/metrics` page larger than this is not read further (vLLM's is tens of KiB).
const MAX_PAGE_BYTES: usize = 4 << 20;

/// The largest count believed: 2^53, where an f64 (the exposition's numbers) stops holding every
/// integer. An engine looking up a million images a second would take 285 years to get there.
pub const MAX_PLAUSIBLE: u64 = 1 << 53;

/// Why a reading was not mirrored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Implausible {
    #[error("a counter's value is not a number")]
    NotANumber,
    #[error("a counter's value is not finite")]
    NotFinite,
    #[error("a counter is negative")]
    Negative,
    #[error("a counter is over 2^53")]
    TooLarge,
    #[error("more hits than queries")]
    HitsOverQueries,
    #[error("hits fell while queries did not")]
    Backwards,
}

impl Implausible {
    /// The `reason` label of `mmrouter_worker_engine_counters_refused_total`.
    pub fn label(self) -> &'static str {
        match self {
            Implausible::NotANumber => "not_a_number",
            Implausible::NotFinite => "not_finite",
            Implausible::Negative => "negative",
            Implausible::TooLarge => "implausible",
            Implausible::HitsOverQueries => "hits_over_queries",
            Implausible::Backwards => "backwards",
        }
    }
}

/// Reads one worker's counters and mirrors them if they make sense; a worker that does not answer,
/// or whose page lacks them, keeps its last reading.
pub async fn scrape(client: &reqwest::Client, w: &Worker, observe: &Observer) {
    let Some(page) = read(client, w.url()).await else { return };
    let page = String::from_utf8_lossy(&page);
    if let Some(active) = lora_active(&page) {
        w.set_engine_active_adapters(active);
    }
    match transfer(&page) {
        Ok(Some(t)) => w.set_engine_kv_transfer(t),
        Ok(None) => {}
        Err(why) => observe.engine_counters_refused(w.name(), why.label()),
    }
    match reading(&page, w.engine_mm_cache()) {
        Ok(Some(c)) => w.set_engine_mm_cache(c),
        Ok(None) => {}
        Err(why) => {
            tracing::debug!(worker = %w.name(), "engine counters refused: {why}");
            observe.engine_counters_refused(w.name(), why.label());
        }
    }
}

async fn read(client: &reqwest::Client, base: &str) -> Option<Vec<u8>> {
    read_page(client, base, "/metrics", MAX_PAGE_BYTES).await
}

/// The page's reading, checked against itself and the `last` one mirrored.
fn reading(page: &str, last: Option<EngineMmCache>) -> Result<Option<EngineMmCache>, Implausible> {
    let Some(now) = parse(page)? else { return Ok(None) };
    if now.hits > now.queries {
        return Err(Implausible::HitsOverQueries);
    }
    if last.is_some_and(|l| now.hits < l.hits && now.queries >= l.queries) {
        return Err(Implausible::Backwards);
    }
    Ok(Some(now))
}

/// The two counters from a Prometheus text page, summed over their label sets (one per engine rank);
/// `None` when the page has neither.
fn parse(page: &str) -> Result<Option<EngineMmCache>, Implausible> {
    let (mut queries, mut hits, mut seen) = (0u64, 0u64, false);
    for line in page.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = sample(line) else { continue };
        let target = match name {
            "vllm:mm_cache_queries_total" | "vllm:mm_cache_queries" => &mut queries,
            "vllm:mm_cache_hits_total" | "vllm:mm_cache_hits" => &mut hits,
            _ => continue,
        };
        *target = target.checked_add(count(value)?).filter(|&n| n <= MAX_PLAUSIBLE).ok_or(Implausible::TooLarge)?;
        seen = true;
    }
    Ok(seen.then_some(EngineMmCache { queries, hits }))
}

/// A disaggregated engine's transfer counters, summed over ranks; `None` when the page has none.
fn transfer(page: &str) -> Result<Option<EngineKvTransfer>, Implausible> {
    let (mut t, mut seen) = (EngineKvTransfer::default(), false);
    for line in page.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = sample(line) else { continue };
        let add = match name {
            "vllm:prompt_tokens_by_source_total" if line.contains("source=\"external_kv_transfer\"") => {
                (&mut t.tokens, count(value)?)
            }
            "vllm:nixl_xfer_time_seconds_count" => (&mut t.transfers, count(value)?),
            "vllm:nixl_xfer_time_seconds_sum" => (&mut t.micros, micros(value)?),
            _ => continue,
        };
        *add.0 = add.0.checked_add(add.1).filter(|&n| n <= MAX_PLAUSIBLE).ok_or(Implausible::TooLarge)?;
        seen = true;
    }
    Ok(seen.then_some(t))
}

/// The adapters of the newest `vllm:lora_requests_info` series (running and waiting, sorted); `None`
/// when the page has none, or its newest runs more adapters than its `max_lora` slots or names one
/// over [`served::MAX_NAME`] bytes. Waiting adapters beyond half of [`MAX_ACTIVE`] are dropped.
fn lora_active(page: &str) -> Option<Vec<String>> {
    let mut newest: Option<(f64, &str)> = None;
    for line in page.lines().filter(|l| l.starts_with("vllm:lora_requests_info{")) {
        let Some((_, value)) = sample(line) else { continue };
        let Ok(at) = value.parse::<f64>() else { continue };
        if at.is_finite() && newest.is_none_or(|(t, _)| at > t) {
            newest = Some((at, line));
        }
    }
    let line = newest?.1;
    let slots = label(line, "max_lora").and_then(|m| m.parse::<usize>().ok()).unwrap_or(1).clamp(1, MAX_ACTIVE / 2);
    let list = |key| label(line, key).map(|l| l.split(',').filter(|n| !n.is_empty()).collect::<Vec<_>>());
    let (running, mut waiting) = (list("running_lora_adapters")?, list("waiting_lora_adapters").unwrap_or_default());
    waiting.truncate(MAX_ACTIVE / 2);
    if running.len() > slots || running.iter().chain(&waiting).any(|n| n.len() > served::MAX_NAME) {
        return None;
    }
    let mut names: Vec<String> = running.into_iter().chain(waiting).map(str::to_owned).collect();
    names.sort();
    names.dedup();
    Some(names)
}

/// Label `key`'s value in a sample line; `None` if absent or escaped (vLLM's adapter lists and numbers
/// need no escapes, and a name with a quote or backslash is not one the router would send).
fn label<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let mut rest = &line[line.find('{')? + 1..];
    loop {
        let (name, after) = rest.split_once("=\"")?;
        let end = after.find('"')?;
        let value = &after[..end];
        if value.ends_with('\\') {
            return None;
        }
        if name.trim_start_matches(',').trim() == key {
            return Some(value);
        }
        rest = &after[end + 1..];
    }
}

/// A sum of seconds as whole microseconds.
fn micros(value: &str) -> Result<u64, Implausible> {
    let v = value.parse::<f64>().map_err(|_| Implausible::NotANumber)?;
    count(&(v * 1e6).to_string())
}

/// A sample's value as a whole count.
fn count(value: &str) -> Result<u64, Implausible> {
    let v = value.parse::<f64>().map_err(|_| Implausible::NotANumber)?;
    if !v.is_finite() {
        return Err(Implausible::NotFinite);
    }
    if v < 0.0 {
        return Err(Implausible::Negative);
    }
    if v > MAX_PLAUSIBLE as f64 {
        return Err(Implausible::TooLarge);
    }
    Ok(v as u64)
}

/// A sample line's metric name (without labels) and its value's text (a timestamp may follow it).
fn sample(line: &str) -> Option<(&str, &str)> {
    let name_end = line.find(['{', ' '])?;
    // Label values may hold spaces: the value starts after the label set's closing brace.
    let rest = if line[name_end..].starts_with('{') { &line[line.rfind('}')? + 1..] } else { &line[name_end..] };
    Some((&line[..name_end], rest.split_whitespace().next()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(queries: u64, hits: u64) -> EngineMmCache {
        EngineMmCache { queries, hits }
    }

    #[test]
    fn sums_the_counters_over_engine_ranks_and_skips_everything_else() {
        let page = "# HELP vllm:mm_cache_queries_total Multi-modal cache queries\n\
            # TYPE vllm:mm_cache_queries_total counter\n\
            vllm:mm_cache_queries_total{engine=\"0\",model_name=\"m\"} 10.0\n\
            vllm:mm_cache_queries_total{engine=\"1\",model_name=\"a } b\"} 5.0 1700000000000\n\
            vllm:mm_cache_hits_total{engine=\"0\",model_name=\"m\"} 7.0\n\
            vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 999.0\n\
            vllm:mm_cache_hits_created{engine=\"0\",model_name=\"m\"} 1.7e9\n";
        assert_eq!(reading(page, None), Ok(Some(counters(15, 7))));
        assert_eq!(reading("vllm:prompt_tokens_total 3\n", None), Ok(None));
    }

    #[test]
    fn a_decode_engines_transfer_counters_are_read() {
        let page = "vllm:prompt_tokens_by_source_total{engine=\"0\",source=\"local_compute\"} 5.0\n\
            vllm:prompt_tokens_by_source_total{engine=\"0\",source=\"external_kv_transfer\"} 140.0\n\
            vllm:nixl_xfer_time_seconds_count{engine=\"0\"} 2.0\n\
            vllm:nixl_xfer_time_seconds_sum{engine=\"0\"} 0.0125\n";
        assert_eq!(transfer(page), Ok(Some(EngineKvTransfer { tokens: 140, transfers: 2, micros: 12_500 })));
        assert_eq!(transfer("vllm:mm_cache_hits_total 3\n"), Ok(None));
        assert_eq!(transfer("vllm:nixl_xfer_time_seconds_sum -1\n"), Err(Implausible::Negative));
    }

    #[test]
    fn the_newest_lora_series_gives_the_active_adapters() {
        let page = "# TYPE vllm:lora_requests_info gauge\n\
            vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"old\",waiting_lora_adapters=\"\"} 1.7e9\n\
            vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"sql,chat\",waiting_lora_adapters=\"doc\"} 1.70000001e9\n\
            vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"} 1.6e9\n";
        assert_eq!(lora_active(page), Some(vec!["chat".into(), "doc".into(), "sql".into()]));
        let idle = "vllm:lora_requests_info{max_lora=\"1\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"} 5\n";
        assert_eq!(lora_active(idle), Some(Vec::new()));
        assert_eq!(lora_active("vllm:mm_cache_hits_total 3\n"), None);
        // More running than the engine's slots, or a name over the bound: not an engine's reading.
        let over =
            "vllm:lora_requests_info{max_lora=\"1\",running_lora_adapters=\"a,b\",waiting_lora_adapters=\"\"} 5\n";
        assert_eq!(lora_active(over), None);
        let long = format!(
            "vllm:lora_requests_info{{max_lora=\"1\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"\"}} 5\n",
            "x".repeat(served::MAX_NAME + 1)
        );
        assert_eq!(lora_active(&long), None);
        let queue: Vec<String> = (0..1000).map(|i| format!("w{i}")).collect();
        let many = format!(
            "vllm:lora_requests_info{{max_lora=\"1\",running_lora_adapters=\"\",waiting_lora_adapters=\"{}\"}} 5\n",
            queue.join(",")
        );
        assert_eq!(lora_active(&many).map(|v| v.len()), Some(MAX_ACTIVE / 2));
    }

    #[test]
    fn absurd_values_are_refused_by_reason() {
        let one = |q: &str, h: &str| {
            reading(&format!("vllm:mm_cache_queries_total {q}\nvllm:mm_cache_hits_total {h}\n"), None)
        };
        assert_eq!(one("NaN", "0"), Err(Implausible::NotFinite));
        assert_eq!(one("+Inf", "0"), Err(Implausible::NotFinite));
        assert_eq!(one("10", "-1"), Err(Implausible::Negative));
        assert_eq!(one("ten", "1"), Err(Implausible::NotANumber));
        assert_eq!(one("1.8e19", "0"), Err(Implausible::TooLarge));
        assert_eq!(one(&(MAX_PLAUSIBLE + 2).to_string(), "0"), Err(Implausible::TooLarge));
        assert_eq!(one(&MAX_PLAUSIBLE.to_string(), "0"), Ok(Some(counters(MAX_PLAUSIBLE, 0))));
        assert_eq!(one("10", "11"), Err(Implausible::HitsOverQueries));
        // Two ranks, each plausible, whose sum is not.
        let ranks = format!(
            "vllm:mm_cache_queries_total{{engine=\"0\"}} {m}\nvllm:mm_cache_queries_total{{engine=\"1\"}} {m}\n",
            m = MAX_PLAUSIBLE
        );
        assert_eq!(reading(&ranks, None), Err(Implausible::TooLarge));
    }

    #[test]
    fn a_restart_resets_but_hits_falling_alone_is_refused() {
        let page = |q: u64, h: u64| format!("vllm:mm_cache_queries_total {q}\nvllm:mm_cache_hits_total {h}\n");
        let last = Some(counters(100, 40));
        assert_eq!(reading(&page(120, 50), last), Ok(Some(counters(120, 50))));
        assert_eq!(reading(&page(3, 1), last), Ok(Some(counters(3, 1))), "an engine restart");
        assert_eq!(reading(&page(120, 30), last), Err(Implausible::Backwards));
        assert_eq!(reading(&page(100, 39), last), Err(Implausible::Backwards));
    }
}
