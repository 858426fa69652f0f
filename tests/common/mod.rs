//! Helpers shared by the integration tests: waiting on observable state
//! with a deadline (never a sleep), a three-daemon cluster and its admin
//! `/status`, and small loop-mounted filesystems.
#![allow(dead_code)] // each test binary uses its own subset

use quire::node::local::processes::LocalProcesses;
use quire::node::{GroupSpec, NodeHandle, NodeSpec};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Polls `f` until it returns a value or `limit` passes (then panics,
/// naming `what`); returns the value and how long it took. Polls are
/// [`POLL_INTERVAL`] apart: only `f` ends the wait, and the pause keeps
/// a test that asks a daemon's `/status` in a loop from taking a core
/// the daemons need on a 2-core host.
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> (T, Duration) {
    let started = Instant::now();
    loop {
        if let Some(v) = f() {
            return (v, started.elapsed());
        }
        assert!(started.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// The pause between two polls of [`wait_for`].
pub const POLL_INTERVAL: Duration = Duration::from_millis(2);

/// One HTTP/1.1 request with an empty body to an admin endpoint (extra
/// `headers` are whole lines, each ending in CRLF): the status code and
/// the body, or `None` if it does not answer within `limit`.
pub fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
    limit: Duration,
) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, limit).ok()?;
    s.set_read_timeout(Some(limit)).ok()?;
    s.set_write_timeout(Some(limit)).ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\n{headers}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Some((code, body.to_string()))
}

/// A node's admin `/status` as JSON, or `None` if it does not answer 200
/// within `limit`.
pub fn admin_status(addr: SocketAddr, limit: Duration) -> Option<serde_json::Value> {
    let (code, body) = http(addr, "GET", "/status", "", limit)?;
    (code == 200).then(|| serde_json::from_str(&body).ok())?
}

/// The node ids in group 0's `kind` list (`voters` or `learners`) of the
/// `/status` of the node whose admin endpoint is `addr`.
pub fn group0_members(addr: SocketAddr, kind: &str, limit: Duration) -> Vec<u64> {
    let v = admin_status(addr, limit).expect("the node's /status");
    v["groups"][0][kind]
        .as_array()
        .unwrap_or_else(|| panic!("no groups[0].{kind} in {v}"))
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect()
}

/// The id of group 0's leader once every node of `c` names the same one
/// in its `/status` (waiting up to `limit`), and it is the group's
/// preferred leader if the group has one: otherwise the leader hands
/// over to it after `timers.preferred_leader_hold_ms`, a term change
/// under a test that took the first leader for the lasting one.
pub fn agreed_leader(c: &LocalProcesses, limit: Duration) -> u64 {
    wait_for("an agreed leader", limit, || {
        let mut leader = None;
        for n in c.nodes.values() {
            let g = &admin_status(n.admin, limit)?["groups"][0];
            let l = g["leader"].as_u64()?;
            if leader.is_some_and(|x| x != l) {
                return None;
            }
            if g["preferred_leader"].as_u64().is_some_and(|p| p != l) {
                return None;
            }
            leader = Some(l);
        }
        leader
    })
    .0
}

/// Three `quired` daemons of one group under `dir` (`quire up`'s layout),
/// started once `tune` has seen each node's config file.
pub fn three_daemons_tuned(dir: &Path, tune: impl Fn(&Path)) -> LocalProcesses {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_quired"));
    let mut c = LocalProcesses::prepare(dir, 3, 1, &exe).expect("cluster prepared");
    for n in c.nodes.values() {
        tune(&n.config);
    }
    c.start_all().expect("daemons start");
    c
}

/// Three `quired` daemons of one group under `dir`, started.
pub fn three_daemons(dir: &Path) -> LocalProcesses {
    three_daemons_tuned(dir, |_| {})
}

/// Runs a command; true if it ran and succeeded.
pub fn run(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A fresh ext4 filesystem of `mib` MiB on a loop device, unmounted (and
/// thawed, if frozen) on drop.
pub struct LoopFs {
    mnt: PathBuf,
    frozen: bool,
    _dir: tempfile::TempDir,
}

impl LoopFs {
    /// Makes and mounts it, or says why it cannot (not root, no mkfs, no
    /// loop devices).
    pub fn new(mib: u64) -> Result<LoopFs, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root: loop mounts need root".into());
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let img = dir.path().join("fs.img");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir_all(&mnt).map_err(|e| e.to_string())?;
        std::fs::File::create(&img)
            .and_then(|f| f.set_len(mib << 20))
            .map_err(|e| e.to_string())?;
        if !run("mkfs.ext4", &["-q", "-F", img.to_str().unwrap()]) {
            return Err("mkfs.ext4 failed or is missing (Debian package e2fsprogs)".into());
        }
        if !run(
            "mount",
            &["-o", "loop", img.to_str().unwrap(), mnt.to_str().unwrap()],
        ) {
            return Err("mount -o loop failed (no loop devices here?)".into());
        }
        Ok(LoopFs {
            mnt,
            frozen: false,
            _dir: dir,
        })
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.mnt
    }

    /// Stalls every write to it (`fsfreeze -f`) until `thaw`.
    pub fn freeze(&mut self) -> Result<(), String> {
        if !run("fsfreeze", &["-f", self.mnt.to_str().unwrap()]) {
            return Err("fsfreeze -f failed (util-linux missing?)".into());
        }
        self.frozen = true;
        Ok(())
    }

    /// Lets writes through again.
    pub fn thaw(&mut self) {
        if self.frozen {
            run("fsfreeze", &["-u", self.mnt.to_str().unwrap()]);
            self.frozen = false;
        }
    }
}

/// Creates `path` as one preallocated file taking every free block of the
/// filesystem holding it (as root the reserved ones too): a ballast that
/// leaves the filesystem full until it is removed.
pub fn fill_up(path: &Path) {
    use std::os::unix::io::AsRawFd;
    let f = std::fs::File::create(path).expect("create the ballast");
    // SAFETY: statvfs on a NUL-terminated path into a zeroed struct.
    let free = unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        let dir = std::ffi::CString::new(path.parent().unwrap().to_str().unwrap()).unwrap();
        assert_eq!(libc::statvfs(dir.as_ptr(), &mut st), 0, "statvfs");
        st.f_bfree as u64 * st.f_frsize as u64
    };
    let mut len = free;
    while len > 0 {
        // SAFETY: fallocate on an open file descriptor we own.
        if unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len as libc::off_t) } == 0 {
            return;
        }
        len = len.saturating_sub(256 << 10);
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        self.thaw();
        run("umount", &["-l", self.mnt.to_str().unwrap()]);
    }
}

/// A one-node cluster of group 0 logging under `dir`, once it leads (a
/// single voter elects itself) and has applied a first append.
pub fn single_node(dir: &Path) -> Arc<NodeHandle> {
    let groups = vec![GroupSpec {
        group: 0,
        dir: dir.join("g0"),
    }];
    let node = Arc::new(NodeHandle::spawn(NodeSpec::loopback(1, vec![1], groups, 0)).unwrap());
    wait_for("the node to lead", Duration::from_secs(10), || {
        node.propose(0, b"x".to_vec(), Duration::from_secs(1)).ok()
    });
    node
}

/// `r` is the client error `Refused(code, why)` with `why` holding `words`.
pub fn assert_refused_with<T: std::fmt::Debug>(
    r: Result<T, quire::client::ClientError>,
    code: quire::api::ErrorCode,
    words: &str,
) {
    match r {
        Err(quire::client::ClientError::Refused(got, why)) if got == code => {
            assert!(why.contains(words), "{why:?} does not say {words:?}")
        }
        other => panic!("expected {code} saying {words:?}, got {other:?}"),
    }
}

/// The value of `metric{reason="REASON"}` in a `/metrics` text (panics,
/// showing the text, if it is not there).
pub fn reason_count(text: &str, metric: &str, reason: &str) -> u64 {
    let prefix = format!("{metric}{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix} in {text}"))
        .trim()
        .parse()
        .unwrap()
}

/// A client certificate for `cn` from `ca`, written as `dir/CN.pem` and
/// `dir/CN.key`; their paths.
pub fn issue_client_cert(
    dir: &Path,
    ca: &quire::tls::issue::LocalCa,
    cn: &str,
) -> (PathBuf, PathBuf) {
    let issued = ca
        .issue(&quire::tls::issue::CertRequest::client(cn))
        .unwrap();
    let (c, k) = (dir.join(format!("{cn}.pem")), dir.join(format!("{cn}.key")));
    std::fs::write(&c, issued.cert_pem).unwrap();
    std::fs::write(&k, issued.key_pem).unwrap();
    (c, k)
}

/// A one-node TLS cluster (`prepare_tls`) under `dir` asking clients for
/// certificates of `client_ca`, with `credentials` as its credentials
/// file, each `(file, token)` of `tokens` written next to it, and its
/// config passed through `edit` first; started.
pub fn mtls_node(
    dir: &Path,
    client_ca: &quire::tls::issue::LocalCa,
    credentials: &str,
    tokens: &[(&str, &str)],
    edit: impl FnOnce(&LocalProcesses, String) -> String,
) -> LocalProcesses {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_quired"));
    let mut procs = LocalProcesses::prepare_tls(dir, 1, 1, &exe).expect("cluster prepared");
    let ca_file = dir.join("client-ca.pem");
    std::fs::write(&ca_file, client_ca.cert_pem()).unwrap();
    std::fs::write(dir.join("credentials.toml"), credentials).unwrap();
    for (file, token) in tokens {
        std::fs::write(dir.join(file), format!("{token}\n")).unwrap();
    }
    // `prepare_tls` names credentials.toml in the config already, and
    // writes `[client]` last: the client CA goes there.
    let cfg = procs.nodes[&1].config.clone();
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(text.contains("credentials_file = \"../credentials.toml\""));
    let text = edit(&procs, text);
    std::fs::write(&cfg, format!("{text}tls_client_ca_file = {ca_file:?}\n")).unwrap();
    procs.start_all().unwrap();
    procs
}
