//! Three real `quired` on AF_XDP, each in a network namespace of its own
//! joined by a bridge (`net::netns`; addresses inside those namespaces
//! only), and the fallback to sockets where AF_XDP cannot run.
//!
//! - `three_daemons_replicate_over_af_xdp_and_survive_a_udp_cut`: every
//!   loop of every node reports the AF_XDP path in `/status`; appends are
//!   confirmed and read back identical on every node; the replication
//!   datagrams went through the rings (`xdp_tx_datagrams`,
//!   `xdp_rx_datagrams`); a UDP cut between the leader and a follower
//!   (an nftables rule on the bridge: a node's own input hook does not
//!   see XDP-redirected frames) is classified ip-partitioned by the
//!   leader (the serial link still up), does not stop appends, and after
//!   it heals the follower is up again and catches up to the same log. Needs root, `ip` and `nft`;
//!   prints why and passes otherwise.
//! - `on_loopback_auto_falls_back_to_sockets_and_says_why` and
//!   `on_loopback_backend_xdp_refuses_to_start`: the fallback, which runs
//!   everywhere.

mod common;

use quire::client::Client;
use quire::net::netns::TestNet;
use quire::node::local::processes::LocalProcesses;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// A liveness bound (2 shared cores), not a performance goal.
const LIMIT: Duration = Duration::from_secs(60);

fn say(text: &str) {
    let _ = writeln!(std::io::stderr(), "{text}");
}

fn quired() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_quired"))
}

/// `/status` of the node at `admin`, read from where the call runs.
fn status(admin: SocketAddr) -> Option<serde_json::Value> {
    let (code, body) = common::http(admin, "GET", "/status", "", Duration::from_secs(1))?;
    (code == 200).then(|| serde_json::from_str(&body).ok())?
}

/// Each loop's datagram path from a `/status`: (backend, detail).
fn net_paths(s: &serde_json::Value) -> Vec<(String, String)> {
    s["net"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|n| {
                    (
                        n["backend"].as_str().unwrap_or("").to_string(),
                        n["detail"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn sum(s: &serde_json::Value, key: &str) -> u64 {
    s["net"]
        .as_array()
        .map_or(0, |a| a.iter().filter_map(|n| n[key].as_u64()).sum())
}

/// Group 0's (role, commit) at `admin`.
fn group0(s: &serde_json::Value) -> (String, u64) {
    let g = &s["groups"][0];
    (
        g["role"].as_str().unwrap_or("").to_string(),
        g["commit"].as_u64().unwrap_or(0),
    )
}

/// Rewrites node configs of `procs` for the namespaces of `net`: every
/// address is the node's veth address (clients and the admin endpoint
/// too, so one namespace reaches them all over the bridge), the MTU the
/// veth's, and AF_XDP required.
fn into_namespaces(procs: &mut LocalProcesses, net: &TestNet) {
    let udp_ports: Vec<(u64, u16)> = procs.nodes.values().map(|n| (n.id, n.udp)).collect();
    let ip_of = |id: u64| net.nodes[id as usize - 1].v4;
    for node in procs.nodes.values_mut() {
        let ip = ip_of(node.id);
        let mut text = std::fs::read_to_string(&node.config).unwrap();
        let client = SocketAddr::new(ip, node.client.port());
        let admin = SocketAddr::new(ip, node.admin.port());
        text = text
            .replace(
                &format!("client_listen = \"{}\"", node.client),
                &format!("client_listen = \"{client}\""),
            )
            .replace(
                &format!("admin_listen = \"{}\"", node.admin),
                &format!("admin_listen = \"{admin}\""),
            )
            .replace("bind = \"127.0.0.1\"", &format!("bind = \"{ip}\""));
        for &(peer, port) in &udp_ports {
            text = text.replace(
                &format!("udp = \"127.0.0.1:{port}\""),
                &format!("udp = \"{}:{port}\"", ip_of(peer)),
            );
        }
        let text: String = text
            .lines()
            .map(|l| {
                if l.starts_with("mtu_bytes") {
                    "mtu_bytes = 1500".to_string()
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(
            &node.config,
            format!("{text}\n\n[net]\nbackend = \"xdp\"\nxdp_umem_frames = 1024\n"),
        )
        .unwrap();
        node.client = client;
        node.admin = admin;
        node.netns = Some(net.nodes[node.id as usize - 1].ns.clone());
    }
}

fn tail_of_logs(procs: &LocalProcesses) -> String {
    let mut out = String::new();
    for n in procs.nodes.values() {
        let log =
            std::fs::read_to_string(n.config.with_file_name("quired.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        out.push_str(&format!("---- node {}\n", n.id));
        for l in &lines[lines.len().saturating_sub(15)..] {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

#[test]
fn three_daemons_replicate_over_af_xdp_and_survive_a_udp_cut() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        say("SKIP three_daemons_replicate_over_af_xdp_and_survive_a_udp_cut: network namespaces need root (CI runs as root)");
        return;
    }
    let net = TestNet::create(3).unwrap_or_else(|e| panic!("namespaces: {e}"));
    let dir = tempfile::tempdir().unwrap();
    let mut procs = LocalProcesses::prepare(dir.path(), 3, 1, &quired()).unwrap();
    into_namespaces(&mut procs, &net);
    procs.start_all().unwrap();
    let admins: Vec<SocketAddr> = procs.nodes.values().map(|n| n.admin).collect();
    let clients = procs.client_addrs();
    let token = procs.token.clone();

    // Everything the test asks of the daemons goes from node 1's
    // namespace, over the bridge, like any client's traffic.
    let outcome = net.in_node(0, || {
        // Every loop of every node on AF_XDP, and a leader.
        let (leader, _) = common::wait_for("three nodes on AF_XDP with a leader", LIMIT, || {
            let mut leader = None;
            for (i, &a) in admins.iter().enumerate() {
                let s = status(a)?;
                let paths = net_paths(&s);
                if paths.is_empty() || paths.iter().any(|p| p.0 != "xdp") {
                    return None;
                }
                if group0(&s).0 == "leader" {
                    leader = Some(i);
                }
            }
            leader
        });
        for &a in &admins {
            let s = status(a).unwrap();
            say(&format!("node at {a}: {:?}", net_paths(&s)));
        }
        let mut c = Client::new(clients.clone(), &token, 1);
        c.deadline = Duration::from_secs(10);
        for i in 0..200 {
            c.append(0, format!("before the cut {i}").as_bytes())
                .expect("an append confirmed over AF_XDP");
        }
        // The cut: between the leader and one follower, both ways.
        let follower = (leader + 1) % 3;
        let cut = net
            .cut(leader, follower)
            .expect("an nftables rule on the bridge");
        // The detector tells the broken IP path from a dead node: the
        // serial link still carries heartbeats the rings do not.
        let peer_status = |observer: usize, peer: usize| -> Option<String> {
            let s = status(admins[observer])?;
            s["peers"]
                .as_array()?
                .iter()
                .find(|p| p["peer"].as_u64() == Some(peer as u64 + 1))
                .and_then(|p| p["status"].as_str().map(str::to_string))
        };
        common::wait_for(
            "the leader to see the follower ip-partitioned",
            LIMIT,
            || (peer_status(leader, follower)? == "ip-partitioned").then_some(()),
        );
        for i in 0..200 {
            c.append(0, format!("during the cut {i}").as_bytes())
                .expect("an append confirmed by the leader and the other follower");
        }
        let dropped = cut.dropped();
        drop(cut);
        common::wait_for("the follower up again after the heal", LIMIT, || {
            (peer_status(leader, follower)? == "up").then_some(())
        });
        for i in 0..50 {
            c.append(0, format!("after the cut {i}").as_bytes())
                .expect("an append confirmed after the heal");
        }
        // The cut follower catches up: every node commits the same index.
        let (commit, _) = common::wait_for("every node at one commit index", LIMIT, || {
            let commits: Vec<u64> = admins
                .iter()
                .map(|&a| status(a).map(|s| group0(&s).1))
                .collect::<Option<_>>()?;
            (commits.iter().all(|&x| x == commits[0]) && commits[0] >= 450).then_some(commits[0])
        });
        // The same log on every node, as each has applied it.
        let mut reader = Client::new(clients.clone(), &token, 2);
        reader.deadline = Duration::from_secs(10);
        let logs: Vec<Vec<(u64, u64, Vec<u8>)>> = (0..clients.len())
            .map(|i| {
                let mut out = Vec::new();
                let mut from = 1;
                // Pages until an empty one: the log is still now.
                loop {
                    let page = reader
                        .read_from(i, 0, from, 4096)
                        .expect("a node serves its committed log");
                    let Some(last) = page.last() else { break };
                    from = last.index + 1;
                    out.extend(page.into_iter().map(|e| (e.index, e.term, e.data.to_vec())));
                }
                out
            })
            .collect();
        let counters: Vec<(u64, u64, u64, u64)> = admins
            .iter()
            .map(|&a| {
                let s = status(a).unwrap();
                (
                    sum(&s, "xdp_tx_datagrams"),
                    sum(&s, "xdp_rx_datagrams"),
                    sum(&s, "xdp_tx_via_kernel"),
                    sum(&s, "xdp_rx_rejected"),
                )
            })
            .collect();
        (leader, follower, dropped, commit, logs, counters)
    });
    let (leader, follower, dropped, commit, logs, counters) = match outcome {
        Ok(o) => o,
        Err(e) => panic!("{e}\n{}", tail_of_logs(&procs)),
    };
    say(&format!(
        "leader node {}, cut from node {}: the bridge dropped {dropped:?} datagrams; \
         commit {commit}; AF_XDP (tx, rx, tx via kernel, rx rejected) per node: {counters:?}",
        leader + 1,
        follower + 1
    ));
    assert!(dropped.is_some_and(|n| n > 0), "the cut dropped nothing");
    for (i, l) in logs.iter().enumerate() {
        assert_eq!(l, &logs[0], "node {} serves another log", i + 1);
    }
    let ours =
        |d: &[u8]| d.starts_with(b"before") || d.starts_with(b"during") || d.starts_with(b"after");
    let appended = logs[0].iter().filter(|e| ours(&e.2)).count();

    assert_eq!(appended, 450, "every confirmed append, once");
    for (i, &(tx, rx, via_kernel, rejected)) in counters.iter().enumerate() {
        assert!(
            tx > 0 && rx > 0,
            "node {}: replication did not use the rings",
            i + 1
        );
        assert!(
            via_kernel * 10 < tx,
            "node {}: {via_kernel} of {tx} through the kernel",
            i + 1
        );
        assert_eq!(rejected, 0, "node {}: frames refused", i + 1);
    }
    procs.stop_all();
}

/// A one-node cluster on 127.0.0.1 with `net` appended to its config.
fn loopback_node(net: &str) -> (tempfile::TempDir, LocalProcesses) {
    let dir = tempfile::tempdir().unwrap();
    let procs = LocalProcesses::prepare(dir.path(), 1, 1, &quired()).unwrap();
    let node = &procs.nodes[&1];
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&node.config)
        .unwrap();
    writeln!(f, "\n[net]\n{net}").unwrap();
    (dir, procs)
}

#[test]
fn on_loopback_auto_falls_back_to_sockets_and_says_why() {
    let (_dir, mut procs) = loopback_node("backend = \"auto\"");
    procs.start_all().unwrap();
    let admin = procs.nodes[&1].admin;
    let (s, _) = common::wait_for("the node's /status", LIMIT, || status(admin));
    let paths = net_paths(&s);
    assert!(!paths.is_empty(), "no net in /status: {s}");
    for (backend, detail) in &paths {
        assert_eq!(backend, "sockets");
        assert!(
            detail.contains("AF_XDP unavailable") && detail.contains("loopback"),
            "{detail}"
        );
    }
    let log = std::fs::read_to_string(procs.nodes[&1].config.with_file_name("quired.log")).unwrap();
    assert!(
        log.contains("datagrams go through sockets: AF_XDP unavailable"),
        "{log}"
    );
    let mut c = Client::new(procs.client_addrs(), &procs.token, 1);
    c.deadline = Duration::from_secs(10);
    c.append(0, b"on sockets")
        .expect("confirmed on the socket path");
    procs.stop_all();
}

#[test]
fn on_loopback_backend_xdp_refuses_to_start() {
    let (_dir, mut procs) = loopback_node("backend = \"xdp\"");
    procs.start_all().unwrap();
    common::wait_for("the daemon to refuse", LIMIT, || {
        procs.has_exited(1).then_some(())
    });
    let code = procs.wait(1);
    assert!(code.is_some_and(|c| c != 0), "exit code {code:?}");
    let log = std::fs::read_to_string(procs.nodes[&1].config.with_file_name("quired.log")).unwrap();
    assert!(
        log.contains("net.backend = \"xdp\" but AF_XDP cannot be used") && log.contains("loopback"),
        "{log}"
    );
}

#[test]
fn a_misspelt_backend_is_refused_naming_the_key() {
    let (_dir, mut procs) = loopback_node("backend = \"xpd\"");
    procs.start_all().unwrap();
    common::wait_for("the daemon to refuse", LIMIT, || {
        procs.has_exited(1).then_some(())
    });
    let code = procs.wait(1);
    assert_eq!(code, Some(2), "a config error exits with 2");
    let log = std::fs::read_to_string(procs.nodes[&1].config.with_file_name("quired.log")).unwrap();
    assert!(log.contains("net.backend") && log.contains("xpd"), "{log}");
}
