//! Why AF_XDP cannot be used here: typed, so the node can tell a setting
//! that can never work on this interface (a loopback address, an MTU too
//! large for a UMEM frame) from the kernel refusing a map, a program or a
//! socket (no privileges, no AF_XDP), and keep the OS's error as the
//! source.

use std::fmt;
use std::io;
use std::net::IpAddr;

use super::{XDP_FRAME_BYTES, XDP_MTU_MAX, XDP_RX_HEADROOM_BYTES};

/// Why [`XdpNode::open`](super::XdpNode::open) or
/// [`XdpNode::port`](super::XdpNode::port) failed.
#[derive(Debug)]
pub enum XdpError {
    /// The UDP address is unspecified (`0.0.0.0`, `::`): no one interface.
    Unspecified(IpAddr),
    /// The interface holding the address could not be found.
    Interface {
        /// The address.
        local: IpAddr,
        /// What the lookup said.
        source: io::Error,
    },
    /// The address is on the loopback interface, which has no XDP path.
    Loopback {
        /// The address.
        local: IpAddr,
        /// The interface's name.
        iface: String,
    },
    /// `transport.mtu_bytes` does not fit a UMEM frame.
    MtuTooLarge {
        /// The MTU asked for.
        mtu_bytes: usize,
    },
    /// The interface's MTU is below `transport.mtu_bytes`.
    InterfaceMtu {
        /// The interface's name.
        iface: String,
        /// Its MTU.
        iface_mtu: u32,
        /// The MTU asked for.
        mtu_bytes: usize,
    },
    /// The UDP ports are chosen by the kernel (`udp.base_port = 0`): the
    /// program cannot be told them before the sockets are bound.
    KernelChosenPorts,
    /// A group's port would be above 65535.
    NoPort {
        /// The group.
        group: u32,
    },
    /// The kernel refused the XSKMAP.
    Map(io::Error),
    /// The kernel refused the program.
    Load(io::Error),
    /// Neither native nor generic XDP could be attached.
    Attach {
        /// Why native XDP was refused.
        native: io::Error,
        /// Why generic XDP was refused.
        generic: io::Error,
    },
    /// The interface has no receive queue for this loop.
    NoQueue {
        /// The interface's name.
        iface: String,
        /// Its receive queues.
        queues: u32,
        /// The queue the loop would need.
        queue: u32,
    },
    /// The AF_XDP socket or its UMEM could not be opened.
    Socket(io::Error),
    /// The kernel's neighbour table could not be opened.
    Neighbours(io::Error),
}

impl fmt::Display for XdpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            XdpError::Unspecified(local) => write!(
                f,
                "the UDP address {local} is unspecified: AF_XDP needs the address of one interface"
            ),
            XdpError::Interface { source, .. } => source.fmt(f),
            XdpError::Loopback { local, iface } => write!(
                f,
                "{local} is on the loopback interface {iface}, which has no XDP path"
            ),
            XdpError::MtuTooLarge { mtu_bytes } => write!(
                f,
                "transport.mtu_bytes {mtu_bytes} does not fit a {XDP_FRAME_BYTES}-byte UMEM frame \
                 with the kernel's {XDP_RX_HEADROOM_BYTES}-byte headroom (no multi-buffer XDP yet): \
                 at most {XDP_MTU_MAX} with AF_XDP"
            ),
            XdpError::InterfaceMtu {
                iface,
                iface_mtu,
                mtu_bytes,
            } => write!(
                f,
                "interface {iface} has MTU {iface_mtu}, below transport.mtu_bytes {mtu_bytes}"
            ),
            XdpError::KernelChosenPorts => {
                f.write_str("udp.base_port is 0 (ports chosen by the kernel)")
            }
            XdpError::NoPort { group } => write!(f, "group {group} has no UDP port below 65536"),
            XdpError::Map(e) | XdpError::Load(e) | XdpError::Socket(e) | XdpError::Neighbours(e) => {
                e.fmt(f)
            }
            XdpError::Attach { native, generic } => {
                write!(f, "{native}; generic XDP too: {generic}")
            }
            XdpError::NoQueue {
                iface,
                queues,
                queue,
            } => write!(
                f,
                "interface {iface} has {queues} receive queues; this loop would need queue {queue}"
            ),
        }
    }
}

impl std::error::Error for XdpError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            XdpError::Interface { source, .. } => Some(source),
            XdpError::Map(e)
            | XdpError::Load(e)
            | XdpError::Socket(e)
            | XdpError::Neighbours(e) => Some(e),
            XdpError::Attach { generic, .. } => Some(generic),
            XdpError::Unspecified(_)
            | XdpError::Loopback { .. }
            | XdpError::MtuTooLarge { .. }
            | XdpError::InterfaceMtu { .. }
            | XdpError::KernelChosenPorts
            | XdpError::NoPort { .. }
            | XdpError::NoQueue { .. } => None,
        }
    }
}
