//! Runs a [`RunConfig`]: opens every job clone's engine on its own thread,
//! snapshots the host counters, starts all clones at once, shows progress,
//! then gathers, groups and logs the results.

use super::cli::{Eta, RunConfig};
use super::cluster_engine::{external_target, ClusterEngine, ClusterTarget, EmbeddedCluster};
use super::cpu;
use super::engine::{CpuBlock, Engine, EngineReport};
use super::error::BenchError;
use super::host::{self, HostSnapshot};
use super::options::{EngineKind, JobOptions};
use super::report::{JobResult, RunResult};
use super::runner::{run_job, Progress, RealClock};
use super::stats::JobStats;
use super::udp_engine::UdpEngine;
use super::wal_engine::WalEngine;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// Opens the engine of clone `clone` of `job`.
pub fn open_engine(
    job: &JobOptions,
    clone: u64,
    cluster: Option<&ClusterTarget>,
) -> Result<Box<dyn Engine>, BenchError> {
    Ok(match job.ioengine {
        EngineKind::Wal => Box::new(WalEngine::open(job, clone)?),
        EngineKind::Udp => Box::new(UdpEngine::open(job)?),
        EngineKind::Cluster => {
            let target = match cluster {
                Some(t) if job.embedded => t.clone(),
                _ => external_target(job)?,
            };
            Box::new(ClusterEngine::open(job, clone, target)?)
        }
    })
}

type CloneOutcome = Result<(JobStats, EngineReport), BenchError>;

/// The block device under `path`, or under its nearest existing ancestor
/// (the job may create the directory itself).
fn device_near(path: &std::path::Path) -> Option<String> {
    path.ancestors()
        .find(|p| p.exists())
        .and_then(host::device_of)
}

/// Runs the jobs of `cfg`: each stonewall group after the one before, the
/// jobs of a group side by side. Errors of single jobs are kept in their
/// results; errors of the run as a whole are returned.
pub fn execute(cfg: &RunConfig) -> Result<RunResult, BenchError> {
    let embedded_jobs: Vec<&JobOptions> = cfg
        .jobs
        .iter()
        .filter(|j| j.ioengine == EngineKind::Cluster && j.embedded)
        .collect();
    let embedded = match embedded_jobs.first() {
        Some(first) => {
            let groups = embedded_jobs.iter().map(|j| j.group).max().unwrap_or(0) + 1;
            if groups > 64 {
                return Err(BenchError::usage(
                    "--embedded starts at most 64 groups: give a smaller --group",
                ));
            }
            Some(EmbeddedCluster::start(
                first.directory.as_deref(),
                groups,
                first.group,
                embedded_jobs.iter().any(|j| j.tls),
            )?)
        }
        None => None,
    };
    let target = embedded.as_ref().map(EmbeddedCluster::target).transpose()?;
    let mut devices: Vec<String> = Vec::new();
    for j in &cfg.jobs {
        let d = match j.ioengine {
            EngineKind::Wal => j.directory.as_deref().and_then(device_near),
            EngineKind::Cluster if j.embedded => target.as_ref().and_then(|t| t.device.clone()),
            _ => None,
        };
        if let Some(d) = d.filter(|d| !devices.contains(d)) {
            devices.push(d);
        }
    }
    let mut groups: Vec<Vec<JobOptions>> = Vec::new();
    for j in &cfg.jobs {
        match groups.last_mut() {
            Some(g) if !j.stonewall => g.push(j.clone()),
            _ => groups.push(vec![j.clone()]),
        }
    }
    let timestamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let run_started = Instant::now();
    let before = HostSnapshot::take(&devices);
    let mut jobs = Vec::new();
    for (groupid, group) in groups.iter().enumerate() {
        let group_start_ms = run_started.elapsed().as_millis() as u64;
        let mut results = run_group(groupid, group, target.as_ref(), cfg.eta)?;
        for r in &mut results {
            r.group_start_ms = group_start_ms;
        }
        jobs.extend(results);
    }
    let after = HostSnapshot::take(&devices);
    let host_window_ms = run_started.elapsed().as_millis() as u64;
    drop(embedded);
    Ok(RunResult {
        jobs,
        host: after.since(&before),
        timestamp,
        host_window_ms,
    })
}

/// Runs one stonewall group: every clone's engine is opened on its own
/// thread first, then all start at once.
fn run_group(
    groupid: usize,
    jobs: &[JobOptions],
    target: Option<&ClusterTarget>,
    eta: Eta,
) -> Result<Vec<JobResult>, BenchError> {
    let clones: Vec<(usize, u64)> = jobs
        .iter()
        .enumerate()
        .flat_map(|(i, j)| (0..j.numjobs as u64).map(move |c| (i, c)))
        .collect();
    let start = Arc::new(Barrier::new(clones.len() + 1));
    let progress: Vec<Arc<Progress>> = clones
        .iter()
        .map(|_| Arc::new(Progress::default()))
        .collect();
    let mut handles = Vec::new();
    for (k, &(i, clone)) in clones.iter().enumerate() {
        let job = jobs[i].clone();
        let (start, progress, target) = (start.clone(), progress[k].clone(), target.cloned());
        let h = std::thread::Builder::new()
            .name(format!("bench-job-{k}"))
            .spawn(move || -> CloneOutcome {
                // Opening (laying out a log, prefilling, connecting) is not
                // part of the measured run: every clone opens, then all start.
                let opened = open_engine(&job, clone, target.as_ref());
                start.wait();
                let mut engine = opened?;
                let clock = RealClock::new();
                run_job(&job, clone, engine.as_mut(), &clock, &progress)
            })
            .map_err(BenchError::io("starting a job thread"))?;
        handles.push(h);
    }
    start.wait();
    // CPU time from the moment every clone starts to the moment the last
    // one finished: the daemons' (known only for an embedded cluster) and
    // this process's.
    let pids: Vec<u32> = target.map(|t| t.pids.clone()).unwrap_or_default();
    let cpu_before = (cpu::processes_cpu_us(&pids), cpu::own_cpu_us());
    let finished = Arc::new(AtomicBool::new(false));
    let show_eta = match eta {
        Eta::Always => true,
        Eta::Never => false,
        Eta::Auto => std::io::stderr().is_terminal(),
    };
    let eta = show_eta.then(|| {
        let (finished, progress, jobs, clones) = (
            finished.clone(),
            progress.clone(),
            jobs.to_vec(),
            clones.clone(),
        );
        std::thread::spawn(move || eta_loop(&finished, &progress, &jobs, &clones))
    });
    let outcomes: Vec<CloneOutcome> = handles
        .into_iter()
        .map(|h| h.join().unwrap_or_else(|_| Err(BenchError::JobPanicked)))
        .collect();
    let cpu_after = (cpu::processes_cpu_us(&pids), cpu::own_cpu_us());
    finished.store(true, Ordering::Relaxed);
    if let Some(h) = eta {
        let _ = h.join();
    }
    let cluster_ops: u64 = clones
        .iter()
        .zip(&progress)
        .filter(|((i, _), _)| jobs[*i].ioengine == EngineKind::Cluster)
        .map(|(_, p)| p.ops.load(Ordering::Relaxed))
        .sum();
    let cpu_block = |embedded: bool| CpuBlock {
        ops: cluster_ops,
        daemon_cpu_us: match (embedded, cpu_before.0, cpu_after.0) {
            (true, Some(b), Some(a)) => Some(a.saturating_sub(b)),
            _ => None,
        },
        daemons: if embedded { pids.len() } else { 0 },
        client_cpu_us: cpu_after.1.saturating_sub(cpu_before.1),
    };
    let mut results: Vec<JobResult> = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        let fresh = || JobResult {
            options: job.clone(),
            groupid,
            group_start_ms: 0,
            clones: 0,
            stats: JobStats::default(),
            engine: EngineReport::default(),
            error: None,
        };
        let mine = clones
            .iter()
            .zip(&outcomes)
            .filter(|((j, _), _)| *j == i)
            .map(|(_, o)| o);
        let mut grouped = fresh();
        for o in mine {
            let mut r = if job.group_reporting {
                grouped
            } else {
                fresh()
            };
            r.clones += 1;
            match o {
                Ok((stats, engine)) => {
                    r.stats.merge(stats);
                    r.engine.merge(engine);
                }
                Err(e) => r.error = Some(e.to_string()),
            }
            if job.group_reporting {
                grouped = r;
            } else {
                results.push(r);
                grouped = fresh();
            }
        }
        if job.group_reporting {
            results.push(grouped);
        }
    }
    for r in &mut results {
        if r.options.ioengine == EngineKind::Cluster {
            r.engine.cpu = Some(cpu_block(r.options.embedded));
        }
    }
    // A job that could not run at all (no cluster, a wrong token) failed,
    // even though each operation's error was counted rather than returned:
    // its report says so and quire-bench exits 1.
    for r in &mut results {
        let ops = r.stats.write.ops + r.stats.read.ops;
        if r.error.is_none() && ops == 0 && !r.stats.errors.is_empty() {
            let kinds: Vec<String> = r
                .stats
                .errors
                .iter()
                .map(|(kind, n)| format!("{n} {kind}"))
                .collect();
            r.error = Some(format!(
                "no operation succeeded; failed: {}",
                kinds.join(", ")
            ));
        }
    }
    Ok(results)
}

/// Writes the `write_lat_log` files of every job that asked for them, in
/// fio's log format (`msec, value_ns, direction, bs, offset`), one line per
/// `log_avg_msec` interval holding the interval's mean.
pub fn write_lat_logs(run: &RunResult) -> Result<Vec<String>, BenchError> {
    let mut written = Vec::new();
    for (n, j) in run.jobs.iter().enumerate() {
        let Some(prefix) = &j.options.write_lat_log else {
            continue;
        };
        let prefix = if prefix.is_empty() || prefix == "1" {
            &j.options.name
        } else {
            prefix
        };
        let dir = if j.stats.write.ops >= j.stats.read.ops {
            1
        } else {
            0
        };
        let bs = j.options.bs.max_bytes;
        for (kind, pick) in [
            (
                "lat",
                (|s| s.lat_mean_ns) as fn(&super::stats::IntervalSample) -> f64,
            ),
            ("clat", |s| s.clat_mean_ns),
            ("slat", |s| s.slat_mean_ns),
        ] {
            let path = format!("{prefix}_{kind}.{}.log", n + 1);
            let mut text = String::new();
            for s in j.stats.intervals.iter().filter(|s| s.ops > 0) {
                text.push_str(&format!("{}, {:.0}, {dir}, {bs}, 0\n", s.end_ms, pick(s)));
            }
            std::fs::write(&path, text).map_err(BenchError::io(path.clone()))?;
            written.push(path);
        }
    }
    Ok(written)
}

fn eta_loop(
    finished: &AtomicBool,
    progress: &[Arc<Progress>],
    jobs: &[JobOptions],
    clones: &[(usize, u64)],
) {
    let started = Instant::now();
    let mut last = (0u64, 0u64, Instant::now());
    while !finished.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(250));
        let ops: u64 = progress.iter().map(|p| p.ops.load(Ordering::Relaxed)).sum();
        let bytes: u64 = progress
            .iter()
            .map(|p| p.bytes.load(Ordering::Relaxed))
            .sum();
        let errors: u64 = progress
            .iter()
            .map(|p| p.errors.load(Ordering::Relaxed))
            .sum();
        let dt = last.2.elapsed().as_secs_f64();
        if dt < 1.0 {
            continue;
        }
        let iops = (ops - last.0) as f64 / dt;
        let bw = (bytes - last.1) as f64 / dt;
        last = (ops, bytes, Instant::now());
        // Done fraction: the furthest-behind bound of the jobs that have one.
        let elapsed = started.elapsed().as_secs_f64();
        let mut fractions = Vec::new();
        for (k, &(i, _)) in clones.iter().enumerate() {
            let j = &jobs[i];
            let p = &progress[k];
            let f = if let Some(r) = j.runtime.filter(|_| j.time_based) {
                elapsed / (r + j.ramp_time).as_secs_f64().max(1e-3)
            } else if let Some(n) = j.number_ios {
                p.ops.load(Ordering::Relaxed) as f64 / n as f64
            } else if let Some(s) = j.size_bytes {
                p.bytes.load(Ordering::Relaxed) as f64 / s as f64
            } else {
                elapsed / j.runtime.map_or(1.0, |r| r.as_secs_f64().max(1e-3))
            };
            fractions.push(f.min(1.0));
        }
        let done = fractions.iter().copied().fold(1.0f64, f64::min);
        let eta_s = if done > 0.0 {
            elapsed / done - elapsed
        } else {
            0.0
        };
        eprint!(
            "\rJobs: {} [{:.1}% done] [{:.1}MiB/s] [{:.0} IOPS] [errors {}] [eta {:02}m:{:02}s]   ",
            clones.len(),
            done * 100.0,
            bw / (1 << 20) as f64,
            iops,
            errors,
            (eta_s as u64) / 60,
            (eta_s as u64) % 60
        );
        let _ = std::io::stderr().flush();
    }
    eprintln!();
}
