//! `quire up`: a local cluster of real daemons with emulated serial
//! cables, and the demonstration it runs on them (appends read back from
//! every node, a ledger fenced, a queue consumed, a read-only principal
//! refused), then each node's status and commands that work as printed.

use super::cli::{Target, TlsArgs};
use super::human;
use super::status::status;
use quire::client::Client;
use quire::node::daemon::quired;
use quire::node::local::processes::LocalProcesses;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The ledger and queue half of `quire up`'s demonstration: a ledger
/// written, fenced by a recovering reader and read back; a queue produced
/// to, consumed from and acked.
fn ledger_and_queue_demo(c: &mut Client) -> Result<(), String> {
    let e = |e: quire::client::ClientError| e.to_string();
    let w = c.ledger_create(0).map_err(e)?;
    for entry in ["first", "second", "third"] {
        c.ledger_append(0, w, entry.as_bytes()).map_err(e)?;
    }
    let info = c.ledger_open(0, w.id, true).map_err(e)?;
    let fenced = c.ledger_append(0, w, b"late").is_err();
    let read = c.ledger_read(0, w.id, 0, u64::MAX).map_err(e)?;
    say!(
        "ledger {}: 3 entries confirmed; opened with recovery (sealed at entry {}); the writer is {}; read back {} entries",
        w.id,
        human::opt(info.lac),
        if fenced { "fenced" } else { "NOT fenced" },
        read.len()
    );
    if !fenced || read.len() != 3 {
        return Err("the ledger demonstration went wrong".into());
    }
    // A queue name of its own, so a second run against the same cluster works.
    let queue = format!("demo-{}", w.id);
    c.queue_create(0, &queue, 5).map_err(e)?;
    let batch: Vec<Vec<u8>> = (1..=3).map(|i| format!("job {i}").into_bytes()).collect();
    let ids = c.produce(0, &queue, &batch).map_err(e)?;
    let got = c.consume(0, &queue, 10, 30_000).map_err(e)?;
    let acked = c
        .ack(0, &queue, &got.iter().map(|d| d.id).collect::<Vec<_>>())
        .map_err(e)?;
    say!(
        "queue {queue}: produced ids {}..{}, consumed {}, acked {acked}",
        ids.start,
        ids.end,
        got.len()
    );
    Ok(())
}

/// The file `quire up` writes into its directory first. A later `quire
/// up` deletes a directory that holds it (or is empty) and no other
/// without `--force`: `--dir` may name a directory of the user's own.
const UP_MARKER: &str = ".quire-up";

/// Makes way for `quire up` in `dir`: nothing to do if it does not exist
/// or is empty; deleted if an earlier `quire up` made it (or `force`);
/// otherwise refused, naming `--force`.
fn clear_up_dir(dir: &Path, force: bool) -> Result<(), String> {
    match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("--dir {}: {e}", dir.display())),
        Ok(mut entries) => {
            if entries.next().is_none() {
                return Ok(());
            }
        }
    }
    if !force && !dir.join(UP_MARKER).is_file() {
        return Err(format!(
            "--dir {} exists and quire up did not create it (it has no {UP_MARKER} file), so it is left as it is; name another --dir, or add --force to delete it and everything in it",
            dir.display()
        ));
    }
    std::fs::remove_dir_all(dir).map_err(|e| format!("clearing {}: {e}", dir.display()))
}

/// `p` as one shell word: as it is if it needs no quoting, else in single
/// quotes, so a printed command works when pasted.
fn shell_word(p: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-:,=+@%".contains(c);
    if !p.is_empty() && p.chars().all(plain) {
        p.to_string()
    } else {
        format!("'{}'", p.replace('\'', "'\\''"))
    }
}

/// Polls every node's status until each sees every link up on both
/// channels and every peer up (the serial heartbeat needs a few periods
/// after start), or `limit` passes; true if they did.
fn wait_for_links_up(c: &mut Client, nodes: usize, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let all_up = |v: &serde_json::Value, key: &str, field: &str| {
        v[key]
            .as_array()
            .is_some_and(|a| !a.is_empty() && a.iter().all(|l| l[field] == "up"))
    };
    let mut pending: Vec<usize> = (0..nodes).collect();
    while !pending.is_empty() {
        pending.retain(|&i| {
            let v = c
                .status(i)
                .ok()
                .and_then(|j| serde_json::from_str::<serde_json::Value>(&j).ok());
            !v.is_some_and(|v| all_up(&v, "links", "state") && all_up(&v, "peers", "status"))
        });
        if Instant::now() > deadline {
            return false;
        }
        if !pending.is_empty() {
            std::thread::sleep(Duration::from_millis(50)); // a heartbeat period is 100s of ms
        }
    }
    true
}

/// How a daemon of `quire up` ended, for its stop line: `exit 0`, or the
/// signal that killed it (a node someone SIGKILLed, say).
fn how_it_ended(status: Option<std::process::ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Some(s) => match (s.code(), s.signal()) {
            (Some(code), _) => format!("exit {code}"),
            (None, Some(sig)) => {
                let name = match sig {
                    libc::SIGKILL => "SIGKILL".to_string(),
                    libc::SIGTERM => "SIGTERM".to_string(),
                    libc::SIGABRT => "SIGABRT".to_string(),
                    libc::SIGSEGV => "SIGSEGV".to_string(),
                    libc::SIGHUP => "SIGHUP".to_string(),
                    libc::SIGINT => "SIGINT".to_string(),
                    n => format!("signal {n}"),
                };
                format!("killed by {name}")
            }
            (None, None) => "ended (no code, no signal)".into(),
        },
        None => "exit ?".into(),
    }
}

/// The read-only principal `quire up` makes (`reader`, credentials.toml):
/// it reads record `first` of group 0, and its append is refused.
fn reader_demo(cluster: &LocalProcesses, first: u64) -> Result<(), String> {
    let token = std::fs::read(cluster.dir.join("reader.token"))
        .map_err(|e| format!("reader.token: {e}"))?;
    let id = quire::client::random_client_id().map_err(|e| format!("a client id: {e}"))?;
    let mut reader = Client::new(cluster.client_addrs(), token.trim_ascii_end(), id);
    if let Some(tls) = cluster.client_tls().map_err(|e| e.to_string())? {
        reader = reader.with_tls(tls);
    }
    reader.deadline = Duration::from_secs(20);
    let read = reader
        .read(0, first, 1)
        .map_err(|e| format!("reading as \"reader\": {e}"))?;
    match reader.append(0, b"not allowed") {
        Err(quire::client::ClientError::Refused(quire::api::ErrorCode::Forbidden, message)) => {
            say!(
                "principal \"reader\" read {} record(s); its append was refused: {message}",
                read.len()
            );
            Ok(())
        }
        Ok(index) => Err(format!("the read-only principal appended at index {index}")),
        Err(e) => Err(format!("appending as \"reader\": {e}")),
    }
}

/// Asks the nodes in turn until one names a leader of group 0: that
/// node, and how long it took.
fn wait_for_leader(
    c: &mut Client,
    nodes: usize,
    within: Duration,
) -> Result<(u64, Duration), String> {
    let started = Instant::now();
    let mut last_error = String::from("no node answered yet");
    if nodes == 0 {
        return Err("no nodes to ask for a leader".into());
    }
    for i in (0..nodes).cycle() {
        match c.leaders(i) {
            Ok(groups) => {
                if let Some(g) = groups.iter().find(|g| g.group == 0 && g.leader != 0) {
                    return Ok((g.leader, started.elapsed()));
                }
            }
            // A node still starting refuses connections: ask the next.
            Err(e) => last_error = e.to_string(),
        }
        if started.elapsed() > within {
            return Err(format!(
                "no leader of group 0 within {} ({last_error})",
                human::duration(within)
            ));
        }
        std::thread::sleep(Duration::from_millis(10)); // a poll's pause
    }
    unreachable!("cycle never ends")
}

/// `quire up`.
pub(super) fn up(
    nodes: u64,
    groups: u32,
    dir: PathBuf,
    demo_only: bool,
    force: bool,
) -> Result<(), String> {
    clear_up_dir(&dir, force)?;
    quire::io::private::create_dir_all(&dir)
        .and_then(|()| {
            quire::io::private::write(
                &dir.join(UP_MARKER),
                "Written by `quire up`: the next `quire up` naming this directory deletes it.\n",
            )
        })
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let signals = quired::block_stop_signals();
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cluster =
        LocalProcesses::prepare_tls(&dir, nodes, groups, &exe).map_err(|e| e.to_string())?;
    // Absolute from here on (`prepare` made it so), for the printed commands.
    let dir = cluster.dir.clone();
    cluster.start_all().map_err(|e| e.to_string())?;
    let addrs = cluster.client_addrs();
    say!(
        "quire: {nodes} nodes starting in {} (logs: nodeN/quired.log)",
        dir.display()
    );
    let id = quire::client::random_client_id().map_err(|e| format!("a client id: {e}"))?;
    let mut c = Client::new(addrs.clone(), &cluster.token, id);
    if let Some(tls) = cluster.client_tls().map_err(|e| e.to_string())? {
        c = c.with_tls(tls);
    }
    c.deadline = Duration::from_secs(20);
    // The election apart from the appends: timed together, the first
    // number a newcomer reads would be mostly the processes' start.
    let (leader, elected_in) = wait_for_leader(&mut c, addrs.len(), Duration::from_secs(20))?;
    say!(
        "group 0 elected node {leader} its leader {} after the nodes started",
        human::duration(elected_in)
    );
    let started = Instant::now();
    let mut indexes = Vec::new();
    for i in 1..=5 {
        let record = format!("hello {i}");
        let index = c
            .append(0, record.as_bytes())
            .map_err(|e| format!("appending: {e}"))?;
        indexes.push(index);
        say!("appended {record:?} at index {index}");
    }
    say!(
        "5 appends confirmed in {} (durable on a majority; the first one connects to the leader)",
        human::duration(started.elapsed())
    );
    // Every node applies them: read each node's copy back.
    let deadline = Instant::now() + Duration::from_secs(10);
    let first = indexes[0];
    let mut copies = Vec::new();
    for i in 0..addrs.len() {
        loop {
            // The appends needed only a majority: a node may still be
            // starting (refusing connections) or applying; ask again.
            let got = match c.read_from(i, 0, first, 5) {
                Ok(got) => got,
                Err(_) if Instant::now() <= deadline => Vec::new(),
                Err(e) => return Err(e.to_string()),
            };
            if got.len() == 5 || Instant::now() > deadline {
                copies.push(got);
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let same = copies.windows(2).all(|w| w[0] == w[1]) && copies[0].len() == 5;
    if !same {
        return Err(format!("the nodes' copies differ: {copies:?}"));
    }
    say!("read back identical from {} nodes", copies.len());
    ledger_and_queue_demo(&mut c)?;
    reader_demo(&cluster, first)?;
    if !wait_for_links_up(&mut c, addrs.len(), Duration::from_secs(10)) {
        say!("not every link came up within 10 s (see the ALARM lines)");
    }
    let target = Target {
        addr: addrs.clone(),
        token_file: Some(dir.join("client.token")),
        tls: TlsArgs {
            ca: Some(dir.join("ca.pem")),
            ..TlsArgs::default()
        },
    };
    status(&target, false)?;
    // Commands that work as printed: this binary's own path (`quire` is
    // not on PATH after `cargo run`) and absolute paths.
    let quire = shell_word(&exe.to_string_lossy());
    let on = format!(
        "--addr {} --token-file {} --ca {}",
        addrs
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(","),
        shell_word(&dir.join("client.token").to_string_lossy()),
        shell_word(&dir.join("ca.pem").to_string_lossy())
    );
    say!();
    for n in cluster.nodes.values() {
        say!(
            "node {}: client {}, admin http://{}",
            n.id,
            n.client,
            n.admin
        );
    }
    say!("try: {quire} status {on}");
    say!(
        "     {quire} read {} --from {first}   (the read-only principal \"reader\": credentials.toml)",
        on.replace(
            &shell_word(&dir.join("client.token").to_string_lossy()),
            &shell_word(&dir.join("reader.token").to_string_lossy())
        )
    );
    say!("     {quire} append {on} 'my record'");
    say!("     {quire} ledger list {on}");
    say!("     {quire} queue create {on} jobs");
    say!("     {quire} queue produce {on} jobs 'my message'");
    let leader_admin = c
        .leaders(0)
        .ok()
        .and_then(|ls| ls.into_iter().find(|l| l.group == 0).map(|l| l.leader))
        .and_then(|l| cluster.nodes.get(&l))
        .map_or("LEADER_ADMIN".to_string(), |n| n.admin.to_string());
    say!(
        "     {quire} member --admin {leader_admin} --admin-token-file {} --group 0 CHANGE --node N   (CHANGE: learner, voter or remove)",
        shell_word(&dir.join("admin.token").to_string_lossy())
    );
    say!(
        "     {quire} leader --admin {leader_admin} --admin-token-file {} --group 0 --to N   (hand the leadership to node N; its clients follow at once)",
        shell_word(&dir.join("admin.token").to_string_lossy())
    );
    let admins: Vec<String> = cluster
        .nodes
        .values()
        .map(|n| n.admin.to_string())
        .collect();
    say!(
        "     curl -s http://{}/status   (admin endpoints: {}; GET /status and /metrics are open, changes need admin.token)",
        admins[0],
        admins.join(", ")
    );
    if !demo_only {
        say!("Ctrl-C stops the cluster cleanly.");
        quired::wait_for_signal(&signals);
    }
    let results = cluster.stop_all_statuses();
    let clean = results
        .iter()
        .all(|(_, status)| status.is_some_and(|s| s.code() == Some(0)));
    say!(
        "stopped: {}",
        results
            .iter()
            .map(|(id, status)| format!("node {id} {}", how_it_ended(*status)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if clean {
        Ok(())
    } else {
        Err("a node did not stop cleanly; see its quired.log".into())
    }
}

#[cfg(test)]
mod tests {
    use super::how_it_ended;
    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;

    #[test]
    fn a_stop_line_names_the_code_or_the_signal() {
        assert_eq!(how_it_ended(Some(ExitStatus::from_raw(0))), "exit 0");
        assert_eq!(how_it_ended(Some(ExitStatus::from_raw(3 << 8))), "exit 3");
        assert_eq!(
            how_it_ended(Some(ExitStatus::from_raw(libc::SIGKILL))),
            "killed by SIGKILL"
        );
        assert_eq!(
            how_it_ended(Some(ExitStatus::from_raw(libc::SIGBUS))),
            format!("killed by signal {}", libc::SIGBUS)
        );
        assert_eq!(how_it_ended(None), "exit ?");
    }
}
