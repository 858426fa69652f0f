//! A local cluster in one process: `n` nodes on 127.0.0.1 (free ports),
//! logs in the directories given, and a PTY null-modem cable between every
//! pair. The failover tests, the failover benchmark and `quire up` use it.

use crate::consensus::{NodeId, Role, Term};
use crate::node::local::error::LocalClusterError;
use crate::node::{GroupSpec, NodeHandle, NodeSpec, NodeStatus, PeerSpec};
use crate::serial::{End, NullModem};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// A running local cluster; nodes stop when it drops.
pub struct LocalCluster {
    /// The running nodes by id (a stopped node is removed).
    pub nodes: BTreeMap<NodeId, NodeHandle>,
    cables: BTreeMap<(NodeId, NodeId), NullModem>,
    /// Each node's spec and cores, to restart it.
    specs: BTreeMap<NodeId, NodeSpec>,
    cores: Vec<usize>,
    /// Each node's UDP port (its group 0 socket).
    pub ports: BTreeMap<NodeId, u16>,
}

impl LocalCluster {
    /// Starts one node per entry of `log_dirs` (node `i + 1` logs group `g`
    /// of `groups` in `log_dirs[i]/g<g>`), with cables made under
    /// `cable_dir`, each node's groups spread over `cores` as
    /// [`NodeHandle::spawn_on`] does, and `tune` applied to each node's
    /// spec before it starts.
    pub fn start(
        log_dirs: &[PathBuf],
        groups: &[u32],
        cores: &[usize],
        cable_dir: &Path,
        tune: impl Fn(&mut NodeSpec),
    ) -> Result<LocalCluster, LocalClusterError> {
        let ids: Vec<NodeId> = (1..=log_dirs.len() as u64).collect();
        // Group g of a node listens on its base port + g.
        let ports_per_node = groups.iter().max().map_or(1, |&g| g + 1);
        let mut ports = BTreeMap::new();
        for &id in &ids {
            ports.insert(
                id,
                crate::node::local::free_ports::udp_run(ports_per_node)
                    .map_err(LocalClusterError::io("finding a free port"))?,
            );
        }
        let mut cables = BTreeMap::new();
        for &a in &ids {
            for &b in ids.iter().filter(|&&b| b > a) {
                let dir = cable_dir.join(format!("{a}-{b}"));
                crate::io::private::create_dir_all(&dir)
                    .map_err(LocalClusterError::io(dir.display().to_string()))?;
                let cable =
                    NullModem::new(&dir).map_err(LocalClusterError::io("a PTY null-modem"))?;
                cables.insert((a, b), cable);
            }
        }
        let mut nodes = BTreeMap::new();
        let mut specs = BTreeMap::new();
        for &id in &ids {
            let peers = ids
                .iter()
                .filter(|&&p| p != id)
                .map(|&p| {
                    let (a, b) = (id.min(p), id.max(p));
                    let end = if id == a { End::A } else { End::B };
                    PeerSpec {
                        id: p,
                        udp_base: SocketAddr::from(([127, 0, 0, 1], ports[&p])),
                        serial_device: Some(cables[&(a, b)].path(end).to_path_buf()),
                    }
                })
                .collect();
            let groups = groups
                .iter()
                .map(|&g| GroupSpec {
                    group: g,
                    dir: log_dirs[(id - 1) as usize].join(format!("g{g}")),
                })
                .collect();
            let mut spec = NodeSpec::loopback(id, ids.clone(), groups, ports[&id]);
            spec.peers = peers;
            tune(&mut spec);
            specs.insert(id, spec.clone());
            let node = NodeHandle::spawn_on(spec, cores)?;
            nodes.insert(id, node);
        }
        Ok(LocalCluster {
            nodes,
            cables,
            specs,
            cores: cores.to_vec(),
            ports,
        })
    }

    /// The status of every running node.
    pub fn statuses(&self) -> Vec<NodeStatus> {
        self.nodes.values().filter_map(|n| n.status()).collect()
    }

    /// The leader of the first group and its term, if every running node
    /// agrees on it and it says it leads, and it is the group's preferred
    /// leader when that one runs (any other hands over to it after
    /// `preferred_leader_hold_ms`: not a leader that lasts).
    pub fn agreed_leader(&self) -> Option<(NodeId, Term)> {
        self.agreed_leader_of(0)
    }

    /// The same for the group at position `i` of every node's groups.
    pub fn agreed_leader_of(&self, i: usize) -> Option<(NodeId, Term)> {
        let all = self.statuses();
        let leader = all.iter().find(|s| s.groups[i].role == Role::Leader)?;
        let (id, term) = (leader.id, leader.groups[i].term);
        let preferred = leader.groups[i]
            .preferred_leader
            .filter(|p| self.nodes.contains_key(p));
        let agreed = all.len() == self.nodes.len()
            && preferred.is_none_or(|p| p == id)
            && all
                .iter()
                .all(|s| s.groups[i].leader == Some(id) && s.groups[i].term == term);
        agreed.then_some((id, term))
    }

    /// True once every running node sees every other running node `up`.
    pub fn all_links_up(&self) -> bool {
        let running: Vec<NodeId> = self.nodes.keys().copied().collect();
        self.statuses().iter().all(|s| {
            running
                .iter()
                .filter(|&&p| p != s.id)
                .all(|&p| s.peer(p).is_some_and(|v| v.status == "up"))
        })
    }

    /// The cable between `a` and `b`.
    pub fn cable(&mut self, a: NodeId, b: NodeId) -> Option<&mut NullModem> {
        self.cables.get_mut(&(a.min(b), a.max(b)))
    }

    /// Starts node `id` again from its logs, as it was configured.
    pub fn restart_node(&mut self, id: NodeId) -> Result<(), LocalClusterError> {
        self.stop_node(id);
        let spec = self
            .specs
            .get(&id)
            .ok_or(LocalClusterError::NoSuchNode(id))?
            .clone();
        let node = NodeHandle::spawn_on(spec, &self.cores)?;
        self.nodes.insert(id, node);
        Ok(())
    }

    /// Node `id`'s spec (its log directories, among others).
    pub fn spec(&self, id: NodeId) -> Option<&NodeSpec> {
        self.specs.get(&id)
    }

    /// Stops node `id` (its thread exits: every channel falls silent).
    pub fn stop_node(&mut self, id: NodeId) {
        if let Some(n) = self.nodes.remove(&id) {
            n.stop();
        }
    }
}
