//! The admin endpoint on a running (single-node) cluster: `/status` is
//! JSON with the node's groups, links and alarm; `/metrics` is the
//! Prometheus text format; anything else is a 404; membership changes
//! need the admin token and answer 400/404/409 for what cannot apply.

mod common;

use quire::node::admin::endpoint::AdminServer;
use quire::node::client::credentials::Credentials;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

const ADMIN_TOKEN: &str = "0123456789abcdef-admin";

/// One HTTP/1.1 request with `headers` (`Name: value\r\n` each); the
/// status code and the body.
fn http(addr: SocketAddr, method: &str, path: &str, headers: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\n{headers}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let code = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (code, body)
}

fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    http(addr, "GET", path, "")
}

/// A POST with the admin token.
fn post(addr: SocketAddr, path: &str) -> (u16, String) {
    http(
        addr,
        "POST",
        path,
        &format!("Authorization: Bearer {ADMIN_TOKEN}\r\n"),
    )
}

/// An admin endpoint for `node` whose token file holds [`ADMIN_TOKEN`].
fn admin_with_token(dir: &std::path::Path, node: &Arc<quire::node::NodeHandle>) -> AdminServer {
    let f = dir.join("admin.token");
    std::fs::write(&f, ADMIN_TOKEN).unwrap();
    AdminServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Arc::clone(node),
        Some(f),
        Credentials::default(),
        None,
    )
    .unwrap()
}

#[test]
fn status_and_metrics_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let node = common::single_node(dir.path());
    let admin = AdminServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Arc::clone(&node),
        None,
        Credentials::default(),
        None,
    )
    .unwrap();

    let (code, body) = get(admin.addr(), "/status");
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["node"], 1);
    assert_eq!(v["groups"][0]["role"], "leader");
    assert!(v["groups"][0]["commit"].as_u64().unwrap() >= 2);
    assert_eq!(v["alarm"], false);
    let backend = v["groups"][0]["backend"].as_str().unwrap();
    assert!(backend == "io_uring" || backend == "portable", "{backend}");
    assert_eq!(v["groups"][0]["follower_lag"], serde_json::json!([]));

    let (code, body) = get(admin.addr(), "/metrics");
    assert_eq!(code, 200);
    assert!(
        body.contains("quire_raft_is_leader{group=\"0\"} 1"),
        "{body}"
    );
    assert!(body.contains("# TYPE quire_raft_term gauge"), "{body}");
    assert!(body.contains("quire_link_alarm 0"), "{body}");

    assert_eq!(get(admin.addr(), "/nope").0, 404);
    // No admin token configured: changes are off, and the answer says
    // which key turns them on.
    let (code, body) = post(admin.addr(), "/membership?group=0&change=learner&node=9");
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("node.admin_token_file"), "{body}");
    drop(admin);
}

// That every exported metric is documented is checked in tests/docs.rs.

#[test]
fn membership_changes_through_the_admin_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let node = common::single_node(dir.path());
    let admin = admin_with_token(dir.path(), &node);
    let (code, body) = post(admin.addr(), "/membership?group=0&change=learner&node=9");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("add learner 9 applied at index"), "{body}");
    let (_, status) = get(admin.addr(), "/status");
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(v["groups"][0]["learners"], serde_json::json!([9]));
    assert_eq!(v["groups"][0]["voters"], serde_json::json!([1]));
    assert_eq!(
        post(admin.addr(), "/membership?group=0&change=oops&node=9").0,
        400
    );
    assert_eq!(post(admin.addr(), "/membership?change=voter&node=9").0, 400);
    // What cannot apply says why, and is not a 503.
    let (code, body) = post(admin.addr(), "/membership?group=7&change=voter&node=9");
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("group 7 is not on this node"), "{body}");
    let (code, body) = post(admin.addr(), "/membership?group=0&change=remove&node=0");
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("node 0 is reserved"), "{body}");
    let (code, body) = post(admin.addr(), "/membership?group=0&change=remove&node=5");
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("node 5 is not a member"), "{body}");
    let (code, body) = post(admin.addr(), "/membership?group=0&change=learner&node=9");
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("already a member"), "{body}");
}
