//! Serving clients: the listener, the connections each loop serves, what
//! they may do and how much of it.
//!
//! - `server`: the client-facing TCP (and TLS) listener, handed to the
//!   loops;
//! - `conns`: the connections one loop serves, each turn; `conn`, one of
//!   them; `lifecycle`, accepting, expiring and closing them; `routing`,
//!   a request to the loop that owns its group; `access`, what its
//!   principal may do and its quota;
//! - `dispatch`: a client request as a node call, and its answer (pure);
//! - `admission`, `gate`: how many connections and requests a node takes
//!   (bounds, counted refusals);
//! - `credentials`, `quota`: who a client is, what it may do, at what
//!   rate;
//! - `stats`: the client server's counters.

mod access;
pub mod admission;
mod conn;
pub(super) mod conns;
pub mod credentials;
pub mod dispatch;
pub(super) mod gate;
mod lifecycle;
pub mod quota;
mod routing;
pub mod server;
pub mod stats;
