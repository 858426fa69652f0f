//! What a connection's principal may do now (`LoopClients::denied`), and
//! its write quota: charged per request, a connection over it held
//! (neither read nor served) until its bucket refills. It never reads
//! or writes a socket: a refusal is an answer like any other.

use super::conns::LoopClients;
use crate::api::{ErrorCode, Request, Response};
use crate::node::client::credentials::access_of;

impl LoopClients {
    /// The Forbidden answer to `req` if the connection's principal may
    /// not make it (counted and logged); `None` if it may. A node whose
    /// principals all have every permission checks nothing.
    pub(super) fn denied(&self, slot: u32, generation: u32, req: &Request) -> Option<Response> {
        if !self.port.limited {
            return None;
        }
        let c = self.conns.get(slot as usize)?.as_ref()?;
        if c.generation != generation {
            return None;
        }
        let principal = self.port.credentials.principal(c.session.principal()?)?;
        if principal.all {
            return None;
        }
        let access = access_of(req)?;
        if principal.allows(&access) {
            return None;
        }
        let why = principal.denial(&access);
        self.port.gate.denied(c.peer, &principal.name, &why);
        Some(Response::Error {
            code: ErrorCode::Forbidden,
            message: why,
            leader: None,
        })
    }

    /// Charges `req` to the quota of the connection's principal. The
    /// request itself is served: a quota delays the next ones
    /// (`over_quota`), it never refuses.
    pub(super) fn charge(&mut self, slot: u32, generation: u32, req: &Request, now_ms: u64) {
        // Fields borrowed apart: no reference count touched per request
        // (the Arcs are shared by every loop's core).
        let Some(quotas) = &self.port.quotas else {
            return;
        };
        let Some(Some(c)) = self.conns.get_mut(slot as usize) else {
            return;
        };
        if c.generation != generation {
            return;
        }
        let Some(principal) = c.session.principal() else {
            return;
        };
        quotas.charge(principal, req, now_ms.saturating_mul(1_000_000));
    }

    /// Holds connection `slot` if it has requests to serve and its
    /// principal is over its quota: true if it is held now.
    pub(super) fn over_quota(&mut self, slot: u32, now_ms: u64) -> bool {
        let Some(quotas) = &self.port.quotas else {
            return false;
        };
        let Some(Some(c)) = self.conns.get_mut(slot as usize) else {
            return false;
        };
        let Some(principal) = c
            .session
            .principal()
            .filter(|_| c.session.is_authenticated())
        else {
            return false;
        };
        if c.session.buffered_bytes() == 0 {
            return false;
        }
        let Some(until_ns) = quotas.hold(principal, now_ms.saturating_mul(1_000_000)) else {
            return false;
        };
        let until_ms = until_ns.div_ceil(1_000_000);
        c.held_until_ms = Some(until_ms);
        self.deadlines.insert((until_ms, slot, c.generation));
        true
    }
}
