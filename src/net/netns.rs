//! Network namespaces joined by a bridge, for the AF_XDP tests and
//! `quire-bench --net_backend`: the one way to run the XDP path on one
//! host without touching its real interfaces (loopback has no XDP path).
//!
//! [`TestNet::create`] makes one namespace per node, each with a veth
//! whose other end is a port of a bridge in a namespace of its own, and
//! addresses `10.<net>.0.<i+1>/24` and `fd00:<net>::<i+1>/64` inside the
//! node namespaces only. Loss and cuts are nftables rules in the bridge
//! namespace (the `bridge` family's forward hook), which sees every frame
//! between the nodes whichever path sent it: the `inet` input hook of a
//! node does not see frames an XDP program redirected, nor frames an
//! AF_XDP socket sent. Everything is removed when the guard drops, and
//! namespaces of test processes that died are removed at the next create.
//!
//! Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and `ip` and `nft`.

use super::nft::NftError;
use std::io;
use std::net::IpAddr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Prefix of every namespace this module makes: `qxn<pid>x<k>...`.
const PREFIX: &str = "qxn";

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Runs a command: `Unavailable` if its program is not installed,
/// `Failed` if it ran and failed.
fn run(args: &[&str]) -> Result<String, NftError> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| {
            let why = format!("{}: {e}", args.join(" "));
            if e.kind() == io::ErrorKind::NotFound {
                NftError::Unavailable(why)
            } else {
                NftError::Failed(why)
            }
        })?;
    if !out.status.success() {
        return Err(NftError::Failed(format!(
            "{} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn nft(ns: &str, script: &str) -> Result<String, NftError> {
    run(&["ip", "netns", "exec", ns, "nft", script])
}

/// Removes namespaces left by test processes that are gone.
fn remove_stale() {
    let Ok(list) = run(&["ip", "netns", "list"]) else {
        return;
    };
    for line in list.lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let pid: Option<u32> = rest.split('x').next().and_then(|p| p.parse().ok());
        if pid.is_some_and(|p| !std::path::Path::new(&format!("/proc/{p}")).exists()) {
            let _ = run(&["ip", "netns", "del", name]);
        }
    }
}

/// One node's place in a [`TestNet`].
#[derive(Clone, Debug)]
pub struct NetNode {
    /// Its namespace.
    pub ns: String,
    /// Its veth.
    pub dev: String,
    /// Its IPv4 address.
    pub v4: IpAddr,
    /// Its IPv6 address.
    pub v6: IpAddr,
}

/// Node namespaces on one bridge; removed on drop.
pub struct TestNet {
    /// The nodes, in order.
    pub nodes: Vec<NetNode>,
    /// The bridge's namespace (where loss and cuts are ruled).
    pub bridge_ns: String,
    all: Vec<String>,
}

impl TestNet {
    /// `n` node namespaces on a bridge. `Unavailable` without root or
    /// `ip`; `Failed` if `ip` refused a step.
    pub fn create(n: usize) -> Result<TestNet, NftError> {
        if !nix::unistd::geteuid().is_root() {
            return Err(NftError::Unavailable("network namespaces need root".into()));
        }
        remove_stale();
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{PREFIX}{}x{k}", std::process::id());
        // A /24 of its own per net, so two nets of one process differ.
        let net = 100 + (std::process::id() % 100 + k) % 150;
        let bridge_ns = format!("{tag}br");
        let mut t = TestNet {
            nodes: Vec::new(),
            bridge_ns: bridge_ns.clone(),
            all: Vec::new(),
        };
        run(&["ip", "netns", "add", &bridge_ns])?;
        t.all.push(bridge_ns.clone());
        run(&[
            "ip", "-n", &bridge_ns, "link", "add", "br0", "type", "bridge",
        ])?;
        run(&["ip", "-n", &bridge_ns, "link", "set", "br0", "up"])?;
        for i in 0..n {
            let ns = format!("{tag}n{i}");
            run(&["ip", "netns", "add", &ns])?;
            t.all.push(ns.clone());
            let dev = format!("qx{i}");
            let port = format!("qxp{i}");
            run(&[
                "ip", "-n", &ns, "link", "add", &dev, "type", "veth", "peer", "name", &port,
                "netns", &bridge_ns,
            ])?;
            let v4 = format!("10.{net}.0.{}", i + 1);
            let v6 = format!("fd00:{net}::{}", i + 1);
            run(&[
                "ip",
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{v4}/24"),
                "dev",
                &dev,
            ])?;
            run(&[
                "ip",
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{v6}/64"),
                "dev",
                &dev,
                "nodad",
            ])?;
            run(&["ip", "-n", &ns, "link", "set", &dev, "up"])?;
            run(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
            run(&[
                "ip", "-n", &bridge_ns, "link", "set", &port, "master", "br0", "up",
            ])?;
            t.nodes.push(NetNode {
                ns,
                dev,
                v4: v4.parse().expect("a v4 address"),
                v6: v6.parse().expect("a v6 address"),
            });
        }
        Ok(t)
    }

    /// Drops `percent`% of the UDP datagrams to `ports` crossing the
    /// bridge, at random, until the returned rule is dropped.
    pub fn loss(&self, ports: &[u16], percent: u32) -> Result<BridgeRule, NftError> {
        let set = ports
            .iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        self.rule(&format!(
            "meta l4proto udp udp dport {{ {set} }} numgen random mod 100 < {percent} counter drop"
        ))
    }

    /// Drops every datagram between nodes `a` and `b` (both ways), until
    /// the returned rule is dropped.
    pub fn cut(&self, a: usize, b: usize) -> Result<BridgeRule, NftError> {
        let (x, y) = (&self.nodes[a], &self.nodes[b]);
        let (xa, ya) = (x.v4, y.v4);
        let (x6, y6) = (x.v6, y.v6);
        self.rule(&format!(
            "meta l4proto udp ip saddr {{ {xa}, {ya} }} ip daddr {{ {xa}, {ya} }} counter drop; \
             add rule bridge quire_test forward meta l4proto udp ip6 saddr {{ {x6}, {y6} }} \
             ip6 daddr {{ {x6}, {y6} }} counter drop"
        ))
    }

    /// Sends a second copy of `percent`% of the UDP datagrams to `ports`
    /// that node `from` sends, straight to node `to` (besides the
    /// original, which crosses the bridge): duplicates, some arriving
    /// before their original. Until the returned rule is dropped.
    pub fn duplicate(
        &self,
        from: usize,
        to: usize,
        ports: &[u16],
        percent: u32,
    ) -> Result<BridgeRule, NftError> {
        let set = ports
            .iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        self.install(
            "netdev quire_dup",
            &format!("ingress {{ type filter hook ingress device qxp{from} priority 0; }}"),
            &format!(
                "meta l4proto udp udp dport {{ {set} }} numgen random mod 100 < {percent} \
                 counter dup to qxp{to}"
            ),
        )
    }

    fn rule(&self, rule: &str) -> Result<BridgeRule, NftError> {
        self.install(
            "bridge quire_test",
            "forward { type filter hook forward priority 0; }",
            rule,
        )
    }

    /// Replaces `table` (`family name`) in the bridge namespace with one
    /// chain (`name { hook }`) holding `rule`.
    fn install(
        &self,
        table: &'static str,
        chain: &str,
        rule: &str,
    ) -> Result<BridgeRule, NftError> {
        let _ = nft(&self.bridge_ns, &format!("delete table {table}"));
        let chain_name = chain.split_whitespace().next().unwrap_or("");
        nft(
            &self.bridge_ns,
            &format!(
                "add table {table}; add chain {table} {chain}; add rule {table} {chain_name} {rule}"
            ),
        )?;
        Ok(BridgeRule {
            bridge_ns: self.bridge_ns.clone(),
            table,
        })
    }

    /// Runs `f` on a thread inside node `i`'s namespace: sockets (and
    /// AF_XDP sockets, netlink sockets) it opens belong there, and keep
    /// working from any thread afterwards.
    pub fn in_node<T: Send>(&self, i: usize, f: impl FnOnce() -> T + Send) -> io::Result<T> {
        in_netns(&self.nodes[i].ns, f)
    }
}

/// Runs `f` on a new thread that entered network namespace `ns` first.
pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> io::Result<T> {
    let file = std::fs::File::open(format!("/var/run/netns/{ns}"))?;
    std::thread::scope(|s| {
        s.spawn(|| {
            // Only this thread moves.
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)?;
            Ok(f())
        })
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

impl Drop for TestNet {
    fn drop(&mut self) {
        for ns in self.all.iter().rev() {
            let _ = run(&["ip", "netns", "del", ns]);
        }
    }
}

/// An nftables rule on the bridge; removed on drop (drop it before its
/// [`TestNet`]).
pub struct BridgeRule {
    bridge_ns: String,
    /// `family name` of the rule's own table.
    table: &'static str,
}

impl BridgeRule {
    /// Packets the rule matched (dropped or copied) so far.
    pub fn dropped(&self) -> Option<u64> {
        let out = nft(&self.bridge_ns, &format!("list table {}", self.table)).ok()?;
        let mut total = None;
        for w in out.split_whitespace().collect::<Vec<_>>().windows(2) {
            if w[0] == "packets" {
                *total.get_or_insert(0) += w[1].parse::<u64>().ok()?;
            }
        }
        total
    }
}

impl Drop for BridgeRule {
    fn drop(&mut self) {
        let _ = nft(&self.bridge_ns, &format!("delete table {}", self.table));
    }
}
