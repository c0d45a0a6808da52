//! The simulator's timing model and fault dice.
//!
//! Time to first token = `ttft_base_ms` + preprocessing + GPU work, where
//! * preprocessing = image tokens missing from the processor cache × `image_preprocess_us_per_token`
//!   (vLLM's processor runs on the CPU of its front end, before the engine sees the request);
//! * GPU work = uncached prompt tokens × `prefill_us_per_token` + image tokens the vision encoder must
//!   run (not in the encoder cache, not inside the cached prefix) × `image_encode_us_per_token`.
//!
//! With prefill contention the GPU work queues behind the work admitted earlier; the preprocessing
//! does not (it is another processor's work) but runs while the request waits, so a request reaches
//! the GPU once both its preprocessing and the earlier work are done. The queue keeps admission
//! order (a request still preprocessing holds its place), a simplification of vLLM's scheduler.
//!
//! A decode leg of disaggregated serving pulls its prompt's uncached tokens instead of computing them
//! ([`ttft_pulled`]): `transfer_us_per_token` each, over the network (NIXL), so not queued behind
//! the prefills of the worker's compute.
//!
//! Each further output token waits `decode_ms_per_token`. All may be zero; with both image knobs at 0
//! images cost only their prefill, as before the image caches were modelled. Pure functions, so tests
//! check the model without measuring wall-clock time.

use std::sync::Mutex;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};

use crate::options::SimOptions;

/// The image work a request still has once the caches have answered (see `mm_cache`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ImageWork {
    /// Image tokens whose processing missed the processor cache.
    pub preprocess_tokens: u64,
    /// Encoder tokens the vision encoder must produce.
    pub encode_tokens: u64,
}

/// Time to first token for a prompt with `uncached_tokens` tokens to prefill (no image work).
pub fn ttft(uncached_tokens: u32, opts: &SimOptions) -> Duration {
    ttft_alone(uncached_tokens, ImageWork::default(), opts)
}

/// CPU time of the image processor for `work`.
pub fn preprocess_time(work: ImageWork, opts: &SimOptions) -> Duration {
    Duration::from_micros(work.preprocess_tokens.saturating_mul(opts.image_preprocess_us_per_token))
}

/// GPU time: prefill of the uncached tokens plus the vision encoder's share of `work`.
pub fn gpu_time(uncached_tokens: u32, work: ImageWork, opts: &SimOptions) -> Duration {
    let prefill = u64::from(uncached_tokens).saturating_mul(opts.prefill_us_per_token);
    let encode = work.encode_tokens.saturating_mul(opts.image_encode_us_per_token);
    Duration::from_micros(prefill.saturating_add(encode))
}

/// Time to first token of a request that has the GPU to itself.
pub fn ttft_alone(uncached_tokens: u32, work: ImageWork, opts: &SimOptions) -> Duration {
    let base = Duration::from_millis(opts.ttft_base_ms);
    base.saturating_add(preprocess_time(work, opts)).saturating_add(gpu_time(uncached_tokens, work, opts))
}

/// Time to first token of a request admitted while the GPU is busy for `busy` more, and how long the
/// GPU is busy once this request's work is queued too (prefill contention).
pub fn ttft_queued(busy: Duration, uncached_tokens: u32, work: ImageWork, opts: &SimOptions) -> (Duration, Duration) {
    // Preprocessing overlaps the wait for the GPU: the GPU work starts when both are over.
    let start = busy.max(preprocess_time(work, opts));
    let done = start.saturating_add(gpu_time(uncached_tokens, work, opts));
    (done.saturating_add(Duration::from_millis(opts.ttft_base_ms)), done)
}

/// Time to first token of a decode leg that pulls `pulled_tokens` of KV from its prefill engine: the
/// images' preprocessing (the front end still processes them) and the transfer, no GPU work.
pub fn ttft_pulled(pulled_tokens: u32, work: ImageWork, opts: &SimOptions) -> Duration {
    let transfer = Duration::from_micros(u64::from(pulled_tokens).saturating_mul(opts.transfer_us_per_token));
    Duration::from_millis(opts.ttft_base_ms).saturating_add(preprocess_time(work, opts)).saturating_add(transfer)
}

/// Delay before each output token after the first.
pub fn decode_delay(opts: &SimOptions) -> Duration {
    Duration::from_millis(opts.decode_ms_per_token)
}

/// Whole generation time of a non-streamed answer: first token, then `output_tokens − 1` decodes.
pub fn generation_time(uncached_tokens: u32, output_tokens: u32, opts: &SimOptions) -> Duration {
    let decodes = output_tokens.saturating_sub(1);
    ttft(uncached_tokens, opts).saturating_add(decode_delay(opts).saturating_mul(decodes))
}

/// Seeded dice for the fault knobs, shared by all requests of one worker.
#[derive(Debug)]
pub(crate) struct Dice(Mutex<StdRng>);

impl Dice {
    pub fn new(seed: u64) -> Self {
        Self(Mutex::new(StdRng::seed_from_u64(seed)))
    }

    /// True with probability `rate`; a zero rate never draws, so it does not disturb the sequence.
    pub fn roll(&self, rate: f64) -> bool {
        if rate <= 0.0 {
            return false;
        }
        let mut rng = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        rng.random::<f64>() < rate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(base: u64, prefill: u64, decode: u64) -> SimOptions {
        SimOptions {
            ttft_base_ms: base,
            prefill_us_per_token: prefill,
            decode_ms_per_token: decode,
            ..Default::default()
        }
    }

    #[test]
    fn ttft_grows_with_uncached_tokens() {
        let o = opts(10, 100, 0);
        assert_eq!(ttft(0, &o), Duration::from_millis(10));
        assert_eq!(ttft(1000, &o), Duration::from_millis(110));
        assert!(ttft(2000, &o) > ttft(1000, &o));
        assert_eq!(ttft(u32::MAX, &opts(0, u64::MAX, 0)), Duration::from_micros(u64::MAX), "saturates");
    }

    fn image_opts(preprocess: u64, encode: u64) -> SimOptions {
        SimOptions { image_preprocess_us_per_token: preprocess, image_encode_us_per_token: encode, ..opts(10, 100, 0) }
    }

    #[test]
    fn image_work_adds_preprocess_and_encode_time() {
        let o = image_opts(5, 20);
        let work = ImageWork { preprocess_tokens: 1000, encode_tokens: 400 };
        assert_eq!(preprocess_time(work, &o), Duration::from_millis(5));
        assert_eq!(gpu_time(100, work, &o), Duration::from_millis(10 + 8));
        assert_eq!(ttft_alone(100, work, &o), Duration::from_millis(10 + 5 + 18));
        assert_eq!(ttft_alone(100, ImageWork::default(), &o), ttft(100, &o), "no image work: the text model");
    }

    #[test]
    fn zero_image_knobs_keep_the_text_model() {
        let o = image_opts(0, 0);
        let work = ImageWork { preprocess_tokens: 5000, encode_tokens: 5000 };
        assert_eq!(ttft_alone(300, work, &o), ttft(300, &o));
        assert_eq!(
            ttft_queued(Duration::from_millis(7), 300, work, &o),
            ttft_queued(Duration::from_millis(7), 300, ImageWork::default(), &o)
        );
    }

    #[test]
    fn queued_gpu_work_waits_but_preprocessing_overlaps_the_wait() {
        let o = image_opts(10, 10);
        // Idle GPU: preprocessing (10 ms) then prefill (10 ms) and encoding (10 ms).
        let work = ImageWork { preprocess_tokens: 1000, encode_tokens: 1000 };
        let (t, busy) = ttft_queued(Duration::ZERO, 100, work, &o);
        assert_eq!((t, busy), (Duration::from_millis(40), Duration::from_millis(30)));
        // GPU busy for 50 ms: the preprocessing is over by then, the GPU work follows.
        let (t, busy) = ttft_queued(Duration::from_millis(50), 100, work, &o);
        assert_eq!((t, busy), (Duration::from_millis(80), Duration::from_millis(70)));
        // Without image work the queue is the text model's: busy + prefill, then the base.
        let (t, busy) = ttft_queued(Duration::from_millis(50), 100, ImageWork::default(), &o);
        assert_eq!((t, busy), (Duration::from_millis(70), Duration::from_millis(60)));
    }

    #[test]
    fn pulled_tokens_cost_the_transfer_not_the_prefill() {
        let o = SimOptions { transfer_us_per_token: 2, ..image_opts(5, 20) };
        let work = ImageWork { preprocess_tokens: 1000, encode_tokens: 0 };
        assert_eq!(ttft_pulled(1000, work, &o), Duration::from_millis(10 + 5 + 2));
        assert_eq!(ttft_pulled(0, ImageWork::default(), &o), Duration::from_millis(10));
        assert!(ttft_pulled(1000, ImageWork::default(), &o) < ttft(1000, &o), "pulling beats prefilling");
    }

    #[test]
    fn zero_model_is_instant() {
        let o = opts(0, 0, 0);
        assert_eq!(generation_time(5000, 100, &o), Duration::ZERO);
    }

    #[test]
    fn generation_time_counts_decodes_after_the_first_token() {
        let o = opts(5, 0, 3);
        assert_eq!(generation_time(0, 1, &o), Duration::from_millis(5));
        assert_eq!(generation_time(0, 4, &o), Duration::from_millis(14));
    }

    #[test]
    fn dice_extremes_and_determinism() {
        let d = Dice::new(7);
        assert!((0..100).all(|_| d.roll(1.0)));
        assert!((0..100).all(|_| !d.roll(0.0)));
        let a: Vec<bool> = {
            let d = Dice::new(42);
            (0..64).map(|_| d.roll(0.5)).collect()
        };
        let b: Vec<bool> = {
            let d = Dice::new(42);
            (0..64).map(|_| d.roll(0.5)).collect()
        };
        assert_eq!(a, b);
        assert!(a.contains(&true) && a.contains(&false));
    }
}
