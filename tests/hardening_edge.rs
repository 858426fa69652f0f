//! The edge of a node under abuse, on real `quired` processes
//! (`LocalProcesses`, 127.0.0.0/8 only):
//!
//! - a replication port taken by another socket stops `quired` with exit
//!   code 2 naming the port and its holder, so does a taken client port;
//!   while a node runs, no socket can bind its ports, not even with
//!   SO_REUSEADDR and SO_REUSEPORT, and a second `quired` on its config
//!   exits 2 naming the first;
//! - idle connections that never send a Hello, from several source
//!   addresses and over the per-source limit from one, do not keep a
//!   legitimate client out, are closed by the server after the Hello
//!   deadline (or evicted earlier), and show in `/metrics`;
//! - a wrong token costs one connection: the client library returns
//!   Unauthorized after one attempt, and `quire append` exits non-zero at
//!   once saying so once.
//!
//! Nothing here sleeps to synchronise: it polls a condition with a
//! generous deadline, and asserts counts, never wall-clock times.

mod common;

use quire::api::ErrorCode;
use quire::client::{Client, ClientError};
use quire::node::local::processes::LocalProcesses;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A generous bound for anything to happen on a loaded 2-core machine.
const LIMIT: Duration = Duration::from_secs(30);

fn prepare(dir: &Path, nodes: u64, extra_config: &str) -> LocalProcesses {
    let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_quired"));
    let procs = LocalProcesses::prepare(dir, nodes, 1, &exe).expect("cluster prepared");
    for n in procs.nodes.values() {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&n.config)
            .unwrap();
        f.write_all(extra_config.as_bytes()).unwrap();
    }
    procs
}

/// Waits for `child` to exit; its exit code.
fn exit_code(child: &mut Child, what: &str) -> Option<i32> {
    common::wait_for(what, LIMIT, || child.try_wait().ok().flatten())
        .0
        .code()
}

/// Node `id`'s daemon log so far.
fn log_of(procs: &LocalProcesses, id: u64) -> String {
    std::fs::read_to_string(procs.nodes[&id].config.with_file_name("quired.log"))
        .unwrap_or_default()
}

/// GET `path` from an admin endpoint: the body, if it answered 200.
fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let (code, body) = common::http(addr, "GET", path, "", Duration::from_secs(2))?;
    (code == 200).then_some(body)
}

/// An unlabelled metric's value in a Prometheus text exposition.
fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

/// Node `id`'s metrics, once its admin endpoint answers.
fn metrics(procs: &LocalProcesses, id: u64) -> String {
    let admin = procs.nodes[&id].admin;
    common::wait_for("the admin endpoint", LIMIT, || http_get(admin, "/metrics")).0
}

/// Until node `id` serves clients: its client port accepts.
fn wait_serving(procs: &LocalProcesses, id: u64) {
    metrics(procs, id);
    let client = procs.nodes[&id].client;
    common::wait_for("the client port", LIMIT, || {
        TcpStream::connect_timeout(&client, Duration::from_secs(1)).ok()
    });
}

/// A socket of `kind` bound to `addr` with SO_REUSEADDR and SO_REUSEPORT
/// set (and listening, for TCP): what a process that wants to share a
/// port would do.
fn bind_shared(kind: libc::c_int, addr: SocketAddr) -> std::io::Result<OwnedFd> {
    let SocketAddr::V4(v4) = addr else {
        panic!("IPv4 only here")
    };
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: v4.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(v4.ip().octets()),
        },
        sin_zero: [0; 8],
    };
    let one: libc::c_int = 1;
    // SAFETY: plain syscalls on a descriptor this function owns; pointers
    // to live locals with their sizes; every result is checked.
    unsafe {
        let fd = libc::socket(libc::AF_INET, kind | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let owned = OwnedFd::from_raw_fd(fd);
        for opt in [libc::SO_REUSEADDR, libc::SO_REUSEPORT] {
            let p = &one as *const libc::c_int as *const libc::c_void;
            let len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            if libc::setsockopt(fd, libc::SOL_SOCKET, opt, p, len) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        let sa = &sin as *const libc::sockaddr_in as *const libc::sockaddr;
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        if libc::bind(fd, sa, len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if kind == libc::SOCK_STREAM && libc::listen(fd, 16) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(owned)
    }
}

/// A TCP connection to `to` from source address `from` (port chosen by
/// the kernel): Linux routes all of 127/8 over lo.
fn connect_from(from: [u8; 4], to: SocketAddr) -> TcpStream {
    let SocketAddr::V4(to) = to else {
        panic!("IPv4 only here")
    };
    let sin = |ip: [u8; 4], port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(ip),
        },
        sin_zero: [0; 8],
    };
    let (local, remote) = (sin(from, 0), sin(to.ip().octets(), to.port()));
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: as in `bind_shared`; the descriptor goes to a TcpStream that
    // owns it from then on.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "{}", std::io::Error::last_os_error());
        let stream = TcpStream::from_raw_fd(fd);
        let l = &local as *const libc::sockaddr_in as *const libc::sockaddr;
        assert_eq!(
            libc::bind(fd, l, len),
            0,
            "{}",
            std::io::Error::last_os_error()
        );
        let r = &remote as *const libc::sockaddr_in as *const libc::sockaddr;
        assert_eq!(
            libc::connect(fd, r, len),
            0,
            "{}",
            std::io::Error::last_os_error()
        );
        stream
    }
}

/// Reads until the server closes the connection (EOF or a reset), at
/// most `LIMIT`; true if it did.
fn closed_by_server(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(LIMIT)).unwrap();
    let mut sink = Vec::new();
    match s.read_to_end(&mut sink) {
        Ok(_) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

#[test]
fn a_taken_port_stops_quired_with_exit_2_naming_the_port_and_its_holder() {
    let dir = tempfile::tempdir().unwrap();
    let mut procs = prepare(dir.path(), 3, "");
    let me = std::process::id();

    // Node 1's replication port, held the way a hijacker would (with
    // SO_REUSEADDR and SO_REUSEPORT): it must not start beside it.
    let udp = procs.nodes[&1].udp;
    let holder = bind_shared(libc::SOCK_DGRAM, SocketAddr::from(([127, 0, 0, 1], udp))).unwrap();
    procs.start(1).unwrap();
    let child = procs.nodes.get_mut(&1).unwrap().child.as_mut().unwrap();
    assert_eq!(exit_code(child, "node 1 to refuse"), Some(2));
    let log = log_of(&procs, 1);
    assert!(log.contains(&format!("udp port {udp} ")), "{log}");
    assert!(log.contains(&format!("by pid {me} ")), "{log}");
    assert!(!log.contains(" up: "), "it never started: {log}");
    drop(holder);

    // Node 2's client port, held by a listener: the same refusal.
    let client = procs.nodes[&2].client;
    let listener = std::net::TcpListener::bind(client).unwrap();
    procs.start(2).unwrap();
    let child = procs.nodes.get_mut(&2).unwrap().child.as_mut().unwrap();
    assert_eq!(exit_code(child, "node 2 to refuse"), Some(2));
    let log = log_of(&procs, 2);
    assert!(
        log.contains(&format!("tcp port {} ", client.port())) && log.contains("node.client_listen"),
        "{log}"
    );
    assert!(log.contains(&format!("by pid {me} ")), "{log}");
    drop(listener);
}

#[test]
fn a_running_node_owns_its_ports_and_a_second_quired_on_its_config_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let mut procs = prepare(dir.path(), 3, "");
    procs.start(1).unwrap();
    wait_serving(&procs, 1);
    let n = &procs.nodes[&1];
    let first = n.child.as_ref().unwrap().id();

    // No socket can bind its ports, whatever options it sets.
    for ip in [[127, 0, 0, 1], [0, 0, 0, 0]] {
        let e = bind_shared(libc::SOCK_DGRAM, SocketAddr::from((ip, n.udp)))
            .expect_err("the replication port is not shared");
        assert_eq!(e.raw_os_error(), Some(libc::EADDRINUSE), "{ip:?}: {e}");
        for port in [n.client.port(), n.admin.port()] {
            let e = bind_shared(libc::SOCK_STREAM, SocketAddr::from((ip, port)))
                .expect_err("a listener port is not shared");
            assert_eq!(
                e.raw_os_error(),
                Some(libc::EADDRINUSE),
                "{ip:?}:{port}: {e}"
            );
        }
    }

    // A second daemon on the same config refuses, naming the first.
    let mut second = Command::new(env!("CARGO_BIN_EXE_quired"))
        .arg("--config")
        .arg(&n.config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert_eq!(exit_code(&mut second, "the second quired"), Some(2));
    let mut stderr = String::new();
    second
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(stderr.contains(&format!("udp port {} ", n.udp)), "{stderr}");
    assert!(
        stderr.contains(&format!("by pid {first} (quired)")),
        "{stderr}"
    );
    let refusals = stderr
        .lines()
        .filter(|l| !l.starts_with("quired: warning:"));
    assert_eq!(refusals.count(), 1, "one line: {stderr}");

    // The first runs on, untouched.
    let child = procs.nodes.get_mut(&1).unwrap().child.as_mut().unwrap();
    assert!(child.try_wait().unwrap().is_none(), "the first still runs");
    metrics(&procs, 1);
}

#[test]
fn idle_connections_never_lock_out_an_authenticated_client() {
    let dir = tempfile::tempdir().unwrap();
    // Small budgets and a short deadline, so the test floods them cheaply.
    // Into the config's last section, [client].
    let cfg = "hello_timeout_ms = 500\nunauthenticated_max = 8\n\
               connections_per_source_max = 4\n";
    let mut procs = prepare(dir.path(), 1, cfg);
    procs.start_all().unwrap();
    wait_serving(&procs, 1);
    let addr = procs.nodes[&1].client;
    let mut good = Client::new(vec![addr], &procs.token, 1);
    good.deadline = LIMIT;
    good.append(0, b"before").expect("served before the flood");
    // The probes of `wait_serving` are gone: the flood alone fills the budget.
    common::wait_for("no unauthenticated connection held", LIMIT, || {
        let t = metrics(&procs, 1);
        (metric(&t, "quire_client_connections_unauthenticated") == 0).then_some(())
    });

    // 16 idle connections from four addresses (twice the unauthenticated
    // budget), and 10 from one more (over its per-source limit of 4).
    let mut idle: Vec<TcpStream> = Vec::new();
    for src in 2..=5u8 {
        idle.extend((0..4).map(|_| connect_from([127, 0, 0, src], addr)));
    }
    idle.extend((0..10).map(|_| connect_from([127, 0, 0, 6], addr)));

    // A client from 127.0.0.1 gets in at once, authenticates, appends.
    let mut late = Client::new(vec![addr], &procs.token, 2);
    late.deadline = LIMIT;
    late.append(0, b"during").expect("served during the flood");

    // The server closes every idle connection: evicted for a newer one,
    // or after its Hello deadline.
    for (i, s) in idle.iter_mut().enumerate() {
        assert!(closed_by_server(s), "idle connection {i} left open");
    }
    let text = common::wait_for("no unauthenticated connection held", LIMIT, || {
        let t = metrics(&procs, 1);
        (metric(&t, "quire_client_connections_unauthenticated") == 0).then_some(t)
    })
    .0;
    let evicted = metric(&text, "quire_client_connections_evicted");
    let timeouts = metric(&text, "quire_client_hello_timeouts");
    assert_eq!(evicted + timeouts, idle.len() as u64, "{text}");
    assert!(evicted >= 1 && timeouts >= 1, "{text}");
    assert_eq!(metric(&text, "quire_client_connections_refused"), 0);
    assert_eq!(metric(&text, "quire_client_auth_failures"), 0);
    assert!(metric(&text, "quire_client_connections_accepted") >= idle.len() as u64 + 2);
    assert!(metric(&text, "quire_client_connections_authenticated") >= 1);
    // Logged, but rate-limited: fewer eviction lines than evictions.
    let log = log_of(&procs, 1);
    let lines = |what: &str| log.lines().filter(|l| l.contains(what)).count() as u64;
    assert!(lines("no Hello within 500 ms") >= 1, "{log}");
    let evict_lines = lines("evicted before its Hello");
    assert!(evict_lines >= 1, "{log}");
    if evicted >= 4 {
        assert!(
            evict_lines < evicted,
            "{evict_lines} lines for {evicted}: {log}"
        );
    }
    // The cluster still serves.
    late.append(0, b"after").expect("served after the flood");
}

/// Client connections accepted over all nodes, and Hellos with a wrong
/// token.
fn accepted_and_refused(procs: &LocalProcesses) -> (u64, u64) {
    procs.nodes.keys().fold((0, 0), |(a, f), &id| {
        let t = metrics(procs, id);
        (
            a + metric(&t, "quire_client_connections_accepted"),
            f + metric(&t, "quire_client_auth_failures"),
        )
    })
}

#[test]
fn a_wrong_token_is_refused_after_one_connection() {
    let dir = tempfile::tempdir().unwrap();
    let mut procs = prepare(dir.path(), 3, "");
    procs.start_all().unwrap();
    for id in 1..=3 {
        wait_serving(&procs, id);
    }
    let mut good = Client::new(procs.client_addrs(), &procs.token, 1);
    good.deadline = LIMIT;
    good.append(0, b"the cluster is up").expect("confirmed");
    drop(good);

    // The library: one connection, one refusal, no retry anywhere.
    let (accepted, failures) = accepted_and_refused(&procs);
    let mut bad = Client::new(procs.client_addrs(), b"not the token", 2);
    bad.deadline = LIMIT;
    match bad.append(0, b"x") {
        Err(ClientError::Refused(ErrorCode::Unauthorized, _)) => {}
        other => panic!("want Refused(Unauthorized), got {other:?}"),
    }
    // The server counts a refusal after it has sent it: wait for the count.
    let after = common::wait_for("the auth failure counted", LIMIT, || {
        let now = accepted_and_refused(&procs);
        (now.1 > failures).then_some(now)
    })
    .0;
    assert_eq!(
        after,
        (accepted + 1, failures + 1),
        "one connection, one refusal"
    );

    // The CLI: non-zero at once, saying so once.
    let token_file = dir.path().join("wrong.token");
    std::fs::write(&token_file, "not the token\n").unwrap();
    let addrs: Vec<String> = procs.client_addrs().iter().map(|a| a.to_string()).collect();
    let (accepted, failures) = after;
    let out = Command::new(env!("CARGO_BIN_EXE_quire"))
        .args(["append", "--addr", &addrs.join(","), "--token-file"])
        .arg(&token_file)
        .args(["record one", "record two"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.to_lowercase().matches("unauthorized").count(),
        1,
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "nothing appended");
    let after = common::wait_for("the CLI's auth failure counted", LIMIT, || {
        let now = accepted_and_refused(&procs);
        (now.1 > failures).then_some(now)
    })
    .0;
    assert_eq!(
        after,
        (accepted + 1, failures + 1),
        "one connection, one refusal"
    );
}
