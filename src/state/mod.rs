//! The replicated state machine's building blocks: sans-IO, deterministic,
//! applied from committed entries on every replica alike.

pub mod dedup;
