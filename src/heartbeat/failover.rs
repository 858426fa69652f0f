//! What the failure detector and the peers' heartbeats mean for this
//! node's Raft replicas: the policy between `heartbeat` and `consensus`.
//! Sans-IO and stateless; the driver (the node loop, the simulator) calls
//! it for every fresh heartbeat and every detector event, per group.
//!
//! | seen | replica input |
//! | --- | --- |
//! | detector: peer `down` (every channel silent) | `peer_down(peer)`: if it leads, campaign fast |
//! | detector: a group of the peer `disk-stalled` | `peer_down(peer)` for that group |
//! | heartbeat: sender leads a higher term | `observe_term`: a leader here steps down |
//! | heartbeat: sender leads this term with an IP quorum, our IP path to it dead | `leader_seen_out_of_band`: keep following |
//! | heartbeat: the leader we follow says it follows now, same term | `peer_down(peer)`: it stepped down (its disk stalled) |
//!
//! Only a sender that *leads* a higher term deposes anyone: a candidate's
//! term means nothing until it wins, and adopting it would let a node the
//! majority refused (pre-vote) disrupt a healthy leader over serial.

use super::detector::{Event, PeerStatus};
use super::message::{GroupStatus, Heartbeat};
use crate::consensus::{NodeId, Raft, Role};

/// True if the sender's own view shows UDP alive to enough peers that,
/// with itself, they make a majority of `voters`.
pub fn has_ip_quorum(hb: &Heartbeat, voters: usize) -> bool {
    let alive = hb.peers().iter().filter(|p| p.udp.is_alive()).count();
    (alive + 1) * 2 > voters
}

/// Applies what `hb` (from `hb.node`, fresh and authentic) says about one
/// group to this node's replica of it. `ip_alive`: this node's UDP link to
/// the sender is alive (then Raft's own traffic speaks for the leader).
pub fn on_group_status(
    raft: &mut Raft,
    now_ms: u64,
    hb: &Heartbeat,
    g: &GroupStatus,
    ip_alive: bool,
) {
    let from: NodeId = hb.node;
    if from == raft.id() {
        return;
    }
    match g.role {
        Role::Leader if g.term >= raft.term() => {
            raft.observe_term(now_ms, g.term); // a no-op for this term
            if !ip_alive && has_ip_quorum(hb, raft.membership().voters.len()) {
                raft.leader_seen_out_of_band(now_ms, from, g.term);
            }
        }
        // A follower in the very term it led cannot lead it again: it
        // stepped down (its disk stalled, or it lost its quorum).
        Role::Follower if g.term == raft.term() && raft.leader() == Some(from) => {
            raft.peer_down(now_ms, from);
        }
        _ => {}
    }
}

/// Applies a detector event to this node's replica of `group`.
pub fn on_event(raft: &mut Raft, now_ms: u64, group: u32, ev: &Event) {
    match *ev {
        Event::Peer {
            peer,
            new: PeerStatus::Down,
            ..
        } => raft.peer_down(now_ms, peer),
        Event::DiskStall {
            peer,
            group: g,
            stalled: true,
            ..
        } if g == group => raft.peer_down(now_ms, peer),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consensus::{Message, RaftConfig};
    use crate::heartbeat::{LinkState, PeerView};

    /// Node 2's replica, following leader 1 in term 1 (after one
    /// heartbeat), at 10 ms.
    fn follower_of_1() -> Raft {
        let mut r = Raft::new(RaftConfig::new(2, vec![1, 2, 3]), 7, 0).unwrap();
        r.step(
            10,
            Message {
                from: 1,
                to: 2,
                term: 1,
                body: crate::consensus::Body::Heartbeat {
                    commit: 0,
                    read_round: 0,
                },
            },
        );
        let _ = r.ready();
        assert_eq!(r.leader(), Some(1));
        r
    }

    fn heartbeat(
        from: NodeId,
        role: Role,
        term: u64,
        udp_to: &[(NodeId, LinkState)],
    ) -> (Heartbeat, GroupStatus) {
        let mut hb = Heartbeat::new(from, 1, 1);
        let g = GroupStatus {
            group: 0,
            role,
            term,
            leader: if role == Role::Leader { from } else { 0 },
            ..GroupStatus::default()
        };
        hb.push_group(g).unwrap();
        for &(node, udp) in udp_to {
            hb.push_peer(PeerView {
                node,
                udp,
                serial: Some(LinkState::Up),
            })
            .unwrap();
        }
        (hb, g)
    }

    #[test]
    fn a_leader_with_quorum_heard_over_serial_only_keeps_its_follower() {
        let mut r = follower_of_1();
        let (hb, g) = heartbeat(
            1,
            Role::Leader,
            1,
            &[(2, LinkState::Dead), (3, LinkState::Up)],
        );
        let deadline = r.poll_timeout();
        on_group_status(&mut r, 100, &hb, &g, false);
        assert!(
            r.poll_timeout() > deadline,
            "the election timer was pushed back"
        );
        assert_eq!(r.stats().out_of_band_leader_contacts, 1);
        // With UDP alive, Raft's own heartbeats speak for the leader.
        on_group_status(&mut r, 110, &hb, &g, true);
        assert_eq!(r.stats().out_of_band_leader_contacts, 1);
    }

    #[test]
    fn a_leader_without_ip_quorum_does_not_hold_anyone_back() {
        let mut r = follower_of_1();
        let (hb, g) = heartbeat(
            1,
            Role::Leader,
            1,
            &[(2, LinkState::Dead), (3, LinkState::Dead)],
        );
        on_group_status(&mut r, 100, &hb, &g, false);
        assert_eq!(r.stats().out_of_band_leader_contacts, 0);
    }

    #[test]
    fn only_a_leader_of_a_higher_term_deposes() {
        let mut r = follower_of_1();
        let (hb, g) = heartbeat(3, Role::Candidate, 5, &[]);
        on_group_status(&mut r, 100, &hb, &g, true);
        assert_eq!(r.term(), 1, "a candidate's term is not news");
        let (hb, g) = heartbeat(3, Role::Leader, 5, &[]);
        on_group_status(&mut r, 100, &hb, &g, true);
        assert_eq!(r.term(), 5);
    }

    #[test]
    fn a_leader_that_stepped_down_is_replaced_fast() {
        let mut r = follower_of_1();
        let (hb, g) = heartbeat(1, Role::Follower, 1, &[]);
        on_group_status(&mut r, 100, &hb, &g, true);
        assert_eq!(r.leader(), None);
        assert_eq!(r.stats().fast_campaigns, 1);
        assert!(r.poll_timeout() <= 100 + RaftConfig::new(2, vec![]).fast_campaign_jitter_ms);
    }

    #[test]
    fn down_and_disk_stalled_peers_are_left_behind() {
        let mut r = follower_of_1();
        let stall_elsewhere = Event::DiskStall {
            peer: 1,
            group: 3,
            stalled: true,
            at_ms: 50,
        };
        on_event(&mut r, 50, 0, &stall_elsewhere);
        assert_eq!(r.leader(), Some(1), "another group's disk");
        let stall = Event::DiskStall {
            peer: 1,
            group: 0,
            stalled: true,
            at_ms: 60,
        };
        on_event(&mut r, 60, 0, &stall);
        assert_eq!(r.leader(), None);
        let mut r = follower_of_1();
        let down = Event::Peer {
            peer: 1,
            old: PeerStatus::Up,
            new: PeerStatus::Down,
            at_ms: 70,
        };
        on_event(&mut r, 70, 0, &down);
        assert_eq!(r.stats().fast_campaigns, 1);
    }
}
