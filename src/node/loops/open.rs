//! Wiring a loop at open (`EventLoop::open`): its replicas and their logs,
//! its UDP driver and sockets (or the XDP path), its mesh mailbox, the
//! control plane on the control loop, and the seed its cores take their
//! randomness from (the OS's, or the loop refuses to start). Nothing here
//! runs a turn: that is `event_loop`'s.

use super::event_loop::{EventLoop, NetPath};
use crate::net::{PeerMap, UdpDriver};
use crate::node::client::conns::PortCommand;
use crate::node::command::CoreCommand;
use crate::node::errors::StartError;
use crate::node::log::{log_info, log_warn};
use crate::node::loops::control::Control;
use crate::node::loops::host::OsHost;
use crate::node::loops::stall::StallClock;
use crate::node::loops::waker::Waker;
use crate::node::mesh::{CoreMsg, Routing, Wiring};
use crate::node::replica::Replica;
use crate::node::spec::{NodeSpec, SpecError};
use crate::storage::Wal;
use crate::transport::Endpoint;
use crossbeam_channel::Receiver;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

impl EventLoop {
    /// Opens this loop's logs, binds its sockets and (control) opens the
    /// serial ports. `spec.groups` are this loop's groups; `started` is
    /// the node's clock, shared by its loops.
    #[allow(clippy::too_many_arguments)] // the loop's channels, each its own
    pub(crate) fn open(
        spec: NodeSpec,
        started: Instant,
        me: usize,
        commands: Receiver<CoreCommand>,
        mesh: Receiver<CoreMsg>,
        wiring: Wiring,
        waker: Waker,
        routing: Arc<Routing>,
        ports: Receiver<PortCommand>,
        net: NetPath,
    ) -> Result<Self, StartError> {
        let id = spec.id;
        let now = started.elapsed().as_millis() as u64;
        let udp_cfg = spec.udp_config(&spec.groups);
        let mut peers = PeerMap::new();
        for p in &spec.peers {
            peers.set_node(p.id, p.udp_base);
        }
        let endpoint = Endpoint::new(spec.transport.clone(), spec.key.clone(), id, random_seed()?)
            .map_err(SpecError::Transport)?;
        let (mut udp, report) =
            UdpDriver::bind(udp_cfg, endpoint, peers).map_err(StartError::Udp)?;
        for w in &report.warnings {
            log_warn!("node {id}: {w}");
        }
        let net_detail = match net {
            // The node's reason was logged once already.
            NetPath::Sockets(why) => why,
            NetPath::Xdp(node) => match node.port(me as u32) {
                Ok(port) => {
                    let d = port.describe();
                    log_info!("node {id} loop {me}: datagrams through {d}");
                    udp.attach_xdp(port);
                    d
                }
                Err(why) if spec.net.backend == crate::net::xdp::Backend::Xdp => {
                    return Err(StartError::Xdp(why));
                }
                // A loop's own reason (no queue for it) is logged here.
                Err(why) => {
                    log_warn!(
                        "node {id} loop {me}: datagrams go through sockets: AF_XDP unavailable: {why}"
                    );
                    format!("AF_XDP unavailable: {why}")
                }
            },
        };
        let mut replicas = Vec::new();
        let mut by_group = BTreeMap::new();
        for g in &spec.groups {
            let log_failed = |error| StartError::Log {
                group: g.group,
                dir: g.dir.clone(),
                error,
            };
            let (mut wal, report) = Wal::open(&g.dir, spec.wal.clone()).map_err(log_failed)?;
            wal.notify_completions(waker.fd()).map_err(log_failed)?;
            log_info!("node {id} group {}: {report}", g.group);
            let r = Replica::open(
                &spec,
                g,
                wal,
                report.restored,
                now,
                OsHost::new({
                    let w = waker.clone();
                    Arc::new(move || w.wake())
                })
                .map_err(entropy_failed)?,
            )?;
            by_group.insert(g.group, replicas.len());
            replicas.push(r);
        }
        let (control, to_control) = match wiring {
            Wiring::Control(workers) => {
                let control = Control::open(&spec, now, workers, random_seed()?)?;
                (Some(control), None)
            }
            Wiring::Worker(to_control) => (None, Some(to_control)),
        };
        let groups = replicas.len();
        let cores = routing.cores.len();
        Ok(EventLoop {
            started,
            me,
            commands,
            mesh,
            routing,
            ports,
            clients: None,
            client_done: Vec::new(),
            client_done_remote: vec![Vec::new(); cores],
            command_done: Vec::new(),
            udp,
            replicas,
            by_group,
            control,
            to_control,
            waker,
            wake_fds: Vec::new(),
            heard_forwarded: BTreeMap::new(),
            next_heartbeat_ms: now,
            stalled_noticed: vec![false; groups],
            transitions: VecDeque::new(),
            out: Vec::new(),
            buf: Vec::new(),
            sends_refused: 0,
            clock: StallClock::new(now, spec.stall_grace_ms),
            stall_logged_real_ms: 0,
            stalls_unlogged: 0,
            net_detail,
            spec,
        })
    }
}

/// Why a node does not start without the OS's random source: its seeds
/// (session epochs, election jitter) would be guessable.
fn entropy_failed(e: crate::entropy::EntropyError) -> StartError {
    StartError::Os {
        what: "the OS's random source",
        error: e.into(),
    }
}

/// A seed for a session epoch or the detector's jitter, from the OS's
/// random source.
fn random_seed() -> Result<u64, StartError> {
    crate::entropy::random_u64().map_err(entropy_failed)
}
