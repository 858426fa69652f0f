//! The client protocol over TLS, on real `quired` processes
//! (`LocalProcesses::prepare_tls`, 127.0.0.1 only):
//!
//! - a client that trusts the cluster's CA appends and reads, one by one
//!   and pipelined (the producer's hand-driven TLS), and nothing is lost;
//! - a client without the CA, with another CA, asking for the wrong
//!   name, or speaking plain TCP is refused at once (no retries) with an
//!   error that says why, and the node counts it;
//! - under mTLS a client without a certificate, with an expired one, one
//!   from another CA or one the CA's revocation list names is refused;
//!   one from the client CA is served; a revocation added on SIGHUP
//!   refuses that certificate's next connection;
//! - SIGHUP rotates the node's certificate: the connection opened before
//!   keeps working, new ones see the new certificate, and a reload of a
//!   broken file keeps the old one;
//! - a TLS client of a node that serves plain TCP is told so.
//!
//! Nothing here sleeps to synchronise: it polls with a generous deadline.

mod common;

use quire::api::ErrorCode;
use quire::client::{Client, ClientError};
use quire::node::local::processes::LocalProcesses;
use quire::tls::issue::{CertRequest, LocalCa};
use quire::tls::{ClientTls, ClientTlsFiles};
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

/// A generous bound for anything to happen on a loaded 2-core machine.
const LIMIT: Duration = Duration::from_secs(30);

/// A one-node cluster (it confirms on its own) serving TLS, with `extra`
/// appended to its config's `[client]` section, started.
fn tls_node(dir: &Path, extra: &str) -> LocalProcesses {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_quired"));
    let mut procs = LocalProcesses::prepare_tls(dir, 1, 1, &exe).expect("cluster prepared");
    let cfg = &procs.nodes[&1].config;
    let mut f = std::fs::OpenOptions::new().append(true).open(cfg).unwrap();
    f.write_all(extra.as_bytes()).unwrap();
    procs.start_all().unwrap();
    wait_serving(&procs);
    procs
}

/// Until node 1 answers on its admin endpoint and its client port.
fn wait_serving(procs: &LocalProcesses) {
    metrics(procs);
    let client = procs.nodes[&1].client;
    common::wait_for("the client port", LIMIT, || {
        std::net::TcpStream::connect_timeout(&client, Duration::from_secs(1)).ok()
    });
}

/// The node's `/metrics`, once it answers.
fn metrics(procs: &LocalProcesses) -> String {
    let admin = procs.nodes[&1].admin;
    common::wait_for("the admin endpoint", LIMIT, || {
        let (code, body) = common::http(admin, "GET", "/metrics", "", Duration::from_secs(2))?;
        (code == 200).then_some(body)
    })
    .0
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

fn addr(procs: &LocalProcesses) -> SocketAddr {
    procs.nodes[&1].client
}

/// A client of node 1 speaking TLS with `tls` (plain TCP if `None`).
fn client(procs: &LocalProcesses, tls: Option<Arc<ClientTls>>) -> Client {
    // Each its own id: appends are deduplicated per (client id, seq).
    let id = quire::client::random_client_id().unwrap();
    let mut c = Client::new(vec![addr(procs)], &procs.token, id);
    c.deadline = LIMIT;
    match tls {
        Some(t) => c.with_tls(t),
        None => c,
    }
}

/// The cluster's own client TLS (its CA), with `edit` applied.
fn tls_with(procs: &LocalProcesses, edit: impl FnOnce(&mut ClientTlsFiles)) -> Arc<ClientTls> {
    let mut files = procs.client_tls.clone().expect("a TLS cluster");
    edit(&mut files);
    ClientTls::load(&files).unwrap_or_else(|e| panic!("{e}"))
}

/// Writes a CA's certificate, or an issued certificate and key, into
/// `dir` as `name.pem` (and `name.key`).
fn write_ca(dir: &Path, name: &str, ca: &LocalCa) -> PathBuf {
    let p = dir.join(format!("{name}.pem"));
    std::fs::write(&p, ca.cert_pem()).unwrap();
    p
}

fn write_issued(dir: &Path, name: &str, ca: &LocalCa, req: &CertRequest) -> (PathBuf, PathBuf) {
    write_issued_serial(dir, name, ca, req).0
}

/// [`write_issued`], with the certificate's serial number.
fn write_issued_serial(
    dir: &Path,
    name: &str,
    ca: &LocalCa,
    req: &CertRequest,
) -> ((PathBuf, PathBuf), u64) {
    let issued = ca.issue(req).unwrap();
    let (cert, key) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    );
    std::fs::write(&cert, issued.cert_pem).unwrap();
    std::fs::write(&key, issued.key_pem).unwrap();
    ((cert, key), issued.serial)
}

/// `r` is a refusal for good (Unauthorized) whose message holds `words`.
fn assert_refused<T: std::fmt::Debug>(r: Result<T, ClientError>, words: &str) {
    common::assert_refused_with(r, ErrorCode::Unauthorized, words)
}

#[test]
fn tls_clients_are_served_and_strangers_refused() {
    let dir = tempfile::tempdir().unwrap();
    let procs = tls_node(dir.path(), "");
    let log = std::fs::read_to_string(procs.nodes[&1].config.with_file_name("quired.log")).unwrap();
    assert!(log.contains("clients: TLS 1.3+ with"), "{log}");

    let mut c = client(&procs, procs.client_tls().unwrap());
    let first = c.append(0, b"over tls").expect("append over TLS");
    // Pipelined through the producer: 2,000 records of 1 KiB, batched.
    let records: Vec<Vec<u8>> = (0..2000u32)
        .map(|i| {
            let mut r = i.to_le_bytes().to_vec();
            r.resize(1024, (i % 251) as u8);
            r
        })
        .collect();
    let indexes = c
        .append_all(0, &records, 256, 64)
        .expect("pipelined over TLS");
    assert_eq!(indexes.len(), records.len());
    let mut read = Vec::new();
    let mut from = first;
    while read.len() < records.len() + 1 {
        let got = c.read(0, from, 512).expect("read over TLS");
        assert!(!got.is_empty(), "read stopped at {from}");
        from = got.last().unwrap().index + 1;
        read.extend(got);
    }
    assert_eq!(&read[0].data[..], b"over tls");
    let data: Vec<&[u8]> = read[1..].iter().map(|e| &e.data[..]).collect();
    let want: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
    assert_eq!(data, want, "every record back, in order");
    assert_eq!(
        read[1..].iter().map(|e| e.index).collect::<Vec<_>>(),
        indexes
    );

    let before = metric(&metrics(&procs), "quire_client_tls_failures");
    // Plain TCP to a TLS port: told to give the CA, at once.
    assert_refused(client(&procs, None).append(0, b"x"), "the node serves TLS");
    // Another CA: the node's certificate is not trusted.
    let other = LocalCa::generate("another CA").unwrap();
    let other_ca = write_ca(dir.path(), "other-ca", &other);
    let stranger = tls_with(&procs, |f| f.ca = other_ca.clone());
    assert_refused(
        client(&procs, Some(stranger)).append(0, b"x"),
        "UnknownIssuer",
    );
    // The right CA, the wrong name.
    let wrong_name = tls_with(&procs, |f| f.server_name = Some("db.example".into()));
    assert_refused(
        client(&procs, Some(wrong_name)).append(0, b"x"),
        "not valid for name",
    );
    // Each failed handshake closed one connection and was counted.
    let after = common::wait_for("the failures counted", LIMIT, || {
        let n = metric(&metrics(&procs), "quire_client_tls_failures");
        (n >= before + 3).then_some(n)
    });
    assert_eq!(after.0, before + 3);
    // The first client's connection is unharmed.
    c.append(0, b"still here").expect("the good client goes on");
}

#[test]
fn the_cli_speaks_tls_with_ca_and_says_why_without() {
    let dir = tempfile::tempdir().unwrap();
    let procs = tls_node(dir.path(), "");
    let quire = env!("CARGO_BIN_EXE_quire");
    let token = procs.dir.join("client.token");
    let ca = procs.dir.join("ca.pem");
    let run = |args: &[&str]| {
        let out = Command::new(quire)
            .args(args)
            .env_remove("QUIRE_CA")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.code(), text)
    };
    let a = addr(&procs).to_string();
    let on = ["--addr", &a, "--token-file", token.to_str().unwrap()];
    let with_ca = [&on[..], &["--ca", ca.to_str().unwrap()]].concat();
    let (code, text) = run(&[&["append"], &with_ca[..], &["from the cli"]].concat());
    assert_eq!(code, Some(0), "{text}");
    let index = text
        .split("appended at index ")
        .nth(1)
        .and_then(|t| t.split(':').next())
        .unwrap_or_else(|| panic!("no index in {text:?}"));
    let (code, text) = run(&[&["read"], &with_ca[..], &["--from", index, "--max", "1"]].concat());
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("from the cli"), "{text}");
    let (code, text) = run(&[&["append"], &on[..], &["no ca"]].concat());
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("the node serves TLS") && text.contains("--ca"),
        "{text}"
    );
    // The environment stands in for the flag.
    let out = Command::new(quire)
        .args([&["status"], &on[..]].concat())
        .env("QUIRE_CA", &ca)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A client certificate without its key is a usage error.
    let (code, _) = run(&[
        &["append"],
        &with_ca[..],
        &["--cert", ca.to_str().unwrap(), "x"],
    ]
    .concat());
    assert_eq!(code, Some(2));
}

#[test]
fn mtls_serves_only_certificates_of_the_client_ca() {
    let dir = tempfile::tempdir().unwrap();
    let client_ca = LocalCa::generate("client CA").unwrap();
    let ca_file = write_ca(dir.path(), "client-ca", &client_ca);
    let ((eve_cert, eve_key), eve) =
        write_issued_serial(dir.path(), "eve", &client_ca, &CertRequest::client("eve"));
    let crl_file = dir.path().join("client-ca.crl");
    std::fs::write(&crl_file, client_ca.revocation_list(&[eve], 1).unwrap()).unwrap();
    let extra = format!(
        "tls_client_ca_file = {:?}\ntls_client_crl_file = {:?}\n",
        ca_file.to_str().unwrap(),
        crl_file.to_str().unwrap()
    );
    let mut procs = tls_node(dir.path(), &extra);

    let with_cert = |cert: &Path, key: &Path| {
        tls_with(&procs, |f| {
            f.cert = Some(cert.to_path_buf());
            f.key = Some(key.to_path_buf());
        })
    };
    let ((cert, key), alice_serial) = write_issued_serial(
        dir.path(),
        "alice",
        &client_ca,
        &CertRequest::client("alice"),
    );
    let alice_tls = with_cert(&cert, &key);
    let mut alice = client(&procs, Some(Arc::clone(&alice_tls)));
    alice
        .append(0, b"from alice")
        .expect("a client certificate of the CA is served");

    // No certificate at all.
    assert_refused(
        client(&procs, procs.client_tls().unwrap()).append(0, b"x"),
        "CertificateRequired",
    );
    // Expired a day ago.
    let mut expired = CertRequest::client("old");
    expired.from_days = -30;
    expired.until_days = -1;
    let (cert, key) = write_issued(dir.path(), "old", &client_ca, &expired);
    assert_refused(
        client(&procs, Some(with_cert(&cert, &key))).append(0, b"x"),
        "CertificateExpired",
    );
    // Signed by another CA (the nodes' own, here).
    let rogue_ca = LocalCa::generate("rogue CA").unwrap();
    let (cert, key) = write_issued(
        dir.path(),
        "mallory",
        &rogue_ca,
        &CertRequest::client("mallory"),
    );
    assert_refused(
        client(&procs, Some(with_cert(&cert, &key))).append(0, b"x"),
        "UnknownCA",
    );
    // Revoked by the list the node loaded at start.
    assert_refused(
        client(&procs, Some(with_cert(&eve_cert, &eve_key))).append(0, b"x"),
        "CertificateRevoked",
    );
    let failures = metric(&metrics(&procs), "quire_client_tls_failures");
    assert_eq!(failures, 4, "each refusal counted once");
    alice.append(0, b"alice again").expect("alice unharmed");

    // Alice revoked too, on SIGHUP: her next connection is refused.
    let list = client_ca.revocation_list(&[eve, alice_serial], 2).unwrap();
    std::fs::write(&crl_file, list).unwrap();
    procs.signal(1, libc::SIGHUP);
    let log_path = procs.nodes[&1].config.with_file_name("quired.log");
    common::wait_for("the reload", LIMIT, || {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        log.contains("SIGHUP: client TLS reloaded").then_some(())
    });
    assert_refused(
        client(&procs, Some(alice_tls)).append(0, b"x"),
        "CertificateRevoked",
    );
}

#[test]
fn sighup_rotates_the_certificate_and_keeps_open_connections() {
    let dir = tempfile::tempdir().unwrap();
    let mut procs = tls_node(dir.path(), "");
    let log_path = procs.nodes[&1].config.with_file_name("quired.log");
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let old_tls = procs.client_tls().unwrap().unwrap();
    let mut before = client(&procs, Some(Arc::clone(&old_tls)));
    before.append(0, b"before").expect("served");

    // A new CA and a node certificate from it, in place of the old files.
    let new_ca = LocalCa::generate("quire CA 2").unwrap();
    let new_ca_file = write_ca(dir.path(), "ca2", &new_ca);
    let node_dir = procs.nodes[&1].config.parent().unwrap().to_path_buf();
    let issued = new_ca
        .issue(&CertRequest::server("node1", &["127.0.0.1"]))
        .unwrap();
    std::fs::write(node_dir.join("tls.key"), issued.key_pem).unwrap();
    std::fs::write(node_dir.join("tls.pem"), issued.cert_pem).unwrap();
    procs.signal(1, libc::SIGHUP);
    common::wait_for("the reload", LIMIT, || {
        log().contains("SIGHUP: client TLS reloaded").then_some(())
    });

    // The connection opened before goes on: had it been dropped, its
    // reconnect (trusting only the old CA) would be refused.
    before.append(0, b"after, same connection").expect("kept");
    // New connections get the new certificate.
    assert_refused(
        client(&procs, Some(old_tls)).append(0, b"x"),
        "UnknownIssuer",
    );
    let new_tls = tls_with(&procs, |f| f.ca = new_ca_file.clone());
    client(&procs, Some(Arc::clone(&new_tls)))
        .append(0, b"new connection")
        .expect("the new certificate is served");

    // A reload of a broken file keeps the certificate in use.
    std::fs::write(node_dir.join("tls.pem"), "not a certificate\n").unwrap();
    procs.signal(1, libc::SIGHUP);
    common::wait_for("the refused reload", LIMIT, || {
        log()
            .contains("SIGHUP: client TLS not reloaded")
            .then_some(())
    });
    assert!(!procs.has_exited(1));
    client(&procs, Some(new_tls))
        .append(0, b"still the new certificate")
        .expect("served with the certificate in use");
}

#[test]
fn a_tls_client_of_a_plain_node_is_told_so() {
    let dir = tempfile::tempdir().unwrap();
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_quired"));
    let mut procs = LocalProcesses::prepare(dir.path(), 1, 1, &exe).unwrap();
    procs.start_all().unwrap();
    wait_serving(&procs);
    // The warning may come just after the port serves: waited for, not
    // read once (a fresh-clone CI run read the log before it was there).
    let log_path = procs.nodes[&1].config.with_file_name("quired.log");
    common::wait_for("the plain-TCP warning", LIMIT, || {
        let log = std::fs::read_to_string(&log_path).ok()?;
        log.contains("clients are served plain TCP").then_some(())
    });
    let ca = LocalCa::generate("some CA").unwrap();
    let ca_file = write_ca(dir.path(), "ca", &ca);
    let tls = ClientTls::load(&ClientTlsFiles {
        ca: ca_file,
        ..ClientTlsFiles::default()
    })
    .unwrap();
    assert_refused(
        client(&procs, Some(tls)).append(0, b"x"),
        "does the node serve plain TCP",
    );
    client(&procs, None)
        .append(0, b"plain")
        .expect("plain is served");
}
