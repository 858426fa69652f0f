//! quire-bench, the fio-style benchmark: job options and files ([`cli`],
//! [`options`], [`jobfile`]), the open-loop runner ([`runner`]) over three
//! engines (the WAL alone, the UDP transport, the whole cluster through the
//! client library), statistics on HdrHistogram ([`stats`]), and normal,
//! JSON and terse output plus an SVG plot ([`report`], [`plot`]), and
//! the CPU time per operation of the daemons and of itself ([`cpu`]).
//! What fails is typed ([`error`]): a run's [`BenchError`], an
//! operation's [`OpError`] (counted by kind).
//!
//! This is a driver (it does I/O and reads clocks), not a core: the cores
//! it measures never import it. Only `runner` decides timing, and it reads
//! time through a `Clock` so tests can run it on a virtual one.

pub mod cli;
pub mod cluster_engine;
pub mod command_engine;
pub mod cpu;
pub mod engine;
pub mod error;
pub mod host;
pub mod jobfile;
pub mod options;
pub mod plot;
pub mod report;
pub mod run;
pub mod runner;
pub mod stats;
pub mod udp_engine;
pub mod wal_engine;

pub use error::{BenchError, OpError};
