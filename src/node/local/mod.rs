//! Local clusters on 127.0.0.1, for `quire up`, the tests and the
//! benchmarks: never a production path.
//!
//! - `in_process`: `LocalCluster`, every node's loops in this process;
//! - `processes`: real daemon processes, with their keys, tokens and
//!   config files written for them;
//! - `free_ports`: ports nobody holds, for both;
//! - `error`: [`LocalClusterError`], why either failed.

pub mod error;
pub(super) mod free_ports;
pub mod in_process;
pub mod processes;
