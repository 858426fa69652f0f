//! The JSON document: fio's keys where fio has one, `bench_version` first.

use super::{commit_latency, RunResult, BENCH_VERSION};
use crate::bench::options::{engine_name, workload_name};
use crate::bench::stats::{DirStats, LatencyStats};
use serde_json::{json, Map, Value};

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
                        "disk_bytes_per_s": f.disk_bytes_per_s,
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
                let commit = commit_latency(&j.stats);
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
                "cpu_us_per_op": j.engine.cpu.as_ref().and_then(|c| c.cpu_us_per_op()),
                "client_cpu_us_per_op": j.engine.cpu.as_ref().and_then(|c| c.client_cpu_us_per_op()),
                "cpu": j.engine.cpu.as_ref().map(|c| json!({
                    "ops": c.ops,
                    "daemons": c.daemons,
                    "daemon_cpu_us": c.daemon_cpu_us,
                    "client_cpu_us": c.client_cpu_us,
                })),
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
