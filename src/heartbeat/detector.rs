//! The failure detector: Linux-HA Heartbeat's four timers per peer and per
//! channel (UDP, serial), a classification of every peer from both
//! channels together, and a disk-stall flag from the peer's own reports.
//!
//! Sans-IO: no clock, no I/O. The driver loop is quinn's:
//!
//! ```text
//!   inputs:  d.heard(now, peer, channel)     every authentic, fresh message
//!                                            from the peer on that channel
//!            d.disk_progress(now, peer, ..)  per group of every heartbeat
//!            d.tick(now)                     once now >= d.poll_timeout()
//!   then:    while let Some(e) = d.poll_event() { log once, count, alarm }
//!   query:   d.status(peer), d.disk_stalled(peer), d.link(peer, ch)
//! ```
//!
//! Per link (peer × channel), with `silence = now - last heard`:
//!
//! ```text
//!   Init --heard--> Up --silence >= warntime--> Late --silence >= deadtime--> Dead
//!   Init --initdead elapsed since the peer was added, never heard--> Dead
//!   Late, Dead --heard--> Up
//! ```
//!
//! Every change of a link, of a peer's classification, and of a group's
//! stall flag is queued exactly once as an [`Event`]. Time only moves
//! forward: an input with an earlier `now_ms` than one already seen is
//! taken at the latest time seen.

use std::collections::VecDeque;

use super::message::{LinkState, PeerView, GROUPS_MAX, PEERS_MAX};
use crate::consensus::NodeId;

/// One of the two independent paths to a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Channel {
    /// The replication transport over IP.
    Udp,
    /// The RS-232 null-modem cable.
    Serial,
}

impl Channel {
    /// The lower-case name used in logs and `quire status`.
    pub fn name(self) -> &'static str {
        match self {
            Channel::Udp => "udp",
            Channel::Serial => "serial",
        }
    }
}

/// A peer's classification from all its channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PeerStatus {
    /// Not enough heard yet to say (start-up grace, `initdead_ms`). Never
    /// reported as up: a peer is up only once heard.
    Unknown,
    /// Heard on UDP, and on serial if it has a cable.
    Up,
    /// Serial alive, UDP dead: the IP path is broken, the peer is not.
    IpPartitioned,
    /// UDP alive, serial dead: the backup link is broken; alarm only.
    SerialDown,
    /// Every channel dead.
    Down,
}

impl PeerStatus {
    /// The lower-case name used in logs and `quire status`.
    pub fn name(self) -> &'static str {
        match self {
            PeerStatus::Unknown => "unknown",
            PeerStatus::Up => "up",
            PeerStatus::IpPartitioned => "ip-partitioned",
            PeerStatus::SerialDown => "serial-down",
            PeerStatus::Down => "down",
        }
    }
}

/// Something that changed, each queued exactly once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A link changed state.
    Link {
        /// The peer.
        peer: NodeId,
        /// Which of its channels.
        channel: Channel,
        /// State before.
        old: LinkState,
        /// State now.
        new: LinkState,
        /// When (the `now_ms` of the input that found it).
        at_ms: u64,
    },
    /// A peer's classification changed.
    Peer {
        /// The peer.
        peer: NodeId,
        /// Classification before.
        old: PeerStatus,
        /// Classification now.
        new: PeerStatus,
        /// When.
        at_ms: u64,
    },
    /// A group on a peer started or stopped looking disk-stalled.
    DiskStall {
        /// The peer.
        peer: NodeId,
        /// The group whose fsyncs stopped (or resumed).
        group: u32,
        /// True: stalled now; false: progressing again (or idle).
        stalled: bool,
        /// When.
        at_ms: u64,
    },
}

/// The timers. Both ends should use the same values.
///
/// Defaults, for a LAN and leader failover within 500 ms at p99:
///
/// - `keepalive_ms` 50: a 3-node, 2-group heartbeat takes 14 ms on the
///   line at 115200 baud, so the serial link stays under a third busy;
///   UDP heartbeats ride on Raft's (30 ms) anyway.
/// - `warntime_ms` 150: three heartbeats missed is worth a log line, not
///   an action.
/// - `deadtime_ms` 250: five heartbeats missed in a row. A dead leader is
///   declared dead at most 250 ms after its last heartbeat (so after it
///   died); the follower then campaigns after a random delay (≤ 50 ms) and
///   one pre-vote + vote round (a few RTTs and one fsync of the vote,
///   ≤ 50 ms at p99 on NVMe): ≤ 350 ms, which leaves 150 ms for scheduling
///   and tick granularity. A false "down" needs *both* channels — which
///   share no hardware — to lose five heartbeats in a row.
/// - `initdead_ms` 2000: peers rarely start within 250 ms of each other;
///   eight deadtimes of grace keep a cluster start from raising alarms
///   (Heartbeat recommends at least twice the deadtime).
/// - `disk_stall_ms` 2000: the same threshold as the WAL's own
///   `disk_stall_ms`, beyond any healthy fsync (tens of ms), well within
///   what a client waits before it gives up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DetectorConfig {
    /// Interval at which heartbeats are sent (the sender's timer; used
    /// here to check the others against it).
    pub keepalive_ms: u64,
    /// Silence after which a link is `Late` (logged, counted; no action).
    pub warntime_ms: u64,
    /// Silence after which a link is `Dead`.
    pub deadtime_ms: u64,
    /// Grace after a peer is added before a never-heard link is `Dead`.
    pub initdead_ms: u64,
    /// A peer reporting writes pending and no fsync completion for this
    /// long is flagged disk-stalled.
    pub disk_stall_ms: u64,
    /// Undrained events kept; beyond it the oldest is dropped and counted.
    pub events_max: usize,
}

impl Default for DetectorConfig {
    fn default() -> Self {
        DetectorConfig {
            keepalive_ms: 50,
            warntime_ms: 150,
            deadtime_ms: 250,
            initdead_ms: 2000,
            disk_stall_ms: 2000,
            events_max: 1024,
        }
    }
}

/// A configuration the detector refuses, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DetectorConfigError(pub String);

impl std::fmt::Display for DetectorConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DetectorConfigError {}

impl DetectorConfig {
    /// Checks the timers' order: keepalive < warntime < deadtime <= initdead.
    pub fn validate(&self) -> Result<(), DetectorConfigError> {
        let err = |s: String| Err(DetectorConfigError(s));
        if self.keepalive_ms == 0 {
            return err("keepalive_ms must be at least 1".into());
        }
        if self.warntime_ms <= self.keepalive_ms {
            return err(format!(
                "warntime_ms {} must exceed keepalive_ms {}: a heartbeat is not late before it is due",
                self.warntime_ms, self.keepalive_ms
            ));
        }
        if self.deadtime_ms <= self.warntime_ms {
            return err(format!(
                "deadtime_ms {} must exceed warntime_ms {}: a link is late before it is dead",
                self.deadtime_ms, self.warntime_ms
            ));
        }
        if self.initdead_ms < self.deadtime_ms {
            return err(format!(
                "initdead_ms {} must be at least deadtime_ms {} (Heartbeat recommends twice)",
                self.initdead_ms, self.deadtime_ms
            ));
        }
        if self.disk_stall_ms == 0 || self.events_max == 0 {
            return err("disk_stall_ms and events_max must be at least 1".into());
        }
        Ok(())
    }
}

/// Counters of one link; names say what they count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Messages heard.
    pub heartbeats: u64,
    /// Of those, heard after `warntime_ms` or more of silence.
    pub late_heartbeats: u64,
    /// State changes.
    pub transitions: u64,
    /// State changes into `Dead`.
    pub deaths: u64,
    /// Longest silence between two messages heard, ms.
    pub longest_silence_ms: u64,
}

/// One link as `quire status` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkInfo {
    /// Current state.
    pub state: LinkState,
    /// When the peer was last heard on this channel; `None`: never.
    pub last_heard_ms: Option<u64>,
    /// When the link entered its current state (or the peer was added).
    pub since_ms: u64,
    /// Its counters.
    pub stats: LinkStats,
}

impl LinkInfo {
    /// When the link died, if it is dead now.
    pub fn dead_since_ms(&self) -> Option<u64> {
        (self.state == LinkState::Dead).then_some(self.since_ms)
    }
}

/// Counters of the whole detector.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DetectorStats {
    /// Link state changes, every peer and channel.
    pub link_transitions: u64,
    /// Peer classification changes.
    pub peer_transitions: u64,
    /// Messages heard after `warntime_ms` or more of silence.
    pub late_heartbeats: u64,
    /// Groups entering the disk-stalled state.
    pub disk_stalls: u64,
    /// Inputs about a peer never added (or a serial input for a peer
    /// without a cable): ignored.
    pub unknown_inputs: u64,
    /// Disk reports for groups beyond `GROUPS_MAX` per peer: ignored.
    pub groups_over_limit: u64,
    /// Events dropped because the caller did not drain `events_max`.
    pub events_dropped: u64,
}

#[derive(Clone, Debug)]
struct Link {
    state: LinkState,
    last_heard_ms: Option<u64>,
    since_ms: u64,
    stats: LinkStats,
}

#[derive(Clone, Debug)]
struct GroupDisk {
    group: u32,
    last_fsync_ms: u64,
    pending: bool,
    /// Our time since which no progress is known while pending.
    since_ms: u64,
    stalled: bool,
}

#[derive(Clone, Debug)]
struct Peer {
    id: NodeId,
    added_ms: u64,
    udp: Link,
    serial: Option<Link>,
    status: PeerStatus,
    disks: Vec<GroupDisk>,
}

/// The failure detector of one node: all its peers, both channels.
#[derive(Clone, Debug)]
pub struct Detector {
    cfg: DetectorConfig,
    now_ms: u64,
    /// Sorted by id.
    peers: Vec<Peer>,
    events: VecDeque<Event>,
    stats: DetectorStats,
}

impl Detector {
    /// A detector with no peers; `now_ms` starts its clock.
    pub fn new(cfg: DetectorConfig, now_ms: u64) -> Result<Self, DetectorConfigError> {
        cfg.validate()?;
        Ok(Detector {
            cfg,
            now_ms,
            peers: Vec::new(),
            events: VecDeque::new(),
            stats: DetectorStats::default(),
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> &DetectorConfig {
        &self.cfg
    }

    /// Starts watching `peer`; `serial` says whether a cable runs to it (a
    /// peer without one is classified from UDP alone). Its `initdead_ms`
    /// grace starts now. False if it is already watched or `PEERS_MAX`
    /// are (the views must fit a heartbeat).
    pub fn add_peer(&mut self, now_ms: u64, peer: NodeId, serial: bool) -> bool {
        let now = self.advance(now_ms);
        let Err(at) = self.peers.binary_search_by_key(&peer, |p| p.id) else {
            return false;
        };
        if peer == 0 || self.peers.len() == PEERS_MAX {
            return false;
        }
        let link = Link {
            state: LinkState::Init,
            last_heard_ms: None,
            since_ms: now,
            stats: LinkStats::default(),
        };
        self.peers.insert(
            at,
            Peer {
                id: peer,
                added_ms: now,
                udp: link.clone(),
                serial: serial.then_some(link),
                status: PeerStatus::Unknown,
                disks: Vec::new(),
            },
        );
        self.assert_consistent();
        true
    }

    /// An authentic, fresh message from `peer` arrived on `channel` (for
    /// serial: a heartbeat that passed the frame checks and the replay
    /// guard; for UDP: any datagram of the peer's current session).
    pub fn heard(&mut self, now_ms: u64, peer: NodeId, channel: Channel) {
        let now = self.advance(now_ms);
        let warn = self.cfg.warntime_ms;
        let Some(i) = self.index(peer) else {
            self.stats.unknown_inputs += 1;
            return;
        };
        let p = &mut self.peers[i];
        let link = match channel {
            Channel::Udp => &mut p.udp,
            Channel::Serial => match p.serial.as_mut() {
                Some(l) => l,
                None => {
                    self.stats.unknown_inputs += 1;
                    return;
                }
            },
        };
        link.stats.heartbeats += 1;
        if let Some(t) = link.last_heard_ms {
            let silence = now - t;
            link.stats.longest_silence_ms = link.stats.longest_silence_ms.max(silence);
            if silence >= warn {
                link.stats.late_heartbeats += 1;
                self.stats.late_heartbeats += 1;
            }
        }
        link.last_heard_ms = Some(now);
        let old = link.state;
        if old != LinkState::Up {
            set_state(link, LinkState::Up, now);
            self.link_event(peer, channel, old, LinkState::Up, now);
        }
        self.reclassify(i, now);
        self.assert_consistent();
    }

    /// The disk progress `peer` reported for `group` in a heartbeat: its
    /// last fsync completion time (its own clock) and whether writes are
    /// pending. Stalled once writes have been pending for `disk_stall_ms`
    /// of our time with no change in `last_fsync_ms`.
    pub fn disk_progress(
        &mut self,
        now_ms: u64,
        peer: NodeId,
        group: u32,
        last_fsync_ms: u64,
        pending: bool,
    ) {
        let now = self.advance(now_ms);
        let Some(i) = self.index(peer) else {
            self.stats.unknown_inputs += 1;
            return;
        };
        let disks = &mut self.peers[i].disks;
        let d = match disks.iter().position(|d| d.group == group) {
            Some(j) => {
                let d = &mut disks[j];
                if d.last_fsync_ms != last_fsync_ms || (pending && !d.pending) {
                    // Progress, or writes pending again after an idle spell:
                    // the stall clock starts now, not at the last fsync.
                    d.since_ms = now;
                }
                d.last_fsync_ms = last_fsync_ms;
                d.pending = pending;
                d
            }
            None if disks.len() == GROUPS_MAX => {
                self.stats.groups_over_limit += 1;
                return;
            }
            None => {
                disks.push(GroupDisk {
                    group,
                    last_fsync_ms,
                    pending,
                    since_ms: now,
                    stalled: false,
                });
                disks.last_mut().expect("just pushed")
            }
        };
        let stall = self.cfg.disk_stall_ms;
        if let Some(stalled) = update_stall(d, now, stall, false) {
            self.stall_event(peer, group, stalled, now);
        }
        self.assert_consistent();
    }

    /// Applies the passage of time: links late, dead, disks stalled. Call
    /// once `now_ms >= poll_timeout()`; calling more often is harmless.
    pub fn tick(&mut self, now_ms: u64) {
        self.advance(now_ms);
    }

    /// The next time at which `tick` may change something; `None` if
    /// nothing will change without a new input.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<u64> {
        let c = &self.cfg;
        let mut next: Option<u64> = None;
        let mut at = |t: u64| next = Some(next.map_or(t, |n| n.min(t)));
        for p in &self.peers {
            for l in std::iter::once(&p.udp).chain(p.serial.as_ref()) {
                match (l.state, l.last_heard_ms) {
                    (LinkState::Init, _) => at(p.added_ms.saturating_add(c.initdead_ms)),
                    (LinkState::Up, Some(t)) => at(t.saturating_add(c.warntime_ms)),
                    (LinkState::Late, Some(t)) => at(t.saturating_add(c.deadtime_ms)),
                    _ => {}
                }
            }
            // A silent (down) peer's disk is never flagged (see `advance`),
            // so its stall clock is no deadline.
            if p.status != PeerStatus::Down {
                for d in p.disks.iter().filter(|d| d.pending && !d.stalled) {
                    at(d.since_ms.saturating_add(c.disk_stall_ms));
                }
            }
        }
        next
    }

    /// The next change, oldest first.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The classification of `peer`; `None` if not watched.
    pub fn status(&self, peer: NodeId) -> Option<PeerStatus> {
        self.index(peer).map(|i| self.peers[i].status)
    }

    /// True if any group of `peer` looks disk-stalled.
    pub fn disk_stalled(&self, peer: NodeId) -> bool {
        self.index(peer)
            .is_some_and(|i| self.peers[i].disks.iter().any(|d| d.stalled))
    }

    /// The groups of `peer` that look disk-stalled.
    pub fn stalled_groups(&self, peer: NodeId) -> impl Iterator<Item = u32> + '_ {
        self.index(peer).into_iter().flat_map(move |i| {
            self.peers[i]
                .disks
                .iter()
                .filter(|d| d.stalled)
                .map(|d| d.group)
        })
    }

    /// One link's state, last heard time and counters; `None` if the peer
    /// is not watched or has no such channel.
    pub fn link(&self, peer: NodeId, channel: Channel) -> Option<LinkInfo> {
        let p = &self.peers[self.index(peer)?];
        let l = match channel {
            Channel::Udp => &p.udp,
            Channel::Serial => p.serial.as_ref()?,
        };
        Some(LinkInfo {
            state: l.state,
            last_heard_ms: l.last_heard_ms,
            since_ms: l.since_ms,
            stats: l.stats,
        })
    }

    /// The watched peers, in increasing id order.
    pub fn peers(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.peers.iter().map(|p| p.id)
    }

    /// Our view of every peer's links, for the heartbeat we send.
    pub fn views(&self) -> impl Iterator<Item = PeerView> + '_ {
        self.peers.iter().map(|p| PeerView {
            node: p.id,
            udp: p.udp.state,
            serial: p.serial.as_ref().map(|l| l.state),
        })
    }

    /// True while any link of any peer is dead: the alarm line stays up.
    pub fn any_link_dead(&self) -> bool {
        self.peers.iter().any(|p| {
            std::iter::once(&p.udp)
                .chain(p.serial.as_ref())
                .any(|l| l.state == LinkState::Dead)
        })
    }

    /// The counters.
    pub fn stats(&self) -> &DetectorStats {
        &self.stats
    }

    fn index(&self, peer: NodeId) -> Option<usize> {
        self.peers.binary_search_by_key(&peer, |p| p.id).ok()
    }

    /// What holds after every input: the invariants the failover policy
    /// relies on. Cheap (at most `PEERS_MAX` peers of two links each).
    fn assert_consistent(&self) {
        let (now, c) = (self.now_ms, &self.cfg);
        // Sorted, distinct ids: `index` searches by id, and a peer found at
        // the wrong slot would take another's heartbeats (a dead leader
        // seen alive, or a live one declared dead).
        assert!(self.peers.windows(2).all(|w| w[0].id < w[1].id));
        assert!(self.peers.len() <= PEERS_MAX);
        assert!(self.events.len() <= c.events_max);
        for p in &self.peers {
            for l in std::iter::once(&p.udp).chain(p.serial.as_ref()) {
                // A link's state is what its silence says, up to `now`: a
                // link left Up past deadtime delays failover from a dead
                // leader; one Dead while heard starts a needless election.
                let silence = l.last_heard_ms.map(|t| now - t);
                let holds = match (l.state, silence) {
                    (LinkState::Init, None) => now - p.added_ms < c.initdead_ms,
                    (LinkState::Up, Some(s)) => s < c.warntime_ms,
                    (LinkState::Late, Some(s)) => (c.warntime_ms..c.deadtime_ms).contains(&s),
                    (LinkState::Dead, None) => now - p.added_ms >= c.initdead_ms,
                    (LinkState::Dead, Some(s)) => s >= c.deadtime_ms,
                    _ => false,
                };
                assert!(
                    holds && l.since_ms <= now,
                    "peer {}: link {:?} after {silence:?} ms of silence at {now}",
                    p.id,
                    l.state
                );
            }
            // The classification follows its links: a stale one would have
            // the failover policy act on an old view.
            assert_eq!(
                p.status,
                classify(p.udp.state, p.serial.as_ref().map(|l| l.state)),
                "peer {}",
                p.id
            );
            // Only a disk with writes pending can stall: a flag without
            // them would make its node step down for nothing.
            assert!(p.disks.len() <= GROUPS_MAX);
            assert!(p.disks.iter().all(|d| d.pending || !d.stalled));
        }
    }

    /// Moves the clock to `now_ms` (never back) and applies every
    /// time-based change up to it; returns the clock.
    fn advance(&mut self, now_ms: u64) -> u64 {
        let now = now_ms.max(self.now_ms);
        self.now_ms = now;
        let c = self.cfg;
        for i in 0..self.peers.len() {
            let id = self.peers[i].id;
            for channel in [Channel::Udp, Channel::Serial] {
                let p = &mut self.peers[i];
                let added = p.added_ms;
                let Some(mut link) = (match channel {
                    Channel::Udp => Some(&mut p.udp),
                    Channel::Serial => p.serial.as_mut(),
                }) else {
                    continue;
                };
                // Step through every state the link passed since the last
                // input (Up -> Late -> Dead), each stamped with the time it
                // really happened, so a coarse tick reports the same
                // transitions as a fine one and `since_ms` is exact.
                loop {
                    let (next, at) = match (link.state, link.last_heard_ms) {
                        (LinkState::Init, None) if now.saturating_sub(added) >= c.initdead_ms => {
                            (LinkState::Dead, added.saturating_add(c.initdead_ms))
                        }
                        (LinkState::Up, Some(t)) if now - t >= c.warntime_ms => {
                            (LinkState::Late, t.saturating_add(c.warntime_ms))
                        }
                        (LinkState::Late, Some(t)) if now - t >= c.deadtime_ms => {
                            (LinkState::Dead, t.saturating_add(c.deadtime_ms))
                        }
                        _ => break,
                    };
                    let old = link.state;
                    set_state(link, next, at);
                    self.link_event(id, channel, old, next, at);
                    let p = &mut self.peers[i];
                    link = match channel {
                        Channel::Udp => &mut p.udp,
                        Channel::Serial => p.serial.as_mut().expect("checked above"),
                    };
                }
            }
            self.reclassify(i, now);
            // A peer silent on every channel is down, not disk-stalled:
            // its last report says nothing about its disk now.
            let silent = self.peers[i].status == PeerStatus::Down;
            for j in 0..self.peers[i].disks.len() {
                let d = &mut self.peers[i].disks[j];
                let group = d.group;
                if let Some(stalled) = update_stall(d, now, c.disk_stall_ms, silent) {
                    self.stall_event(id, group, stalled, now);
                }
            }
        }
        self.assert_consistent();
        now
    }

    fn reclassify(&mut self, i: usize, now: u64) {
        let p = &mut self.peers[i];
        let new = classify(p.udp.state, p.serial.as_ref().map(|l| l.state));
        let old = p.status;
        if new != old {
            p.status = new;
            let peer = p.id;
            self.stats.peer_transitions += 1;
            self.push_event(Event::Peer {
                peer,
                old,
                new,
                at_ms: now,
            });
        }
    }

    fn link_event(
        &mut self,
        peer: NodeId,
        channel: Channel,
        old: LinkState,
        new: LinkState,
        at_ms: u64,
    ) {
        self.stats.link_transitions += 1;
        self.push_event(Event::Link {
            peer,
            channel,
            old,
            new,
            at_ms,
        });
    }

    fn stall_event(&mut self, peer: NodeId, group: u32, stalled: bool, at_ms: u64) {
        if stalled {
            self.stats.disk_stalls += 1;
        }
        self.push_event(Event::DiskStall {
            peer,
            group,
            stalled,
            at_ms,
        });
    }

    fn push_event(&mut self, e: Event) {
        if self.events.len() >= self.cfg.events_max {
            self.events.pop_front();
            self.stats.events_dropped += 1;
        }
        self.events.push_back(e);
    }
}

fn set_state(link: &mut Link, new: LinkState, now: u64) {
    link.state = new;
    link.since_ms = now;
    link.stats.transitions += 1;
    if new == LinkState::Dead {
        link.stats.deaths += 1;
    }
}

/// Re-evaluates one group's stall flag; `Some(new)` if it changed.
fn update_stall(d: &mut GroupDisk, now: u64, disk_stall_ms: u64, silent: bool) -> Option<bool> {
    let stalled = !silent && d.pending && now.saturating_sub(d.since_ms) >= disk_stall_ms;
    (stalled != d.stalled).then(|| {
        d.stalled = stalled;
        stalled
    })
}

/// A peer's classification from its links; `serial` is `None` without a
/// cable. A channel still in `Init` (start-up grace) neither proves the
/// peer alive nor dead.
fn classify(udp: LinkState, serial: Option<LinkState>) -> PeerStatus {
    let Some(serial) = serial else {
        return match udp {
            LinkState::Init => PeerStatus::Unknown,
            LinkState::Dead => PeerStatus::Down,
            LinkState::Up | LinkState::Late => PeerStatus::Up,
        };
    };
    match (udp.is_alive(), serial.is_alive()) {
        (true, true) => PeerStatus::Up,
        (true, false) if serial == LinkState::Dead => PeerStatus::SerialDown,
        (false, true) if udp == LinkState::Dead => PeerStatus::IpPartitioned,
        (true, false) | (false, true) => PeerStatus::Up,
        (false, false) if udp == LinkState::Dead && serial == LinkState::Dead => PeerStatus::Down,
        (false, false) => PeerStatus::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: NodeId = 2;
    const B: NodeId = 3;

    fn detector() -> Detector {
        let mut d = Detector::new(DetectorConfig::default(), 0).unwrap();
        assert!(d.add_peer(0, A, true));
        assert!(d.add_peer(0, B, false));
        d
    }

    fn events(d: &mut Detector) -> Vec<Event> {
        std::iter::from_fn(|| d.poll_event()).collect()
    }

    fn link_events(d: &mut Detector) -> Vec<(NodeId, Channel, LinkState, LinkState)> {
        events(d)
            .into_iter()
            .filter_map(|e| match e {
                Event::Link {
                    peer,
                    channel,
                    old,
                    new,
                    ..
                } => Some((peer, channel, old, new)),
                _ => None,
            })
            .collect()
    }

    /// Both channels of A and UDP of B heard every `keepalive_ms` from
    /// `from` to `to`, ticking at each step.
    fn hear_all(d: &mut Detector, from: u64, to: u64) {
        let mut t = from;
        while t <= to {
            d.heard(t, A, Channel::Udp);
            d.heard(t, A, Channel::Serial);
            d.heard(t, B, Channel::Udp);
            d.tick(t);
            t += 50;
        }
    }

    #[test]
    fn defaults_are_valid_and_ordered() {
        let c = DetectorConfig::default();
        c.validate().unwrap();
        let bad = |f: fn(&mut DetectorConfig)| {
            let mut c = DetectorConfig::default();
            f(&mut c);
            c.validate().is_err()
        };
        assert!(bad(|c| c.keepalive_ms = 0));
        assert!(bad(|c| c.warntime_ms = 50));
        assert!(bad(|c| c.deadtime_ms = 150));
        assert!(bad(|c| c.initdead_ms = 249));
        assert!(bad(|c| c.disk_stall_ms = 0));
        assert!(bad(|c| c.events_max = 0));
        assert!(Detector::new(
            DetectorConfig {
                deadtime_ms: 1,
                ..c
            },
            0
        )
        .is_err());
    }

    #[test]
    fn unknown_during_initdead_then_down_if_never_heard() {
        let mut d = detector();
        d.tick(1999);
        assert_eq!(d.status(A), Some(PeerStatus::Unknown));
        assert_eq!(d.status(B), Some(PeerStatus::Unknown));
        assert!(events(&mut d).is_empty());
        assert_eq!(d.poll_timeout(), Some(2000));
        d.tick(2000);
        assert_eq!(d.status(A), Some(PeerStatus::Down));
        assert_eq!(d.status(B), Some(PeerStatus::Down));
        let mut d = detector();
        d.tick(2000);
        let ev = events(&mut d);
        assert_eq!(
            ev,
            vec![
                Event::Link {
                    peer: A,
                    channel: Channel::Udp,
                    old: LinkState::Init,
                    new: LinkState::Dead,
                    at_ms: 2000
                },
                Event::Link {
                    peer: A,
                    channel: Channel::Serial,
                    old: LinkState::Init,
                    new: LinkState::Dead,
                    at_ms: 2000
                },
                Event::Peer {
                    peer: A,
                    old: PeerStatus::Unknown,
                    new: PeerStatus::Down,
                    at_ms: 2000
                },
                Event::Link {
                    peer: B,
                    channel: Channel::Udp,
                    old: LinkState::Init,
                    new: LinkState::Dead,
                    at_ms: 2000
                },
                Event::Peer {
                    peer: B,
                    old: PeerStatus::Unknown,
                    new: PeerStatus::Down,
                    at_ms: 2000
                },
            ]
        );
        assert!(d.any_link_dead());
        assert_eq!(
            d.link(A, Channel::Serial).unwrap().dead_since_ms(),
            Some(2000)
        );
        assert_eq!(d.poll_timeout(), None);
    }

    #[test]
    fn up_once_every_channel_heard() {
        let mut d = detector();
        d.heard(10, A, Channel::Serial);
        assert_eq!(
            d.status(A),
            Some(PeerStatus::Up),
            "serial heard, udp still in grace"
        );
        d.heard(20, A, Channel::Udp);
        d.heard(20, B, Channel::Udp);
        assert_eq!(d.status(A), Some(PeerStatus::Up));
        assert_eq!(
            d.status(B),
            Some(PeerStatus::Up),
            "no cable: UDP alone decides"
        );
        assert!(d.link(B, Channel::Serial).is_none());
        assert!(!d.any_link_dead());
    }

    #[test]
    fn each_classification_and_each_transition_once() {
        let mut d = detector();
        hear_all(&mut d, 0, 1000);
        events(&mut d);
        assert_eq!(d.status(A), Some(PeerStatus::Up));

        // UDP to A falls silent: late at +150, dead at +250; serial goes on.
        let mut t = 1050;
        while t <= 1400 {
            d.heard(t, A, Channel::Serial);
            d.heard(t, B, Channel::Udp);
            d.tick(t);
            t += 10;
        }
        assert_eq!(d.status(A), Some(PeerStatus::IpPartitioned));
        let ev = events(&mut d);
        assert_eq!(
            ev,
            vec![
                Event::Link {
                    peer: A,
                    channel: Channel::Udp,
                    old: LinkState::Up,
                    new: LinkState::Late,
                    at_ms: 1150
                },
                Event::Link {
                    peer: A,
                    channel: Channel::Udp,
                    old: LinkState::Late,
                    new: LinkState::Dead,
                    at_ms: 1250
                },
                Event::Peer {
                    peer: A,
                    old: PeerStatus::Up,
                    new: PeerStatus::IpPartitioned,
                    at_ms: 1250
                },
            ]
        );
        assert_eq!(d.link(A, Channel::Udp).unwrap().dead_since_ms(), Some(1250));
        assert_eq!(d.link(A, Channel::Udp).unwrap().last_heard_ms, Some(1000));

        // UDP back, serial silent: serial-down.
        let mut t = 1410;
        while t <= 1800 {
            d.heard(t, A, Channel::Udp);
            d.heard(t, B, Channel::Udp);
            d.tick(t);
            t += 10;
        }
        assert_eq!(d.status(A), Some(PeerStatus::SerialDown));
        assert_eq!(
            link_events(&mut d),
            vec![
                (A, Channel::Udp, LinkState::Dead, LinkState::Up),
                (A, Channel::Serial, LinkState::Up, LinkState::Late),
                (A, Channel::Serial, LinkState::Late, LinkState::Dead),
            ]
        );

        // Everything silent: down.
        d.tick(1800 + 250);
        assert_eq!(d.status(A), Some(PeerStatus::Down));
        assert_eq!(d.status(B), Some(PeerStatus::Down));
        let s = d.link(A, Channel::Udp).unwrap().stats;
        assert_eq!((s.deaths, s.late_heartbeats), (2, 1));
        assert_eq!(d.stats().late_heartbeats, 1);
        // Ticking again changes nothing and emits nothing.
        events(&mut d);
        d.tick(5000);
        d.tick(5000);
        assert!(events(&mut d).is_empty());
    }

    #[test]
    fn a_late_heartbeat_without_a_tick_still_reports_what_happened() {
        let mut d = detector();
        hear_all(&mut d, 0, 500);
        events(&mut d);
        // No tick for 300 ms; the next heartbeat shows the link went late
        // and dead in between, then up, each reported once, in order.
        d.heard(800, A, Channel::Udp);
        let ev: Vec<_> = link_events(&mut d)
            .into_iter()
            .filter(|e| e.0 == A && e.1 == Channel::Udp)
            .collect();
        assert_eq!(
            ev,
            vec![
                (A, Channel::Udp, LinkState::Up, LinkState::Late),
                (A, Channel::Udp, LinkState::Late, LinkState::Dead),
                (A, Channel::Udp, LinkState::Dead, LinkState::Up),
            ]
        );
        let s = d.link(A, Channel::Udp).unwrap().stats;
        assert_eq!(s.longest_silence_ms, 300);
        assert_eq!(s.late_heartbeats, 1);
    }

    #[test]
    fn late_recovers_without_dying() {
        let mut d = detector();
        hear_all(&mut d, 0, 500);
        events(&mut d);
        d.tick(700);
        d.heard(720, A, Channel::Serial);
        let ev: Vec<_> = link_events(&mut d)
            .into_iter()
            .filter(|e| e.0 == A && e.1 == Channel::Serial)
            .collect();
        assert_eq!(
            ev,
            vec![
                (A, Channel::Serial, LinkState::Up, LinkState::Late),
                (A, Channel::Serial, LinkState::Late, LinkState::Up),
            ]
        );
        assert_eq!(d.link(A, Channel::Serial).unwrap().stats.deaths, 0);
    }

    #[test]
    fn poll_timeout_names_the_next_change() {
        let mut d = detector();
        assert_eq!(d.poll_timeout(), Some(2000));
        d.heard(100, A, Channel::Udp);
        d.heard(100, A, Channel::Serial);
        d.heard(100, B, Channel::Udp);
        assert_eq!(
            d.poll_timeout(),
            Some(250),
            "warntime after the last heartbeat"
        );
        d.tick(250);
        assert_eq!(d.poll_timeout(), Some(350), "then deadtime");
        d.tick(350);
        assert_eq!(d.poll_timeout(), None);
    }

    #[test]
    fn disk_stall_needs_pending_writes_and_no_progress() {
        let mut d = detector();
        hear_all(&mut d, 0, 100);
        events(&mut d);
        // Idle disk: no writes pending, no fsync for ages: not stalled.
        d.disk_progress(100, A, 0, 5, false);
        hear_all(&mut d, 150, 5000);
        assert!(!d.disk_stalled(A));
        // Writes pending from 5000: the stall clock starts then, not at the
        // last fsync long ago.
        d.disk_progress(5000, A, 0, 5, true);
        assert!(!d.disk_stalled(A));
        // Progress keeps it healthy.
        hear_all(&mut d, 5050, 6500);
        d.disk_progress(6500, A, 0, 6, true);
        hear_all(&mut d, 6550, 8450);
        assert!(!d.disk_stalled(A));
        hear_all(&mut d, 8500, 8500);
        assert!(d.disk_stalled(A));
        assert_eq!(d.stalled_groups(A).collect::<Vec<_>>(), vec![0]);
        // Resumes: one event each way.
        d.disk_progress(8600, A, 0, 7, false);
        assert!(!d.disk_stalled(A));
        let stalls: Vec<_> = events(&mut d)
            .into_iter()
            .filter(|e| matches!(e, Event::DiskStall { .. }))
            .collect();
        assert_eq!(
            stalls,
            vec![
                Event::DiskStall {
                    peer: A,
                    group: 0,
                    stalled: true,
                    at_ms: 8500
                },
                Event::DiskStall {
                    peer: A,
                    group: 0,
                    stalled: false,
                    at_ms: 8600
                },
            ]
        );
        assert_eq!(d.stats().disk_stalls, 1);
    }

    #[test]
    fn a_silent_peer_is_down_not_disk_stalled() {
        let mut d = detector();
        hear_all(&mut d, 0, 1000);
        // Its last heartbeat had writes pending; then it fell silent.
        d.disk_progress(1000, A, 0, 900, true);
        d.tick(1000 + 10 * d.config().disk_stall_ms);
        assert_eq!(d.status(A), Some(PeerStatus::Down));
        assert!(
            !d.disk_stalled(A),
            "nothing is known of a silent peer's disk"
        );
        let stalls = events(&mut d)
            .into_iter()
            .filter(|e| matches!(e, Event::DiskStall { .. }))
            .count();
        assert_eq!(stalls, 0);
        // And its stall clock is no deadline: a tick at poll_timeout()
        // always moves it (a driver would spin otherwise).
        let now = 1000 + 10 * d.config().disk_stall_ms;
        assert!(
            d.poll_timeout().is_none_or(|t| t > now),
            "{:?}",
            d.poll_timeout()
        );
    }

    #[test]
    fn bounded_inputs_are_counted_not_grown() {
        let mut d = detector();
        d.heard(1, 99, Channel::Udp);
        d.heard(1, B, Channel::Serial);
        d.disk_progress(1, 99, 0, 0, true);
        assert_eq!(d.stats().unknown_inputs, 3);
        for g in 0..GROUPS_MAX as u32 + 2 {
            d.disk_progress(2, A, g, 0, false);
        }
        assert_eq!(d.stats().groups_over_limit, 2);
        assert!(!d.add_peer(3, A, true), "already watched");
        assert!(!d.add_peer(3, 0, true), "node 0 is nobody");
        for id in 10..100 {
            d.add_peer(3, id, true);
        }
        assert_eq!(d.peers().count(), PEERS_MAX);
        // Time never runs backwards, and events are bounded.
        let mut d = Detector::new(
            DetectorConfig {
                events_max: 2,
                ..DetectorConfig::default()
            },
            0,
        )
        .unwrap();
        d.add_peer(0, A, true);
        d.heard(1000, A, Channel::Udp);
        d.heard(10, A, Channel::Serial);
        assert_eq!(
            d.link(A, Channel::Serial).unwrap().last_heard_ms,
            Some(1000)
        );
        assert_eq!(d.stats().events_dropped, 1);
    }

    #[test]
    fn random_inputs_give_one_consistent_chain_of_events_per_link() {
        use rand::{Rng, SeedableRng};
        use std::collections::HashMap;
        for seed in 0..50 {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let mut d = detector();
            let mut last: HashMap<(NodeId, Channel), LinkState> = HashMap::new();
            let mut status: HashMap<NodeId, PeerStatus> = HashMap::new();
            let mut now = 0;
            for _ in 0..2000 {
                now += rng.gen_range(0..120);
                match rng.gen_range(0..4) {
                    0 => d.heard(now, A, Channel::Udp),
                    1 => d.heard(now, A, Channel::Serial),
                    2 => d.heard(now, B, Channel::Udp),
                    _ => d.tick(now),
                }
                while let Some(e) = d.poll_event() {
                    match e {
                        Event::Link {
                            peer,
                            channel,
                            old,
                            new,
                            at_ms,
                        } => {
                            assert_ne!(old, new, "seed {seed}: a non-change reported");
                            assert!(at_ms <= now);
                            let prev = last.insert((peer, channel), new).unwrap_or(LinkState::Init);
                            assert_eq!(prev, old, "seed {seed}: a transition missed or repeated");
                        }
                        Event::Peer { peer, old, new, .. } => {
                            assert_ne!(old, new);
                            let prev = status.insert(peer, new).unwrap_or(PeerStatus::Unknown);
                            assert_eq!(prev, old, "seed {seed}");
                        }
                        Event::DiskStall { .. } => unreachable!("no disk inputs"),
                    }
                }
                for ((peer, channel), state) in &last {
                    assert_eq!(d.link(*peer, *channel).unwrap().state, *state);
                }
                for (peer, s) in &status {
                    assert_eq!(d.status(*peer), Some(*s));
                }
                if let Some(t) = d.poll_timeout() {
                    assert!(t > now, "seed {seed}: a deadline already passed");
                }
            }
        }
    }

    #[test]
    fn views_report_our_side() {
        let mut d = detector();
        d.heard(1, A, Channel::Udp);
        let v: Vec<_> = d.views().collect();
        assert_eq!(
            v,
            vec![
                PeerView {
                    node: A,
                    udp: LinkState::Up,
                    serial: Some(LinkState::Init)
                },
                PeerView {
                    node: B,
                    udp: LinkState::Init,
                    serial: None
                },
            ]
        );
    }
}
