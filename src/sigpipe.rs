//! What a closed pipe does to the binaries: a command whose reader went
//! away (`quire status | head -1`, `quire-sim ... | head`) ends quietly,
//! as `cat` does, instead of panicking on EPIPE with exit code 101; a
//! process that others depend on (the daemon, `quire up`'s cluster) must
//! see EPIPE and go on. The sockets send with MSG_NOSIGNAL, so only
//! stdout and stderr raise SIGPIPE.

/// Sets what SIGPIPE does to this process: end it (the default action)
/// or nothing (writes to a closed pipe fail with EPIPE). Call before any
/// thread starts.
pub fn on_closed_pipe(end_quietly: bool) {
    let action = if end_quietly {
        libc::SIG_DFL
    } else {
        libc::SIG_IGN
    };
    // SAFETY: SIG_DFL and SIG_IGN install no handler, so nothing runs in
    // signal context; the disposition is process-wide and set before any
    // other thread exists.
    unsafe { libc::signal(libc::SIGPIPE, action) };
}
