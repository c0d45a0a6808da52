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
//! A worker's page is not trusted: a reading is mirrored only if it could be an engine's. Refused
//! (counted by reason, the last good reading kept): a value that is not a number, not finite,
//! negative, or over [`MAX_PLAUSIBLE`]; more hits than queries; hits fewer than last time while the
//! queries are not (an engine restart resets both, and shows as fewer queries).

use mmrouter_core::routing::{EngineKvTransfer, EngineMmCache, Worker};

use crate::observe::Observer;

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

/// A worker's page at `path`, whole, if it answers 2xx within `limit` bytes (a larger one is not read
/// further: a worker's pages are untrusted).
pub(super) async fn read_page(client: &reqwest::Client, base: &str, path: &str, limit: usize) -> Option<Vec<u8>> {
    let url = format!("{}{path}", base.trim_end_matches('/'));
    let mut resp = client.get(url).send().await.ok()?;
    if !resp.status().is_success() || resp.content_length().is_some_and(|n| n > limit as u64) {
        return None;
    }
    let mut page = Vec::new();
    while let Some(chunk) = resp.chunk().await.ok()? {
        if page.len() + chunk.len() > limit {
            return None;
        }
        page.extend_from_slice(&chunk);
    }
    Some(page)
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
