//! What the CLI takes in before it sends anything: records from its
//! arguments or, given `-`, one per line from stdin (handed over in
//! batches as the lines arrive, so `seq 1000 | quire append ... -` is
//! pipelined and `tail -f F | quire append ... -` sends each line as it
//! comes); and the checks that name an argument and its limit before the
//! cluster would refuse it with "invalid argument".

use std::io::BufRead;
use std::sync::mpsc::{sync_channel, Receiver, TryRecvError};

/// Lines read from stdin but not yet taken, at most (the reader thread
/// waits beyond, so a fast producer does not fill memory).
const STDIN_LINES_QUEUED_MAX: usize = 4096;

/// Where the records come from.
pub(crate) enum Records {
    /// The arguments, all in one batch.
    Args(Option<Vec<Vec<u8>>>),
    /// Stdin, a line each, read on a thread of its own.
    Stdin {
        lines: Receiver<std::io::Result<Vec<u8>>>,
        /// A line taken that did not fit the last batch.
        held: Option<Vec<u8>>,
    },
}

impl Records {
    /// The records of `args`: stdin's lines if it is exactly `-`.
    pub(crate) fn from_args(args: Vec<String>) -> Records {
        if args.len() == 1 && args[0] == "-" {
            let (tx, rx) = sync_channel(STDIN_LINES_QUEUED_MAX);
            std::thread::spawn(move || {
                let mut stdin = std::io::stdin().lock();
                loop {
                    let mut line = Vec::new();
                    match stdin.read_until(b'\n', &mut line) {
                        Ok(0) => return,
                        Ok(_) => {
                            if line.ends_with(b"\n") {
                                line.pop();
                                if line.ends_with(b"\r") {
                                    line.pop();
                                }
                            }
                            if tx.send(Ok(line)).is_err() {
                                return;
                            }
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            return;
                        }
                    }
                }
            });
            Records::Stdin {
                lines: rx,
                held: None,
            }
        } else {
            Records::Args(Some(args.into_iter().map(String::into_bytes).collect()))
        }
    }

    /// The next batch: at least one record (waiting for stdin's next
    /// line), then whatever has already arrived, up to `count_max`
    /// records and `bytes_max` bytes (a single larger record goes alone,
    /// for the cluster to refuse by name); `None` once there are no more.
    pub(crate) fn next_batch(
        &mut self,
        count_max: usize,
        bytes_max: usize,
    ) -> Result<Option<Vec<Vec<u8>>>, String> {
        match self {
            Records::Args(args) => Ok(args.take()),
            Records::Stdin { lines, held } => {
                let first = match held.take() {
                    Some(l) => l,
                    None => match lines.recv() {
                        Ok(l) => l.map_err(|e| format!("reading stdin: {e}"))?,
                        Err(_) => return Ok(None),
                    },
                };
                let mut bytes = first.len();
                let mut batch = vec![first];
                while batch.len() < count_max {
                    match lines.try_recv() {
                        Ok(l) => {
                            let l = l.map_err(|e| format!("reading stdin: {e}"))?;
                            if bytes + l.len() > bytes_max {
                                *held = Some(l);
                                break;
                            }
                            bytes += l.len();
                            batch.push(l);
                        }
                        Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                    }
                }
                Ok(Some(batch))
            }
        }
    }
}

/// A queue name as the state machine takes it: 1 to
/// `QUEUE_NAME_BYTES_MAX` bytes of UTF-8 (a clap value parser).
pub(crate) fn queue_name(s: &str) -> Result<String, String> {
    let max = quire::state::queue::QUEUE_NAME_BYTES_MAX;
    if s.is_empty() || s.len() > max {
        return Err(format!(
            "a queue name is 1 to {max} bytes; this one is {} bytes",
            s.len()
        ));
    }
    Ok(s.to_string())
}

/// A log index for `--from`: the log's first entry is at index 1.
pub(crate) fn log_index(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(0) => Err("the log's first index is 1".into()),
        Ok(i) => Ok(i),
        Err(e) => Err(format!("not an index: {e}")),
    }
}
