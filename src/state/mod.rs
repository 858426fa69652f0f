//! The replicated state machine's building blocks: sans-IO, deterministic,
//! applied from committed entries on every replica alike.

pub mod dedup;
pub mod ledger;
pub mod machine;
pub mod queue;
mod wire;

pub use machine::{
    decode_state_entry, encode_state_entry, BadSnapshot, Command, Error, Outcome, StateMachine,
    STATE_ENTRY,
};
