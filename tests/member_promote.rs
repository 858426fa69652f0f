//! `quire member voter` promotes only a learner that has caught up
//! (issue 17, item 10). Three real daemons (`LocalProcesses`), driven
//! through the `quire member` CLI with the admin token: a learner whose
//! daemon is stopped while appends run is refused with how far behind it
//! is (409), a node that is not a learner is refused (400), a caught-up
//! learner is promoted, and `--force` (which sends `force=1`) overrides.

mod common;

use quire::client::Client;
use quire::node::local::processes::LocalProcesses;
use quire::node::LEARNER_CAUGHT_UP_ENTRIES_MAX;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

const SLOW: Duration = Duration::from_secs(20);

/// `quire member --admin A --admin-token-file F --group 0 CHANGE --node N [extra]`.
fn member(admin: SocketAddr, token: &Path, change: &str, node: u64, extra: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_quire"))
        .args(["member", "--admin", &admin.to_string(), "--group", "0"])
        .arg("--admin-token-file")
        .arg(token)
        .args([change, "--node", &node.to_string()])
        .args(extra)
        .output()
        .unwrap()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "quire member failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The stderr of a refused `quire member` (exit code 1).
fn refused(out: &Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected a refusal: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Appends `n` records one at a time: each waits for the one before, so
/// each is an entry of its own (a leader gathers a turn's appends into
/// one entry, and the learner bound counts entries).
fn append(c: &LocalProcesses, n: usize, what: &str) {
    let id = quire::client::random_client_id().unwrap();
    let mut client = Client::new(c.client_addrs(), &c.token, id);
    let records: Vec<Vec<u8>> = (0..n).map(|i| format!("{what} {i}").into_bytes()).collect();
    client
        .append_all(0, &records, 1, 1)
        .expect("appends confirmed");
}

/// Makes `id` a learner that is far behind: out of the group, back as a
/// learner, then its daemon stopped while `entries` appends commit.
fn lagging_learner(c: &mut LocalProcesses, admin: SocketAddr, token: &Path, id: u64) {
    ok(&member(admin, token, "remove", id, &[]));
    ok(&member(admin, token, "learner", id, &[]));
    assert_eq!(common::group0_members(admin, "learners", SLOW), vec![id]);
    c.signal(id, libc::SIGTERM);
    c.wait(id);
    append(
        c,
        4 * LEARNER_CAUGHT_UP_ENTRIES_MAX as usize,
        "while it is down",
    );
}

#[test]
fn only_a_caught_up_learner_is_promoted_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = common::three_daemons(dir.path());
    let token = dir.path().join("admin.token");
    let leader = common::agreed_leader(&c, SLOW);
    let admin = c.nodes[&leader].admin;
    let mut others = c.nodes.keys().copied().filter(|&n| n != leader);
    let (victim, bystander) = (others.next().unwrap(), others.next().unwrap());
    append(&c, 10, "before");

    // Not a learner at all: 400, with the reason.
    let err = refused(&member(admin, &token, "voter", 9, &[]));
    assert!(err.contains("400"), "{err}");
    assert!(err.contains("node 9 is not a learner"), "{err}");
    let err = refused(&member(admin, &token, "voter", bystander, &[]));
    assert!(err.contains("400"), "{err}");
    assert!(
        err.contains(&format!("node {bystander} is already a voter")),
        "{err}"
    );
    // Also with --force: there is nothing to promote.
    let err = refused(&member(admin, &token, "voter", bystander, &["--force"]));
    assert!(err.contains("already a voter"), "{err}");

    // A learner whose daemon is down while appends commit: 409, how far
    // behind, the bound, and what to do.
    lagging_learner(&mut c, admin, &token, victim);
    let err = refused(&member(admin, &token, "voter", victim, &[]));
    assert!(err.contains("409"), "{err}");
    assert!(
        err.contains(&format!("node {victim} is a learner ")),
        "{err}"
    );
    let behind: u64 = err
        .split(" is a learner ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no entry count in {err}"));
    assert!(behind > LEARNER_CAUGHT_UP_ENTRIES_MAX, "{err}");
    assert!(
        err.contains(&format!(
            "entries behind the leader (at most {LEARNER_CAUGHT_UP_ENTRIES_MAX}): wait, or --force"
        )),
        "{err}"
    );
    assert_eq!(
        common::group0_members(admin, "learners", SLOW),
        vec![victim],
        "still a learner"
    );

    // Back up, it catches up and is promoted without --force. Until the
    // leader has its acknowledgements, the answer is the same 409.
    c.start(victim).expect("restarted");
    let promoted = common::wait_for("the learner to catch up and be promoted", SLOW, || {
        let out = member(admin, &token, "voter", victim, &[]);
        if out.status.success() {
            return Some(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("entries behind the leader"), "{err}");
        None
    })
    .0;
    assert!(
        promoted.contains(&format!("add voter {victim} applied")),
        "{promoted}"
    );
    assert!(
        common::group0_members(admin, "voters", SLOW).contains(&victim),
        "promoted"
    );

    // --force promotes a learner however far behind it is.
    lagging_learner(&mut c, admin, &token, bystander);
    let err = refused(&member(admin, &token, "voter", bystander, &[]));
    assert!(err.contains("entries behind the leader"), "{err}");
    let out = ok(&member(admin, &token, "voter", bystander, &["--force"]));
    assert!(
        out.contains(&format!("add voter {bystander} applied")),
        "{out}"
    );
    let voters = common::group0_members(admin, "voters", SLOW);
    assert!(voters.contains(&bystander), "{voters:?}");
    assert_eq!(voters.len(), 3, "{voters:?}");
    c.stop_all();
}
