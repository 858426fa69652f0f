//! Hardening of the admin endpoint and of what quire leaves on disk, on
//! three real `quired` processes (`LocalProcesses`, `quire up`'s layout):
//!
//! - `POST /membership` needs the admin token (`admin.token`, not the
//!   client token): without it 401, with a wrong one or the client
//!   token 403, from a browser
//!   (an `Origin` header) 403, and the voter stays; refusals are counted
//!   in `/metrics` and logged, at most a line a second; a change that
//!   cannot apply answers 400/404/409 with the reason; with the token the
//!   change applies and is logged with who asked; replacing the token
//!   file rotates the token without a restart; `quire member` sends the
//!   token from `--admin-token-file`;
//! - every file quire creates under the cluster directory (keys, tokens,
//!   configs, daemon logs, WAL segments, superblock, lock, snapshot slots)
//!   is 0600 and every directory 0700, and no daemon warns about a secret
//!   readable by others.

mod common;

use quire::client::Client;
use quire::node::local::processes::LocalProcesses;

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const SLOW: Duration = Duration::from_secs(20);

/// One HTTP/1.1 request with `headers` (`Name: value\r\n` each); the
/// status code and the body, or `None` if the node does not answer.
fn http(addr: SocketAddr, method: &str, path: &str, headers: &str) -> Option<(u16, String)> {
    common::http(addr, method, path, headers, SLOW)
}

fn metrics(addr: SocketAddr) -> String {
    http(addr, "GET", "/metrics", "").expect("metrics").1
}

fn voters(addr: SocketAddr) -> Vec<u64> {
    common::group0_members(addr, "voters", SLOW)
}

fn bearer(token: &[u8]) -> String {
    format!(
        "Authorization: Bearer {}\r\n",
        String::from_utf8_lossy(token)
    )
}

fn log_of(c: &LocalProcesses, id: u64) -> String {
    std::fs::read_to_string(c.nodes[&id].config.with_file_name("quired.log")).unwrap()
}

fn refusals(text: &str, reason: &str) -> u64 {
    common::reason_count(text, "quire_admin_refusals", reason)
}

#[test]
fn membership_changes_need_the_admin_token_and_refusals_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let c = common::three_daemons(dir.path());
    let leader = common::agreed_leader(&c, SLOW);
    let victim = *c.nodes.keys().find(|&&n| n != leader).unwrap();
    let bystander = *c
        .nodes
        .keys()
        .find(|&&n| n != leader && n != victim)
        .unwrap();
    let admin = c.nodes[&leader].admin;
    let remove = format!("/membership?group=0&change=remove&node={victim}");
    let post = |path: &str, headers: &str| http(admin, "POST", path, headers).expect("an answer");
    let first_refusal = Instant::now();

    // No credential: 401, and the voter stays.
    let (code, body) = post(&remove, "");
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("Authorization: Bearer"), "{body}");
    // The client token is every client permission, but not admin.
    let (code, body) = post(&remove, &bearer(&c.token));
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains("principal \"cluster\" holds no \"admin\" grant"),
        "{body}"
    );
    // A token nobody holds.
    let (code, body) = post(&remove, &bearer(b"not-anyones-token-0123"));
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("not the admin token"), "{body}");
    // The right token from a browser (DNS rebinding, a cross-site form).
    let (code, body) = post(
        &remove,
        &format!("{}Origin: http://evil\r\n", bearer(&c.admin_token)),
    );
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("browser"), "{body}");
    assert!(voters(admin).contains(&victim), "still a voter");

    let m = metrics(admin);
    assert_eq!(refusals(&m, "missing_token"), 1, "{m}");
    assert_eq!(refusals(&m, "wrong_token"), 1, "{m}");
    assert_eq!(refusals(&m, "not_admin"), 1, "{m}");
    assert_eq!(refusals(&m, "browser"), 1, "{m}");
    assert_eq!(refusals(&m, "not_configured"), 0, "{m}");

    // A flood of refusals is counted in full but logged at most once a
    // second (plus the first line).
    for _ in 0..20 {
        assert_eq!(post(&remove, "").0, 401);
    }
    let elapsed_s = first_refusal.elapsed().as_secs();
    assert_eq!(refusals(&metrics(admin), "missing_token"), 21);
    let lines = log_of(&c, leader)
        .lines()
        .filter(|l| l.contains("admin: refused"))
        .count() as u64;
    assert!(
        (1..=elapsed_s + 2).contains(&lines),
        "{lines} refusal lines in {elapsed_s} s"
    );

    // Changes that cannot apply say why, and none is a 503.
    let token = bearer(&c.admin_token);
    let (code, body) = post("/membership?group=0&change=remove&node=9", &token);
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("node 9 is not a member"), "{body}");
    let (code, body) = post("/membership?group=0&change=remove&node=0", &token);
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("node 0 is reserved"), "{body}");
    let (code, body) = post(
        &format!("/membership?group=5&change=remove&node={victim}"),
        &token,
    );
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("group 5 is not on this node"), "{body}");
    let (code, body) = http(c.nodes[&bystander].admin, "POST", &remove, &token).unwrap();
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("not the leader"), "{body}");
    assert!(voters(admin).contains(&victim), "still a voter");

    // The admin token: applied, and logged with who and what.
    let (code, body) = post(&remove, &token);
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains(&format!("remove node {victim} applied")),
        "{body}"
    );
    assert!(!voters(admin).contains(&victim), "removed");
    let log = log_of(&c, leader);
    let line = log
        .lines()
        .find(|l| l.contains("admin: membership change") && l.contains(" 200 "))
        .unwrap_or_else(|| panic!("no log line of the change:\n{log}"));
    assert!(line.contains("127.0.0.1:"), "who: {line}");
    assert!(line.contains(&format!("node={victim}")), "what: {line}");
    assert!(line.contains("as the admin token"), "as whom: {line}");

    // Rotation: replace the file (atomically); no restart.
    let file = dir.path().join("admin.token");
    let new_token = b"rotated-0123456789abcdef";
    std::fs::write(dir.path().join("admin.token.new"), new_token).unwrap();
    std::fs::rename(dir.path().join("admin.token.new"), &file).unwrap();
    let learner = format!("/membership?group=0&change=learner&node={victim}");
    let (code, body) = post(&learner, &token);
    assert_eq!(code, 403, "the old token is refused: {body}");
    let (code, body) = post(&learner, &bearer(new_token));
    assert_eq!(code, 200, "{body}");
    let v = common::admin_status(admin, SLOW).unwrap();
    assert_eq!(v["groups"][0]["learners"], serde_json::json!([victim]));

    // `quire member` sends the token from --admin-token-file.
    let member = |token_file: &Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_quire"))
            .args(["member", "--admin", &admin.to_string(), "--group", "0"])
            .arg("--admin-token-file")
            .arg(token_file)
            .args(["voter", "--node", &victim.to_string()])
            .output()
            .unwrap()
    };
    let out = member(&dir.path().join("client.token"));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("403"), "{err}");
    // Promoted once the leader has the learner's acknowledgements (until
    // then it is refused as behind: tests/member_promote.rs).
    common::wait_for("the learner promoted", SLOW, || {
        let out = member(&file);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() || err.contains("entries behind the leader"),
            "{err}"
        );
        out.status.success().then_some(())
    });
    assert!(voters(admin).contains(&victim), "promoted");
}

/// Every file under `dir` (not following symlinks: the cables' PTY links)
/// whose mode lets anyone but its owner in.
fn open_to_others(dir: &Path, out: &mut Vec<String>, seen: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        if meta.file_type().is_symlink() {
            continue;
        }
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            out.push(format!("{} {mode:o}", path.display()));
        }
        if meta.is_dir() {
            open_to_others(&path, out, seen);
        }
        seen.push(path);
    }
}

#[test]
fn everything_quire_writes_is_its_owners_only() {
    // The usual umask lets others read (0644); with it, only the modes
    // quire asks for keep its files private.
    // SAFETY: umask has no preconditions; the daemons inherit it.
    unsafe { libc::umask(0o022) };
    let dir = tempfile::tempdir().unwrap();
    // Small snapshots, so the snapshot slot files exist too.
    let c = common::three_daemons_tuned(dir.path(), |config| {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(config)
            .unwrap();
        writeln!(f, "\n[snapshot]\nentries = 8").unwrap();
    });
    let mut client = Client::new(c.client_addrs(), &c.token, 11);
    client.deadline = SLOW;
    for i in 0..30 {
        client
            .append(0, format!("record {i}").as_bytes())
            .expect("confirmed");
    }
    for n in c.nodes.values() {
        common::wait_for("a snapshot on every node", SLOW, || {
            let taken =
                common::admin_status(n.admin, SLOW)?["groups"][0]["snapshot"]["taken"].as_u64()?;
            (taken >= 1).then_some(())
        });
    }

    let mut bad = Vec::new();
    let mut seen = Vec::new();
    open_to_others(dir.path(), &mut bad, &mut seen);
    assert!(bad.is_empty(), "open to others: {bad:#?}");
    let names: Vec<String> = seen
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for want in [
        "cluster.key",
        "client.token",
        "admin.token",
        "node.toml",
        "quired.log",
        "superblock",
        "lock",
        "log0",
        "cables",
    ] {
        assert!(names.iter().any(|n| n == want), "no {want} in {names:?}");
    }
    assert!(names.iter().any(|n| n.ends_with(".seg")), "{names:?}");
    assert!(names.iter().any(|n| n.contains("snap")), "{names:?}");
    for &id in c.nodes.keys() {
        let log = log_of(&c, id);
        assert!(!log.contains("readable by other users"), "{log}");
    }
}
