//! fio's normal output: per-job blocks, run status groups, host counters.

use super::{commit_latency, RunResult};
use crate::bench::options::{engine_name, workload_name};
use crate::bench::stats::{DirStats, LatencyStats};
use std::fmt::Write;

fn dir_name(write: bool) -> &'static str {
    if write {
        "write"
    } else {
        "read"
    }
}

/// Picks a unit in which `typical_ns` (a mean or median) reads as a
/// number of a few digits: (name, divisor).
fn unit_for(typical_ns: u64) -> (&'static str, f64) {
    if typical_ns < 10_000 {
        ("nsec", 1.0)
    } else if typical_ns < 10_000_000 {
        ("usec", 1e3)
    } else {
        ("msec", 1e6)
    }
}

/// `n` with fio's k/M suffix for IOPS.
fn short_count(n: f64) -> String {
    if n >= 1e6 {
        format!("{:.2}M", n / 1e6)
    } else if n >= 1e4 {
        format!("{:.1}k", n / 1e3)
    } else {
        format!("{n:.0}")
    }
}

/// Bytes per second as fio prints them: binary, then decimal.
fn bw(bytes_per_s: f64) -> String {
    let mib = bytes_per_s / (1 << 20) as f64;
    let mb = bytes_per_s / 1e6;
    if mib >= 1.0 {
        format!("{mib:.1}MiB/s ({mb:.1}MB/s)")
    } else {
        format!(
            "{:.1}KiB/s ({:.1}kB/s)",
            bytes_per_s / 1024.0,
            bytes_per_s / 1e3
        )
    }
}

fn lat_line(out: &mut String, label: &str, l: &LatencyStats) {
    let (unit, div) = unit_for(l.mean_ns() as u64);
    let _ = writeln!(
        out,
        "    {label:>4} ({unit}): min={:.0}, max={:.0}, avg={:.2}, stdev={:.2}",
        l.min_ns() as f64 / div,
        l.max_ns() as f64 / div,
        l.mean_ns() / div,
        l.stdev_ns() / div
    );
}

fn percentile_rows(out: &mut String, values: &[(f64, u64)], div: f64) {
    for row in values.chunks(4) {
        let cells: Vec<String> = row
            .iter()
            .map(|(p, v)| format!("{p:>5.2}th=[{:>6.0}]", *v as f64 / div))
            .collect();
        let _ = writeln!(out, "     | {}", cells.join(", "));
    }
}

fn normal_dir(out: &mut String, write: bool, d: &DirStats, runtime_ns: u64, pcts: &[f64]) {
    if d.ops == 0 {
        return;
    }
    let secs = (runtime_ns as f64 / 1e9).max(1e-9);
    let _ = writeln!(
        out,
        "  {}: IOPS={}, BW={}({:.1}MiB/{}msec)",
        dir_name(write),
        short_count(d.ops as f64 / secs),
        bw(d.bytes as f64 / secs),
        d.bytes as f64 / (1 << 20) as f64,
        runtime_ns / 1_000_000
    );
    lat_line(out, "slat", &d.slat);
    lat_line(out, "clat", &d.clat);
    lat_line(out, "lat", &d.lat);
    let (unit, div) = unit_for(d.clat.percentile_ns(50.0));
    let _ = writeln!(out, "    clat percentiles ({unit}):");
    let values: Vec<(f64, u64)> = pcts.iter().map(|&p| (p, d.clat.percentile_ns(p))).collect();
    percentile_rows(out, &values, div);
}

/// fio's normal output.
pub fn normal(run: &RunResult) -> String {
    let mut out = String::new();
    for j in &run.jobs {
        let o = &j.options;
        let _ = writeln!(
            out,
            "{}: (groupid={}, jobs={}): err={:>2}: ioengine={}, rw={}, bs={}-{}, iodepth={}{}",
            o.name,
            j.groupid,
            j.clones,
            u8::from(j.error.is_some() || j.stats.error_count() > 0),
            engine_name(o.ioengine),
            workload_name(o.rw),
            o.bs.min_bytes,
            o.bs.max_bytes,
            o.iodepth,
            o.rate_iops
                .map_or(String::new(), |r| format!(", rate_iops={r}"))
        );
        if let Some(e) = &j.error {
            let _ = writeln!(out, "  error: {e}");
        }
        normal_dir(
            &mut out,
            true,
            &j.stats.write,
            j.stats.runtime_ns,
            &o.percentile_list,
        );
        normal_dir(
            &mut out,
            false,
            &j.stats.read,
            j.stats.runtime_ns,
            &o.percentile_list,
        );
        if !j.stats.errors.is_empty() {
            let kinds: Vec<String> = j
                .stats
                .errors
                .iter()
                .map(|(k, n)| format!("{k}={n}"))
                .collect();
            let _ = writeln!(out, "  errors: {}", kinds.join(", "));
        }
        for f in &j.engine.fsync {
            let median = f
                .percentiles_ns
                .iter()
                .find(|(p, _)| *p >= 50.0)
                .map_or(0, |(_, v)| *v);
            let (unit, div) = unit_for(median);
            let _ = write!(
                out,
                "  fsync latency ({unit}) {}: flushes={}",
                f.disk, f.flushes
            );
            if let Some(m) = f.mean_ns {
                let _ = write!(out, ", avg={:.2}", m / div);
            }
            if let Some(m) = f.max_ns {
                let _ = write!(out, ", max={:.0}", m as f64 / div);
            }
            if let Some(r) = f.records_per_flush_p50 {
                let _ = write!(out, ", records/flush p50={r}");
            }
            if let Some(b) = f.bytes_per_flush {
                let _ = write!(out, ", bytes/flush={b}");
            }
            if let Some(b) = f.disk_bytes_per_s {
                let _ = write!(out, ", disk={:.1}MB/s", b / 1e6);
            }
            let _ = writeln!(out);
            percentile_rows(&mut out, &f.percentiles_ns, div);
        }
        if let Some(t) = &j.engine.transport {
            let _ = writeln!(
                out,
                "  transport: datagrams={}, rexmit frames={} ({} bytes), nacks received={}, nack rounds={}, window stalls={}, skipped={}, loss={}%{}",
                t.datagrams_sent,
                t.rexmit_frames,
                t.rexmit_bytes,
                t.nacks_received,
                t.nack_rounds,
                t.window_stalls,
                t.skipped,
                t.loss_percent,
                t.nft_dropped.map_or(String::new(), |d| format!(" (nft dropped {d})"))
            );
        }
        if let Some(r) = &j.engine.replication {
            let commit = commit_latency(&j.stats);
            let (unit, div) = unit_for(commit.percentile_ns(50.0));
            let _ = writeln!(
                out,
                "  replication: commit lat ({unit}) p50={:.0}, p99={:.0}, max={:.0}; nack rounds={}, retransmits={}, datagrams={}, sends refused={}, leader changes={}, elections={}, leader=node {}, bad datagrams={}",
                commit.percentile_ns(50.0) as f64 / div,
                commit.percentile_ns(99.0) as f64 / div,
                commit.max_ns() as f64 / div,
                r.nack_rounds,
                r.retransmits.map_or("n/a".into(), |n| n.to_string()),
                r.datagrams_sent,
                r.sends_refused,
                r.leader_changes,
                r.elections,
                r.leader.map_or("?".into(), |l| l.to_string()),
                r.bad_datagrams
            );
            let kinds: Vec<String> = j
                .stats
                .errors
                .iter()
                .map(|(k, n)| format!("{k}={n}"))
                .collect();
            let _ = writeln!(
                out,
                "  replication errors: {}",
                if kinds.is_empty() {
                    "none".into()
                } else {
                    kinds.join(", ")
                }
            );
        }
        if let Some(c) = &j.engine.cpu {
            let per_op = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.1}"));
            let daemons = match c.daemon_cpu_us {
                Some(us) => format!(
                    "{} us/op ({} daemons, {:.2} s)",
                    per_op(c.cpu_us_per_op()),
                    c.daemons,
                    us as f64 / 1e6
                ),
                None => "n/a (their PIDs are known only --embedded)".into(),
            };
            let _ = writeln!(
                out,
                "  cpu per confirmed op, over the group's {} ops: daemons {daemons}; quire-bench {} us/op ({:.2} s)",
                c.ops,
                per_op(c.client_cpu_us_per_op()),
                c.client_cpu_us as f64 / 1e6
            );
        }
        for n in &j.engine.notes {
            let _ = writeln!(out, "  {n}");
        }
        let _ = writeln!(out);
    }
    let groups = run
        .jobs
        .iter()
        .map(|j| j.groupid)
        .max()
        .map_or(0, |g| g + 1);
    for groupid in 0..groups {
        let _ = writeln!(out, "Run status group {groupid} (all jobs):");
        for write in [true, false] {
            let rows: Vec<(&DirStats, u64)> = run
                .jobs
                .iter()
                .filter(|j| j.groupid == groupid)
                .map(|j| {
                    (
                        if write { &j.stats.write } else { &j.stats.read },
                        j.stats.runtime_ns,
                    )
                })
                .filter(|(d, _)| d.ops > 0)
                .collect();
            if rows.is_empty() {
                continue;
            }
            let rates: Vec<f64> = rows
                .iter()
                .map(|(d, ns)| d.bytes as f64 / (*ns as f64 / 1e9).max(1e-9))
                .collect();
            let total_bytes: u64 = rows.iter().map(|(d, _)| d.bytes).sum();
            let run_max = rows.iter().map(|(_, ns)| *ns).max().unwrap_or(1);
            let run_min = rows.iter().map(|(_, ns)| *ns).min().unwrap_or(1);
            let lo = rates.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = rates.iter().copied().fold(0.0, f64::max);
            let _ = writeln!(
                out,
                "  {}: bw={}, {}-{}, io={:.1}MiB ({:.1}MB), run={}-{}msec",
                dir_name(write).to_uppercase(),
                bw(total_bytes as f64 / (run_max as f64 / 1e9).max(1e-9)),
                bw(lo).split(' ').next().unwrap_or(""),
                bw(hi).split(' ').next().unwrap_or(""),
                total_bytes as f64 / (1 << 20) as f64,
                total_bytes as f64 / 1e6,
                run_min / 1_000_000,
                run_max / 1_000_000
            );
        }
    }
    if !run.host.disks.is_empty() {
        let _ = writeln!(out, "\nDisk stats (read/write):");
        // util is over the window the counters cover: the whole run.
        let run_ms = run.host_window_ms.max(1);
        for d in &run.host.disks {
            let _ = writeln!(
                out,
                "  {}: ios={}/{}, merge={}/{}, ticks={}/{}, flushes={}, in_queue={}, util={:.2}%",
                d.name,
                d.read_ios,
                d.write_ios,
                d.read_merges,
                d.write_merges,
                d.read_ticks_ms,
                d.write_ticks_ms,
                d.flush_ios,
                d.in_queue_ms,
                (d.io_ticks_ms as f64 * 100.0 / run_ms as f64).min(100.0)
            );
        }
    }
    if let Some(u) = &run.host.udp {
        let _ = writeln!(
            out,
            "\nUDP errors (/proc/net/snmp, whole host): InErrors={}, RcvbufErrors={}, SndbufErrors={}, NoPorts={} (InDatagrams={}, OutDatagrams={})",
            u.in_errors, u.rcvbuf_errors, u.sndbuf_errors, u.no_ports, u.in_datagrams, u.out_datagrams
        );
    }
    out
}
