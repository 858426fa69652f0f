//! Free ports on 127.0.0.1 for the daemons of a local cluster
//! (`LocalProcesses`, `LocalCluster`): probed with `bind(…:0)` and
//! recorded, so that no port is handed out twice by one process.

use std::net::{TcpListener, UdpSocket};

/// How many ports the kernel may offer before a search gives up.
const PORT_TRIES_MAX: usize = 1000;

/// Every port this process has handed to a daemon (TCP and UDP alike).
/// The kernel's `bind(…:0)` can offer a port again as soon as the probe
/// closes, so without this two nodes of one cluster (or of two clusters a
/// test starts side by side) could be given the same port, and the second
/// daemon to bind it exits just after it started.
static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// A TCP port free now and never handed out before by this process.
pub(crate) fn tcp() -> std::io::Result<u16> {
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..PORT_TRIES_MAX {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        if handed_out.insert(port) {
            return Ok(port);
        }
    }
    Err(std::io::Error::other(
        "no free TCP port not handed out already",
    ))
}

/// The first of `groups` consecutive UDP ports free now, none of them
/// handed out before by this process.
pub(crate) fn udp_run(groups: u32) -> std::io::Result<u16> {
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    'search: for _ in 0..PORT_TRIES_MAX {
        let base = UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port();
        if base as u32 + groups > 65_535 {
            continue;
        }
        let run = base..base + groups as u16;
        if run.clone().any(|p| handed_out.contains(&p)) {
            continue;
        }
        for g in 1..groups {
            if UdpSocket::bind(("127.0.0.1", base + g as u16)).is_err() {
                continue 'search;
            }
        }
        handed_out.extend(run);
        return Ok(base);
    }
    Err(std::io::Error::other("no run of free UDP ports"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ports picked one after another are never the same, though each
    /// probe closes before the next: with the kernel's random choice, 300
    /// picks from ~28,000 ephemeral ports would repeat one nineteen times
    /// in twenty without the record of what was handed out.
    #[test]
    fn no_port_is_handed_out_twice() {
        let tcp: Vec<u16> = (0..300).map(|_| tcp().unwrap()).collect();
        let udp: Vec<u16> = (0..100).map(|_| udp_run(3).unwrap()).collect();
        let mut all: Vec<u16> = tcp.clone();
        all.extend(udp.iter().flat_map(|&b| b..b + 3));
        let distinct: std::collections::BTreeSet<u16> = all.iter().copied().collect();
        assert_eq!(distinct.len(), all.len(), "a port was handed out twice");
    }
}
