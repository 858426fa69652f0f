//! The AF_XDP checks of `quire tune check`: what `net.backend = "auto"`
//! or `"xdp"` needs of the host for the groups' datagrams to bypass the
//! kernel's stack (`net::xdp`).
//!
//! - the kernel has AF_XDP sockets;
//! - the process may use them: CAP_NET_ADMIN, CAP_NET_RAW and CAP_BPF
//!   (or CAP_SYS_ADMIN, which older kernels ask instead of CAP_BPF);
//! - it may lock the UMEMs, loops × `net.xdp_umem_frames` × 4096 bytes,
//!   within RLIMIT_MEMLOCK (unless it has CAP_IPC_LOCK): twice that with
//!   `net.xdp_zero_copy`, whose refused attempt stays charged for a
//!   moment, and 1 MiB more for the WAL's io_uring rings, which the
//!   kernel charges to the same limit;
//! - `udp.bind` is the address of one interface that is not loopback;
//! - that interface's MTU holds `transport.mtu_bytes`, and
//!   `transport.mtu_bytes` fits a UMEM frame (at most 3826 bytes);
//! - the interface has a receive queue for every loop (loop i binds queue
//!   i).
//!
//! How much a finding weighs follows `net.backend`: with `"xdp"` the
//! daemon refuses to start (FAIL), with `"auto"` it runs on sockets and
//! says why (WARN); with no config each line only says what is there
//! (OK); with `"sockets"` nothing is checked. Privileges and limits are
//! those of the process running the check: run it as the daemon runs
//! (the `ExecStartPre=` line of `tuning/quired.service` does).

use super::{Check, Host, Status};
use crate::net::xdp::link::{self, Interface};
pub use crate::net::xdp::XDP_MTU_MAX;
use crate::net::xdp::{Backend, XDP_FRAME_BYTES};
use crate::node::daemon::config_file::DaemonConfig;
use std::net::IpAddr;

/// Capability bits of `CapEff` (linux/capability.h).
const CAP_NET_ADMIN: u32 = 12;
const CAP_NET_RAW: u32 = 13;
const CAP_IPC_LOCK: u32 = 14;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_BPF: u32 = 39;

const WHY_KERNEL: &str = "the groups' datagrams bypass the kernel's stack through AF_XDP sockets; without them the node runs on UDP sockets";
const WHY_PRIVILEGES: &str = "loading and attaching the XDP program needs CAP_BPF and CAP_NET_ADMIN, an AF_XDP socket CAP_NET_RAW";
const WHY_MEMLOCK: &str = "each loop's UMEM (net.xdp_umem_frames × 4096 bytes) is locked memory, charged to the daemon's user against RLIMIT_MEMLOCK unless it has CAP_IPC_LOCK; the WAL's io_uring rings are charged to the same limit";
const WHY_INTERFACE: &str = "AF_XDP binds the receive queues of the one interface holding udp.bind; loopback has no XDP path";
const WHY_MTU: &str = "a frame must fit one 4096-byte UMEM frame with the kernel's 256-byte headroom (no multi-buffer XDP), and the interface must carry transport.mtu_bytes";
const WHY_QUEUES: &str =
    "loop i binds its AF_XDP socket to receive queue i; a loop without a queue runs on sockets";

/// How a finding weighs for this config: `None` when nothing is checked.
fn weight(cfg: Option<&DaemonConfig>) -> Option<Status> {
    match cfg.map(|c| c.node.net.backend) {
        None => Some(Status::Ok),
        Some(Backend::Sockets) => None,
        Some(Backend::Auto) => Some(Status::Warn),
        Some(Backend::Xdp) => Some(Status::Fail),
    }
}

/// What the finding costs, for the `found` text.
fn consequence(bad: Status) -> &'static str {
    match bad {
        Status::Fail => "quired refuses to start (net.backend = \"xdp\")",
        Status::Warn => "the node runs on sockets",
        Status::Ok => "AF_XDP would not be used",
    }
}

/// The loops the node runs: one per distinct core its groups go to
/// (`NodeHandle::spawn_on`).
pub fn loops(cfg: &DaemonConfig) -> usize {
    if cfg.cores.is_empty() {
        return 1;
    }
    let mut cores: Vec<usize> = Vec::new();
    for g in &cfg.node.groups {
        let c = cfg.core_of(g.group);
        if !cores.contains(&c) {
            cores.push(c);
        }
    }
    cores.len().max(1)
}

/// Locked memory the node's UMEMs take, bytes.
pub fn umem_bytes(cfg: &DaemonConfig) -> u64 {
    loops(cfg) as u64 * u64::from(cfg.node.net.umem_frames) * u64::from(XDP_FRAME_BYTES)
}

/// Room left in RLIMIT_MEMLOCK for the WAL's io_uring rings, which the
/// kernel charges to the same limit (a few pages per group): with none,
/// the UMEMs take it all and the logs fall back to the portable backend.
pub const IO_URING_MARGIN_BYTES: u64 = 1 << 20;

/// The RLIMIT_MEMLOCK the config needs at start: the UMEMs, twice over
/// with `net.xdp_zero_copy` (a driver that refuses zero-copy leaves the
/// first UMEM charged until the kernel releases it, after the copy-mode
/// one is registered), and [`IO_URING_MARGIN_BYTES`].
pub fn memlock_needed(cfg: &DaemonConfig) -> u64 {
    let times = if cfg.node.net.zero_copy { 2 } else { 1 };
    umem_bytes(cfg) * times + IO_URING_MARGIN_BYTES
}

fn check(
    name: &str,
    status: Status,
    found: String,
    why: &'static str,
    fix: Option<String>,
) -> Check {
    Check {
        name: name.into(),
        status,
        found,
        why,
        fix: (status != Status::Ok).then_some(fix).flatten(),
        apply: None,
    }
}

impl Host {
    /// The AF_XDP checks for `cfg` (see the module doc).
    pub(super) fn xdp(&self, cfg: Option<&DaemonConfig>) -> Vec<Check> {
        let Some(bad) = weight(cfg) else {
            return vec![check(
                "AF_XDP",
                Status::Ok,
                "not used: net.backend = \"sockets\"".into(),
                WHY_KERNEL,
                None,
            )];
        };
        let status = self.read("/proc/self/status");
        let caps = status.as_deref().and_then(cap_eff);
        let mut out = vec![
            kernel(probe_af_xdp(), bad),
            privileges(caps, status.as_deref().and_then(euid), bad),
            memlock(
                cfg.map(memlock_needed),
                self.memlock_soft(),
                caps.is_some_and(|c| has(c, CAP_IPC_LOCK)),
                bad,
            ),
        ];
        if let Some(cfg) = cfg {
            let ip = cfg.node.udp.bind_ip;
            let found = if ip.is_unspecified() {
                Err(format!(
                    "udp.bind is {ip}: AF_XDP needs the address of one interface"
                ))
            } else {
                link::interface_of(ip).map_err(|e| e.to_string())
            };
            let iface = interface(ip, found, bad, &mut out);
            if let Some(iface) = iface {
                out.push(mtu(&iface, cfg.node.transport.mtu_bytes, bad));
                out.push(queues(&iface, loops(cfg), bad));
            }
        }
        out
    }

    /// The soft RLIMIT_MEMLOCK in bytes (`u64::MAX`: unlimited), from
    /// `/proc/self/limits`.
    fn memlock_soft(&self) -> Option<u64> {
        let text = self.read("/proc/self/limits")?;
        let which = "Max locked memory";
        let line = text.lines().find(|l| l.starts_with(which))?;
        let v = line[which.len()..].split_whitespace().next()?;
        if v == "unlimited" {
            Some(u64::MAX)
        } else {
            v.parse().ok()
        }
    }
}

/// Opens and closes an AF_XDP socket: `Err(errno)` if refused.
fn probe_af_xdp() -> Result<(), i32> {
    use std::os::fd::FromRawFd;
    // SAFETY: socket(2) takes no pointers; a descriptor it returns is
    // new and owned here alone (closed when dropped, at once).
    let fd = unsafe {
        let fd = libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0);
        (fd >= 0).then(|| std::os::fd::OwnedFd::from_raw_fd(fd))
    };
    match fd {
        Some(_) => Ok(()),
        None => Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)),
    }
}

/// The kernel's answer to `socket(AF_XDP)`.
fn kernel(probe: Result<(), i32>, bad: Status) -> Check {
    let (status, found) = match probe {
        Ok(()) => (Status::Ok, "available".to_string()),
        // Present: whether this process may use it is the next check.
        Err(libc::EPERM) | Err(libc::EACCES) => (
            Status::Ok,
            "present (this process may not open a socket: see the privileges)".into(),
        ),
        Err(libc::EAFNOSUPPORT) => (
            bad,
            format!(
                "refused with EAFNOSUPPORT (no CONFIG_XDP_SOCKETS, or a sandbox without AF_XDP): {}",
                consequence(bad)
            ),
        ),
        Err(e) => (
            bad,
            format!(
                "socket(AF_XDP) failed: {}: {}",
                std::io::Error::from_raw_os_error(e),
                consequence(bad)
            ),
        ),
    };
    check(
        "AF_XDP sockets",
        status,
        found,
        WHY_KERNEL,
        Some(
            "a kernel with CONFIG_XDP_SOCKETS=y (distribution kernels have it); under systemd, AF_XDP in RestrictAddressFamilies= (tuning/quired.service)"
                .into(),
        ),
    )
}

/// `CapEff` of a `/proc/PID/status` text.
fn cap_eff(status: &str) -> Option<u64> {
    let v = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(v.trim(), 16).ok()
}

/// The effective uid of a `/proc/PID/status` text.
fn euid(status: &str) -> Option<u32> {
    let v = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    v.split_whitespace().nth(1)?.parse().ok()
}

fn has(caps: u64, cap: u32) -> bool {
    caps & (1u64 << cap) != 0
}

/// The capabilities AF_XDP needs, from `CapEff` (or, unreadable, the
/// effective uid).
fn privileges(caps: Option<u64>, euid: Option<u32>, bad: Status) -> Check {
    let fix = Some(
        "run quired with AmbientCapabilities= and CapabilityBoundingSet= holding CAP_NET_ADMIN CAP_NET_RAW CAP_BPF CAP_IPC_LOCK (tuning/quired.service), or as root"
            .to_string(),
    );
    let Some(caps) = caps else {
        let (status, found) = match euid {
            Some(0) => (Status::Ok, "root (capabilities unreadable)".to_string()),
            _ => (
                bad,
                format!(
                    "capabilities unreadable (/proc/self/status), not root: {}",
                    consequence(bad)
                ),
            ),
        };
        return check("AF_XDP privileges", status, found, WHY_PRIVILEGES, fix);
    };
    let mut missing = Vec::new();
    if !has(caps, CAP_NET_ADMIN) {
        missing.push("CAP_NET_ADMIN");
    }
    if !has(caps, CAP_NET_RAW) {
        missing.push("CAP_NET_RAW");
    }
    if !has(caps, CAP_BPF) && !has(caps, CAP_SYS_ADMIN) {
        missing.push("CAP_BPF");
    }
    let (status, found) = if missing.is_empty() {
        let bpf = if has(caps, CAP_BPF) {
            "CAP_BPF"
        } else {
            "CAP_SYS_ADMIN"
        };
        (Status::Ok, format!("CAP_NET_ADMIN, CAP_NET_RAW, {bpf}"))
    } else {
        (
            bad,
            format!("missing {}: {}", missing.join(", "), consequence(bad)),
        )
    };
    check("AF_XDP privileges", status, found, WHY_PRIVILEGES, fix)
}

fn mib(bytes: u64) -> String {
    if bytes == u64::MAX {
        "unlimited".into()
    } else if bytes % (1 << 20) == 0 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{bytes} bytes")
    }
}

/// RLIMIT_MEMLOCK (`soft`, bytes) against the UMEM bytes the config needs
/// (`need`; `None` without a config: what one loop takes at the default).
fn memlock(need: Option<u64>, soft: Option<u64>, ipc_lock: bool, bad: Status) -> Check {
    let default_loop = 4096 * u64::from(XDP_FRAME_BYTES);
    let fix = Some(format!(
        "LimitMEMLOCK=infinity in quired.service (or at least {}), or CAP_IPC_LOCK in its AmbientCapabilities=",
        mib(need.unwrap_or(default_loop))
    ));
    let (status, found) = match (need, soft) {
        _ if ipc_lock => (Status::Ok, "not limited: CAP_IPC_LOCK".to_string()),
        (None, Some(s)) => (
            Status::Ok,
            format!(
                "{} (a loop's UMEM takes {} at the default net.xdp_umem_frames)",
                mib(s),
                mib(default_loop)
            ),
        ),
        (Some(n), Some(s)) if s >= n => (
            Status::Ok,
            format!("{} (the node needs {} at start)", mib(s), mib(n)),
        ),
        (Some(n), Some(s)) => (
            bad,
            format!(
                "{}, below the {} the node locks at start (UMEMs and io_uring rings): {}, or its logs on the portable backend",
                mib(s),
                mib(n),
                consequence(bad)
            ),
        ),
        (_, None) => (
            if need.is_some() { bad } else { Status::Ok },
            "unreadable (/proc/self/limits)".into(),
        ),
    };
    check("AF_XDP locked memory", status, found, WHY_MEMLOCK, fix)
}

/// The interface holding `ip` (`found`), pushed as a check; returned if
/// AF_XDP can bind it.
fn interface(
    ip: IpAddr,
    found: Result<Interface, String>,
    bad: Status,
    out: &mut Vec<Check>,
) -> Option<Interface> {
    let fix = Some(
        "set udp.bind to this host's address on the replication network (one interface's, not loopback)"
            .to_string(),
    );
    let (status, text, iface) = match found {
        Err(why) => (bad, format!("{why}: {}", consequence(bad)), None),
        Ok(i) if i.loopback => (
            bad,
            format!(
                "{ip} is on the loopback interface {}, which has no XDP path: {}",
                i.name,
                consequence(bad)
            ),
            None,
        ),
        Ok(i) => (
            Status::Ok,
            format!("{ip} is on {} (ifindex {})", i.name, i.index),
            Some(i),
        ),
    };
    out.push(check("AF_XDP interface", status, text, WHY_INTERFACE, fix));
    iface
}

/// The interface's MTU and `transport.mtu_bytes` against a UMEM frame.
fn mtu(iface: &Interface, mtu_bytes: usize, bad: Status) -> Check {
    let (status, found, fix) = if mtu_bytes > XDP_MTU_MAX {
        (
            bad,
            format!(
                "transport.mtu_bytes {mtu_bytes} is above {XDP_MTU_MAX}, the most a 4096-byte UMEM frame holds: {}",
                consequence(bad)
            ),
            format!(
                "transport.mtu_bytes = {XDP_MTU_MAX} or less on every node (and `ip link set {} mtu {XDP_MTU_MAX}`), or net.backend = \"sockets\" to keep jumbo frames",
                iface.name
            ),
        )
    } else if (iface.mtu as usize) < mtu_bytes {
        (
            bad,
            format!(
                "{} has MTU {}, below transport.mtu_bytes {mtu_bytes}: {}",
                iface.name,
                iface.mtu,
                consequence(bad)
            ),
            format!(
                "ip link set {} mtu {mtu_bytes} (every hop of the path too), or a smaller transport.mtu_bytes",
                iface.name
            ),
        )
    } else {
        (
            Status::Ok,
            format!(
                "{} MTU {}, transport.mtu_bytes {mtu_bytes} (at most {XDP_MTU_MAX})",
                iface.name, iface.mtu
            ),
            String::new(),
        )
    };
    check("AF_XDP MTU", status, found, WHY_MTU, Some(fix))
}

/// The interface's receive queues against the loops.
fn queues(iface: &Interface, loops: usize, bad: Status) -> Check {
    let have = iface.queues.max(1) as usize;
    let counted = format!(
        "{} has {have} receive queue{} for {loops} loop{}",
        iface.name,
        if have == 1 { "" } else { "s" },
        if loops == 1 { "" } else { "s" }
    );
    let (status, found) = if have >= loops {
        (Status::Ok, counted)
    } else {
        let without = if loops - have == 1 {
            format!("loop {have} has")
        } else {
            format!("loops {have} to {} have", loops - 1)
        };
        (
            bad,
            format!("{counted}: {without} no queue: {}", consequence(bad)),
        )
    };
    check(
        "AF_XDP receive queues",
        status,
        found,
        WHY_QUEUES,
        Some(format!(
            "ethtool -L {} combined {loops} (one queue per loop), then steer each group's port to its loop's queue (tuning/README.md, \"AF_XDP\")",
            iface.name
        )),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(mtu: u32, queues: u32) -> Interface {
        Interface {
            name: "eth1".into(),
            index: 3,
            mac: [2, 0, 0, 0, 0, 1],
            mtu,
            loopback: false,
            queues,
        }
    }

    #[test]
    fn the_mtu_limit_is_a_umem_frame_less_headroom_and_ethernet() {
        assert_eq!(XDP_MTU_MAX, 3826);
        assert_eq!(mtu(&iface(9000, 8), 3826, Status::Fail).status, Status::Ok);
        let jumbo = mtu(&iface(9000, 8), 9000, Status::Fail);
        assert_eq!(jumbo.status, Status::Fail);
        assert!(jumbo.found.contains("3826"), "{}", jumbo.found);
        assert!(jumbo.fix.unwrap().contains("sockets"));
        let small = mtu(&iface(1500, 8), 3000, Status::Warn);
        assert_eq!(small.status, Status::Warn);
        assert!(small.fix.unwrap().contains("ip link set eth1 mtu 3000"));
    }

    #[test]
    fn a_loop_without_a_queue_is_named() {
        assert_eq!(queues(&iface(1500, 6), 6, Status::Warn).status, Status::Ok);
        let c = queues(&iface(1500, 2), 6, Status::Warn);
        assert_eq!(c.status, Status::Warn);
        assert!(
            c.found
                .contains("2 receive queues for 6 loops: loops 2 to 5 have no queue"),
            "{}",
            c.found
        );
        assert!(c.fix.unwrap().contains("ethtool -L eth1 combined 6"));
        let c = queues(&iface(1500, 1), 2, Status::Fail);
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.found
                .contains("1 receive queue for 2 loops: loop 1 has no queue"),
            "{}",
            c.found
        );
    }

    #[test]
    fn privileges_come_from_the_effective_capabilities() {
        let all = (1u64 << CAP_NET_ADMIN) | (1 << CAP_NET_RAW) | (1 << CAP_BPF);
        assert_eq!(
            privileges(Some(all), Some(1000), Status::Fail).status,
            Status::Ok
        );
        // Before CAP_BPF (5.8) bpf(2) took CAP_SYS_ADMIN, which still works.
        let old = (1u64 << CAP_NET_ADMIN) | (1 << CAP_NET_RAW) | (1 << CAP_SYS_ADMIN);
        assert_eq!(privileges(Some(old), None, Status::Fail).status, Status::Ok);
        // Root without the capabilities (a unit's empty bounding set) is refused.
        let c = privileges(Some(1 << CAP_NET_RAW), Some(0), Status::Fail);
        assert_eq!(c.status, Status::Fail);
        assert!(c.found.contains("CAP_NET_ADMIN, CAP_BPF"), "{}", c.found);
        assert!(c.fix.is_some());
        assert_eq!(privileges(None, Some(0), Status::Warn).status, Status::Ok);
        assert_eq!(
            privileges(None, Some(1000), Status::Warn).status,
            Status::Warn
        );
        let status = "Name:\tquired\nUid:\t1000\t0\t0\t0\nCapEff:\t000000800000f000\n";
        assert_eq!(euid(status), Some(0));
        assert_eq!(cap_eff(status), Some(0x80_0000_f000));
        assert!(has(0x80_0000_f000, CAP_BPF) && has(0x80_0000_f000, CAP_IPC_LOCK));
    }

    #[test]
    fn memlock_must_hold_every_loops_umem_unless_ipc_lock() {
        let need = 6 * 4096 * 4096;
        let c = memlock(Some(need), Some(8 << 20), false, Status::Warn);
        assert_eq!(c.status, Status::Warn);
        assert!(c.found.contains("8 MiB, below the 96 MiB"), "{}", c.found);
        assert!(c.found.contains("portable backend"), "{}", c.found);
        assert!(c.fix.unwrap().contains("LimitMEMLOCK=infinity"));
        assert_eq!(
            memlock(Some(need), Some(need), false, Status::Warn).status,
            Status::Ok
        );
        assert_eq!(
            memlock(Some(need), Some(u64::MAX), false, Status::Warn).status,
            Status::Ok
        );
        assert_eq!(
            memlock(Some(need), Some(0), true, Status::Fail).status,
            Status::Ok
        );
        // Without a config: informational.
        assert_eq!(memlock(None, Some(0), false, Status::Ok).status, Status::Ok);
    }

    #[test]
    fn loopback_and_the_unspecified_address_have_no_xdp_path() {
        let mut out = Vec::new();
        let lo = link::interface_of("127.0.0.1".parse().unwrap()).map_err(|e| e.to_string());
        assert!(interface("127.0.0.1".parse().unwrap(), lo, Status::Fail, &mut out).is_none());
        assert_eq!(out[0].status, Status::Fail);
        assert!(out[0].found.contains("loopback"), "{}", out[0].found);
        let none = interface(
            "0.0.0.0".parse().unwrap(),
            Err("udp.bind is 0.0.0.0".into()),
            Status::Warn,
            &mut out,
        );
        assert!(none.is_none());
        assert_eq!(out[1].status, Status::Warn);
        assert!(out[1].fix.as_ref().unwrap().contains("udp.bind"));
    }

    #[test]
    fn without_a_config_every_line_is_informational() {
        let root = tempfile::tempdir().unwrap();
        let proc = root.path().join("proc/self");
        std::fs::create_dir_all(&proc).unwrap();
        std::fs::write(
            proc.join("status"),
            "Uid:\t1000\t1000\t1000\t1000\nCapEff:\t0000000000000000\n",
        )
        .unwrap();
        std::fs::write(
            proc.join("limits"),
            "Limit                     Soft Limit           Hard Limit           Units\nMax locked memory         65536                65536                bytes\n",
        )
        .unwrap();
        let checks = Host::new(root.path()).xdp(None);
        assert_eq!(checks.len(), 3, "{checks:#?}");
        assert!(checks.iter().all(|c| c.status == Status::Ok), "{checks:#?}");
        assert!(checks[1].found.contains("missing"), "{:?}", checks[1]);
        assert!(checks[2].found.contains("64 KiB") || checks[2].found.contains("65536"));
    }

    /// A node config with `[net]` and `[udp]` as given.
    fn config(dir: &std::path::Path, extra: &str) -> DaemonConfig {
        std::fs::write(dir.join("cluster.key"), "0123456789abcdef0123456789abcdef").unwrap();
        std::fs::write(dir.join("client.token"), "token").unwrap();
        let text = format!(
            "[node]\nid = 1\ncluster_key_file = \"cluster.key\"\nauth_token_file = \"client.token\"\n\
             cores = [0, 1]\n\n[[peers]]\nid = 2\nudp = \"10.9.0.2:7400\"\n\n\
             [[disks]]\npath = \"g0\"\ngroup = 0\n\n[[disks]]\npath = \"g1\"\ngroup = 1\n\n\
             [[disks]]\npath = \"g2\"\ngroup = 2\n\n[client]\nplain = true\n\n{extra}"
        );
        std::fs::write(dir.join("node.toml"), text).unwrap();
        crate::node::daemon::config_file::load_with_cores(&dir.join("node.toml"), &[0, 1])
            .expect("a valid config")
    }

    #[test]
    fn the_backend_decides_what_a_finding_weighs() {
        let dir = tempfile::tempdir().unwrap();
        let host = Host::new(dir.path());
        let status_of = |checks: &[Check], name: &str| {
            checks
                .iter()
                .find(|c| c.name == name)
                .unwrap_or_else(|| panic!("no {name} in {checks:#?}"))
                .status
        };
        let xdp = config(
            dir.path(),
            "[udp]\nbind = \"127.0.0.1\"\n\n[net]\nbackend = \"xdp\"\nxdp_umem_frames = 1024\n",
        );
        // Groups 0 and 2 on core 0, group 1 on core 1: two loops.
        assert_eq!(loops(&xdp), 2);
        assert_eq!(umem_bytes(&xdp), 2 * 1024 * 4096);
        // Twice over: the refused zero-copy attempt's UMEM is still
        // charged when the copy-mode one registers; and room for io_uring.
        assert_eq!(memlock_needed(&xdp), 2 * 2 * 1024 * 4096 + (1 << 20));
        let checks = host.xdp(Some(&xdp));
        assert_eq!(status_of(&checks, "AF_XDP interface"), Status::Fail);
        // Loopback: no interface to check the MTU and queues of.
        assert!(checks.iter().all(|c| c.name != "AF_XDP MTU"), "{checks:#?}");
        let auto = config(dir.path(), "");
        let checks = host.xdp(Some(&auto));
        let c = checks
            .iter()
            .find(|c| c.name == "AF_XDP interface")
            .unwrap();
        assert_eq!(c.status, Status::Warn, "udp.bind 0.0.0.0: {c:?}");
        assert!(c.found.contains("udp.bind"), "{c:?}");
        let sockets = config(dir.path(), "[net]\nbackend = \"sockets\"\n");
        let checks = host.xdp(Some(&sockets));
        assert_eq!(checks.len(), 1);
        assert_eq!(checks[0].status, Status::Ok);
    }
}
