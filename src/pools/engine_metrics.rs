//! The engines' own multimodal-cache counters: at each health-check round every healthy vLLM worker's
//! `/metrics` is read (bounded) for `vllm:mm_cache_queries` and `vllm:mm_cache_hits` (images looked up
//! in its processor cache / found there), which the router mirrors per worker, so operators see on
//! their own fleet what the image-affinity term achieves. Nothing routes on them: they are aggregate
//! counters, naming no image.

use mmrouter_core::routing::{Engine, EngineMmCache, Router};

/// A `/metrics` page larger than this is not read further (vLLM's is tens of KiB).
const MAX_PAGE_BYTES: usize = 4 << 20;

/// Reads the counters of every healthy vLLM worker of a pool, concurrently; a worker that does not
/// answer, or whose page lacks them, keeps its last reading.
pub async fn scrape_pool(client: &reqwest::Client, router: &Router) {
    let live = router.live_workers();
    let vllm: Vec<_> = live.iter().filter(|(_, w)| w.engine() == Engine::Vllm && w.is_healthy()).collect();
    let reads = vllm.iter().map(|(_, w)| read(client, w.url()));
    let results = futures_util::future::join_all(reads).await;
    for ((_, w), counters) in vllm.iter().zip(results) {
        if let Some(c) = counters {
            w.set_engine_mm_cache(c);
        }
    }
}

async fn read(client: &reqwest::Client, base: &str) -> Option<EngineMmCache> {
    let url = format!("{}/metrics", base.trim_end_matches('/'));
    let mut resp = client.get(url).send().await.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let mut page = Vec::new();
    while let Some(chunk) = resp.chunk().await.ok()? {
        if page.len() + chunk.len() > MAX_PAGE_BYTES {
            return None;
        }
        page.extend_from_slice(&chunk);
    }
    parse(&String::from_utf8_lossy(&page))
}

/// The two counters from a Prometheus text page, summed over their label sets (one per engine rank);
/// `None` when the page has neither.
fn parse(page: &str) -> Option<EngineMmCache> {
    let (mut queries, mut hits, mut seen) = (0u64, 0u64, false);
    for line in page.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = sample(line) else { continue };
        let target = match name {
            "vllm:mm_cache_queries_total" | "vllm:mm_cache_queries" => &mut queries,
            "vllm:mm_cache_hits_total" | "vllm:mm_cache_hits" => &mut hits,
            _ => continue,
        };
        *target = target.saturating_add(value);
        seen = true;
    }
    seen.then_some(EngineMmCache { queries, hits })
}

/// A sample line's metric name (without labels) and its value as a whole count.
fn sample(line: &str) -> Option<(&str, u64)> {
    let name_end = line.find(['{', ' '])?;
    let value = line.rsplit(' ').next()?.parse::<f64>().ok()?;
    (value.is_finite() && value >= 0.0).then(|| (&line[..name_end], value as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_the_counters_over_engine_ranks_and_skips_everything_else() {
        let page = "# HELP vllm:mm_cache_queries_total Multi-modal cache queries\n\
            # TYPE vllm:mm_cache_queries_total counter\n\
            vllm:mm_cache_queries_total{engine=\"0\",model_name=\"m\"} 10.0\n\
            vllm:mm_cache_queries_total{engine=\"1\",model_name=\"m\"} 5.0\n\
            vllm:mm_cache_hits_total{engine=\"0\",model_name=\"m\"} 7.0\n\
            vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 999.0\n\
            vllm:mm_cache_hits_created{engine=\"0\",model_name=\"m\"} 1.7e9\n";
        assert_eq!(parse(page), Some(EngineMmCache { queries: 15, hits: 7 }));
    }

    #[test]
    fn a_page_without_them_or_with_garbage_reads_as_nothing() {
        assert_eq!(parse("vllm:prompt_tokens_total 3\n"), None);
        assert_eq!(parse("vllm:mm_cache_hits_total NaN\nvllm:mm_cache_hits_total{a=\"b\"} -1\n"), None);
    }
}
