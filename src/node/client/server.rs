//! The client-facing TCP server: it binds the listening socket and hands
//! it to every one of the node's event loops, which accept and serve the
//! connections themselves (`conns`): no thread per connection, no
//! lock on a session. The one thread it keeps answers `Leaders` and
//! `Status`, which gather every loop's state (a loop cannot wait on the
//! others).
//!
//! Which connections are taken and kept (budgets for connections before
//! and after their Hello, a limit per source address, the Hello deadline)
//! is decided by `admission::Admission`; `gate` applies
//! its verdicts to the sockets and counts and logs them.

use crate::api::{Response, ServerConfig};
use crate::consensus::NodeId;
use crate::node::client::admission::ClientLimits;
use crate::node::client::conns::{ClientPort, SlowCall};
use crate::node::client::credentials::Credentials;
use crate::node::client::dispatch::{error_response, leaders_response};
use crate::node::client::gate::Gate;
use crate::node::client::quota::Quotas;
use crate::node::status::status_json;
use crate::node::{ListenError, NodeHandle, ProposeError};
use crate::tls::ServerTls;
use crossbeam_channel::{bounded, Sender};
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::thread::JoinHandle;

/// Authenticated client connections served at once by default
/// (`client.connections_max`; a connection costs memory, not a thread).
pub const CONNECTIONS_MAX: usize = crate::node::client::admission::CONNECTIONS_MAX_DEFAULT;
/// Long polls (Tail, waiting ledger reads, consumes) waiting at once,
/// over all connections; beyond, one is answered Busy.
pub const TAILS_MAX: usize = 256;
/// `Leaders` and `Status` requests queued for the status thread; beyond,
/// one is answered Busy.
pub const STATUS_CALLS_QUEUED_MAX: usize = 256;

/// The running server; stops serving (closes every client connection)
/// when dropped.
pub struct ClientServer {
    addr: SocketAddr,
    node: Arc<NodeHandle>,
    status_thread: Option<JoinHandle<()>>,
}

impl ClientServer {
    /// Listens on `listen` for clients of `node`, which present `token`;
    /// `client_addrs` maps node ids to their client addresses, for
    /// NotLeader redirects. The default [`ClientLimits`].
    pub fn start(
        listen: SocketAddr,
        node: Arc<NodeHandle>,
        token: &[u8],
        client_addrs: BTreeMap<NodeId, String>,
    ) -> Result<ClientServer, ListenError> {
        Self::start_with(
            listen,
            node,
            Credentials::cluster_only(token),
            client_addrs,
            ClientLimits::default(),
            None,
        )
    }

    /// [`start`](Self::start) with the principals of `credentials` (the
    /// cluster token's and the credentials file's), the connection bounds
    /// of `limits` (the config file's `[client]` section), over TLS with
    /// `tls` (plain TCP if `None`).
    pub fn start_with(
        listen: SocketAddr,
        node: Arc<NodeHandle>,
        credentials: Credentials,
        client_addrs: BTreeMap<NodeId, String>,
        limits: ClientLimits,
        tls: Option<Arc<ServerTls>>,
    ) -> Result<ClientServer, ListenError> {
        limits.validate().map_err(ListenError::Limits)?;
        let bind_failed = |error| ListenError::Bind {
            server: "the client server",
            addr: listen,
            error,
        };
        let listener = TcpListener::bind(listen).map_err(bind_failed)?;
        let addr = listener.local_addr().map_err(bind_failed)?;
        listener.set_nonblocking(true).map_err(bind_failed)?;
        let listener = Arc::new(listener);
        let config = Arc::new(ServerConfig::with_tokens(
            node.id(),
            credentials.token_hashes(),
        ));
        let quotas = Arc::new(Quotas::new(
            credentials
                .principals
                .iter()
                .map(|p| (p.name.clone(), p.quota)),
        ));
        node.set_quotas(Arc::clone(&quotas));
        let credentials = Arc::new(credentials);
        let addrs = Arc::new(client_addrs);
        let gate = Arc::new(Gate::new(
            limits,
            node.id(),
            Arc::clone(node.client_counters()),
        ));
        let tails = Arc::new(AtomicUsize::new(0));
        let (slow, calls) = bounded::<SlowCall>(STATUS_CALLS_QUEUED_MAX);
        let status_node = Arc::clone(&node);
        let status_addrs = Arc::clone(&addrs);
        let status_thread = std::thread::Builder::new()
            .name("quire-client-status".into())
            .spawn(move || {
                // Ends once every loop has dropped its port (and with it
                // its sender) and the last call is answered.
                for call in calls {
                    let status = status_node.status();
                    let resp = if call.status {
                        match status {
                            Some(s) => Response::StatusJson {
                                json: status_json(&s).to_string(),
                            },
                            None => error_response(ProposeError::Stopping, &status_addrs),
                        }
                    } else {
                        leaders_response(status.as_ref(), &status_addrs)
                    };
                    (call.answer)(resp);
                }
            })
            .map_err(ListenError::Thread)?;
        let port = |slow: &Sender<SlowCall>| ClientPort {
            listener: Arc::clone(&listener),
            gate: Arc::clone(&gate),
            config: Arc::clone(&config),
            addrs: Arc::clone(&addrs),
            tails: Arc::clone(&tails),
            tails_max: TAILS_MAX,
            slow: slow.clone(),
            tls: tls.clone(),
            credentials: Arc::clone(&credentials),
            limited: credentials.any_limited(),
            quotas: quotas.any().then(|| Arc::clone(&quotas)),
        };
        let served = node.serve_clients(|| port(&slow));
        drop(slow);
        let server = ClientServer {
            addr,
            node,
            status_thread: Some(status_thread),
        };
        served.map_err(|_| {
            ListenError::Thread(std::io::Error::other("the node's loops have stopped"))
        })?;
        Ok(server)
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for ClientServer {
    fn drop(&mut self) {
        self.node.stop_clients();
        if let Some(t) = self.status_thread.take() {
            let _ = t.join();
        }
    }
}
