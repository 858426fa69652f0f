//! The pinned event loops of a node and what runs them.
//!
//! - `event_loop`: one core's loop, driving its replicas, its client
//!   connections and (on the control loop) the control plane;
//! - `open`: wiring a loop; `peers`: its transport and heartbeat traffic;
//! - `control`: the control plane: serial ports, failure detector,
//!   heartbeat;
//! - `handle`: `NodeHandle`, which starts the loops and talks to them;
//! - `waker`: a loop's eventfd;
//! - `stall`: a disk that stops answering;
//! - `host`: the OS behind the replicas' `Host` (clock, threads,
//!   randomness).

pub(super) mod control;
pub(super) mod event_loop;
pub(super) mod handle;
pub(crate) mod host;
mod open;
mod peers;
pub(super) mod stall;
pub(super) mod waker;
