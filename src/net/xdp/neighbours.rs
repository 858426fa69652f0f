//! The MAC addresses of the peers on the link under an AF_XDP socket,
//! read from the kernel's neighbour table (ARP and IPv6 neighbour
//! discovery) over rtnetlink ([`Neighbours`]). AF_XDP hands the driver
//! raw Ethernet frames, so it writes the peer's MAC itself; the kernel
//! already keeps the answers, so we read them rather than resolve again.
//! This module owns the NETLINK_ROUTE socket, the RTM_GETNEIGH dump
//! request and the parser of the kernel's replies; which interface to ask
//! about is [`super::link`]'s.
//!
//! - **Only peers on the link.** A peer behind a router has no neighbour
//!   entry of its own (its frames go to the gateway's MAC); the driver
//!   looks up only peers directly on the link and leaves routed peers to
//!   the kernel's UDP path. Nothing here reads routes.
//! - **Reading never resolves.** A dump reports the table as it is; an
//!   address the kernel never sent to has no entry ([`Neighbours::lookup`]
//!   returns `None`). Any packet the kernel stack sends to the peer (such
//!   as the UDP socket path) makes it resolve the address. Entries that
//!   only AF_XDP traffic uses turn STALE and stay usable until the
//!   kernel collects them, so the driver refreshes its cache from
//!   periodic dumps, never per packet. Nothing here sends the kernel
//!   anything but a dump request: it never adds, changes or deletes an
//!   entry.
//! - **Network namespaces.** The netlink socket reads the table of the
//!   namespace of the thread that opened it.
//! - **Bytes from the kernel are still checked.** Every netlink length is
//!   bounds-checked before it is used; a malformed message is an
//!   `InvalidData` error, never a panic or a read past the buffer.
//! - **Bounded.** One receive buffer of fixed size per socket (a message
//!   that does not fit is an error, not a bigger buffer), and the entries
//!   a dump returns: nothing is sized from a length the kernel sent. No
//!   call hangs: a receive times out after a second, a dump gives up
//!   after five.

use super::link::Mac;
use nix::errno::Errno;
use nix::sys::socket::{
    bind, getsockname, sendto, setsockopt, socket, sockopt, AddressFamily, MsgFlags, NetlinkAddr,
    SockFlag, SockProtocol, SockType,
};
use nix::sys::time::TimeVal;
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// sizeof(struct nlmsghdr), already a multiple of NLMSG_ALIGNTO.
const NLMSG_HDRLEN: usize = 16;
/// sizeof(struct ndmsg) (linux/neighbour.h; libc does not define it):
/// ndm_family u8, ndm_pad1 u8, ndm_pad2 u16, ndm_ifindex i32,
/// ndm_state u16, ndm_flags u8, ndm_type u8.
const NDMSG_LEN: usize = 12;
/// sizeof(struct rtattr).
const RTA_HDRLEN: usize = 4;
/// The attribute type bits of rta_type (NLA_TYPE_MASK: without
/// NLA_F_NESTED and NLA_F_NET_BYTEORDER).
const NLA_TYPE_MASK: u16 = 0x3fff;
/// The dump request: nlmsghdr, ndmsg, and one NDA_IFINDEX attribute.
const DUMP_REQUEST_LEN: usize = NLMSG_HDRLEN + NDMSG_LEN + RTA_HDRLEN + 4;

/// Neighbour states whose link-layer address can be used (the kernel's
/// NUD_VALID): not NUD_INCOMPLETE, NUD_FAILED or NUD_NONE.
const NUD_USABLE: u16 = libc::NUD_REACHABLE
    | libc::NUD_STALE
    | libc::NUD_DELAY
    | libc::NUD_PROBE
    | libc::NUD_PERMANENT
    | libc::NUD_NOARP;

/// Receive buffer: above the largest message batch a dump sends (the
/// kernel sizes them to at most 32 KiB).
const RECV_BUFFER_BYTES: usize = 64 << 10;
/// How long one receive waits for the kernel, which answers a dump at
/// once: only a wedged kernel or a lost message reaches it.
const RECV_TIMEOUT: Duration = Duration::from_secs(1);
/// The most a whole dump may take, however many entries it has.
const DUMP_DEADLINE: Duration = Duration::from_secs(5);
/// Dumps tried when the kernel flags one as inconsistent (the table
/// changed during it).
const DUMP_ATTEMPTS: usize = 3;

/// A NETLINK_ROUTE socket for reading the kernel's neighbour table (ARP
/// and IPv6 neighbour discovery), in the network namespace of the thread
/// that opened it.
pub struct Neighbours {
    fd: OwnedFd,
    /// Sequence number of the latest request; replies carrying another
    /// are the rest of an earlier dump abandoned on error, and skipped.
    seq: u32,
    /// Our netlink port id, which the kernel writes in its replies to us.
    portid: u32,
    buf: Vec<u8>,
}

/// One entry of a neighbour dump, as the kernel sent it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Neighbour {
    ifindex: u32,
    state: u16,
    ip: IpAddr,
    /// None without an NDA_LLADDR or when it is not six bytes long.
    mac: Option<Mac>,
}

/// How a batch of netlink messages ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct BatchEnd {
    /// The dump ended (NLMSG_DONE).
    done: bool,
    /// The kernel flagged the dump as inconsistent (NLM_F_DUMP_INTR).
    interrupted: bool,
}

impl Neighbours {
    /// Opens the socket (unprivileged: reading the table needs no
    /// capability). Receives time out after a second, so no call hangs.
    pub fn open() -> io::Result<Neighbours> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkRoute,
        )?;
        let timeout = TimeVal::new(
            RECV_TIMEOUT.as_secs() as _,
            RECV_TIMEOUT.subsec_micros() as _,
        );
        setsockopt(&fd, sockopt::ReceiveTimeout, &timeout)?;
        // Port id 0 asks the kernel to pick one, which getsockname then
        // reads back.
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0))?;
        let addr: NetlinkAddr = getsockname(fd.as_raw_fd())?;
        Ok(Neighbours {
            fd,
            seq: 0,
            portid: addr.pid(),
            buf: vec![0; RECV_BUFFER_BYTES],
        })
    }

    /// The MAC of `ip` on interface `ifindex` if the neighbour table has a
    /// usable entry (reachable, stale, delay, probe, permanent or noarp);
    /// `None` if it has none or only an incomplete or failed one. One dump
    /// of that interface's entries of the address family.
    pub fn lookup(&mut self, ifindex: u32, ip: IpAddr) -> io::Result<Option<Mac>> {
        let ip = ip.to_canonical();
        let family = match ip {
            IpAddr::V4(_) => libc::AF_INET,
            IpAddr::V6(_) => libc::AF_INET6,
        };
        Ok(self
            .dump_family(ifindex, family as u8)?
            .into_iter()
            .find(|(addr, _)| *addr == ip)
            .map(|(_, mac)| mac))
    }

    /// Every usable IPv4 and IPv6 entry of interface `ifindex` (the
    /// states [`Neighbours::lookup`] accepts): what a driver's peer cache
    /// is refreshed from.
    pub fn dump(&mut self, ifindex: u32) -> io::Result<Vec<(IpAddr, Mac)>> {
        self.dump_family(ifindex, libc::AF_UNSPEC as u8)
    }

    fn dump_family(&mut self, ifindex: u32, family: u8) -> io::Result<Vec<(IpAddr, Mac)>> {
        if ifindex == 0 || ifindex > i32::MAX as u32 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{ifindex} is not an interface index"),
            ));
        }
        let deadline = Instant::now() + DUMP_DEADLINE;
        for _ in 0..DUMP_ATTEMPTS {
            self.seq = self.seq.wrapping_add(1);
            self.send(&dump_request(self.seq, family, ifindex))?;
            let mut entries = Vec::new();
            let mut interrupted = false;
            loop {
                let n = self.recv(deadline)?;
                let end = parse_batch(&self.buf[..n], self.seq, self.portid, &mut entries)?;
                interrupted |= end.interrupted;
                if end.done {
                    break;
                }
            }
            if !interrupted {
                return Ok(usable(entries, ifindex));
            }
        }
        Err(io::Error::new(
            io::ErrorKind::Interrupted,
            format!("the neighbour table changed during each of {DUMP_ATTEMPTS} dumps"),
        ))
    }

    fn send(&self, msg: &[u8]) -> io::Result<()> {
        // Port 0 is the kernel.
        let kernel = NetlinkAddr::new(0, 0);
        loop {
            let n = match sendto(self.fd.as_raw_fd(), msg, &kernel, MsgFlags::empty()) {
                Ok(n) => n,
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            };
            if n != msg.len() {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!("netlink took {n} of {} request bytes", msg.len()),
                ));
            }
            return Ok(());
        }
    }

    /// Receives one batch of messages from the kernel into `buf`, returning
    /// its length.
    fn recv(&mut self, deadline: Instant) -> io::Result<usize> {
        loop {
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the neighbour dump took over {DUMP_DEADLINE:?}"),
                ));
            }
            // SAFETY: sockaddr_nl is plain data; all-zero is valid.
            let mut from: libc::sockaddr_nl = unsafe { zeroed() };
            let mut from_len = size_of::<libc::sockaddr_nl>() as libc::socklen_t;
            // SAFETY: `buf` and `from` are valid for the lengths given.
            // MSG_TRUNC makes the call return the message's full length,
            // so a message cut short is seen, not parsed.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    self.buf.as_mut_ptr() as *mut libc::c_void,
                    self.buf.len(),
                    libc::MSG_TRUNC,
                    &mut from as *mut _ as *mut libc::sockaddr,
                    &mut from_len,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::Interrupted => continue,
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("the kernel sent no neighbour dump within {RECV_TIMEOUT:?}"),
                        ))
                    }
                    _ => return Err(e),
                }
            }
            if from.nl_pid != 0 {
                // Another process, not the kernel.
                continue;
            }
            let n = n as usize;
            if n > self.buf.len() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "a netlink message of {n} bytes did not fit the {}-byte buffer",
                        self.buf.len()
                    ),
                ));
            }
            return Ok(n);
        }
    }
}

/// The entries of `ifindex` whose MAC can be used. The kernel already
/// filters by NDA_IFINDEX, but older kernels ignore that attribute.
fn usable(entries: Vec<Neighbour>, ifindex: u32) -> Vec<(IpAddr, Mac)> {
    entries
        .into_iter()
        .filter(|n| n.ifindex == ifindex && n.state & NUD_USABLE != 0)
        .filter_map(|n| Some((n.ip, n.mac?)))
        .collect()
}

/// An RTM_GETNEIGH dump request for `family` (AF_UNSPEC: IPv4 and IPv6)
/// on `ifindex`. The interface goes in an NDA_IFINDEX attribute, not in
/// ndm_ifindex: the kernel ignores ndm_ifindex in dumps, and rejects it
/// when the socket asks for strict checking.
fn dump_request(seq: u32, family: u8, ifindex: u32) -> [u8; DUMP_REQUEST_LEN] {
    let mut m = [0u8; DUMP_REQUEST_LEN];
    m[0..4].copy_from_slice(&(DUMP_REQUEST_LEN as u32).to_ne_bytes());
    m[4..6].copy_from_slice(&libc::RTM_GETNEIGH.to_ne_bytes());
    m[6..8].copy_from_slice(&((libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16).to_ne_bytes());
    m[8..12].copy_from_slice(&seq.to_ne_bytes());
    // nlmsg_pid 0: the kernel knows who sent it.
    m[NLMSG_HDRLEN] = family;
    let attr = NLMSG_HDRLEN + NDMSG_LEN;
    m[attr..attr + 2].copy_from_slice(&((RTA_HDRLEN + 4) as u16).to_ne_bytes());
    m[attr + 2..attr + 4].copy_from_slice(&libc::NDA_IFINDEX.to_ne_bytes());
    m[attr + 4..attr + 8].copy_from_slice(&ifindex.to_ne_bytes());
    m
}

fn malformed(why: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("malformed netlink message: {why}"),
    )
}

/// Rounds up to NLMSG_ALIGNTO (= RTA_ALIGNTO = 4).
fn align4(n: usize) -> usize {
    n.saturating_add(3) & !3
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// An errno the kernel sent as a negative number, as an io::Error.
fn kernel_error(code: i32, what: &str) -> io::Error {
    match code.checked_neg() {
        Some(errno) if errno > 0 => {
            let e = io::Error::from_raw_os_error(errno);
            io::Error::new(e.kind(), format!("{what}: {e}"))
        }
        _ => malformed(format!("{what} carries error code {code}")),
    }
}

/// Parses one batch of netlink messages answering dump `seq` sent from
/// port `portid`, appending the neighbour entries to `out`. Messages of
/// other requests are skipped; an error message is returned as the error.
fn parse_batch(
    buf: &[u8],
    seq: u32,
    portid: u32,
    out: &mut Vec<Neighbour>,
) -> io::Result<BatchEnd> {
    let mut end = BatchEnd::default();
    let mut rest = buf;
    while !rest.is_empty() {
        if rest.len() < NLMSG_HDRLEN {
            return Err(malformed(format!(
                "{} trailing bytes, fewer than a header",
                rest.len()
            )));
        }
        let len = u32_at(rest, 0).unwrap_or(0) as usize;
        let kind = u16_at(rest, 4).unwrap_or(0);
        let flags = u16_at(rest, 6).unwrap_or(0);
        let msg_seq = u32_at(rest, 8).unwrap_or(0);
        let msg_portid = u32_at(rest, 12).unwrap_or(0);
        if len < NLMSG_HDRLEN || len > rest.len() {
            return Err(malformed(format!(
                "length {len} with {} bytes left",
                rest.len()
            )));
        }
        let payload = &rest[NLMSG_HDRLEN..len];
        rest = &rest[align4(len).min(rest.len())..];
        if msg_seq != seq || msg_portid != portid {
            continue;
        }
        if flags & libc::NLM_F_DUMP_INTR as u16 != 0 {
            end.interrupted = true;
        }
        match kind as libc::c_int {
            libc::NLMSG_NOOP => {}
            libc::NLMSG_DONE => {
                // The payload, when present, is the dump's error code.
                if let Some(code) = u32_at(payload, 0) {
                    if code as i32 != 0 {
                        return Err(kernel_error(code as i32, "the neighbour dump failed"));
                    }
                }
                end.done = true;
                return Ok(end);
            }
            libc::NLMSG_ERROR => {
                let code = u32_at(payload, 0)
                    .ok_or_else(|| malformed(format!("an error of {} bytes", payload.len())))?;
                if code == 0 {
                    // An acknowledgement: nothing more follows.
                    end.done = true;
                    return Ok(end);
                }
                return Err(kernel_error(
                    code as i32,
                    "the kernel refused the neighbour dump",
                ));
            }
            libc::NLMSG_OVERRUN => return Err(malformed("an overrun".into())),
            _ if kind == libc::RTM_NEWNEIGH => {
                if let Some(n) = parse_neighbour(payload)? {
                    out.push(n);
                }
            }
            _ => {}
        }
    }
    Ok(end)
}

/// Parses the payload of an RTM_NEWNEIGH message: an ndmsg and its
/// attributes. `None` for a family other than IPv4 or IPv6.
fn parse_neighbour(payload: &[u8]) -> io::Result<Option<Neighbour>> {
    if payload.len() < NDMSG_LEN {
        return Err(malformed(format!(
            "a neighbour of {} bytes, fewer than an ndmsg",
            payload.len()
        )));
    }
    let family = payload[0] as libc::c_int;
    let ifindex = u32_at(payload, 4).unwrap_or(0);
    let state = u16_at(payload, 8).unwrap_or(0);
    let mut dst: Option<&[u8]> = None;
    let mut lladdr: Option<&[u8]> = None;
    let mut rest = &payload[NDMSG_LEN..];
    while !rest.is_empty() {
        let (Some(len), Some(kind)) = (u16_at(rest, 0), u16_at(rest, 2)) else {
            return Err(malformed(format!(
                "{} trailing bytes, fewer than an attribute header",
                rest.len()
            )));
        };
        let len = len as usize;
        if len < RTA_HDRLEN || len > rest.len() {
            return Err(malformed(format!(
                "attribute length {len} with {} bytes left",
                rest.len()
            )));
        }
        let data = &rest[RTA_HDRLEN..len];
        match kind & NLA_TYPE_MASK {
            libc::NDA_DST => dst = Some(data),
            libc::NDA_LLADDR => lladdr = Some(data),
            _ => {}
        }
        rest = &rest[align4(len).min(rest.len())..];
    }
    let ip = match (family, dst) {
        (libc::AF_INET, Some(d)) if d.len() == 4 => {
            IpAddr::V4(Ipv4Addr::new(d[0], d[1], d[2], d[3]))
        }
        (libc::AF_INET6, Some(d)) if d.len() == 16 => {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(d);
            IpAddr::V6(Ipv6Addr::from(octets))
        }
        (libc::AF_INET | libc::AF_INET6, Some(d)) => {
            return Err(malformed(format!(
                "a {}-byte NDA_DST for family {family}",
                d.len()
            )))
        }
        (libc::AF_INET | libc::AF_INET6, None) => {
            return Err(malformed("a neighbour without NDA_DST".into()))
        }
        _ => return Ok(None),
    };
    let mac = lladdr.and_then(|l| Mac::try_from(l).ok());
    Ok(Some(Neighbour {
        ifindex,
        state,
        ip,
        mac,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::xdp::link::index_of;

    #[test]
    fn dump_of_the_host_answers_without_root() {
        let mut n = Neighbours::open().unwrap();
        let lo = index_of("lo").unwrap();
        // Whatever the host's table holds: the request is accepted and the
        // reply parses, twice on one socket (sequence numbers advance).
        n.dump(lo).unwrap();
        n.lookup(lo, "127.0.0.1".parse().unwrap()).unwrap();
        assert_eq!(n.seq, 2);
        let e = n.dump(0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        // An index no interface has: nothing, not an error.
        assert_eq!(n.dump(i32::MAX as u32).unwrap(), vec![]);
    }

    #[test]
    fn only_usable_entries_of_the_interface_are_kept() {
        let entry = |ifindex, state, ip: &str, mac| Neighbour {
            ifindex,
            state,
            ip: ip.parse().unwrap(),
            mac,
        };
        let m = Some([2, 0, 0, 0, 0, 1]);
        let mut entries = Vec::new();
        for (i, state) in [
            libc::NUD_REACHABLE,
            libc::NUD_STALE,
            libc::NUD_DELAY,
            libc::NUD_PROBE,
            libc::NUD_PERMANENT,
            libc::NUD_NOARP,
        ]
        .into_iter()
        .enumerate()
        {
            entries.push(entry(4, state, &format!("10.0.0.{i}"), m));
        }
        let kept: Vec<IpAddr> = entries.iter().map(|n| n.ip).collect();
        entries.push(entry(4, libc::NUD_INCOMPLETE, "10.0.1.1", m));
        entries.push(entry(4, libc::NUD_FAILED, "10.0.1.2", m));
        entries.push(entry(4, 0, "10.0.1.3", m));
        entries.push(entry(5, libc::NUD_REACHABLE, "10.0.1.4", m));
        entries.push(entry(4, libc::NUD_REACHABLE, "10.0.1.5", None));
        let out = usable(entries, 4);
        assert_eq!(out.iter().map(|(ip, _)| *ip).collect::<Vec<_>>(), kept);
        assert!(out.iter().all(|(_, mac)| Some(*mac) == m));
    }

    // --- the parser on hand-made messages ---

    const SEQ: u32 = 7;
    const PORT: u32 = 4242;

    fn message(kind: u16, flags: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let len = NLMSG_HDRLEN + payload.len();
        let mut m = Vec::new();
        m.extend_from_slice(&(len as u32).to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&flags.to_ne_bytes());
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&PORT.to_ne_bytes());
        m.extend_from_slice(payload);
        m.resize(align4(m.len()), 0);
        m
    }

    fn attribute(kind: u16, data: &[u8]) -> Vec<u8> {
        let mut a = Vec::new();
        a.extend_from_slice(&((RTA_HDRLEN + data.len()) as u16).to_ne_bytes());
        a.extend_from_slice(&kind.to_ne_bytes());
        a.extend_from_slice(data);
        a.resize(align4(a.len()), 0);
        a
    }

    fn ndmsg(family: i32, ifindex: u32, state: u16) -> Vec<u8> {
        let mut p = vec![family as u8, 0, 0, 0];
        p.extend_from_slice(&ifindex.to_ne_bytes());
        p.extend_from_slice(&state.to_ne_bytes());
        p.extend_from_slice(&[0, 1]);
        p
    }

    fn neighbour(family: i32, ifindex: u32, state: u16, dst: &[u8], mac: &[u8]) -> Vec<u8> {
        let mut p = ndmsg(family, ifindex, state);
        p.extend(attribute(libc::NDA_DST, dst));
        p.extend(attribute(libc::NDA_CACHEINFO, &[0; 16]));
        p.extend(attribute(libc::NDA_LLADDR, mac));
        message(libc::RTM_NEWNEIGH, libc::NLM_F_MULTI as u16, SEQ, &p)
    }

    fn done() -> Vec<u8> {
        message(
            libc::NLMSG_DONE as u16,
            libc::NLM_F_MULTI as u16,
            SEQ,
            &[0; 4],
        )
    }

    fn parse(buf: &[u8]) -> io::Result<(BatchEnd, Vec<Neighbour>)> {
        let mut out = Vec::new();
        parse_batch(buf, SEQ, PORT, &mut out).map(|end| (end, out))
    }

    fn assert_malformed(buf: &[u8]) {
        match parse(buf) {
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}"),
            Ok(r) => panic!("{buf:?} parsed: {r:?}"),
        }
    }

    /// Two entries and the end of the dump, as one batch, with the
    /// offsets where each message starts.
    fn valid_batch() -> (Vec<u8>, Vec<usize>) {
        let mut b = neighbour(
            libc::AF_INET,
            3,
            libc::NUD_REACHABLE,
            &[10, 77, 0, 2],
            &[2, 0, 0, 0, 0, 2],
        );
        let second = b.len();
        let mut v6 = [0u8; 16];
        v6[0] = 0xfd;
        v6[1] = 0x77;
        v6[15] = 2;
        b.extend(neighbour(
            libc::AF_INET6,
            3,
            libc::NUD_STALE,
            &v6,
            &[2, 0, 0, 0, 0, 3],
        ));
        let third = b.len();
        b.extend(done());
        let end = b.len();
        (b, vec![0, second, third, end])
    }

    #[test]
    fn parses_a_well_formed_batch() {
        let (b, _) = valid_batch();
        let (end, out) = parse(&b).unwrap();
        assert!(end.done && !end.interrupted);
        assert_eq!(
            out,
            vec![
                Neighbour {
                    ifindex: 3,
                    state: libc::NUD_REACHABLE,
                    ip: "10.77.0.2".parse().unwrap(),
                    mac: Some([2, 0, 0, 0, 0, 2]),
                },
                Neighbour {
                    ifindex: 3,
                    state: libc::NUD_STALE,
                    ip: "fd77::2".parse().unwrap(),
                    mac: Some([2, 0, 0, 0, 0, 3]),
                },
            ]
        );
    }

    #[test]
    fn skips_other_requests_and_reports_interrupted_dumps() {
        let old = message(libc::RTM_NEWNEIGH, 0, SEQ - 1, &[0xff; 3]);
        let mut b = old;
        b.extend(message(
            libc::NLMSG_NOOP as u16,
            libc::NLM_F_DUMP_INTR as u16,
            SEQ,
            &[],
        ));
        let (end, out) = parse(&b).unwrap();
        assert!(!end.done && end.interrupted);
        assert!(out.is_empty());
    }

    #[test]
    fn kernel_errors_come_back_as_errors() {
        let enodev = (-libc::ENODEV).to_ne_bytes();
        let e = parse(&message(libc::NLMSG_ERROR as u16, 0, SEQ, &enodev)).unwrap_err();
        assert!(e.to_string().contains("refused"), "{e}");
        assert_eq!(
            e.kind(),
            io::Error::from_raw_os_error(libc::ENODEV).kind(),
            "{e}"
        );
        let e = parse(&message(
            libc::NLMSG_DONE as u16,
            0,
            SEQ,
            &(-libc::EBUSY).to_ne_bytes(),
        ))
        .unwrap_err();
        assert!(e.to_string().contains("dump failed"), "{e}");
        let (end, _) = parse(&message(libc::NLMSG_ERROR as u16, 0, SEQ, &[0; 20])).unwrap();
        assert!(end.done);
        // Error codes that are no errno.
        assert_malformed(&message(
            libc::NLMSG_ERROR as u16,
            0,
            SEQ,
            &i32::MIN.to_ne_bytes(),
        ));
        assert_malformed(&message(
            libc::NLMSG_ERROR as u16,
            0,
            SEQ,
            &5i32.to_ne_bytes(),
        ));
        assert_malformed(&message(libc::NLMSG_ERROR as u16, 0, SEQ, &[0; 2]));
        assert_malformed(&message(libc::NLMSG_OVERRUN as u16, 0, SEQ, &[]));
    }

    #[test]
    fn malformed_messages_are_invalid_data() {
        let mac = [2, 0, 0, 0, 0, 2];
        // Shorter than a header; a length below the header's; a length
        // past the buffer.
        assert_malformed(&[1, 2, 3]);
        let mut short = done();
        short[0..4].copy_from_slice(&8u32.to_ne_bytes());
        assert_malformed(&short);
        let mut long = done();
        long[0..4].copy_from_slice(&1000u32.to_ne_bytes());
        assert_malformed(&long);
        let mut huge = done();
        huge[0..4].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert_malformed(&huge);
        // A neighbour shorter than an ndmsg.
        assert_malformed(&message(libc::RTM_NEWNEIGH, 0, SEQ, &[2, 0, 0, 0, 1]));
        // A wrong-size destination for the family; none at all.
        assert_malformed(&neighbour(
            libc::AF_INET,
            1,
            libc::NUD_REACHABLE,
            &[10, 0, 0],
            &mac,
        ));
        assert_malformed(&neighbour(
            libc::AF_INET6,
            1,
            libc::NUD_REACHABLE,
            &[10, 0, 0, 1],
            &mac,
        ));
        let mut p = ndmsg(libc::AF_INET, 1, libc::NUD_REACHABLE);
        p.extend(attribute(libc::NDA_LLADDR, &mac));
        assert_malformed(&message(libc::RTM_NEWNEIGH, 0, SEQ, &p));
        // Attribute lengths below the header, past the message, and a
        // header cut short.
        for bad in [[2u8, 0, 1, 0], [200, 0, 1, 0]] {
            let mut p = ndmsg(libc::AF_INET, 1, libc::NUD_REACHABLE);
            p.extend_from_slice(&bad);
            assert_malformed(&message(libc::RTM_NEWNEIGH, 0, SEQ, &p));
        }
        let mut p = ndmsg(libc::AF_INET, 1, libc::NUD_REACHABLE);
        p.extend_from_slice(&[8, 0]);
        assert_malformed(&message(libc::RTM_NEWNEIGH, 0, SEQ, &p));
    }

    #[test]
    fn odd_but_valid_entries_are_kept_or_skipped() {
        // A link-layer address that is not Ethernet's: kept, without MAC.
        let b = neighbour(
            libc::AF_INET,
            1,
            libc::NUD_REACHABLE,
            &[10, 0, 0, 1],
            &[1, 2, 3, 4],
        );
        let (_, out) = parse(&b).unwrap();
        assert_eq!(out[0].mac, None);
        // Another family (a bridge's fdb entry): skipped.
        let b = neighbour(libc::AF_BRIDGE, 1, libc::NUD_REACHABLE, &[1, 2], &[1; 6]);
        assert!(parse(&b).unwrap().1.is_empty());
        // Unknown attribute types and flag bits are ignored.
        let mut p = ndmsg(libc::AF_INET, 1, libc::NUD_PERMANENT);
        p.extend(attribute(0x8000 | libc::NDA_DST, &[10, 0, 0, 9]));
        p.extend(attribute(999, &[]));
        let (_, out) = parse(&message(libc::RTM_NEWNEIGH, 0, SEQ, &p)).unwrap();
        assert_eq!(out[0].ip, "10.0.0.9".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn truncated_and_corrupted_batches_never_panic() {
        let (b, starts) = valid_batch();
        for cut in 0..b.len() {
            match parse(&b[..cut]) {
                // Cut between messages: what came before, dump unfinished.
                Ok((end, out)) => {
                    let whole = starts.iter().position(|&s| s == cut);
                    assert_eq!(whole, Some(out.len()), "cut at {cut}");
                    assert!(!end.done, "cut at {cut}");
                }
                Err(e) => {
                    assert_eq!(e.kind(), io::ErrorKind::InvalidData, "cut at {cut}: {e}");
                    assert!(!starts.contains(&cut), "cut at {cut}: {e}");
                }
            }
        }
        // Every byte set to a few values, and a stream of pseudo-random
        // flips: anything may come back but a panic.
        for i in 0..b.len() {
            for v in [0, 1, 3, 4, 0x7f, 0x80, 0xff] {
                let mut c = b.clone();
                c[i] = v;
                let _ = parse(&c);
            }
        }
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            let mut c = b.clone();
            for _ in 0..3 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let at = (x % c.len() as u64) as usize;
                c[at] = (x >> 32) as u8;
            }
            let cut = (x >> 40) as usize % (c.len() + 1);
            let _ = parse(&c[..cut]);
        }
    }

    #[test]
    fn dump_request_names_the_interface_in_an_attribute() {
        let r = dump_request(9, libc::AF_INET6 as u8, 0x0102_0304);
        let mut out = Vec::new();
        // It reads back as a message: header fields and ndmsg.
        assert_eq!(u32_at(&r, 0), Some(DUMP_REQUEST_LEN as u32));
        assert_eq!(u16_at(&r, 4), Some(libc::RTM_GETNEIGH));
        assert_eq!(
            u16_at(&r, 6),
            Some((libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16)
        );
        assert_eq!(u32_at(&r, 8), Some(9));
        assert_eq!(r[NLMSG_HDRLEN], libc::AF_INET6 as u8);
        assert_eq!(u32_at(&r, NLMSG_HDRLEN + 4), Some(0), "ndm_ifindex");
        assert_eq!(
            u16_at(&r, NLMSG_HDRLEN + NDMSG_LEN + 2),
            Some(libc::NDA_IFINDEX)
        );
        assert_eq!(u32_at(&r, NLMSG_HDRLEN + NDMSG_LEN + 4), Some(0x0102_0304));
        // A GETNEIGH is not a reply: the parser passes over it.
        assert_eq!(
            parse_batch(&r, 9, 0, &mut out).unwrap(),
            BatchEnd::default()
        );
    }
}
