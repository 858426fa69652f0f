//! HdrHistogram-backed statistics against brute force on a fixed sample.

use quire::bench::stats::LatencyStats;

/// A fixed, spread-out sample: 20,000 values from 1 µs to about 100 ms,
/// from a linear congruential generator (the same every run).
fn sample() -> Vec<u64> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (0..20_000)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            // Log-uniform, as latencies are: 10^3 .. 10^8 ns.
            let u = (x >> 11) as f64 / (1u64 << 53) as f64;
            10f64.powf(3.0 + 5.0 * u) as u64
        })
        .collect()
}

/// The nearest-rank percentile: the smallest value with at least p % of
/// the sample at or below it.
fn brute_percentile(sorted: &[u64], p: f64) -> u64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank - 1]
}

#[test]
fn percentiles_match_brute_force_within_histogram_precision() {
    let values = sample();
    let mut stats = LatencyStats::default();
    for &v in &values {
        stats.record(v);
    }
    let mut sorted = values.clone();
    sorted.sort_unstable();
    for p in [
        1.0, 5.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.99, 100.0,
    ] {
        let exact = brute_percentile(&sorted, p);
        let hdr = stats.percentile_ns(p);
        // Three significant figures: the histogram answers with the top of
        // the bucket holding the exact value, at most 0.1 % above it.
        let tolerance = exact as f64 * 0.001 + 1.0;
        assert!(
            hdr >= exact && (hdr - exact) as f64 <= tolerance,
            "p{p}: histogram {hdr}, brute force {exact}"
        );
    }
}

#[test]
fn min_max_mean_stdev_are_exact() {
    let values = sample();
    let mut stats = LatencyStats::default();
    for &v in &values {
        stats.record(v);
    }
    let n = values.len() as f64;
    let mean = values.iter().map(|&v| v as f64).sum::<f64>() / n;
    let var = values
        .iter()
        .map(|&v| (v as f64 - mean).powi(2))
        .sum::<f64>()
        / n;
    assert_eq!(stats.count(), values.len() as u64);
    assert_eq!(stats.min_ns(), *values.iter().min().unwrap());
    assert_eq!(stats.max_ns(), *values.iter().max().unwrap());
    assert!((stats.mean_ns() - mean).abs() <= mean * 1e-9);
    assert!((stats.stdev_ns() - var.sqrt()).abs() <= var.sqrt() * 1e-6);
}

#[test]
fn merged_stats_equal_one_histogram_of_everything() {
    let values = sample();
    let (a, b) = values.split_at(values.len() / 3);
    let (mut all, mut left, mut right) = (
        LatencyStats::default(),
        LatencyStats::default(),
        LatencyStats::default(),
    );
    values.iter().for_each(|&v| all.record(v));
    a.iter().for_each(|&v| left.record(v));
    b.iter().for_each(|&v| right.record(v));
    left.merge(&right);
    for p in [50.0, 99.0, 99.9] {
        assert_eq!(left.percentile_ns(p), all.percentile_ns(p));
    }
    assert_eq!(left.count(), all.count());
}
