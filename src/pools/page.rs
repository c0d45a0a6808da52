//! One bounded read of a worker's page (`/metrics`, `/v1/models`): a leaf both readers share.

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
