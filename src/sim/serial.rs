//! Serial cables and the failure detector in the simulator. Every live
//! node sends its heartbeat every `keepalive_ms` to each peer twice: over
//! the simulated network (the UDP channel: same partitions, loss and clogs
//! as Raft's traffic) and over a null-modem cable (its own faults: cut, or
//! noisy so bytes flip). Receivers run the real frame decoder, replay
//! guard and detector of `crate::heartbeat`, and the failover policy of
//! `heartbeat::failover` drives their replicas, exactly as a node does.
//! A node also watches its own disk: a write pending longer than
//! `disk_stall_ms` makes its leaders step down.

use super::checker::Violation;
use super::trace::What;
use super::world::{Event, World};
use crate::consensus::{NodeId, Role};
use crate::heartbeat::failover::{on_event, on_group_status};
use crate::heartbeat::{
    encode_frame, Channel, Detector, DetectorConfig, Event as LinkEvent, FrameDecoder, Freshness,
    Heartbeat, ReplayGuard,
};
use crate::transport::ClusterKey;
use rand::Rng;

/// Line rate of the cables: 115200 baud, 8N1 (10 bits a byte).
const BAUD: u64 = 115_200;

/// The cluster key of simulated nodes.
pub(crate) fn sim_key() -> ClusterKey {
    ClusterKey::derive(b"quire-sim cluster key")
}

/// The detector's timers in the simulator (the defaults: what a LAN
/// deployment runs).
pub(crate) fn detector_config() -> DetectorConfig {
    DetectorConfig::default()
}

/// The null-modem cables between every pair of nodes.
pub(crate) struct Cables {
    nodes: usize,
    /// cut[a * nodes + b], symmetric.
    cut: Vec<bool>,
    /// Chance that a byte is damaged on the line, symmetric.
    noise: Vec<f64>,
}

impl Cables {
    pub(crate) fn new(nodes: usize) -> Self {
        Cables {
            nodes,
            cut: vec![false; nodes * nodes],
            noise: vec![0.0; nodes * nodes],
        }
    }

    pub(crate) fn is_cut(&self, a: usize, b: usize) -> bool {
        self.cut[a * self.nodes + b]
    }

    pub(crate) fn set_cut(&mut self, a: usize, b: usize, cut: bool) {
        self.cut[a * self.nodes + b] = cut;
        self.cut[b * self.nodes + a] = cut;
    }

    pub(crate) fn set_noise(&mut self, a: usize, b: usize, p: f64) {
        self.noise[a * self.nodes + b] = p;
        self.noise[b * self.nodes + a] = p;
    }

    fn noise(&self, a: usize, b: usize) -> f64 {
        self.noise[a * self.nodes + b]
    }

    pub(crate) fn heal(&mut self) {
        self.cut.iter_mut().for_each(|c| *c = false);
        self.noise.iter_mut().for_each(|p| *p = 0.0);
    }
}

/// One node's heartbeat state: what it sends and what it has heard.
pub(crate) struct Watch {
    pub(crate) detector: Detector,
    epoch: u64,
    seq: u64,
    /// Per peer (by node index): the serial line's decoder, and a replay
    /// guard per channel (the same heartbeat goes out on both, so one
    /// guard for both would refuse the second copy).
    decoders: Vec<FrameDecoder>,
    udp_guards: Vec<ReplayGuard>,
    serial_guards: Vec<ReplayGuard>,
}

impl Watch {
    /// A node (index `n`) starting at `now` with a fresh epoch.
    pub(crate) fn new(n: usize, nodes: usize, now: u64, epoch: u64) -> Self {
        let mut detector =
            Detector::new(detector_config(), now).expect("the default timers are valid");
        for peer in (0..nodes).filter(|&p| p != n) {
            detector.add_peer(now, peer as NodeId + 1, true);
        }
        Watch {
            detector,
            epoch,
            seq: 0,
            decoders: (0..nodes).map(|_| FrameDecoder::new(sim_key())).collect(),
            udp_guards: (0..nodes).map(|_| ReplayGuard::new()).collect(),
            serial_guards: (0..nodes).map(|_| ReplayGuard::new()).collect(),
        }
    }
}

impl World {
    /// Node `n` sends its heartbeat on both channels, checks its own
    /// disks, and schedules its next heartbeat.
    pub(crate) fn heartbeat_send(&mut self, n: usize) -> Result<(), Violation> {
        if !self.nodes[n].alive {
            return Ok(());
        }
        self.check_own_disks(n)?;
        let Some(hb) = self.build_heartbeat(n) else {
            return Ok(());
        };
        let mut frame = Vec::new();
        encode_frame(&sim_key(), &hb, &mut frame).expect("a heartbeat of this size encodes");
        if self.endpoint_net.is_some() {
            self.endpoint_send_heartbeat(n, &hb);
        }
        for to in (0..self.nodes.len()).filter(|&m| m != n) {
            // Under `Net::Endpoint` the UDP copy went through the endpoint.
            let direct = self.endpoint_net.is_none();
            if let Some(at) = direct.then(|| self.udp_arrival(n, to)).flatten() {
                let hb = Box::new(hb);
                self.schedule(at, Event::HeartbeatUdp { to, hb });
            }
            if !self.cables.is_cut(n, to) {
                let mut bytes = frame.clone();
                let noise = self.cables.noise(n, to);
                if noise > 0.0 {
                    for b in bytes.iter_mut() {
                        if self.rng.gen_bool(noise) {
                            *b = self.rng.gen();
                        }
                    }
                }
                let at = self.now + 1 + bytes.len() as u64 * 10 * 1000 / BAUD;
                self.schedule(at, Event::HeartbeatSerial { from: n, to, bytes });
            }
        }
        let next = self.now + detector_config().keepalive_ms;
        self.schedule(next, Event::HeartbeatSend { node: n });
        Ok(())
    }

    fn build_heartbeat(&mut self, n: usize) -> Option<Heartbeat> {
        let watch = self.watches[n].as_mut()?;
        watch.seq += 1;
        let mut hb = Heartbeat::new(n as NodeId + 1, watch.epoch, watch.seq);
        // Each production replica reports its own status.
        for h in self.nodes[n].hosted.iter().flatten() {
            let status = h.replica.group_status();
            hb.push_group(status).expect("groups fit a heartbeat");
        }
        for view in watch.detector.views() {
            hb.push_peer(view).expect("peers fit a heartbeat");
        }
        Some(hb)
    }

    /// When a datagram from `from` reaches `to`, if it does.
    fn udp_arrival(&mut self, from: usize, to: usize) -> Option<u64> {
        if self.net.is_blocked(from, to) || self.rng.gen_bool(self.net.loss) {
            return None;
        }
        let delay = self.p.net_delay_min_ms + self.rng.gen_range(0..=self.p.net_jitter_ms);
        Some((self.now + delay).max(self.net.clogged_until(from, to) + delay))
    }

    /// A heartbeat arrived at node `to` over UDP (authenticated by the
    /// transport's MAC in a real node).
    pub(crate) fn heartbeat_udp(&mut self, to: usize, hb: &Heartbeat) -> Result<(), Violation> {
        if !self.nodes[to].alive {
            return Ok(());
        }
        let from = (hb.node - 1) as usize;
        let fresh = match self.watches[to].as_mut() {
            Some(w) => w.udp_guards[from].check(hb) != Freshness::Stale,
            None => false,
        };
        if fresh {
            self.heard(to, hb, Channel::Udp)?;
        }
        Ok(())
    }

    /// Bytes from `from`'s end of the cable arrived at `to`.
    pub(crate) fn heartbeat_serial(
        &mut self,
        from: usize,
        to: usize,
        bytes: &[u8],
    ) -> Result<(), Violation> {
        if !self.nodes[to].alive || self.cables.is_cut(from, to) {
            return Ok(());
        }
        let Some(w) = self.watches[to].as_mut() else {
            return Ok(());
        };
        w.decoders[from].push(bytes);
        let mut fresh = Vec::new();
        while let Some(frame) = w.decoders[from].next_frame() {
            match frame {
                // A frame claiming another sender on this cable is refused.
                Ok(hb) if hb.node as usize == from + 1 => {
                    if w.serial_guards[from].check(&hb) != Freshness::Stale {
                        fresh.push(hb);
                    }
                }
                Ok(_) | Err(_) => self.serial_frame_errors += 1,
            }
        }
        for hb in fresh {
            self.heard(to, &hb, Channel::Serial)?;
        }
        Ok(())
    }

    /// Feeds one fresh heartbeat to node `n`'s detector and replicas.
    fn heard(&mut self, n: usize, hb: &Heartbeat, channel: Channel) -> Result<(), Violation> {
        let now = self.now;
        let peer = hb.node;
        let ip_alive = {
            let w = self.watches[n].as_mut().expect("live node");
            w.detector.heard(now, peer, channel);
            for g in hb.groups() {
                w.detector
                    .disk_progress(now, peer, g.group, g.last_fsync_ms, g.writes_pending);
            }
            w.detector
                .link(peer, Channel::Udp)
                .is_some_and(|l| l.state.is_alive())
        };
        for g in hb.groups() {
            let group = g.group as usize;
            if group >= self.opts.groups {
                continue;
            }
            if let Some(raft) = self.nodes[n].raft_mut(group) {
                on_group_status(raft, now, hb, g, ip_alive);
                self.drive(n, group)?;
            }
        }
        self.detector_events(n)
    }

    /// The next detector deadline of any live node.
    pub(crate) fn next_detector_tick(&self) -> (u64, Option<usize>) {
        let mut best = (u64::MAX, None);
        for (n, w) in self.watches.iter().enumerate() {
            if let (true, Some(w)) = (self.nodes[n].alive, w) {
                if let Some(t) = w.detector.poll_timeout() {
                    if t < best.0 {
                        best = (t, Some(n));
                    }
                }
            }
        }
        best
    }

    /// Ticks node `n`'s detector and acts on what changed.
    pub(crate) fn detector_tick(&mut self, n: usize) -> Result<(), Violation> {
        let now = self.now;
        if let Some(w) = self.watches[n].as_mut() {
            w.detector.tick(now);
            assert!(
                w.detector.poll_timeout().is_none_or(|t| t > now),
                "n{}: detector tick at {now} did not move its deadline",
                n + 1
            );
        }
        self.detector_events(n)
    }

    fn detector_events(&mut self, n: usize) -> Result<(), Violation> {
        loop {
            let Some(ev) = self.watches[n]
                .as_mut()
                .and_then(|w| w.detector.poll_event())
            else {
                return Ok(());
            };
            self.detector_transitions += 1;
            match ev {
                LinkEvent::Link {
                    peer, channel, new, ..
                } => self.record(
                    n,
                    0,
                    What::Link {
                        peer,
                        channel: channel.name(),
                        state: new.name(),
                    },
                ),
                LinkEvent::Peer { peer, new, .. } => self.record(
                    n,
                    0,
                    What::PeerStatus {
                        peer,
                        status: new.name(),
                    },
                ),
                LinkEvent::DiskStall {
                    peer,
                    group,
                    stalled,
                    ..
                } => self.record(n, group as usize, What::PeerDiskStall { peer, stalled }),
            }
            let now = self.now;
            for g in 0..self.opts.groups {
                if let Some(raft) = self.nodes[n].raft_mut(g) {
                    on_event(raft, now, g as u32, &ev);
                    self.drive(n, g)?;
                }
            }
        }
    }

    /// A leader whose own disk has a write pending for longer than
    /// `disk_stall_ms` steps down: it cannot make anything durable, and
    /// followers must not wait on it (etcd #13527).
    fn check_own_disks(&mut self, n: usize) -> Result<(), Violation> {
        let stall_ms = detector_config().disk_stall_ms;
        for g in 0..self.opts.groups {
            let stalled = self.hosted_disk_stalled(n, g, stall_ms);
            let leads = self.nodes[n]
                .raft(g)
                .is_some_and(|r| r.role() == Role::Leader);
            if stalled && leads {
                self.record(n, g, What::Fault("own-disk-stalled"));
                self.nodes[n].raft_mut(g).expect("checked").step_down();
                self.drive(n, g)?;
            }
        }
        Ok(())
    }
}
