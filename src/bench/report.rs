//! The three output formats. Pure: results in, text out.
//!
//! - normal: fio's per-job block (IOPS and BW; slat, clat, lat; clat
//!   percentiles; then an fsync block per disk, the transport or
//!   replication block), "Run status group 0", disk stats, UDP errors;
//! - json: fio-like keys (`jobs[].write.iops`, `.bw`, `.clat_ns.percentile`,
//!   ...) plus a `bench_version`;
//! - terse: one `;`-separated line per job, the terse version first.

use super::engine::EngineReport;
use super::host::HostSnapshot;
use super::options::{engine_name, workload_name, JobOptions};
use super::stats::{DirStats, JobStats, LatencyStats};
use serde_json::{json, Map, Value};
use std::fmt::Write;

/// The version of the JSON layout (`bench_version`); bumped on a change
/// that breaks a script reading it.
pub const BENCH_VERSION: u32 = 1;
/// The version of the terse line layout (its first field).
pub const TERSE_VERSION: u32 = 1;

/// One reported job: a job clone, or all clones of a job with
/// `group_reporting`.
#[derive(Clone, Debug)]
pub struct JobResult {
    /// The job's options.
    pub options: JobOptions,
    /// Its stonewall group.
    pub groupid: usize,
    /// When its group started, ms after the run started.
    pub group_start_ms: u64,
    /// How many clones it sums.
    pub clones: usize,
    /// What it measured.
    pub stats: JobStats,
    /// What its engines added.
    pub engine: EngineReport,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

/// Everything a run produced.
#[derive(Clone, Debug, Default)]
pub struct RunResult {
    /// Per job.
    pub jobs: Vec<JobResult>,
    /// Host counters over the run.
    pub host: HostSnapshot,
    /// Unix time the run started, s.
    pub timestamp: u64,
    /// How long the host counters were collected over, ms (the whole run,
    /// every group included).
    pub host_window_ms: u64,
}

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
            // Appends and produces commit on write; consume + ack on read.
            let commit = if j.stats.write.ops > 0 || j.stats.read.ops == 0 {
                &j.stats.write.lat
            } else {
                &j.stats.read.lat
            };
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

fn lat_json(l: &LatencyStats, pcts: Option<&[f64]>) -> Value {
    let mut m = Map::new();
    m.insert("min".into(), json!(l.min_ns()));
    m.insert("max".into(), json!(l.max_ns()));
    m.insert("mean".into(), json!(l.mean_ns()));
    m.insert("stddev".into(), json!(l.stdev_ns()));
    m.insert("N".into(), json!(l.count()));
    if let Some(pcts) = pcts {
        let p: Map<String, Value> = pcts
            .iter()
            .map(|&p| (format!("{p:.6}"), json!(l.percentile_ns(p))))
            .collect();
        m.insert("percentile".into(), Value::Object(p));
    }
    Value::Object(m)
}

fn dir_json(d: &DirStats, runtime_ns: u64, pcts: &[f64]) -> Value {
    let secs = (runtime_ns as f64 / 1e9).max(1e-9);
    json!({
        "io_bytes": d.bytes,
        "io_kbytes": d.bytes / 1024,
        "bw_bytes": (d.bytes as f64 / secs) as u64,
        "bw": (d.bytes as f64 / secs / 1024.0) as u64,
        "iops": d.ops as f64 / secs,
        "runtime": runtime_ns / 1_000_000,
        "total_ios": d.ops,
        "slat_ns": lat_json(&d.slat, None),
        "clat_ns": lat_json(&d.clat, Some(pcts)),
        "lat_ns": lat_json(&d.lat, Some(pcts)),
    })
}

/// The JSON document.
pub fn json(run: &RunResult) -> Value {
    let jobs: Vec<Value> = run
        .jobs
        .iter()
        .map(|j| {
            let o = &j.options;
            let fsync: Vec<Value> = j
                .engine
                .fsync
                .iter()
                .map(|f| {
                    let p: Map<String, Value> = f
                        .percentiles_ns
                        .iter()
                        .map(|(p, v)| (format!("{p:.6}"), json!(v)))
                        .collect();
                    json!({
                        "disk": f.disk,
                        "flushes": f.flushes,
                        "records_per_flush_p50": f.records_per_flush_p50,
                        "bytes_per_flush": f.bytes_per_flush,
                        "lat_ns": { "mean": f.mean_ns, "max": f.max_ns, "percentile": p },
                    })
                })
                .collect();
            let transport = j.engine.transport.as_ref().map(|t| {
                json!({
                    "datagrams_sent": t.datagrams_sent,
                    "rexmit_frames": t.rexmit_frames,
                    "rexmit_bytes": t.rexmit_bytes,
                    "nacks_received": t.nacks_received,
                    "nack_rounds": t.nack_rounds,
                    "window_stalls": t.window_stalls,
                    "skipped": t.skipped,
                    "loss_percent": t.loss_percent,
                    "nft_dropped": t.nft_dropped,
                })
            });
            let replication = j.engine.replication.as_ref().map(|r| {
                let commit = if j.stats.write.ops > 0 || j.stats.read.ops == 0 {
                    &j.stats.write.lat
                } else {
                    &j.stats.read.lat
                };
                json!({
                    "commit_lat_ns": lat_json(commit, Some(&o.percentile_list)),
                    "nack_rounds": r.nack_rounds,
                    "retransmits": r.retransmits,
                    "datagrams_sent": r.datagrams_sent,
                    "sends_refused": r.sends_refused,
                    "leader_changes": r.leader_changes,
                    "elections": r.elections,
                    "leader": r.leader,
                    "bad_datagrams": r.bad_datagrams,
                    "errors": j.stats.errors,
                })
            });
            json!({
                "jobname": o.name,
                "groupid": j.groupid,
                "jobs": j.clones,
                "error": u8::from(j.error.is_some()),
                "error_message": j.error,
                "job options": {
                    "ioengine": engine_name(o.ioengine),
                    "rw": workload_name(o.rw),
                    "bs": format!("{}-{}", o.bs.min_bytes, o.bs.max_bytes),
                    "iodepth": o.iodepth,
                    "numjobs": o.numjobs,
                    "rate_iops": o.rate_iops,
                    "rate_process": format!("{:?}", o.rate_process).to_lowercase(),
                },
                "job_runtime": j.stats.runtime_ns / 1_000_000,
                "job_start": j.group_start_ms,
                "write": dir_json(&j.stats.write, j.stats.runtime_ns, &o.percentile_list),
                "read": dir_json(&j.stats.read, j.stats.runtime_ns, &o.percentile_list),
                "errors": j.stats.errors,
                "total_err": j.stats.error_count(),
                "fsync": fsync,
                "transport": transport,
                "replication": replication,
                "notes": j.engine.notes,
            })
        })
        .collect();
    // util is over the window the counters cover: the whole run.
    let run_ms = run.host_window_ms.max(1);
    let disks: Vec<Value> = run
        .host
        .disks
        .iter()
        .map(|d| {
            json!({
                "name": d.name,
                "read_ios": d.read_ios,
                "write_ios": d.write_ios,
                "read_merges": d.read_merges,
                "write_merges": d.write_merges,
                "read_ticks": d.read_ticks_ms,
                "write_ticks": d.write_ticks_ms,
                "flush_ios": d.flush_ios,
                "in_queue": d.in_queue_ms,
                "util": (d.io_ticks_ms as f64 * 100.0 / run_ms as f64).min(100.0),
            })
        })
        .collect();
    let udp = run.host.udp.map(|u| {
        json!({
            "in_datagrams": u.in_datagrams,
            "out_datagrams": u.out_datagrams,
            "in_errors": u.in_errors,
            "rcvbuf_errors": u.rcvbuf_errors,
            "sndbuf_errors": u.sndbuf_errors,
            "no_ports": u.no_ports,
        })
    });
    json!({
        "bench_version": BENCH_VERSION,
        "quire_version": env!("CARGO_PKG_VERSION"),
        "timestamp": run.timestamp,
        "jobs": jobs,
        "disk_util": disks,
        "udp_errors": udp,
    })
}

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
