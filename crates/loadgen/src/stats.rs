//! Percentiles and summaries of latency samples (sorted vectors: runs are small enough).

use serde::{Deserialize, Serialize};

/// Nearest-rank percentile `q` (0–100) of ascending `sorted` samples; `None` when empty.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let q = q.clamp(0.0, 100.0);
    // Nearest rank: the smallest sample with at least q% of the samples at or below it.
    let rank = ((q / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Count, mean and percentiles of a set of samples (milliseconds in reports).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Summary {
    pub count: usize,
    pub mean: Option<f64>,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
}

impl Summary {
    /// Summarises `samples` (any order; NaNs are dropped).
    pub fn of(mut samples: Vec<f64>) -> Summary {
        samples.retain(|v| !v.is_nan());
        samples.sort_by(f64::total_cmp);
        let mean = if samples.is_empty() { None } else { Some(samples.iter().sum::<f64>() / samples.len() as f64) };
        Summary {
            count: samples.len(),
            mean,
            p50: percentile(&samples, 50.0),
            p90: percentile(&samples, 90.0),
            p99: percentile(&samples, 99.0),
            max: samples.last().copied(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_on_one_to_hundred() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 90.0), Some(90.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 99.5), Some(100.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
    }

    #[test]
    fn small_and_empty_sets() {
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        // Four samples: p50 is the 2nd, p90 and p99 the 4th.
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 50.0), Some(2.0));
        assert_eq!(percentile(&v, 90.0), Some(4.0));
        assert_eq!(percentile(&v, 25.0), Some(1.0));
        assert_eq!(percentile(&v, 26.0), Some(2.0));
    }

    #[test]
    fn summary_sorts_and_averages() {
        let s = Summary::of(vec![30.0, 10.0, f64::NAN, 20.0, 40.0]);
        assert_eq!(s.count, 4);
        assert_eq!(s.mean, Some(25.0));
        assert_eq!(s.p50, Some(20.0));
        assert_eq!(s.p99, Some(40.0));
        assert_eq!(s.max, Some(40.0));
        assert_eq!(Summary::of(Vec::new()), Summary::default());
    }
}
