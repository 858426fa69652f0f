//! [`UdpDriver`]: runs one transport [`Endpoint`] over the UDP sockets of
//! the groups its thread owns, with a blocking `run_once` loop.

use super::config::{PeerMap, UdpConfig};
use super::rx::RxBatch;
use super::socket;
use super::stats::NetStats;
use super::tx::{Flushed, Gso, TxQueue};
use super::xdp::{XdpPort, XdpSend, XdpStats, RX_BATCH_FRAMES_MAX};
use crate::consensus::NodeId;
use crate::transport::{Endpoint, GroupId, Transmit};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

/// Notices kept until [`UdpDriver::take_notices`]; later ones are counted
/// in the last notice instead of growing the list.
const NOTICES_MAX: usize = 64;
/// Rejected datagrams described in notices; later ones are only counted.
const REJECTS_NOTICED_MAX: u64 = 16;
/// Datagrams taken from the endpoint (and MACed side by side) at a time.
const TX_BATCH_MAX: usize = 64;
/// How soon a full AF_XDP tx ring is looked at again, µs.
const XDP_FULL_RECHECK_US: u64 = 100;
/// How long the kernel may take no frame from a non-empty AF_XDP tx ring
/// before the loop gives the path up for its sockets, µs: far above any
/// healthy pause (a ring drains in well under a millisecond), well below
/// the failure detector's deadtime.
const XDP_TX_STALL_US: u64 = 100_000;

/// Kicks in a row the kernel must also have answered by taking nothing
/// from a non-empty tx ring before the path is given up: time alone would
/// also count a stretch the host did not run this loop at all (one flush
/// before it, one after), which says nothing of the ring.
const XDP_TX_STALL_KICKS: u32 = 5;

/// Whether an offload is in use, and if not, why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Offload {
    /// In use.
    On,
    /// Not in use, for this reason.
    Off(String),
}

impl Offload {
    /// True if in use.
    pub fn is_on(&self) -> bool {
        *self == Offload::On
    }
}

impl std::fmt::Display for Offload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Offload::On => write!(f, "on"),
            Offload::Off(why) => write!(f, "off ({why})"),
        }
    }
}

/// What [`UdpDriver::bind`] set up, for the log: one line per fact.
#[derive(Clone, Debug)]
pub struct BindReport {
    /// The socket of each group and the address it is bound to.
    pub sockets: Vec<(GroupId, SocketAddr)>,
    /// Smallest receive buffer the kernel granted, bytes.
    pub recv_buffer_bytes: usize,
    /// Smallest send buffer the kernel granted, bytes.
    pub send_buffer_bytes: usize,
    /// UDP GSO.
    pub gso: Offload,
    /// UDP GRO.
    pub gro: Offload,
    /// Things asked for and not granted (buffer sizes capped by the
    /// kernel), each saying what to change.
    pub warnings: Vec<String>,
}

impl std::fmt::Display for BindReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (g, a) in &self.sockets {
            writeln!(f, "group {g}: udp socket bound on {a}")?;
        }
        writeln!(
            f,
            "socket buffers: receive {} bytes, send {} bytes",
            self.recv_buffer_bytes, self.send_buffer_bytes
        )?;
        writeln!(f, "UDP GSO: {}", self.gso)?;
        writeln!(f, "UDP GRO: {}", self.gro)?;
        for w in &self.warnings {
            writeln!(f, "warning: {w}")?;
        }
        Ok(())
    }
}

struct GroupSocket {
    group: GroupId,
    socket: UdpSocket,
    local: SocketAddr,
    tx: TxQueue,
}

impl GroupSocket {
    fn fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

/// Runs an [`Endpoint`] over one UDP socket per group (`base_port +
/// group`). Only the thread that owns it touches it; it never spawns.
///
/// The loop: [`UdpDriver::run_once`] waits for a datagram, the endpoint's
/// next deadline, or room in a full socket buffer; feeds datagrams in;
/// fires timers; hands what the endpoint wants to send to the kernel.
/// Between calls the caller drains [`Endpoint::poll_event`] through
/// [`UdpDriver::endpoint_mut`] (while undrained events exceed
/// `events_bytes_max` the endpoint refuses new data) and sends with
/// [`Endpoint::send`], then calls [`UdpDriver::flush`] or `run_once`.
pub struct UdpDriver {
    cfg: UdpConfig,
    endpoint: Endpoint,
    peers: PeerMap,
    sockets: Vec<GroupSocket>,
    by_group: BTreeMap<GroupId, usize>,
    rx: RxBatch,
    scratch: Vec<u8>,
    /// Each datagram's destination and size, for `push_batch_whole`.
    batch_dests: Vec<(SocketAddr, usize)>,
    clock: Instant,
    gso: Gso,
    gro: Offload,
    stats: NetStats,
    rejects_noticed: u64,
    notices: Vec<String>,
    notices_dropped: u64,
    unroutable_noticed: BTreeSet<(NodeId, Option<GroupId>)>,
    pollfds: Vec<libc::pollfd>,
    /// Other descriptors whose readability ends a wait (the caller's
    /// wake-up eventfd, serial ports); the caller reads them.
    wake_fds: Vec<std::os::fd::RawFd>,
    /// Where the wake descriptors start in `pollfds` (as of the last wait).
    wake_fds_at: usize,
    /// Scratch: sockets with datagrams waiting.
    ready: Vec<usize>,
    /// Scratch: (receive time, slot) of the messages of a round.
    order: Vec<(u64, usize)>,
    /// A `flush` is running: a nested one (from receiving between its
    /// batches) leaves the sending to it.
    flushing: bool,
    /// Scratch: where the datagrams of a batch in `scratch` go.
    transmits: Vec<Transmit>,
    /// Scratch: the datagrams of a receive round, as (slot, offset, len)
    /// in the receive batch.
    rx_datagrams: Vec<(usize, usize, usize)>,
    /// The AF_XDP path, if attached: datagrams go out and come in through
    /// its rings; the sockets carry the rest (see `net::xdp`).
    xdp: Option<XdpPort>,
    /// The tx ring was full at the last flush: wait for completions.
    xdp_blocked: bool,
    /// The tx ring's consumer index last seen to move, and when (µs).
    xdp_tx_seen: (u32, u64),
    /// Kicks since the tx ring last moved (or was empty).
    xdp_kicks_unanswered: u32,
    /// Why the AF_XDP path was given up at run time, if it was.
    xdp_lost: Option<String>,
}

impl UdpDriver {
    /// Opens a socket for every group of `cfg` on `bind_ip`, port
    /// `base_port + group` (or a free port each if `base_port` is 0), and
    /// wraps `endpoint`. Fails if a socket cannot be bound; a buffer size
    /// the kernel caps, or an offload it refuses, is only reported.
    pub fn bind(
        cfg: UdpConfig,
        endpoint: Endpoint,
        peers: PeerMap,
    ) -> io::Result<(UdpDriver, BindReport)> {
        cfg.validate()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("udp config: {e}")))?;
        let mut sockets = Vec::new();
        let mut by_group = BTreeMap::new();
        let mut warnings = Vec::new();
        let (mut rcv, mut snd) = (usize::MAX, usize::MAX);
        let mut gso_off: Option<String> = None;
        let mut gro_off: Option<String> = None;
        for &group in &cfg.groups {
            let port = if cfg.base_port == 0 {
                0
            } else {
                cfg.base_port + group as u16
            };
            let addr = SocketAddr::new(cfg.bind_ip, port);
            let o = socket::open(addr, &cfg, cfg.groups.len() > 1)
                .map_err(|e| io::Error::new(e.kind(), format!("group {group}: {e}")))?;
            rcv = rcv.min(o.recv_buffer_bytes);
            snd = snd.min(o.send_buffer_bytes);
            // The same sizes are asked of every socket: report each cap once.
            for w in o.warnings {
                if !warnings.contains(&w) {
                    warnings.push(w);
                }
            }
            if let Err(why) = o.gso {
                gso_off.get_or_insert(why.to_string());
            }
            if let Err(why) = o.gro {
                gro_off.get_or_insert(why.to_string());
            }
            let local = o.socket.local_addr()?;
            by_group.insert(group, sockets.len());
            sockets.push(GroupSocket {
                group,
                socket: o.socket,
                local,
                tx: TxQueue::default(),
            });
        }
        let gso = Gso {
            segments_max: if gso_off.is_some() {
                1
            } else {
                cfg.gso_segments_max
            },
            off_reason: gso_off,
        };
        let gro = gro_off.map_or(Offload::On, Offload::Off);
        let report = BindReport {
            sockets: sockets.iter().map(|s| (s.group, s.local)).collect(),
            recv_buffer_bytes: rcv,
            send_buffer_bytes: snd,
            gso: gso.off_reason.clone().map_or(Offload::On, Offload::Off),
            gro: gro.clone(),
            warnings,
        };
        let stats = NetStats {
            gso_enabled: gso.segments_max > 1,
            gro_enabled: gro.is_on(),
            ..Default::default()
        };
        let driver = UdpDriver {
            rx: RxBatch::new(cfg.recv_batch_max),
            cfg,
            endpoint,
            peers,
            sockets,
            by_group,
            scratch: Vec::with_capacity(TX_BATCH_MAX * super::config::UDP_PAYLOAD_BYTES_MAX / 16),
            batch_dests: Vec::new(),
            clock: Instant::now(),
            gso,
            gro,
            stats,
            rejects_noticed: 0,
            notices: Vec::new(),
            notices_dropped: 0,
            unroutable_noticed: BTreeSet::new(),
            pollfds: Vec::new(),
            wake_fds: Vec::new(),
            wake_fds_at: 0,
            ready: Vec::new(),
            order: Vec::new(),
            flushing: false,
            transmits: Vec::new(),
            rx_datagrams: Vec::new(),
            xdp: None,
            xdp_blocked: false,
            xdp_tx_seen: (0, 0),
            xdp_kicks_unanswered: 0,
            xdp_lost: None,
        };
        Ok((driver, report))
    }

    /// Sends and receives the groups' datagrams through `port` (AF_XDP)
    /// from now on; the sockets stay bound and carry what the rings
    /// cannot (a peer whose MAC is not known yet, datagrams the XDP
    /// program passes to the kernel). GSO is off on this path: each
    /// datagram is its own frame.
    pub fn attach_xdp(&mut self, port: XdpPort) {
        self.xdp_tx_seen = (port.tx_progress(), self.now_us());
        self.xdp_kicks_unanswered = 0;
        self.gso.segments_max = 1;
        self.gso.off_reason = Some("the AF_XDP path sends one frame per datagram".into());
        self.xdp = Some(port);
    }

    /// Why the AF_XDP path was given up at run time, if it was.
    pub fn xdp_lost(&self) -> Option<&str> {
        self.xdp_lost.as_deref()
    }

    /// The AF_XDP path's description and counters, if attached.
    pub fn xdp(&self) -> Option<(String, XdpStats)> {
        self.xdp.as_ref().map(|x| (x.describe(), x.stats()))
    }

    /// Reads the AF_XDP socket's kernel drop counters into its stats (a
    /// syscall: call it for a status read, not per turn).
    pub fn refresh_xdp_drops(&mut self) {
        if let Some(x) = &mut self.xdp {
            x.refresh_kernel_drops();
        }
    }

    /// The endpoint, to read its stats.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The endpoint, to `send` and `poll_event`. Call [`UdpDriver::flush`]
    /// (or `run_once`) after sending.
    pub fn endpoint_mut(&mut self) -> &mut Endpoint {
        &mut self.endpoint
    }

    /// Where the peers are.
    pub fn peers(&self) -> &PeerMap {
        &self.peers
    }

    /// Where the peers are, to change (a peer moved, or its ports became
    /// known only after it bound).
    pub fn peers_mut(&mut self) -> &mut PeerMap {
        &mut self.peers
    }

    /// The address group `group`'s socket is bound to.
    pub fn local_addr(&self, group: GroupId) -> Option<SocketAddr> {
        self.by_group.get(&group).map(|&i| self.sockets[i].local)
    }

    /// The driver's clock in µs (monotonic, from its creation): the `now`
    /// it passes to the endpoint.
    pub fn now_us(&self) -> u64 {
        self.clock.elapsed().as_micros() as u64
    }

    /// Socket-level counters.
    pub fn stats(&self) -> NetStats {
        NetStats {
            gso_enabled: self.gso.segments_max > 1,
            gro_enabled: self.gro.is_on(),
            ..self.stats
        }
    }

    /// UDP GSO now (it can go off at run time).
    pub fn gso(&self) -> Offload {
        match &self.gso.off_reason {
            None => Offload::On,
            Some(why) => Offload::Off(why.clone()),
        }
    }

    /// UDP GRO.
    pub fn gro(&self) -> Offload {
        self.gro.clone()
    }

    /// Things that happened at run time and deserve a log line: GSO
    /// turned off, send errors, rejected datagrams, peers without an
    /// address. Each kind is described a bounded number of times.
    #[must_use = "the notices are taken: log them"]
    pub fn take_notices(&mut self) -> Vec<String> {
        if self.notices_dropped > 0 {
            self.notices.push(format!(
                "{} more notices were dropped (more than {NOTICES_MAX} between two take_notices)",
                self.notices_dropped
            ));
            self.notices_dropped = 0;
        }
        std::mem::take(&mut self.notices)
    }

    fn notice(&mut self, text: String) {
        if self.notices.len() < NOTICES_MAX {
            self.notices.push(text);
        } else {
            self.notices_dropped += 1;
        }
    }

    /// One turn of the loop: waits at most `max_wait` (less if the
    /// endpoint has a deadline sooner) for a datagram or for room in a
    /// full socket buffer, receives what is there, fires due timers and
    /// sends what the endpoint has. Then drain `poll_event`. An error is
    /// returned only if waiting itself fails; send and receive errors are
    /// counted and noticed.
    pub fn run_once(&mut self, max_wait: Duration) -> io::Result<()> {
        self.flush();
        let now = self.now_us();
        let max_wait_us = max_wait.as_micros().min(u64::MAX as u128) as u64;
        let wait_us = match self.endpoint.poll_timeout() {
            Some(t) => t.saturating_sub(now).min(max_wait_us),
            None => max_wait_us,
        };
        self.wait(wait_us)?;
        self.receive_ready();
        self.fire_timers();
        self.flush();
        Ok(())
    }

    /// Descriptors that also end `run_once`'s wait when readable (after the
    /// sockets in the poll set; the caller reads or drains them).
    pub fn set_wake_fds(&mut self, fds: &[std::os::fd::RawFd]) {
        self.wake_fds.clear();
        self.wake_fds.extend_from_slice(fds);
    }

    /// True if the last wait found `fd`, one of the wake descriptors,
    /// readable (or hung up). They are level-triggered: one not read now
    /// is reported again by the next wait, so the caller reads only
    /// those reported, not every descriptor every turn.
    pub fn wake_fd_ready(&self, fd: std::os::fd::RawFd) -> bool {
        self.pollfds
            .get(self.wake_fds_at..)
            .is_some_and(|w| w.iter().any(|p| p.fd == fd && p.revents != 0))
    }

    /// Blocks in ppoll (µs precision; poll's ms would make a 100 µs NACK
    /// delay 1 ms) until a socket is readable, a blocked one writable,
    /// a wake descriptor readable, or `wait_us` passed.
    fn wait(&mut self, wait_us: u64) -> io::Result<()> {
        self.pollfds.clear();
        for s in &self.sockets {
            let mut events = libc::POLLIN;
            // On the AF_XDP path a socket's queue waits for the tx ring,
            // not for the socket: POLLOUT would spin.
            if !s.tx.is_empty() && self.xdp.is_none() {
                events |= libc::POLLOUT;
            }
            self.pollfds.push(libc::pollfd {
                fd: s.fd(),
                events,
                revents: 0,
            });
        }
        if let Some(x) = &self.xdp {
            self.pollfds.push(libc::pollfd {
                fd: x.fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        self.wake_fds_at = self.pollfds.len();
        for &fd in &self.wake_fds {
            self.pollfds.push(libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
        }
        // A full tx ring frees as the kernel completes frames, which
        // raises no poll event: look again soon.
        let wait_us = if self.xdp_blocked {
            wait_us.min(XDP_FULL_RECHECK_US)
        } else {
            wait_us
        };
        let ts = libc::timespec {
            tv_sec: (wait_us / 1_000_000) as libc::time_t,
            tv_nsec: ((wait_us % 1_000_000) * 1000) as libc::c_long,
        };
        // SAFETY: pollfds is a valid array of its length; ts outlives the call.
        let r = unsafe {
            libc::ppoll(
                self.pollfds.as_mut_ptr(),
                self.pollfds.len() as libc::nfds_t,
                &ts,
                std::ptr::null(),
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                for p in &mut self.pollfds {
                    p.revents = 0;
                }
                return Ok(());
            }
            return Err(io::Error::new(
                e.kind(),
                format!("ppoll on the group sockets: {e}"),
            ));
        }
        Ok(())
    }

    fn fire_timers(&mut self) {
        let now = self.now_us();
        if self.endpoint.poll_timeout().is_some_and(|t| t <= now) {
            self.endpoint.handle_timeout(now);
        }
    }

    /// Receives from the sockets `ppoll` found readable until each is
    /// empty or the per-run budget is spent, and sends what that causes
    /// (acks, retransmissions) after each round. In a round every ready
    /// socket gets an equal share of the message slots, and the messages
    /// are handed to the endpoint in kernel receive order (see the `rx`
    /// module: a channel's frames may arrive on several sockets).
    fn receive_ready(&mut self) {
        let xdp_ready = self.xdp.is_some()
            && self
                .pollfds
                .get(self.sockets.len())
                .is_some_and(|p| p.revents & (libc::POLLIN | libc::POLLERR) != 0);
        if xdp_ready {
            self.receive_xdp();
        }
        let mut ready = std::mem::take(&mut self.ready);
        ready.clear();
        ready.extend(
            (0..self.sockets.len())
                .filter(|&i| self.pollfds[i].revents & (libc::POLLIN | libc::POLLERR) != 0),
        );
        let mut order = std::mem::take(&mut self.order);
        let slots = self.rx.capacity();
        let mut budget = self.cfg.recv_datagrams_per_run_max;
        while budget > 0 && !ready.is_empty() {
            // More ready sockets than slots: the first ones this round.
            let turn = ready.len().min(slots);
            let share = slots / turn;
            order.clear();
            let mut k = 0;
            for j in 0..turn {
                let i = ready[k];
                let range = j * share..(j + 1) * share;
                let n = match self
                    .rx
                    .recv(self.sockets[i].fd(), range.clone(), &mut self.stats)
                {
                    Ok(n) => n,
                    Err(e) => {
                        self.stats.recv_errors += 1;
                        let g = self.sockets[i].group;
                        self.notice(format!("group {g}: recvmmsg failed: {e}"));
                        0
                    }
                };
                for slot in range.start..range.start + n {
                    order.push((self.rx.message(slot).stamp_ns, slot));
                }
                if n == share {
                    k += 1; // full: more may be waiting
                } else {
                    ready.remove(k);
                }
            }
            // Sockets that got no turn go first next round.
            let rot = k.min(ready.len());
            ready.rotate_left(rot);
            if turn > 1 {
                order.sort_unstable();
            }
            let now = self.now_us();
            self.deliver(now, &order, &mut budget);
            self.fire_timers();
            self.flush();
        }
        self.ready = ready;
        self.order = order;
    }

    /// Reads the AF_XDP rx ring until it is empty or the per-run budget
    /// is spent, feeding each batch to the endpoint (in ring order, which
    /// is arrival order) and sending what that causes.
    fn receive_xdp(&mut self) {
        let mut budget = self.cfg.recv_datagrams_per_run_max;
        while budget > 0 {
            let Some(mut x) = self.xdp.take() else { return };
            // The loop's own ports, read in place (no list built per batch).
            let sockets = &self.sockets;
            let is_ours = |p: u16| sockets.iter().any(|s| s.local.port() == p);
            let now = self.now_us();
            // Described only while notices are left: a flood of garbage
            // costs a count, not a formatted string per frame.
            let describe =
                std::cell::Cell::new(REJECTS_NOTICED_MAX.saturating_sub(self.rejects_noticed));
            let texts = std::cell::RefCell::new(Vec::<String>::new());
            let note = |text: &dyn Fn() -> String| {
                if describe.get() > 0 {
                    describe.set(describe.get() - 1);
                    texts.borrow_mut().push(text());
                }
            };
            let mut refused = 0u64;
            let (endpoint, stats) = (&mut self.endpoint, &mut self.stats);
            let n = x.receive(
                RX_BATCH_FRAMES_MAX.min(budget),
                &is_ours,
                &mut |got| {
                    let datagrams: Vec<&[u8]> = got.iter().map(|d| d.1).collect();
                    for d in &datagrams {
                        stats.datagrams_received += 1;
                        stats.bytes_received += d.len() as u64;
                    }
                    endpoint.handle_datagrams(now, &datagrams, |i, why| {
                        refused += 1;
                        note(&|| format!("datagram from {} dropped: {why}", got[i].0));
                    });
                },
                &mut |why| note(&|| why.to_string()),
            );
            self.xdp = Some(x);
            self.stats.endpoint_rejected += refused;
            for text in texts.into_inner() {
                self.rejects_noticed += 1;
                self.notice(text);
            }
            if n == 0 {
                return;
            }
            budget = budget.saturating_sub(n);
            self.fire_timers();
            self.flush();
        }
    }

    /// Receives what is waiting on any socket, without blocking; what it
    /// causes to send goes out with the rest of the running flush.
    fn receive_between_batches(&mut self) {
        if self.wait(0).is_ok() {
            self.receive_ready();
        }
    }

    /// Feeds every datagram of the messages in `order`'s slots to the
    /// endpoint, in that order, as one batch (their MACs side by side).
    fn deliver(&mut self, now: u64, order: &[(u64, usize)], budget: &mut usize) {
        let mut rx_datagrams = std::mem::take(&mut self.rx_datagrams);
        rx_datagrams.clear();
        for &(_, slot) in order {
            self.rx
                .datagram_ranges(slot, |off, len| rx_datagrams.push((slot, off, len)));
        }
        for &(_, _, len) in &rx_datagrams {
            self.stats.datagrams_received += 1;
            self.stats.bytes_received += len as u64;
        }
        *budget = budget.saturating_sub(rx_datagrams.len());
        let datagrams: Vec<&[u8]> = rx_datagrams
            .iter()
            .map(|&(slot, off, len)| self.rx.bytes(slot, off, len))
            .collect();
        let mut rejected = Vec::new();
        self.endpoint.handle_datagrams(now, &datagrams, |i, why| {
            rejected.push((rx_datagrams[i].0, why))
        });
        drop(datagrams);
        self.stats.endpoint_rejected += rejected.len() as u64;
        for (slot, why) in rejected {
            if self.rejects_noticed < REJECTS_NOTICED_MAX {
                self.rejects_noticed += 1;
                let from = self
                    .rx
                    .message(slot)
                    .from
                    .map_or("an unknown address".into(), |a| a.to_string());
                self.notice(format!("datagram from {from} dropped: {why}"));
            }
        }
        self.rx_datagrams = rx_datagrams;
    }

    /// Where a transmit goes: the socket to send from and the address.
    fn route(&self, t: &Transmit) -> (usize, Option<SocketAddr>) {
        match t.group {
            Some(g) => {
                // A group this thread has no socket for: any socket will
                // do, the receiver reads the group from the frame.
                let s = self.by_group.get(&g).copied().unwrap_or(0);
                (s, self.peers.addr(t.peer, g))
            }
            None => (0, self.peers.any_addr(t.peer, self.sockets[0].group)),
        }
    }

    /// Hands the batch in `scratch` to its socket's queue without copying
    /// it, if every datagram in it goes to one socket and has an address;
    /// false (nothing done) otherwise.
    fn push_batch_whole(&mut self, transmits: &[Transmit]) -> bool {
        let mut socket = None;
        let mut dests = std::mem::take(&mut self.batch_dests);
        dests.clear();
        for t in transmits {
            let (s, dest) = self.route(t);
            let Some(dest) = dest.filter(|_| socket.is_none_or(|prev| prev == s)) else {
                self.batch_dests = dests;
                return false;
            };
            socket = Some(s);
            dests.push((dest, t.size_bytes));
        }
        if let Some(s) = socket {
            self.sockets[s]
                .tx
                .push_batch(&mut self.scratch, &dests, self.gso.segments_max);
        }
        self.batch_dests = dests;
        true
    }

    /// Copies each datagram of the batch in `scratch` to its socket's
    /// queue, dropping (and noticing once) those without an address.
    fn push_batch_each(&mut self, transmits: &[Transmit], queued: &mut usize) {
        let mut at = 0;
        for t in transmits {
            let datagram = at..at + t.size_bytes;
            at += t.size_bytes;
            let (s, dest) = self.route(t);
            let Some(dest) = dest else {
                self.stats.unroutable_dropped += 1;
                if self.unroutable_noticed.insert((t.peer, t.group)) {
                    self.notice(format!(
                        "no address for node {} group {:?}: its datagrams are dropped until \
                         the peer map has one",
                        t.peer, t.group
                    ));
                }
                continue;
            };
            self.sockets[s]
                .tx
                .push(dest, &self.scratch[datagram], self.gso.segments_max);
            *queued += 1;
        }
    }

    /// Sends everything the endpoint has to send, in batches, until it has
    /// nothing more or a socket buffer is full (then `run_once` waits for
    /// room before taking more from the endpoint). After every
    /// `flush_recv_every_datagrams` sent it takes what has arrived, without
    /// waiting: a sender with a whole window queued would otherwise read a
    /// NACK only after sending all of it (4 MiB, some 8 ms of MACs and
    /// syscalls), while the gap holds the receiver's window closed.
    pub fn flush(&mut self) {
        if self.flushing {
            return;
        }
        self.flushing = true;
        self.flush_batches();
        self.flushing = false;
    }

    fn flush_batches(&mut self) {
        if self.flush_queues() == Flushed::Blocked {
            return;
        }
        let mut now = self.now_us();
        let mut queued = 0;
        let mut since_recv = 0;
        let mut transmits = std::mem::take(&mut self.transmits);
        loop {
            // A batch at a time, sealed together (its MACs side by side).
            let want = (self.cfg.send_batch_datagrams_max - queued).min(TX_BATCH_MAX);
            let got = self
                .endpoint
                .poll_transmits(now, want, &mut self.scratch, &mut transmits);
            if self.push_batch_whole(&transmits) {
                queued += got;
            } else {
                self.push_batch_each(&transmits, &mut queued);
            }
            if got < want {
                break;
            }
            if queued >= self.cfg.send_batch_datagrams_max {
                since_recv += queued;
                queued = 0;
                if self.flush_queues() == Flushed::Blocked {
                    self.transmits = transmits;
                    return;
                }
                let every = self.cfg.flush_recv_every_datagrams;
                if every > 0 && since_recv >= every {
                    since_recv = 0;
                    self.receive_between_batches();
                }
                now = self.now_us();
            }
        }
        self.transmits = transmits;
        let _ = self.flush_queues();
    }

    /// Hands every socket's queue to the kernel.
    fn flush_queues(&mut self) -> Flushed {
        if self.xdp.is_some() {
            return self.flush_queues_xdp();
        }
        let mut result = Flushed::All;
        let mut notices = Vec::new();
        for s in &mut self.sockets {
            if s.tx.is_empty() {
                continue;
            }
            if s.tx.flush(
                s.socket.as_raw_fd(),
                &mut self.gso,
                &mut self.stats,
                &mut notices,
            ) == Flushed::Blocked
            {
                result = Flushed::Blocked;
            }
        }
        for n in notices {
            self.notice(n);
        }
        result
    }

    /// Hands every socket's queue to the AF_XDP tx ring (a datagram to a
    /// peer without a known MAC goes through its kernel socket), then
    /// starts transmission.
    fn flush_queues_xdp(&mut self) -> Flushed {
        let Some(mut x) = self.xdp.take() else {
            return Flushed::All;
        };
        let now_ms = self.now_us() / 1000;
        let mut result = Flushed::All;
        let mut notices = Vec::new();
        let mut queued = false;
        for s in &mut self.sockets {
            if s.tx.is_empty() {
                continue;
            }
            let (fd, port) = (s.socket.as_raw_fd(), s.local.port());
            let stats = &mut self.stats;
            let r =
                s.tx.drain_each(|dest, bytes| match x.send(port, dest, bytes, now_ms) {
                    XdpSend::Queued => {
                        stats.datagrams_sent += 1;
                        stats.bytes_sent += bytes.len() as u64;
                        queued = true;
                        true
                    }
                    XdpSend::NoRoute => {
                        match socket::send_one(fd, dest, bytes) {
                            Ok(()) => {
                                stats.datagrams_sent += 1;
                                stats.bytes_sent += bytes.len() as u64;
                            }
                            Err(e) => {
                                // Dropped: the protocol retransmits.
                                stats.send_errors += 1;
                                if stats.send_errors_noticed < REJECTS_NOTICED_MAX {
                                    stats.send_errors_noticed += 1;
                                    notices.push(format!(
                                        "send to {dest} through the kernel failed, dropped: {e}"
                                    ));
                                }
                            }
                        }
                        true
                    }
                    XdpSend::Full => false,
                });
            if r == Flushed::Blocked {
                result = Flushed::Blocked;
                break;
            }
        }
        let mut kick_error = None;
        let mut kicked = false;
        if queued || result == Flushed::Blocked || x.tx_pending() > 0 {
            kicked = true;
            if let Err(e) = x.kick() {
                kick_error = Some(e);
            }
        }
        // Frames left on the ring go with a kick soon, not with the next
        // datagram (which may not come).
        let pending = x.tx_pending();
        self.xdp_blocked = result == Flushed::Blocked || pending > 0;
        if self.xdp_blocked {
            self.stats.send_would_block += 1;
        }
        // A ring the kernel stopped taking from (the interface went down
        // or away, its queues were cut below ours) would hold the loop's
        // datagrams for good: after a while the loop goes back to its
        // sockets, which the kernel routes however the link changed.
        let now_us = self.now_us();
        let progress = x.tx_progress();
        if pending == 0 || progress != self.xdp_tx_seen.0 {
            self.xdp_tx_seen = (progress, now_us);
            self.xdp_kicks_unanswered = 0;
        } else if kicked {
            self.xdp_kicks_unanswered = self.xdp_kicks_unanswered.saturating_add(1);
        }
        let stalled_us = now_us.saturating_sub(self.xdp_tx_seen.1);
        for n in notices {
            self.notice(n);
        }
        if (stalled_us >= XDP_TX_STALL_US && self.xdp_kicks_unanswered >= XDP_TX_STALL_KICKS)
            || kick_error
                .as_ref()
                .is_some_and(|e| e.raw_os_error() == Some(libc::ENXIO))
        {
            let why = match &kick_error {
                Some(e) => format!("its transmit kick failed: {e}"),
                None => format!(
                    "the kernel took none of its {pending} queued frames for {} ms ({} kicks)",
                    stalled_us / 1000,
                    self.xdp_kicks_unanswered
                ),
            };
            let reason = format!(
                "AF_XDP path dropped ({}): {why}; datagrams go through the sockets from now on",
                x.describe()
            );
            self.notice(reason.clone());
            self.xdp_lost = Some(reason);
            self.xdp_blocked = false;
            drop(x);
            return Flushed::All;
        }
        if let Some(e) = kick_error {
            if self.stats.send_errors_noticed < REJECTS_NOTICED_MAX {
                self.stats.send_errors_noticed += 1;
                self.notice(format!("AF_XDP transmit kick failed: {e}"));
            }
        }
        self.xdp = Some(x);
        result
    }

    /// Datagrams waiting for room in a socket buffer.
    pub fn queued_datagrams(&self) -> usize {
        self.sockets.iter().map(|s| s.tx.datagrams()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{ClusterKey, Event, TransportConfig};

    fn driver(node: NodeId, groups: Vec<GroupId>) -> UdpDriver {
        let ep = Endpoint::new(
            TransportConfig::default(),
            ClusterKey::derive(b"driver unit test"),
            node,
            node,
        )
        .unwrap();
        let cfg = UdpConfig {
            bind_ip: "127.0.0.1".parse().unwrap(),
            base_port: 0,
            groups,
            recv_buffer_bytes: 1 << 20,
            send_buffer_bytes: 1 << 20,
            ..Default::default()
        };
        UdpDriver::bind(cfg, ep, PeerMap::new()).unwrap().0
    }

    #[test]
    fn a_message_crosses_on_one_thread() {
        let mut a = driver(1, vec![0, 1]);
        let mut b = driver(2, vec![0, 1]);
        for g in [0, 1] {
            let (aa, ba) = (a.local_addr(g).unwrap(), b.local_addr(g).unwrap());
            a.peers_mut().set_group(2, g, ba);
            b.peers_mut().set_group(1, g, aa);
        }
        let msg: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        a.endpoint_mut().send(2, 1, &msg).unwrap();
        a.flush();
        let mut got = None;
        for _ in 0..1000 {
            b.run_once(Duration::from_millis(10)).unwrap();
            a.run_once(Duration::ZERO).unwrap();
            if let Some(Event::Delivered { group, message, .. }) = b.endpoint_mut().poll_event() {
                got = Some((group, message));
                break;
            }
        }
        assert_eq!(got, Some((1, msg)));
        assert!(a.stats().datagrams_sent >= 138);
        assert_eq!(b.stats().endpoint_rejected, 0);
    }

    #[test]
    fn gso_refused_at_run_time_falls_back_and_says_why() {
        let mut a = driver(1, vec![0]);
        let mut b = driver(2, vec![0]);
        a.peers_mut().set_group(2, 0, b.local_addr(0).unwrap());
        b.peers_mut().set_group(1, 0, a.local_addr(0).unwrap());
        if !a.gso().is_on() {
            return; // a kernel without GSO: nothing to fall back from
        }
        // With SO_NO_CHECK the kernel refuses UDP_SEGMENT sends with
        // EINVAL: the same path as a NIC that cannot segment.
        let one: libc::c_int = 1;
        // SAFETY: a valid int option on an open socket.
        let r = unsafe {
            libc::setsockopt(
                a.sockets[0].fd(),
                libc::SOL_SOCKET,
                libc::SO_NO_CHECK,
                &one as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0);
        let msg = vec![7u8; 100_000];
        a.endpoint_mut().send(2, 0, &msg).unwrap();
        a.flush();
        assert!(!a.gso().is_on());
        assert_eq!(a.stats().gso_fallbacks, 1);
        assert_eq!(a.stats().gso_sends, 0);
        assert_eq!(a.stats().send_errors, 0, "nothing is lost by the fallback");
        let n = a.take_notices();
        assert!(n.iter().any(|t| t.contains("GSO turned off")), "{n:?}");
        let mut got = None;
        for _ in 0..1000 {
            b.run_once(Duration::from_millis(10)).unwrap();
            a.run_once(Duration::ZERO).unwrap();
            if let Some(Event::Delivered { message, .. }) = b.endpoint_mut().poll_event() {
                got = Some(message);
                break;
            }
        }
        assert_eq!(got, Some(msg));
    }

    #[test]
    fn a_long_flush_reads_what_arrived_between_batches() {
        let mut a = driver(1, vec![0]);
        let mut b = driver(2, vec![0]);
        a.peers_mut().set_group(2, 0, b.local_addr(0).unwrap());
        b.peers_mut().set_group(1, 0, a.local_addr(0).unwrap());
        // Something from b waits in a's socket (loopback delivers at once).
        b.endpoint_mut().send(1, 0, b"from b").unwrap();
        b.flush();
        // a has more to send than flush_recv_every_datagrams.
        let msg = vec![3u8; 2_000_000];
        a.endpoint_mut().send(2, 0, &msg).unwrap();
        let frags = a.endpoint().config().fragments(msg.len());
        assert!(frags > UdpConfig::default().flush_recv_every_datagrams);
        a.flush();
        assert_eq!(a.stats().datagrams_received, 1, "read during the flush");
        assert!(
            a.stats().datagrams_sent as usize >= frags,
            "all of it went out"
        );
        assert!(matches!(
            a.endpoint_mut().poll_event(),
            Some(Event::Delivered { message, .. }) if message == b"from b"
        ));
    }

    #[test]
    fn a_peer_without_an_address_is_noticed_once() {
        let mut a = driver(1, vec![0]);
        a.endpoint_mut().send(9, 0, b"x").unwrap();
        a.endpoint_mut().send(9, 0, b"y").unwrap();
        a.flush();
        a.endpoint_mut().send(9, 0, b"z").unwrap();
        a.flush();
        assert_eq!(a.stats().unroutable_dropped, 2);
        let n = a.take_notices();
        assert_eq!(n.len(), 1, "{n:?}");
        assert!(n[0].contains("no address for node 9"));
    }

    #[test]
    fn garbage_is_counted_and_noticed_with_its_source() {
        let mut a = driver(1, vec![0]);
        let junk = UdpSocket::bind("127.0.0.1:0").unwrap();
        junk.send_to(&[0u8; 100], a.local_addr(0).unwrap()).unwrap();
        while a.stats().datagrams_received == 0 {
            a.run_once(Duration::from_millis(100)).unwrap();
        }
        assert_eq!(a.stats().endpoint_rejected, 1);
        let n = a.take_notices();
        assert!(
            n[0].contains(&junk.local_addr().unwrap().to_string()),
            "{n:?}"
        );
    }
}
