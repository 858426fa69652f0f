//! The replicated state machine's building blocks: sans-IO, deterministic,
//! applied from committed entries on every replica alike.

pub mod dedup;
pub mod ledger;
pub mod machine;
pub mod query;
pub mod queue;
pub mod stored;
mod wire;

pub use machine::{BadSnapshot, Command, EntryCheck, Error, Outcome, StateMachine};
pub use query::{Answer, Query};
pub use stored::{Lookup, Stored, Unfilled};
