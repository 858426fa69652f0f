//! Two heartbeat endpoints on the emulated null-modem cable (real PTYs,
//! real termios, real time): unplug, replug, noise, a device that vanishes.
//!
//! Each endpoint runs what the node's serial loop will run: open the port
//! (with backoff), send a heartbeat every `keepalive_ms`, read frames, drop
//! replays, feed the detector, tick it at its deadlines. The UDP channel
//! is stood in for by hearing the peer on UDP at every step, so a dead
//! serial link shows as `serial-down`. The loop waits in poll(2) on the
//! ports until the next deadline; assertions poll observable state with a
//! deadline, never sleep.

use std::os::fd::RawFd;
use std::time::Instant;

use quire::consensus::{NodeId, Role};
use quire::heartbeat::{
    encode_frame, Channel, Detector, DetectorConfig, Event, Freshness, GroupStatus, Heartbeat,
    LinkState, PeerStatus, ReplayGuard,
};
use quire::serial::{End, NullModem, PortState, SerialConfig, SerialPort};
use quire::transport::ClusterKey;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Scheduling slack on a shared 2-core machine: how much later than the
/// protocol's bound an observation may come.
const SLACK_MS: u64 = 150;

fn key() -> ClusterKey {
    ClusterKey::derive(b"serial pty test")
}

struct Node {
    id: NodeId,
    peer: NodeId,
    epoch: u64,
    seq: u64,
    port: SerialPort,
    det: Detector,
    guard: ReplayGuard,
    next_send_ms: u64,
    /// Serial heartbeats accepted from the peer (authentic and fresh).
    accepted: u64,
    events: Vec<Event>,
}

impl Node {
    fn new(id: NodeId, peer: NodeId, device: &std::path::Path, now: u64) -> Node {
        let cfg = SerialConfig {
            reopen_backoff_min_ms: 50,
            reopen_backoff_max_ms: 400,
            ..SerialConfig::new(device)
        };
        let mut det = Detector::new(DetectorConfig::default(), now).unwrap();
        assert!(det.add_peer(now, peer, true));
        Node {
            id,
            peer,
            epoch: 0x5eed_0000 + id,
            seq: 0,
            port: SerialPort::new(cfg, key()).unwrap(),
            det,
            guard: ReplayGuard::new(),
            next_send_ms: now,
            accepted: 0,
            events: Vec::new(),
        }
    }

    fn step(&mut self, now: u64) {
        self.port.poll_open(now);
        self.det.heard(now, self.peer, Channel::Udp);
        self.port.receive(now);
        while let Some(r) = self.port.next_frame() {
            let Ok(hb) = r else { continue };
            if hb.node != self.peer || self.guard.check(&hb) == Freshness::Stale {
                continue;
            }
            self.accepted += 1;
            self.det.heard(now, self.peer, Channel::Serial);
            for g in hb.groups() {
                self.det
                    .disk_progress(now, self.peer, g.group, g.last_fsync_ms, g.writes_pending);
            }
        }
        if now >= self.next_send_ms {
            self.seq += 1;
            let mut hb = Heartbeat::new(self.id, self.epoch, self.seq);
            hb.push_group(GroupStatus {
                group: 0,
                role: Role::Leader,
                term: 3,
                leader: self.id,
                commit: self.seq,
                persisted: self.seq,
                last_fsync_ms: now,
                writes_pending: true,
            })
            .unwrap();
            for v in self.det.views() {
                hb.push_peer(v).unwrap();
            }
            let mut frame = Vec::new();
            encode_frame(&key(), &hb, &mut frame).unwrap();
            self.port.send_frame(now, &frame);
            self.next_send_ms = now + self.det.config().keepalive_ms;
        }
        self.port.flush(now);
        self.det.tick(now);
        while let Some(e) = self.det.poll_event() {
            self.events.push(e);
        }
    }

    fn next_deadline(&self) -> u64 {
        let mut t = self.next_send_ms;
        if let Some(d) = self.det.poll_timeout() {
            t = t.min(d);
        }
        if let PortState::Closed { retry_at_ms } = self.port.state() {
            t = t.min(retry_at_ms);
        }
        t
    }

    fn serial(&self) -> LinkState {
        self.det.link(self.peer, Channel::Serial).unwrap().state
    }

    fn status(&self) -> PeerStatus {
        self.det.status(self.peer).unwrap()
    }

    /// Serial link transitions since the last call.
    fn take_serial_events(&mut self) -> Vec<(LinkState, LinkState)> {
        let ev = std::mem::take(&mut self.events);
        let serial = ev
            .iter()
            .filter_map(|e| match *e {
                Event::Link {
                    channel: Channel::Serial,
                    old,
                    new,
                    ..
                } => Some((old, new)),
                _ => None,
            })
            .collect();
        self.events = ev
            .into_iter()
            .filter(|e| matches!(e, Event::Peer { .. }))
            .collect();
        serial
    }

    /// Peer classification changes since the last call.
    fn take_peer_events(&mut self) -> Vec<(PeerStatus, PeerStatus)> {
        std::mem::take(&mut self.events)
            .into_iter()
            .filter_map(|e| match e {
                Event::Peer { old, new, .. } => Some((old, new)),
                _ => None,
            })
            .collect()
    }
}

struct Rig {
    cable: NullModem,
    a: Node,
    b: Node,
    start: Instant,
    /// When the endpoints last stepped, and the longest time between two
    /// steps (ms) since `measure_gaps` (the poll's own wait of up to
    /// 10 ms included): a test thread the host did not run for a while
    /// sees a state change that much late, which the bounds forgive.
    last_step_ms: u64,
    longest_gap_ms: u64,
    _dir: tempfile::TempDir,
}

impl Rig {
    /// The rig, or `None` (saying why) where the host has no PTYs.
    fn new() -> Option<Rig> {
        if !std::path::Path::new("/dev/ptmx").exists() {
            eprintln!("skipping: no /dev/ptmx (mount devpts to run the serial tests)");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let cable = NullModem::new(dir.path()).unwrap();
        let a = Node::new(1, 2, cable.path(End::A), 0);
        let b = Node::new(2, 1, cable.path(End::B), 0);
        Some(Rig {
            cable,
            a,
            b,
            start: Instant::now(),
            last_step_ms: 0,
            longest_gap_ms: 0,
            _dir: dir,
        })
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Steps both endpoints at `now`, noting the gap since the last step.
    fn step(&mut self, now: u64) {
        self.longest_gap_ms = self.longest_gap_ms.max(now - self.last_step_ms);
        self.last_step_ms = now;
        self.a.step(now);
        self.b.step(now);
    }

    /// Measures the gaps between steps from now on (at the event a bound
    /// is measured from: a hiccup before it does not widen that bound).
    fn measure_gaps(&mut self) {
        self.last_step_ms = self.now();
        self.longest_gap_ms = 0;
    }

    /// How late a state change may be seen: [`SLACK_MS`], plus the longest
    /// time between two steps since `measure_gaps`.
    fn slack_ms(&self) -> u64 {
        SLACK_MS + self.longest_gap_ms
    }

    /// Runs both endpoints until `done` holds (returns the time it was
    /// first seen) or `budget_ms` passes (panics with `what`).
    fn run_until(&mut self, budget_ms: u64, what: &str, done: impl Fn(&Rig) -> bool) -> u64 {
        let deadline = self.now() + budget_ms;
        loop {
            let now = self.now();
            self.step(now);
            if done(self) {
                return now;
            }
            assert!(
                now < deadline,
                "{what}: not reached within {budget_ms} ms; a: serial {:?} {:?} port {:?} {:?}; b: serial {:?} {:?} port {:?} {:?}",
                self.a.serial(),
                self.a.status(),
                self.a.port.stats(),
                self.a.port.decoder_stats(),
                self.b.serial(),
                self.b.status(),
                self.b.port.stats(),
                self.b.port.decoder_stats(),
            );
            self.wait(now);
        }
    }

    /// Runs both endpoints for `ms`, calling `each` at every step.
    fn run_for(&mut self, ms: u64, mut each: impl FnMut(&mut Rig, u64)) {
        let end = self.now() + ms;
        loop {
            let now = self.now();
            if now >= end {
                return;
            }
            self.step(now);
            each(self, now);
            self.wait(now);
        }
    }

    /// Waits in poll(2) for input on either port, at most until the next
    /// deadline of either endpoint (and at most 10 ms).
    fn wait(&self, now: u64) {
        let next = self.a.next_deadline().min(self.b.next_deadline());
        let timeout = next.saturating_sub(now).clamp(1, 10) as i32;
        let mut fds: Vec<libc::pollfd> = [self.a.port.raw_fd(), self.b.port.raw_fd()]
            .into_iter()
            .flatten()
            .map(|fd: RawFd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
    }

    fn both_up(&mut self) -> u64 {
        let t = self.run_until(3000, "both serial links up", |r| {
            r.a.serial() == LinkState::Up
                && r.b.serial() == LinkState::Up
                && r.a.status() == PeerStatus::Up
                && r.b.status() == PeerStatus::Up
        });
        self.a.events.clear();
        self.b.events.clear();
        t
    }
}

#[test]
fn heartbeats_cross_the_cable_both_ways() {
    let Some(mut rig) = Rig::new() else { return };
    rig.both_up();
    let before = (rig.a.accepted, rig.b.accepted);
    rig.run_for(500, |_, _| {});
    // About 10 heartbeats each way in 500 ms at keepalive 50 ms.
    assert!(rig.a.accepted - before.0 >= 5, "{:?}", rig.a.port.stats());
    assert!(rig.b.accepted - before.1 >= 5, "{:?}", rig.b.port.stats());
    assert_eq!(rig.a.port.decoder_stats().errors(), 0);
    assert_eq!(rig.b.port.decoder_stats().errors(), 0);
    assert!(
        !rig.a.det.disk_stalled(2),
        "fsyncs progress every heartbeat"
    );
}

#[test]
fn unplug_declares_serial_dead_within_deadtime_and_replug_brings_it_back() {
    let Some(mut rig) = Rig::new() else { return };
    rig.both_up();
    let deadtime = DetectorConfig::default().deadtime_ms;
    let keepalive = DetectorConfig::default().keepalive_ms;

    let unplugged = rig.now();
    rig.measure_gaps();
    rig.cable.unplug();
    let dead = rig.run_until(deadtime + 1000, "serial dead on both sides", |r| {
        r.a.serial() == LinkState::Dead && r.b.serial() == LinkState::Dead
    });
    assert!(
        dead - unplugged <= deadtime + rig.slack_ms(),
        "serial declared dead {} ms after the unplug (deadtime {deadtime})",
        dead - unplugged
    );
    let slack = rig.slack_ms();
    for n in [&mut rig.a, &mut rig.b] {
        let since = n
            .det
            .link(n.peer, Channel::Serial)
            .unwrap()
            .dead_since_ms()
            .unwrap();
        assert!(
            since + keepalive + slack >= unplugged + deadtime,
            "dead too early"
        );
        assert_eq!(n.status(), PeerStatus::SerialDown);
        assert!(n.det.any_link_dead(), "alarm line up");
        assert_eq!(
            n.take_serial_events(),
            vec![
                (LinkState::Up, LinkState::Late),
                (LinkState::Late, LinkState::Dead)
            ],
            "node {}",
            n.id
        );
        assert_eq!(
            n.take_peer_events(),
            vec![(PeerStatus::Up, PeerStatus::SerialDown)]
        );
    }

    let replugged = rig.now();
    rig.measure_gaps();
    rig.cable.replug();
    let up = rig.run_until(1000, "serial up again on both sides", |r| {
        r.a.serial() == LinkState::Up && r.b.serial() == LinkState::Up
    });
    assert!(
        up - replugged <= keepalive + rig.slack_ms(),
        "up {} ms after replug",
        up - replugged
    );
    eprintln!(
        "serial dead {} ms after unplug (deadtime {deadtime}), up {} ms after replug",
        dead - unplugged,
        up - replugged
    );
    for n in [&mut rig.a, &mut rig.b] {
        assert_eq!(n.status(), PeerStatus::Up);
        assert_eq!(
            n.take_serial_events(),
            vec![(LinkState::Dead, LinkState::Up)]
        );
        assert_eq!(
            n.take_peer_events(),
            vec![(PeerStatus::SerialDown, PeerStatus::Up)]
        );
        assert!(!n.det.any_link_dead());
    }
    assert!(rig.cable.stats().bytes_dropped_unplugged > 0);
}

#[test]
fn garbage_is_counted_resynced_and_never_makes_a_link_up() {
    let Some(mut rig) = Rig::new() else { return };
    rig.both_up();
    let mut rng = ChaCha8Rng::seed_from_u64(5);

    // Noise on a working line: frames keep arriving, errors are counted.
    let accepted = (rig.a.accepted, rig.b.accepted);
    let mut next_noise = 0;
    rig.run_for(1000, |r, now| {
        if now >= next_noise {
            next_noise = now + 20;
            let mut noise = vec![0u8; rng.gen_range(1..600)];
            rng.fill_bytes(&mut noise);
            r.cable.inject_garbage(End::A, &noise);
            rng.fill_bytes(&mut noise);
            r.cable.inject_garbage(End::B, &noise);
        }
    });
    for (n, before) in [(&mut rig.a, accepted.0), (&mut rig.b, accepted.1)] {
        let d = *n.port.decoder_stats();
        assert!(d.errors() >= 10, "node {}: {d:?}", n.id);
        assert!(
            n.accepted - before >= 10,
            "node {}: heartbeats lost to noise",
            n.id
        );
        assert!(
            !n.take_serial_events()
                .iter()
                .any(|&(_, new)| new == LinkState::Dead),
            "node {}: noise killed the link",
            n.id
        );
    }

    // Cut the cable; then feed each end noise, truncated frames, frames
    // under another key, and recordings of the peer's own earlier frames.
    rig.cable.unplug();
    rig.run_until(2000, "serial dead after unplug", |r| {
        r.a.serial() == LinkState::Dead && r.b.serial() == LinkState::Dead
    });
    rig.a.events.clear();
    rig.b.events.clear();
    let accepted = (rig.a.accepted, rig.b.accepted);
    let errors = (
        rig.a.port.decoder_stats().errors(),
        rig.b.port.decoder_stats().errors(),
    );
    let frames = |k: &ClusterKey, node: NodeId, epoch: u64, seq: u64| {
        let mut f = Vec::new();
        encode_frame(k, &Heartbeat::new(node, epoch, seq), &mut f).unwrap();
        f
    };
    let wrong = ClusterKey::derive(b"another cluster");
    let (ea, eb) = (rig.a.epoch, rig.b.epoch);
    let mut round = 0u64;
    let mut next = 0;
    rig.run_for(3 * DetectorConfig::default().deadtime_ms, |r, now| {
        if now < next {
            return;
        }
        next = now + 10;
        round += 1;
        for (end, from, epoch) in [(End::A, 2, eb), (End::B, 1, ea)] {
            let bytes = match round % 4 {
                0 => {
                    let mut v = vec![0u8; rng.gen_range(1..300)];
                    rng.fill_bytes(&mut v);
                    v
                }
                1 => {
                    let f = frames(&key(), from, epoch, 1_000_000 + round);
                    let mut cut = f[..rng.gen_range(1..f.len() - 1)].to_vec();
                    cut.push(0);
                    cut
                }
                2 => frames(&wrong, from, epoch, 1_000_000 + round),
                // A recording: authentic, but an old sequence number.
                _ => frames(&key(), from, epoch, 1),
            };
            r.cable.inject_garbage(end, &bytes);
        }
    });
    for (n, acc, err) in [
        (&mut rig.a, accepted.0, errors.0),
        (&mut rig.b, accepted.1, errors.1),
    ] {
        assert_eq!(
            n.accepted, acc,
            "node {}: accepted a frame from a cut cable",
            n.id
        );
        assert_eq!(n.serial(), LinkState::Dead);
        assert_eq!(n.status(), PeerStatus::SerialDown);
        assert!(
            n.take_serial_events().is_empty(),
            "node {}: a false transition",
            n.id
        );
        let d = *n.port.decoder_stats();
        assert!(
            d.errors() - err >= 20 && d.bad_mac >= 5,
            "node {}: {d:?}",
            n.id
        );
        assert!(
            n.guard.stale_dropped >= 5,
            "node {}: replays not dropped",
            n.id
        );
    }

    // And the decoder is not wedged: replugged, the link comes back.
    rig.cable.replug();
    rig.run_until(1000, "serial up after the noise", |r| {
        r.a.serial() == LinkState::Up && r.b.serial() == LinkState::Up
    });
}

#[test]
fn a_vanished_device_is_reopened_with_backoff() {
    let Some(mut rig) = Rig::new() else { return };
    rig.both_up();
    rig.cable.vanish(End::A);
    rig.run_until(2000, "port A closed and serial dead on both sides", |r| {
        matches!(r.a.port.state(), PortState::Closed { .. })
            && r.a.serial() == LinkState::Dead
            && r.b.serial() == LinkState::Dead
    });
    assert_eq!(
        rig.a.port.stats().device_lost,
        1,
        "{:?}",
        rig.a.port.last_error()
    );
    // Keep it gone long enough for several reopen attempts (50, 100, 200,
    // 400, 400 ms apart): they fail, spaced out, and never panic.
    rig.run_for(1200, |_, _| {});
    let failures = rig.a.port.stats().open_failures;
    assert!((3..=8).contains(&failures), "open failures {failures}");
    assert_eq!(rig.b.status(), PeerStatus::SerialDown);

    rig.cable.reappear(End::A).unwrap();
    rig.run_until(2000, "port A reopened and serial up on both sides", |r| {
        r.a.port.state() == PortState::Open
            && r.a.serial() == LinkState::Up
            && r.b.serial() == LinkState::Up
    });
    assert_eq!(rig.a.port.stats().opens, 2);
    assert_eq!(rig.b.port.stats().opens, 1, "B's end never went away");
}
