//! The control plane of a node: what only the control loop (the loop of
//! the core of the node's first group) owns. That is the serial ports to
//! the peers, the failure detector, and the node's heartbeat: its epoch
//! and sequence, the replay guards of the peers' heartbeats on each
//! channel, the workers' groups it reports, and the rotation of groups
//! when the node has more than one heartbeat holds.
//!
//! It never touches a replica or a socket: the loop hands it what arrived
//! (heartbeats, peers heard) with the time, and it hands back what the
//! loop must act on: the heartbeats heard, whether IP to a peer is alive,
//! the detector's events with their log lines, the heartbeat to send over
//! UDP. The loop applies those to its replicas (`heartbeat::failover`).
//! Its only I/O is the serial ports it drives (the loop waits on their
//! descriptors); the workers learn the detector's events and the peers'
//! heartbeats through their mailboxes (`node::mesh`).

use crate::consensus::NodeId;
use crate::heartbeat::message::GROUPS_MAX;
use crate::heartbeat::{
    encode_frame, Channel, Detector, Event as LinkEvent, Freshness, GroupStatus, Heartbeat,
    ReplayGuard,
};
use crate::node::mesh::{CoreMailbox, CoreMsg};
use crate::node::spec::{NodeSpec, PeerSpec, SpecError};
use crate::node::status::{LinkView, PeerView};
use crate::serial::SerialPort;
use crate::transport::{ClusterKey, GroupId};
use std::collections::BTreeMap;

/// The parts only the control loop has.
pub(crate) struct Control {
    serial: Vec<(NodeId, SerialPort)>,
    detector: Detector,
    epoch: u64,
    seq: u64,
    udp_guards: BTreeMap<NodeId, ReplayGuard>,
    serial_guards: BTreeMap<NodeId, ReplayGuard>,
    workers: Vec<CoreMailbox>,
    /// The latest status of the workers' groups.
    remote_groups: BTreeMap<GroupId, GroupStatus>,
    /// Where the next heartbeat's groups start, for nodes with more groups
    /// than a heartbeat holds.
    rotation: usize,
}

impl Control {
    /// The detector for `spec`'s peers and a serial port for each peer
    /// with a cable (opened later, by `serve_serial`); `workers` are the
    /// other loops' mailboxes; `epoch_seed` makes this start's heartbeat
    /// epoch differ from every earlier one.
    pub(crate) fn open(
        spec: &NodeSpec,
        now: u64,
        workers: Vec<CoreMailbox>,
        epoch_seed: u64,
    ) -> Result<Control, SpecError> {
        let mut detector = Detector::new(spec.detector, now).map_err(SpecError::Detector)?;
        let mut serial = Vec::new();
        for p in &spec.peers {
            detector.add_peer(now, p.id, p.serial_device.is_some());
            if let Some(dev) = &p.serial_device {
                let port = SerialPort::new(spec.serial_config(dev), spec.key.clone())
                    // Only its config can be refused: it opens later.
                    .map_err(SpecError::Serial)?;
                serial.push((p.id, port));
            }
        }
        Ok(Control {
            serial,
            detector,
            epoch: epoch_seed | 1,
            seq: 0,
            udp_guards: BTreeMap::new(),
            serial_guards: BTreeMap::new(),
            workers,
            remote_groups: BTreeMap::new(),
            rotation: 0,
        })
    }

    /// The serial ports' descriptors, for the loop's wait.
    pub(crate) fn wake_fds(&self) -> impl Iterator<Item = std::os::fd::RawFd> + '_ {
        self.serial.iter().filter_map(|(_, p)| p.raw_fd())
    }

    /// The detector's next deadline, if any.
    pub(crate) fn poll_timeout(&self) -> Option<u64> {
        self.detector.poll_timeout()
    }

    /// Advances the detector to `now`.
    pub(crate) fn tick(&mut self, now: u64) {
        self.detector.tick(now);
    }

    /// A peer was heard over UDP (on this loop's sockets or a worker's).
    pub(crate) fn heard_udp(&mut self, now: u64, peer: NodeId) {
        self.detector.heard(now, peer, Channel::Udp);
    }

    /// A worker's groups, for the node's heartbeat.
    pub(crate) fn remote_groups(&mut self, groups: Vec<GroupStatus>) {
        for g in groups {
            self.remote_groups.insert(g.group, g);
        }
    }

    /// Reads and writes the serial lines; the fresh, authentic heartbeats
    /// that arrived on them.
    pub(crate) fn serve_serial(
        &mut self,
        now: u64,
        readable: impl Fn(std::os::fd::RawFd) -> bool,
    ) -> Vec<Heartbeat> {
        let mut heard = Vec::new();
        for (peer, port) in &mut self.serial {
            port.poll_open(now);
            // A port the wait did not find readable has nothing to read
            // (or was opened since: the next wait reports it).
            if port.raw_fd().is_some_and(&readable) {
                port.receive(now);
            }
            while let Some(frame) = port.next_frame() {
                // Frame errors are counted by the port's decoder.
                if let Ok(hb) = frame {
                    let guard = self.serial_guards.entry(*peer).or_default();
                    if hb.node == *peer && guard.check(&hb) != Freshness::Stale {
                        heard.push(hb);
                    }
                }
            }
            port.flush(now);
        }
        heard
    }

    /// Whether a heartbeat that arrived over UDP is fresh (not a replay
    /// of one already heard).
    pub(crate) fn fresh_udp(&mut self, hb: &Heartbeat) -> bool {
        let guard = self.udp_guards.entry(hb.node).or_default();
        guard.check(hb) != Freshness::Stale
    }

    /// A fresh, authentic heartbeat from a peer on `channel`: the detector
    /// hears it, the workers get it. Returns whether IP to that peer is
    /// alive, for the failover policy the loop applies to its replicas.
    pub(crate) fn heard(&mut self, now: u64, hb: &Heartbeat, channel: Channel) -> bool {
        let peer = hb.node;
        self.detector.heard(now, peer, channel);
        for g in hb.groups() {
            self.detector
                .disk_progress(now, peer, g.group, g.last_fsync_ms, g.writes_pending);
        }
        let ip_alive = self
            .detector
            .link(peer, Channel::Udp)
            .is_some_and(|l| l.state.is_alive());
        for w in &self.workers {
            w.send(CoreMsg::PeerHeartbeat(Box::new(*hb), ip_alive));
        }
        ip_alive
    }

    /// The detector's next event, with its line for the log and the
    /// status; the workers get it too.
    pub(crate) fn next_event(&mut self) -> Option<(LinkEvent, String)> {
        let ev = self.detector.poll_event()?;
        let line = event_line(&ev);
        for w in &self.workers {
            w.send(CoreMsg::Detector(ev));
        }
        Some((ev, line))
    }

    /// The node's next heartbeat, with `mine` (the control loop's groups)
    /// and the workers' groups: written as a frame to every serial port,
    /// and returned for the UDP channel.
    pub(crate) fn heartbeat(
        &mut self,
        id: NodeId,
        key: &ClusterKey,
        now: u64,
        mine: Vec<GroupStatus>,
    ) -> Heartbeat {
        self.seq += 1;
        let mut hb = Heartbeat::new(id, self.epoch, self.seq);
        let mut all: BTreeMap<GroupId, GroupStatus> = self.remote_groups.clone();
        all.extend(mine.into_iter().map(|g| (g.group, g)));
        // A heartbeat holds GROUPS_MAX groups (its serial airtime must fit
        // the keepalive); with more, successive heartbeats take turns, so
        // each group is reported every ceil(groups / GROUPS_MAX) keepalives.
        let all: Vec<GroupStatus> = all.into_values().collect();
        let take = all.len().min(GROUPS_MAX);
        let start = if all.len() > GROUPS_MAX {
            self.rotation % all.len()
        } else {
            0
        };
        self.rotation = self.rotation.wrapping_add(take);
        let mut chosen: Vec<GroupStatus> =
            (0..take).map(|i| all[(start + i) % all.len()]).collect();
        chosen.sort_by_key(|g| g.group); // the format wants increasing ids
        for g in chosen {
            hb.push_group(g)
                .expect("at most GROUPS_MAX, in increasing order");
        }
        for view in self.detector.views() {
            let _ = hb.push_peer(view);
        }
        let mut frame = Vec::new();
        if encode_frame(key, &hb, &mut frame).is_ok() {
            for (_, port) in &mut self.serial {
                port.send_frame(now, &frame);
            }
        }
        hb
    }

    /// Some link is dead: the alarm line.
    pub(crate) fn any_link_dead(&self) -> bool {
        self.detector.any_link_dead()
    }

    /// Every link to `peers` and every peer's classification, as the
    /// detector sees them at `now`.
    pub(crate) fn views(&self, peers: &[PeerSpec], now: u64) -> (Vec<LinkView>, Vec<PeerView>) {
        let mut links = Vec::new();
        let mut views = Vec::new();
        for p in peers {
            for ch in [Channel::Udp, Channel::Serial] {
                if let Some(l) = self.detector.link(p.id, ch) {
                    links.push(LinkView {
                        peer: p.id,
                        channel: ch.name(),
                        state: l.state.name(),
                        last_heard_ago_ms: l.last_heard_ms.map(|t| now.saturating_sub(t)),
                    });
                }
            }
            if let Some(s) = self.detector.status(p.id) {
                views.push(PeerView {
                    peer: p.id,
                    status: s.name(),
                    disk_stalled: self.detector.disk_stalled(p.id),
                });
            }
        }
        (links, views)
    }
}

/// A detector event as one line: `at N ms: ` (the event's time on the
/// loop's clock), then what changed.
fn event_line(ev: &LinkEvent) -> String {
    match *ev {
        LinkEvent::Link {
            peer,
            channel,
            old,
            new,
            at_ms,
        } => format!(
            "at {at_ms} ms: link to node {peer} over {}: {} -> {}",
            channel.name(),
            old.name(),
            new.name()
        ),
        LinkEvent::Peer {
            peer,
            old,
            new,
            at_ms,
        } => format!(
            "at {at_ms} ms: node {peer}: {} -> {}",
            old.name(),
            new.name()
        ),
        LinkEvent::DiskStall {
            peer,
            group,
            stalled,
            at_ms,
        } => format!(
            "at {at_ms} ms: node {peer} group {group}: disk {}",
            if stalled { "stalled" } else { "progressing" }
        ),
    }
}
