//! The node runtime: the loop that wires the sans-IO cores (consensus,
//! transport, heartbeat) to their drivers (the WAL on its I/O backend, the
//! UDP driver, the serial ports), for the groups of one node.
//!
//! [`NodeHandle::spawn_on`] runs group `g` on core `cores[g % len]`: one
//! event-loop thread per core that gets a group, pinned there, owning that
//! core's replicas, their logs and its UDP sockets ([`NodeHandle::spawn`]:
//! one unpinned loop for every group). The loop of the first group's core
//! is the *control* loop and also owns the serial ports, the failure
//! detector and the node's heartbeat; the others exchange with it over
//! channels only what the detector needs (`loops::event_loop`). Besides that,
//! only client requests cross loops (`mesh`); the handle talks to the
//! loops through channels (propose, status, stop) and each loop's eventfd
//! (`loops::waker`). The daemon (`daemon::quired`) adds the client server, whose
//! listener every loop polls: each loop serves the connections it accepts
//! on its own thread (`client::conns`), no thread per connection; and the
//! admin endpoint.
//!
//! Per turn a loop: waits in the UDP driver's `ppoll` on its sockets, its
//! eventfd, its client epoll set and (control) its serial ports, until the
//! next deadline and at most 10 ms (`TURN_MAX`; the eventfd wakes it at
//! once for commands, other cores' messages and WAL completions); serves
//! the queued commands; hands what the transport delivered to the replicas
//! (Raft) and the detector (heartbeats); serves the other cores' messages
//! and the serial lines; ticks Raft at its deadlines, checks its own
//! disks, sends the heartbeat every `keepalive_ms` on both channels, ticks
//! the detector and applies its events; serves its client connections
//! (requests read and dispatched, appends for its own groups proposed);
//! then drives every replica (the `Ready` contract: writes, messages, WAL
//! completions reported as durability, held messages released, applies,
//! reads, snapshots) and flushes the transport; last it routes the turn's
//! client ticket outcomes to the loops serving their connections and
//! writes each connection's answers. `docs/internals/node.md` has the turn
//! step by step.
//!
//! # Layers
//!
//! The files import one another in one direction only: a file may use a
//! file of a lower layer, never one of its own layer or above, so no
//! import cycle can form (`tests/node_layers.rs` checks this list against
//! the code, and refuses a file missing from it):
//!
//! 1. `log`, `loops/waker`, `loops/stall`, `loops/host`, `spec`, `client/stats`, `client/admission`, `client/quota`, `daemon/port_check`, `local/free_ports`, `admin/http_head`: leaves
//! 2. `status`, `errors`, `client/gate`, `client/credentials`, `admin/http`: status views, start errors, the client server's admission, who a client is and what it may do, the admin endpoint's HTTP server
//! 3. `command`, `daemon/config_file`, `admin/auth`, `admin/group_metrics`, `local/error`: commands and replies, the daemon's config file, who may change the cluster through the admin endpoint, each group's metrics, why a local cluster failed
//! 4. `mesh`, `admin/metrics`, `local/processes`: the inter-core mesh (control plane, and client requests between loops); `/metrics`; clusters of daemon processes
//! 5. `replica`, `loops/control`, `client/dispatch`: one group's glue; the control plane (serial ports, detector, heartbeat); client requests as node calls, pure
//! 6. `client/conn`: one client connection
//! 7. `client/conns`: the client connections one loop serves
//! 8. `client/routing`, `client/access`, `client/lifecycle`: where a request goes; what its principal may do; a connection accepted, expired, closed
//! 9. `loops/event_loop`: one core's loop, driving its replicas, its client connections and (control loop) the control plane
//! 10. `loops/open`, `loops/peers`: a loop wired at open; its traffic with its peers
//! 11. `loops/handle`: `NodeHandle`, which starts the loops and talks to them
//! 12. `local/in_process`, `admin/endpoint`: clusters in one process; the admin endpoint
//! 13. `client/server`: the client-facing TCP server: the listener, handed to the loops
//! 14. `daemon/quired`: `quired`
//!
//! This file only declares the files and re-exports the public API.

pub mod admin;
pub mod client;
mod command;
pub mod daemon;
mod errors;
pub mod local;
pub(crate) mod log;
pub(crate) mod loops;
mod mesh;
pub(crate) mod replica;
mod spec;
mod status;

pub(crate) use command::ClientTicket;
pub use command::{ProposeError, QueryReply, ReadReply, Reply, StateReply};
pub use errors::{ListenError, StartError};
pub use local::error::LocalClusterError;
pub use local::in_process::LocalCluster;
pub use loops::handle::NodeHandle;
pub use replica::LEARNER_CAUGHT_UP_ENTRIES_MAX;
pub use spec::{GroupSpec, NodeSpec, PeerSpec, SpecError, SNAPSHOT_INTERVAL_MS, STALL_GRACE_MS};
pub use status::{
    GroupView, LinkView, NodeStatus, PeerView, RepairStats, ScrubStats, SnapshotStats, StallView,
    TransportView, WalView,
};
