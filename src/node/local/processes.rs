//! A local cluster of real daemon processes on 127.0.0.1, for `quire up`
//! and the end-to-end tests: it writes a cluster key, a client token, an
//! admin token and a config file per node into a directory (files 0600,
//! directories 0700: `io::private`), runs a PTY null-modem cable
//! between every pair of nodes (in this process), and starts
//! `<exe> daemon --config nodeN/node.toml` for each node with its log in
//! `nodeN/quired.log`.
//!
//! Clients are served plain TCP ([`LocalProcesses::prepare`]: the
//! configs say `client.plain = true`) or TLS ([`LocalProcesses::prepare_tls`],
//! what `quire up` runs): then it makes a CA (`ca.pem`, `ca.key`) and a
//! certificate for each node (`nodeN/tls.pem`, `nodeN/tls.key`, valid
//! for 127.0.0.1 and localhost).

use crate::consensus::NodeId;
use crate::io::private;
use crate::node::local::error::LocalClusterError;
use crate::node::local::free_ports;
use crate::serial::{End, NullModem};
use crate::tls::issue::{CertRequest, LocalCa};
use crate::tls::{ClientTls, ClientTlsFiles};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

/// One node of the cluster.
pub struct NodeProcess {
    /// Its id.
    pub id: NodeId,
    /// Its config file.
    pub config: PathBuf,
    /// Where clients connect.
    pub client: SocketAddr,
    /// Its admin endpoint.
    pub admin: SocketAddr,
    /// Its UDP port (group g at this + g).
    pub udp: u16,
    /// The running process, if started.
    pub child: Option<Child>,
    /// Extra arguments for its daemon's command line (the fault-injection
    /// suite passes test-only options this way); empty by default.
    pub args: Vec<String>,
    /// Extra environment variables for its daemon; empty by default.
    pub env: Vec<(String, String)>,
    /// The network namespace (a name under /var/run/netns) its daemon
    /// runs in; `None`: this process's. The AF_XDP tests use it.
    pub netns: Option<String>,
}

/// The cluster: its directory, nodes and cables.
pub struct LocalProcesses {
    /// The directory holding everything.
    pub dir: PathBuf,
    /// The daemon executable (run as `<exe> daemon --config F`, or as
    /// `<exe> --config F` if it is `quired`).
    pub exe: PathBuf,
    /// The nodes by id.
    pub nodes: BTreeMap<NodeId, NodeProcess>,
    /// The client token (`client.token`).
    pub token: Vec<u8>,
    /// The admin token (`admin.token`), which `POST /membership` needs.
    pub admin_token: Vec<u8>,
    /// What a client needs to trust the nodes (`ca.pem`), if they serve
    /// TLS.
    pub client_tls: Option<ClientTlsFiles>,
    /// The null-modem cable between each pair of nodes, keyed (lower id,
    /// higher id); it runs in this process, so a test can unplug it.
    cables: BTreeMap<(NodeId, NodeId), NullModem>,
}

/// The MTU of the loopback interface (`/sys/class/net/lo/mtu`), capped at
/// the transport's largest (65,535); 1500 when it cannot be read.
fn loopback_mtu_bytes() -> usize {
    std::fs::read_to_string("/sys/class/net/lo/mtu")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .map_or(1500, |m| m.clamp(1500, 65_535))
}

/// `p` as a TOML basic string (a JSON string is one: the same escapes).
fn toml_path(p: &Path) -> Result<String, LocalClusterError> {
    let s = p
        .to_str()
        .ok_or_else(|| LocalClusterError::NotUtf8(p.to_path_buf()))?;
    Ok(serde_json::Value::from(s).to_string())
}

/// `bytes` random bytes as hex, for `what` (a key or token): refused,
/// naming it, if the OS's random source cannot be read.
fn random_hex(bytes: usize, what: &'static str) -> Result<String, LocalClusterError> {
    crate::entropy::random_hex(bytes).map_err(|source| LocalClusterError::Entropy { what, source })
}

/// The credentials file `prepare_tls` writes: one read-only principal,
/// `reader`, whose token is `reader.token`.
pub const READER_CREDENTIALS: &str =
    "# Written by `quire up`: principals besides the cluster token's (client.token).
[[principals]]
name = \"reader\"
token_file = \"reader.token\"
grants = [{ allow = [\"read\"] }]
";

impl LocalProcesses {
    /// Writes the key, tokens, configs and cables for `n` nodes of `groups`
    /// groups each under `dir` (created if missing); starts nothing yet.
    ///
    /// A relative `dir` is made absolute first (against the current
    /// directory): the config loader resolves a relative path in a config
    /// against the config file's directory, so a path written relative to
    /// the current directory (`quire-up/cables/1-2/ttyA`) would name a
    /// cable that does not exist. The paths in the configs are either
    /// absolute (serial devices) or relative to the config by construction
    /// (`../cluster.key`, `log0`).
    pub fn prepare(
        dir: &Path,
        n: u64,
        groups: u32,
        exe: &Path,
    ) -> Result<LocalProcesses, LocalClusterError> {
        Self::prepare_with(dir, n, groups, exe, false)
    }

    /// [`prepare`](Self::prepare), with clients served TLS: a CA made
    /// here signs each node's certificate (`ca.pem`, `ca.key`,
    /// `nodeN/tls.pem`), and `credentials.toml` names a read-only
    /// principal, `reader` (`reader.token`), beside the cluster token's.
    pub fn prepare_tls(
        dir: &Path,
        n: u64,
        groups: u32,
        exe: &Path,
    ) -> Result<LocalProcesses, LocalClusterError> {
        Self::prepare_with(dir, n, groups, exe, true)
    }

    fn prepare_with(
        dir: &Path,
        n: u64,
        groups: u32,
        exe: &Path,
        tls: bool,
    ) -> Result<LocalProcesses, LocalClusterError> {
        let io = LocalClusterError::io;
        let dir = &std::path::absolute(dir).map_err(io("the cluster directory"))?;
        private::create_dir_all(dir).map_err(io("creating the cluster directory"))?;
        let token = random_hex(24, "client.token")?;
        let key = random_hex(32, "cluster.key")?;
        private::write(&dir.join("cluster.key"), key).map_err(io("cluster.key"))?;
        private::write(&dir.join("client.token"), &token).map_err(io("client.token"))?;
        let admin_token = random_hex(24, "admin.token")?;
        private::write(&dir.join("admin.token"), &admin_token).map_err(io("admin.token"))?;
        let ca = if tls {
            // A second, read-only principal beside the cluster token's,
            // to show (and test) a credential that may not write.
            let reader = random_hex(24, "reader.token")?;
            private::write(&dir.join("reader.token"), reader).map_err(io("reader.token"))?;
            private::write(&dir.join("credentials.toml"), READER_CREDENTIALS)
                .map_err(io("credentials.toml"))?;
            let ca = LocalCa::generate("quire local CA")?;
            private::write(&dir.join("ca.pem"), ca.cert_pem()).map_err(io("ca.pem"))?;
            private::write(&dir.join("ca.key"), ca.key_pem()).map_err(io("ca.key"))?;
            Some(ca)
        } else {
            None
        };
        let ids: Vec<NodeId> = (1..=n).collect();
        let mut cables = BTreeMap::new();
        let mut ends: BTreeMap<(NodeId, NodeId), PathBuf> = BTreeMap::new();
        for &a in &ids {
            for &b in ids.iter().filter(|&&b| b > a) {
                let cdir = dir.join("cables").join(format!("{a}-{b}"));
                private::create_dir_all(&cdir).map_err(io("creating a cable directory"))?;
                let cable = NullModem::new(&cdir).map_err(io("a PTY null-modem cable"))?;
                ends.insert((a, b), cable.path(End::A).to_path_buf());
                ends.insert((b, a), cable.path(End::B).to_path_buf());
                cables.insert((a, b), cable);
            }
        }
        let mut nodes = BTreeMap::new();
        for &id in &ids {
            let udp = free_ports::udp_run(groups).map_err(io("finding UDP ports"))?;
            let client = SocketAddr::from((
                [127, 0, 0, 1],
                free_ports::tcp().map_err(io("a client port"))?,
            ));
            let admin = SocketAddr::from((
                [127, 0, 0, 1],
                free_ports::tcp().map_err(io("an admin port"))?,
            ));
            nodes.insert(
                id,
                NodeProcess {
                    id,
                    config: dir.join(format!("node{id}")).join("node.toml"),
                    client,
                    admin,
                    udp,
                    child: None,
                    args: Vec::new(),
                    env: Vec::new(),
                    netns: None,
                },
            );
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mtu_bytes = loopback_mtu_bytes();
        for (&id, node) in &nodes {
            let mut t = String::new();
            let _ = writeln!(t, "# Written by `quire up`: node {id} of a local cluster.");
            let _ = writeln!(t, "[node]\nid = {id}");
            let _ = writeln!(t, "cluster_key_file = \"../cluster.key\"");
            let _ = writeln!(t, "auth_token_file = \"../client.token\"");
            let _ = writeln!(t, "admin_token_file = \"../admin.token\"");
            if ca.is_some() {
                let _ = writeln!(t, "credentials_file = \"../credentials.toml\"");
            }
            let _ = writeln!(t, "cores = [{}]", (id as usize - 1) % cores);
            let _ = writeln!(t, "client_listen = \"{}\"", node.client);
            let _ = writeln!(t, "admin_listen = \"{}\"", node.admin);
            let _ = writeln!(t, "\n[udp]\nbind = \"127.0.0.1\"\nbase_port = {}", node.udp);
            let _ = writeln!(t, "recv_buffer_bytes = 1048576");
            let _ = writeln!(t, "\n[storage]\nsegment_bytes = 8388608");
            // The peers are on loopback, whose path carries datagrams of
            // up to its MTU: one datagram then carries dozens of records,
            // where 1500 bytes carry one (the kernel's cost is per
            // datagram; bench/README.md, "Datagrams as large as the path").
            let _ = writeln!(t, "\n[transport]\nmtu_bytes = {mtu_bytes}");
            for (&p, peer) in nodes.iter().filter(|(&p, _)| p != id) {
                let _ = writeln!(t, "\n[[peers]]\nid = {p}\nudp = \"127.0.0.1:{}\"", peer.udp);
                let _ = writeln!(t, "serial = {}", toml_path(&ends[&(id, p)])?);
            }
            for g in 0..groups {
                let _ = writeln!(t, "\n[[disks]]\npath = \"log{g}\"\ngroup = {g}");
            }
            let cfg_dir = node.config.parent().expect("nodeN/node.toml");
            private::create_dir_all(cfg_dir).map_err(io("creating a node directory"))?;
            // Last, so that a test may append keys of its own to it.
            let _ = writeln!(t, "\n[client]");
            match &ca {
                None => {
                    let _ = writeln!(t, "plain = true");
                }
                Some(ca) => {
                    let name = format!("node{id}");
                    let cert =
                        ca.issue(&CertRequest::server(&name, &["127.0.0.1", "localhost"]))?;
                    private::write(&cfg_dir.join("tls.pem"), &cert.cert_pem)
                        .map_err(io("a node certificate"))?;
                    private::write(&cfg_dir.join("tls.key"), &cert.key_pem)
                        .map_err(io("a node key"))?;
                    let _ = writeln!(t, "tls_cert_file = \"tls.pem\"\ntls_key_file = \"tls.key\"");
                }
            }
            private::write(&node.config, t).map_err(io("writing a node config"))?;
        }
        Ok(LocalProcesses {
            dir: dir.to_path_buf(),
            exe: exe.to_path_buf(),
            nodes,
            token: token.into_bytes(),
            admin_token: admin_token.into_bytes(),
            client_tls: ca.map(|_| ClientTlsFiles {
                ca: dir.join("ca.pem"),
                ..ClientTlsFiles::default()
            }),
            cables,
        })
    }

    /// The TLS config a client of this cluster needs, if it serves TLS.
    pub fn client_tls(&self) -> Result<Option<Arc<ClientTls>>, LocalClusterError> {
        Ok(self.client_tls.as_ref().map(ClientTls::load).transpose()?)
    }

    /// The cable between nodes `a` and `b` (either order), to unplug and
    /// replug it.
    pub fn cable(&self, a: NodeId, b: NodeId) -> Option<&NullModem> {
        self.cables.get(&(a.min(b), a.max(b)))
    }

    /// Starts node `id`'s daemon (its output goes to `nodeN/quired.log`).
    pub fn start(&mut self, id: NodeId) -> Result<(), LocalClusterError> {
        // A killed predecessor left its ends of the cables exclusive.
        for (&(a, b), cable) in &self.cables {
            if a == id {
                cable.release(End::A);
            } else if b == id {
                cable.release(End::B);
            }
        }
        let node = self
            .nodes
            .get_mut(&id)
            .ok_or(LocalClusterError::NoSuchNode(id))?;
        let log_path = node.config.with_file_name("quired.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(private::FILE_MODE)
            .open(&log_path)
            .map_err(LocalClusterError::io(log_path.display().to_string()))?;
        let mut cmd = Command::new(&self.exe);
        let is_quired = self.exe.file_name().is_some_and(|n| n == "quired");
        if !is_quired {
            cmd.arg("daemon");
        }
        if let Some(ns) = &node.netns {
            use std::os::fd::AsRawFd;
            use std::os::unix::process::CommandExt;
            let file = std::fs::File::open(format!("/var/run/netns/{ns}"))
                .map_err(LocalClusterError::io(format!("network namespace {ns}")))?;
            // SAFETY: setns(2) is async-signal-safe; `file` stays open
            // (moved into the closure) until the child execs.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = cmd
            .arg("--config")
            .arg(&node.config)
            .args(&node.args)
            .envs(node.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(
                log.try_clone()
                    .map_err(LocalClusterError::io(log_path.display().to_string()))?,
            )
            .stderr(log)
            .spawn()
            .map_err(LocalClusterError::io(format!(
                "starting {}",
                self.exe.display()
            )))?;
        node.child = Some(child);
        Ok(())
    }

    /// Starts every node.
    pub fn start_all(&mut self) -> Result<(), LocalClusterError> {
        let ids: Vec<NodeId> = self.nodes.keys().copied().collect();
        for id in ids {
            self.start(id)?;
        }
        Ok(())
    }

    /// Sends `signal` to node `id` (SIGTERM: a clean stop; SIGKILL: a crash).
    pub fn signal(&mut self, id: NodeId, signal: libc::c_int) {
        if let Some(c) = self.nodes.get(&id).and_then(|n| n.child.as_ref()) {
            // A child we started and have not reaped: its pid is its own.
            if let Ok(signal) = Signal::try_from(signal) {
                let _ = kill(Pid::from_raw(c.id() as libc::pid_t), signal);
            }
        }
    }

    /// Whether node `id`'s daemon was started and has exited since (it is
    /// not reaped: `wait` still returns its exit code).
    pub fn has_exited(&self, id: NodeId) -> bool {
        let Some(c) = self.nodes.get(&id).and_then(|n| n.child.as_ref()) else {
            return false;
        };
        // WNOWAIT leaves it to be reaped by `wait`.
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        matches!(
            waitid(Id::Pid(Pid::from_raw(c.id() as libc::pid_t)), flags),
            Ok(s) if s != WaitStatus::StillAlive
        )
    }

    /// Waits for node `id` to exit; returns its exit code.
    pub fn wait(&mut self, id: NodeId) -> Option<i32> {
        self.wait_status(id).and_then(|s| s.code())
    }

    /// Waits for node `id`'s daemon to exit; its whole status (a signal
    /// that ended it, or its code), `None` if it was not running.
    pub fn wait_status(&mut self, id: NodeId) -> Option<std::process::ExitStatus> {
        let mut c = self.nodes.get_mut(&id)?.child.take()?;
        c.wait().ok()
    }

    /// Stops every running node cleanly (SIGTERM) and waits for them.
    pub fn stop_all(&mut self) -> Vec<(NodeId, Option<i32>)> {
        self.stop_all_statuses()
            .into_iter()
            .map(|(id, s)| (id, s.and_then(|s| s.code())))
            .collect()
    }

    /// [`LocalProcesses::stop_all`], with each node's whole exit status.
    pub fn stop_all_statuses(&mut self) -> Vec<(NodeId, Option<std::process::ExitStatus>)> {
        let ids: Vec<NodeId> = self.nodes.keys().copied().collect();
        for &id in &ids {
            self.signal(id, libc::SIGTERM);
        }
        let running: Vec<NodeId> = ids
            .into_iter()
            .filter(|id| self.nodes[id].child.is_some())
            .collect();
        running
            .into_iter()
            .map(|id| (id, self.wait_status(id)))
            .collect()
    }

    /// Every node's client address, in id order.
    pub fn client_addrs(&self) -> Vec<SocketAddr> {
        self.nodes.values().map(|n| n.client).collect()
    }
}

impl Drop for LocalProcesses {
    fn drop(&mut self) {
        let ids: Vec<NodeId> = self.nodes.keys().copied().collect();
        for id in ids {
            if self.nodes[&id].child.is_some() {
                self.signal(id, libc::SIGKILL);
                self.wait(id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn no_cluster_is_prepared_without_the_os_random_source() {
        let dir = tempfile::tempdir().unwrap();
        let exe = std::path::Path::new("/bin/true");
        crate::entropy::fail_in_this_thread(true);
        let refused = super::LocalProcesses::prepare(dir.path(), 3, 1, exe).err();
        crate::entropy::fail_in_this_thread(false);
        let why = refused.expect("keys were minted without the random source");
        assert!(
            matches!(
                why,
                super::LocalClusterError::Entropy {
                    what: "client.token",
                    ..
                }
            ),
            "{why}"
        );
        let why = why.to_string();
        assert!(
            why.starts_with("client.token: cannot read the OS's random source"),
            "{why}"
        );
        assert!(!dir.path().join("cluster.key").exists());
        assert!(!dir.path().join("client.token").exists());
    }
}
