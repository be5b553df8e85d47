//! Latency summaries (avg, percentiles, max) over a set of measured requests.

use serde::Serialize;
use std::time::Duration;

/// Latency distribution in milliseconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Latency {
    pub count: usize,
    pub min_ms: f64,
    pub avg_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    /// Summarises the samples; an empty set gives all zeros.
    pub fn from_samples(samples: &[Duration]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        let sum: f64 = ms.iter().sum();
        Latency {
            count: ms.len(),
            min_ms: ms[0],
            avg_ms: sum / ms.len() as f64,
            p50_ms: percentile(&ms, 50.0),
            p90_ms: percentile(&ms, 90.0),
            p99_ms: percentile(&ms, 99.0),
            max_ms: ms[ms.len() - 1],
        }
    }
}

/// Nearest-rank percentile of an ascending slice: the smallest value with at least `p` % of the
/// samples at or below it.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let l = Latency::from_samples(&samples);
        assert_eq!(l.count, 100);
        assert!((l.p50_ms - 50.0).abs() < 1e-9);
        assert!((l.p90_ms - 90.0).abs() < 1e-9);
        assert!((l.p99_ms - 99.0).abs() < 1e-9);
        assert!((l.max_ms - 100.0).abs() < 1e-9);
        assert!((l.avg_ms - 50.5).abs() < 1e-9);
    }

    #[test]
    fn single_and_empty() {
        let l = Latency::from_samples(&[Duration::from_millis(7)]);
        assert!((l.p99_ms - 7.0).abs() < 1e-9);
        assert_eq!(Latency::from_samples(&[]).count, 0);
    }
}
