//! What the host saw during a run: block-device counters from sysfs (fio's
//! "Disk stats") and UDP counters from /proc/net/snmp. Best effort: where a
//! file is missing (a container, tmpfs) the block is left out.

use crate::net::UdpSnmp;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The block device (as /sys/dev/block names it, e.g. `vda1`) holding `path`.
pub fn device_of(path: &Path) -> Option<String> {
    let dev = std::fs::metadata(path).ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let link = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    Some(link.file_name()?.to_string_lossy().into_owned())
}

/// One device's counters from its sysfs `stat` file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskCounters {
    /// Device name.
    pub name: String,
    /// Reads completed.
    pub read_ios: u64,
    /// Reads merged.
    pub read_merges: u64,
    /// Sectors read.
    pub read_sectors: u64,
    /// ms spent reading.
    pub read_ticks_ms: u64,
    /// Writes completed.
    pub write_ios: u64,
    /// Writes merged.
    pub write_merges: u64,
    /// Sectors written.
    pub write_sectors: u64,
    /// ms spent writing.
    pub write_ticks_ms: u64,
    /// ms with I/O in flight.
    pub io_ticks_ms: u64,
    /// Weighted ms in queue.
    pub in_queue_ms: u64,
    /// Flushes completed (kernels 5.5+).
    pub flush_ios: u64,
}

impl DiskCounters {
    /// Reads the counters of device `name` (a disk or a partition).
    pub fn read(name: &str) -> Option<DiskCounters> {
        if name.contains(['/', '.']) {
            return None;
        }
        let text = std::fs::read_to_string(format!("/sys/class/block/{name}/stat")).ok()?;
        let f: Vec<u64> = text
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        let at = |i: usize| f.get(i).copied().unwrap_or(0);
        Some(DiskCounters {
            name: name.to_string(),
            read_ios: at(0),
            read_merges: at(1),
            read_sectors: at(2),
            read_ticks_ms: at(3),
            write_ios: at(4),
            write_merges: at(5),
            write_sectors: at(6),
            write_ticks_ms: at(7),
            io_ticks_ms: at(9),
            in_queue_ms: at(10),
            flush_ios: at(15),
        })
    }

    /// What changed since `earlier`.
    pub fn since(&self, earlier: &DiskCounters) -> DiskCounters {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        DiskCounters {
            name: self.name.clone(),
            read_ios: d(self.read_ios, earlier.read_ios),
            read_merges: d(self.read_merges, earlier.read_merges),
            read_sectors: d(self.read_sectors, earlier.read_sectors),
            read_ticks_ms: d(self.read_ticks_ms, earlier.read_ticks_ms),
            write_ios: d(self.write_ios, earlier.write_ios),
            write_merges: d(self.write_merges, earlier.write_merges),
            write_sectors: d(self.write_sectors, earlier.write_sectors),
            write_ticks_ms: d(self.write_ticks_ms, earlier.write_ticks_ms),
            io_ticks_ms: d(self.io_ticks_ms, earlier.io_ticks_ms),
            in_queue_ms: d(self.in_queue_ms, earlier.in_queue_ms),
            flush_ios: d(self.flush_ios, earlier.flush_ios),
        }
    }
}

/// Host counters taken before a run, to diff after it.
#[derive(Clone, Debug, Default)]
pub struct HostSnapshot {
    /// Devices under test.
    pub disks: Vec<DiskCounters>,
    /// UDP counters.
    pub udp: Option<UdpSnmp>,
}

impl HostSnapshot {
    /// Reads the counters of `devices` and UDP.
    pub fn take(devices: &[String]) -> HostSnapshot {
        HostSnapshot {
            disks: devices
                .iter()
                .filter_map(|d| DiskCounters::read(d))
                .collect(),
            udp: UdpSnmp::read().ok(),
        }
    }

    /// What changed between `earlier` and this snapshot.
    pub fn since(&self, earlier: &HostSnapshot) -> HostSnapshot {
        HostSnapshot {
            disks: self
                .disks
                .iter()
                .filter_map(|d| {
                    earlier
                        .disks
                        .iter()
                        .find(|e| e.name == d.name)
                        .map(|e| d.since(e))
                })
                .collect(),
            udp: match (&self.udp, &earlier.udp) {
                (Some(a), Some(b)) => Some(a.since(b)),
                _ => None,
            },
        }
    }
}
