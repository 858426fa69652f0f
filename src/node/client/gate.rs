//! The client server's admission policy applied to sockets: the event
//! loops serving client connections call the [`Gate`] at accept, on a
//! successful Hello, when a Hello deadline passes, and at close; it asks
//! `admission::Admission` (the sans-IO policy) what to do, closes
//! what the policy lets go (through a clone of each unauthenticated
//! socket, which wakes the loop holding it), and counts and logs it
//! (`stats`). The policy is node-wide, so the gate is shared by
//! the loops: one short mutex per such event, never per request.

use crate::consensus::NodeId;
use crate::node::client::admission::{Admission, Admit, ClientLimits, ConnId};
use crate::node::client::stats::{ClientCounters, ClientEvent, LogLimit};
use std::collections::HashMap;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// At most one log line per this many ms for each kind of refusal (bad
/// token, Hello timeout, budget), with the count of those left out.
const REFUSAL_LOG_INTERVAL_MS: u64 = 1000;

/// The kinds of refusal that are logged, each rate-limited on its own.
#[derive(Clone, Copy)]
enum Refusal {
    BadToken,
    HelloTimeout,
    Budget,
    Tls,
    Denied,
}

/// What the gate's mutex guards.
struct GateState {
    admission: Admission,
    /// A handle on each unauthenticated connection's socket, to close it
    /// when the policy evicts it or its deadline passes.
    waiting: HashMap<ConnId, TcpStream>,
    logs: [LogLimit; 5],
}

/// The admission policy applied to sockets: shared by the accept thread
/// and the connection threads (a short mutex per accept, Hello and
/// close; never per request).
pub(in crate::node) struct Gate {
    state: Mutex<GateState>,
    counters: Arc<ClientCounters>,
    node: NodeId,
    /// `client.hello_timeout_ms`, for the messages.
    pub(in crate::node) hello_timeout_ms: u64,
    /// The policy's clock.
    started: Instant,
}

impl Gate {
    pub(in crate::node) fn new(
        limits: ClientLimits,
        node: NodeId,
        counters: Arc<ClientCounters>,
    ) -> Gate {
        Gate {
            state: Mutex::new(GateState {
                admission: Admission::new(limits),
                waiting: HashMap::new(),
                logs: [LogLimit::new(REFUSAL_LOG_INTERVAL_MS); 5],
            }),
            counters,
            node,
            hello_timeout_ms: limits.hello_timeout_ms,
            started: Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        // A connection thread that panicked holding the lock left counts
        // that are still right (every change is one call): carry on.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One log line for `what` about `peer`, unless one went out in the
    /// last second (then it is counted into the next line).
    fn log(&self, st: &mut GateState, kind: Refusal, peer: Option<SocketAddr>, what: &str) {
        if let Some(left_out) = st.logs[kind as usize].event(self.now_ms()) {
            let peer = peer.map_or_else(|| "?".into(), |p| p.to_string());
            let more = if left_out > 0 {
                format!(" ({left_out} more like it since the last such line)")
            } else {
                String::new()
            };
            crate::node::log::log_warn!("node {}: client {peer}: {what}{more}", self.node);
        }
    }

    fn publish(&self, st: &GateState) {
        self.counters
            .set_held(st.admission.authenticated(), st.admission.unauthenticated());
    }

    /// A new connection: its id, or `None` if it is refused (drop it).
    pub(in crate::node) fn admit(&self, stream: &TcpStream) -> Option<ConnId> {
        self.counters.add(ClientEvent::Accepted, 1);
        let peer = stream.peer_addr().ok()?;
        let mut st = self.lock();
        let verdict = st.admission.admit(peer.ip(), self.now_ms());
        let id = match verdict {
            Admit::Refuse => {
                self.counters.add(ClientEvent::Refused, 1);
                let why = "closed at once: its address holds connections_per_source_max authenticated connections";
                self.log(&mut st, Refusal::Budget, Some(peer), why);
                return None;
            }
            Admit::Accept { id, evict } => {
                if let Some(old) = evict.and_then(|old| st.waiting.remove(&old)) {
                    self.counters.add(ClientEvent::Evicted, 1);
                    let why = "evicted before its Hello: the unauthenticated budget (or its address's) is full";
                    self.log(&mut st, Refusal::Budget, old.peer_addr().ok(), why);
                    let _ = old.shutdown(Shutdown::Both);
                }
                id
            }
        };
        if let Ok(handle) = stream.try_clone() {
            st.waiting.insert(id, handle);
        }
        self.publish(&st);
        Some(id)
    }

    /// The Hello of `id` succeeded: true if it may be served.
    pub(in crate::node) fn authenticate(&self, id: ConnId, peer: Option<SocketAddr>) -> bool {
        let mut st = self.lock();
        let ok = st.admission.authenticate(id);
        if ok {
            st.waiting.remove(&id);
        } else if st.admission.hello_deadline_ms(id).is_some() {
            self.counters.add(ClientEvent::Refused, 1);
            let why = "Hello refused: connections_max authenticated connections are served";
            self.log(&mut st, Refusal::Budget, peer, why);
        }
        self.publish(&st);
        ok
    }

    /// Time left for `id`'s Hello; `None` once it is authenticated.
    pub(in crate::node) fn hello_time_left(&self, id: ConnId) -> Option<Duration> {
        let deadline = self.lock().admission.hello_deadline_ms(id)?;
        Some(Duration::from_millis(
            deadline.saturating_sub(self.now_ms()),
        ))
    }

    /// `id`'s Hello deadline has passed: it and any other connection past
    /// its own are let go (counted and logged once each); the others'
    /// sockets are closed here, `id`'s is the caller's to close.
    pub(in crate::node) fn hello_expired(&self, id: ConnId, peer: Option<SocketAddr>) {
        let mut st = self.lock();
        let expired = st.admission.handle_timeout(self.now_ms());
        for x in expired {
            self.counters.add(ClientEvent::HelloTimeout, 1);
            let sock = st.waiting.remove(&x);
            let who = if x == id {
                peer
            } else {
                sock.as_ref().and_then(|s| s.peer_addr().ok())
            };
            let why = format!("no Hello within {} ms; closed", self.hello_timeout_ms);
            self.log(&mut st, Refusal::HelloTimeout, who, &why);
            if x != id {
                if let Some(s) = sock {
                    let _ = s.shutdown(Shutdown::Both);
                }
            }
        }
        self.publish(&st);
    }

    /// A Hello with a wrong token on `peer`'s connection.
    pub(in crate::node) fn bad_token(&self, peer: Option<SocketAddr>) {
        self.counters.add(ClientEvent::AuthFailure, 1);
        let mut st = self.lock();
        self.log(&mut st, Refusal::BadToken, peer, "wrong auth token; closed");
    }

    /// `peer`'s connection failed its TLS handshake or sent a corrupt
    /// record (`why`, rustls' words); it is being closed.
    pub(in crate::node) fn tls_failed(
        &self,
        peer: Option<SocketAddr>,
        why: &dyn std::fmt::Display,
    ) {
        self.counters.add(ClientEvent::TlsFailure, 1);
        let mut st = self.lock();
        self.log(&mut st, Refusal::Tls, peer, &format!("TLS: {why}; closed"));
    }

    /// A request of `principal` on `peer`'s connection was refused
    /// (`why`): counted per principal, logged at most once a second.
    pub(in crate::node) fn denied(&self, peer: Option<SocketAddr>, principal: &str, why: &str) {
        self.counters.denied(principal);
        let mut st = self.lock();
        self.log(&mut st, Refusal::Denied, peer, &format!("forbidden: {why}"));
    }

    /// `id` has closed (whatever the reason): its slots are free.
    pub(in crate::node) fn closed(&self, id: ConnId) {
        let mut st = self.lock();
        st.admission.closed(id);
        st.waiting.remove(&id);
        self.publish(&st);
    }
}
