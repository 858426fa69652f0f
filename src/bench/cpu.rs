//! CPU time per confirmed operation: the daemons' (`/proc/PID/stat`
//! utime + stime, summed over the daemons of an `--embedded` cluster,
//! whose PIDs this process started) and quire-bench's own
//! (`getrusage(RUSAGE_SELF)`: every thread of this process). Read before
//! and after a stonewall group; reads files and makes one syscall, nothing
//! else.

/// CPU time of process `pid` so far (user + system), µs; `None` if it is
/// gone or its stat cannot be read.
pub fn process_cpu_us(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces:
    // the fields are counted from the last ')'. After it come field 3
    // (state) onwards; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(14 - 3)?.parse().ok()?;
    let stime: u64 = fields.get(15 - 3)?.parse().ok()?;
    let ticks_per_s = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??;
    let ticks_per_s = u64::try_from(ticks_per_s).ok().filter(|&t| t > 0)?;
    Some((utime + stime) * 1_000_000 / ticks_per_s)
}

/// CPU time of every process of `pids` so far, summed, µs; `None` if one
/// cannot be read (or there are none).
pub fn processes_cpu_us(pids: &[u32]) -> Option<u64> {
    if pids.is_empty() {
        return None;
    }
    pids.iter().map(|&p| process_cpu_us(p)).sum()
}

/// CPU time of this process so far (every thread, user + system), µs.
pub fn own_cpu_us() -> u64 {
    use nix::sys::resource::{getrusage, UsageWho};
    use nix::sys::time::TimeValLike;
    let Ok(ru) = getrusage(UsageWho::RUSAGE_SELF) else {
        return 0;
    };
    (ru.user_time().num_microseconds() + ru.system_time().num_microseconds()).max(0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_cpu_time_grows_with_work_and_reads_as_proc_says() {
        let before = own_cpu_us();
        let mut x = 0u64;
        while own_cpu_us() < before + 20_000 {
            for i in 0..10_000u64 {
                x = x.wrapping_mul(31).wrapping_add(i);
            }
        }
        std::hint::black_box(x);
        let proc = process_cpu_us(std::process::id()).expect("our own stat");
        // /proc counts in clock ticks (10 ms at 100 Hz): it may lag
        // getrusage by a tick or two, never lead it by more.
        let own = own_cpu_us();
        assert!(proc <= own + 20_000, "proc {proc} us, getrusage {own} us");
        assert!(proc + 50_000 >= before + 20_000, "proc {proc} us");
        assert_eq!(processes_cpu_us(&[]), None);
    }
}
