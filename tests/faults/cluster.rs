//! The cluster under test: real `quired` processes (`LocalProcesses`) with
//! the handles the faults need (signals, ports, cables, log directories)
//! and what the checks read back: each node's `/status` from its admin
//! endpoint and each node's committed log through the client protocol.
//! Nothing here injects a fault by itself; `nemesis` does.

use super::common;
use quire::client::Client;
use quire::consensus::NodeId;
use quire::node::local::processes::LocalProcesses;
use std::collections::{BTreeMap, BTreeSet};

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Generous bound for anything the cluster does after a fault heals (an
/// election, a restart, catching up): the machine has 2 shared cores and a
/// debug-ish build, so this is a liveness bound, not a performance goal.
pub const SERVE_BOUND: Duration = Duration::from_secs(30);

/// One entry as a node serves it: (index, term, data).
pub type LogEntry = (u64, u64, Vec<u8>);

/// A running cluster of `n` daemons on 127.0.0.1, one group (group 0).
pub struct Cluster {
    /// The processes, their configs, ports and cables.
    pub procs: LocalProcesses,
    /// Nodes stopped with SIGSTOP and not yet continued: their admin
    /// endpoint and client port do not answer, so reads skip them.
    pub paused: BTreeSet<NodeId>,
    /// Nodes killed and not yet restarted.
    pub dead: BTreeSet<NodeId>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// Prepares `n` nodes, lets `setup` adjust them (configs, daemon
    /// arguments) before anything starts, then starts every daemon.
    pub fn start(n: u64, setup: impl FnOnce(&mut LocalProcesses)) -> Cluster {
        let dir = tempfile::tempdir().expect("a temp dir");
        let exe = PathBuf::from(env!("CARGO_BIN_EXE_quired"));
        let mut procs = LocalProcesses::prepare(dir.path(), n, 1, &exe).expect("cluster prepared");
        for node in procs.nodes.values() {
            // No snapshots: the checks read every node's log from index 1,
            // which compaction would cut (a long run passes 100k entries).
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&node.config)
                .expect("the node config");
            writeln!(
                f,
                "\n[snapshot]\nentries = 1000000000\ninterval_ms = 86400000"
            )
            .expect("write the node config");
        }
        setup(&mut procs);
        procs.start_all().expect("daemons start");
        Cluster {
            procs,
            paused: BTreeSet::new(),
            dead: BTreeSet::new(),
            _dir: dir,
        }
    }

    /// Every node id.
    pub fn ids(&self) -> Vec<NodeId> {
        self.procs.nodes.keys().copied().collect()
    }

    /// Nodes that run and are not paused: the ones that can answer.
    pub fn live(&self) -> Vec<NodeId> {
        self.ids()
            .into_iter()
            .filter(|id| !self.paused.contains(id) && !self.dead.contains(id))
            .collect()
    }

    /// Node `id`'s UDP port (group 0).
    pub fn udp_port(&self, id: NodeId) -> u16 {
        self.procs.nodes[&id].udp
    }

    /// A client of every node, with `deadline` per call.
    pub fn client(&self, client_id: u64, deadline: Duration) -> Client {
        let mut c = Client::new(self.procs.client_addrs(), &self.procs.token, client_id);
        c.deadline = deadline;
        c
    }

    /// Node `id`'s `/status` JSON, or None if it does not answer within
    /// half a second (dead, paused, starting).
    pub fn status(&self, id: NodeId) -> Option<serde_json::Value> {
        http_get_json(self.procs.nodes[&id].admin, "/status")
    }

    /// How node `observer` classifies `peer` (up, ip-partitioned,
    /// serial-down, down, unknown), if it answers.
    pub fn peer_status(&self, observer: NodeId, peer: NodeId) -> Option<String> {
        let s = self.status(observer)?;
        s["peers"]
            .as_array()?
            .iter()
            .find(|p| p["peer"].as_u64() == Some(peer))
            .and_then(|p| p["status"].as_str().map(str::to_string))
    }

    /// Group 0 as node `id` sees it: (role, term, commit, disk).
    pub fn group0(&self, id: NodeId) -> Option<(String, u64, u64, String)> {
        let s = self.status(id)?;
        let g = &s["groups"][0];
        Some((
            g["role"].as_str()?.to_string(),
            g["term"].as_u64()?,
            g["commit"].as_u64()?,
            g["disk"].as_str()?.to_string(),
        ))
    }

    /// The leader of group 0 with the highest term among the nodes that
    /// answer, if one claims it.
    pub fn leader(&self) -> Option<NodeId> {
        self.live()
            .into_iter()
            .filter_map(|id| self.group0(id).map(|g| (id, g)))
            .filter(|(_, g)| g.0 == "leader")
            .max_by_key(|(_, g)| g.1)
            .map(|(id, _)| id)
    }

    /// True when every live node answers, classifies every other live
    /// node `up`, and exactly one of them leads at the highest term.
    pub fn healthy(&self) -> bool {
        let live = self.live();
        let mut leaders = 0;
        let mut top_term = 0;
        let mut top_leader = false;
        for &id in &live {
            let Some(s) = self.status(id) else {
                return false;
            };
            for &p in live.iter().filter(|&&p| p != id) {
                let st = s["peers"].as_array().and_then(|ps| {
                    ps.iter()
                        .find(|x| x["peer"].as_u64() == Some(p))
                        .and_then(|x| x["status"].as_str())
                });
                if st != Some("up") {
                    return false;
                }
            }
            let g = &s["groups"][0];
            let term = g["term"].as_u64().unwrap_or(0);
            let lead = g["role"].as_str() == Some("leader");
            leaders += usize::from(lead);
            if term > top_term {
                top_term = term;
                top_leader = lead;
            } else if term == top_term {
                top_leader |= lead;
            }
        }
        leaders == 1 && top_leader
    }

    /// Waits until `healthy` and an append confirms; returns how long it
    /// took. Panics past `SERVE_BOUND`: the cluster must serve again.
    pub fn wait_healthy(&self, what: &str) -> Duration {
        let mut c = self.client(fresh_client_id(), Duration::from_secs(2));
        // Unique values: the duplicate check judges these appends too.
        static CHECKS: AtomicU64 = AtomicU64::new(0);
        common::wait_for(
            &format!("the cluster to be healthy and serve again ({what})"),
            SERVE_BOUND,
            || {
                self.assert_none_exited(what);
                (self.healthy()
                    && c.append(
                        0,
                        format!(
                            "health check {} after {what}",
                            CHECKS.fetch_add(1, Ordering::Relaxed)
                        )
                        .as_bytes(),
                    )
                    .is_ok())
                .then_some(())
            },
        )
        .1
    }

    /// Panics, naming the node and the end of its log, if a daemon that
    /// should run has exited: no wait for health can end well then.
    pub fn assert_none_exited(&self, what: &str) {
        for id in self.live() {
            if self.procs.has_exited(id) {
                let log = std::fs::read_to_string(
                    self.procs.nodes[&id].config.with_file_name("quired.log"),
                )
                .unwrap_or_default();
                // A panic's message is above its backtrace: from there on.
                let lines: Vec<&str> = log.lines().collect();
                let from = lines
                    .iter()
                    .rposition(|l| l.contains("panicked"))
                    .unwrap_or(lines.len().saturating_sub(1));
                panic!(
                    "node {id} exited during {what}; its log ends:\n{}",
                    lines[from..lines.len().min(from + 20)].join("\n")
                );
            }
        }
    }

    /// SIGKILL node `id` and reap it.
    pub fn kill(&mut self, id: NodeId) {
        self.procs.signal(id, libc::SIGKILL);
        self.procs.wait(id);
        self.paused.remove(&id);
        self.dead.insert(id);
    }

    /// Starts a killed node again (it recovers from its log).
    pub fn restart(&mut self, id: NodeId) {
        self.procs.start(id).expect("the daemon restarts");
        self.dead.remove(&id);
    }

    /// SIGSTOP node `id`.
    pub fn pause(&mut self, id: NodeId) {
        self.procs.signal(id, libc::SIGSTOP);
        self.paused.insert(id);
    }

    /// SIGCONT node `id`.
    pub fn resume(&mut self, id: NodeId) {
        self.procs.signal(id, libc::SIGCONT);
        self.paused.remove(&id);
    }

    /// Node `id`'s whole committed log of group 0 through the client
    /// protocol (read page by page: one Read answers at most 4096
    /// entries), up to `commit` as it stands when each page is served.
    pub fn read_log(&self, id: NodeId) -> Result<Vec<LogEntry>, String> {
        let i = self.ids().iter().position(|&n| n == id).expect("a node");
        let mut c = self.client(fresh_client_id(), Duration::from_secs(5));
        let mut out = Vec::new();
        let mut from = 1;
        loop {
            let page = c.read_from(i, 0, from, 4096).map_err(|e| e.to_string())?;
            let Some(last) = page.last() else {
                return Ok(out);
            };
            from = last.index + 1;
            out.extend(page.into_iter().map(|e| (e.index, e.term, e.data.to_vec())));
        }
    }

    /// Every live node's log, once every live node has committed the
    /// entry holding `commit_min` (the highest record address any client
    /// saw confirmed; a node's commit index counts entries).
    pub fn read_all_logs(&self, commit_min: u64) -> BTreeMap<NodeId, Vec<LogEntry>> {
        let commit_min_index = quire::state::dedup::address_index(commit_min);
        let started = std::time::Instant::now();
        while !self
            .live()
            .into_iter()
            .all(|id| self.group0(id).is_some_and(|g| g.2 >= commit_min_index))
        {
            if started.elapsed() > SERVE_BOUND {
                for id in self.live() {
                    out!(
                        "node {id}: group 0 (role, term, commit, disk) {:?}",
                        self.group0(id)
                    );
                }
                // The loop-mounted log filesystems, if any: is a full one
                // really full?
                if let Ok(df) = std::process::Command::new("df").arg("-k").output() {
                    for l in String::from_utf8_lossy(&df.stdout).lines() {
                        if l.contains("/mnt") {
                            out!("{l}");
                        }
                    }
                }
                panic!("timed out waiting for every node to commit {commit_min}");
            }
        }
        self.live()
            .into_iter()
            .map(|id| {
                let log = common::wait_for("a node to serve its log", SERVE_BOUND, || {
                    self.read_log(id).ok()
                })
                .0;
                (id, log)
            })
            .collect()
    }

    /// Points node `id`'s group-0 log at `dir` (e.g. a small loop-mounted
    /// filesystem) and sets its segment size; call before starting.
    pub fn set_log_dir(procs: &LocalProcesses, id: NodeId, dir: &Path, segment_bytes: u64) {
        let cfg = &procs.nodes[&id].config;
        let text = std::fs::read_to_string(cfg).expect("the node config");
        let text = text
            .replace(
                "path = \"log0\"",
                &format!("path = \"{}\"", dir.join("log0").display()),
            )
            .replace(
                "segment_bytes = 8388608",
                &format!(
                    "segment_bytes = {segment_bytes}\nflush_bytes_max = {}",
                    segment_bytes / 4
                ),
            );
        std::fs::write(cfg, text).expect("rewrite the node config");
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // A failing run shows what the daemons said: their logs go with
        // the temp dir.
        if std::thread::panicking() {
            for (id, node) in &self.procs.nodes {
                let log = std::fs::read_to_string(node.config.with_file_name("quired.log"))
                    .unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                out!("---- node {id}: the last lines of quired.log");
                for l in &lines[lines.len().saturating_sub(25)..] {
                    out!("{l}");
                }
            }
        }
        // A stopped process ignores SIGKILL's reaping until continued.
        for id in self.paused.clone() {
            self.resume(id);
        }
    }
}

/// A client id no other client of this process has used. A client id
/// must not be reused by a new `Client` (its sequence numbers start at 1
/// again, so its appends look like retries of the old one's and are
/// answered with the old indexes without being applied).
pub fn fresh_client_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0xfa17_0000);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// GET `path` from an admin endpoint as JSON; None if it does not answer
/// within half a second or the body is not JSON.
pub fn http_get_json(addr: SocketAddr, path: &str) -> Option<serde_json::Value> {
    let (_, body) = common::http(addr, "GET", path, "", Duration::from_millis(500))?;
    serde_json::from_str(&body).ok()
}
