//! The admin endpoint: HTTP `/metrics`, `/status` and the operator's
//! `POST` routes, on threads of its own off the data path.
//!
//! - `http`, `http_head`: the bounded HTTP/1.1 server and its head parser
//!   (what a peer can make the endpoint hold);
//! - `auth`: who may change the cluster (the admin token, TLS);
//! - `endpoint`: the server and its routes;
//! - `metrics`, `group_metrics`: `/metrics`, the node's and each group's.
//!
//! Nothing here runs on a loop or touches a replica: the endpoint asks
//! the loops through the handle.

pub(super) mod auth;
pub mod endpoint;
mod group_metrics;
pub mod http;
pub mod http_head;
pub mod metrics;
