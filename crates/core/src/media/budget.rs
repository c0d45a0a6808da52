//! The request-wide byte budget (`media.max_total_bytes`), shared by the images one request fetches
//! and decodes concurrently.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::media::error::MediaError;

pub(crate) struct Budget {
    used: AtomicUsize,
    limit: usize,
}

impl Budget {
    pub(crate) fn new(limit: usize) -> Budget {
        Budget { used: AtomicUsize::new(0), limit }
    }

    /// Charges `n` bytes; fails once the request as a whole is over the limit.
    pub(crate) fn take(&self, n: usize) -> Result<(), MediaError> {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(n).filter(|&total| total <= self.limit)
            })
            .map(|_| ())
            .map_err(|_| MediaError::TotalTooLarge { limit: self.limit })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_is_shared_and_overflow_safe() {
        let b = Budget::new(10);
        b.take(6).unwrap();
        assert_eq!(b.take(5).unwrap_err().label(), "too_large");
        let b = Budget::new(10);
        b.take(1).unwrap();
        assert!(b.take(usize::MAX).is_err());
        b.take(9).unwrap(); // a refused charge is not kept
    }
}
