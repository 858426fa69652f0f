//! Job options: one flat set of fio-style names, parsed the same way from
//! command-line flags (`--bs=4k`) and job-file lines (`bs=4k`). Pure: text
//! in, a validated [`JobOptions`] out; every bad value is a [`UsageError`]
//! naming the option and where it came from, never a panic (job files are
//! untrusted input).

use crate::transport::TransportConfig;
use std::path::PathBuf;
use std::time::Duration;

/// A bad flag, job file or option value: quire-bench exits with code 2.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

impl From<String> for UsageError {
    fn from(why: String) -> Self {
        UsageError(why)
    }
}

impl From<&str> for UsageError {
    fn from(why: &str) -> Self {
        UsageError(why.into())
    }
}

/// Which path is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    /// The storage path alone: `storage::Wal` on `directory`.
    Wal,
    /// The replication transport between two local endpoints.
    Udp,
    /// The client library against a cluster.
    Cluster,
}

/// What each operation does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Appends (writes).
    Append,
    /// Reads of entries already written.
    Read,
    /// Long-polls for new committed entries (cluster).
    Tail,
    /// Queue produce (cluster).
    Produce,
    /// Queue consume + ack (cluster).
    Consume,
    /// Ledger adds, to one ledger per job (cluster).
    Ledger,
    /// Appends and reads, `rwmixwrite` percent appends.
    Mixed,
}

/// How intended start times are spaced under `rate_iops`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RateProcess {
    /// Evenly: one every 1/rate seconds.
    Linear,
    /// Exponential gaps with mean 1/rate (arrivals of many independent clients).
    Poisson,
}

/// Record size of each operation: fixed, or uniform over a range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSize {
    /// Smallest size, bytes.
    pub min_bytes: u64,
    /// Largest size, bytes (equal to `min_bytes` for a fixed size).
    pub max_bytes: u64,
}

/// The datagram path of `ioengine=udp` between two network namespaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetBackend {
    /// Kernel UDP sockets.
    Sockets,
    /// AF_XDP (copy mode on the namespaces' veths).
    Xdp,
}

/// Everything one job is configured with.
#[derive(Clone, Debug)]
pub struct JobOptions {
    /// Job name (the section name of a job file, or `--name`).
    pub name: String,
    /// Engine.
    pub ioengine: EngineKind,
    /// Workload.
    pub rw: Workload,
    /// Percent of mixed operations that write.
    pub rwmixwrite: u32,
    /// Record size.
    pub bs: BlockSize,
    /// Operations in flight at once, per job.
    pub iodepth: usize,
    /// Clones of this job, each with its own engine and thread.
    pub numjobs: usize,
    /// Bytes each job issues (unless time based).
    pub size_bytes: Option<u64>,
    /// Operations each job issues (unless time based).
    pub number_ios: Option<u64>,
    /// Run length cap (or length, with `time_based`).
    pub runtime: Option<Duration>,
    /// Run for `runtime` however much was issued.
    pub time_based: bool,
    /// Warm-up not counted in the results.
    pub ramp_time: Duration,
    /// Open-loop target rate, operations per second per job.
    pub rate_iops: Option<u64>,
    /// Spacing of intended start times.
    pub rate_process: RateProcess,
    /// Start only after every job before this one has finished (and
    /// begin a new reporting group), as fio's `stonewall`.
    pub stonewall: bool,
    /// Report all jobs of a group as one.
    pub group_reporting: bool,
    /// clat percentiles to print, in percent.
    pub percentile_list: Vec<f64>,
    /// Directory for the wal engine.
    pub directory: Option<PathBuf>,
    /// Segment size of the wal engine's log.
    pub wal_segment_bytes: u64,
    /// Prefix of the per-interval latency logs, if any.
    pub write_lat_log: Option<String>,
    /// Interval of the logs and of the plot, ms.
    pub log_avg_msec: u64,
    /// Cluster client addresses (`--servers`).
    pub servers: Vec<String>,
    /// Cluster admin addresses, for the replication block (`--admin`).
    pub admin: Vec<String>,
    /// File holding the client token.
    pub token_file: Option<PathBuf>,
    /// Start a local 3-node cluster instead of using `servers`.
    pub embedded: bool,
    /// Speak TLS to the cluster: `--embedded` makes its daemons serve it
    /// (a CA of its own); with `servers`, `ca` names the CA to trust.
    pub tls: bool,
    /// The CA certificates (PEM) of `servers`' certificates (implies `tls`).
    pub ca: Option<PathBuf>,
    /// Raft group the cluster engine writes to.
    pub group: u32,
    /// Queue name for produce/consume.
    pub queue: String,
    /// Cluster appends: how long the producer lets a batch's first
    /// record wait for others, µs (`ProducerConfig::linger_us`).
    pub linger_us: u64,
    /// Cluster appends: most record bytes in one batch request.
    pub batch_bytes_max: usize,
    /// Cluster appends: requests in flight per connection at most
    /// (default: iodepth, so each append is a request of its own).
    pub in_flight_max: Option<usize>,
    /// Percent of datagrams nftables drops (udp engine; root and nft only).
    pub loss_percent: u32,
    /// UDP GSO/GRO for the udp engine.
    pub udp_offload: bool,
    /// Path MTU the udp engine's transport cuts datagrams for, bytes
    /// (`TransportConfig::mtu_bytes`; datagrams are 48 bytes shorter).
    pub udp_mtu_bytes: usize,
    /// The udp engine between two network namespaces on a bridge, over
    /// this datagram path (`None`: both ends on 127.0.0.1, sockets).
    pub net_backend: Option<NetBackend>,
    /// Seed of the size and Poisson generators.
    pub seed: u64,
}

impl Default for JobOptions {
    fn default() -> Self {
        JobOptions {
            name: "job".into(),
            ioengine: EngineKind::Wal,
            rw: Workload::Append,
            rwmixwrite: 50,
            bs: BlockSize {
                min_bytes: 4096,
                max_bytes: 4096,
            },
            iodepth: 1,
            numjobs: 1,
            size_bytes: None,
            number_ios: None,
            runtime: None,
            time_based: false,
            ramp_time: Duration::ZERO,
            rate_iops: None,
            rate_process: RateProcess::Linear,
            stonewall: false,
            group_reporting: false,
            percentile_list: DEFAULT_PERCENTILES.to_vec(),
            directory: None,
            wal_segment_bytes: 64 << 20,
            write_lat_log: None,
            log_avg_msec: 0,
            servers: Vec::new(),
            admin: Vec::new(),
            token_file: None,
            embedded: false,
            tls: false,
            ca: None,
            group: 0,
            queue: "bench".into(),
            linger_us: 0,
            batch_bytes_max: 64 << 10,
            in_flight_max: None,
            loss_percent: 0,
            udp_offload: true,
            udp_mtu_bytes: TransportConfig::default().mtu_bytes,
            net_backend: None,
            seed: 1,
        }
    }
}

/// Client threads (iodepth x numjobs) the cluster engine may start for
/// the workloads on the blocking client (all but append).
pub const CLUSTER_CLIENT_THREADS_MAX: usize = 1024;
/// Appends in flight per cluster append job: the producer's tickets, at
/// most the nodes' dedup window (`state::dedup::WINDOW`).
pub const CLUSTER_APPENDS_IN_FLIGHT_MAX: usize = crate::state::dedup::WINDOW;

/// fio's default clat percentiles.
pub const DEFAULT_PERCENTILES: [f64; 17] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95,
    99.99,
];

/// Every option name a job accepts, for error messages and the docs.
pub const JOB_OPTION_NAMES: &[&str] = &[
    "name",
    "ioengine",
    "rw",
    "readwrite",
    "rwmixwrite",
    "rwmixread",
    "bs",
    "blocksize",
    "bsrange",
    "iodepth",
    "numjobs",
    "size",
    "number_ios",
    "runtime",
    "time_based",
    "ramp_time",
    "rate_iops",
    "rate_process",
    "stonewall",
    "wait_for_previous",
    "group_reporting",
    "percentile_list",
    "directory",
    "wal_segment_bytes",
    "write_lat_log",
    "log_avg_msec",
    "servers",
    "admin",
    "token_file",
    "embedded",
    "tls",
    "ca",
    "group",
    "queue",
    "linger_us",
    "batch_bytes_max",
    "in_flight_max",
    "loss",
    "udp_offload",
    "udp_mtu",
    "net_backend",
    "randseed",
];

/// Parses a size: bytes, or with a binary suffix (`4k`, `64KiB`, `1m`, `2g`),
/// as fio does by default (k = 1024).
pub fn parse_size(text: &str) -> Result<u64, UsageError> {
    let t = text.trim();
    let digits_end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits_end);
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => {
            return Err(UsageError(format!(
                "unknown size suffix {other:?} in {text:?}"
            )))
        }
    };
    let n: f64 = num
        .parse()
        .map_err(|_| UsageError(format!("{text:?} is not a size (e.g. 4096, 4k, 1m)")))?;
    let bytes = n * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 / 2.0 {
        return Err(UsageError(format!("size {text:?} is out of range")));
    }
    Ok(bytes as u64)
}

/// Parses a duration: seconds by default, as fio does, or with a unit
/// (`us`, `ms`, `s`, `m`, `h`).
pub fn parse_duration(text: &str) -> Result<Duration, UsageError> {
    let t = text.trim();
    let digits_end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(digits_end);
    let n: f64 = num
        .parse()
        .map_err(|_| UsageError(format!("{text:?} is not a duration (e.g. 10, 500ms, 2m)")))?;
    let secs = match unit.trim() {
        "" | "s" => n,
        "us" => n / 1e6,
        "ms" => n / 1e3,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        other => {
            return Err(UsageError(format!(
                "unknown time unit {other:?} in {text:?}"
            )))
        }
    };
    if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
        return Err(UsageError(format!("duration {text:?} is out of range")));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn parse_bool(text: &str) -> Result<bool, UsageError> {
    match text.trim().to_ascii_lowercase().as_str() {
        "" | "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        other => Err(UsageError(format!("{other:?} is not a boolean (1 or 0)"))),
    }
}

fn parse_num<T: std::str::FromStr>(text: &str, what: &str) -> Result<T, UsageError> {
    text.trim()
        .parse()
        .map_err(|_| UsageError(format!("{text:?} is not a valid {what}")))
}

fn parse_list(text: &str) -> Vec<String> {
    text.split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

impl JobOptions {
    /// Sets one option from its fio name and text value; `origin` says
    /// where it came from (a flag, or `FILE:LINE`) for the error message.
    pub fn set(&mut self, key: &str, value: &str, origin: &str) -> Result<(), UsageError> {
        self.set_inner(key, value)
            .map_err(|why| UsageError(format!("{origin}: option {key}={value:?}: {why}")))
    }

    fn set_inner(&mut self, key: &str, value: &str) -> Result<(), UsageError> {
        match key {
            "name" => {
                if value.trim().is_empty() {
                    return Err("a job name cannot be empty".into());
                }
                self.name = value.trim().to_string()
            }
            "ioengine" => {
                self.ioengine = match value.trim() {
                    "wal" => EngineKind::Wal,
                    "udp" => EngineKind::Udp,
                    "cluster" => EngineKind::Cluster,
                    _ => return Err("ioengine is one of wal, udp, cluster".into()),
                }
            }
            "rw" | "readwrite" => {
                self.rw = match value.trim() {
                    "append" | "write" => Workload::Append,
                    "read" => Workload::Read,
                    "tail" => Workload::Tail,
                    "produce" => Workload::Produce,
                    "consume" => Workload::Consume,
                    "ledger" => Workload::Ledger,
                    "mixed" | "rw" | "readwrite" => Workload::Mixed,
                    _ => {
                        return Err(
                            "rw is one of append, read, tail, produce, consume, ledger, mixed"
                                .into(),
                        )
                    }
                }
            }
            "rwmixwrite" => self.rwmixwrite = percent(value)?,
            "rwmixread" => self.rwmixwrite = 100 - percent(value)?,
            "bs" | "blocksize" | "bsrange" => self.bs = parse_block_size(value)?,
            "iodepth" => self.iodepth = bounded(value, "iodepth", 1, 65_536)? as usize,
            "numjobs" => self.numjobs = bounded(value, "numjobs", 1, 1024)? as usize,
            "size" => self.size_bytes = Some(parse_size(value)?.max(1)),
            "number_ios" => self.number_ios = Some(bounded(value, "number_ios", 1, u64::MAX)?),
            "runtime" => self.runtime = Some(parse_duration(value)?),
            "time_based" => self.time_based = parse_bool(value)?,
            "ramp_time" => self.ramp_time = parse_duration(value)?,
            "rate_iops" => self.rate_iops = Some(bounded(value, "rate_iops", 1, 100_000_000)?),
            "rate_process" => {
                self.rate_process = match value.trim() {
                    "linear" => RateProcess::Linear,
                    "poisson" => RateProcess::Poisson,
                    _ => return Err("rate_process is linear or poisson".into()),
                }
            }
            "stonewall" | "wait_for_previous" => self.stonewall = parse_bool(value)?,
            "group_reporting" => self.group_reporting = parse_bool(value)?,
            "percentile_list" => {
                let mut list = Vec::new();
                for p in value.split(':').filter(|p| !p.trim().is_empty()) {
                    let p: f64 = parse_num(p, "percentile")?;
                    if !(p > 0.0 && p <= 100.0) {
                        return Err(UsageError(format!("percentile {p} is not in (0, 100]")));
                    }
                    list.push(p);
                }
                if list.is_empty() || list.len() > 64 {
                    return Err("give 1 to 64 percentiles separated by ':'".into());
                }
                self.percentile_list = list;
            }
            "directory" => self.directory = Some(PathBuf::from(value.trim())),
            "wal_segment_bytes" => {
                let b = parse_size(value)?;
                if !(1 << 20..=1 << 40).contains(&b) || b % 4096 != 0 {
                    return Err("a multiple of 4k between 1m and 1t".into());
                }
                self.wal_segment_bytes = b;
            }
            "write_lat_log" => {
                let v = value.trim();
                self.write_lat_log = Some(if v.is_empty() {
                    self.name.clone()
                } else {
                    v.into()
                })
            }
            "log_avg_msec" => self.log_avg_msec = bounded(value, "log_avg_msec", 0, 3_600_000)?,
            "servers" => self.servers = parse_list(value),
            "admin" => self.admin = parse_list(value),
            "token_file" => self.token_file = Some(PathBuf::from(value.trim())),
            "embedded" => self.embedded = parse_bool(value)?,
            "tls" => self.tls = parse_bool(value)?,
            "ca" => {
                self.ca = Some(PathBuf::from(value.trim()));
                self.tls = true;
            }
            "group" => self.group = bounded(value, "group", 0, u32::MAX as u64)? as u32,
            "queue" => {
                if value.trim().is_empty() || value.len() > 200 {
                    return Err("a queue name of 1 to 200 bytes".into());
                }
                self.queue = value.trim().into()
            }
            "linger_us" => self.linger_us = bounded(value, "linger_us", 0, 60_000_000)?,
            "batch_bytes_max" => {
                let b = parse_size(value)?;
                if !(1..=16 << 20).contains(&b) {
                    return Err("batch_bytes_max is 1 to 16m".into());
                }
                self.batch_bytes_max = b as usize;
            }
            "in_flight_max" => {
                self.in_flight_max = Some(bounded(value, "in_flight_max", 1, 65_536)? as usize)
            }
            "loss" => self.loss_percent = percent(value)?,
            "udp_offload" => self.udp_offload = parse_bool(value)?,
            // The transport's own bounds (a datagram fits one IPv4 UDP
            // payload; 576 is the IPv4 minimum).
            "udp_mtu" => self.udp_mtu_bytes = bounded(value, "udp_mtu", 576, 65_535)? as usize,
            "net_backend" => {
                self.net_backend = Some(match value {
                    "sockets" => NetBackend::Sockets,
                    "xdp" => NetBackend::Xdp,
                    _ => return Err("net_backend is sockets or xdp".into()),
                })
            }
            "randseed" => self.seed = parse_num(value, "seed")?,
            _ => {
                return Err(UsageError(format!(
                    "unknown option; job options are: {}",
                    JOB_OPTION_NAMES.join(", ")
                )))
            }
        }
        Ok(())
    }

    /// Checks the combination of options once all are set.
    pub fn validate(&self) -> Result<(), UsageError> {
        let fail = |why: String| Err(UsageError(format!("job {:?}: {why}", self.name)));
        if self.size_bytes.is_none() && self.number_ios.is_none() && self.runtime.is_none() {
            return fail("give --size, --number_ios or --runtime (with --time_based)".into());
        }
        if self.time_based && self.runtime.is_none() {
            return fail("time_based needs runtime".into());
        }
        match (self.ioengine, self.rw) {
            (EngineKind::Wal, Workload::Append | Workload::Read | Workload::Mixed) => {
                if self.directory.is_none() {
                    return fail("ioengine=wal needs --directory on the disk under test".into());
                }
            }
            (EngineKind::Udp, Workload::Append) => {}
            (EngineKind::Cluster, _) => {
                if !self.embedded && self.servers.is_empty() {
                    return fail(
                        "ioengine=cluster needs --servers host:port,... and --token_file, or --embedded"
                            .into(),
                    );
                }
                if !self.embedded && self.token_file.is_none() {
                    return fail("--servers needs --token_file".into());
                }
                if self.tls && !self.embedded && self.ca.is_none() {
                    return fail(
                        "--tls with --servers needs --ca (the CA the nodes' certificates chain to)"
                            .into(),
                    );
                }
                if self.embedded && self.ca.is_some() {
                    return fail("--ca is for --servers: --embedded --tls makes its own CA".into());
                }
            }
            (engine, rw) => {
                return fail(format!(
                    "rw={} is not supported by ioengine={} (wal: append, read, mixed; udp: append; \
                     cluster: append, read, tail, mixed, produce, consume, ledger)",
                    workload_name(rw),
                    engine_name(engine)
                ))
            }
        }
        if self.bs.min_bytes < 8 && self.ioengine == EngineKind::Udp {
            return fail("ioengine=udp needs bs of at least 8 bytes (the message id)".into());
        }
        let pipelined = self.ioengine == EngineKind::Cluster && self.rw == Workload::Append;
        if pipelined && self.iodepth > CLUSTER_APPENDS_IN_FLIGHT_MAX {
            // One producer keeps them in flight; its tickets are bounded
            // by the nodes' dedup window.
            return fail(format!(
                "ioengine=cluster rw=append keeps at most {CLUSTER_APPENDS_IN_FLIGHT_MAX} appends in flight per job (iodepth)"
            ));
        }
        if self.ioengine == EngineKind::Cluster
            && !pipelined
            && self.iodepth.saturating_mul(self.numjobs) > CLUSTER_CLIENT_THREADS_MAX
        {
            // Each operation in flight is a client thread with a connection.
            return fail(format!(
                "ioengine=cluster runs one client thread per operation in flight: \
                 iodepth x numjobs is at most {CLUSTER_CLIENT_THREADS_MAX}"
            ));
        }
        if self.bs.max_bytes > 16 << 20 {
            return fail("bs is at most 16m".into());
        }
        if self.loss_percent > 0 && self.ioengine != EngineKind::Udp {
            return fail("loss applies to ioengine=udp only".into());
        }
        if self.net_backend.is_some() && self.ioengine != EngineKind::Udp {
            return fail("net_backend applies to ioengine=udp only".into());
        }
        Ok(())
    }

    /// The interval of logs and plot points.
    pub fn interval(&self) -> Duration {
        Duration::from_millis(if self.log_avg_msec == 0 {
            1000
        } else {
            self.log_avg_msec
        })
    }
}

fn percent(value: &str) -> Result<u32, UsageError> {
    Ok(bounded(value, "percentage", 0, 100)? as u32)
}

fn bounded(value: &str, what: &str, lo: u64, hi: u64) -> Result<u64, UsageError> {
    let n: u64 = parse_num(value, what)?;
    if n < lo || n > hi {
        return Err(UsageError(format!("{what} must be between {lo} and {hi}")));
    }
    Ok(n)
}

/// Parses `4k` or a range `1k-64k` (also `1k:64k`).
pub fn parse_block_size(value: &str) -> Result<BlockSize, UsageError> {
    let (lo, hi) = match value.split_once(['-', ':']) {
        Some((a, b)) => (parse_size(a)?, parse_size(b)?),
        None => {
            let s = parse_size(value)?;
            (s, s)
        }
    };
    if lo == 0 || hi < lo {
        return Err("bs must be positive, and a range low-high with low <= high".into());
    }
    Ok(BlockSize {
        min_bytes: lo,
        max_bytes: hi,
    })
}

/// The fio name of an engine.
pub fn engine_name(e: EngineKind) -> &'static str {
    match e {
        EngineKind::Wal => "wal",
        EngineKind::Udp => "udp",
        EngineKind::Cluster => "cluster",
    }
}

/// The fio name of a workload.
pub fn workload_name(w: Workload) -> &'static str {
    match w {
        Workload::Append => "append",
        Workload::Read => "read",
        Workload::Tail => "tail",
        Workload::Produce => "produce",
        Workload::Consume => "consume",
        Workload::Ledger => "ledger",
        Workload::Mixed => "mixed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations() {
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("512"), Ok(512));
        assert!(parse_size("4q").is_err());
        assert!(parse_size("").is_err());
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("-1").is_err());
        assert_eq!(
            parse_block_size("1k-64k"),
            Ok(BlockSize {
                min_bytes: 1024,
                max_bytes: 65536
            })
        );
        assert!(parse_block_size("64k-1k").is_err());
    }

    #[test]
    fn udp_mtu_defaults_to_the_transport_and_is_bounded() {
        let mut o = JobOptions::default();
        assert_eq!(o.udp_mtu_bytes, TransportConfig::default().mtu_bytes);
        o.set("udp_mtu", "9000", "--udp_mtu").unwrap();
        assert_eq!(o.udp_mtu_bytes, 9000);
        for bad in ["575", "65536", "jumbo"] {
            let e = o.set("udp_mtu", bad, "--udp_mtu").unwrap_err();
            assert!(e.0.contains("udp_mtu"), "{bad}: {e}");
        }
    }

    #[test]
    fn bad_values_name_the_option() {
        let mut o = JobOptions::default();
        let e = o.set("iodepth", "0", "--iodepth").unwrap_err();
        assert!(e.0.contains("iodepth"), "{e}");
        assert!(o.set("nonsense", "1", "x.fio:3").is_err());
    }
}
