//! Which client connections the client server takes and keeps: the
//! connection budgets, the per-source-address limit and the Hello
//! deadline, as a sans-IO core. It touches no socket, reads no clock and
//! starts no thread: the caller passes `now_ms` and closes what it is told
//! to close. The event loops that serve client connections drive it
//! through `gate::Gate` (one shared instance, behind a short
//! mutex per event): `poll_timeout` for their timer, `handle_timeout`
//! when it fires.
//!
//! The policy (`docs/operating/quired.md`, "Client connection bounds"):
//!
//! - Every accepted connection starts *unauthenticated* and must complete
//!   its Hello within `hello_timeout_ms`, or it is closed.
//! - Unauthenticated connections have a budget of their own,
//!   `unauthenticated_max`; a successful Hello moves a connection to the
//!   budget of authenticated ones, `connections_max`. The two never mix:
//!   however many connections sit without a Hello, the authenticated ones
//!   keep their slots, and a new client can always get an unauthenticated
//!   slot, because when that budget is full the *oldest* unauthenticated
//!   connection (the one that has had the longest to say Hello) is
//!   evicted to make room. To keep a newcomer out an attacker would have
//!   to open `unauthenticated_max` connections within the newcomer's
//!   round trip.
//! - One source address holds at most `connections_per_source_max`
//!   connections, both kinds counted. A new connection over it evicts the
//!   oldest unauthenticated connection *of that address*, so a flood from
//!   one address only displaces itself; if all of that address's
//!   connections are authenticated, the newcomer is refused.
//! - A Hello that succeeds while `connections_max` connections are
//!   already authenticated is refused (the server answers Unavailable).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

/// Default `client.hello_timeout_ms`.
pub const HELLO_TIMEOUT_MS_DEFAULT: u64 = 5000;
/// Default `client.connections_max`: authenticated connections (each
/// costs two threads today).
pub const CONNECTIONS_MAX_DEFAULT: usize = 10_000;
/// Default `client.unauthenticated_max`: connections before their Hello.
pub const UNAUTHENTICATED_MAX_DEFAULT: usize = 64;
/// Default `client.connections_per_source_max`.
pub const CONNECTIONS_PER_SOURCE_MAX_DEFAULT: usize = 256;

/// The bounds of the client server (the `[client]` section).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientLimits {
    /// Longest a connection may take from accept to a successful Hello, ms.
    pub hello_timeout_ms: u64,
    /// Authenticated connections at once.
    pub connections_max: usize,
    /// Connections that have not completed their Hello, at once.
    pub unauthenticated_max: usize,
    /// Connections from one source address, authenticated or not.
    pub connections_per_source_max: usize,
}

impl Default for ClientLimits {
    fn default() -> Self {
        ClientLimits {
            hello_timeout_ms: HELLO_TIMEOUT_MS_DEFAULT,
            connections_max: CONNECTIONS_MAX_DEFAULT,
            unauthenticated_max: UNAUTHENTICATED_MAX_DEFAULT,
            connections_per_source_max: CONNECTIONS_PER_SOURCE_MAX_DEFAULT,
        }
    }
}

impl ClientLimits {
    /// Checks the bounds; a message starts with the field at fault.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=600_000).contains(&self.hello_timeout_ms) {
            return Err(format!(
                "hello_timeout_ms {} is outside 1..=600000 (ten minutes)",
                self.hello_timeout_ms
            ));
        }
        for (name, v) in [
            ("connections_max", self.connections_max),
            ("unauthenticated_max", self.unauthenticated_max),
            (
                "connections_per_source_max",
                self.connections_per_source_max,
            ),
        ] {
            if v == 0 {
                return Err(format!("{name} is 0: no client could connect"));
            }
        }
        Ok(())
    }
}

/// A connection's handle in the policy, never reused.
pub type ConnId = u64;

/// What to do with a newly accepted connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Serve it as `id`; first close `evict` (an older unauthenticated
    /// connection whose slot it takes), if any.
    Accept {
        /// The new connection's id.
        id: ConnId,
        /// The connection to close to make room.
        evict: Option<ConnId>,
    },
    /// Close it at once: its source address already holds
    /// `connections_per_source_max` connections, all authenticated.
    Refuse,
}

/// One connection the policy holds a slot for.
#[derive(Clone, Copy, Debug)]
struct Conn {
    source: IpAddr,
    /// `Some(deadline)` until its Hello succeeds.
    hello_deadline_ms: Option<u64>,
}

/// The admission state of one client server (see the module doc).
#[derive(Debug)]
pub struct Admission {
    limits: ClientLimits,
    next_id: ConnId,
    conns: HashMap<ConnId, Conn>,
    /// Unauthenticated connections by id: ids grow with time, so the first
    /// is the oldest.
    waiting: BTreeMap<ConnId, u64>,
    authenticated: usize,
    per_source: HashMap<IpAddr, usize>,
}

impl Admission {
    /// An empty server with these bounds (checked by `validate`).
    pub fn new(limits: ClientLimits) -> Admission {
        assert!(limits.validate().is_ok(), "{:?}", limits.validate());
        Admission {
            limits,
            next_id: 1,
            conns: HashMap::new(),
            waiting: BTreeMap::new(),
            authenticated: 0,
            per_source: HashMap::new(),
        }
    }

    /// Call when a connection from `source` has been accepted, before
    /// serving it; close the evicted one, or the new one if refused.
    #[must_use = "the verdict says which connection to close"]
    pub fn admit(&mut self, source: IpAddr, now_ms: u64) -> Admit {
        let mut evict = None;
        if self.per_source.get(&source).copied().unwrap_or(0)
            >= self.limits.connections_per_source_max
        {
            let oldest = self
                .waiting
                .keys()
                .copied()
                .find(|id| self.conns[id].source == source);
            match oldest {
                Some(old) => {
                    self.remove(old);
                    evict = Some(old);
                }
                None => return Admit::Refuse,
            }
        }
        if self.waiting.len() >= self.limits.unauthenticated_max {
            let old = *self.waiting.keys().next().expect("the budget is not 0");
            self.remove(old);
            // At most one eviction is needed: the per-source one above also
            // freed a slot here.
            debug_assert!(evict.is_none());
            evict = Some(old);
        }
        let id = self.next_id;
        self.next_id += 1;
        let deadline = now_ms.saturating_add(self.limits.hello_timeout_ms);
        self.conns.insert(
            id,
            Conn {
                source,
                hello_deadline_ms: Some(deadline),
            },
        );
        self.waiting.insert(id, deadline);
        *self.per_source.entry(source).or_default() += 1;
        debug_assert!(self.waiting.len() <= self.limits.unauthenticated_max);
        Admit::Accept { id, evict }
    }

    /// Call when connection `id`'s Hello has succeeded: true if it moved
    /// to the authenticated budget; false if that is full (refuse it, then
    /// call `closed`) or `id` is no longer held (it was evicted or timed
    /// out meanwhile: close it).
    pub fn authenticate(&mut self, id: ConnId) -> bool {
        let Some(c) = self.conns.get_mut(&id) else {
            return false;
        };
        if c.hello_deadline_ms.is_none() {
            return true;
        }
        if self.authenticated >= self.limits.connections_max {
            return false;
        }
        c.hello_deadline_ms = None;
        self.waiting.remove(&id);
        self.authenticated += 1;
        debug_assert!(self.authenticated <= self.limits.connections_max);
        true
    }

    /// Call when connection `id` has closed, for whatever reason; frees
    /// its slots. A connection the policy already let go (evicted, timed
    /// out) is ignored.
    pub fn closed(&mut self, id: ConnId) {
        self.remove(id);
    }

    /// When connection `id` must have completed its Hello; `None` once it
    /// has (or if it is not held).
    pub fn hello_deadline_ms(&self, id: ConnId) -> Option<u64> {
        self.conns.get(&id)?.hello_deadline_ms
    }

    /// The earliest Hello deadline of any connection: when to call
    /// `handle_timeout` next.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<u64> {
        self.waiting.values().min().copied()
    }

    /// Call at or after `poll_timeout`: the connections whose Hello
    /// deadline has passed, each returned once; close them. Their slots
    /// are free from now.
    #[must_use = "the expired connections must be closed"]
    pub fn handle_timeout(&mut self, now_ms: u64) -> Vec<ConnId> {
        let expired: Vec<ConnId> = self
            .waiting
            .iter()
            .filter(|(_, &d)| d <= now_ms)
            .map(|(&id, _)| id)
            .collect();
        for &id in &expired {
            self.remove(id);
        }
        expired
    }

    /// Connections holding an authenticated slot.
    pub fn authenticated(&self) -> usize {
        self.authenticated
    }

    /// Connections holding an unauthenticated slot.
    pub fn unauthenticated(&self) -> usize {
        self.waiting.len()
    }

    /// Connections held from `source`.
    pub fn from_source(&self, source: IpAddr) -> usize {
        self.per_source.get(&source).copied().unwrap_or(0)
    }

    fn remove(&mut self, id: ConnId) {
        let Some(c) = self.conns.remove(&id) else {
            return;
        };
        match c.hello_deadline_ms {
            Some(_) => {
                self.waiting.remove(&id);
            }
            None => self.authenticated -= 1,
        }
        let n = self.per_source.get_mut(&c.source).expect("counted");
        *n -= 1;
        if *n == 0 {
            self.per_source.remove(&c.source);
        }
        debug_assert_eq!(self.conns.len(), self.waiting.len() + self.authenticated);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    fn limits() -> ClientLimits {
        ClientLimits {
            hello_timeout_ms: 300,
            connections_max: 3,
            unauthenticated_max: 4,
            connections_per_source_max: 2,
        }
    }

    fn accept(a: &mut Admission, source: IpAddr, now: u64) -> (ConnId, Option<ConnId>) {
        match a.admit(source, now) {
            Admit::Accept { id, evict } => (id, evict),
            Admit::Refuse => panic!("refused"),
        }
    }

    #[test]
    fn a_full_unauthenticated_budget_evicts_its_oldest_and_never_an_authenticated_one() {
        let mut a = Admission::new(limits());
        let (good, _) = accept(&mut a, ip(1), 0);
        assert!(a.authenticate(good));
        // Idle connections from four addresses fill the budget of four.
        let idle: Vec<ConnId> = (2..6).map(|s| accept(&mut a, ip(s), 1).0).collect();
        assert_eq!(a.unauthenticated(), 4);
        // A fifth evicts the oldest idle one, not the authenticated one.
        let (new, evict) = accept(&mut a, ip(9), 2);
        assert_eq!(evict, Some(idle[0]));
        assert!(a.authenticate(new));
        assert_eq!((a.authenticated(), a.unauthenticated()), (2, 3));
        assert_eq!(a.hello_deadline_ms(good), None);
        // The evicted one's close is a no-op; it cannot authenticate late.
        a.closed(idle[0]);
        assert!(!a.authenticate(idle[0]));
        assert_eq!((a.authenticated(), a.unauthenticated()), (2, 3));
    }

    #[test]
    fn one_source_over_its_limit_displaces_only_itself() {
        let mut a = Admission::new(limits());
        let (other, _) = accept(&mut a, ip(3), 0);
        let (first, _) = accept(&mut a, ip(2), 1);
        let (second, _) = accept(&mut a, ip(2), 2);
        // The third from 127.0.0.2 evicts 127.0.0.2's oldest, not 127.0.0.3's.
        let (third, evict) = accept(&mut a, ip(2), 3);
        assert_eq!(evict, Some(first));
        assert_eq!(a.from_source(ip(2)), 2);
        assert_eq!(a.hello_deadline_ms(other), Some(300));
        // Once both of its connections are authenticated, it is refused.
        assert!(a.authenticate(second) && a.authenticate(third));
        assert_eq!(a.admit(ip(2), 4), Admit::Refuse);
        a.closed(second);
        assert!(matches!(
            a.admit(ip(2), 5),
            Admit::Accept { evict: None, .. }
        ));
    }

    #[test]
    fn the_hello_deadline_expires_each_connection_once() {
        let mut a = Admission::new(limits());
        let (x, _) = accept(&mut a, ip(2), 0);
        let (y, _) = accept(&mut a, ip(3), 100);
        let (z, _) = accept(&mut a, ip(4), 100);
        assert!(a.authenticate(z));
        assert_eq!(a.poll_timeout(), Some(300));
        assert_eq!(a.hello_deadline_ms(x), Some(300));
        assert!(a.handle_timeout(299).is_empty());
        assert_eq!(a.handle_timeout(300), vec![x]);
        assert_eq!(a.handle_timeout(300), Vec::<ConnId>::new());
        assert_eq!(a.poll_timeout(), Some(400));
        assert_eq!(a.handle_timeout(10_000), vec![y]);
        assert_eq!(a.poll_timeout(), None);
        // The authenticated one has no deadline and stays.
        assert_eq!((a.authenticated(), a.unauthenticated()), (1, 0));
        a.closed(x);
        assert_eq!(a.from_source(ip(2)), 0);
    }

    #[test]
    fn a_hello_beyond_the_authenticated_budget_is_refused() {
        let mut a = Admission::new(ClientLimits {
            connections_per_source_max: 10,
            ..limits()
        });
        let ids: Vec<ConnId> = (0..4).map(|t| accept(&mut a, ip(1), t).0).collect();
        assert!(ids[..3].iter().all(|&id| a.authenticate(id)));
        assert!(!a.authenticate(ids[3]), "connections_max is 3");
        assert_eq!(a.hello_deadline_ms(ids[3]), Some(303));
        a.closed(ids[0]);
        assert!(a.authenticate(ids[3]));
    }

    #[test]
    fn limits_are_checked() {
        assert!(ClientLimits::default().validate().is_ok());
        let zero = ClientLimits {
            unauthenticated_max: 0,
            ..ClientLimits::default()
        };
        assert!(zero
            .validate()
            .unwrap_err()
            .starts_with("unauthenticated_max "));
        let slow = ClientLimits {
            hello_timeout_ms: 0,
            ..ClientLimits::default()
        };
        assert!(slow
            .validate()
            .unwrap_err()
            .starts_with("hello_timeout_ms "));
    }
}
