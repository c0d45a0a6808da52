//! The simulator's timing model and fault dice.
//!
//! Time to first token = `ttft_base_ms` + uncached prompt tokens × `prefill_us_per_token`; each
//! further output token waits `decode_ms_per_token`. All may be zero. Pure functions, so tests check
//! the model without measuring wall-clock time.

use std::sync::Mutex;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};

use crate::options::SimOptions;

/// Time to first token for a prompt with `uncached_tokens` tokens to prefill.
pub fn ttft(uncached_tokens: u32, opts: &SimOptions) -> Duration {
    let prefill = u64::from(uncached_tokens).saturating_mul(opts.prefill_us_per_token);
    Duration::from_millis(opts.ttft_base_ms).saturating_add(Duration::from_micros(prefill))
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
