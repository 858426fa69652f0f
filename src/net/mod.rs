//! The UDP socket driver of the replication transport: it runs a
//! [`crate::transport::Endpoint`] (the sans-IO protocol core) over real
//! sockets. This module owns the group sockets and every socket syscall
//! of the transport; the protocol itself (sequence numbers, NACKs,
//! windows, MACs) lives in the core and nothing here second-guesses it.
//!
//! - **One socket per group**, bound on `base_port + group`, so that the
//!   core that owns a group owns its socket and RSS can steer its packets
//!   there. Bound exclusively (no SO_REUSEADDR, no SO_REUSEPORT): no other
//!   socket can share the port and receive the group's datagrams. For
//!   now one [`UdpDriver`] owns the sockets of the groups of its thread;
//!   it is `Send` but never shared.
//! - **Buffers** sized from [`UdpConfig`]; where the kernel grants less
//!   (net.core.rmem_max / wmem_max) the [`BindReport`] says so and how to
//!   fix it. Datagrams the kernel then drops show up as `RcvbufErrors` in
//!   /proc/net/snmp: [`UdpSnmp::read`].
//! - **Batched I/O**: `sendmmsg` and `recvmmsg`. Runs of same-size
//!   datagrams to one peer go out as one UDP GSO message (`UDP_SEGMENT`),
//!   and with `UDP_GRO` the kernel may hand up several datagrams as one
//!   message, split again here. Both are probed at bind, and GSO falls
//!   back to single datagrams at run time if the kernel refuses it (EIO,
//!   EINVAL), with the reason recorded ([`UdpDriver::gso`]) and noticed.
//! - **Responsive while sending**: a flush of a whole window takes many
//!   batches (milliseconds of MACs and syscalls); every
//!   `flush_recv_every_datagrams` the driver reads what has arrived,
//!   without waiting, so a NACK is answered within a few batches and not
//!   after the window.
//! - **Order across sockets**: a channel's frames can ride in another
//!   group's datagrams, so with several sockets the driver reads a share
//!   of each ready socket per round and feeds the endpoint in kernel
//!   receive-timestamp order (SO_TIMESTAMPNS), not socket by socket.
//! - **Errors degrade, never stop the loop**: a failed send drops that
//!   datagram (the protocol retransmits), counted in [`NetStats`] and
//!   described in [`UdpDriver::take_notices`], a bounded number of times.
//!   Only a failing `ppoll` is returned as an error.
//!
//! - **AF_XDP** ([`xdp`]): with `net.backend = "auto" | "xdp"` the groups'
//!   datagrams bypass the kernel's stack through an AF_XDP socket per loop
//!   and an XDP program per node; the sockets stay bound and carry the
//!   rest. Where it cannot run, the reason is kept for the log and
//!   `/status`.
//!
//! Nothing here reads configuration files or spawns threads; the node
//! wiring does that. Only the owning thread touches a driver.

mod config;
mod driver;
pub mod netns;
pub mod nft;
mod rx;
mod socket;
mod stats;
mod tx;

pub use config::{PeerMap, UdpConfig, GSO_SEGMENTS_KERNEL_MAX, UDP_PAYLOAD_BYTES_MAX};
pub use driver::{BindReport, Offload, UdpDriver};
pub use stats::{NetStats, UdpSnmp};
pub mod xdp;
