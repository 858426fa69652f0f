//! Terse output: one `;`-separated line per job, for scripts and logs.

use super::{RunResult, TERSE_VERSION};
use crate::bench::stats::DirStats;
use std::fmt::Write;

fn terse_dir(fields: &mut Vec<String>, d: &DirStats, runtime_ns: u64, pcts: &[f64]) {
    let secs = (runtime_ns as f64 / 1e9).max(1e-9);
    fields.push((d.bytes / 1024).to_string());
    fields.push(format!("{:.0}", d.bytes as f64 / secs / 1024.0));
    fields.push(format!("{:.0}", d.ops as f64 / secs));
    fields.push((runtime_ns / 1_000_000).to_string());
    for l in [&d.slat, &d.clat] {
        fields.push(format!("{}", l.min_ns() / 1000));
        fields.push(format!("{}", l.max_ns() / 1000));
        fields.push(format!("{:.6}", l.mean_ns() / 1e3));
        fields.push(format!("{:.6}", l.stdev_ns() / 1e3));
    }
    for &p in pcts {
        fields.push(format!("{p:.6}%={}", d.clat.percentile_ns(p) / 1000));
    }
    let l = &d.lat;
    fields.push(format!("{}", l.min_ns() / 1000));
    fields.push(format!("{}", l.max_ns() / 1000));
    fields.push(format!("{:.6}", l.mean_ns() / 1e3));
    fields.push(format!("{:.6}", l.stdev_ns() / 1e3));
}

/// One terse line per job: version;quire version;name;group;error; then
/// for write and for read: KiB, KiB/s, IOPS, runtime ms, slat and clat
/// min/max/mean/stdev (µs), clat percentiles (`p%=µs`), lat
/// min/max/mean/stdev (µs); then the error count.
pub fn terse(run: &RunResult) -> String {
    let mut out = String::new();
    for j in &run.jobs {
        let o = &j.options;
        let mut f = vec![
            TERSE_VERSION.to_string(),
            format!("quire-bench-{}", env!("CARGO_PKG_VERSION")),
            o.name.replace(';', "_"),
            j.groupid.to_string(),
            u8::from(j.error.is_some()).to_string(),
        ];
        terse_dir(
            &mut f,
            &j.stats.write,
            j.stats.runtime_ns,
            &o.percentile_list,
        );
        terse_dir(
            &mut f,
            &j.stats.read,
            j.stats.runtime_ns,
            &o.percentile_list,
        );
        f.push(j.stats.error_count().to_string());
        let _ = writeln!(out, "{}", f.join(";"));
    }
    out
}
