//! quire: a replication appliance. Appends are confirmed only once they are
//! on stable storage on a majority of hosts.
//!
//! The crate is layered (see `docs/architecture.md`): sans-IO cores that
//! never touch a clock, file or socket ([`consensus`], [`transport`],
//! [`heartbeat`], [`state`], [`api`], and the pure parts of [`storage`]),
//! and the code that feeds them: the node runtime ([`node`]: one pinned
//! event loop per core, the daemon `quired`) on its drivers (the WAL and
//! [`io`] for the disk, [`net`] for UDP, [`serial`] for the RS-232
//! heartbeat), the [`client`] library, and the deterministic simulator
//! ([`sim`]), which drives the cores through glue of its own.

#![warn(missing_docs, unreachable_pub)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod api;
pub mod bench;
pub mod buf;
pub mod client;
pub mod consensus;
pub mod entropy;
pub mod heartbeat;
pub mod io;
pub mod net;
pub mod node;
pub mod serial;
pub mod sigpipe;
pub mod sim;
pub mod state;
pub mod storage;
pub mod tls;
pub mod transport;
pub mod tune;
