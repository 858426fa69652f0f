//! Opening one group socket: created with libc so that the buffer sizes
//! are set before `bind`, the sizes the kernel granted compared with
//! those asked, and GSO and GRO probed. Also the `SocketAddr` <->
//! `sockaddr` conversions the batched calls need.
//!
//! The socket is bound exclusively: neither SO_REUSEADDR nor SO_REUSEPORT
//! is set, so while a node runs no other socket can bind its port (Linux
//! lets two UDP sockets share a port only if both set one of them), and a
//! port already taken makes `bind` fail instead of splitting the node's
//! datagrams with whoever holds it.

use super::config::UdpConfig;
use nix::errno::Errno;
use nix::sys::socket::{
    bind, getsockopt, sendto, setsockopt, socket, sockopt, AddressFamily, MsgFlags, SockFlag,
    SockProtocol, SockType, SockaddrStorage,
};
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// A socket address in the form the kernel takes.
#[derive(Clone, Copy)]
pub(crate) struct RawAddr {
    pub(crate) storage: libc::sockaddr_storage,
    pub(crate) len: libc::socklen_t,
}

impl RawAddr {
    /// Room for any address (what `recvmmsg` fills in).
    pub(crate) fn empty() -> RawAddr {
        RawAddr {
            // SAFETY: sockaddr_storage is plain data; all-zero is valid.
            storage: unsafe { zeroed() },
            len: size_of::<libc::sockaddr_storage>() as libc::socklen_t,
        }
    }

    pub(crate) fn from_std(addr: &SocketAddr) -> RawAddr {
        // SAFETY: sockaddr_storage is plain data; all-zero is valid.
        let mut storage: libc::sockaddr_storage = unsafe { zeroed() };
        let len = match addr {
            SocketAddr::V4(a) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: a.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(a.ip().octets()),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is larger than and aligned for
                // every sockaddr type.
                unsafe { std::ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in, sin) };
                size_of::<libc::sockaddr_in>()
            }
            SocketAddr::V6(a) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: a.port().to_be(),
                    sin6_flowinfo: a.flowinfo(),
                    sin6_addr: libc::in6_addr {
                        s6_addr: a.ip().octets(),
                    },
                    sin6_scope_id: a.scope_id(),
                };
                // SAFETY: as above.
                unsafe { std::ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in6, sin6) };
                size_of::<libc::sockaddr_in6>()
            }
        };
        RawAddr {
            storage,
            len: len as libc::socklen_t,
        }
    }

    pub(crate) fn to_std(self) -> Option<SocketAddr> {
        match self.storage.ss_family as libc::c_int {
            libc::AF_INET => {
                // SAFETY: the family says this is a sockaddr_in.
                let a = unsafe { *(&self.storage as *const _ as *const libc::sockaddr_in) };
                let ip = Ipv4Addr::from(a.sin_addr.s_addr.to_ne_bytes());
                Some(SocketAddr::V4(SocketAddrV4::new(
                    ip,
                    u16::from_be(a.sin_port),
                )))
            }
            libc::AF_INET6 => {
                // SAFETY: the family says this is a sockaddr_in6.
                let a = unsafe { *(&self.storage as *const _ as *const libc::sockaddr_in6) };
                Some(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(a.sin6_addr.s6_addr),
                    u16::from_be(a.sin6_port),
                    a.sin6_flowinfo,
                    a.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

fn with_context(what: &str, e: Errno) -> io::Error {
    let e = io::Error::from(e);
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Reads a sysctl under /proc/sys/net/core, for the warning text.
fn core_sysctl(name: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/sys/net/core/{name}"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Why UDP GSO or GRO is not on for a socket.
#[derive(Debug)]
pub(crate) enum OffloadRefused {
    /// The config turned it off.
    Disabled,
    /// The kernel has no such socket option (too old).
    Unsupported {
        /// The option (`UDP_SEGMENT`, `UDP_GRO`).
        option: &'static str,
        /// The first Linux release that has it.
        linux: &'static str,
        /// The kernel's answer (ENOPROTOOPT).
        source: io::Error,
    },
    /// The kernel refused it for another reason.
    Failed {
        /// What was tried.
        what: &'static str,
        /// The kernel's answer.
        source: io::Error,
    },
}

impl std::fmt::Display for OffloadRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OffloadRefused::Disabled => f.write_str("disabled by configuration"),
            OffloadRefused::Unsupported {
                option,
                linux,
                source,
            } => write!(
                f,
                "the kernel has no {option} (Linux {linux} or newer is needed): {source}"
            ),
            OffloadRefused::Failed { what, source } => write!(f, "{what} failed: {source}"),
        }
    }
}

impl std::error::Error for OffloadRefused {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OffloadRefused::Disabled => None,
            OffloadRefused::Unsupported { source, .. } | OffloadRefused::Failed { source, .. } => {
                Some(source)
            }
        }
    }
}

/// What opening the sockets found: what the kernel granted and why
/// something asked for is not in use.
pub(crate) struct Opened {
    pub(crate) socket: UdpSocket,
    pub(crate) recv_buffer_bytes: usize,
    pub(crate) send_buffer_bytes: usize,
    /// Ok, or why GSO cannot be used on this socket.
    pub(crate) gso: Result<(), OffloadRefused>,
    /// Ok, or why GRO is not on for this socket.
    pub(crate) gro: Result<(), OffloadRefused>,
    /// Buffer sizes the kernel capped, in words for the operator.
    pub(crate) warnings: Vec<String>,
}

/// Sets a buffer size and says, in the warning, how far short the kernel
/// fell. Linux doubles the value for its bookkeeping and reports the
/// doubled figure; we compare half of it with what was asked.
fn set_buffer(fd: &OwnedFd, receive: bool, asked: usize, warnings: &mut Vec<String>) -> usize {
    let (opt, sysctl) = if receive {
        ("SO_RCVBUF", "rmem_max")
    } else {
        ("SO_SNDBUF", "wmem_max")
    };
    let value = asked.min(libc::c_int::MAX as usize / 2);
    let set = if receive {
        setsockopt(fd, sockopt::RcvBuf, &value)
    } else {
        setsockopt(fd, sockopt::SndBuf, &value)
    };
    if let Err(e) = set {
        let e = io::Error::from(e);
        warnings.push(format!(
            "{opt} of {asked} bytes refused ({e}); the kernel default stays"
        ));
    }
    let read = if receive {
        getsockopt(fd, sockopt::RcvBuf)
    } else {
        getsockopt(fd, sockopt::SndBuf)
    };
    let granted = match read {
        Ok(v) => v / 2,
        Err(e) => {
            warnings.push(format!(
                "{opt} cannot be read back ({})",
                io::Error::from(e)
            ));
            return 0;
        }
    };
    if granted < asked {
        let max = core_sysctl(sysctl).map_or("unknown".into(), |v| v.to_string());
        warnings.push(format!(
            "{opt}: asked for {asked} bytes, the kernel granted {granted}: it caps the size at \
             net.core.{sysctl} (now {max}); raise it with `sysctl -w net.core.{sysctl}={asked}` \
             (and in /etc/sysctl.d/) or datagrams will be dropped under load (RcvbufErrors in \
             /proc/net/snmp)"
        ));
    }
    granted
}

/// Whether the kernel takes UDP_SEGMENT on this socket (Linux 4.18+):
/// reading the option back succeeds exactly where sending with it can.
fn probe_gso(fd: &OwnedFd) -> Result<(), OffloadRefused> {
    match getsockopt(fd, sockopt::UdpGsoSegment).map_err(io::Error::from) {
        Ok(_) => Ok(()),
        Err(source) if source.raw_os_error() == Some(libc::ENOPROTOOPT) => {
            Err(OffloadRefused::Unsupported {
                option: "UDP_SEGMENT",
                linux: "4.18",
                source,
            })
        }
        Err(source) => Err(OffloadRefused::Failed {
            what: "UDP_SEGMENT probe",
            source,
        }),
    }
}

/// Turns on UDP_GRO (Linux 5.0+).
fn enable_gro(fd: &OwnedFd) -> Result<(), OffloadRefused> {
    match setsockopt(fd, sockopt::UdpGroSegment, &true).map_err(io::Error::from) {
        Ok(()) => Ok(()),
        Err(source) if source.raw_os_error() == Some(libc::ENOPROTOOPT) => {
            Err(OffloadRefused::Unsupported {
                option: "UDP_GRO",
                linux: "5.0",
                source,
            })
        }
        Err(source) => Err(OffloadRefused::Failed {
            what: "setting UDP_GRO",
            source,
        }),
    }
}

/// Opens one non-blocking UDP socket bound to `addr`; with `timestamps`,
/// received messages carry their kernel receive time (SO_TIMESTAMPNS).
pub(crate) fn open(addr: SocketAddr, cfg: &UdpConfig, timestamps: bool) -> io::Result<Opened> {
    let family = match addr {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let owned = socket(
        family,
        SockType::Datagram,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        SockProtocol::Udp,
    )
    .map_err(|e| with_context("socket(AF_INET, SOCK_DGRAM)", e))?;
    // No SO_REUSEADDR: on a UDP socket it does not speed up a restart (a
    // closed UDP socket frees its port at once, there is no TIME_WAIT; the
    // old process's queued datagrams die with its socket) and it lets any
    // other process that sets it too bind the same port and take the
    // node's datagrams (unicast goes to the last socket bound).
    let mut warnings = Vec::new();
    // Sizes before bind: datagrams may arrive as soon as it is bound.
    let recv_buffer_bytes = set_buffer(&owned, true, cfg.recv_buffer_bytes, &mut warnings);
    let send_buffer_bytes = set_buffer(&owned, false, cfg.send_buffer_bytes, &mut warnings);
    if let Err(e) = bind(owned.as_raw_fd(), &SockaddrStorage::from(addr)) {
        let e = io::Error::from(e);
        let hint = match e.raw_os_error() {
            Some(libc::EADDRINUSE) => {
                " (another socket holds the port: is a second quired running?)"
            }
            Some(libc::EADDRNOTAVAIL) => " (bind_ip is not an address of this host)",
            Some(libc::EACCES) => " (ports below 1024 need CAP_NET_BIND_SERVICE)",
            _ => "",
        };
        return Err(io::Error::new(e.kind(), format!("bind {addr}: {e}{hint}")));
    }
    if timestamps {
        if let Err(e) = setsockopt(&owned, sockopt::ReceiveTimestampns, &true) {
            let e = io::Error::from(e);
            warnings.push(format!(
                "SO_TIMESTAMPNS refused ({e}): datagrams of different group sockets are read \
                 socket by socket, which can reorder a channel's frames and cause needless NACKs"
            ));
        }
    }
    let gso = if cfg.gso && cfg.gso_segments_max > 1 {
        probe_gso(&owned)
    } else {
        Err(OffloadRefused::Disabled)
    };
    let gro = if cfg.gro {
        enable_gro(&owned)
    } else {
        Err(OffloadRefused::Disabled)
    };
    Ok(Opened {
        socket: UdpSocket::from(owned),
        recv_buffer_bytes,
        send_buffer_bytes,
        gso,
        gro,
        warnings,
    })
}

/// Sends one datagram from `fd` to `dest` without blocking (the AF_XDP
/// path's way through the kernel for a peer whose MAC is not known yet).
pub(crate) fn send_one(fd: RawFd, dest: SocketAddr, bytes: &[u8]) -> io::Result<()> {
    sendto(
        fd,
        bytes,
        &SockaddrStorage::from(dest),
        MsgFlags::MSG_DONTWAIT,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_addr_round_trips() {
        for s in ["127.0.0.1:7400", "[::1]:9", "10.1.2.3:65535"] {
            let a: SocketAddr = s.parse().unwrap();
            assert_eq!(RawAddr::from_std(&a).to_std(), Some(a));
        }
    }

    #[test]
    fn bound_socket_reports_its_port_and_buffers() {
        let cfg = UdpConfig {
            recv_buffer_bytes: 64 << 10,
            send_buffer_bytes: 64 << 10,
            ..Default::default()
        };
        let o = open("127.0.0.1:0".parse().unwrap(), &cfg, false).unwrap();
        assert_ne!(o.socket.local_addr().unwrap().port(), 0);
        assert!(o.recv_buffer_bytes >= 64 << 10, "{}", o.recv_buffer_bytes);
        assert!(o.warnings.is_empty(), "{:?}", o.warnings);
    }

    /// Another socket binding the port with SO_REUSEADDR and SO_REUSEPORT
    /// set: what a process that wants the group's datagrams would try.
    fn bind_shared(addr: SocketAddr) -> io::Result<OwnedFd> {
        let fd = socket(
            AddressFamily::Inet,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC,
            None,
        )?;
        setsockopt(&fd, sockopt::ReuseAddr, &true)?;
        setsockopt(&fd, sockopt::ReusePort, &true)?;
        bind(fd.as_raw_fd(), &SockaddrStorage::from(addr))?;
        Ok(fd)
    }

    #[test]
    fn a_group_socket_is_bound_exclusively() {
        let o = open("127.0.0.1:0".parse().unwrap(), &UdpConfig::default(), false).unwrap();
        let addr = o.socket.local_addr().unwrap();
        for other in [addr, SocketAddr::from(([0, 0, 0, 0], addr.port()))] {
            let e = bind_shared(other).expect_err("the port is not shared");
            assert_eq!(e.raw_os_error(), Some(libc::EADDRINUSE), "{other}: {e}");
        }
        // And the other way round: a port someone holds is refused, named.
        let e = open(addr, &UdpConfig::default(), false)
            .err()
            .expect("taken");
        assert!(e.to_string().contains(&format!("bind {addr}")), "{e}");
    }

    #[test]
    fn a_capped_buffer_is_reported_with_the_sysctl() {
        let asked = 1 << 30;
        let Some(max) = core_sysctl("rmem_max") else {
            return;
        };
        if max >= asked as u64 {
            return;
        }
        let cfg = UdpConfig {
            recv_buffer_bytes: asked,
            ..Default::default()
        };
        let o = open("127.0.0.1:0".parse().unwrap(), &cfg, false).unwrap();
        assert!(o.recv_buffer_bytes < asked);
        assert!(
            o.warnings.iter().any(|w| w.contains("net.core.rmem_max")),
            "{:?}",
            o.warnings
        );
    }
}
