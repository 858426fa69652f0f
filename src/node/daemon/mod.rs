//! The daemon, `quired`: its config file and the checks it makes before
//! anything starts.
//!
//! - `quired`: the process (config, port checks, loops, client server,
//!   admin endpoint, signals, exit codes);
//! - `config_file`: the TOML config file, parsed and checked whole;
//! - `port_check`: who holds a port the config names.

pub mod config_file;
pub mod port_check;
pub mod quired;
