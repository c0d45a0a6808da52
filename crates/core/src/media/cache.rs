//! URL → (hash, size) cache for http(s) images, so a hot URL is not refetched on every request.
//!
//! Bounded (oldest insertion evicted first) and TTL'd. Keyed by the exact URL string: a URL whose
//! content changes keeps its old identity until the entry expires, which only affects routing
//! quality (the worker fetches the URL itself), never the forwarded request.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::media::image::ImageInfo;

pub(crate) struct UrlCache {
    ttl: Duration,
    capacity: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    map: HashMap<String, Entry>,
    /// Insertion order; items whose sequence number no longer matches the map are stale.
    order: VecDeque<(String, u64)>,
    next_seq: u64,
}

struct Entry {
    seq: u64,
    at: Instant,
    info: ImageInfo,
}

impl UrlCache {
    /// `ttl` zero or `capacity` zero disables the cache.
    pub(crate) fn new(ttl: Duration, capacity: usize) -> UrlCache {
        UrlCache { ttl, capacity, inner: Mutex::new(Inner::default()) }
    }

    fn enabled(&self) -> bool {
        !self.ttl.is_zero() && self.capacity > 0
    }

    pub(crate) fn get(&self, url: &str) -> Option<ImageInfo> {
        if !self.enabled() {
            return None;
        }
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match inner.map.get(url) {
            Some(e) if e.at.elapsed() < self.ttl => Some(e.info.clone()),
            _ => None,
        }
    }

    pub(crate) fn insert(&self, url: &str, info: ImageInfo) {
        if !self.enabled() {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let seq = inner.next_seq;
        inner.next_seq += 1;
        let entry = Entry { seq, at: Instant::now(), info };
        inner.map.insert(url.to_string(), entry);
        inner.order.push_back((url.to_string(), seq));
        // Drop stale, expired and over-capacity entries from the old end.
        while let Some((key, seq)) = inner.order.front().cloned() {
            let entry = inner.map.get(&key).filter(|e| e.seq == seq);
            let live = entry.is_some();
            let fresh = entry.is_some_and(|e| e.at.elapsed() < self.ttl);
            let over = inner.map.len() > self.capacity;
            if live && fresh && !over {
                break;
            }
            inner.order.pop_front();
            if live {
                inner.map.remove(&key);
            }
        }
        // The queue holds at most one stale item per overwrite; keep it from growing without bound.
        if inner.order.len() > self.capacity.saturating_mul(2) {
            let Inner { map, order, .. } = &mut *inner;
            order.retain(|(k, seq)| map.get(k).is_some_and(|e| e.seq == *seq));
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().map(|i| i.map.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::ImageDigest;
    use crate::media::image::Source;

    fn info(n: u8) -> ImageInfo {
        ImageInfo {
            digest: ImageDigest([n; 32]),
            width: 1,
            height: 1,
            format: "png",
            bytes: 1,
            source: Source::Http,
            transposed: false,
        }
    }

    #[test]
    fn evicts_oldest_beyond_capacity() {
        let c = UrlCache::new(Duration::from_secs(60), 2);
        c.insert("a", info(1));
        c.insert("b", info(2));
        c.insert("a", info(3)); // refresh: "a" is now newer than "b"
        c.insert("c", info(4));
        assert_eq!(c.len(), 2);
        assert!(c.get("b").is_none());
        assert_eq!(c.get("a").unwrap().digest, ImageDigest([3; 32]));
        assert_eq!(c.get("c").unwrap().digest, ImageDigest([4; 32]));
    }

    #[test]
    fn zero_ttl_disables() {
        let c = UrlCache::new(Duration::ZERO, 10);
        c.insert("a", info(1));
        assert!(c.get("a").is_none());
    }

    #[test]
    fn queue_stays_bounded_under_overwrites() {
        let c = UrlCache::new(Duration::from_secs(60), 4);
        for i in 0..1000u32 {
            c.insert("same", info(i as u8));
        }
        let inner = c.inner.lock().unwrap();
        assert!(inner.order.len() <= 8);
        assert_eq!(inner.map.len(), 1);
    }
}
