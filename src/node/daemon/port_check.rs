//! Whether the ports a daemon is about to take are free, and if not, who
//! holds them: the daemon asks before it opens anything (a second
//! `quired` on the same config, or any process on a replication port,
//! must stop it with exit code 2 and one line naming the port, not split
//! the node's datagrams or fail half-started).
//!
//! It binds each port the way the runtime will (UDP without SO_REUSEADDR
//! or SO_REUSEPORT, TCP as `std::net::TcpListener` does) and closes it at
//! once; the real bind later is still the authority, this only gives the
//! refusal its words. The holder is found the way `ss -p` finds it: the
//! socket's inode in `/proc/net/{udp,udp6,tcp,tcp6}`, then the process
//! whose `/proc/PID/fd` links to `socket:[INODE]`, and its
//! `/proc/PID/comm`. Reading other users' `/proc/PID/fd` needs root; when
//! the holder cannot be seen the message says so.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, UdpSocket};
use std::path::Path;

/// The transport a port is claimed on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    /// A group's replication socket.
    Udp,
    /// A listener (clients, admin).
    Tcp,
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Proto::Udp => "udp",
            Proto::Tcp => "tcp",
        })
    }
}

/// One port the daemon will bind, and what for (for the message).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// UDP or TCP.
    pub proto: Proto,
    /// The address it binds.
    pub addr: SocketAddr,
    /// What uses it, in config terms (`group 1 (udp.base_port + 1)`).
    pub what: String,
}

/// A process holding a port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// Its pid.
    pub pid: u32,
    /// Its `/proc/PID/comm` (the executable's name, at most 15 bytes).
    pub comm: String,
}

/// A claimed port that is taken, and who holds it if that can be seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortInUse {
    /// The claim that failed.
    pub claim: Claim,
    /// The holding process, if found in /proc.
    pub holder: Option<Holder>,
}

impl fmt::Display for PortInUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.claim;
        write!(
            f,
            "{} port {} ({}, {}) is already in use",
            c.proto,
            c.addr.port(),
            c.addr,
            c.what
        )?;
        match &self.holder {
            Some(h) => write!(f, " by pid {} ({})", h.pid, h.comm)?,
            None => write!(
                f,
                "; no process holding it was found in /proc (another user's process needs \
                 root to see; try `ss -{}lpn 'sport = :{}'`)",
                if c.proto == Proto::Udp { "u" } else { "t" },
                c.addr.port()
            )?,
        }
        f.write_str(": is another quired running with this config? Not starting")
    }
}

/// The first of `claims` that cannot be bound because its port is taken
/// (EADDRINUSE), with its holder. Other bind errors (an address not of
/// this host, a privileged port) are left to the real bind to report.
pub fn find_taken(claims: &[Claim]) -> Option<PortInUse> {
    for c in claims {
        let taken = match c.proto {
            Proto::Udp => UdpSocket::bind(c.addr).err(),
            Proto::Tcp => TcpListener::bind(c.addr).err(),
        }
        .is_some_and(|e| e.kind() == std::io::ErrorKind::AddrInUse);
        if taken {
            return Some(PortInUse {
                claim: c.clone(),
                holder: holder(c.proto, c.addr),
            });
        }
    }
    None
}

/// The process holding a socket that conflicts with binding `addr` on
/// `proto` (same port; same address, or either side the wildcard), if
/// this process may see it. For TCP only listening sockets count.
pub fn holder(proto: Proto, addr: SocketAddr) -> Option<Holder> {
    holder_in(Path::new("/proc"), proto, addr)
}

/// [`holder`] under a given proc root (tests).
fn holder_in(proc_root: &Path, proto: Proto, addr: SocketAddr) -> Option<Holder> {
    let tables: [&str; 2] = match proto {
        Proto::Udp => ["net/udp", "net/udp6"],
        Proto::Tcp => ["net/tcp", "net/tcp6"],
    };
    let mut inodes = Vec::new();
    for t in tables {
        let Ok(text) = std::fs::read_to_string(proc_root.join(t)) else {
            continue;
        };
        inodes.extend(socket_inodes(&text, proto, addr));
    }
    if inodes.is_empty() {
        return None;
    }
    let wanted: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    let mut pids: Vec<u32> = std::fs::read_dir(proc_root)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    for pid in pids {
        let Ok(fds) = std::fs::read_dir(proc_root.join(format!("{pid}/fd"))) else {
            continue;
        };
        let holds = fds.filter_map(Result::ok).any(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|l| wanted.iter().any(|w| l.as_os_str() == w.as_str()))
        });
        if holds {
            let comm = std::fs::read_to_string(proc_root.join(format!("{pid}/comm")))
                .map_or_else(|_| "?".into(), |c| c.trim_end().to_string());
            return Some(Holder { pid, comm });
        }
    }
    None
}

/// Inodes of the sockets in one `/proc/net/{udp,tcp}[6]` table that
/// conflict with `addr`.
fn socket_inodes(text: &str, proto: Proto, addr: SocketAddr) -> Vec<u64> {
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 10 {
            continue;
        }
        let Some(local) = parse_local(f[1]) else {
            continue;
        };
        // 0A is TCP_LISTEN; a connected or closing socket on the port
        // does not keep a listener out.
        if proto == Proto::Tcp && f[3] != "0A" {
            continue;
        }
        let overlaps = local.port() == addr.port()
            && (local.ip() == addr.ip()
                || local.ip().is_unspecified()
                || addr.ip().is_unspecified()
                || local.ip() == mapped(addr.ip()));
        if overlaps {
            if let Ok(inode) = f[9].parse::<u64>() {
                if inode != 0 {
                    out.push(inode);
                }
            }
        }
    }
    out
}

/// `addr` as an IPv4-mapped IPv6 address, as a dual-stack socket lists it.
fn mapped(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V6(v4.to_ipv6_mapped()),
        v6 => v6,
    }
}

/// `0100007F:1F90` (IPv4) or 32 hex digits and a port (IPv6): the kernel
/// prints each 32-bit word of the address as it sits in memory.
fn parse_local(s: &str) -> Option<SocketAddr> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |h: &str| u32::from_str_radix(h, 16).ok().map(u32::to_ne_bytes);
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(ip)?)),
        32 => {
            let mut b = [0u8; 16];
            for k in 0..4 {
                b[4 * k..4 * k + 4].copy_from_slice(&word(&ip[8 * k..8 * k + 8])?);
            }
            IpAddr::V6(Ipv6Addr::from(b))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn udp(addr: &str) -> Claim {
        Claim {
            proto: Proto::Udp,
            addr: addr.parse().unwrap(),
            what: "group 0".into(),
        }
    }

    #[test]
    fn proc_addresses_parse() {
        if cfg!(target_endian = "little") {
            assert_eq!(
                parse_local("0100007F:1F90"),
                Some("127.0.0.1:8080".parse().unwrap())
            );
            assert_eq!(
                parse_local("00000000000000000000000001000000:0016"),
                Some("[::1]:22".parse().unwrap())
            );
        }
        assert_eq!(parse_local("zz:1"), None);
    }

    #[test]
    fn a_taken_udp_port_is_found_with_this_process_as_holder() {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = s.local_addr().unwrap();
        let taken = find_taken(&[udp("127.0.0.1:0"), udp(&addr.to_string())]).unwrap();
        assert_eq!(taken.claim.addr, addr);
        let h = taken.holder.clone().expect("our own socket is visible");
        assert_eq!(h.pid, std::process::id());
        let msg = taken.to_string();
        assert!(msg.contains(&format!("udp port {}", addr.port())), "{msg}");
        assert!(
            msg.contains(&format!("pid {}", std::process::id())),
            "{msg}"
        );
        drop(s);
        assert_eq!(find_taken(&[udp(&addr.to_string())]), None);
    }

    #[test]
    fn a_taken_tcp_listener_is_found_and_a_wildcard_claim_overlaps() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let claim = Claim {
            proto: Proto::Tcp,
            addr: SocketAddr::from(([0, 0, 0, 0], port)),
            what: "node.client_listen".into(),
        };
        let taken = find_taken(&[claim]).expect("a listener on the port");
        assert_eq!(taken.holder.map(|h| h.pid), Some(std::process::id()));
    }

    #[test]
    fn no_holder_is_said_so() {
        let p = PortInUse {
            claim: udp("127.0.0.1:7401"),
            holder: None,
        };
        let msg = p.to_string();
        assert!(msg.contains("udp port 7401"), "{msg}");
        assert!(msg.contains("no process holding it was found"), "{msg}");
    }
}
