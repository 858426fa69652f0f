//! `quire tune`: checks a host against what quire needs, applies the
//! settings that are safe to change at run time, and probes a disk.
//!
//! Everything is read from, and written under, a root directory ("/" on a
//! real host), so tests run the checks on fake /proc and /sys trees.

pub mod disk;
pub mod xdp;

use crate::node::daemon::config_file::DaemonConfig;
use serde_json::json;
use std::path::{Path, PathBuf};

/// How a setting looks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// As quire wants it.
    Ok,
    /// Works, but costs speed or safety margin.
    Warn,
    /// Breaks something quire needs.
    Fail,
}

impl Status {
    /// "OK", "WARN" or "FAIL".
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        }
    }
}

/// A change `apply` may make: write `value` to the file at `path` (under
/// the root).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    /// The file, as an absolute path on the host.
    pub path: PathBuf,
    /// What to write.
    pub value: String,
}

/// One line of the checklist.
#[derive(Clone, Debug)]
pub struct Check {
    /// What is checked.
    pub name: String,
    /// Its status.
    pub status: Status,
    /// What was found.
    pub found: String,
    /// Why it matters to quire.
    pub why: &'static str,
    /// The command that fixes it for good (shell), if any.
    pub fix: Option<String>,
    /// The run-time change `apply` makes, if it is safe to make.
    pub apply: Option<Write>,
}

/// A host to check: everything is read under `root`.
pub struct Host {
    root: PathBuf,
}

impl Host {
    /// The host whose /proc and /sys are under `root` ("/" for this one).
    pub fn new(root: impl Into<PathBuf>) -> Host {
        Host { root: root.into() }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.root.join(p.trim_start_matches('/'))
    }

    fn read(&self, p: &str) -> Option<String> {
        std::fs::read_to_string(self.path(p))
            .ok()
            .map(|s| s.trim().to_string())
    }

    fn read_u64(&self, p: &str) -> Option<u64> {
        self.read(p)?.parse().ok()
    }

    /// Runs every check; `cfg` adds the node's own (buffers, disks, cores,
    /// serial devices) and weighs the AF_XDP checks by `net.backend`
    /// ([`xdp`]).
    pub fn check(&self, cfg: Option<&DaemonConfig>) -> Vec<Check> {
        let mut out = Vec::new();
        let rmem_want = cfg.map_or(16 << 20, |c| c.node.udp.recv_buffer_bytes) as u64;
        let wmem_want = cfg.map_or(4 << 20, |c| c.node.udp.send_buffer_bytes) as u64;
        out.push(self.sysctl_min(
            "net.core.rmem_max",
            rmem_want,
            "UDP receive buffers: below what quire asks, datagrams are dropped under load (RcvbufErrors in /proc/net/snmp)",
        ));
        out.push(self.sysctl_min(
            "net.core.wmem_max",
            wmem_want,
            "UDP send buffers: below what quire asks, sends stall in the kernel",
        ));
        out.push(self.sysctl_min(
            "net.core.netdev_max_backlog",
            10_000,
            "packets queued per core before the stack takes them: bursts of replication traffic are dropped beyond it",
        ));
        out.push(self.io_uring());
        out.push(self.sysctl_max(
            "vm.swappiness",
            10,
            "a swapped-out event loop stalls a group for milliseconds",
        ));
        out.push(self.thp());
        out.push(self.governor());
        out.push(self.clocksource());
        out.push(self.limit(
            "Max open files",
            65_536,
            "sockets, segment files and client connections",
            "LimitNOFILE=1048576 in the systemd unit (tuning/quired.service)",
        ));
        out.extend(self.xdp(cfg));
        if let Some(cfg) = cfg {
            out.extend(self.cores(cfg));
            for g in &cfg.node.groups {
                out.extend(self.disk(g.group, &g.dir));
            }
            for p in &cfg.node.peers {
                if let Some(dev) = &p.serial_device {
                    out.push(self.serial(p.id, dev));
                }
            }
        }
        out
    }

    fn sysctl_min(&self, key: &str, want: u64, why: &'static str) -> Check {
        self.sysctl(key, want, |v| v >= want, why)
    }

    fn sysctl_max(&self, key: &str, max: u64, why: &'static str) -> Check {
        self.sysctl(key, max, |v| v <= max, why)
    }

    /// A numeric sysctl that is fine when `good(value)`; `target` is what
    /// the fix and `apply` set.
    fn sysctl(
        &self,
        key: &str,
        target: u64,
        good: impl Fn(u64) -> bool,
        why: &'static str,
    ) -> Check {
        let file = format!("/proc/sys/{}", key.replace('.', "/"));
        let found = self.read_u64(&file);
        let status = match found {
            Some(v) if good(v) => Status::Ok,
            _ => Status::Warn,
        };
        Check {
            name: key.to_string(),
            status,
            found: found.map_or("unreadable".into(), |v| v.to_string()),
            why,
            fix: (status != Status::Ok).then(|| {
                format!("sysctl -w {key}={target} && echo '{key} = {target}' >> /etc/sysctl.d/99-quire.conf")
            }),
            apply: (status != Status::Ok && found.is_some()).then(|| Write {
                path: PathBuf::from(&file),
                value: target.to_string(),
            }),
        }
    }

    fn io_uring(&self) -> Check {
        let found = self.read_u64("/proc/sys/kernel/io_uring_disabled");
        let (status, found_text) = match found {
            None => (
                Status::Ok,
                "no such sysctl (kernel before 6.6: io_uring on)".to_string(),
            ),
            Some(0) => (Status::Ok, "0 (enabled)".into()),
            Some(1) => (Status::Warn, "1 (only for the io_uring_group)".into()),
            Some(v) => (Status::Warn, format!("{v} (disabled)")),
        };
        Check {
            name: "kernel.io_uring_disabled".into(),
            status,
            found: found_text,
            why: "without io_uring the WAL runs on the portable backend (pwrite + fdatasync on a helper thread): slower group commit",
            fix: (status != Status::Ok).then(|| {
                "sysctl -w kernel.io_uring_disabled=0 && echo 'kernel.io_uring_disabled = 0' >> /etc/sysctl.d/99-quire.conf".to_string()
            }),
            apply: (status != Status::Ok).then(|| Write {
                path: "/proc/sys/kernel/io_uring_disabled".into(),
                value: "0".into(),
            }),
        }
    }

    fn thp(&self) -> Check {
        let file = "/sys/kernel/mm/transparent_hugepage/enabled";
        let found = self.read(file);
        let selected = found.as_deref().and_then(|s| {
            let a = s.find('[')?;
            let b = s[a..].find(']')?;
            Some(s[a + 1..a + b].to_string())
        });
        let status = match selected.as_deref() {
            Some("always") => Status::Warn,
            _ => Status::Ok,
        };
        Check {
            name: "transparent hugepages".into(),
            status,
            found: selected.unwrap_or_else(|| "not available".into()),
            why: "`always` makes the kernel compact memory behind the loops' backs: latency spikes",
            fix: (status != Status::Ok).then(|| {
                format!("echo madvise > {file} (persistently: transparent_hugepage=madvise on the kernel command line)")
            }),
            apply: (status != Status::Ok).then(|| Write {
                path: file.into(),
                value: "madvise".into(),
            }),
        }
    }

    fn governor(&self) -> Check {
        let dir = self.path("/sys/devices/system/cpu");
        let mut governors = Vec::new();
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name
                    .strip_prefix("cpu")
                    .is_some_and(|n| n.parse::<u32>().is_ok())
                {
                    let f = format!("/sys/devices/system/cpu/{name}/cpufreq/scaling_governor");
                    if let Some(g) = self.read(&f) {
                        governors.push((f, g));
                    }
                }
            }
        }
        governors.sort();
        let slow: Vec<&(String, String)> = governors
            .iter()
            .filter(|(_, g)| g != "performance")
            .collect();
        let status = if slow.is_empty() {
            Status::Ok
        } else {
            Status::Warn
        };
        Check {
            name: "CPU frequency governor".into(),
            status,
            found: if governors.is_empty() {
                "no cpufreq (a VM, or a fixed frequency)".into()
            } else if slow.is_empty() {
                "performance on every core".into()
            } else {
                format!("{} on {} of {} cores", slow[0].1, slow.len(), governors.len())
            },
            why: "a core that clocks down between bursts adds tens of microseconds to every wake-up",
            fix: (status != Status::Ok)
                .then(|| "cpupower frequency-set -g performance (and disable deep C-states: see tuning/README.md)".to_string()),
            apply: slow.first().map(|(f, _)| Write {
                path: f.into(),
                value: "performance".into(),
            }),
        }
    }

    fn clocksource(&self) -> Check {
        let file = "/sys/devices/system/clocksource/clocksource0/current_clocksource";
        let found = self.read(file);
        let status = match found.as_deref() {
            Some("tsc") | Some("kvm-clock") | Some("arch_sys_counter") | None => Status::Ok,
            Some(_) => Status::Warn,
        };
        Check {
            name: "clocksource".into(),
            status,
            found: found.unwrap_or_else(|| "unreadable".into()),
            why: "timers and latency histograms read the clock constantly; hpet or acpi_pm are slow to read",
            fix: (status != Status::Ok).then(|| format!("echo tsc > {file} (persistently: clocksource=tsc)")),
            apply: None,
        }
    }

    fn limit(&self, which: &str, want: u64, why: &'static str, fix: &str) -> Check {
        let soft = self.read("/proc/self/limits").and_then(|t| {
            let line = t.lines().find(|l| l.starts_with(which))?;
            let v = line[which.len()..].split_whitespace().next()?;
            Some(if v == "unlimited" {
                u64::MAX
            } else {
                v.parse().ok()?
            })
        });
        let status = match soft {
            Some(v) if v >= want => Status::Ok,
            _ => Status::Warn,
        };
        Check {
            name: format!("limit: {}", which.to_lowercase()),
            status,
            found: soft.map_or("unreadable".into(), |v| {
                if v == u64::MAX {
                    "unlimited".into()
                } else {
                    v.to_string()
                }
            }),
            why,
            fix: (status != Status::Ok).then(|| fix.to_string()),
            apply: None,
        }
    }

    fn cores(&self, cfg: &DaemonConfig) -> Vec<Check> {
        let uses_zero = cfg.cores.contains(&0);
        vec![Check {
            name: "node.cores".into(),
            status: if uses_zero { Status::Warn } else { Status::Ok },
            found: format!("{:?}", cfg.cores),
            why: "core 0 takes most interrupts and housekeeping; a group loop there shares it",
            fix: uses_zero.then(|| {
                "list cores from 1 (or 2) up in node.cores, and steer IRQs away from them"
                    .to_string()
            }),
            apply: None,
        }]
    }

    /// The block device holding `dir` (its sysfs directory), the queue of
    /// the whole disk, and the mount entry.
    fn disk(&self, group: u32, dir: &Path) -> Vec<Check> {
        use std::os::unix::fs::MetadataExt;
        let mut out = Vec::new();
        let probe = dir
            .ancestors()
            .find(|p| p.exists())
            .unwrap_or(Path::new("/"));
        let Ok(meta) = std::fs::metadata(probe) else {
            return out;
        };
        let dev = meta.dev();
        let (major, minor) = (libc::major(dev), libc::minor(dev));
        let sys = format!("/sys/dev/block/{major}:{minor}");
        // A partition's queue is its parent disk's.
        let queue = if self.path(&format!("{sys}/queue")).exists() {
            format!("{sys}/queue")
        } else {
            format!("{sys}/../queue")
        };
        let rotational = self.read_u64(&format!("{queue}/rotational"));
        if let Some(sched) = self.read(&format!("{queue}/scheduler")) {
            let current = sched
                .split_whitespace()
                .find(|s| s.starts_with('['))
                .map(|s| s.trim_matches(|c| c == '[' || c == ']').to_string())
                .unwrap_or(sched.clone());
            let want = if rotational == Some(1) {
                "mq-deadline"
            } else {
                "none"
            };
            let status = if current == want {
                Status::Ok
            } else {
                Status::Warn
            };
            out.push(Check {
                name: format!("group {group} disk scheduler"),
                status,
                found: format!("{current} ({})", if rotational == Some(1) { "rotational" } else { "solid state" }),
                why: "the log writes sequentially and flushes in batches: a scheduler only adds latency (none), or keeps fsyncs fair on spinning disks (mq-deadline)",
                fix: (status != Status::Ok).then(|| {
                    format!("echo {want} > /sys/dev/block/{major}:{minor}/queue/scheduler (persistently: tuning/60-quire.rules)")
                }),
                apply: (status != Status::Ok).then(|| Write {
                    path: PathBuf::from(&queue).join("scheduler"),
                    value: want.into(),
                }),
            });
        }
        if let Some(wc) = self.read(&format!("{queue}/write_cache")) {
            let status = if wc == "write back" {
                Status::Warn
            } else {
                Status::Ok
            };
            out.push(Check {
                name: format!("group {group} volatile write cache"),
                status,
                found: wc,
                why: "with a volatile cache, only a flush (fdatasync, which quire issues) makes data durable: safe if the disk honours flushes; check it has power-loss protection",
                fix: (status != Status::Ok).then(|| {
                    "confirm power-loss protection, or: hdparm -W0 /dev/DISK (see HARDWARE.md)".to_string()
                }),
                apply: None,
            });
        }
        if let Some(mounts) = self.read("/proc/self/mounts") {
            // The longest mount point that holds `dir`.
            let entry = mounts
                .lines()
                .filter_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    (f.len() >= 4 && probe.starts_with(f[1]))
                        .then(|| (f[1].len(), f[2].to_string(), f[3].to_string()))
                })
                .max_by_key(|e| e.0);
            if let Some((_, fstype, opts)) = entry {
                let discard = opts.split(',').any(|o| o == "discard");
                let good_fs = fstype == "ext4" || fstype == "xfs";
                let status = if discard || !good_fs {
                    Status::Warn
                } else {
                    Status::Ok
                };
                out.push(Check {
                    name: format!("group {group} filesystem"),
                    status,
                    found: format!("{fstype} ({opts})"),
                    why: "ext4 or xfs take O_DIRECT and preallocated segments well; `discard` issues a TRIM inline with trimmed segments",
                    fix: (status != Status::Ok).then(|| {
                        "use ext4 or xfs, mounted without `discard` (run fstrim weekly instead)".to_string()
                    }),
                    apply: None,
                });
            }
        }
        out
    }

    fn serial(&self, peer: u64, dev: &Path) -> Check {
        let ok = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(dev)
            .is_ok();
        Check {
            name: format!("serial cable to node {peer}"),
            status: if ok { Status::Ok } else { Status::Fail },
            found: format!("{} {}", dev.display(), if ok { "opens read-write" } else { "cannot be opened read-write" }),
            why: "the serial heartbeat tells a dead peer from a broken IP path; without it every IP fault looks like a dead host",
            fix: (!ok).then(|| {
                format!("check the device exists and the quire user is in its group (dialout): ls -l {}", dev.display())
            }),
            apply: None,
        }
    }
}

/// The checklist as text, one line per check, with the fix under it.
pub fn render(checks: &[Check]) -> String {
    let mut s = String::new();
    for c in checks {
        s += &format!("[{:<4}] {:<32} {}\n", c.status.name(), c.name, c.found);
        if c.status != Status::Ok {
            s += &format!("       why: {}\n", c.why);
            if let Some(f) = &c.fix {
                s += &format!("       fix: {f}\n");
            }
        }
    }
    let (w, f) = (
        checks.iter().filter(|c| c.status == Status::Warn).count(),
        checks.iter().filter(|c| c.status == Status::Fail).count(),
    );
    s += &format!(
        "{} checks: {} ok, {w} warn, {f} fail\n",
        checks.len(),
        checks.len() - w - f
    );
    s
}

/// The checklist as JSON.
pub fn to_json(checks: &[Check]) -> serde_json::Value {
    json!(checks
        .iter()
        .map(|c| json!({
            "name": c.name,
            "status": c.status.name(),
            "found": c.found,
            "why": c.why,
            "fix": c.fix,
        }))
        .collect::<Vec<_>>())
}

/// Applies the run-time-safe changes of the failing checks under `root`;
/// with `dry_run`, only says what it would write. Returns one line each.
pub fn apply(root: &Path, checks: &[Check], dry_run: bool) -> Vec<String> {
    let mut out = Vec::new();
    for c in checks.iter().filter(|c| c.status != Status::Ok) {
        let Some(w) = &c.apply else { continue };
        let target = root.join(w.path.strip_prefix("/").unwrap_or(&w.path));
        if dry_run {
            out.push(format!("would write {:?} to {}", w.value, w.path.display()));
            continue;
        }
        match std::fs::write(&target, &w.value) {
            Ok(()) => out.push(format!("wrote {:?} to {}", w.value, w.path.display())),
            Err(e) => out.push(format!("could not write {}: {e}", w.path.display())),
        }
    }
    out
}
