//! The daemon's log lines: `2026-12-01T12:34:56.789Z INFO  node 1: …` on
//! stderr, one line each, in the order they were written (the time is
//! taken while stderr is held, so lines from the loops, the admin endpoint
//! and the client server never print out of time order). UTC, so that
//! lines from every host of a cluster sort together; journald or the
//! service manager may add their own stamp in front.
//!
//! A tiny formatter of our own rather than `tracing`: the daemon writes a
//! few dozen kinds of line, all from a handful of call sites, and needs no
//! spans, filters or subscribers.

use std::fmt;
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

/// How much a line matters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Level {
    /// Something an operator may want to know (a start, a transition).
    Info,
    /// Something that needs a look (a refused request, a link down).
    Warn,
    /// Something failed (a log stopped, a start that cannot go on).
    Error,
}

impl Level {
    /// Its name as printed, padded to one width.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Level::Info => "INFO ",
            Level::Warn => "WARN ",
            Level::Error => "ERROR",
        }
    }
}

thread_local! {
    /// Set on a thread whose replicas are not the daemon's (a simulator
    /// runs thousands of them, and their lines would only be noise).
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Silences the log lines written on this thread from now on.
pub(crate) fn quiet_on_this_thread() {
    QUIET.with(|q| q.set(true));
}

/// Writes one line at `level` (nothing on a quiet thread).
pub(crate) fn emit(level: Level, line: fmt::Arguments<'_>) {
    if QUIET.with(|q| q.get()) {
        return;
    }
    let mut err = std::io::stderr().lock();
    let stamp = rfc3339_utc(SystemTime::now());
    // A closed stderr must not stop the daemon: the line is lost.
    let _ = writeln!(err, "{stamp} {} {line}", level.name());
}

/// `t` as RFC 3339 in UTC with milliseconds: `2026-12-01T12:34:56.789Z`.
pub(crate) fn rfc3339_utc(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since.subsec_millis()
    )
}

/// The proleptic Gregorian (year, month, day) of `days` since 1970-01-01
/// (H. Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// An INFO line, formatted as `format!`.
macro_rules! log_info {
    ($($t:tt)*) => {
        $crate::node::log::emit($crate::node::log::Level::Info, format_args!($($t)*))
    };
}
/// A WARN line, formatted as `format!`.
macro_rules! log_warn {
    ($($t:tt)*) => {
        $crate::node::log::emit($crate::node::log::Level::Warn, format_args!($($t)*))
    };
}
/// An ERROR line, formatted as `format!`.
macro_rules! log_error {
    ($($t:tt)*) => {
        $crate::node::log::emit($crate::node::log::Level::Error, format_args!($($t)*))
    };
}
pub(crate) use {log_error, log_info, log_warn};

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let at = |s: u64, ms: u64| {
            rfc3339_utc(UNIX_EPOCH + Duration::from_secs(s) + Duration::from_millis(ms))
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(at(1_796_109_135, 526), "2026-12-01T07:12:15.526Z");
        assert_eq!(at(4_102_444_799, 999), "2099-12-31T23:59:59.999Z");
    }
}
