//! The admin endpoint: HTTP `/metrics` in the Prometheus text format and
//! `/status` as JSON, readable by anyone who can reach it, and `POST
//! /membership`, which only an admin opens (`auth`), served
//! by a few threads of its own off the data path (`http`, which
//! bounds what a peer can make them hold). It asks the node's loops for
//! their status through the handle (channels), so it never touches their
//! state. With `node.admin_tls` it serves all of it over HTTPS only,
//! with the client listener's certificate.

use crate::node::admin::auth::Gate;
use crate::node::admin::http::{Handler, HttpRefusals, HttpRequest, HttpResponse, HttpServer};
use crate::node::admin::metrics::metrics_text_with;
use crate::node::client::credentials::Credentials;
use crate::node::log::log_info;
use crate::node::status::status_json;
use crate::node::{ListenError, NodeHandle};
use crate::tls::ServerTls;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// `POST /membership?group=G&change=remove|learner|voter&node=N[&force=1]`:
/// one membership change of group G, proposed on this node (its leader);
/// answers once applied, or why not: 400 for a request that cannot apply
/// (bad arguments, node 0, removing a non-member, adding a member twice,
/// promoting a voter, or without `force` a node that is not a learner),
/// 404 for a group this node does not run, 409 if this node does not lead
/// the group, another change or a leadership transfer is under way, or
/// (without `force`) the learner to promote is more than
/// `LEARNER_CAUGHT_UP_ENTRIES_MAX` entries behind the leader's log, 503
/// if the group cannot serve (stopped log, full disk, no answer in time).
/// Every outcome is logged with who asked (`peer`, as `who`).
fn membership(node: &NodeHandle, query: &str, peer: &str, who: &str) -> (u16, String) {
    let (code, body) = membership_outcome(node, query);
    log_info!(
        "quired: admin: membership change {query:?} from {peer} as {who}: {code} {}",
        body.trim_end()
    );
    (code, body)
}

/// The value of `key` in a URL's `query` (`k=v&k=v`), if there.
fn query_arg(query: &str, key: &str) -> Option<String> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.to_string())
}

fn membership_outcome(node: &NodeHandle, query: &str) -> (u16, String) {
    use crate::consensus::MembershipChange;
    const USAGE: &str = "want group=G&change=remove|learner|voter&node=N[&force=1]";
    let arg = |k: &str| query_arg(query, k);
    let (Some(group), Some(peer)) = (
        arg("group").and_then(|g| g.parse::<u32>().ok()),
        arg("node").and_then(|n| n.parse::<u64>().ok()),
    ) else {
        return (400, format!("{USAGE}\n"));
    };
    let change = match arg("change").as_deref() {
        Some("remove") => MembershipChange::Remove(peer),
        Some("learner") => MembershipChange::AddLearner(peer),
        Some("voter") => MembershipChange::AddVoter(peer),
        _ => return (400, format!("{USAGE}\n")),
    };
    if peer == 0 {
        return (400, "node 0 is reserved: no node has that id\n".into());
    }
    if !node.groups().any(|g| g == group) {
        let groups: Vec<String> = node.groups().map(|g| g.to_string()).collect();
        return (
            404,
            format!(
                "group {group} is not on this node (its groups: {})\n",
                groups.join(", ")
            ),
        );
    }
    use crate::node::ProposeError as E;
    // `force=1`: promote a learner however far behind, or a non-member.
    let force = matches!(arg("force").as_deref(), Some("1" | "true"));
    match node.change_membership_with(group, change, force, std::time::Duration::from_secs(10)) {
        Ok(index) => (200, format!("{change} applied at index {index}\n")),
        Err(e @ E::Invalid(_)) => (400, format!("{e}\n")),
        Err(e @ (E::NotLeader(_) | E::Busy(_) | E::Lagging(_))) => (409, format!("{e}\n")),
        Err(e) => (503, format!("{e}\n")),
    }
}

/// `POST /leader?group=G&node=N`: hands group G's leadership to voter N
/// (on the group's leader), answered once this node hears from N as
/// leader; logged with who asked.
fn leader_transfer(node: &NodeHandle, query: &str, peer: &str, who: &str) -> (u16, String) {
    let (code, body) = leader_transfer_outcome(node, query);
    log_info!(
        "quired: admin: leadership transfer {query:?} from {peer} as {who}: {code} {}",
        body.trim_end()
    );
    (code, body)
}

fn leader_transfer_outcome(node: &NodeHandle, query: &str) -> (u16, String) {
    const USAGE: &str = "want group=G&node=N (a voter of the group)";
    let arg = |k: &str| query_arg(query, k);
    let (Some(group), Some(to)) = (
        arg("group").and_then(|g| g.parse::<u32>().ok()),
        arg("node").and_then(|n| n.parse::<u64>().ok()),
    ) else {
        return (400, format!("{USAGE}\n"));
    };
    if to == 0 {
        return (400, "node 0 is reserved: no node has that id\n".into());
    }
    if !node.groups().any(|g| g == group) {
        return (404, format!("group {group} is not on this node\n"));
    }
    use crate::node::ProposeError as E;
    match node.transfer_leadership(group, to, std::time::Duration::from_secs(10)) {
        Ok(term) => (
            200,
            format!("node {to} leads group {group} in term {term}\n"),
        ),
        Err(e @ E::Invalid(_)) => (400, format!("{e}\n")),
        Err(e @ (E::NotLeader(_) | E::Busy(_))) => (409, format!("{e}\n")),
        Err(e) => (503, format!("{e}\n")),
    }
}

/// A running admin endpoint; stops when dropped.
pub struct AdminServer {
    http: HttpServer,
}

impl AdminServer {
    /// Serves `/metrics`, `/status`, `/membership` and `/leader` for `node` on
    /// `listen`, over HTTPS only if given `tls`. Requests other than GET
    /// need an admin: the token in `admin_token_file` (read again for
    /// each, so replacing the file rotates it), or a principal of
    /// `credentials` with an `admin` grant, by token or client
    /// certificate; with neither configured they are all refused. What a
    /// peer can make it hold is bounded (`http`).
    pub fn start(
        listen: SocketAddr,
        node: Arc<NodeHandle>,
        admin_token_file: Option<PathBuf>,
        credentials: Credentials,
        tls: Option<Arc<ServerTls>>,
    ) -> Result<AdminServer, ListenError> {
        let bind_failed = |error| ListenError::Bind {
            server: "the admin endpoint",
            addr: listen,
            error,
        };
        let listener = std::net::TcpListener::bind(listen).map_err(bind_failed)?;
        let gate = Mutex::new(Gate::new(admin_token_file, credentials));
        let refusals = Arc::new(HttpRefusals::default());
        let counted = Arc::clone(&refusals);
        let handler: Arc<Handler> =
            Arc::new(move |req: &HttpRequest| answer(&node, &gate, &counted, req));
        let http = HttpServer::start(listener, "quire-admin", handler, refusals, tls)
            .map_err(ListenError::Thread)?;
        Ok(AdminServer { http })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.http.addr()
    }
}

/// What the endpoint answers `req`.
fn answer(
    node: &NodeHandle,
    gate: &Mutex<Gate>,
    http_refusals: &HttpRefusals,
    req: &HttpRequest,
) -> HttpResponse {
    // Held only to judge and to count: never while a change or a status
    // waits on the loops, so one slow request does not hold the others.
    let gate = || gate.lock().unwrap_or_else(|p| p.into_inner());
    let head = &req.head;
    let url = head.url.as_str();
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    let peer = req.peer.map_or("an unknown peer".into(), |a| a.to_string());
    // Whatever is not a read passes the gate first, so a route added
    // later is closed unless said otherwise.
    let reading = matches!(head.method.as_str(), "GET" | "HEAD");
    let mut who = String::new();
    if !reading {
        let headers = head.headers.iter().map(|(n, v)| (n.as_str(), v.as_str()));
        let what = format!("{} {url}", head.method);
        // A group that does not parse is none: only an admin of every
        // group passes, and the route then answers the usage.
        let group = query_arg(query, "group").and_then(|g| g.parse().ok());
        let cn = req.client_cn.as_deref();
        match gate().check(headers, cn, group, &what, req.peer, Instant::now()) {
            Ok(w) => who = w,
            Err(r) => {
                let mut resp = HttpResponse::text(r.refusal.status(), r.body);
                if r.refusal.status() == 401 {
                    resp.headers
                        .push(("WWW-Authenticate", "Bearer realm=\"quire-admin\"".into()));
                }
                return resp;
            }
        }
    }
    let (code, ctype, body) = match (head.method.as_str(), path) {
        ("POST", "/membership") => {
            let (code, body) = membership(node, query, &peer, &who);
            (code, "text/plain", body)
        }
        ("POST", "/leader") => {
            let (code, body) = leader_transfer(node, query, &peer, &who);
            (code, "text/plain", body)
        }
        ("GET" | "HEAD", "/metrics") => match node.status() {
            Some(st) => {
                let refusals = gate().counts();
                let text = metrics_text_with(&st, &refusals, &http_refusals.counts());
                (200, "text/plain; version=0.0.4", text)
            }
            None => (503, "text/plain", "node stopped\n".into()),
        },
        ("GET" | "HEAD", "/status") => match node.status() {
            Some(st) => (200, "application/json", status_json(&st).to_string()),
            None => (503, "text/plain", "node stopped\n".into()),
        },
        _ => (
            404,
            "text/plain",
            "try GET /metrics, GET /status, POST /membership or POST /leader\n".into(),
        ),
    };
    HttpResponse {
        status: code,
        headers: vec![("Content-Type", ctype.into())],
        body,
    }
}
