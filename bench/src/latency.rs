//! Latency histograms (HDR, microseconds) and their summary as the results show it.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// A latency histogram in microseconds, 3 significant digits, from 1 µs to 10 minutes.
#[derive(Debug, Clone)]
pub struct Latency(Histogram<u64>);

impl Default for Latency {
    fn default() -> Self {
        Latency::new()
    }
}

impl Latency {
    /// An empty histogram.
    pub fn new() -> Latency {
        // Bounds and precision are constants that hdrhistogram accepts.
        let h = Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds");
        Latency(h)
    }

    /// Records one latency (clamped into the histogram's range).
    pub fn record(&mut self, d: Duration) {
        self.record_n(d, 1);
    }

    /// Records `n` equal latencies.
    pub fn record_n(&mut self, d: Duration, n: u64) {
        let us = (d.as_micros() as u64).clamp(1, 600_000_000);
        self.0.saturating_record_n(us, n);
    }

    /// Adds another histogram's counts.
    pub fn add(&mut self, other: &Latency) {
        // Same bounds on both sides, so adding cannot fail; saturate rather than panic anyway.
        let _ = self.0.add(&other.0);
    }

    /// Number of values recorded.
    pub fn count(&self) -> u64 {
        self.0.len()
    }

    /// The summary the results carry.
    pub fn summary(&self) -> LatencySummary {
        let h = &self.0;
        if h.is_empty() {
            return LatencySummary::default();
        }
        let q = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        // The distribution for the plot: quantiles 1 - 10^-k/4 steps, as HdrHistogram's
        // percentile plots use, up to the largest value.
        let mut distribution = Vec::new();
        let mut k = 0.0f64;
        while k <= 5.0 {
            let quantile = 1.0 - 10f64.powf(-k);
            if quantile * h.len() as f64 > h.len() as f64 - 1.0 && k > 0.0 {
                break;
            }
            distribution.push([quantile, q(quantile)]);
            k += 0.125;
        }
        distribution.push([1.0, h.max() as f64 / 1000.0]);
        LatencySummary {
            count: h.len(),
            p50_ms: q(0.5),
            p99_ms: q(0.99),
            p999_ms: q(0.999),
            max_ms: h.max() as f64 / 1000.0,
            mean_ms: h.mean() / 1000.0,
            distribution,
        }
    }
}

/// Percentiles of a latency histogram, in milliseconds.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct LatencySummary {
    /// Values recorded.
    pub count: u64,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// Largest value.
    pub max_ms: f64,
    /// Mean.
    pub mean_ms: f64,
    /// `[quantile, ms]` pairs for a percentile plot.
    pub distribution: Vec<[f64; 2]>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_known_spread() {
        let mut l = Latency::new();
        for us in 1..=10_000u64 {
            l.record(Duration::from_micros(us));
        }
        let s = l.summary();
        assert_eq!(s.count, 10_000);
        assert!((s.p50_ms - 5.0).abs() < 0.01, "{}", s.p50_ms);
        assert!((s.p99_ms - 9.9).abs() < 0.01, "{}", s.p99_ms);
        assert!((s.max_ms - 10.0).abs() < 0.01, "{}", s.max_ms);
        assert_eq!(s.distribution.last().unwrap()[0], 1.0);
        assert!(s.distribution.windows(2).all(|w| w[0][0] < w[1][0] && w[0][1] <= w[1][1]));
    }

    #[test]
    fn an_empty_histogram_summarizes_to_zeros() {
        assert_eq!(Latency::new().summary().count, 0);
    }
}
