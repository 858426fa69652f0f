//! Socket-level counters of a driver, and the kernel's UDP counters from
//! /proc/net/snmp (where datagrams dropped for a full receive buffer show
//! up, which no socket call reports).

use std::io;

/// Counters of one [`UdpDriver`](super::UdpDriver), at the socket level:
/// a GSO send of 40 segments counts 40 datagrams and one `gso_sends`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Datagrams handed to the kernel.
    pub datagrams_sent: u64,
    /// Bytes of those datagrams (UDP payload).
    pub bytes_sent: u64,
    /// `sendmmsg` calls.
    pub send_calls: u64,
    /// Messages sent with more than one GSO segment.
    pub gso_sends: u64,
    /// Times GSO was turned off at run time (0 or 1).
    pub gso_fallbacks: u64,
    /// Datagrams dropped because the send failed (not EAGAIN).
    pub send_errors: u64,
    /// Send errors described in notices so far (the rest are only counted).
    pub send_errors_noticed: u64,
    /// `sendmmsg` calls that found the socket buffer full (EAGAIN).
    pub send_would_block: u64,
    /// Datagrams dropped because the peer map has no address for them.
    pub unroutable_dropped: u64,
    /// Datagrams received (GRO messages split into their datagrams).
    pub datagrams_received: u64,
    /// Bytes of those datagrams.
    pub bytes_received: u64,
    /// `recvmmsg` calls (including those that found nothing).
    pub recv_calls: u64,
    /// Messages received that carried more than one GRO segment.
    pub gro_receives: u64,
    /// `recvmmsg` failures other than EAGAIN.
    pub recv_errors: u64,
    /// Messages cut short by the buffer (cannot happen with UDP's 64 KiB
    /// limit; counted in case it does).
    pub recv_truncated: u64,
    /// Datagrams the endpoint dropped (bad MAC, stale epoch, ...); the
    /// endpoint's own stats say which.
    pub endpoint_rejected: u64,
    /// Whether GSO is in use now.
    pub gso_enabled: bool,
    /// Whether GRO is on for every socket.
    pub gro_enabled: bool,
}

/// The kernel's UDP counters for this network namespace, IPv4 and IPv6
/// summed (/proc/net/snmp `Udp:` and /proc/net/snmp6 `Udp6*`). They count
/// every UDP socket of the host: compare two readings around a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UdpSnmp {
    /// Datagrams delivered to sockets.
    pub in_datagrams: u64,
    /// Datagrams to a port with no socket.
    pub no_ports: u64,
    /// Datagrams dropped on receive for any reason (includes the next).
    pub in_errors: u64,
    /// Datagrams dropped because a socket's receive buffer was full:
    /// SO_RCVBUF (and net.core.rmem_max) too small, or the reader too slow.
    pub rcvbuf_errors: u64,
    /// Datagrams dropped because a socket's send buffer was full.
    pub sndbuf_errors: u64,
    /// Datagrams sent.
    pub out_datagrams: u64,
}

impl UdpSnmp {
    /// Reads the counters now. IPv6 is added where /proc/net/snmp6 exists.
    pub fn read() -> io::Result<UdpSnmp> {
        let v4 = std::fs::read_to_string("/proc/net/snmp")?;
        let mut s = parse_snmp(&v4).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "/proc/net/snmp has no Udp: lines",
            )
        })?;
        if let Ok(v6) = std::fs::read_to_string("/proc/net/snmp6") {
            let s6 = parse_snmp6(&v6);
            s.in_datagrams += s6.in_datagrams;
            s.no_ports += s6.no_ports;
            s.in_errors += s6.in_errors;
            s.rcvbuf_errors += s6.rcvbuf_errors;
            s.sndbuf_errors += s6.sndbuf_errors;
            s.out_datagrams += s6.out_datagrams;
        }
        Ok(s)
    }

    /// What happened since `earlier` (counters only grow).
    pub fn since(&self, earlier: &UdpSnmp) -> UdpSnmp {
        UdpSnmp {
            in_datagrams: self.in_datagrams.saturating_sub(earlier.in_datagrams),
            no_ports: self.no_ports.saturating_sub(earlier.no_ports),
            in_errors: self.in_errors.saturating_sub(earlier.in_errors),
            rcvbuf_errors: self.rcvbuf_errors.saturating_sub(earlier.rcvbuf_errors),
            sndbuf_errors: self.sndbuf_errors.saturating_sub(earlier.sndbuf_errors),
            out_datagrams: self.out_datagrams.saturating_sub(earlier.out_datagrams),
        }
    }
}

/// Parses the `Udp:` header line and the value line after it.
fn parse_snmp(text: &str) -> Option<UdpSnmp> {
    let mut lines = text.lines().filter(|l| l.starts_with("Udp:"));
    let names: Vec<&str> = lines.next()?.split_whitespace().skip(1).collect();
    let values: Vec<u64> = lines
        .next()?
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    let get = |name: &str| {
        names
            .iter()
            .position(|n| *n == name)
            .and_then(|i| values.get(i).copied())
            .unwrap_or(0)
    };
    Some(UdpSnmp {
        in_datagrams: get("InDatagrams"),
        no_ports: get("NoPorts"),
        in_errors: get("InErrors"),
        rcvbuf_errors: get("RcvbufErrors"),
        sndbuf_errors: get("SndbufErrors"),
        out_datagrams: get("OutDatagrams"),
    })
}

/// Parses the `Udp6Name value` lines.
fn parse_snmp6(text: &str) -> UdpSnmp {
    let mut s = UdpSnmp::default();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(name), Some(v)) = (it.next(), it.next()) else {
            continue;
        };
        let v: u64 = v.parse().unwrap_or(0);
        match name {
            "Udp6InDatagrams" => s.in_datagrams = v,
            "Udp6NoPorts" => s.no_ports = v,
            "Udp6InErrors" => s.in_errors = v,
            "Udp6RcvbufErrors" => s.rcvbuf_errors = v,
            "Udp6SndbufErrors" => s.sndbuf_errors = v,
            "Udp6OutDatagrams" => s.out_datagrams = v,
            _ => {}
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_net_snmp() {
        let text = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
            Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors\n\
            Udp: 100 2 7 90 5 1 0\n\
            UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors\n\
            UdpLite: 0 0 0 0 0 0 0\n";
        let s = parse_snmp(text).unwrap();
        assert_eq!(
            s,
            UdpSnmp {
                in_datagrams: 100,
                no_ports: 2,
                in_errors: 7,
                rcvbuf_errors: 5,
                sndbuf_errors: 1,
                out_datagrams: 90,
            }
        );
        let s6 = parse_snmp6("Udp6InDatagrams 4\nUdp6RcvbufErrors 3\nIp6InReceives 9\n");
        assert_eq!((s6.in_datagrams, s6.rcvbuf_errors), (4, 3));
        assert!(parse_snmp("nothing").is_none());
    }

    #[test]
    fn reads_this_host() {
        // /proc is there on every Linux host this crate runs on.
        let a = UdpSnmp::read().unwrap();
        let b = UdpSnmp::read().unwrap();
        let _ = b.since(&a);
    }
}
