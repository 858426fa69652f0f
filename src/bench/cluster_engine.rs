//! `ioengine=cluster`: `client::Client` against a running cluster
//! (`servers` + `token_file`), or with `embedded` against a local 3-node
//! cluster of real daemons this process starts (`node::processes`, as
//! `quire up` does) and stops at the end.
//!
//! Appends (`rw=append`) go through one `client::Producer` per job: the
//! job's own thread keeps `iodepth` appends in flight on one connection
//! per node, each cut from one preallocated payload, and takes their
//! outcomes back as the runner polls; no thread per operation. Queue
//! produces, consumes with their acks and ledger adds (`rw=produce`,
//! `consume`, `ledger`) are pipelined on the job's thread in the same way
//! (`command_engine`). The other workloads (read, tail, mixed) use the
//! blocking client, so their `iodepth` operations in flight are `iodepth`
//! worker threads, each with its own connection and client id; the job's
//! thread hands them operations and collects completions over channels. The
//! replication block comes from the nodes' admin `/metrics`, read before
//! and after the run.

use super::engine::{ClusterCounters, Completion, Engine, EngineReport, FsyncBlock, Op, OpKind};
use super::error::{BenchError, OpError};
use super::options::{JobOptions, Workload};
use crate::client::{Client, Producer, ProducerConfig, Ticket};
use crate::node::local::processes::LocalProcesses;
use crate::tls::{ClientTls, ClientTlsFiles};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Records written before a read workload, so reads have something to hit.
const PREFILL_RECORDS: usize = 256;
/// How long one tail operation long-polls for a new entry.
const TAIL_WAIT_MS: u32 = 1000;

/// Where the cluster is: addresses and the token.
#[derive(Clone, Debug)]
pub struct ClusterTarget {
    /// Client addresses.
    pub clients: Vec<SocketAddr>,
    /// Admin addresses (may be empty: then no replication block).
    pub admin: Vec<SocketAddr>,
    /// Client token.
    pub token: Vec<u8>,
    /// The disk the nodes log to, when known (embedded).
    pub device: Option<String>,
    /// What the report should say about the cluster (embedded: which
    /// daemon binary, where).
    pub note: Option<String>,
    /// The daemons' PIDs, when this process started them (embedded): for
    /// their CPU time per operation.
    pub pids: Vec<u32>,
    /// TLS to the nodes, if they serve it.
    pub tls: Option<Arc<ClientTls>>,
}

impl ClusterTarget {
    /// A blocking client of the cluster as client `id`.
    pub(super) fn client(&self, id: u64) -> Client {
        let c = Client::new(self.clients.clone(), &self.token, id);
        match &self.tls {
            Some(tls) => c.with_tls(Arc::clone(tls)),
            None => c,
        }
    }
}

/// A local 3-node cluster started for the run; stopped when dropped.
pub struct EmbeddedCluster {
    processes: LocalProcesses,
    exe: PathBuf,
    dir: PathBuf,
}

impl EmbeddedCluster {
    /// Starts 3 daemons with `groups` groups under `directory` (or a
    /// fresh directory under the system temp dir), using the `quired` or
    /// `quire` binary next to this one, and waits for `group` to elect.
    pub fn start(
        directory: Option<&Path>,
        groups: u32,
        group: u32,
        tls: bool,
    ) -> Result<EmbeddedCluster, BenchError> {
        let own = std::env::current_exe().map_err(BenchError::io("finding quire-bench itself"))?;
        let bin_dir = own.parent().ok_or_else(|| BenchError::NoDaemon {
            bin_dir: own.clone(),
        })?;
        // Both run the daemon; of the two, the one built last, since a
        // target directory can hold a stale one beside a fresh build.
        let exe = ["quire", "quired"]
            .iter()
            .map(|n| bin_dir.join(n))
            .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
            .max()
            .map(|(_, p)| p)
            .ok_or_else(|| BenchError::NoDaemon {
                bin_dir: bin_dir.to_path_buf(),
            })?;
        let dir = directory
            .map_or_else(std::env::temp_dir, Path::to_path_buf)
            .join(format!("quire-bench-cluster.{}", std::process::id()));
        let mut processes = if tls {
            LocalProcesses::prepare_tls(&dir, 3, groups, &exe)?
        } else {
            LocalProcesses::prepare(&dir, 3, groups, &exe)?
        };
        processes.start_all()?;
        let cluster = EmbeddedCluster {
            processes,
            exe,
            dir,
        };
        let mut c = cluster.target()?.client(1);
        c.deadline = Duration::from_secs(30);
        c.append(group, b"quire-bench warm-up")
            .map_err(|source| BenchError::NoLeader {
                dir: cluster.dir.clone(),
                source,
            })?;
        Ok(cluster)
    }

    /// How to reach it.
    pub fn target(&self) -> Result<ClusterTarget, BenchError> {
        Ok(ClusterTarget {
            clients: self.processes.client_addrs(),
            admin: self.processes.nodes.values().map(|n| n.admin).collect(),
            token: self.processes.token.clone(),
            device: super::host::device_of(&self.dir),
            note: Some(format!(
                "cluster: embedded, 3 daemons of {} in {}",
                self.exe.display(),
                self.dir.display()
            )),
            pids: self
                .processes
                .nodes
                .values()
                .filter_map(|n| n.child.as_ref().map(|c| c.id()))
                .collect(),
            tls: self.processes.client_tls()?,
        })
    }
}

impl Drop for EmbeddedCluster {
    fn drop(&mut self) {
        self.processes.stop_all();
        // Only the directory this run named for itself is removed.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The target of `job` when it names servers (not embedded).
pub fn external_target(job: &JobOptions) -> Result<ClusterTarget, BenchError> {
    let resolve = |list: &[String]| -> Result<Vec<SocketAddr>, BenchError> {
        let mut out = Vec::new();
        for a in list {
            let addr = a
                .to_socket_addrs()
                .map_err(|e| BenchError::Address {
                    addr: a.clone(),
                    source: Some(e),
                })?
                .next()
                .ok_or_else(|| BenchError::Address {
                    addr: a.clone(),
                    source: None,
                })?;
            out.push(addr);
        }
        Ok(out)
    };
    let token_file = job
        .token_file
        .as_ref()
        .ok_or_else(|| BenchError::usage("--servers needs --token_file"))?;
    let token =
        crate::io::private::read_capped(token_file, crate::io::private::SECRET_FILE_BYTES_MAX)
            .map_err(BenchError::io(token_file.display().to_string()))?;
    let tls = match &job.ca {
        Some(ca) => Some(ClientTls::load(&ClientTlsFiles {
            ca: ca.clone(),
            ..ClientTlsFiles::default()
        })?),
        None => None,
    };
    Ok(ClusterTarget {
        clients: resolve(&job.servers)?,
        admin: resolve(&job.admin)?,
        token: token.trim_ascii_end().to_vec(),
        device: None,
        note: None,
        pids: Vec::new(),
        tls,
    })
}

/// A point-in-time reading of every node's `/metrics`: (node index, metric
/// with labels) -> value.
type MetricsSnapshot = BTreeMap<(usize, String), f64>;

fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut body = String::new();
    s.take(16 << 20).read_to_string(&mut body)?;
    Ok(body
        .split_once("\r\n\r\n")
        .map_or(body.clone(), |(_, b)| b.to_string()))
}

/// Reads every admin endpoint's metrics (nodes that do not answer are left out).
fn metrics(admin: &[SocketAddr]) -> MetricsSnapshot {
    let mut out = BTreeMap::new();
    for (i, &a) in admin.iter().enumerate() {
        let Ok(text) = http_get(a, "/metrics") else {
            continue;
        };
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            if let Some((name, value)) = line.rsplit_once(' ') {
                if let Ok(v) = value.parse::<f64>() {
                    out.insert((i, name.to_string()), v);
                }
            }
        }
    }
    out
}

/// Sum over nodes of metric `name` (any labels) in `m`.
fn sum(m: &MetricsSnapshot, name: &str) -> f64 {
    m.iter()
        .filter(|((_, k), _)| k == name || k.starts_with(&format!("{name}{{")))
        .map(|(_, v)| v)
        .sum()
}

/// True if some node exports the metric `name` (any labels).
fn exported(m: &MetricsSnapshot, name: &str) -> bool {
    m.keys()
        .any(|(_, k)| k == name || k.starts_with(&format!("{name}{{")))
}

fn get(m: &MetricsSnapshot, node: usize, key: &str) -> Option<f64> {
    m.get(&(node, key.to_string())).copied()
}

/// The cluster engine of one job clone.
pub struct ClusterEngine {
    mode: Mode,
    target: ClusterTarget,
    group: u32,
    before: MetricsSnapshot,
}

/// How the engine keeps operations in flight.
enum Mode {
    /// Appends, on the job's own thread.
    Pipelined(Box<Pipelined>),
    /// Queue and ledger commands, on the job's own thread.
    Commands(Box<super::command_engine::Commands>),
    /// Every other workload, on blocking clients in worker threads.
    Threads(Threads),
}

/// The producer of an append job.
struct Pipelined {
    producer: Producer,
    group: u32,
    /// Every record is a prefix of this one buffer.
    payload: Vec<u8>,
    /// The operation behind each ticket, and its bytes.
    ops: HashMap<Ticket, (u64, u64)>,
}

/// The worker threads of a blocking workload.
struct Threads {
    ops: Option<Sender<Op>>,
    completions: Receiver<Completion>,
    workers: Vec<JoinHandle<()>>,
}

impl ClusterEngine {
    /// Opens the engine of clone `clone_index` of `job` against `target`:
    /// a producer for appends, `job.iodepth` client workers otherwise.
    pub fn open(
        job: &JobOptions,
        clone_index: u64,
        target: ClusterTarget,
    ) -> Result<ClusterEngine, BenchError> {
        let group = job.group;
        // Random per process (pids are reused), distinct per worker.
        let base = crate::client::random_client_id().map_err(BenchError::io("a client id"))?;
        let client_id = |worker: u64| (base ^ (clone_index << 16) ^ worker).max(1);
        let mode = match job.rw {
            Workload::Append => {
                Mode::Pipelined(Box::new(Pipelined::open(job, &target, client_id(0xfffd))?))
            }
            Workload::Produce | Workload::Consume | Workload::Ledger => Mode::Commands(Box::new(
                super::command_engine::Commands::open(job, &target, client_id(0xfffc))?,
            )),
            _ => Mode::Threads(Threads::open(job, &target, client_id)?),
        };
        let before = metrics(&target.admin);
        Ok(ClusterEngine {
            mode,
            target,
            group,
            before,
        })
    }
}

impl Pipelined {
    /// A producer for `job`: `iodepth` requests in flight at most per
    /// connection (so, by default, one append per request), and the job's
    /// `linger_us` and `batch_bytes_max`. It learns the leader before the
    /// run starts.
    fn open(
        job: &JobOptions,
        target: &ClusterTarget,
        client_id: u64,
    ) -> Result<Pipelined, BenchError> {
        let config = ProducerConfig {
            in_flight_max: job.in_flight_max.unwrap_or(job.iodepth),
            linger_us: job.linger_us,
            batch_bytes_max: job.batch_bytes_max,
            pending_max: job.iodepth.max(1),
            ..ProducerConfig::default()
        };
        // The leader, learnt by one blocking append (under another client
        // id): an error here is not the run's, whose appends will say what
        // is wrong, counted by kind.
        let mut c = target.client(client_id ^ 1);
        c.deadline = Duration::from_secs(2);
        let _ = c.append(job.group, b"quire-bench: the leader");
        let mut producer = Producer::with_leaders(
            target.clients.clone(),
            &target.token,
            client_id,
            config,
            c.known_leaders().clone(),
        );
        if let Some(tls) = &target.tls {
            producer = producer.with_tls(Arc::clone(tls));
        }
        Ok(Pipelined {
            producer,
            group: job.group,
            payload: vec![0xa5u8; job.bs.max_bytes as usize],
            ops: HashMap::new(),
        })
    }

    fn submit(&mut self, op: Op) -> Result<(), BenchError> {
        let t = self
            .producer
            .send(self.group, &self.payload[..op.bytes])
            .map_err(|source| BenchError::Send {
                what: "appends",
                source,
            })?;
        self.ops.insert(t, (op.id, op.bytes as u64));
        Ok(())
    }

    fn poll(&mut self, timeout: Duration, done: &mut Vec<Completion>) {
        let mut wait = timeout;
        while let Some(c) = self.producer.poll(wait) {
            wait = Duration::ZERO;
            let Some((id, bytes)) = self.ops.remove(&c.ticket) else {
                continue;
            };
            done.push(Completion {
                id,
                result: c.result.map(|_| bytes).map_err(OpError::Client),
                finished: None,
            });
        }
    }
}

impl Threads {
    /// Starts `job.iodepth` client workers against `target`.
    fn open(
        job: &JobOptions,
        target: &ClusterTarget,
        client_id: impl Fn(u64) -> u64,
    ) -> Result<Threads, BenchError> {
        let group = job.group;
        let highest = Arc::new(AtomicU64::new(0));
        if matches!(job.rw, Workload::Read | Workload::Mixed | Workload::Tail) {
            let mut c = target.client(client_id(0xffff));
            let records = vec![vec![0xa5u8; job.bs.max_bytes as usize]; PREFILL_RECORDS];
            let indexes = c
                .append_all(group, &records, 32, 1)
                .map_err(BenchError::client(format!("prefilling group {group}")))?;
            highest.store(indexes.last().copied().unwrap_or(0), Ordering::Relaxed);
        }
        let (op_tx, op_rx) = crossbeam_channel::bounded::<Op>(job.iodepth);
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        let mut workers = Vec::new();
        for w in 0..job.iodepth as u64 {
            let (op_rx, done_tx, highest) = (op_rx.clone(), done_tx.clone(), highest.clone());
            let mut client = target.client(client_id(w));
            let rw = job.rw;
            let mut rng = ChaCha8Rng::seed_from_u64(job.seed ^ w);
            let handle = std::thread::Builder::new()
                .name(format!("bench-client-{w}"))
                .spawn(move || {
                    let mut tail_from = highest.load(Ordering::Relaxed) + 1;
                    for op in op_rx {
                        let result: Result<u64, OpError> = match (op.kind, rw) {
                            (OpKind::Write, _) => client
                                .append(group, &vec![0xa5u8; op.bytes])
                                .map(|index| {
                                    highest.fetch_max(index, Ordering::Relaxed);
                                    op.bytes as u64
                                })
                                .map_err(OpError::Client),
                            (OpKind::Read, Workload::Tail) => client
                                .tail(group, tail_from, TAIL_WAIT_MS)
                                .map(|entries| {
                                    tail_from += entries.len() as u64;
                                    entries.iter().map(|e| e.data.len() as u64).sum()
                                })
                                .map_err(OpError::Client),
                            (OpKind::Read, _) => {
                                let top = highest.load(Ordering::Relaxed).max(1);
                                let at = rng.gen_range(1..=top);
                                client
                                    .read(group, at, 1)
                                    .map(|entries| {
                                        entries.iter().map(|e| e.data.len() as u64).sum()
                                    })
                                    .map_err(OpError::Client)
                            }
                        };
                        let c = Completion {
                            id: op.id,
                            result,
                            finished: Some(Instant::now()),
                        };
                        if done_tx.send(c).is_err() {
                            return;
                        }
                    }
                })
                .map_err(BenchError::io("starting a client thread"))?;
            workers.push(handle);
        }
        Ok(Threads {
            ops: Some(op_tx),
            completions: done_rx,
            workers,
        })
    }
}

impl Engine for ClusterEngine {
    fn submit(&mut self, op: Op, _done: &mut Vec<Completion>) -> Result<(), BenchError> {
        match &mut self.mode {
            Mode::Pipelined(p) => p.submit(op),
            Mode::Commands(c) => c.submit(op),
            // The runner keeps at most iodepth in flight, so this never blocks.
            Mode::Threads(t) => t
                .ops
                .as_ref()
                .ok_or(BenchError::Misuse("submit after finish"))?
                .send(op)
                .map_err(|_| BenchError::Stopped("the client threads")),
        }
    }

    fn poll(&mut self, timeout: Duration, done: &mut Vec<Completion>) -> Result<(), BenchError> {
        let t = match &mut self.mode {
            Mode::Pipelined(p) => {
                p.poll(timeout, done);
                return Ok(());
            }
            Mode::Commands(c) => {
                c.poll(timeout, done);
                return Ok(());
            }
            Mode::Threads(t) => t,
        };
        match t.completions.recv_timeout(timeout) {
            Ok(c) => done.push(c),
            Err(RecvTimeoutError::Timeout) => return Ok(()),
            Err(RecvTimeoutError::Disconnected) => {
                return Err(BenchError::Stopped("the client threads"))
            }
        }
        done.extend(t.completions.try_iter());
        Ok(())
    }

    fn finish(&mut self) -> Result<EngineReport, BenchError> {
        if let Mode::Threads(t) = &mut self.mode {
            t.ops = None;
            for w in t.workers.drain(..) {
                w.join()
                    .map_err(|_| BenchError::Panicked("a client thread"))?;
            }
        }
        let after = metrics(&self.target.admin);
        let mut report = EngineReport {
            devices: self.target.device.iter().cloned().collect(),
            notes: self.target.note.iter().cloned().collect(),
            ..EngineReport::default()
        };
        if after.is_empty() {
            report.notes.push(
                "cluster: no admin endpoint answered (give --admin): no replication block".into(),
            );
            return Ok(report);
        }
        let diff = |name: &str| (sum(&after, name) - sum(&self.before, name)).max(0.0) as u64;
        let g = self.group;
        let term_key = format!("quire_raft_term{{group=\"{g}\"}}");
        let max_term = |m: &MetricsSnapshot| {
            (0..self.target.admin.len())
                .filter_map(|i| get(m, i, &term_key))
                .fold(0.0f64, f64::max)
        };
        let leader = (0..self.target.admin.len())
            .find(|&i| {
                get(&after, i, &format!("quire_raft_is_leader{{group=\"{g}\"}}")) == Some(1.0)
            })
            .map(|i| i as u64 + 1);
        report.replication = Some(ClusterCounters {
            nack_rounds: diff("quire_transport_nack_rounds"),
            // `n/a` from nodes that predate the metric, not a false 0.
            retransmits: exported(&after, "quire_transport_retransmits")
                .then(|| diff("quire_transport_retransmits")),
            datagrams_sent: diff("quire_transport_datagrams_sent"),
            sends_refused: diff("quire_transport_sends_refused"),
            leader_changes: (max_term(&after) - max_term(&self.before)).max(0.0) as u64,
            elections: diff("quire_raft_elections_started"),
            leader,
            bad_datagrams: diff("quire_transport_mac_failures")
                + diff("quire_transport_malformed_dropped"),
        });
        for i in 0..self.target.admin.len() {
            let key = |m: &str| format!("quire_{m}{{group=\"{g}\"}}");
            let (Some(p50), Some(p99)) = (
                get(&after, i, &key("wal_flush_latency_p50_us")),
                get(&after, i, &key("wal_flush_latency_p99_us")),
            ) else {
                continue;
            };
            let flushes = get(&after, i, &key("wal_flushes")).unwrap_or(0.0)
                - get(&self.before, i, &key("wal_flushes")).unwrap_or(0.0);
            report.fsync.push(FsyncBlock {
                disk: format!(
                    "node {} group {g}{}",
                    i + 1,
                    self.target
                        .device
                        .as_ref()
                        .map_or(String::new(), |d| format!(" ({d})"))
                ),
                flushes: flushes.max(0.0) as u64,
                percentiles_ns: vec![(50.0, p50 as u64 * 1000), (99.0, p99 as u64 * 1000)],
                mean_ns: None,
                max_ns: None,
                records_per_flush_p50: None,
                bytes_per_flush: None,
                disk_bytes_per_s: None,
            });
        }
        report.notes.push(
            "cluster: fsync percentiles are each node's since it started (admin /metrics)".into(),
        );
        Ok(report)
    }
}
