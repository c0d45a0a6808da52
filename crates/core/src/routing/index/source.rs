//! Where an index entry comes from ([`Source`]: the worker's events, a pending dispatch, or the
//! router's guess) and entry counts per source ([`BySource`]): the vocabulary every part of the index
//! shares, so it lives below them all.

use serde::Serialize;

/// Where a (key, worker) entry comes from; see the index's module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Event = 0,
    Pending = 1,
    Approximate = 2,
}

/// Entries per source (stored ones: an expired entry counts until it is swept; see the `store` module).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BySource {
    pub events: usize,
    pub pending: usize,
    pub approximate: usize,
}

impl BySource {
    pub(super) fn slot(&mut self, source: Source) -> &mut usize {
        match source {
            Source::Event => &mut self.events,
            Source::Pending => &mut self.pending,
            Source::Approximate => &mut self.approximate,
        }
    }

    pub(super) fn add(&mut self, source: Source) {
        *self.slot(source) += 1;
    }

    pub(super) fn sub(&mut self, source: Source) {
        *self.slot(source) -= 1;
    }

    /// All entries.
    pub fn total(&self) -> usize {
        self.events + self.pending + self.approximate
    }
}
