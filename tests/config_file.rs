//! The daemon's config file: the example in `tuning/` loads, a minimal file
//! takes every default, and each kind of bad file is refused with one
//! message that names the key and says what is wrong (exit code 2).

use quire::node::daemon::config_file::{load, load_with_cores, ConfigError, DaemonConfig};
use quire::tls::issue::{CertRequest, LocalCa};
use std::path::{Path, PathBuf};

/// A temp dir holding a key file and the client and admin token files,
/// where config files are written.
struct Dir {
    dir: tempfile::TempDir,
}

impl Dir {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("cluster.key"),
            "0123456789abcdef0123456789abcdef\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("client.token"), "s3cret-token\n").unwrap();
        std::fs::write(dir.path().join("admin.token"), "0123456789abcdef-admin\n").unwrap();
        let ca = LocalCa::generate("test CA").unwrap();
        let cert = ca
            .issue(&CertRequest::server("node1", &["10.0.0.1"]))
            .unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.cert_pem()).unwrap();
        std::fs::write(dir.path().join("tls.pem"), &cert.cert_pem).unwrap();
        std::fs::write(dir.path().join("tls.key"), &cert.key_pem).unwrap();
        Dir { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn write(&self, text: &str) -> PathBuf {
        let p = self.dir.path().join("node.toml");
        std::fs::write(&p, text).unwrap();
        p
    }

    /// Loads `text` as if this host had cores 0 to 7.
    fn load(&self, text: &str) -> Result<DaemonConfig, ConfigError> {
        load_with_cores(&self.write(text), &(0..8).collect::<Vec<_>>())
    }

    /// The error `text` must produce, as displayed, without the file name.
    fn error(&self, text: &str) -> (ConfigError, String) {
        let e = self.load(text).expect_err("the file must be refused");
        assert_eq!(e.exit_code(), 2);
        let shown = e.to_string();
        let prefix = format!("{}: ", self.dir.path().join("node.toml").display());
        assert!(shown.starts_with(&prefix), "{shown}");
        assert_eq!(shown.lines().count(), 1, "one line: {shown}");
        let rest = shown[prefix.len()..].to_string();
        (e, rest)
    }
}

/// The smallest valid file: relative paths resolve next to the file.
const MINIMAL: &str = r#"
[node]
id = 1
cluster_key_file = "cluster.key"
auth_token_file = "client.token"

[[peers]]
id = 2
udp = "10.0.0.2:7400"

[[peers]]
id = 3
udp = "10.0.0.3:7400"

[[disks]]
path = "log0"
group = 0

[client]
tls_cert_file = "tls.pem"
tls_key_file = "tls.key"
"#;

fn minimal_with(extra: &str) -> String {
    format!("{MINIMAL}\n{extra}")
}

#[test]
fn the_ts60_example_loads() {
    let d = Dir::new();
    let example = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tuning/quired-ts60.toml"),
    )
    .unwrap();
    // Its secrets live in /etc/quire on a real host; here, in the temp dir.
    let text = example.replace("/etc/quire/", &format!("{}/", d.path().display()));
    let c = d.load(&text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.admin_token_file, Some(d.path().join("admin.token")));
    let n = &c.node;
    assert_eq!(n.id, 1);
    assert_eq!(n.voters, vec![1, 2, 3]);
    assert_eq!(n.groups.len(), 12);
    assert_eq!(n.groups[11].dir, Path::new("/srv/quire/disk11/log"));
    assert_eq!(c.cores, vec![2, 3, 4, 5, 6, 7]);
    assert_eq!(c.core_of(0), 2);
    assert_eq!(c.core_of(7), 3);
    assert_eq!(c.core_of(11), 7);
    assert_eq!(
        n.peers[0].serial_device.as_deref(),
        Some(Path::new("/dev/ttyS1"))
    );
    assert_eq!(
        n.peers[1].serial_device.as_deref(),
        Some(Path::new("/dev/ttyS2"))
    );
    assert_eq!(n.peers[1].udp_base, "10.10.0.3:7400".parse().unwrap());
    assert_eq!(n.transport.mtu_bytes, 9000);
    assert_eq!(n.udp.recv_buffer_bytes, 16 << 20);
    assert_eq!(n.udp.bind_ip.to_string(), "10.10.0.1");
    assert_eq!(n.udp.groups, (0..12).collect::<Vec<_>>());
    assert_eq!(c.client_listen, "10.20.0.1:7100".parse().unwrap());
    assert!(
        c.warnings.iter().all(|w| !w.contains("serial")),
        "{:?}",
        c.warnings
    );
}

#[test]
fn segments_too_small_for_a_transport_message_are_warned() {
    let d = Dir::new();
    let small = minimal_with("[storage]\nsegment_bytes = 4194304\n");
    let c = d.load(&small).unwrap_or_else(|e| panic!("{e}"));
    let w: Vec<_> = c
        .warnings
        .iter()
        .filter(|w| {
            w.starts_with("storage.segment_bytes: 4194304 holds entries up to 2097152 bytes")
        })
        .collect();
    assert_eq!(w.len(), 1, "{:?}", c.warnings);
    assert!(
        w[0].contains("transport.message_bytes_max (4194304)"),
        "{}",
        w[0]
    );
    let c = d.load(MINIMAL).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        c.warnings.iter().all(|w| !w.contains("segment_bytes")),
        "{:?}",
        c.warnings
    );
}

#[test]
fn a_minimal_file_takes_every_default() {
    let d = Dir::new();
    let c = d.load(MINIMAL).unwrap_or_else(|e| panic!("{e}"));
    let n = &c.node;
    assert_eq!(n.voters, vec![1, 2, 3]);
    assert_eq!(n.groups[0].dir, d.path().join("log0"));
    assert_eq!(c.cores, vec![0]);
    assert_eq!(c.client_listen, "0.0.0.0:7100".parse().unwrap());
    assert_eq!(c.admin_listen, "127.0.0.1:7200".parse().unwrap());
    assert_eq!(
        c.client,
        quire::node::client::admission::ClientLimits::default()
    );
    assert_eq!(c.token_file, d.path().join("client.token"));
    assert_eq!(n.transport, quire::transport::TransportConfig::default());
    let udp = quire::net::UdpConfig::default();
    assert_eq!(n.udp.base_port, udp.base_port);
    assert_eq!(n.udp.recv_buffer_bytes, udp.recv_buffer_bytes);
    assert_eq!(n.udp.groups, vec![0]);
    assert_eq!(n.detector, quire::heartbeat::DetectorConfig::default());
    let raft = quire::consensus::RaftConfig::new(1, vec![1, 2, 3]);
    assert_eq!(n.raft.election_timeout_ms, raft.election_timeout_ms);
    assert_eq!(n.raft.initial_voters, vec![1, 2, 3]);
    let wal = quire::storage::WalConfig::default();
    assert_eq!(n.wal.segment_bytes, wal.segment_bytes);
    assert_eq!(n.wal.flush_bytes_max, wal.flush_bytes_max);
    assert_eq!(n.serial_baud, 115_200);
    assert!(n.peers.iter().all(|p| p.serial_device.is_none()));
}

#[test]
fn missing_key() {
    let d = Dir::new();
    let (e, msg) = d.error(&MINIMAL.replace("id = 1\n", ""));
    assert_eq!(e.key, "node.id");
    assert_eq!(msg, "node.id: missing; this key is required (line 2)");
    let (_, msg) = d.error(&MINIMAL.replace("udp = \"10.0.0.3:7400\"\n", ""));
    assert!(
        msg.starts_with("peers[1].udp: missing; this key is required"),
        "{msg}"
    );
    let no_disks = MINIMAL.split("[[disks]]").next().unwrap();
    let (_, msg) = d.error(no_disks);
    assert_eq!(msg, "disks: missing; this key is required");
}

#[test]
fn wrong_type() {
    let d = Dir::new();
    let (e, msg) = d.error(&MINIMAL.replace("id = 1", "id = \"one\""));
    assert_eq!(e.key, "node.id");
    assert!(
        msg.starts_with("node.id: invalid type: string \"one\""),
        "{msg}"
    );
    assert!(msg.contains("(line 3)"), "{msg}");
    let (_, msg) = d.error(&minimal_with("[timers]\ndeadtime_ms = -5\n"));
    assert!(
        msg.starts_with("timers.deadtime_ms: invalid value"),
        "{msg}"
    );
    let (_, msg) = d.error(&MINIMAL.replace("group = 0", "group = true"));
    assert!(
        msg.starts_with("disks[0].group: invalid type: boolean"),
        "{msg}"
    );
    let (_, msg) = d.error(&minimal_with("[udp]\nbase_port = 70000\n"));
    assert!(msg.starts_with("udp.base_port: invalid value"), "{msg}");
}

#[test]
fn unknown_key() {
    let d = Dir::new();
    let (e, msg) = d.error(&minimal_with("[timers]\ndeadtime = 300\n"));
    assert_eq!(e.key, "timers.deadtime");
    assert!(msg.starts_with("timers.deadtime: unknown key"), "{msg}");
    assert!(
        msg.contains("deadtime_ms"),
        "names the keys it knows: {msg}"
    );
    let (_, msg) = d.error(&minimal_with("[raft]\npre_vote = false\n"));
    assert!(msg.starts_with("raft: unknown key"), "{msg}");
    let (_, msg) = d.error(&MINIMAL.replace("id = 2", "id = 2\nserial_device = \"/dev/ttyS1\""));
    assert!(
        msg.starts_with("peers[0].serial_device: unknown key"),
        "{msg}"
    );
}

#[test]
fn not_toml() {
    let d = Dir::new();
    let (e, msg) = d.error(&MINIMAL.replace("id = 1", "id = = 1"));
    assert_eq!(e.key, "");
    assert!(msg.starts_with("not valid TOML (line 3)"), "{msg}");
}

#[test]
fn unknown_or_duplicate_peer() {
    let d = Dir::new();
    let (_, msg) = d.error(&MINIMAL.replace("id = 3", "id = 1"));
    assert_eq!(msg, "peers[1].id: 1 is this node's id (node.id)");
    let (_, msg) = d.error(&MINIMAL.replace("id = 3", "id = 2"));
    assert_eq!(
        msg,
        "peers[1].id: node 2 appears twice (peers[0] and peers[1])"
    );
    let (_, msg) = d.error(&MINIMAL.replace("id = 3", "id = 0"));
    assert_eq!(msg, "peers[1].id: node id 0 is reserved");
    let (_, msg) = d.error(&MINIMAL.replace("id = 1", "id = 0"));
    assert_eq!(msg, "node.id: node id 0 is reserved");
}

#[test]
fn bad_address() {
    let d = Dir::new();
    let (e, msg) = d.error(&MINIMAL.replace("10.0.0.3:7400", "10.0.0.2:70000"));
    assert_eq!(e.key, "peers[1].udp");
    assert_eq!(msg, "peers[1].udp: \"10.0.0.2:70000\" is not a host:port");
    let (_, msg) = d.error(&MINIMAL.replace("10.0.0.3:7400", "10.0.0.3"));
    assert_eq!(msg, "peers[1].udp: \"10.0.0.3\" is not a host:port");
    let (_, msg) = d.error(&MINIMAL.replace("10.0.0.3:7400", "0.0.0.0:7400"));
    assert_eq!(
        msg,
        "peers[1].udp: 0.0.0.0 is not an address a peer can be reached at"
    );
    let (_, msg) = d.error(&minimal_with("[udp]\nbind = \"10.0.0.256\"\n"));
    assert_eq!(msg, "udp.bind: \"10.0.0.256\" is not an IP address");
    let (_, msg) =
        d.error(&MINIMAL.replace("[node]\n", "[node]\nclient_listen = \"localhost:7100\"\n"));
    assert_eq!(
        msg,
        "node.client_listen: \"localhost:7100\" is not an ip:port"
    );
}

#[test]
fn same_port_twice() {
    let d = Dir::new();
    // A peer on this host's loopback at this node's own base port.
    let text =
        minimal_with("[udp]\nbind = \"127.0.0.1\"\n").replace("10.0.0.2:7400", "127.0.0.1:7400");
    let (e, msg) = d.error(&text);
    assert_eq!(e.key, "peers[0].udp");
    assert_eq!(
        msg,
        "peers[0].udp: port 7400 is used twice (udp.base_port + group 0 and peers[0].udp + group 0)"
    );
    // The client port inside this node's group ports.
    let text = MINIMAL.replace("[node]\n", "[node]\nclient_listen = \"0.0.0.0:7400\"\n");
    let (_, msg) = d.error(&text);
    assert_eq!(
        msg,
        "node.client_listen: port 7400 is used twice (udp.base_port + group 0 and node.client_listen)"
    );
    // Admin and client on one port.
    let text = MINIMAL.replace(
        "[node]\n",
        "[node]\nclient_listen = \"0.0.0.0:7100\"\nadmin_listen = \"127.0.0.1:7100\"\n",
    );
    let (_, msg) = d.error(&text);
    assert_eq!(
        msg,
        "node.admin_listen: port 7100 is used twice (node.client_listen and node.admin_listen)"
    );
    // Two peers whose group port ranges overlap on one host.
    let text = format!(
        "{}\n[[disks]]\npath = \"log1\"\ngroup = 1\n",
        MINIMAL.replace("10.0.0.3:7400", "10.0.0.2:7401")
    );
    let (_, msg) = d.error(&text);
    assert_eq!(
        msg,
        "peers[1].udp: port 7401 is used twice (peers[0].udp + group 1 and peers[1].udp + group 0)"
    );
    // The usual layout, every node at 7400 on its own host, is fine.
    d.load(MINIMAL).unwrap();
}

#[test]
fn duplicate_group_or_disk() {
    let d = Dir::new();
    let (e, msg) = d.error(&minimal_with("[[disks]]\npath = \"log1\"\ngroup = 0\n"));
    assert_eq!(e.key, "disks[1].group");
    assert_eq!(
        msg,
        "disks[1].group: group 0 appears twice (disks[0] and disks[1]): a group has one disk"
    );
    let (_, msg) = d.error(&minimal_with("[[disks]]\npath = \"log0\"\ngroup = 1\n"));
    assert!(msg.starts_with("disks[1].path: "), "{msg}");
    assert!(
        msg.ends_with("log0 is also disks[0].path: a disk holds one group"),
        "{msg}"
    );
}

#[test]
fn empty_disks() {
    let d = Dir::new();
    let no_disks = MINIMAL.split("[[disks]]").next().unwrap();
    let (_, msg) = d.error(&format!("disks = []\n{no_disks}"));
    assert_eq!(
        msg,
        "disks: no disks: a node needs at least one [[disks]] (one group per disk)"
    );
}

#[test]
fn deadtime_not_above_warntime() {
    let d = Dir::new();
    let (e, msg) = d.error(&minimal_with(
        "[timers]\nwarntime_ms = 150\ndeadtime_ms = 150\n",
    ));
    assert_eq!(e.key, "timers.deadtime_ms");
    assert_eq!(
        msg,
        "timers.deadtime_ms: 150 must exceed warntime_ms 150: a link is late before it is dead"
    );
    let (_, msg) = d.error(&minimal_with(
        "[timers]\nelection_timeout_ms = 30\nheartbeat_interval_ms = 30\n",
    ));
    assert!(
        msg.starts_with("timers.election_timeout_ms: 30 must exceed heartbeat_interval_ms (30)"),
        "{msg}"
    );
}

#[test]
fn raft_timers_are_refused_by_raft_s_own_check_under_their_key() {
    let d = Dir::new();
    let (e, msg) = d.error(&minimal_with("[timers]\nheartbeat_interval_ms = 0\n"));
    assert_eq!(e.key, "timers.heartbeat_interval_ms");
    assert_eq!(msg, "timers.heartbeat_interval_ms: must be at least 1");
    let (e, _) = d.error(&minimal_with("[timers]\nelection_timeout_ms = 20\n"));
    assert_eq!(e.key, "timers.election_timeout_ms");
    let (e, msg) = d.error(&minimal_with("[timers]\npreferred_leader_hold_ms = 0\n"));
    assert_eq!(e.key, "timers.preferred_leader_hold_ms");
    assert_eq!(msg, "timers.preferred_leader_hold_ms: must be at least 1");
}

#[test]
fn preferred_leaders_are_on_by_default_and_each_group_gets_its_rank() {
    let d = Dir::new();
    let on = d.load(MINIMAL).unwrap_or_else(|e| panic!("{e}"));
    assert!(on.node.preferred_leaders);
    assert_eq!(on.node.raft_config(5).preferred_leader_rank, Some(5));
    assert_eq!(on.node.raft.preferred_leader_hold_ms, 2_000);
    let off = d
        .load(&minimal_with(
            "[timers]\npreferred_leaders = false\npreferred_leader_hold_ms = 9000\n",
        ))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!off.node.preferred_leaders);
    assert_eq!(off.node.raft_config(5).preferred_leader_rank, None);
    assert_eq!(off.node.raft.preferred_leader_hold_ms, 9_000);
}

/// A spec built in code (not from a file) with a Raft config the core
/// cannot run: `spawn` refuses it with a config error naming the field,
/// before any log is opened, instead of a loop thread panicking.
#[test]
fn a_bad_raft_config_is_refused_by_spawn_as_a_config_error() {
    use quire::consensus::RaftConfigError;
    use quire::node::{GroupSpec, NodeHandle, NodeSpec, SpecError, StartError};
    let d = Dir::new();
    let groups = vec![GroupSpec {
        group: 0,
        dir: d.path().join("log0"),
    }];
    let mut spec = NodeSpec::loopback(1, vec![1], groups, 0);
    spec.raft.election_timeout_ms = spec.raft.heartbeat_interval_ms;
    let e = NodeHandle::spawn(spec).err().expect("refused");
    assert!(e.is_config(), "{e}");
    assert!(
        matches!(
            e,
            StartError::Spec(SpecError::Raft(
                RaftConfigError::ElectionTimeoutTooShort { .. }
            ))
        ),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .contains("raft.election_timeout_ms: 30 must exceed"),
        "{e}"
    );
    assert!(!d.path().join("log0").exists(), "no log was opened");
}

#[test]
fn cores() {
    let d = Dir::new();
    let p = d.write(&MINIMAL.replace("[node]\n", "[node]\ncores = [1, 9]\n"));
    let e = load_with_cores(&p, &[0, 1]).unwrap_err();
    assert_eq!(e.key, "node.cores");
    assert!(
        e.to_string()
            .ends_with("node.cores: core 9 is not available on this host (0-1)"),
        "{e}"
    );
    let (_, msg) = d.error(&MINIMAL.replace("[node]\n", "[node]\ncores = [2, 2]\n"));
    assert_eq!(msg, "node.cores: core 2 appears twice");
    let (_, msg) = d.error(&MINIMAL.replace("[node]\n", "[node]\ncores = []\n"));
    assert_eq!(msg, "node.cores: empty: give at least one core");
    // `load` checks against this host: core 0 always exists.
    load(&d.write(MINIMAL)).unwrap();
}

#[test]
fn embedded_configs_are_checked_with_their_section() {
    let d = Dir::new();
    let (_, msg) = d.error(&minimal_with("[transport]\nmtu_bytes = 100\n"));
    assert_eq!(msg, "transport.mtu_bytes: 100 not in 576..=65535");
    let (_, msg) = d.error(&minimal_with("[storage]\nbackend = \"fast\"\n"));
    assert_eq!(
        msg,
        "storage.backend: unknown I/O backend 'fast' (auto, io_uring, portable)"
    );
    let (_, msg) = d.error(&minimal_with("[storage]\nsegment_bytes = 1000000\n"));
    assert!(
        msg.starts_with("storage.segment_bytes: 1000000 must be a multiple of 4096"),
        "{msg}"
    );
    let (_, msg) = d.error(&minimal_with("[serial]\nbaud = 115000\n"));
    assert_eq!(
        msg,
        "serial.baud: 115000 is not a standard rate (1200..=4000000)"
    );
    let (_, msg) = d.error(&minimal_with("[transport]\nholdback_frames_max = 10\n"));
    assert!(
        msg.starts_with("transport: the hold-back buffer (10 frames"),
        "{msg}"
    );
    let (_, msg) = d.error(&minimal_with("[udp]\ngso_segments_max = 65\n"));
    assert_eq!(msg, "udp.gso_segments_max: must be in 1..=64");
    let (_, msg) = d.error(&minimal_with("unauthenticated_max = 0\n"));
    assert_eq!(
        msg,
        "client.unauthenticated_max: is 0: no client could connect"
    );
    let c = d
        .load(&minimal_with("hello_timeout_ms = 300\n"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.client.hello_timeout_ms, 300);
}

#[test]
fn secret_files() {
    let d = Dir::new();
    let (e, msg) = d.error(&MINIMAL.replace("cluster.key", "missing.key"));
    assert_eq!(e.key, "node.cluster_key_file");
    assert!(msg.contains("missing.key: cannot read it"), "{msg}");
    std::fs::write(d.path().join("short.key"), "abc\n").unwrap();
    let (_, msg) = d.error(&MINIMAL.replace("cluster.key", "short.key"));
    assert!(
        msg.contains("short.key holds 3 bytes; at least 16 are needed"),
        "{msg}"
    );
    std::fs::write(d.path().join("empty.token"), "\n").unwrap();
    let (e, msg) = d.error(&MINIMAL.replace("client.token", "empty.token"));
    assert_eq!(e.key, "node.auth_token_file");
    assert!(msg.ends_with("empty.token is empty"), "{msg}");
}

#[test]
fn admin_token_file_is_optional_long_and_not_the_client_token() {
    let d = Dir::new();
    assert_eq!(d.load(MINIMAL).unwrap().admin_token_file, None);
    let with = |file: &str| {
        MINIMAL.replace(
            "auth_token_file = \"client.token\"\n",
            &format!("auth_token_file = \"client.token\"\nadmin_token_file = \"{file}\"\n"),
        )
    };
    let c = d
        .load(&with("admin.token"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.admin_token_file, Some(d.path().join("admin.token")));
    std::fs::write(d.path().join("short.token"), "abc\n").unwrap();
    let (e, msg) = d.error(&with("short.token"));
    assert_eq!(e.key, "node.admin_token_file");
    assert!(msg.contains("holds 3 bytes; at least 16"), "{msg}");
    std::fs::write(d.path().join("client.token"), "0123456789abcdef-admin\n").unwrap();
    let (e, msg) = d.error(&with("admin.token"));
    assert_eq!(e.key, "node.admin_token_file");
    assert!(msg.contains("holds the client token"), "{msg}");
    let (e, _) = d.error(&with("missing.token"));
    assert_eq!(e.key, "node.admin_token_file");
}

#[test]
fn unreadable_file() {
    let d = Dir::new();
    let e = load(&d.path().join("nope.toml")).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    assert!(e.to_string().contains("nope.toml: cannot read it"), "{e}");
}

// That every key is documented is checked in tests/docs.rs.

#[test]
fn a_peer_by_host_name_is_resolved_at_load() {
    let d = Dir::new();
    let c = d
        .load(&MINIMAL.replace("10.0.0.3:7400", "localhost:7500"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(c.node.peers[1].udp_base.ip().is_loopback());
    assert_eq!(c.node.peers[1].udp_base.port(), 7500);
    // (A name that does not resolve is not tested: on a host whose DNS
    // server is unreachable the lookup takes seconds.)
}

/// Left out, the trimmed segments kept for reuse cover one snapshot's
/// trim, so a log of small segments stops zero-filling new ones; given,
/// the operator's number stands.
#[test]
fn recycled_segments_cover_one_snapshot_unless_given() {
    let d = Dir::new();
    let small = "[storage]\nsegment_bytes = 8388608\n[snapshot]\nbytes = 67108864\n";
    let c = d
        .load(&minimal_with(small))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.node.wal.segments_recycled_max, 64 / 8 + 2);
    let c = d.load(MINIMAL).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        c.node.wal.segments_recycled_max, 4,
        "64 MiB segments, 64 MiB snapshots"
    );
    let given = "[storage]\nsegment_bytes = 8388608\nsegments_recycled_max = 3\n";
    let c = d
        .load(&minimal_with(given))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.node.wal.segments_recycled_max, 3);
}

#[test]
fn snapshot_image_chunks_are_bounded_by_a_transport_message() {
    let d = Dir::new();
    let c = d
        .load(&minimal_with("[snapshot]\nchunk_bytes = 262144\n"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.node.raft.snapshot_chunk_bytes, 262_144);
    let c = d.load(MINIMAL).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.node.raft.snapshot_chunk_bytes, 1 << 20);
    let (e, msg) = d.error(&minimal_with("[snapshot]\nchunk_bytes = 100\n"));
    assert_eq!(e.key, "snapshot.chunk_bytes");
    assert_eq!(msg, "snapshot.chunk_bytes: must be at least 4096");
    let (e, msg) = d.error(&minimal_with("[snapshot]\nchunk_bytes = 4194304\n"));
    assert_eq!(e.key, "snapshot.chunk_bytes");
    assert!(
        msg.contains("more than half of transport.message_bytes_max"),
        "{msg}"
    );
}

#[test]
fn clients_are_served_tls_unless_the_file_says_plain() {
    let d = Dir::new();
    let c = d.load(MINIMAL).unwrap_or_else(|e| panic!("{e}"));
    let tls = c.client_tls.expect("TLS by default");
    assert_eq!(tls.cert, d.path().join("tls.pem"));
    assert_eq!(tls.client_ca, None);
    assert_eq!(tls.min_version, quire::tls::TlsVersion::V1_3);

    let no_tls = MINIMAL.replace(
        "tls_cert_file = \"tls.pem\"\ntls_key_file = \"tls.key\"\n",
        "",
    );
    let (e, msg) = d.error(&no_tls);
    assert_eq!(e.key, "client.tls_cert_file");
    assert!(
        msg.contains("unless the config says client.plain = true"),
        "{msg}"
    );
    let (e, _) = d.error(&MINIMAL.replace("tls_key_file = \"tls.key\"\n", ""));
    assert_eq!(e.key, "client.tls_key_file");

    let plain = d
        .load(&format!("{no_tls}plain = true\n"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(plain.client_tls.is_none());
    let (e, msg) = d.error(&minimal_with("plain = true\n"));
    assert_eq!(e.key, "client.plain");
    assert!(msg.contains("client.tls_cert_file is set too"), "{msg}");
    let (e, _) = d.error(&format!("{no_tls}plain = false\n"));
    assert_eq!(e.key, "client.tls_cert_file");

    let (e, msg) = d.error(&minimal_with("tls_min_version = \"1.1\"\n"));
    assert_eq!(e.key, "client.tls_min_version");
    assert!(msg.contains("must be \"1.2\" or \"1.3\""), "{msg}");
    let v12 = d
        .load(&minimal_with("tls_min_version = \"1.2\"\n"))
        .unwrap();
    assert_eq!(
        v12.client_tls.unwrap().min_version,
        quire::tls::TlsVersion::V1_2
    );

    let (e, msg) = d.error(&minimal_with("tls_client_crl_file = \"ca.pem\"\n"));
    assert_eq!(e.key, "client.tls_client_crl_file");
    assert!(msg.contains("set it too"), "{msg}");
    let (e, msg) = d.error(&minimal_with(
        "tls_client_ca_file = \"ca.pem\"\ntls_client_crl_file = \"ca.pem\"\n",
    ));
    assert_eq!(e.key, "client.tls_client_crl_file");
    assert!(msg.contains("no revocation list in it"), "{msg}");
    let mtls = d
        .load(&minimal_with("tls_client_ca_file = \"ca.pem\"\n"))
        .unwrap();
    assert_eq!(
        mtls.client_tls.unwrap().client_ca,
        Some(d.path().join("ca.pem"))
    );
}

#[test]
fn bad_tls_files_are_refused_with_the_key_at_fault() {
    let d = Dir::new();
    // A file that is not a certificate, one that is missing, a key that
    // belongs to another certificate, a CA file with no certificate.
    let (e, msg) = d.error(&MINIMAL.replace(
        "tls_cert_file = \"tls.pem\"",
        "tls_cert_file = \"client.token\"",
    ));
    assert_eq!(e.key, "client.tls_cert_file");
    assert!(msg.contains("no certificate in it"), "{msg}");
    let (e, msg) = d.error(&MINIMAL.replace("\"tls.pem\"", "\"missing.pem\""));
    assert_eq!(e.key, "client.tls_cert_file");
    assert!(msg.contains("missing.pem"), "{msg}");
    let ca = LocalCa::generate("another CA").unwrap();
    let other = ca
        .issue(&CertRequest::server("node9", &["10.0.0.9"]))
        .unwrap();
    std::fs::write(d.path().join("other.key"), &other.key_pem).unwrap();
    let (e, msg) = d.error(&MINIMAL.replace("\"tls.key\"", "\"other.key\""));
    assert_eq!(e.key, "client.tls_key_file");
    assert!(msg.contains("does not go with"), "{msg}");
    let (e, msg) = d.error(&MINIMAL.replace("\"tls.key\"", "\"tls.pem\""));
    assert_eq!(e.key, "client.tls_key_file");
    assert!(msg.contains("no private key in it"), "{msg}");
    let (e, msg) = d.error(&minimal_with("tls_client_ca_file = \"tls.key\"\n"));
    assert_eq!(e.key, "client.tls_client_ca_file");
    assert!(msg.contains("no certificate in it"), "{msg}");
    let (_, msg) = d.error(&MINIMAL.replace("\"tls.pem\"", "\"/dev/zero\""));
    assert!(msg.contains("/dev/zero"), "{msg}");
}

#[test]
fn a_credentials_file_names_principals_and_is_checked_whole() {
    let d = Dir::new();
    std::fs::write(d.path().join("reader.token"), "reader-token\n").unwrap();
    let with = |creds: &str| {
        std::fs::write(d.path().join("credentials.toml"), creds).unwrap();
        MINIMAL.replace(
            "[node]\n",
            "[node]\ncredentials_file = \"credentials.toml\"\n",
        )
    };
    let good = "[[principals]]\nname = \"reader\"\ntoken_file = \"reader.token\"\n\
                grants = [{ groups = [0], allow = [\"read\"] }]\n";
    let c = d.load(&with(good)).unwrap_or_else(|e| panic!("{e}"));
    let creds = &c.credentials;
    let reader = creds.by_token(b"reader-token").expect("the reader's token");
    assert_eq!(creds.principal(reader).unwrap().name, "reader");
    let cluster = creds.by_token(b"s3cret-token").expect("the cluster token");
    assert!(creds.principal(cluster).unwrap().all);
    let metered = format!("{good}quota_bytes_per_s = 1048576\n");
    let c = d.load(&with(&metered)).unwrap_or_else(|e| panic!("{e}"));
    let reader = c.credentials.by_token(b"reader-token").unwrap();
    let quota = c.credentials.principal(reader).unwrap().quota;
    assert_eq!(quota.bytes_per_s, Some(1 << 20));
    assert_eq!(quota.requests_per_s, None);

    let cases = [
        (
            good.replace("reader.token", "client.token"),
            "has the token of principal \"cluster\"",
        ),
        (
            good.replace("\"reader\"", "\"bad name\""),
            "name \"bad name\"",
        ),
        (
            good.replace("\"read\"", "\"write\""),
            "unknown variant `write`",
        ),
        (
            good.replace("allow = [\"read\"]", "allow = []"),
            "grants[0] allows nothing",
        ),
        (
            good.replace("token_file = \"reader.token\"", "cert_common_name = \"r\""),
            "only client.tls_client_ca_file asks for",
        ),
        (
            good.replace("token_file = \"reader.token\"\n", ""),
            "neither token_file nor cert_common_name",
        ),
        (format!("{good}{good}"), "named twice"),
        (
            format!("{good}quota_bytes_per_s = 0\n"),
            "quota_bytes_per_s = 0 would stop every write",
        ),
        (
            format!("{good}quota_requests_per_s = -1\n"),
            "quota_requests_per_s",
        ),
        ("principals = 3\n".to_string(), "principals"),
        (
            good.replace("reader.token", "missing.token"),
            "missing.token",
        ),
        (
            good.replace(
                "{ groups = [0], allow = [\"read\"] }",
                "{ queues = \"q-\", allow = [\"admin\"] }",
            ),
            "allows \"admin\" on queues",
        ),
    ];
    for (text, words) in cases {
        let (e, msg) = d.error(&with(&text));
        assert_eq!(e.key, "node.credentials_file", "{msg}");
        assert!(msg.contains(words), "{msg:?} does not say {words:?}");
    }
}

#[test]
fn the_admin_endpoint_serves_https_with_the_client_certificate_if_asked() {
    let d = Dir::new();
    let c = d.load(MINIMAL).unwrap_or_else(|e| panic!("{e}"));
    assert!(c.admin_tls.is_none(), "plain HTTP unless asked");
    let https = MINIMAL.replace("[node]\n", "[node]\nadmin_tls = true\n");
    let c = d.load(&https).unwrap_or_else(|e| panic!("{e}"));
    let admin = c.admin_tls.expect("HTTPS");
    let client = c.client_tls.unwrap();
    assert_eq!((&admin.cert, &admin.key), (&client.cert, &client.key));
    assert!(admin.client_cert_optional && !client.client_cert_optional);

    let plain = https.replace(
        "tls_cert_file = \"tls.pem\"\ntls_key_file = \"tls.key\"\n",
        "plain = true\n",
    );
    let (e, msg) = d.error(&plain);
    assert_eq!(e.key, "node.admin_tls");
    assert!(msg.contains("client.plain = true"), "{msg}");
    let (e, _) = d.error(&MINIMAL.replace("[node]\n", "[node]\nadmin_tls = \"yes\"\n"));
    assert_eq!(e.key, "node.admin_tls");
}
