//! The AF_XDP path of the UDP driver: the groups' datagrams bypass the
//! kernel's network stack, in and out, on the interface that holds the
//! node's UDP address.
//!
//! - **Per node** ([`XdpNode`]): one XDP program on the interface, which
//!   redirects a group's UDP datagrams to the AF_XDP socket of the
//!   receive queue they arrived on if that queue belongs to the loop that
//!   owns the group, and passes everything else to the kernel; an XSKMAP
//!   (queue -> socket); a BPF link that detaches the program when the
//!   daemon exits, however it exits.
//! - **Per loop** ([`XdpPort`]): an AF_XDP socket on the queue numbered
//!   like the loop (loop 0: queue 0), with its UMEM. On a NIC with
//!   several queues the operator steers each group's port to its loop's
//!   queue (ethtool ntuple rules, HARDWARE.md); a datagram that lands on
//!   another queue is passed to the kernel and still reaches the group's
//!   socket, only not bypassing.
//! - **Sending**: the driver writes Ethernet, IP and UDP headers itself;
//!   the peer's MAC comes from the kernel's neighbour table. A peer
//!   without an entry yet is sent to through the kernel socket, which also
//!   makes the kernel resolve it (ARP or neighbour discovery).
//! - **The kernel sockets stay bound**: they keep the ports ours, receive
//!   whatever the program passes (fragments, IP options, other queues),
//!   and carry what cannot go through the rings.
//!
//! [`XdpNode::open`] fails with the reason when AF_XDP cannot be used
//! (no privileges, a loopback address, an MTU that does not fit a UMEM
//! frame, a kernel without AF_XDP): the node then runs on sockets alone
//! and says why (`net.backend = "auto"`), or refuses to start (`"xdp"`).

pub mod bpf;
mod error;
pub mod frame;
pub mod link;
pub mod neighbours;
pub mod xsk;

pub use error::XdpError;
use frame::{FrameAddrs, Mac};
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use xsk::{Mode, Xsk, XskSizes};

/// UMEM frame size: room for a 1500-byte MTU frame and the kernel's
/// 256-byte receive headroom, twice over.
pub const XDP_FRAME_BYTES: u32 = 4096;
/// Headroom the kernel keeps in front of a received frame in copy mode
/// (XDP_PACKET_HEADROOM).
const XDP_RX_HEADROOM_BYTES: usize = 256;
/// Ethernet header and FCS-free framing the MTU does not count.
const ETHERNET_HEADER_BYTES: usize = 14;
/// The largest `transport.mtu_bytes` the AF_XDP path takes: a frame and
/// the kernel's headroom in one UMEM frame (3826; no multi-buffer XDP).
pub const XDP_MTU_MAX: usize =
    XDP_FRAME_BYTES as usize - ETHERNET_HEADER_BYTES - XDP_RX_HEADROOM_BYTES;
/// How long a peer's MAC (or its absence) is trusted before the
/// neighbour table is read again, ms.
const NEIGHBOUR_REFRESH_MS: u64 = 1_000;
/// How soon a peer without a MAC is looked up again, ms: the kernel
/// resolves it within a round trip of the first datagram sent through
/// the socket, and a lookup costs microseconds.
const NEIGHBOUR_MISS_RETRY_MS: u64 = 1;
/// Misses in a row looked up again that soon; then once a second (a peer
/// off the link, or down, would cost a table dump a millisecond).
const NEIGHBOUR_QUICK_MISSES: u32 = 20;
/// Frames read from the rx ring per call.
pub const RX_BATCH_FRAMES_MAX: usize = 64;

/// Which path the node's datagrams take (`net.backend`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Backend {
    /// AF_XDP where it works, sockets (with the reason logged) where not.
    #[default]
    Auto,
    /// AF_XDP or refuse to start.
    Xdp,
    /// Kernel UDP sockets only.
    Sockets,
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Backend::Auto),
            "xdp" => Ok(Backend::Xdp),
            "sockets" => Ok(Backend::Sockets),
            other => Err(format!(
                "unknown backend {other:?}: one of \"auto\", \"xdp\", \"sockets\""
            )),
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Auto => "auto",
            Backend::Xdp => "xdp",
            Backend::Sockets => "sockets",
        })
    }
}

/// The AF_XDP settings (`[net]` in the config file).
#[derive(Clone, Debug)]
pub struct XdpConfig {
    /// Which path to take.
    pub backend: Backend,
    /// UMEM frames per loop (a power of two): half receive, half send.
    pub umem_frames: u32,
    /// Ask for zero-copy (falls back to copy mode, with the reason).
    pub zero_copy: bool,
}

impl Default for XdpConfig {
    fn default() -> Self {
        XdpConfig {
            backend: Backend::Auto,
            umem_frames: 4096,
            zero_copy: true,
        }
    }
}

impl XdpConfig {
    /// Checks the values, naming the key.
    pub fn validate(&self) -> Result<(), String> {
        if !self.umem_frames.is_power_of_two() || !(64..=1 << 20).contains(&self.umem_frames) {
            return Err(format!(
                "{}: a power of two in 64..=1048576",
                self.umem_frames
            ));
        }
        Ok(())
    }
}

/// The node's XDP program on its interface, shared by its loops.
pub struct XdpNode {
    /// The interface.
    pub iface: link::Interface,
    /// The local address the program steers.
    pub local: IpAddr,
    /// Native (driver) or generic XDP.
    pub attach_mode: &'static str,
    /// Instructions of the loaded program.
    pub program_insns: usize,
    cfg: XdpConfig,
    xskmap: OwnedFd,
    _link: OwnedFd,
    _program: bpf::Program,
}

impl XdpNode {
    /// Loads and attaches the program for `routes`: (UDP port, receive
    /// queue of the loop that owns the port's group). Fails with the
    /// reason AF_XDP cannot be used here.
    pub fn open(
        cfg: &XdpConfig,
        local: IpAddr,
        mtu_bytes: usize,
        routes: &[(u16, u32)],
    ) -> Result<XdpNode, XdpError> {
        if local.is_unspecified() {
            return Err(XdpError::Unspecified(local));
        }
        let iface =
            link::interface_of(local).map_err(|source| XdpError::Interface { local, source })?;
        if iface.loopback {
            return Err(XdpError::Loopback {
                local,
                iface: iface.name,
            });
        }
        if mtu_bytes > XDP_MTU_MAX {
            return Err(XdpError::MtuTooLarge { mtu_bytes });
        }
        if (iface.mtu as usize) < mtu_bytes {
            return Err(XdpError::InterfaceMtu {
                iface: iface.name,
                iface_mtu: iface.mtu,
                mtu_bytes,
            });
        }
        let queues = routes.iter().map(|r| r.1).max().map_or(1, |q| q + 1);
        let xskmap = bpf::create_xskmap(queues.max(iface.queues)).map_err(XdpError::Map)?;
        let program = bpf::Program::load(
            &bpf::Steering {
                local,
                routes: routes.to_vec(),
            },
            bpf::OnMatch::Redirect(xskmap.as_raw_fd()),
        )
        .map_err(XdpError::Load)?;
        // Native XDP where the driver has it; generic (after the skb is
        // built, slower but everywhere) otherwise.
        let (link, attach_mode) = match program.attach(iface.index, bpf::XDP_FLAGS_DRV_MODE) {
            Ok(l) => (l, "native"),
            Err(native) => match program.attach(iface.index, bpf::XDP_FLAGS_SKB_MODE) {
                Ok(l) => (l, "generic"),
                Err(generic) => {
                    return Err(XdpError::Attach { native, generic });
                }
            },
        };
        Ok(XdpNode {
            local,
            attach_mode,
            program_insns: program.insns,
            cfg: cfg.clone(),
            xskmap,
            _link: link,
            _program: program,
            iface,
        })
    }

    /// Opens loop `queue`'s socket (the loop numbered like the queue).
    /// The port holds the program: it stays attached while any port of
    /// the node lives.
    pub fn port(self: &Arc<Self>, queue: u32) -> Result<XdpPort, XdpError> {
        if queue >= self.iface.queues.max(1) {
            return Err(XdpError::NoQueue {
                iface: self.iface.name.clone(),
                queues: self.iface.queues,
                queue,
            });
        }
        let sizes = XskSizes {
            frames: self.cfg.umem_frames,
            frame_bytes: XDP_FRAME_BYTES,
        };
        let (xsk, zero_copy_refused) = xsk::open_in_map(
            self.iface.index,
            queue,
            sizes,
            self.cfg.zero_copy,
            self.xskmap.as_raw_fd(),
        )
        .map_err(XdpError::Socket)?;
        let neighbours = neighbours::Neighbours::open().map_err(XdpError::Neighbours)?;
        Ok(XdpPort {
            _node: Arc::clone(self),
            xsk,
            queue,
            ifindex: self.iface.index,
            iface: self.iface.name.clone(),
            attach_mode: self.attach_mode,
            local_ip: self.local,
            local_mac: self.iface.mac,
            neighbours,
            macs: HashMap::new(),
            zero_copy_refused,
            stats: XdpStats::default(),
        })
    }
}

/// Counters of a loop's AF_XDP path.
#[derive(Clone, Copy, Debug, Default)]
pub struct XdpStats {
    /// Datagrams received through the rx ring.
    pub rx_datagrams: u64,
    /// Frames on the rx ring refused (not an IPv4/IPv6 UDP datagram to us,
    /// bad IP checksum or lengths).
    pub rx_rejected: u64,
    /// Datagrams sent through the tx ring.
    pub tx_datagrams: u64,
    /// Datagrams sent through the kernel socket because the peer's MAC was
    /// not known yet (or it is not on the link).
    pub tx_via_kernel: u64,
    /// Sends that waited for a free frame or tx slot.
    pub tx_ring_full: u64,
    /// Neighbour table reads.
    pub neighbour_lookups: u64,
    /// Frames the kernel dropped on the way to the rx ring (ring full,
    /// no free frame on the fill ring): the loop did not keep up.
    pub rx_kernel_dropped: u64,
}

/// A datagram read from the rx ring: its source and payload (in the UMEM).
pub type Received<'a> = (SocketAddr, &'a [u8]);

/// A peer's entry in a port's neighbour cache.
#[derive(Clone, Copy, Debug)]
struct Neighbour {
    /// Its MAC, if the kernel's table had a usable entry.
    mac: Option<Mac>,
    /// When the table was read, ms.
    at_ms: u64,
    /// Reads in a row that found nothing.
    misses: u32,
}

/// A frame on the rx ring that is not a datagram for this loop.
#[derive(Clone, Copy, Debug)]
pub enum Refused {
    /// A UDP datagram, but not to this node's address and a port of the
    /// loop (the program steers only those; a kernel bug or a race with
    /// a reconfiguration).
    NotOurs {
        /// Its source.
        src: SocketAddr,
        /// Its destination.
        dst: SocketAddr,
    },
    /// Not a well-formed unfragmented UDP datagram.
    Malformed(frame::FrameError),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::NotOurs { src, dst } => {
                write!(
                    f,
                    "a frame from {src} to {dst}, not one of this loop's ports"
                )
            }
            Refused::Malformed(e) => write!(f, "a frame refused: {e}"),
        }
    }
}

/// What became of one datagram handed to [`XdpPort::send`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpSend {
    /// On the tx ring.
    Queued,
    /// No MAC for the peer: send it through the kernel.
    NoRoute,
    /// No free frame or slot: wait for completions.
    Full,
}

/// One loop's AF_XDP socket and what it needs to build frames.
pub struct XdpPort {
    /// The program that steers datagrams to the socket (detached when
    /// the last port and the node's own handle are gone).
    _node: Arc<XdpNode>,
    xsk: Xsk,
    queue: u32,
    ifindex: u32,
    iface: String,
    attach_mode: &'static str,
    local_ip: IpAddr,
    local_mac: Mac,
    neighbours: neighbours::Neighbours,
    /// What the kernel's table said of each peer address.
    macs: HashMap<IpAddr, Neighbour>,
    zero_copy_refused: Option<String>,
    stats: XdpStats,
}

impl XdpPort {
    /// The socket, for the driver's poll.
    pub fn fd(&self) -> std::os::fd::RawFd {
        self.xsk.fd()
    }

    /// Counters.
    pub fn stats(&self) -> XdpStats {
        XdpStats {
            tx_ring_full: self.xsk.stats().tx_ring_full,
            rx_kernel_dropped: self.xsk.stats().rx_kernel_dropped,
            ..self.stats
        }
    }

    /// Reads the kernel's drop counters (a syscall: for status reads).
    pub fn refresh_kernel_drops(&mut self) {
        self.xsk.kernel_drops();
    }

    /// One line for the log and `/status`: how the socket runs.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "AF_XDP on {} queue {} ({} mode, {} XDP)",
            self.iface,
            self.queue,
            self.xsk.mode(),
            self.attach_mode
        );
        if let Some(why) = &self.zero_copy_refused {
            s.push_str(&format!("; {why}"));
        }
        s
    }

    /// True if bound in zero-copy mode.
    pub fn zero_copy(&self) -> bool {
        self.xsk.mode() == Mode::ZeroCopy
    }

    /// The MAC of `ip` from the cache, read again from the kernel's table
    /// once a second (a few times a millisecond apart while the kernel
    /// resolves a new peer, then once a second: an off-link peer never
    /// resolves). `refreshed` is set when a known MAC was just read
    /// again: that datagram then goes through the kernel, whose
    /// neighbour state machine sees no traffic on the AF_XDP path and
    /// would otherwise never confirm or re-probe the entry (a peer whose
    /// MAC changes without a gratuitous ARP).
    fn mac_of(&mut self, ip: IpAddr, now_ms: u64) -> (Option<Mac>, bool) {
        let cached = self.macs.get(&ip).copied();
        if let Some(n) = cached {
            let fresh = if n.mac.is_some() || n.misses >= NEIGHBOUR_QUICK_MISSES {
                NEIGHBOUR_REFRESH_MS
            } else {
                NEIGHBOUR_MISS_RETRY_MS
            };
            if now_ms < n.at_ms + fresh {
                return (n.mac, false);
            }
        }
        self.stats.neighbour_lookups += 1;
        let mac = self.neighbours.lookup(self.ifindex, ip).ok().flatten();
        let misses = match (mac, cached) {
            (Some(_), _) => 0,
            (None, Some(n)) => n.misses.saturating_add(1),
            (None, None) => 1,
        };
        self.macs.insert(
            ip,
            Neighbour {
                mac,
                at_ms: now_ms,
                misses,
            },
        );
        (
            mac,
            mac.is_some() && cached.is_some_and(|n| n.mac.is_some()),
        )
    }

    /// Puts one datagram from local port `src_port` to `dest` on the tx
    /// ring (call [`XdpPort::kick`] after a batch).
    pub fn send(
        &mut self,
        src_port: u16,
        dest: SocketAddr,
        payload: &[u8],
        now_ms: u64,
    ) -> XdpSend {
        if dest.is_ipv4() != self.local_ip.is_ipv4() {
            self.stats.tx_via_kernel += 1;
            return XdpSend::NoRoute;
        }
        let (Some(dst_mac), false) = self.mac_of(dest.ip(), now_ms) else {
            self.stats.tx_via_kernel += 1;
            return XdpSend::NoRoute;
        };
        let addrs = FrameAddrs {
            src_mac: self.local_mac,
            dst_mac,
            src: SocketAddr::new(self.local_ip, src_port),
            dst: dest,
        };
        let head = frame::headers_bytes(&self.local_ip);
        if head + payload.len() > self.xsk.frame_bytes() {
            self.stats.tx_via_kernel += 1;
            return XdpSend::NoRoute;
        }
        let sent = self.xsk.send(|buf| {
            buf[head..head + payload.len()].copy_from_slice(payload);
            // No UDP checksum over IPv4: the transport's keyed tag covers
            // every byte, and the sum would cost a pass over the payload.
            frame::seal_in_place_with(buf, &addrs, payload.len(), frame::UdpChecksum::Skip).ok()
        });
        match sent {
            xsk::Sent::Queued => {
                self.stats.tx_datagrams += 1;
                XdpSend::Queued
            }
            xsk::Sent::Full => XdpSend::Full,
            xsk::Sent::Refused => {
                self.stats.tx_via_kernel += 1;
                XdpSend::NoRoute
            }
        }
    }

    /// Starts transmission of what was queued.
    pub fn kick(&mut self) -> io::Result<()> {
        self.xsk.kick()
    }

    /// The tx ring's consumer index: it moves while the kernel takes
    /// frames.
    pub fn tx_progress(&self) -> u32 {
        self.xsk.tx_consumed()
    }

    /// Frames on the tx ring the kernel has not taken yet (kick again).
    pub fn tx_pending(&self) -> u32 {
        self.xsk.tx_pending()
    }

    /// Frames that can be queued now.
    pub fn tx_free(&mut self) -> usize {
        self.xsk.tx_free()
    }

    /// Reads up to `max` frames from the rx ring: `f` gets the datagrams
    /// addressed to one of `ports` on this node as (source, payload), all
    /// at once (the payloads are in the UMEM, valid during the call);
    /// `rejected` gets each refused frame's reason. Returns frames read.
    pub fn receive(
        &mut self,
        max: usize,
        ports: &dyn Fn(u16) -> bool,
        f: &mut dyn FnMut(&[Received<'_>]),
        rejected: &mut dyn FnMut(Refused),
    ) -> usize {
        let local = self.local_ip;
        let stats = &mut self.stats;
        self.xsk.receive(max, |frames| {
            let mut got: Vec<(SocketAddr, &[u8])> = Vec::with_capacity(frames.len());
            for fr in frames {
                // The UDP checksum is not verified: every datagram carries
                // the transport's keyed BLAKE3 tag, which catches all a
                // 16-bit sum would; and frames the kernel sent through a
                // veth carry only the pseudo-header sum (CHECKSUM_PARTIAL).
                match frame::parse_udp_with(fr, frame::UdpChecksum::Skip) {
                    Ok(p) if p.dst.ip() == local && ports(p.dst.port()) => {
                        got.push((p.src, p.payload));
                    }
                    Ok(p) => {
                        stats.rx_rejected += 1;
                        rejected(Refused::NotOurs {
                            src: p.src,
                            dst: p.dst,
                        });
                    }
                    Err(e) => {
                        stats.rx_rejected += 1;
                        rejected(Refused::Malformed(e));
                    }
                }
            }
            stats.rx_datagrams += got.len() as u64;
            f(&got);
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backend_names_round_trip_and_a_wrong_one_lists_the_right_ones() {
        for b in [Backend::Auto, Backend::Xdp, Backend::Sockets] {
            assert_eq!(b.to_string().parse::<Backend>(), Ok(b));
        }
        let e = "xpd".parse::<Backend>().unwrap_err();
        assert!(e.contains("\"xpd\"") && e.contains("\"sockets\""), "{e}");
    }

    #[test]
    fn umem_frames_are_a_bounded_power_of_two() {
        let ok = |f| {
            XdpConfig {
                umem_frames: f,
                ..Default::default()
            }
            .validate()
        };
        assert!(ok(4096).is_ok() && ok(64).is_ok() && ok(1 << 20).is_ok());
        for bad in [0, 32, 1000, 1 << 21] {
            assert!(ok(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn where_af_xdp_cannot_run_the_reason_says_why() {
        let cfg = XdpConfig::default();
        let routes = [(7000, 0)];
        let why = |ip: &str, mtu| XdpNode::open(&cfg, ip.parse().unwrap(), mtu, &routes).err();
        let unspecified = why("0.0.0.0", 1500).expect("refused");
        assert!(
            matches!(unspecified, XdpError::Unspecified(_)),
            "{unspecified}"
        );
        assert!(
            unspecified.to_string().contains("unspecified"),
            "{unspecified}"
        );
        let lo = why("127.0.0.1", 1500).expect("refused");
        assert!(matches!(lo, XdpError::Loopback { .. }), "{lo}");
        assert!(lo.to_string().contains("loopback"), "{lo}");
        let nobody = why("192.0.2.77", 1500).expect("refused");
        assert!(matches!(nobody, XdpError::Interface { .. }), "{nobody}");
        assert!(nobody.to_string().contains("192.0.2.77"), "{nobody}");
        // The MTU is judged on an interface that could run it: see the
        // namespace tests (tests/transport_udp.rs).
        assert_eq!(XDP_MTU_MAX, 3826);
    }
}
