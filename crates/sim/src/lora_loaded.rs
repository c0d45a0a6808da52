//! The adapters a sim loaded at run time (`lora.rs` serves the loads): a leaf the server's state
//! holds without knowing the LoRA routes.

use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

/// The adapters loaded at run time, and the load requests received.
#[derive(Default)]
pub(crate) struct Loaded {
    pub(crate) names: Mutex<Vec<String>>,
    pub(crate) requests: AtomicU64,
}

impl Loaded {
    /// The adapters loaded at run time, in load order.
    pub fn names(&self) -> Vec<String> {
        self.names.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
