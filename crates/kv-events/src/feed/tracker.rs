//! Sans-IO sequence tracking for one publisher.
//!
//! The [`Tracker`] sees live messages, replayed messages, replay completion and disconnects, and answers
//! with [`Action`]s: deliver an item, tell the consumer to reset, start or cancel a replay. The socket task
//! in `task.rs` executes the actions; everything that decides *what* happens lives here and is tested
//! without sockets.
//!
//! Rules (seq = the publisher's per-process batch counter, `last` = the last seq handed to the consumer):
//!
//! * first message (nothing delivered yet): seq 0 → deliver; otherwise, with a replay endpoint, replay from
//!   0 (slow joiner) and buffer live messages until the replay ends; without one, deliver.
//! * `seq == last + 1` → deliver.
//! * `seq > last + 1` (gap) → replay from `last + 1` while buffering live messages; without a replay
//!   endpoint → `Reset(Resync)` and continue from `seq`.
//! * `seq <= last` → the publisher restarted → `Reset(Restart)`, then treat as a first message.
//! * replayed or buffered messages are applied in order: `seq <= last` is a duplicate (skipped), a hole
//!   → `Reset(Resync)` (the replay ring did not reach back far enough, or the replay failed) — but only if
//!   something had been delivered; a first sync that cannot reach seq 0 just marks history incomplete.
//! * a hole inside the live buffer after a successful replay that delivered something is a new gap
//!   (published after the replay request was served) → replay again; a replay without progress resyncs.
//! * after the SUB lost its connection, the first message decides: `seq <= last` → `Reset(Restart)`;
//!   otherwise, with `reset_on_reconnect`, `Reset(Reconnect)` (a restarted publisher may already have
//!   published past `last`, which seq numbers alone cannot reveal); then it is treated as a first message.
//! * a resume point ([`Tracker::resume`], a peer replica's word) is checked against the engine before it
//!   counts. With a replay endpoint the replay starts *at* the point, not after it: a ring that answers
//!   with nothing at or past it shows the point is ahead of anything the engine published →
//!   `Reset(ResumeAhead)` and a replay from 0; a ring whose first batch lies beyond the point's successor
//!   no longer reaches back to it → `Reset(ResumeUnreachable)` and the ring from its start. Without one
//!   the live stream's newest seq is all the engine tells: a point past it (or, nothing held yet, a
//!   first live message at or before it) is `ResumeAhead`, a hole right after it `ResumeUnreachable`.

use std::collections::VecDeque;
use std::sync::Arc;

use super::{Counters, ResetReason};

/// What the socket task must do.
#[derive(Debug, PartialEq)]
pub(crate) enum Action<T> {
    /// Hand `item` (the payload of batch `seq`) to the consumer.
    Deliver { seq: u64, item: T, replayed: bool },
    /// Tell the consumer to drop everything it knows about this publisher.
    Reset(ResetReason),
    /// Ask the replay endpoint for every batch with seq ≥ `from`.
    StartReplay { from: u64 },
    /// Stop the running replay; its remaining messages must not reach the tracker.
    CancelReplay,
    /// The sync [`Tracker::resume`] asked for is over (replayed, or given up): everything the engine
    /// could still tell has been delivered.
    Synced,
}

/// Items whose size counts against the replay buffer's byte budget.
pub(crate) trait Weigh {
    /// Bytes this item holds.
    fn weight(&self) -> usize;
}

impl Weigh for bytes::Bytes {
    fn weight(&self) -> usize {
        self.len()
    }
}

#[cfg(test)]
impl Weigh for &'static str {
    fn weight(&self) -> usize {
        self.len()
    }
}

struct Replay<T> {
    /// Live messages received while replaying, strictly increasing seq.
    buffer: VecDeque<(u64, T)>,
    /// Sum of the buffered items' weights.
    bytes: usize,
    /// `last` when the replay started, to tell whether it delivered anything.
    last_at_start: Option<u64>,
}

/// Tracker tunables.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TrackerConfig {
    pub replay_enabled: bool,
    pub reset_on_reconnect: bool,
    pub max_replay_buffer: usize,
    pub max_replay_buffer_bytes: usize,
}

pub(crate) struct Tracker<T> {
    cfg: TrackerConfig,
    counters: Arc<Counters>,
    last: Option<u64>,
    /// Every batch since the publisher's seq 0 has been delivered (since the last reset).
    complete: bool,
    replay: Option<Replay<T>>,
    disconnected: bool,
    /// Highest seq seen on the live stream (since the last restart).
    live_high: Option<u64>,
    /// `Some` while holding live messages until [`Tracker::resume`] (a replica grafting a peer's state).
    held: Option<Held<T>>,
    /// A resumed sync has not ended yet: [`Action::Synced`] is still owed.
    sync_owed: bool,
    /// The resume point while the engine has not shown a batch at or past it: until it does, the
    /// point may be ahead of anything the engine published (a peer's word only).
    unproven: Option<u64>,
    /// The resume point while nothing after it was delivered: a hole right after it means the engine
    /// can no longer give what the consumer's state lacks.
    resumed_at: Option<u64>,
}

/// Live messages held before [`Tracker::resume`], oldest first, within the replay buffer's bounds
/// (the oldest go first: a replay from the resume point brings them back).
struct Held<T> {
    buffer: VecDeque<(u64, T)>,
    bytes: usize,
}

impl<T: Weigh> Tracker<T> {
    pub(crate) fn new(cfg: TrackerConfig, counters: Arc<Counters>) -> Self {
        Tracker {
            cfg,
            counters,
            last: None,
            complete: false,
            replay: None,
            disconnected: false,
            live_high: None,
            held: None,
            sync_owed: false,
            unproven: None,
            resumed_at: None,
        }
    }

    /// A tracker that holds live messages until [`Tracker::resume`] says where its consumer's state
    /// stands (a replica grafting a peer's snapshot subscribes before it knows).
    pub(crate) fn holding(cfg: TrackerConfig, counters: Arc<Counters>) -> Self {
        Tracker { held: Some(Held { buffer: VecDeque::new(), bytes: 0 }), ..Tracker::new(cfg, counters) }
    }

    /// The consumer's state now reflects every batch up to `after` (`None`: nothing): replay from
    /// there — everything the engine's ring still holds from seq 0 when `None` — then the held live
    /// messages; [`Action::Synced`] follows once that is over. Without a replay endpoint the held
    /// messages are applied as live ones (a gap resyncs). `after` is checked against the engine first
    /// (see the module's rules): a point it cannot continue from resets the consumer with
    /// [`ResetReason::ResumeAhead`] or [`ResetReason::ResumeUnreachable`]. Only the first call counts.
    pub(crate) fn resume(&mut self, after: Option<u64>, out: &mut Vec<Action<T>>) {
        let Some(held) = self.held.take() else { return };
        self.last = after;
        self.complete = false;
        self.sync_owed = true;
        self.resumed_at = after;
        if self.cfg.replay_enabled {
            // From the point itself: the engine still holding batch `after` (or anything past it) is
            // what shows the point is one it reached.
            self.unproven = after;
            self.start_replay_with(after.unwrap_or(0), held.buffer, out);
            return;
        }
        if let Some(at) = after {
            match self.live_high {
                Some(high) if high < at => self.reset(ResetReason::ResumeAhead, out),
                Some(_) => {}
                None => self.unproven = Some(at), // the first live message decides
            }
        }
        // The held messages are judged against each other, not against the newest of them.
        self.live_high = None;
        for (seq, item) in held.buffer {
            self.on_live(seq, item, out);
        }
        self.settle(out);
    }

    /// Owes [`Action::Synced`] and no replay runs any more: pay it.
    fn settle(&mut self, out: &mut Vec<Action<T>>) {
        if self.sync_owed && self.replay.is_none() {
            self.sync_owed = false;
            out.push(Action::Synced);
        }
    }

    /// Holds a live message (before [`Tracker::resume`]); `live_high` still tracks the stream.
    fn hold(&mut self, seq: u64, item: T) {
        let Some(held) = &mut self.held else { return };
        if self.live_high.is_some_and(|high| seq <= high) {
            held.buffer.clear(); // the publisher restarted: what was held belongs to its old run
            held.bytes = 0;
        }
        self.live_high = Some(seq);
        held.bytes += item.weight();
        held.buffer.push_back((seq, item));
        while held.buffer.len() > self.cfg.max_replay_buffer || held.bytes > self.cfg.max_replay_buffer_bytes {
            let Some((_, old)) = held.buffer.pop_front() else { break };
            held.bytes -= old.weight();
        }
    }

    #[cfg(test)]
    pub(crate) fn is_replaying(&self) -> bool {
        self.replay.is_some()
    }

    /// A live message arrived on the SUB socket.
    pub(crate) fn on_live(&mut self, seq: u64, item: T, out: &mut Vec<Action<T>>) {
        if self.held.is_some() {
            return self.hold(seq, item);
        }
        // Restarts are judged against the live stream itself: a replay may deliver batches the live
        // stream has not shown yet, and those later arrive live as harmless duplicates.
        let went_back = self.live_high.is_some_and(|high| seq <= high);
        self.live_high = Some(seq);

        if let Some(replay) = &mut self.replay {
            if went_back {
                // The publisher restarted while we were replaying: the replay is moot.
                self.replay = None;
                out.push(Action::CancelReplay);
                self.reset(ResetReason::Restart, out);
                self.first(seq, item, out);
            } else if replay.buffer.len() >= self.cfg.max_replay_buffer
                || replay.bytes.saturating_add(item.weight()) > self.cfg.max_replay_buffer_bytes
            {
                // The replay is too slow for the live rate (or the live batches too big to hold while it
                // runs): give it up and resync from what we hold.
                out.push(Action::CancelReplay);
                Counters::inc(&self.counters.replay_failures);
                self.finish_replay(false, out);
                self.apply_ordered(seq, item, false, out);
            } else {
                replay.bytes += item.weight();
                replay.buffer.push_back((seq, item));
            }
            return self.settle(out);
        }

        // A resume point the engine has not vouched for: a live stream still at or before it shows
        // the point is ahead of the engine (a replica's snapshot cannot be ahead of what it received).
        if let Some(at) = self.unproven.take() {
            if seq <= at {
                self.reset(ResetReason::ResumeAhead, out);
                return self.first(seq, item, out);
            }
        }

        if std::mem::take(&mut self.disconnected) {
            if let Some(last) = self.last {
                if seq <= last {
                    self.reset(ResetReason::Restart, out);
                    return self.first(seq, item, out);
                }
                if self.cfg.reset_on_reconnect {
                    self.reset(ResetReason::Reconnect, out);
                    return self.first(seq, item, out);
                }
            }
        }

        match self.last {
            None => self.first(seq, item, out),
            Some(last) if Some(seq) == last.checked_add(1) => self.deliver(seq, item, false, out),
            Some(last) if seq > last => {
                Counters::inc(&self.counters.gaps);
                if self.cfg.replay_enabled {
                    self.start_replay(last + 1, seq, item, out);
                } else {
                    self.resync(out);
                    self.deliver(seq, item, false, out);
                }
            }
            // Already delivered by a replay that ran ahead of the live stream.
            Some(_) if !went_back => Counters::inc(&self.counters.duplicates),
            Some(_) => {
                self.reset(ResetReason::Restart, out);
                self.first(seq, item, out);
            }
        }
    }

    /// A data message of the running replay arrived.
    pub(crate) fn on_replay_item(&mut self, seq: u64, item: T, out: &mut Vec<Action<T>>) {
        if self.replay.is_some() {
            if self.unproven.is_some_and(|at| seq >= at) {
                self.unproven = None; // the ring reaches the resume point: it is not ahead
            }
            self.apply_ordered(seq, item, true, out);
        }
    }

    /// The running replay ended: `ok` = end marker seen; otherwise it failed (timeout, bad reply, …).
    pub(crate) fn on_replay_end(&mut self, ok: bool, out: &mut Vec<Action<T>>) {
        if self.replay.is_none() {
            return;
        }
        if !ok {
            Counters::inc(&self.counters.replay_failures);
        }
        self.finish_replay(ok, out);
        self.settle(out);
    }

    /// The SUB socket lost its publisher connection.
    pub(crate) fn on_disconnect(&mut self, out: &mut Vec<Action<T>>) {
        if self.replay.is_some() {
            out.push(Action::CancelReplay);
            self.finish_replay(false, out);
            self.settle(out);
        }
        self.disconnected = true;
    }

    pub(crate) fn last_seq(&self) -> Option<u64> {
        self.last
    }

    pub(crate) fn history_complete(&self) -> bool {
        self.complete
    }

    fn first(&mut self, seq: u64, item: T, out: &mut Vec<Action<T>>) {
        debug_assert!(self.last.is_none());
        if seq != 0 && self.cfg.replay_enabled {
            self.start_replay(0, seq, item, out);
        } else {
            self.apply_ordered(seq, item, false, out);
        }
    }

    fn start_replay(&mut self, from: u64, seq: u64, item: T, out: &mut Vec<Action<T>>) {
        self.start_replay_with(from, VecDeque::from([(seq, item)]), out);
    }

    fn start_replay_with(&mut self, from: u64, buffer: VecDeque<(u64, T)>, out: &mut Vec<Action<T>>) {
        Counters::inc(&self.counters.replays);
        let bytes = buffer.iter().map(|(_, item)| item.weight()).sum();
        self.replay = Some(Replay { buffer, bytes, last_at_start: self.last });
        out.push(Action::StartReplay { from });
    }

    /// Leaves replay mode and applies the buffered live messages.
    ///
    /// After a successful replay that delivered something, a hole *inside* the buffer is a new gap (those
    /// batches were published after the replay request was answered): replay again from there. Otherwise
    /// (failed replay, or one that made no progress) holes are resyncs, which also bounds the number of
    /// consecutive replays.
    fn finish_replay(&mut self, ok: bool, out: &mut Vec<Action<T>>) {
        let Some(replay) = self.replay.take() else { return };
        let mut buffer = replay.buffer;
        if let Some(at) = self.unproven {
            // The ring answered with nothing at or past the resume point (`ok`), or, when it could not
            // answer, the live stream is the engine's word: no batch that far yet means the point is
            // ahead of the engine. Nothing held either: the first live message decides.
            let ahead = ok || self.live_high.is_some_and(|high| high < at);
            if ok || self.live_high.is_some() {
                self.unproven = None;
            }
            if ahead {
                self.reset(ResetReason::ResumeAhead, out);
                if ok {
                    // Everything the ring holds instead, then the held messages.
                    self.start_replay_with(0, buffer, out);
                    return;
                }
            }
        }
        let progressed = self.last != replay.last_at_start;
        while let Some((seq, item)) = buffer.pop_front() {
            match self.last {
                Some(last) if ok && progressed && last.checked_add(1).is_some_and(|next| seq > next) => {
                    Counters::inc(&self.counters.gaps);
                    buffer.push_front((seq, item));
                    self.start_replay_with(last + 1, buffer, out);
                    return;
                }
                _ => self.apply_ordered(seq, item, false, out),
            }
        }
    }

    /// Applies a message known to come after everything delivered unless it is a duplicate.
    fn apply_ordered(&mut self, seq: u64, item: T, replayed: bool, out: &mut Vec<Action<T>>) {
        match self.last {
            None => {
                self.complete = seq == 0;
                self.deliver(seq, item, replayed, out);
            }
            Some(last) if seq <= last => Counters::inc(&self.counters.duplicates),
            Some(last) if seq == last + 1 => self.deliver(seq, item, replayed, out),
            Some(_) => {
                self.resync(out);
                self.deliver(seq, item, replayed, out);
            }
        }
    }

    fn deliver(&mut self, seq: u64, item: T, replayed: bool, out: &mut Vec<Action<T>>) {
        self.last = Some(seq);
        self.resumed_at = None;
        out.push(Action::Deliver { seq, item, replayed });
    }

    /// The consumer's state for this publisher has a hole that cannot be filled: right after a resume
    /// point, the point was one the engine can no longer continue from.
    fn resync(&mut self, out: &mut Vec<Action<T>>) {
        let unreachable = self.resumed_at.is_some() && self.resumed_at == self.last;
        self.reset(if unreachable { ResetReason::ResumeUnreachable } else { ResetReason::Resync }, out);
    }

    fn reset(&mut self, reason: ResetReason, out: &mut Vec<Action<T>>) {
        let counter = match reason {
            ResetReason::Restart => &self.counters.restarts,
            ResetReason::Resync => &self.counters.resyncs,
            ResetReason::Reconnect => &self.counters.reconnect_resets,
            ResetReason::ResumeAhead => &self.counters.resume_ahead,
            ResetReason::ResumeUnreachable => &self.counters.resume_unreachable,
        };
        Counters::inc(counter);
        self.last = None;
        self.complete = false;
        // Whatever the resume point was, the consumer's state it described is gone.
        (self.unproven, self.resumed_at) = (None, None);
        out.push(Action::Reset(reason));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    type A = Action<&'static str>;

    struct Harness {
        t: Tracker<&'static str>,
        counters: Arc<Counters>,
    }

    impl Harness {
        fn new(replay_enabled: bool) -> Self {
            Self::with(TrackerConfig {
                replay_enabled,
                reset_on_reconnect: true,
                max_replay_buffer: 4,
                max_replay_buffer_bytes: 1000,
            })
        }

        fn with(cfg: TrackerConfig) -> Self {
            let counters = Arc::new(Counters::default());
            Harness { t: Tracker::new(cfg, counters.clone()), counters }
        }

        fn live(&mut self, seq: u64) -> Vec<A> {
            let mut out = Vec::new();
            self.t.on_live(seq, "live", &mut out);
            out
        }

        fn replayed(&mut self, seq: u64) -> Vec<A> {
            let mut out = Vec::new();
            self.t.on_replay_item(seq, "replay", &mut out);
            out
        }

        fn end(&mut self, ok: bool) -> Vec<A> {
            let mut out = Vec::new();
            self.t.on_replay_end(ok, &mut out);
            out
        }

        fn disconnect(&mut self) -> Vec<A> {
            let mut out = Vec::new();
            self.t.on_disconnect(&mut out);
            out
        }

        fn get(&self, f: impl Fn(&Counters) -> &std::sync::atomic::AtomicU64) -> u64 {
            f(&self.counters).load(Ordering::Relaxed)
        }
    }

    fn live(seq: u64) -> A {
        Action::Deliver { seq, item: "live", replayed: false }
    }

    fn rep(seq: u64) -> A {
        Action::Deliver { seq, item: "replay", replayed: true }
    }

    #[test]
    fn in_order_stream() {
        let mut h = Harness::new(true);
        assert_eq!(h.live(0), vec![live(0)]);
        assert!(h.t.history_complete());
        assert_eq!(h.live(1), vec![live(1)]);
        assert_eq!(h.live(2), vec![live(2)]);
        assert_eq!(h.t.last_seq(), Some(2));
        assert_eq!(h.get(|c| &c.gaps), 0);
    }

    #[test]
    fn slow_joiner_replays_from_zero() {
        let mut h = Harness::new(true);
        assert_eq!(h.live(3), vec![Action::StartReplay { from: 0 }]);
        assert!(h.t.is_replaying());
        assert_eq!(h.live(4), vec![]);
        assert_eq!(h.replayed(0), vec![rep(0)]);
        assert_eq!(h.replayed(1), vec![rep(1)]);
        assert_eq!(h.replayed(2), vec![rep(2)]);
        assert_eq!(h.replayed(3), vec![rep(3)]);
        // Buffered 3 is a duplicate of the replayed 3; 4 follows.
        assert_eq!(h.end(true), vec![live(4)]);
        assert!(h.t.history_complete());
        assert_eq!(h.get(|c| &c.duplicates), 1);
        assert_eq!(h.get(|c| &c.replays), 1);
    }

    #[test]
    fn slow_joiner_without_replay_endpoint() {
        let mut h = Harness::new(false);
        assert_eq!(h.live(10), vec![live(10)]);
        assert!(!h.t.history_complete());
        assert_eq!(h.live(11), vec![live(11)]);
    }

    #[test]
    fn first_sync_with_truncated_ring_is_incomplete_but_not_a_reset() {
        let mut h = Harness::new(true);
        assert_eq!(h.live(50), vec![Action::StartReplay { from: 0 }]);
        // The ring starts at 45: nothing was delivered before, so no reset, just incomplete history.
        assert_eq!(h.replayed(45), vec![rep(45)]);
        assert!(!h.t.history_complete());
        for s in 46..=50 {
            assert_eq!(h.replayed(s), vec![rep(s)]);
        }
        assert_eq!(h.end(true), vec![]);
        assert_eq!(h.get(|c| &c.resyncs), 0);
        assert_eq!(h.live(51), vec![live(51)]);
    }

    #[test]
    fn replay_ending_short_of_the_buffer_replays_again_then_resyncs() {
        let mut h = Harness::new(true);
        h.live(50);
        h.replayed(45);
        h.replayed(46);
        // 47..49 are missing: ask again from 47.
        assert_eq!(h.end(true), vec![Action::StartReplay { from: 47 }]);
        // The second replay brings nothing new: give up, the consumer's 45, 46 are followed by a hole.
        assert_eq!(h.end(true), vec![Action::Reset(ResetReason::Resync), live(50)]);
        assert_eq!(h.get(|c| &c.replays), 2);
    }

    #[test]
    fn new_gap_during_replay_is_replayed_too() {
        let mut h = Harness::new(true);
        h.live(0);
        assert_eq!(h.live(2), vec![Action::StartReplay { from: 1 }]);
        h.live(3);
        h.live(5); // 4 lost while the first replay runs; the replay snapshot ends at 3
        h.live(6);
        assert_eq!(h.replayed(1), vec![rep(1)]);
        assert_eq!(h.replayed(2), vec![rep(2)]);
        assert_eq!(h.end(true), vec![live(3), Action::StartReplay { from: 4 }]);
        h.live(7);
        assert_eq!(h.replayed(4), vec![rep(4)]);
        assert_eq!(h.replayed(5), vec![rep(5)]);
        assert_eq!(h.end(true), vec![live(6), live(7)]);
        assert_eq!(h.get(|c| &c.gaps), 2);
        assert_eq!(h.get(|c| &c.resyncs), 0);
        assert!(h.t.history_complete());
    }

    #[test]
    fn gap_is_filled_by_replay() {
        let mut h = Harness::new(true);
        h.live(0);
        h.live(1);
        assert_eq!(h.live(4), vec![Action::StartReplay { from: 2 }]);
        assert_eq!(h.live(5), vec![]);
        assert_eq!(h.replayed(2), vec![rep(2)]);
        assert_eq!(h.replayed(3), vec![rep(3)]);
        assert_eq!(h.replayed(4), vec![rep(4)]);
        assert_eq!(h.replayed(5), vec![rep(5)]);
        assert_eq!(h.end(true), vec![]);
        assert_eq!(h.live(6), vec![live(6)]);
        assert!(h.t.history_complete());
        assert_eq!(h.get(|c| &c.gaps), 1);
        assert_eq!(h.get(|c| &c.duplicates), 2);
        assert_eq!(h.get(|c| &c.resyncs), 0);
    }

    #[test]
    fn gap_older_than_ring_resyncs() {
        let mut h = Harness::new(true);
        h.live(0);
        assert_eq!(h.live(20), vec![Action::StartReplay { from: 1 }]);
        // The ring only holds 15.. now.
        assert_eq!(h.replayed(15), vec![Action::Reset(ResetReason::Resync), rep(15)]);
        for s in 16..=20 {
            assert_eq!(h.replayed(s), vec![rep(s)]);
        }
        assert_eq!(h.end(true), vec![]);
        assert_eq!(h.get(|c| &c.resyncs), 1);
        assert!(!h.t.history_complete());
        assert_eq!(h.live(21), vec![live(21)]);
    }

    #[test]
    fn gap_without_replay_endpoint_resyncs() {
        let mut h = Harness::new(false);
        h.live(0);
        assert_eq!(h.live(2), vec![Action::Reset(ResetReason::Resync), live(2)]);
        assert_eq!(h.get(|c| &c.gaps), 1);
        assert_eq!(h.get(|c| &c.resyncs), 1);
    }

    #[test]
    fn failed_replay_resyncs_and_applies_buffer() {
        let mut h = Harness::new(true);
        h.live(0);
        assert_eq!(h.live(3), vec![Action::StartReplay { from: 1 }]);
        h.live(4);
        assert_eq!(h.end(false), vec![Action::Reset(ResetReason::Resync), live(3), live(4)]);
        assert_eq!(h.get(|c| &c.replay_failures), 1);
        assert_eq!(h.live(5), vec![live(5)]);
    }

    #[test]
    fn failed_replay_after_partial_fill_without_hole_is_fine() {
        let mut h = Harness::new(true);
        h.live(0);
        h.live(3);
        h.replayed(1);
        h.replayed(2);
        assert_eq!(h.end(false), vec![live(3)]);
        assert_eq!(h.get(|c| &c.resyncs), 0);
    }

    #[test]
    fn restart_resets_and_starts_over() {
        let mut h = Harness::new(false);
        h.live(0);
        h.live(1);
        h.live(2);
        assert_eq!(h.live(0), vec![Action::Reset(ResetReason::Restart), live(0)]);
        assert!(h.t.history_complete());
        assert_eq!(h.live(1), vec![live(1)]);
        // A duplicate seq is also a restart (the reference's rule `seq <= last`).
        assert_eq!(h.live(1), vec![Action::Reset(ResetReason::Restart), live(1)]);
        assert_eq!(h.get(|c| &c.restarts), 2);
    }

    #[test]
    fn restart_with_replay_replays_the_new_process_from_zero() {
        let mut h = Harness::new(true);
        h.live(0);
        h.live(1);
        assert_eq!(h.live(1), vec![Action::Reset(ResetReason::Restart), Action::StartReplay { from: 0 }]);
        assert_eq!(h.replayed(0), vec![rep(0)]);
        assert_eq!(h.replayed(1), vec![rep(1)]);
        assert_eq!(h.end(true), vec![]);
        assert!(h.t.history_complete());
    }

    #[test]
    fn restart_during_replay_cancels_it() {
        let mut h = Harness::new(true);
        h.live(0);
        h.live(5);
        h.live(6);
        assert_eq!(h.live(0), vec![Action::CancelReplay, Action::Reset(ResetReason::Restart), live(0)]);
        assert!(!h.t.is_replaying());
        // Late items of the cancelled replay are ignored.
        assert_eq!(h.replayed(1), vec![]);
        assert_eq!(h.end(true), vec![]);
        assert_eq!(h.live(1), vec![live(1)]);
    }

    #[test]
    fn replay_buffer_byte_budget_gives_up() {
        // "live" weighs 4 bytes: a budget of 10 holds two buffered items, the third overflows.
        let cfg = TrackerConfig {
            replay_enabled: true,
            reset_on_reconnect: true,
            max_replay_buffer: 100,
            max_replay_buffer_bytes: 10,
        };
        let mut h = Harness::with(cfg);
        h.live(0);
        assert_eq!(h.live(2), vec![Action::StartReplay { from: 1 }]);
        assert_eq!(h.live(3), vec![]);
        assert_eq!(
            h.live(4),
            vec![Action::CancelReplay, Action::Reset(ResetReason::Resync), live(2), live(3), live(4)]
        );
        assert_eq!(h.get(|c| &c.replay_failures), 1);
    }

    #[test]
    fn replay_buffer_overflow_gives_up() {
        let mut h = Harness::new(true); // max_replay_buffer = 4
        h.live(0);
        assert_eq!(h.live(2), vec![Action::StartReplay { from: 1 }]);
        h.live(3);
        h.live(4);
        h.live(5);
        assert_eq!(
            h.live(6),
            vec![Action::CancelReplay, Action::Reset(ResetReason::Resync), live(2), live(3), live(4), live(5), live(6)]
        );
        assert_eq!(h.get(|c| &c.replay_failures), 1);
    }

    #[test]
    fn reconnect_resets_by_default() {
        let mut h = Harness::new(false);
        h.live(0);
        h.live(1);
        assert_eq!(h.disconnect(), vec![]);
        assert_eq!(h.live(2), vec![Action::Reset(ResetReason::Reconnect), live(2)]);
        assert!(!h.t.history_complete());
        assert_eq!(h.live(3), vec![live(3)]);
        // A restarted publisher seen after a reconnect is reported as a restart.
        h.disconnect();
        assert_eq!(h.live(0), vec![Action::Reset(ResetReason::Restart), live(0)]);
        assert_eq!(h.get(|c| &c.reconnect_resets), 1);
        assert_eq!(h.get(|c| &c.restarts), 1);
    }

    #[test]
    fn reconnect_with_replay_rebuilds_from_zero() {
        let mut h = Harness::new(true);
        h.live(0);
        h.disconnect();
        assert_eq!(h.live(7), vec![Action::Reset(ResetReason::Reconnect), Action::StartReplay { from: 0 }]);
    }

    #[test]
    fn reconnect_without_reset_uses_seq_rules() {
        let mut h = Harness::with(TrackerConfig {
            replay_enabled: false,
            reset_on_reconnect: false,
            max_replay_buffer: 4,
            max_replay_buffer_bytes: 1000,
        });
        h.live(0);
        h.disconnect();
        assert_eq!(h.live(1), vec![live(1)]);
        h.disconnect();
        assert_eq!(h.live(3), vec![Action::Reset(ResetReason::Resync), live(3)]);
    }

    #[test]
    fn disconnect_during_replay_applies_buffer() {
        let mut h = Harness::new(true);
        h.live(0);
        h.live(2);
        h.replayed(1);
        assert_eq!(h.disconnect(), vec![Action::CancelReplay, live(2)]);
        assert!(!h.t.is_replaying());
    }

    #[test]
    fn replay_running_ahead_of_live_is_not_a_restart() {
        let mut h = Harness::new(true);
        h.live(0);
        assert_eq!(h.live(2), vec![Action::StartReplay { from: 1 }]);
        // The ring already held 1..=5 when the request was served.
        for s in 1..=5 {
            assert_eq!(h.replayed(s), vec![rep(s)]);
        }
        assert_eq!(h.end(true), vec![]);
        // 3..=5 now arrive live: duplicates, then the stream continues.
        assert_eq!(h.live(3), vec![]);
        assert_eq!(h.live(4), vec![]);
        assert_eq!(h.live(5), vec![]);
        assert_eq!(h.live(6), vec![live(6)]);
        assert_eq!(h.get(|c| &c.restarts), 0);
        assert_eq!(h.get(|c| &c.duplicates), 4);
        // A real restart is still detected against the live stream.
        assert_eq!(h.live(0), vec![Action::Reset(ResetReason::Restart), live(0)]);
    }

    #[test]
    fn max_seq_does_not_overflow() {
        let mut h = Harness::new(false);
        h.live(u64::MAX - 1);
        assert_eq!(h.live(u64::MAX), vec![live(u64::MAX)]);
        assert_eq!(h.live(0), vec![Action::Reset(ResetReason::Restart), live(0)]);
    }

    fn holding(replay_enabled: bool) -> Harness {
        let mut h = Harness::new(replay_enabled);
        h.t = Tracker::holding(h.t.cfg, h.counters.clone());
        h
    }

    fn resume(h: &mut Harness, after: Option<u64>) -> Vec<A> {
        let mut out = Vec::new();
        h.t.resume(after, &mut out);
        out
    }

    #[test]
    fn held_live_messages_wait_for_the_resume_point_then_follow_the_replay() {
        let mut h = holding(true);
        assert_eq!(h.live(41), vec![], "held, not delivered, no replay yet");
        assert_eq!(h.live(42), vec![]);
        // The grafted state stands at 39: replay 39.. (39 itself shows the engine reached it), then the
        // held 41, 42 are duplicates or follow.
        assert_eq!(resume(&mut h, Some(39)), vec![Action::StartReplay { from: 39 }]);
        assert_eq!(h.replayed(39), vec![], "the resume point itself is a duplicate");
        assert_eq!(h.replayed(40), vec![rep(40)]);
        assert_eq!(h.replayed(41), vec![rep(41)]);
        assert_eq!(h.end(true), vec![live(42), Action::Synced]);
        assert_eq!(h.live(43), vec![live(43)]);
        assert_eq!(resume(&mut h, Some(0)), vec![], "only the first resume counts");
    }

    #[test]
    fn resume_from_nothing_asks_for_the_whole_ring_even_without_traffic() {
        let mut h = holding(true);
        assert_eq!(resume(&mut h, None), vec![Action::StartReplay { from: 0 }]);
        assert_eq!(h.replayed(0), vec![rep(0)]);
        assert_eq!(h.replayed(1), vec![rep(1)]);
        assert_eq!(h.end(true), vec![Action::Synced]);
        assert!(h.t.history_complete());
        // A failed replay still ends the sync (with what arrived).
        let mut h = holding(true);
        resume(&mut h, Some(5));
        assert_eq!(h.end(false), vec![Action::Synced]);
        assert_eq!(h.t.last_seq(), Some(5));
    }

    #[test]
    fn resume_without_a_replay_endpoint_applies_the_held_messages_as_live_ones() {
        let mut h = holding(false);
        h.live(10);
        h.live(11);
        assert_eq!(resume(&mut h, Some(9)), vec![live(10), live(11), Action::Synced]);
        let mut h = holding(false);
        h.live(20);
        let out = resume(&mut h, Some(9));
        let unreachable = Action::Reset(ResetReason::ResumeUnreachable);
        assert_eq!(out, vec![unreachable, live(20), Action::Synced], "a gap right after the point");
        // Held messages at and before the point are duplicates, not a restart.
        let mut h = holding(false);
        for s in 8..12 {
            h.live(s);
        }
        assert_eq!(resume(&mut h, Some(9)), vec![live(10), live(11), Action::Synced]);
        assert_eq!((h.get(|c| &c.restarts), h.get(|c| &c.duplicates)), (0, 2));
    }

    /// A peer's snapshot said the engine is at 2^64−1: the ring has nothing that far, so the point is
    /// refused and everything the ring holds is replayed instead (not ignored for good as duplicates).
    #[test]
    fn a_resume_point_ahead_of_the_ring_resets_and_replays_from_zero() {
        let mut h = holding(true);
        h.live(5);
        h.live(6);
        assert_eq!(resume(&mut h, Some(u64::MAX)), vec![Action::StartReplay { from: u64::MAX }]);
        let ahead = Action::Reset(ResetReason::ResumeAhead);
        assert_eq!(h.end(true), vec![ahead, Action::StartReplay { from: 0 }]);
        for s in 0..=6 {
            assert_eq!(h.replayed(s), vec![rep(s)]);
        }
        assert_eq!(h.end(true), vec![Action::Synced], "the held 5, 6 were replayed already");
        assert_eq!(h.live(7), vec![live(7)]);
        assert!(h.t.history_complete());
        assert_eq!((h.get(|c| &c.resume_ahead), h.get(|c| &c.resyncs)), (1, 0));
        // No traffic at all yet: an empty ring answers nothing, which is as good a refusal.
        let mut h = holding(true);
        assert_eq!(resume(&mut h, Some(100)), vec![Action::StartReplay { from: 100 }]);
        assert_eq!(h.end(true), vec![Action::Reset(ResetReason::ResumeAhead), Action::StartReplay { from: 0 }]);
        assert_eq!(h.end(true), vec![Action::Synced]);
        assert_eq!(h.live(0), vec![live(0)]);
    }

    #[test]
    fn a_resume_point_the_ring_no_longer_reaches_resets_and_takes_the_ring_from_its_start() {
        let mut h = holding(true);
        h.live(50);
        assert_eq!(resume(&mut h, Some(10)), vec![Action::StartReplay { from: 10 }]);
        assert_eq!(h.replayed(40), vec![Action::Reset(ResetReason::ResumeUnreachable), rep(40)]);
        for s in 41..=50 {
            assert_eq!(h.replayed(s), vec![rep(s)]);
        }
        assert_eq!(h.end(true), vec![Action::Synced]);
        assert_eq!((h.get(|c| &c.resume_unreachable), h.get(|c| &c.resyncs)), (1, 0));
        // The ring's oldest is the point's successor: nothing is missing.
        let mut h = holding(true);
        resume(&mut h, Some(10));
        assert_eq!(h.replayed(11), vec![rep(11)]);
        assert_eq!(h.end(true), vec![Action::Synced]);
        assert_eq!(h.get(|c| &c.resume_unreachable) + h.get(|c| &c.resume_ahead), 0);
    }

    #[test]
    fn without_the_ring_the_live_stream_judges_the_resume_point() {
        // The replay failed: what was held shows the engine is at 3, not 9.
        let mut h = holding(true);
        h.live(3);
        resume(&mut h, Some(9));
        assert_eq!(h.end(false), vec![Action::Reset(ResetReason::ResumeAhead), live(3), Action::Synced]);
        // The replay failed and nothing was held: the first live message decides.
        let mut h = holding(true);
        resume(&mut h, Some(9));
        assert_eq!(h.end(false), vec![Action::Synced]);
        assert_eq!(h.live(4), vec![Action::Reset(ResetReason::ResumeAhead), Action::StartReplay { from: 0 }]);
        let mut h = holding(true);
        resume(&mut h, Some(9));
        h.end(false);
        assert_eq!(h.live(10), vec![live(10)], "a stream past the point proves it");
        // No replay endpoint at all.
        let mut h = holding(false);
        h.live(3);
        let out = resume(&mut h, Some(u64::MAX));
        assert_eq!(out, vec![Action::Reset(ResetReason::ResumeAhead), live(3), Action::Synced]);
        let mut h = holding(false);
        assert_eq!(resume(&mut h, Some(u64::MAX)), vec![Action::Synced]);
        assert_eq!(h.live(0), vec![Action::Reset(ResetReason::ResumeAhead), live(0)]);
        assert_eq!(h.live(1), vec![live(1)]);
        assert_eq!(h.get(|c| &c.resume_ahead), 1);
    }

    #[test]
    fn holding_is_bounded_and_forgets_a_restarted_publishers_old_run() {
        let mut h = holding(true);
        for s in 0..10 {
            h.live(s);
        }
        let held: Vec<u64> = h.t.held.as_ref().unwrap().buffer.iter().map(|(s, _)| *s).collect();
        assert_eq!(held, vec![6, 7, 8, 9], "the oldest go first (a replay brings them back)");
        h.live(0);
        assert_eq!(h.t.held.as_ref().unwrap().buffer.len(), 1);
    }

    #[test]
    fn a_disconnect_during_the_resumed_replay_still_ends_the_sync() {
        let mut h = holding(true);
        resume(&mut h, None);
        assert_eq!(h.disconnect(), vec![Action::CancelReplay, Action::Synced]);
    }
}
