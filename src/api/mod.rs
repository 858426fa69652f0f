//! The client wire protocol, sans-IO: frames, messages and the per-connection
//! state machines of both ends.
//!
//! This module owns the bytes between a client and a node and nothing
//! else: it never touches a socket, a clock or a thread.
//!
//! - [`wire`]: the frame layout, [`Request`], [`Response`] and
//!   [`ErrorCode`], with a total decoder.

pub mod wire;

pub use wire::{DecodeError, EncodeError, Entry, ErrorCode, LeaderInfo, Request, Response};
