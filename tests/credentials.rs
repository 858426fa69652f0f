//! Named credentials on real `quired` processes (`LocalProcesses`,
//! 127.0.0.1 only): principals known by a token or by a client
//! certificate's common name, each with grants per group and queue-name
//! prefix. A request a principal's grants do not cover is refused with
//! `Forbidden` (and nothing is applied), counted per principal in
//! `/metrics` and logged; the cluster token keeps every permission.
//!
//! Nothing here sleeps to synchronise: it polls with a generous deadline.

mod common;

use quire::api::ErrorCode;
use quire::client::{Client, ClientError};
use quire::node::local::processes::LocalProcesses;
use quire::tls::issue::LocalCa;
use quire::tls::ClientTls;
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
name = "orders"
token_file = "orders.token"
grants = [{ groups = [0], queues = "orders-", allow = ["create", "append", "consume"] }]

[[principals]]
name = "alice"
cert_common_name = "alice"
grants = [{ allow = ["read"] }]
"#;

/// A one-node TLS cluster with mTLS (client CA `client_ca`) and the
/// credentials above, started.
fn node(dir: &Path, client_ca: &LocalCa) -> LocalProcesses {
    let tokens = [
        ("reader.token", "reader-secret-token"),
        ("orders.token", "orders-secret-token"),
    ];
    let procs = common::mtls_node(dir, client_ca, CREDENTIALS, &tokens, |_, text| text);
    metrics(&procs);
    let client = procs.nodes[&1].client;
    common::wait_for("the client port", LIMIT, || {
        std::net::TcpStream::connect_timeout(&client, Duration::from_secs(1)).ok()
    });
    procs
}

fn metrics(procs: &LocalProcesses) -> String {
    let admin = procs.nodes[&1].admin;
    common::wait_for("the admin endpoint", LIMIT, || {
        let (code, body) = common::http(admin, "GET", "/metrics", "", Duration::from_secs(2))?;
        (code == 200).then_some(body)
    })
    .0
}

/// A client presenting `token`, with a client certificate of `cert`.
fn client(procs: &LocalProcesses, token: &[u8], cert: &(PathBuf, PathBuf)) -> Client {
    let mut files = procs.client_tls.clone().unwrap();
    files.cert = Some(cert.0.clone());
    files.key = Some(cert.1.clone());
    let tls = ClientTls::load(&files).unwrap();
    let id = quire::client::random_client_id().unwrap();
    let mut c = Client::new(vec![procs.nodes[&1].client], token, id).with_tls(Arc::clone(&tls));
    c.deadline = LIMIT;
    c
}

fn issue(dir: &Path, ca: &LocalCa, cn: &str) -> (PathBuf, PathBuf) {
    common::issue_client_cert(dir, ca, cn)
}

fn assert_forbidden<T: std::fmt::Debug>(r: Result<T, ClientError>, words: &str) {
    common::assert_refused_with(r, ErrorCode::Forbidden, words)
}

#[test]
fn principals_do_what_their_grants_allow_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let client_ca = LocalCa::generate("client CA").unwrap();
    let procs = node(dir.path(), &client_ca);
    // A certificate whose name is no principal's: only its token counts.
    let anon = issue(dir.path(), &client_ca, "someone");

    let mut full = client(&procs, &procs.token, &anon);
    let first = full
        .append(0, b"by the cluster token")
        .expect("every permission");

    let mut reader = client(&procs, b"reader-secret-token", &anon);
    let got = reader.read(0, first, 1).expect("reader reads");
    assert_eq!(&got[0].data[..], b"by the cluster token");
    assert_forbidden(
        reader.append(0, b"x"),
        "principal \"reader\" may not append on group 0",
    );
    assert_forbidden(reader.queue_create(0, "orders-1", 3), "may not create");
    assert!(reader.queue_list(0).is_ok(), "listing is a read");

    let mut orders = client(&procs, b"orders-secret-token", &anon);
    orders.queue_create(0, "orders-1", 3).expect("its prefix");
    orders
        .produce(0, "orders-1", &[b"o1".to_vec()])
        .expect("produce");
    let got = orders.consume(0, "orders-1", 10, 30_000).expect("consume");
    assert_eq!(got.len(), 1);
    assert_forbidden(
        orders.queue_create(0, "payments", 3),
        "on queue \"payments\"",
    );
    assert_forbidden(orders.append(0, b"x"), "may not append on group 0");
    assert_forbidden(orders.queue_delete(0, "orders-1"), "may not delete");
    assert!(orders.read(0, first, 1).is_err(), "no read grant");

    // Nothing a denial refused was applied: the log holds only the
    // cluster token's append and the queue's commands after it.
    let all = full.read(0, first, 100).unwrap();
    assert!(all.iter().all(|e| &e.data[..] != b"x"), "{all:?}");

    // Known by its certificate alone: no token.
    let alice = issue(dir.path(), &client_ca, "alice");
    let mut by_cert = client(&procs, b"", &alice);
    assert!(by_cert.read(0, first, 1).is_ok(), "alice reads");
    assert_forbidden(
        by_cert.append(0, b"x"),
        "principal \"alice\" may not append",
    );
    // An unknown certificate name and no token: the Hello fails.
    match client(&procs, b"", &anon).read(0, first, 1) {
        Err(ClientError::Refused(ErrorCode::Unauthorized, why)) => {
            assert!(why.contains("wrong auth token"), "{why}")
        }
        other => panic!("{other:?}"),
    }

    let text = metrics(&procs);
    let denials = |p: &str| {
        let key = format!("quire_client_denials{{principal=\"{p}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&key)?.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert_eq!(denials("reader"), 2);
    assert_eq!(denials("orders"), 4);
    assert_eq!(denials("alice"), 1);
    assert_eq!(denials("cluster"), 0);
    let log = std::fs::read_to_string(procs.nodes[&1].config.with_file_name("quired.log")).unwrap();
    assert!(log.contains("forbidden: principal"), "{log}");
}
