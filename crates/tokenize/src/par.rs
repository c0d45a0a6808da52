//! Long texts encoded in parallel, in parts cut where the encoding of the whole is the concatenation
//! of the parts' encodings.
//!
//! A text is normalized (NFC), split into pieces by the pre-tokenizer and each piece BPE-encoded on its
//! own, so a cut at a position that is a piece boundary whatever came before it, and that NFC cannot
//! move, gives the same ids in two halves as in one. Two kinds of positions `p` are such cuts
//! (`b` the text's bytes):
//!
//! * `b[p-1]` is `\n` and `b[p]` is an ASCII character that is not white space. Every alternative of
//!   the split regex that can take a `\n` (`\s*[\r\n]+`, which comes before the other white-space
//!   alternatives, and the `[\r\n]*` tail of the punctuation one) ends at the end of the CR/LF or
//!   white-space run, which is `p`; no other alternative takes a `\n`.
//! * `b[p-1]` and `b[p+1]` are ASCII letters and `b[p]` a space: every alternative that takes a letter
//!   ends with the run of letters it is in (the contractions end with their letters too), which is `p`.
//!
//! Both characters around such a cut are starters that compose with nothing on the other side, so NFC
//! of the parts is NFC of the whole. One more condition: the pre-tokenizer's one context-dependent rule,
//! the rest of the text as one piece after a white-space run of [`STACK_LIMIT_RUN`] characters, cannot
//! apply to a text shorter than that many bytes, and longer texts are never cut.
//!
//! The second part of a cut is encoded on a helper thread while the calling thread encodes the first,
//! and only while no other encode is running in the process: a router under load already has every
//! core planning its own request, and cutting would only add the hand-off; an idle router gives a
//! spare core to the one long prompt it is planning. The helper sleeps on a channel between jobs
//! (a thread pool that spins while idle, as rayon's does, was measured burning a core's worth of CPU
//! at one request at a time). Whoever gets to a part first encodes it: when the helper has not picked
//! it up by the time the caller is done with its own, the caller encodes it too, so a cut never waits
//! on a slow wake-up.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use crate::pretok::STACK_LIMIT_RUN;
use crate::unicode::{ASCII, LETTER, SPACE};

/// Texts shorter than this are encoded on the calling thread (~4 000 tokens of prose: ~150 µs on one
/// core, against the tens of microseconds a hand-off to another thread costs).
pub(crate) const PARALLEL_MIN_BYTES: usize = 16 * 1024;

/// Encodes running in the process now (see the module docs).
static RUNNING: AtomicUsize = AtomicUsize::new(0);

/// Counts one running encode while alive.
pub(crate) struct Running {
    alone: bool,
}

impl Running {
    pub(crate) fn start() -> Running {
        Running { alone: RUNNING.fetch_add(1, Ordering::Relaxed) == 0 }
    }

    /// No other encode was running when this one started.
    pub(crate) fn alone(&self) -> bool {
        self.alone
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.fetch_sub(1, Ordering::Relaxed);
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// The helper thread's queue, the thread started on first use.
fn helper() -> &'static Mutex<Sender<Job>> {
    static HELPER: OnceLock<Mutex<Sender<Job>>> = OnceLock::new();
    HELPER.get_or_init(|| {
        let (tx, rx) = channel::<Job>();
        let spawned = std::thread::Builder::new().name("mmrouter-tokenize".into()).spawn(move || {
            while let Ok(job) = rx.recv() {
                job();
            }
        });
        // Without a helper every job stays unclaimed, and each caller encodes its own second part.
        drop(spawned);
        Mutex::new(tx)
    })
}

/// A part handed to the helper thread; [`Offloaded::join`] returns its result.
pub(crate) struct Offloaded<T> {
    shared: Arc<Shared<T>>,
}

struct Shared<T> {
    part: Mutex<Part<T>>,
    done: Condvar,
    /// Set with `Done`/`Panicked`: the caller spins on it instead of sleeping on `done` at once.
    finished: AtomicBool,
}

/// How long a caller spins for a part the helper is encoding before it sleeps. Sleeping at once adds a
/// second wake-up, the caller's, which on a small VM took tens of microseconds; spinning long burns a
/// core the busy machine's other work needs (a helper still busy after this was likely preempted).
const SPIN_FOR: Duration = Duration::from_micros(50);

enum Part<T> {
    /// Not started: whoever takes it runs it.
    Waiting(Box<dyn FnOnce() -> T + Send>),
    Running,
    Done(T),
    Panicked,
    Taken,
}

impl<T: Send + 'static> Offloaded<T> {
    pub(crate) fn start(work: impl FnOnce() -> T + Send + 'static) -> Offloaded<T> {
        let shared = Arc::new(Shared {
            part: Mutex::new(Part::Waiting(Box::new(work))),
            done: Condvar::new(),
            finished: AtomicBool::new(false),
        });
        let theirs = shared.clone();
        let job: Job = Box::new(move || {
            let Some(work) = take_waiting(&mut lock(&theirs.part)) else { return };
            // A panic is handed to the caller, whose own encode would have panicked the same way;
            // the helper lives on for the next part.
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
            *lock(&theirs.part) = result.map_or(Part::Panicked, Part::Done);
            theirs.finished.store(true, Ordering::Release);
            theirs.done.notify_one();
        });
        // A send fails only if the helper is gone: the part then waits for the caller.
        let _ = lock(helper()).send(job);
        Offloaded { shared }
    }

    /// The part's result: encoded here if the helper has not started it, else waited for.
    pub(crate) fn join(self) -> T {
        let Shared { part, done, finished } = &*self.shared;
        let mut state = lock(part);
        if let Some(work) = take_waiting(&mut state) {
            drop(state);
            return work();
        }
        drop(state);
        let spin_until = Instant::now() + SPIN_FOR;
        while !finished.load(Ordering::Acquire) && Instant::now() < spin_until {
            std::hint::spin_loop();
        }
        let mut state = lock(part);
        loop {
            match std::mem::replace(&mut *state, Part::Taken) {
                Part::Done(result) => return result,
                Part::Panicked => panic!("encoding a part of a long text panicked on the helper thread"),
                running => *state = running,
            }
            state = done.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Takes the work out of a part not started yet, marking it running.
fn take_waiting<T>(state: &mut Part<T>) -> Option<Box<dyn FnOnce() -> T + Send>> {
    match std::mem::replace(state, Part::Running) {
        Part::Waiting(work) => Some(work),
        other => {
            *state = other;
            None
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether the text may be cut at all (see the module docs).
pub(crate) fn cuttable(len: usize) -> bool {
    (PARALLEL_MIN_BYTES..STACK_LIMIT_RUN).contains(&len)
}

/// Whether `p` is a safe cut of `b` (see the module docs).
pub(crate) fn is_cut(b: &[u8], p: usize) -> bool {
    if p == 0 || p + 1 >= b.len() {
        return false;
    }
    let ascii_class = |c: u8| (c < 0x80).then(|| ASCII[c as usize]);
    let after_newline = b[p - 1] == b'\n' && ascii_class(b[p]).is_some_and(|k| k != SPACE);
    let between_words = b[p] == b' ' && ascii_class(b[p - 1]) == Some(LETTER) && ascii_class(b[p + 1]) == Some(LETTER);
    after_newline || between_words
}

/// The safe cut nearest to `target` within `window` bytes either side, if any.
pub(crate) fn cut_near(b: &[u8], target: usize, window: usize) -> Option<usize> {
    (0..=window).find_map(|d| {
        let ahead = target + d;
        let behind = target.checked_sub(d);
        [Some(ahead), behind].into_iter().flatten().find(|&p| is_cut(b, p))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::normalize::nfc;
    use crate::pretok::for_each_piece;

    fn pieces(s: &str) -> Vec<String> {
        let mut v = Vec::new();
        for_each_piece(s, 1, |p| v.push(String::from_utf8(p.to_vec()).unwrap()));
        v
    }

    fn normalized(s: &str) -> String {
        nfc(s).unwrap_or_else(|| s.to_owned())
    }

    /// A small xorshift generator: deterministic texts without a dependency.
    fn texts(seed: u64, n: usize) -> Vec<String> {
        const ATOMS: &[&str] = &[
            "a", "word", "The", " ", "  ", "\n", "\n\n", "\r\n", " \n ", "\t", "'s", "'LL", "it's", "123", "4", ".",
            "!!", " ...", "東京", "é", "e\u{301}", "\u{301}", "\u{17F}", "Ⅻ", "\u{a0}", "\u{3000}", "x y", "-",
        ];
        let mut x = seed | 1;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        (0..n).map(|_| (0..40).map(|_| ATOMS[next() as usize % ATOMS.len()]).collect()).collect()
    }

    #[test]
    fn a_cut_splits_pieces_and_normalization_exactly() {
        let mut cuts = 0;
        for text in texts(0x5EED, 4000) {
            let b = text.as_bytes();
            for p in (1..b.len()).filter(|&p| is_cut(b, p)) {
                let (head, tail) = text.split_at(p);
                let whole = pieces(&normalized(&text));
                let mut parts = pieces(&normalized(head));
                parts.extend(pieces(&normalized(tail)));
                assert_eq!(parts, whole, "cut at {p} of {text:?}");
                cuts += 1;
            }
        }
        assert!(cuts > 1000, "only {cuts} cuts were tried");
    }

    #[test]
    fn cuts_are_found_near_the_target() {
        let b = b"alpha beta\ngamma";
        assert_eq!(cut_near(b, 5, 0), Some(5));
        assert_eq!(cut_near(b, 8, 3), Some(11), "ahead before behind at the same distance");
        assert_eq!(cut_near(b, 11, 0), Some(11));
        assert_eq!(cut_near("東京東京".as_bytes(), 6, 6), None);
        assert!(!is_cut(b"a b", 0) && !is_cut(b"a b", 2));
        assert!(!cuttable(PARALLEL_MIN_BYTES - 1) && cuttable(PARALLEL_MIN_BYTES) && !cuttable(STACK_LIMIT_RUN));
    }

    #[test]
    fn a_part_is_run_once_by_whoever_gets_to_it_first() {
        let runs = Arc::new(AtomicUsize::new(0));
        for i in 0..200u64 {
            let counted = runs.clone();
            let part = Offloaded::start(move || {
                counted.fetch_add(1, Ordering::Relaxed);
                i * 2
            });
            if i % 2 == 0 {
                std::thread::sleep(std::time::Duration::from_micros(200)); // let the helper take it
            }
            assert_eq!(part.join(), i * 2);
        }
        assert_eq!(runs.load(Ordering::Relaxed), 200, "each part ran exactly once");
    }

    #[test]
    fn only_a_lone_encode_may_split() {
        let first = Running::start();
        let second = Running::start();
        assert!(!second.alone(), "another encode is running");
        drop((first, second));
    }
}
