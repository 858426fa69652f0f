//! The interface under an AF_XDP socket: which one holds the node's
//! local address ([`interface_of`]), with its index, MAC, MTU and receive
//! queues. AF_XDP hands the driver raw Ethernet frames, so it must know
//! the interface (to bind its queues) and write its own MAC as the
//! source of every frame. The peers' MACs, the other half of a frame's
//! link-layer addressing, come from the kernel's neighbour table, which
//! [`super::neighbours`] reads.
//!
//! - **Only reads.** getifaddrs, SIOCGIFMTU, ETHTOOL_GCHANNELS and sysfs
//!   are asked; nothing here changes an interface, its addresses or its
//!   queues.
//! - **Network namespaces.** getifaddrs and the ioctls follow the calling
//!   thread's namespace; sysfs shows the namespace of whoever mounted it.
//!   The rx queue count is asked of the driver (ETHTOOL_GCHANNELS); only
//!   a driver that does not answer is looked up in sysfs, after checking
//!   that its entry is this namespace's device (same ifindex and MAC),
//!   and refused otherwise.

use nix::ifaddrs::{getifaddrs, InterfaceAddress};
use nix::net::if_::{if_nametoindex, InterfaceFlags};
use nix::sys::socket::{socket, AddressFamily, LinkAddr, SockFlag, SockType};
use std::io;
use std::mem::{size_of, zeroed};
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

/// An Ethernet (link-layer) address.
pub type Mac = [u8; 6];

/// The interface that carries a local address, with what an AF_XDP
/// socket on it needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    /// The device name (`eth0`), not an IPv4 alias label (`eth0:1`).
    pub name: String,
    /// The interface index, as if_nametoindex gives it.
    pub index: u32,
    /// The interface's own MAC: the source address of our frames.
    pub mac: Mac,
    /// The MTU: the largest IP packet a frame may carry.
    pub mtu: u32,
    /// Whether this is a loopback device (IFF_LOOPBACK).
    pub loopback: bool,
    /// Receive queues in use (`/sys/class/net/<name>/queues/rx-*`): an
    /// AF_XDP socket binds one queue, so seeing all traffic takes one
    /// socket per queue.
    pub queues: u32,
}

/// Finds the interface that carries the local address `ip` in the calling
/// thread's network namespace.
///
/// Errors: `InvalidInput` for the unspecified address or one held by
/// several interfaces, `NotFound` if no interface holds it (or sysfs shows
/// another namespace), `Unsupported` for a device without an Ethernet
/// address (tun, WireGuard), and the errors of the underlying calls.
pub fn interface_of(ip: IpAddr) -> io::Result<Interface> {
    // A v4-mapped IPv6 address (what a dual-stack socket reports) is the
    // IPv4 address on the interface.
    let ip = ip.to_canonical();
    if ip.is_unspecified() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{ip} is the unspecified address: AF_XDP binds the queues of one interface, \
                 so it needs the concrete local address the node uses"
            ),
        ));
    }
    let addrs: Vec<InterfaceAddress> = getifaddrs()?.collect();
    // getifaddrs names an IPv4 address by its label, which may be an alias
    // ("eth0:1"); the device is the part before the colon (device names
    // cannot contain one).
    let mut holders: Vec<String> = Vec::new();
    for entry in &addrs {
        if entry_ip(entry) == Some(ip) {
            let label = &entry.interface_name;
            let device = label.split(':').next().unwrap_or_default().to_string();
            if !holders.contains(&device) {
                holders.push(device);
            }
        }
    }
    let device = match holders.as_slice() {
        [] => {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no interface has the address {ip} (in this network namespace)"),
            ))
        }
        [one] => one.clone(),
        several => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the address {ip} is on several interfaces ({}): AF_XDP binds one, \
                     so give an address only one of them has",
                    several.join(", ")
                ),
            ))
        }
    };
    let link = addrs
        .iter()
        .find(|e| link_addr(e).is_some() && e.interface_name == device)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{ip} is on {device}, but getifaddrs lists no link-layer entry for it"),
            )
        })?;
    let name = link.interface_name.clone();
    let mac = link_mac(link).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{name} (holding {ip}) has no Ethernet address: AF_XDP frames need one"),
        )
    })?;
    let index = index_of(&name)?;
    let mtu = mtu_of(&name)?;
    let queues = rx_queues(&name, index, mac)?;
    Ok(Interface {
        loopback: link.flags.contains(InterfaceFlags::IFF_LOOPBACK),
        name,
        index,
        mac,
        mtu,
        queues,
    })
}

/// The IP address of a getifaddrs entry, if it has one.
fn entry_ip(e: &InterfaceAddress) -> Option<IpAddr> {
    let a = e.address.as_ref()?;
    if let Some(sin) = a.as_sockaddr_in() {
        return Some(IpAddr::V4(sin.ip()));
    }
    a.as_sockaddr_in6().map(|sin6| IpAddr::V6(sin6.ip()))
}

/// The link-layer (AF_PACKET) address of a getifaddrs entry.
fn link_addr(e: &InterfaceAddress) -> Option<&LinkAddr> {
    e.address.as_ref()?.as_link_addr()
}

/// The MAC of an AF_PACKET entry, if its link-layer address is Ethernet's
/// six bytes.
fn link_mac(e: &InterfaceAddress) -> Option<Mac> {
    let sll = link_addr(e)?;
    if sll.halen() != size_of::<Mac>() {
        return None;
    }
    sll.addr()
}

/// The interface index of `name` (if_nametoindex), the error naming it.
pub(super) fn index_of(name: &str) -> io::Result<u32> {
    if_nametoindex(name).map_err(|e| {
        let e = io::Error::from(e);
        io::Error::new(e.kind(), format!("if_nametoindex({name}): {e}"))
    })
}

/// The MTU by SIOCGIFMTU: the ioctl answers for the caller's network
/// namespace, which sysfs may not.
fn mtu_of(name: &str) -> io::Result<u32> {
    let (fd, mut req) = ifreq_for(name)?;
    // SAFETY: SIOCGIFMTU reads the NUL-terminated name (shorter than
    // IFNAMSIZ, checked above) and writes ifru_mtu of `req`.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFMTU as _, &mut req) } < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("SIOCGIFMTU on {name}: {e}"),
        ));
    }
    // SAFETY: SIOCGIFMTU filled in the mtu member of the union.
    let mtu = unsafe { req.ifr_ifru.ifru_mtu };
    u32::try_from(mtu).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{name} reports MTU {mtu}"),
        )
    })
}

/// A datagram socket for interface ioctls and an `ifreq` naming `name`
/// (refused unless it fits IFNAMSIZ with its NUL).
fn ifreq_for(name: &str) -> io::Result<(OwnedFd, libc::ifreq)> {
    if name.len() >= libc::IFNAMSIZ || name.as_bytes().contains(&0) {
        return Err(invalid_name(name));
    }
    let fd = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    // SAFETY: ifreq is plain data; all-zero is valid.
    let mut req: libc::ifreq = unsafe { zeroed() };
    for (dst, &src) in req.ifr_name.iter_mut().zip(name.as_bytes()) {
        *dst = src as libc::c_char;
    }
    Ok((fd, req))
}

fn invalid_name(name: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{name:?} is not a valid interface name"),
    )
}

/// The rx queues in use, from sysfs, after checking that the sysfs entry
/// is this namespace's device: in a thread that switched namespaces, or
/// under a sysfs mounted elsewhere, `/sys/class/net/<name>` can be another
/// device of the same name, and its queue count would be wrong.
///
/// Asked of the driver first (`ETHTOOL_GCHANNELS`, which follows the
/// calling thread's namespace like the MTU's ioctl); sysfs only where the
/// driver does not say.
fn rx_queues(name: &str, index: u32, mac: Mac) -> io::Result<u32> {
    match channels_of(name) {
        Ok(Some(n)) => Ok(n),
        Ok(None) => rx_queues_in(Path::new("/sys/class/net"), name, index, mac),
        Err(e) => Err(e),
    }
}

/// `SIOCETHTOOL` (linux/sockios.h).
const SIOCETHTOOL: libc::c_ulong = 0x8946;
/// `ETHTOOL_GCHANNELS` (linux/ethtool.h).
const ETHTOOL_GCHANNELS: u32 = 0x0000_003c;

/// `struct ethtool_channels`.
#[repr(C)]
#[derive(Default)]
struct EthtoolChannels {
    cmd: u32,
    max_rx: u32,
    max_tx: u32,
    max_other: u32,
    max_combined: u32,
    rx_count: u32,
    tx_count: u32,
    other_count: u32,
    combined_count: u32,
}

/// The receive queues the driver reports (`None`: it does not answer
/// ETHTOOL_GCHANNELS). NICs report combined queues, veth reports rx and
/// combined as the same queues: the larger of the two is the count.
fn channels_of(name: &str) -> io::Result<Option<u32>> {
    let (fd, mut req) = ifreq_for(name)?;
    let mut ch = EthtoolChannels {
        cmd: ETHTOOL_GCHANNELS,
        ..Default::default()
    };
    req.ifr_ifru.ifru_data = &mut ch as *mut EthtoolChannels as *mut libc::c_char;
    // SAFETY: SIOCETHTOOL reads the name and fills `ch`, which outlives
    // the call.
    if unsafe { libc::ioctl(fd.as_raw_fd(), SIOCETHTOOL as _, &mut req) } < 0 {
        let e = io::Error::last_os_error();
        if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EINVAL)) {
            return Ok(None);
        }
        return Err(io::Error::new(
            e.kind(),
            format!("ETHTOOL_GCHANNELS on {name}: {e}"),
        ));
    }
    let n = ch.rx_count.max(ch.combined_count);
    Ok((n > 0).then_some(n))
}

/// [`rx_queues`] under `class_net` (a stand-in for /sys/class/net in
/// tests).
fn rx_queues_in(class_net: &Path, name: &str, index: u32, mac: Mac) -> io::Result<u32> {
    let dir = class_net.join(name);
    let foreign = |what: String| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{} {what}: sysfs is not mounted for this network namespace \
                 (mount it there, as `ip netns exec` does)",
                dir.display()
            ),
        )
    };
    let shown_index = match std::fs::read_to_string(dir.join("ifindex")) {
        Ok(s) => s.trim().parse::<u32>().ok(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(foreign("does not exist".into()))
        }
        Err(e) => return Err(e),
    };
    let shown_mac = std::fs::read_to_string(dir.join("address"))?;
    if shown_index != Some(index) || parse_mac(shown_mac.trim()) != Some(mac) {
        return Err(foreign(format!(
            "is another device (ifindex {shown_index:?}, address {}; here {index}, {})",
            shown_mac.trim(),
            format_mac(mac)
        )));
    }
    let mut queues = 0u32;
    for entry in std::fs::read_dir(dir.join("queues"))? {
        if entry?.file_name().to_string_lossy().starts_with("rx-") {
            queues += 1;
        }
    }
    // Every device receives on at least one queue, listed or not.
    Ok(queues.max(1))
}

/// Parses `aa:bb:cc:dd:ee:ff`.
fn parse_mac(s: &str) -> Option<Mac> {
    let mut mac = [0; 6];
    let mut parts = s.split(':');
    for byte in &mut mac {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// Formats a MAC as `aa:bb:cc:dd:ee:ff`.
fn format_mac(mac: Mac) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::xdp::neighbours::Neighbours;
    use std::process::Command;
    use std::time::Instant;

    #[test]
    fn loopback_address_is_on_lo() {
        let lo = interface_of("127.0.0.1".parse().unwrap()).unwrap();
        assert_eq!(lo.name, "lo");
        assert!(lo.loopback);
        assert_eq!(lo.index, index_of("lo").unwrap());
        // SAFETY: a NUL-terminated literal.
        assert_eq!(lo.index, unsafe { libc::if_nametoindex(c"lo".as_ptr()) });
        assert_eq!(lo.mac, [0; 6]);
        assert!(lo.mtu >= 1280, "{lo:?}");
        assert!(lo.queues >= 1, "{lo:?}");
        // The v4-mapped form names the same address.
        assert_eq!(
            interface_of("::ffff:127.0.0.1".parse().unwrap()).unwrap(),
            lo
        );
    }

    #[test]
    fn address_nobody_has_is_not_found() {
        let e = interface_of("192.0.2.77".parse().unwrap()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        assert!(e.to_string().contains("192.0.2.77"), "{e}");
    }

    #[test]
    fn unspecified_address_is_refused() {
        for ip in ["0.0.0.0", "::"] {
            let e = interface_of(ip.parse().unwrap()).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
            assert!(e.to_string().contains("AF_XDP"), "{e}");
        }
    }

    #[test]
    fn mac_text_round_trips() {
        let mac = [0x02, 0, 0xab, 0xcd, 0xef, 0x10];
        assert_eq!(format_mac(mac), "02:00:ab:cd:ef:10");
        assert_eq!(parse_mac("02:00:ab:cd:ef:10"), Some(mac));
        assert_eq!(parse_mac("02:00:ab:cd:ef"), None);
        assert_eq!(parse_mac("02:00:ab:cd:ef:10:11"), None);
        assert_eq!(parse_mac("02:00:ab:cd:ef:zz"), None);
    }

    #[test]
    fn rx_queues_come_only_from_the_same_device() {
        let sys = tempfile::tempdir().unwrap();
        let mac = [2, 0, 0, 0, 0, 5];
        let dev = sys.path().join("eth9");
        std::fs::create_dir_all(dev.join("queues")).unwrap();
        for q in ["rx-0", "rx-1", "tx-0", "tx-1", "tx-2"] {
            std::fs::create_dir(dev.join("queues").join(q)).unwrap();
        }
        std::fs::write(dev.join("ifindex"), "5\n").unwrap();
        std::fs::write(dev.join("address"), "02:00:00:00:00:05\n").unwrap();
        assert_eq!(rx_queues_in(sys.path(), "eth9", 5, mac).unwrap(), 2);
        // Another namespace's eth9: another index, or another address.
        for (index, mac) in [(6, mac), (5, [2, 0, 0, 0, 0, 6])] {
            let e = rx_queues_in(sys.path(), "eth9", index, mac).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
            assert!(e.to_string().contains("another device"), "{e}");
        }
        let e = rx_queues_in(sys.path(), "eth8", 5, mac).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        assert!(e.to_string().contains("does not exist"), "{e}");
        // No rx-* listed (a kernel without them in sysfs): still one.
        for q in ["rx-0", "rx-1"] {
            std::fs::remove_dir(dev.join("queues").join(q)).unwrap();
        }
        assert_eq!(rx_queues_in(sys.path(), "eth9", 5, mac).unwrap(), 1);
    }

    // --- a veth pair in a network namespace of its own (root) ---

    /// A network namespace made for one test; deleted on drop, also when
    /// the test panics.
    struct Netns(String);

    impl Drop for Netns {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }

    /// Runs `ip` with `args`, returning its stdout or why it failed.
    fn ip(args: &[&str]) -> Result<String, String> {
        let out = Command::new("ip")
            .args(args)
            .output()
            .map_err(|e| format!("cannot run ip: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "ip {} failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Deletes the namespaces of earlier runs killed before their guard
    /// ran (`qtn<pid>` of a process that is gone).
    fn remove_stale_namespaces() {
        let Ok(dir) = std::fs::read_dir("/var/run/netns") else {
            return;
        };
        for entry in dir.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(pid) = name.strip_prefix("qtn") else {
                continue;
            };
            if !pid.is_empty()
                && pid.bytes().all(|b| b.is_ascii_digit())
                && !Path::new(&format!("/proc/{pid}")).exists()
            {
                let _ = ip(&["netns", "del", &name]);
            }
        }
    }

    /// Makes the calling thread see sysfs for its network namespace: a
    /// private mount namespace (for this thread only), with changes kept
    /// from the host's mounts, and a fresh sysfs on /sys, as `ip netns
    /// exec` does.
    fn mount_own_sysfs() {
        // SAFETY: plain syscalls with NUL-terminated literals; they change
        // only this thread's mount namespace, results checked.
        unsafe {
            assert_eq!(
                libc::unshare(libc::CLONE_NEWNS),
                0,
                "unshare: {}",
                io::Error::last_os_error()
            );
            let rc = libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_SLAVE,
                std::ptr::null(),
            );
            assert_eq!(rc, 0, "make / a slave: {}", io::Error::last_os_error());
            // /sys may not be a mount point of its own; then there is
            // nothing to detach.
            libc::umount2(c"/sys".as_ptr(), libc::MNT_DETACH);
            let rc = libc::mount(
                c"sysfs".as_ptr(),
                c"/sys".as_ptr(),
                c"sysfs".as_ptr(),
                0,
                std::ptr::null(),
            );
            assert_eq!(rc, 0, "mount sysfs: {}", io::Error::last_os_error());
        }
    }

    #[test]
    fn veth_in_a_namespace_resolves_its_neighbours() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: not root (a network namespace and veth pair need CAP_SYS_ADMIN)");
            return;
        }
        remove_stale_namespaces();
        let pid = std::process::id();
        let ns = format!("qtn{pid}");
        let (a, b) = (format!("qt-nb{pid}a"), format!("qt-nb{pid}b"));
        let alias = format!("{a}:x");
        // As root (CI's case) a namespace that cannot be made is a failure.
        ip(&["netns", "add", &ns]).unwrap_or_else(|e| panic!("a network namespace: {e}"));
        let guard = Netns(ns.clone());
        // Everything below happens inside the namespace: nothing touches
        // the host's interfaces, addresses or neighbour table.
        let setup: &[&[&str]] = &[
            &[
                "link",
                "add",
                &a,
                "numrxqueues",
                "3",
                "numtxqueues",
                "3",
                "type",
                "veth",
                "peer",
                "name",
                &b,
            ],
            &["link", "set", &a, "mtu", "1400"],
            &["addr", "add", "10.77.0.1/24", "dev", &a],
            &["addr", "add", "fd77::1/64", "dev", &a, "nodad"],
            // The same address again (another prefix), under an alias
            // label, and on both ends of the pair.
            &["addr", "add", "10.77.0.1/16", "dev", &a],
            &["addr", "add", "10.77.0.5/24", "dev", &a, "label", &alias],
            &["addr", "add", "10.77.0.6/32", "dev", &a],
            &["addr", "add", "10.77.0.6/32", "dev", &b],
            &["link", "set", &a, "up"],
            &["link", "set", &b, "up"],
            &["link", "set", "lo", "up"],
            &[
                "neigh",
                "add",
                "10.77.0.2",
                "lladdr",
                "02:00:00:00:00:02",
                "dev",
                &a,
                "nud",
                "permanent",
            ],
            &[
                "neigh",
                "add",
                "fd77::2",
                "lladdr",
                "02:00:00:00:00:03",
                "dev",
                &a,
                "nud",
                "permanent",
            ],
            // Unusable: a lookup must not report it.
            &["neigh", "add", "10.77.0.3", "dev", &a, "nud", "incomplete"],
        ];
        for args in setup {
            let mut full = vec!["-n", ns.as_str()];
            full.extend_from_slice(args);
            ip(&full).unwrap();
        }
        // What `ip` says about the device, independently of the code
        // under test.
        let shown: serde_json::Value =
            serde_json::from_str(&ip(&["-n", &ns, "-j", "link", "show", "dev", &a]).unwrap())
                .unwrap();
        let want_index = shown[0]["ifindex"].as_u64().unwrap() as u32;
        let want_mac = parse_mac(shown[0]["address"].as_str().unwrap()).unwrap();
        assert_eq!(shown[0]["mtu"].as_u64(), Some(1400));

        let ns_path = format!("/var/run/netns/{ns}");
        let checks = std::thread::spawn(move || {
            let file = std::fs::File::open(&ns_path).unwrap();
            // SAFETY: setns on an open namespace file; it moves only this
            // thread, which is discarded at the end.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", io::Error::last_os_error());
            let v4: IpAddr = "10.77.0.1".parse().unwrap();

            let want = Interface {
                name: a.clone(),
                index: want_index,
                mac: want_mac,
                mtu: 1400,
                loopback: false,
                queues: 3,
            };
            // The host's sysfs does not know the namespace's veth, but
            // the driver's answer (ETHTOOL_GCHANNELS) follows the thread.
            assert_eq!(interface_of(v4).unwrap(), want);
            mount_own_sysfs();
            assert_eq!(interface_of(v4).unwrap(), want);
            assert_eq!(interface_of("fd77::1".parse().unwrap()).unwrap(), want);
            assert_eq!(interface_of("10.77.0.5".parse().unwrap()).unwrap(), want);
            let e = interface_of("10.77.0.6".parse().unwrap()).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
            assert!(e.to_string().contains("several"), "{e}");
            let lo = interface_of("::1".parse().unwrap()).unwrap();
            assert!(lo.loopback && lo.name == "lo", "{lo:?}");
            // A neighbour's address is not a local one.
            assert_eq!(
                interface_of("10.77.0.2".parse().unwrap())
                    .unwrap_err()
                    .kind(),
                io::ErrorKind::NotFound
            );

            let mut n = Neighbours::open().unwrap();
            let ifindex = want.index;
            assert_eq!(
                n.lookup(ifindex, "10.77.0.2".parse().unwrap()).unwrap(),
                Some([2, 0, 0, 0, 0, 2])
            );
            assert_eq!(
                n.lookup(ifindex, "fd77::2".parse().unwrap()).unwrap(),
                Some([2, 0, 0, 0, 0, 3])
            );
            assert_eq!(
                n.lookup(ifindex, "10.77.0.9".parse().unwrap()).unwrap(),
                None
            );
            assert_eq!(
                n.lookup(ifindex, "10.77.0.3".parse().unwrap()).unwrap(),
                None
            );
            // Another interface's table has none of them.
            assert_eq!(
                n.lookup(lo.index, "10.77.0.2".parse().unwrap()).unwrap(),
                None
            );
            let started = Instant::now();
            let mut all = n.dump(ifindex).unwrap();
            let took = started.elapsed();
            all.sort();
            let mut expected: Vec<(IpAddr, Mac)> = vec![
                ("10.77.0.2".parse().unwrap(), [2, 0, 0, 0, 0, 2]),
                ("fd77::2".parse().unwrap(), [2, 0, 0, 0, 0, 3]),
            ];
            expected.sort();
            // Entries the kernel added itself (IPv6 multicast, routers)
            // may sit beside ours; ours must be there.
            for e in &expected {
                assert!(all.contains(e), "{e:?} not in {all:?}");
            }
            eprintln!("dump of {} entries took {took:?}", all.len());
        });
        let result = checks.join();
        drop(guard);
        if let Err(panic) = result {
            std::panic::resume_unwind(panic);
        }
    }
}
