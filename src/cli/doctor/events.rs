//! The doctor's view of a worker's KV events: is the publisher's endpoint bound (vLLM connects out
//! instead of binding for most spellings, and a subscriber then hears nothing), and what it publishes
//! while the probes run.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mmrouter_kv_events::endpoint::Endpoint;
use mmrouter_kv_events::{spawn_feed, ExtraKey, FeedConfig, FeedEvent, FeedHandle, KvEvent};

/// What the feeds delivered so far.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    pub batches: u64,
    pub stored_blocks: u64,
    pub block_sizes: BTreeSet<u32>,
    /// Multimodal identifiers named in stored blocks' `extra_keys` (bounded).
    pub mm_ids: BTreeSet<String>,
}

const MAX_IDS: usize = 1024;

impl Seen {
    fn add(&mut self, events: &[KvEvent]) {
        self.batches += 1;
        for event in events {
            let KvEvent::BlockStored(stored) = event else { continue };
            self.stored_blocks += stored.block_hashes.len() as u64;
            self.block_sizes.insert(stored.block_size);
            let keys = stored.extra_keys.iter().flatten().flatten().flatten();
            for key in keys {
                let id = match key {
                    ExtraKey::Mm { id, .. } | ExtraKey::Str(id) => id,
                    _ => continue,
                };
                if self.mm_ids.len() < MAX_IDS {
                    self.mm_ids.insert(id.clone());
                }
            }
        }
    }
}

/// Subscriptions to a worker's publishers, for the length of its checks.
pub struct Listener {
    handles: Vec<FeedHandle>,
    seen: Arc<Mutex<Seen>>,
}

/// Whether something accepts connections at a TCP endpoint (an IPC path is taken as bound).
pub async fn bound(endpoint: &str, within: Duration) -> Result<(), String> {
    let Endpoint::Tcp { host, port } = Endpoint::parse(endpoint).map_err(|e| e.to_string())? else {
        return Ok(());
    };
    match tokio::time::timeout(within, tokio::net::TcpStream::connect((host.as_str(), port))).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("{endpoint}: {e}")),
        Err(_) => Err(format!("{endpoint}: no answer within {within:?}")),
    }
}

impl Listener {
    pub fn start(configs: Vec<FeedConfig>) -> Result<Listener, String> {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let mut handles = Vec::new();
        for cfg in configs {
            let (handle, mut events) = spawn_feed(cfg).map_err(|e| e.to_string())?;
            let seen = seen.clone();
            tokio::spawn(async move {
                while let Some(event) = events.recv().await {
                    // Replayed history may name an earlier run's images: only live batches count.
                    if let FeedEvent::Batch { batch, replayed: false, .. } = event {
                        seen.lock().unwrap_or_else(|e| e.into_inner()).add(&batch.events);
                    }
                }
            });
            handles.push(handle);
        }
        Ok(Listener { handles, seen })
    }

    /// Waits until every subscription has its connection (ZMQ drops what a publisher sends before).
    pub async fn connected(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.handles.iter().all(|h| h.stats().connected) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// What was seen once `done` holds, or when `within` has passed.
    pub async fn wait(&self, within: Duration, done: impl Fn(&Seen) -> bool) -> Seen {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if done(&seen) || tokio::time::Instant::now() >= deadline {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
