//! Durable log storage: the on-disk format, the recovery scan, and the
//! write-ahead log that group-commits a Raft group's entries to disk.
//!
//! `format`, `superblock` and `recovery` are pure: bytes in, bytes out.
//! `wal` drives them through an [`crate::io::IoBackend`] (io_uring, or the
//! portable pwrite + fdatasync fallback).

pub mod dir;
pub mod format;
pub mod recovery;
pub mod superblock;
pub mod wal;

pub use dir::{LogDir, LogFile, OsDir};
pub use wal::{
    read_located, scrub_located, write_snapshot_file, write_snapshot_in, CachedRead, DiskState,
    LocatedRange, OpenReport, ScrubResult, Ticket, Wal, WalConfig, WalError, WalMetrics,
};
