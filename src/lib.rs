//! quire: a replication appliance. Appends are confirmed only once they are
//! on stable storage on a majority of hosts.
//!
//! The crate is layered (see ARCHITECTURE.md in the shared docs):
//! sans-IO cores that never touch a clock, file or socket ([`consensus`]),
//! and drivers that feed them: the deterministic simulator ([`sim`]) now,
//! the io_uring node daemon later.

#![warn(missing_docs, unreachable_pub)]

pub mod api;
pub mod bench;
pub mod client;
pub mod consensus;
pub mod heartbeat;
pub mod io;
pub mod net;
pub mod node;
pub mod serial;
pub mod sim;
pub mod state;
pub mod storage;
pub mod transport;
pub mod tune;
