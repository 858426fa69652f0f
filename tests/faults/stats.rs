//! Measurements a run collects and prints at its end: named samples of
//! durations (failover times, classification times, recovery times) and
//! named rates (throughput). Printed, never asserted: the machine is
//! shared and noisy; the bounds the suite asserts are liveness bounds.

use std::collections::BTreeMap;
use std::time::Duration;

/// What a run measured.
#[derive(Default)]
pub struct Measurements {
    /// Samples by name.
    pub times: BTreeMap<String, Vec<Duration>>,
    /// Faults whose expected classification was not seen in time, with
    /// what was seen instead.
    pub unseen: Vec<String>,
    /// Rates by name (confirmed appends per second).
    pub rates: BTreeMap<String, f64>,
}

impl Measurements {
    /// Adds a sample.
    pub fn time(&mut self, name: &str, d: Duration) {
        self.times.entry(name.to_string()).or_default().push(d);
    }

    /// Sets a rate.
    pub fn rate(&mut self, name: &str, r: f64) {
        self.rates.insert(name.to_string(), r);
    }

    /// Prints everything, each sample set as n, p50, p99, max.
    pub fn print(&self, title: &str) {
        out!("==== {title}: measurements");
        for (name, v) in &self.times {
            let mut v = v.clone();
            v.sort();
            out!(
                "{name}: n={} p50={:.0?} p99={:.0?} max={:.0?}",
                v.len(),
                percentile(&v, 50.0),
                percentile(&v, 99.0),
                v.last().copied().unwrap_or_default()
            );
        }
        for (name, r) in &self.rates {
            out!("{name}: {r:.0} confirmed appends/s");
        }
        for u in &self.unseen {
            out!("not seen in time: {u}");
        }
    }
}

/// The `p`th percentile of sorted `v` (nearest rank).
pub fn percentile(v: &[Duration], p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}
