//! What the client server counts and how it logs refusals: the counters
//! it shares with the admin endpoint (atomics: they are bumped once per
//! connection, never per request, so this is off the data path) and a
//! rate limit for the log lines an attacker could otherwise multiply.

use std::sync::atomic::{AtomicU64, Ordering};

/// The client server's counters, shared with `/metrics` through the
/// node's handle.
#[derive(Debug, Default)]
pub struct ClientCounters {
    connections_accepted: AtomicU64,
    connections_refused: AtomicU64,
    connections_evicted: AtomicU64,
    hello_timeouts: AtomicU64,
    auth_failures: AtomicU64,
    tls_failures: AtomicU64,
    /// Requests refused as Forbidden, per principal (off the data path:
    /// a denial is an error, and only limited principals are checked).
    denials: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
    authenticated: AtomicU64,
    unauthenticated: AtomicU64,
}

/// A copy of [`ClientCounters`] at one moment (in `NodeStatus`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientView {
    /// TCP connections accepted (each `connect` of a client that reached us).
    pub connections_accepted: u64,
    /// Connections closed at once: their source address was full of
    /// authenticated connections, or their Hello came with every
    /// authenticated slot taken.
    pub connections_refused: u64,
    /// Unauthenticated connections closed to make room for a newer one.
    pub connections_evicted: u64,
    /// Connections closed for not completing their Hello in time.
    pub hello_timeouts: u64,
    /// Hellos with a wrong token.
    pub auth_failures: u64,
    /// Connections closed for a failed TLS handshake or a corrupt record
    /// (no certificate, an untrusted or expired one, a client speaking
    /// plain TCP to a TLS port).
    pub tls_failures: u64,
    /// Requests refused as Forbidden, per principal.
    pub denials: Vec<(String, u64)>,
    /// Connections authenticated now.
    pub authenticated: u64,
    /// Connections waiting for their Hello now.
    pub unauthenticated: u64,
}

/// One of the counters, for [`ClientCounters::add`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientEvent {
    /// A connection was accepted.
    Accepted,
    /// A connection was refused.
    Refused,
    /// A connection was evicted.
    Evicted,
    /// A Hello deadline passed.
    HelloTimeout,
    /// A wrong token.
    AuthFailure,
    /// A failed TLS handshake or a corrupt record.
    TlsFailure,
}

impl ClientCounters {
    /// Counts `n` of `event`.
    pub fn add(&self, event: ClientEvent, n: u64) {
        let c = match event {
            ClientEvent::Accepted => &self.connections_accepted,
            ClientEvent::Refused => &self.connections_refused,
            ClientEvent::Evicted => &self.connections_evicted,
            ClientEvent::HelloTimeout => &self.hello_timeouts,
            ClientEvent::AuthFailure => &self.auth_failures,
            ClientEvent::TlsFailure => &self.tls_failures,
        };
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts a request of `principal` refused as Forbidden.
    pub fn denied(&self, principal: &str) {
        let mut d = self.denials.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = d.get_mut(principal) {
            *n += 1;
        } else {
            d.insert(principal.to_string(), 1);
        }
    }

    /// Requests refused as Forbidden so far, per principal.
    pub fn denials(&self) -> Vec<(String, u64)> {
        let d = self.denials.lock().unwrap_or_else(|p| p.into_inner());
        d.iter().map(|(k, &v)| (k.clone(), v)).collect()
    }

    /// Sets the gauges of connections held now.
    pub fn set_held(&self, authenticated: usize, unauthenticated: usize) {
        self.authenticated
            .store(authenticated as u64, Ordering::Relaxed);
        self.unauthenticated
            .store(unauthenticated as u64, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn view(&self) -> ClientView {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ClientView {
            connections_accepted: get(&self.connections_accepted),
            connections_refused: get(&self.connections_refused),
            connections_evicted: get(&self.connections_evicted),
            hello_timeouts: get(&self.hello_timeouts),
            auth_failures: get(&self.auth_failures),
            tls_failures: get(&self.tls_failures),
            denials: self.denials(),
            authenticated: get(&self.authenticated),
            unauthenticated: get(&self.unauthenticated),
        }
    }
}

/// At most one log line per `interval_ms` for one kind of event; the
/// line says how many were left out since the last one. Sans-IO: the
/// caller passes the time.
#[derive(Clone, Copy, Debug)]
pub struct LogLimit {
    interval_ms: u64,
    last_ms: Option<u64>,
    suppressed: u64,
}

impl LogLimit {
    /// A limit of one line per `interval_ms`.
    pub fn new(interval_ms: u64) -> LogLimit {
        LogLimit {
            interval_ms,
            last_ms: None,
            suppressed: 0,
        }
    }

    /// An event at `now_ms`: `Some(suppressed)` if a line may be written
    /// now (with how many events went unlogged since the last line),
    /// `None` if it is one of those.
    #[must_use]
    pub fn event(&mut self, now_ms: u64) -> Option<u64> {
        let due = self
            .last_ms
            .is_none_or(|t| now_ms.saturating_sub(t) >= self.interval_ms);
        if !due {
            self.suppressed += 1;
            return None;
        }
        self.last_ms = Some(now_ms);
        Some(std::mem::take(&mut self.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_with_the_count_left_out() {
        let mut l = LogLimit::new(1000);
        assert_eq!(l.event(0), Some(0));
        assert_eq!(l.event(1), None);
        assert_eq!(l.event(999), None);
        assert_eq!(l.event(1000), Some(2));
        assert_eq!(l.event(5000), Some(0));
    }

    #[test]
    fn counters_show_in_the_view() {
        let c = ClientCounters::default();
        c.add(ClientEvent::Accepted, 3);
        c.add(ClientEvent::HelloTimeout, 1);
        c.set_held(2, 5);
        let v = c.view();
        assert_eq!(
            (
                v.connections_accepted,
                v.hello_timeouts,
                v.authenticated,
                v.unauthenticated
            ),
            (3, 1, 2, 5)
        );
    }
}
