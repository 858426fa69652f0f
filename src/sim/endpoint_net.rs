//! The transport under the seed (`Net::Endpoint`): every simulated node
//! runs one production `transport::Endpoint`, used as the daemon's event
//! loop uses it (`node/loops/event_loop.rs`). Raft messages are encoded with
//! `transport::raft_codec` and handed to the endpoint; each datagram it
//! transmits crosses the simulated network under the rules a message
//! meets under `Net::Direct` (`World::path_arrivals`); each message it
//! delivers steps the receiver's Raft. Its timers are events of their own.
//!
//! The endpoint reads the virtual clock in µs (the world's ms × 1000) and
//! draws its epoch and delays from a seed taken from the run's; nothing
//! here reads a clock or touches a socket. An endpoint dies with its node
//! and a restart makes a new one, with a new session epoch, as a restarted
//! daemon does.

use super::trace::{describe, What};
use super::world::{idx, Event, World};
use super::RunReport;
use crate::consensus::{Message, NodeId};
use crate::heartbeat::{Channel, Heartbeat};
use crate::transport::raft_codec::{
    decode_raft_delivery, send_raft_message, ENVELOPE_HEARTBEAT, ENVELOPE_RAFT,
};
use crate::transport::{
    ClusterKey, DropReason, Endpoint, Event as Delivery, GroupId, SendError, TransportConfig,
};
use rand::Rng;

/// The transport's configuration under the seed: the daemon's defaults.
/// They validate (`Endpoint::new` checks), and the simulated network's
/// delays (1–18 ms, clogs of hundreds) are far above their µs timers, so
/// reordering past the reorder window, NACK rounds and probes all happen.
pub(crate) fn sim_transport_config() -> TransportConfig {
    TransportConfig::default()
}

/// What the endpoints did, summed over every endpoint of the run.
#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    datagrams: u64,
    datagrams_refused: u64,
    sends_refused: u64,
    /// Retransmissions and NACKs of endpoints that died with their node.
    retired_retransmits: u64,
    retired_nacks: u64,
}

/// The nodes' endpoints and the driver state around them.
pub(crate) struct EndpointNet {
    cfg: TransportConfig,
    key: ClusterKey,
    /// Per node, while its process runs.
    endpoints: Vec<Option<Endpoint>>,
    /// Per node: when the `Event::EndpointTimer` in force is due.
    wake_ms: Vec<Option<u64>>,
    /// Per node: called since its transmits were last drained.
    dirty: Vec<bool>,
    counters: Counters,
    buf: Vec<u8>,
}

impl EndpointNet {
    /// No endpoints yet; `World::endpoint_start` makes each node's. The
    /// key is derived from the seed: one cluster, one key.
    pub(crate) fn new(seed: u64, nodes: usize) -> Self {
        EndpointNet {
            cfg: sim_transport_config(),
            key: ClusterKey::derive(format!("quire-sim cluster of seed {seed}").as_bytes()),
            endpoints: (0..nodes).map(|_| None).collect(),
            wake_ms: vec![None; nodes],
            dirty: vec![false; nodes],
            counters: Counters::default(),
            buf: Vec::new(),
        }
    }
}

/// (retransmitted frames, NACK frames sent) over every channel.
fn channel_totals(ep: &Endpoint) -> (u64, u64) {
    ep.channels()
        .filter_map(|(peer, group)| ep.channel_stats(peer, group))
        .fold((0, 0), |(r, n), s| (r + s.rexmit_frames, n + s.nacks_sent))
}

impl World {
    /// A new endpoint for node `n`'s new process (`Net::Endpoint`).
    pub(crate) fn endpoint_start(&mut self, n: usize) {
        if self.endpoint_net.is_none() {
            return;
        }
        let seed = self.rng.gen();
        let net = self.endpoint_net.as_mut().expect("checked");
        let ep = Endpoint::new(net.cfg.clone(), net.key.clone(), n as NodeId + 1, seed)
            .expect("the simulator's transport config validates");
        net.endpoints[n] = Some(ep);
        net.wake_ms[n] = None;
        net.dirty[n] = false;
    }

    /// Node `n` crashed: its endpoint, with everything it held, is gone.
    pub(crate) fn endpoint_crash(&mut self, n: usize) {
        let Some(net) = self.endpoint_net.as_mut() else {
            return;
        };
        if let Some(ep) = net.endpoints[n].take() {
            let (r, k) = channel_totals(&ep);
            net.counters.retired_retransmits += r;
            net.counters.retired_nacks += k;
        }
        net.wake_ms[n] = None;
        net.dirty[n] = false;
    }

    /// Hands a Raft message to the sender's endpoint, as the daemon's
    /// drive does: a full window drops it (Raft resends).
    pub(crate) fn endpoint_send(&mut self, g: usize, msg: &Message) {
        let from = idx(msg.from);
        let alive = self.nodes[from].alive;
        let net = self.endpoint_net.as_mut().expect("Net::Endpoint");
        let Some(ep) = net.endpoints[from].as_mut() else {
            assert!(!alive, "n{}: a live node without an endpoint", from + 1);
            return;
        };
        // As the node's loop sends.
        match send_raft_message(ep, g as GroupId, msg) {
            Ok(_) => net.dirty[from] = true,
            Err(SendError::WouldBlock) => {
                net.counters.sends_refused += 1;
                let kind = describe(msg).0;
                self.record(from, g, What::SendRefused { to: msg.to, kind });
            }
            // The simulator's messages are small and its peers few: any
            // other refusal is a bug in the transport or its config.
            Err(e) => panic!("n{}: the transport refused a Raft message: {e}", from + 1),
        }
    }

    /// Node `n`'s heartbeat to every peer, on group 0's channels, as the
    /// daemon's `send_heartbeat` sends it: a full window drops it (the
    /// next one follows a keepalive later).
    pub(crate) fn endpoint_send_heartbeat(&mut self, n: usize, hb: &Heartbeat) {
        let peers = self.nodes.len();
        let net = self.endpoint_net.as_mut().expect("Net::Endpoint");
        let Some(ep) = net.endpoints[n].as_mut() else {
            return;
        };
        net.buf.clear();
        net.buf.push(ENVELOPE_HEARTBEAT);
        hb.encode(&mut net.buf)
            .expect("a heartbeat of the simulator's size encodes");
        for to in (0..peers).filter(|&m| m != n) {
            match ep.send(to as NodeId + 1, 0, &net.buf) {
                Ok(_) => net.dirty[n] = true,
                Err(SendError::WouldBlock) => net.counters.sends_refused += 1,
                Err(e) => panic!("n{}: the transport refused a heartbeat: {e}", n + 1),
            }
        }
    }

    /// A datagram reached node `to`: its endpoint takes it, then every
    /// message it delivers steps Raft, as the daemon's receive does.
    pub(crate) fn datagram_arrived(
        &mut self,
        from: usize,
        to: usize,
        bytes: &[u8],
    ) -> Result<(), super::Violation> {
        let now_us = self.now * 1000;
        let net = self.endpoint_net.as_mut().expect("Net::Endpoint");
        let Some(ep) = net.endpoints[to].as_mut() else {
            return Ok(()); // the node is down: nobody reads the socket
        };
        net.counters.datagrams += 1;
        net.dirty[to] = true;
        let result = ep.handle_datagram(now_us, bytes);
        let mut delivered = Vec::new();
        while let Some(e) = ep.poll_event() {
            delivered.push(e);
        }
        self.record(
            to,
            0,
            What::Datagram {
                from: from as u64 + 1,
                len: bytes.len() as u64,
            },
        );
        match result {
            Ok(()) => {}
            // A restarted sender's old datagrams, or ours before a
            // restart, still in flight: the sessions tell them apart.
            Err(DropReason::StaleEpoch) => {
                let net = self.endpoint_net.as_mut().expect("Net::Endpoint");
                net.counters.datagrams_refused += 1;
                let why = "stale-epoch";
                self.record(
                    to,
                    0,
                    What::DatagramRefused {
                        from: from as u64 + 1,
                        why,
                    },
                );
            }
            // The simulated network neither corrupts nor misaddresses, and
            // the cluster is smaller than `peers_max`.
            Err(why) => panic!("n{}: a datagram from n{} refused: {why}", to + 1, from + 1),
        }
        for e in delivered {
            let Delivery::Delivered {
                peer,
                group,
                message,
            } = e
            else {
                continue; // restarts, skips and reopened windows: Raft copes
            };
            // Any message is a sign of life on the UDP path, as in the
            // daemon's receive.
            if let Some(w) = self.watches[to].as_mut() {
                w.detector.heard(self.now, peer, Channel::Udp);
            }
            let (&envelope, body) = message
                .split_first()
                .unwrap_or_else(|| panic!("n{}: an empty message from n{peer}", to + 1));
            if envelope == ENVELOPE_HEARTBEAT {
                let hb = Heartbeat::decode(body).unwrap_or_else(|e| {
                    panic!("n{}: undecodable heartbeat from n{peer}: {e}", to + 1)
                });
                assert_eq!(hb.node, peer, "n{}: a heartbeat in another's name", to + 1);
                self.heartbeat_udp(to, &hb)?;
                continue;
            }
            assert_eq!(envelope, ENVELOPE_RAFT, "n{}: an unknown envelope", to + 1);
            // As the node's loop decodes: an append shares its buffer.
            let (decoded, _) = decode_raft_delivery(message);
            let msg = decoded
                .unwrap_or_else(|e| panic!("n{}: undecodable message from n{peer}: {e}", to + 1));
            assert!(
                msg.from == peer && idx(msg.to) == to && (group as usize) < self.opts.groups,
                "n{}: the transport delivered {msg:?} from n{peer} in group {group}",
                to + 1
            );
            self.deliver(group as usize, msg)?;
        }
        Ok(())
    }

    /// Node `n`'s endpoint timer: stale if a sooner one replaced it or
    /// the node restarted since.
    pub(crate) fn endpoint_timer(&mut self, n: usize, at_ms: u64) -> Result<(), super::Violation> {
        let now_us = self.now * 1000;
        let net = self.endpoint_net.as_mut().expect("Net::Endpoint");
        if net.wake_ms[n] != Some(at_ms) {
            return Ok(());
        }
        net.wake_ms[n] = None;
        let Some(ep) = net.endpoints[n].as_mut() else {
            return Ok(());
        };
        ep.handle_timeout(now_us);
        net.dirty[n] = true;
        self.record(n, 0, What::EndpointTimer);
        Ok(())
    }

    /// Sends what every endpoint called since the last flush has to send,
    /// and sets its next wake-up.
    pub(crate) fn endpoint_flush_all(&mut self) {
        let Some(net) = self.endpoint_net.as_ref() else {
            return;
        };
        let dirty: Vec<usize> = (0..net.dirty.len()).filter(|&n| net.dirty[n]).collect();
        for n in dirty {
            self.endpoint_flush(n);
        }
    }

    fn endpoint_flush(&mut self, n: usize) {
        let (now, now_us) = (self.now, self.now * 1000);
        let net = self.endpoint_net.as_mut().expect("Net::Endpoint");
        net.dirty[n] = false;
        let Some(ep) = net.endpoints[n].as_mut() else {
            return;
        };
        let mut out = Vec::new();
        let mut timers_run = false;
        loop {
            while let Some(t) = ep.poll_transmit(now_us, &mut net.buf) {
                out.push((idx(t.peer), net.buf.clone()));
            }
            // A timer already due (the clock is in ms, the endpoint's in
            // µs) runs now, once; then what it wrote goes too.
            match ep.poll_timeout() {
                Some(t) if t <= now_us && !timers_run => {
                    ep.handle_timeout(now_us);
                    timers_run = true;
                }
                _ => break,
            }
        }
        // Never at this ms again: what is due now has just run.
        let wake = ep.poll_timeout().map(|t| t.div_ceil(1000).max(now + 1));
        if let Some(at_ms) = wake {
            if net.wake_ms[n].is_none_or(|w| at_ms < w) {
                net.wake_ms[n] = Some(at_ms);
                self.schedule(at_ms, Event::EndpointTimer { node: n, at_ms });
            }
        }
        for (to, bytes) in out {
            self.datagram_leaves(n, to, bytes);
        }
    }

    /// One datagram from `from` to `to` through the simulated network.
    fn datagram_leaves(&mut self, from: usize, to: usize, bytes: Vec<u8>) {
        assert!(
            to < self.nodes.len(),
            "a transmit to a node not in the cluster"
        );
        let arrivals = self.path_arrivals(from, to);
        let times = arrivals.times();
        if times.is_empty() {
            self.dropped += 1;
            self.record(from, 0, What::DatagramDrop { to: to as u64 + 1 });
            return;
        }
        for &at in times {
            let bytes = bytes.clone();
            self.schedule(at, Event::Datagram { from, to, bytes });
        }
    }

    /// The endpoints' counters, into the run's report.
    pub(crate) fn endpoint_report(&self, r: &mut RunReport) {
        let Some(net) = self.endpoint_net.as_ref() else {
            return;
        };
        let c = net.counters;
        let (mut rexmit, mut nacks) = (c.retired_retransmits, c.retired_nacks);
        for ep in net.endpoints.iter().flatten() {
            let (x, k) = channel_totals(ep);
            rexmit += x;
            nacks += k;
        }
        r.datagrams = c.datagrams;
        r.datagrams_refused = c.datagrams_refused;
        r.sends_refused = c.sends_refused;
        r.retransmits = rexmit;
        r.nacks_sent = nacks;
    }
}
