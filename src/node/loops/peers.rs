//! A loop's traffic with its peers: transport messages received and
//! dispatched to the replicas, peers heard on their sockets, heartbeats
//! over UDP and (control loop) the serial lines, the detector's events
//! handed to the failover policy, and the node's heartbeat sent. It never
//! blocks and never touches a client connection.

use super::event_loop::{EventLoop, HEARD_FORWARD_MS};
use crate::consensus::NodeId;
use crate::heartbeat::failover::{on_event, on_group_status};
use crate::heartbeat::{Channel, GroupStatus, Heartbeat};
use crate::node::mesh::CoreMsg;
use crate::transport::raft_codec::{decode_raft_delivery, ENVELOPE_HEARTBEAT, ENVELOPE_RAFT};
use crate::transport::Event;

impl EventLoop {
    /// A peer was heard over UDP on this loop's sockets.
    pub(super) fn heard_udp(&mut self, now: u64, peer: NodeId) {
        if let Some(c) = self.control.as_mut() {
            c.heard_udp(now, peer);
        } else if let Some(tx) = &self.to_control {
            let last = self.heard_forwarded.entry(peer).or_insert(0);
            if now >= *last + HEARD_FORWARD_MS {
                *last = now;
                tx.send(CoreMsg::HeardUdp { peer });
            }
        }
    }

    pub(super) fn receive_udp(&mut self, now: u64) {
        while let Some(ev) = self.udp.endpoint_mut().poll_event() {
            let Event::Delivered {
                peer,
                group,
                message,
            } = ev
            else {
                continue;
            };
            self.heard_udp(now, peer);
            if message.first() == Some(&ENVELOPE_RAFT) {
                let (decoded, spare) = decode_raft_delivery(message);
                match decoded {
                    Ok(msg) if msg.from == peer && msg.to == self.spec.id => {
                        if let Some(&i) = self.by_group.get(&group) {
                            self.replicas[i].step(now, msg);
                        }
                    }
                    Ok(_) | Err(_) => self.note(format!("dropped a bad message from node {peer}")),
                }
                // An append's entries keep its buffer; any other message's
                // carries the next reassembled one.
                if let Some(buf) = spare {
                    self.udp.endpoint_mut().recycle_message(buf);
                }
                continue;
            }
            match message.split_first() {
                Some((&ENVELOPE_HEARTBEAT, body)) => match Heartbeat::decode(body) {
                    Ok(hb) if hb.node == peer => self.udp_heartbeat(now, hb),
                    Ok(_) | Err(_) => {
                        self.note(format!("dropped a bad heartbeat from node {peer}"))
                    }
                },
                _ => self.note(format!("dropped an unknown message from node {peer}")),
            }
            // Decoded into owned values above: the buffer can carry the
            // next reassembled message (no allocation and page faults).
            self.udp.endpoint_mut().recycle_message(message);
        }
    }

    /// A heartbeat that arrived over UDP on this loop's sockets.
    pub(super) fn udp_heartbeat(&mut self, now: u64, hb: Heartbeat) {
        let Some(c) = self.control.as_mut() else {
            if let Some(tx) = &self.to_control {
                tx.send(CoreMsg::Heartbeat(Box::new(hb)));
            }
            return;
        };
        if c.fresh_udp(&hb) {
            self.heartbeat_heard(now, &hb, Channel::Udp);
        }
    }

    /// Messages from the node's other loops.
    pub(super) fn serve_mesh(&mut self, now: u64) {
        while let Ok(msg) = self.mesh.try_recv() {
            match msg {
                CoreMsg::HeardUdp { peer } => {
                    if let Some(c) = self.control.as_mut() {
                        c.heard_udp(now, peer);
                    }
                }
                CoreMsg::Heartbeat(hb) => self.udp_heartbeat(now, *hb),
                CoreMsg::Groups(groups) => {
                    if let Some(c) = self.control.as_mut() {
                        c.remote_groups(groups);
                    }
                }
                CoreMsg::Detector(ev) => {
                    for r in &mut self.replicas {
                        on_event(&mut r.raft, now, r.group, &ev);
                    }
                }
                CoreMsg::ClientDone(done) => {
                    if let Some(c) = self.clients.as_mut() {
                        for d in done {
                            c.deliver(d);
                        }
                    }
                }
                CoreMsg::ClientAnswer {
                    conn,
                    generation,
                    request,
                    response,
                    small,
                } => {
                    if let Some(c) = self.clients.as_mut() {
                        c.answer(conn, generation, request, response, small);
                    }
                }
                CoreMsg::PeerHeartbeat(hb, ip_alive) => {
                    for g in hb.groups() {
                        if let Some(&i) = self.by_group.get(&g.group) {
                            on_group_status(&mut self.replicas[i].raft, now, &hb, g, ip_alive);
                        }
                    }
                }
            }
        }
    }

    /// Control: the serial lines, and the heartbeats heard on them.
    pub(super) fn serve_serial(&mut self, now: u64) {
        let Some(c) = self.control.as_mut() else {
            return;
        };
        let udp = &self.udp;
        for hb in c.serve_serial(now, |fd| udp.wake_fd_ready(fd)) {
            self.heartbeat_heard(now, &hb, Channel::Serial);
        }
    }

    /// Control: a fresh, authentic heartbeat from a peer on `channel`.
    pub(super) fn heartbeat_heard(&mut self, now: u64, hb: &Heartbeat, channel: Channel) {
        let Some(c) = self.control.as_mut() else {
            return;
        };
        let ip_alive = c.heard(now, hb, channel);
        for g in hb.groups() {
            if let Some(&i) = self.by_group.get(&g.group) {
                on_group_status(&mut self.replicas[i].raft, now, hb, g, ip_alive);
            }
        }
        self.detector_events(now);
    }

    /// Control: notes each of the detector's events and hands it to the
    /// failover policy of this loop's replicas (the workers get it from
    /// `Control::next_event`).
    pub(super) fn detector_events(&mut self, now: u64) {
        while let Some((ev, line)) = self.control.as_mut().and_then(|c| c.next_event()) {
            self.note(line);
            for r in &mut self.replicas {
                on_event(&mut r.raft, now, r.group, &ev);
            }
        }
    }

    pub(super) fn group_statuses(&self) -> Vec<GroupStatus> {
        self.replicas.iter().map(|r| r.group_status()).collect()
    }

    /// Control: the node's heartbeat on every channel. Worker: its groups
    /// to the control loop, which puts them in the heartbeat.
    pub(super) fn send_heartbeat(&mut self, now: u64) {
        let mine = self.group_statuses();
        let Some(c) = self.control.as_mut() else {
            if let Some(tx) = &self.to_control {
                tx.send(CoreMsg::Groups(mine));
            }
            return;
        };
        let hb = c.heartbeat(self.spec.id, &self.spec.key, now, mine);
        self.buf.clear();
        self.buf.push(ENVELOPE_HEARTBEAT);
        if hb.encode(&mut self.buf).is_err() {
            return;
        }
        let group = self.replicas[0].group;
        let peers: Vec<NodeId> = self.spec.peers.iter().map(|p| p.id).collect();
        for peer in peers {
            let _ = self.udp.endpoint_mut().send(peer, group, &self.buf);
        }
    }
}
