//! The admin endpoint over HTTPS (`node.admin_tls = true`) on a real
//! `quired` process (`LocalProcesses`, 127.0.0.1 only), and its admin
//! principals:
//!
//! - it serves HTTPS only, with the client listener's certificate: a
//!   reader needs the CA and no client certificate; a plain HTTP request is
//!   answered, in plain HTTP, that it wants HTTPS; a client that does not
//!   trust the node's CA, or shows a certificate of another CA, fails the
//!   handshake, and both are counted;
//! - `POST /membership` passes for the admin token, for a principal with
//!   an `admin` grant on the group (by token or by client certificate),
//!   and is refused (403 `not_admin`) to the cluster token and to
//!   principals without one, and (403) to an admin of another group;
//! - SIGHUP reloads the admin certificate with the client one;
//! - `quire member` speaks HTTPS with `--ca`, as the principal of
//!   `--cert`, and says what to do without `--ca`.
//!
//! Nothing here sleeps to synchronise: it polls with a generous deadline.

mod common;

use quire::node::local::processes::LocalProcesses;
use quire::tls::issue::LocalCa;
use quire::tls::{ClientTls, ClientTlsFiles};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// A generous bound for anything to happen on a loaded 2-core machine.
const LIMIT: Duration = Duration::from_secs(30);

const CREDENTIALS: &str = r#"
[[principals]]
name = "reader"
token_file = "reader.token"
grants = [{ allow = ["read"] }]

[[principals]]
name = "ops"
token_file = "ops.token"
grants = [{ groups = [0], allow = ["admin"] }]

[[principals]]
name = "ops-elsewhere"
token_file = "elsewhere.token"
grants = [{ groups = [1], allow = ["admin"] }]

[[principals]]
name = "oncall"
cert_common_name = "oncall"
grants = [{ allow = ["admin"] }]

[[principals]]
name = "alice"
cert_common_name = "alice"
grants = [{ allow = ["read", "append"] }]
"#;

/// A one-node TLS cluster with the admin endpoint on HTTPS, client
/// certificates from `client_ca`, and the credentials above, started.
fn node(dir: &Path, client_ca: &LocalCa) -> LocalProcesses {
    let tokens = [
        ("reader.token", "reader-secret-token"),
        ("ops.token", "ops-secret-token-0123"),
        ("elsewhere.token", "elsewhere-token-0123"),
    ];
    common::mtls_node(dir, client_ca, CREDENTIALS, &tokens, |procs, text| {
        let admin_line = format!("admin_listen = \"{}\"\n", procs.nodes[&1].admin);
        assert!(text.contains(&admin_line), "{text}");
        text.replacen(&admin_line, &format!("{admin_line}admin_tls = true\n"), 1)
    })
}

/// Client TLS trusting the cluster's CA, with `cert` if given.
fn tls(procs: &LocalProcesses, cert: Option<&(PathBuf, PathBuf)>) -> Arc<ClientTls> {
    let mut files: ClientTlsFiles = procs.client_tls.clone().unwrap();
    files.cert = cert.map(|c| c.0.clone());
    files.key = cert.map(|c| c.1.clone());
    ClientTls::load(&files).unwrap()
}

fn issue(dir: &Path, ca: &LocalCa, cn: &str) -> (PathBuf, PathBuf) {
    common::issue_client_cert(dir, ca, cn)
}

/// One HTTPS request; the status and body, or the I/O or TLS error.
fn https(
    addr: SocketAddr,
    tls: &ClientTls,
    method: &str,
    path: &str,
    headers: &str,
) -> Result<(u16, String), String> {
    let tcp = std::net::TcpStream::connect_timeout(&addr, LIMIT).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(LIMIT)).unwrap();
    tcp.set_write_timeout(Some(LIMIT)).unwrap();
    let conn = tls.connect(addr).map_err(|e| e.to_string())?;
    let mut s = rustls::StreamOwned::new(conn, tcp);
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: quire\r\n{headers}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .and_then(|()| s.flush())
    .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&raw);
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status line in {text:?}"))?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok((code, body.to_string()))
}

fn bearer(token: &str) -> String {
    format!("Authorization: Bearer {token}\r\n")
}

fn counted(text: &str, metric: &str, reason: &str) -> u64 {
    common::reason_count(text, metric, reason)
}

/// Passes the gate: the change is judged, and node 9 is no member.
const PASSED: (u16, &str) = (400, "node 9 is not a member");
const REMOVE_9: &str = "/membership?group=0&change=remove&node=9";

#[test]
fn the_admin_endpoint_serves_https_and_takes_changes_from_admin_principals() {
    let dir = tempfile::tempdir().unwrap();
    let client_ca = LocalCa::generate("client CA").unwrap();
    let mut procs = node(dir.path(), &client_ca);
    let admin = procs.nodes[&1].admin;
    let reader_tls = tls(&procs, None);
    let status = |t: &ClientTls| https(admin, t, "GET", "/status", "");
    let (st, _) = common::wait_for("the node to lead, over HTTPS", LIMIT, || {
        let (code, body) = status(&reader_tls).ok()?;
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        (code == 200 && v["groups"][0]["role"] == "leader").then_some(v)
    });
    assert_eq!(st["node"], 1, "a reader needs no certificate: {st}");
    let log_path = procs.nodes[&1].config.with_file_name("quired.log");
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(
        log().contains(&format!("admin on https://{admin}/status")),
        "{}",
        log()
    );

    // Plain HTTP is told to use HTTPS.
    let (code, body) = common::http(admin, "GET", "/status", "", LIMIT).expect("a plain answer");
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("serves HTTPS only"), "{body}");
    assert!(body.contains(&format!("https://{admin}/")), "{body}");

    // A client that trusts another CA, or shows a certificate of one.
    let stranger_ca = LocalCa::generate("stranger CA").unwrap();
    let stranger_ca_file = dir.path().join("stranger-ca.pem");
    std::fs::write(&stranger_ca_file, stranger_ca.cert_pem()).unwrap();
    let untrusting = ClientTls::load(&ClientTlsFiles {
        ca: stranger_ca_file,
        cert: None,
        key: None,
        server_name: None,
    })
    .unwrap();
    let err = status(&untrusting).unwrap_err();
    assert!(err.contains("UnknownIssuer"), "{err}");
    let forged = issue(dir.path(), &stranger_ca, "oncall");
    let err = status(&tls(&procs, Some(&forged))).unwrap_err();
    assert!(!err.is_empty());

    // Who may change the membership of group 0.
    let post = |t: &ClientTls, headers: &str| {
        https(admin, t, "POST", REMOVE_9, headers).expect("an answer")
    };
    let passed = |(code, body): (u16, String)| {
        assert_eq!(code, PASSED.0, "{body}");
        assert!(body.contains(PASSED.1), "{body}");
    };
    let admin_token = String::from_utf8(procs.admin_token.clone()).unwrap();
    passed(post(&reader_tls, &bearer(&admin_token)));
    passed(post(&reader_tls, &bearer("ops-secret-token-0123")));
    let oncall = issue(dir.path(), &client_ca, "oncall");
    let oncall_tls = tls(&procs, Some(&oncall));
    passed(post(&oncall_tls, ""));
    let line = log()
        .lines()
        .find(|l| {
            l.contains("membership change") && l.contains("as principal \"oncall\" (certificate)")
        })
        .map(str::to_string);
    assert!(line.is_some(), "the change is logged with who: {}", log());

    let refused = |(code, body): (u16, String), status: u16, words: &str| {
        assert_eq!(code, status, "{body}");
        assert!(body.contains(words), "{words:?} in {body}");
    };
    let cluster_token = String::from_utf8(procs.token.clone()).unwrap();
    refused(
        post(&reader_tls, &bearer(&cluster_token)),
        403,
        "principal \"cluster\" holds no \"admin\" grant on group 0",
    );
    refused(
        post(&reader_tls, &bearer("reader-secret-token")),
        403,
        "principal \"reader\" holds no \"admin\" grant",
    );
    refused(
        post(&reader_tls, &bearer("elsewhere-token-0123")),
        403,
        "principal \"ops-elsewhere\" holds no \"admin\" grant on group 0",
    );
    let alice = issue(dir.path(), &client_ca, "alice");
    let alice_tls = tls(&procs, Some(&alice));
    refused(post(&alice_tls, ""), 403, "principal \"alice\"");
    refused(post(&reader_tls, ""), 401, "client certificate");

    // The failed handshakes are counted by the server's worker once it
    // reads the alert, which may come after the client gave up.
    let (m, _) = common::wait_for("the failed handshakes counted", LIMIT, || {
        let (code, m) = https(admin, &reader_tls, "GET", "/metrics", "").ok()?;
        (code == 200 && counted(&m, "quire_admin_http_refusals", "tls_failed") >= 2).then_some(m)
    });
    assert_eq!(counted(&m, "quire_admin_refusals", "not_admin"), 4, "{m}");
    assert_eq!(
        counted(&m, "quire_admin_refusals", "missing_token"),
        1,
        "{m}"
    );
    assert_eq!(
        counted(&m, "quire_admin_http_refusals", "not_https"),
        1,
        "{m}"
    );

    // SIGHUP reloads the admin certificate with the client one.
    procs.signal(1, libc::SIGHUP);
    common::wait_for("the reload", LIMIT, || {
        log().contains("SIGHUP: admin HTTPS reloaded").then_some(())
    });
    assert_eq!(status(&reader_tls).expect("still served").0, 200);

    // `quire member` over HTTPS: as the certificate's principal, with the
    // admin token, and without --ca.
    let quire = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_quire"))
            .arg("member")
            .arg("--admin")
            .arg(admin.to_string())
            .args(args)
            .args(["remove", "--node", "9"])
            .env_remove("QUIRE_CA")
            .env_remove("QUIRE_CERT")
            .env_remove("QUIRE_KEY")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        String::from_utf8(out.stderr).unwrap()
    };
    let ca = procs.client_tls.as_ref().unwrap().ca.clone();
    let ca = ca.to_str().unwrap();
    let (cert, key) = (oncall.0.to_str().unwrap(), oncall.1.to_str().unwrap());
    let err = quire(&["--ca", ca, "--cert", cert, "--key", key]);
    assert!(err.contains("node 9 is not a member"), "{err}");
    let token_file = dir.path().join("admin.token");
    let token_file = token_file.to_str().unwrap();
    let err = quire(&["--ca", ca, "--admin-token-file", token_file]);
    assert!(err.contains("node 9 is not a member"), "{err}");
    let err = quire(&["--admin-token-file", token_file]);
    assert!(err.contains("serves HTTPS only"), "{err}");
}
