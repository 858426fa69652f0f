//! How the CLI prints values for people: dates in RFC 3339 local time,
//! durations with their unit, an absent value as `-`; never Rust's debug
//! formatting (`Some(2)`, `None`, `189.192059ms`). `--json` keeps the raw
//! values for scripts.

use std::time::Duration;

/// `v`, or `-` if absent.
pub(crate) fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

/// `d` in the unit that reads best: `850 us`, `189 ms`, `2.4 s`.
pub(crate) fn duration(d: Duration) -> String {
    let us = d.as_micros();
    if us < 1_000 {
        format!("{us} us")
    } else if us < 10_000_000 {
        format!("{} ms", us / 1_000)
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// Ms since the Unix epoch as RFC 3339 in local time, to the
/// millisecond: `2026-12-01T11:16:15.451+01:00`.
pub(crate) fn rfc3339_local(ms: u64) -> String {
    let secs = (ms / 1000) as libc::time_t;
    // SAFETY: tm is plain data (all-zero is a valid value); localtime_r
    // fills it from `secs` and touches nothing else (it reads the zone
    // from TZ or /etc/localtime).
    let tm = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        (!libc::localtime_r(&secs, &mut tm).is_null()).then_some(tm)
    };
    let Some(tm) = tm else {
        return format!("{ms} ms after the epoch");
    };
    let off_min = tm.tm_gmtoff / 60;
    let zone = if off_min == 0 {
        "Z".to_string()
    } else {
        let sign = if off_min < 0 { '-' } else { '+' };
        format!("{sign}{:02}:{:02}", off_min.abs() / 60, off_min.abs() % 60)
    };
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}{zone}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
        ms % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_as_people_write_them() {
        assert_eq!(opt(None), "-");
        assert_eq!(opt(Some(2)), "2");
        assert_eq!(duration(Duration::from_micros(850)), "850 us");
        assert_eq!(duration(Duration::from_micros(189_192)), "189 ms");
        assert_eq!(duration(Duration::from_millis(24_400)), "24.4 s");
        let t = rfc3339_local(1_796_123_775_451);
        assert_eq!(
            t.len(),
            "2026-12-01T11:16:15.451".len() + if t.ends_with('Z') { 1 } else { 6 }
        );
        assert!(t.starts_with("2026-12-") && t.contains(".451"), "{t}");
    }
}
