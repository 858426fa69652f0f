//! The node runtime: the loop that wires the sans-IO cores (consensus,
//! transport, heartbeat) to their drivers (the WAL on its I/O backend, the
//! UDP driver, the serial ports), for the groups of one node.
//!
//! One [`NodeHandle::spawn`] runs one event-loop thread that owns
//! everything it drives: its replicas and their logs, its UDP sockets, its
//! serial ports and its failure detector. Nothing is shared; the handle
//! talks to the loop through channels (propose, status, stop). Spreading a
//! node's groups over several pinned cores is the daemon's job (see
//! ARCHITECTURE.md); this loop is what each of those threads runs.
//!
//! Per turn the loop: waits in the UDP driver (at most 1 ms, so the serial
//! ports and the WAL's completions are seen promptly); feeds delivered
//! messages to the replicas; reaps WAL completions, reporting durability to
//! Raft and releasing the messages that waited for it; ticks Raft and the
//! detector at their deadlines; reads and writes the serial lines; sends
//! its heartbeat every `keepalive_ms` on both channels; serves commands.

pub mod admin;
mod admin_auth;
pub mod client_admission;
mod client_gate;
pub mod client_server;
pub mod client_stats;
mod config;
pub mod config_file;
pub mod daemon;
mod errors;
mod event_loop;
mod handle;
mod local;
pub(crate) mod log;
pub mod port_check;
pub mod processes;
mod replica;
mod stall;
mod waker;

pub use config::{GroupSpec, NodeSpec, PeerSpec, SpecError, SNAPSHOT_INTERVAL_MS, STALL_GRACE_MS};
pub use errors::{ListenError, StartError};
pub use handle::{
    GroupView, LinkView, NodeHandle, NodeStatus, PeerView, ProposeError, QueryReply, ReadReply,
    Reply, StallView, StateReply, TransportView, WalView,
};
pub use local::LocalCluster;
pub use replica::{SnapshotStats, LEARNER_CAUGHT_UP_ENTRIES_MAX};

/// A seed from the OS for what must differ at every start (session
/// epochs, election jitter); falls back to the clock and the pid.
pub(crate) fn os_seed() -> u64 {
    use std::io::Read;
    let mut b = [0u8; 8];
    match std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)) {
        Ok(()) => u64::from_le_bytes(b),
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            t ^ (std::process::id() as u64).rotate_left(32)
        }
    }
}
