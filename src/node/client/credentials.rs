//! Named credentials: who a client connection is (its principal) and what
//! it may do. Sans-IO: the credentials file's text in, principals and
//! verdicts out; `daemon::config_file` reads the files, the client loops ask.
//!
//! A principal is known by a token (sent in its Hello) or by the common
//! name of its client certificate (mTLS). Its grants say, per group and
//! optionally per queue-name prefix, which operations it may do: `read`,
//! `append` (log appends, ledger entries, produces), `consume` (consume
//! and ack), `create` and `delete` (ledgers and queues), and `admin`
//! (membership changes through the admin endpoint, `node::admin::auth`).
//! The cluster's one token of old (`node.auth_token_file`) is the
//! principal `cluster` with every client permission, so a config without
//! a credentials file works as before; it is not an admin (changing the
//! membership takes a credential of its own, as it did before principals).
//! `Leaders` and `Status` are open to every principal.

use crate::api::Request;
use crate::state::{Command, Query};
use crate::transport::GroupId;
use serde::Deserialize;
use std::collections::HashMap;

/// Principals one credentials file may name at most.
pub const PRINCIPALS_MAX: usize = 1024;
/// Grants one principal may hold at most.
pub const GRANTS_PER_PRINCIPAL_MAX: usize = 64;
/// Bytes an admin token (`node.admin_token_file`) must hold at least,
/// after trailing whitespace: the same bar as the cluster key, so it
/// cannot be guessed.
pub const ADMIN_TOKEN_BYTES_MIN: usize = 16;
/// The name of the principal the cluster token (`node.auth_token_file`)
/// authenticates.
pub const CLUSTER_PRINCIPAL: &str = "cluster";

/// An operation a grant may allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Permission {
    /// Log reads and tails; ledger reads and lists; queue lists and dead
    /// letters.
    Read,
    /// Log appends; ledger entries, LAC and close; queue produces.
    Append,
    /// Queue consumes and acks.
    Consume,
    /// Creating a ledger or queue, and recovering a ledger (which fences
    /// its writer).
    Create,
    /// Deleting a ledger or queue.
    Delete,
    /// Membership changes of the group through the admin endpoint
    /// (`POST /membership`); never asked by the client protocol.
    Admin,
}

impl Permission {
    /// The permission's name in a credentials file.
    pub fn name(self) -> &'static str {
        match self {
            Permission::Read => "read",
            Permission::Append => "append",
            Permission::Consume => "consume",
            Permission::Create => "create",
            Permission::Delete => "delete",
            Permission::Admin => "admin",
        }
    }
}

/// What a request asks for: an operation on a group, perhaps on a queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// The operation.
    pub permission: Permission,
    /// The group.
    pub group: GroupId,
    /// The queue it names, for a queue operation.
    pub queue: Option<String>,
}

/// What `req` asks for; `None` for requests open to every principal
/// (Hello, Leaders, Status) and for commands or queries that do not
/// decode (which are refused as such later).
pub fn access_of(req: &Request) -> Option<Access> {
    let (permission, group, queue) = match req {
        Request::Append { group, .. } | Request::AppendBatch { group, .. } => {
            (Permission::Append, *group, None)
        }
        Request::Read { group, .. } | Request::Tail { group, .. } => {
            (Permission::Read, *group, None)
        }
        Request::Command { group, command, .. } => {
            let (permission, queue) = match Command::decode(command)? {
                Command::CreateLedger { .. } | Command::OpenRecover { .. } => {
                    (Permission::Create, None)
                }
                Command::AddEntry { .. } | Command::SetLac { .. } | Command::CloseLedger { .. } => {
                    (Permission::Append, None)
                }
                Command::DeleteLedger { .. } => (Permission::Delete, None),
                Command::CreateQueue { name, .. } => (Permission::Create, Some(name)),
                Command::DeleteQueue { name } => (Permission::Delete, Some(name)),
                Command::Produce { queue, .. } | Command::ProduceUncounted { queue, .. } => {
                    (Permission::Append, Some(queue))
                }
                Command::Consume { queue, .. } | Command::Ack { queue, .. } => {
                    (Permission::Consume, Some(queue))
                }
            };
            (permission, *group, queue)
        }
        Request::Query { group, query, .. } => {
            let queue = match Query::decode(query)? {
                Query::DeadLetters { queue } => Some(queue),
                _ => None,
            };
            (Permission::Read, *group, queue)
        }
        Request::Hello { .. } | Request::Leaders | Request::Status => return None,
    };
    Some(Access {
        permission,
        group,
        queue,
    })
}

/// One grant: operations on groups, perhaps only on queues of a prefix.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    /// The groups it covers; absent: every group.
    pub groups: Option<Vec<GroupId>>,
    /// If set, it covers only queue operations on queues whose name
    /// starts with this ("" : every queue).
    pub queues: Option<String>,
    /// The operations it allows.
    pub allow: Vec<Permission>,
}

impl Grant {
    fn covers(&self, a: &Access) -> bool {
        let group = self.groups.as_ref().is_none_or(|g| g.contains(&a.group));
        let name = match (&self.queues, &a.queue) {
            (None, _) => true,
            (Some(prefix), Some(q)) => q.starts_with(prefix.as_str()),
            (Some(_), None) => false,
        };
        group && name && self.allow.contains(&a.permission)
    }
}

/// Who a connection is and what it may do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// Its name, in denials, logs and metrics.
    pub name: String,
    /// Every permission on everything (the cluster token's principal):
    /// no request is checked.
    pub all: bool,
    /// Its grants (unused if `all`).
    pub grants: Vec<Grant>,
    /// Its write quotas (`node::quota`).
    pub quota: crate::node::client::quota::Quota,
}

impl Principal {
    /// Whether it may do `a`.
    pub fn allows(&self, a: &Access) -> bool {
        self.all || self.grants.iter().any(|g| g.covers(a))
    }

    /// Whether it may change the membership of `group` through the admin
    /// endpoint; with `None` (a request naming no group), of every group.
    /// Only an `admin` grant says so: `all` (the cluster token) does not.
    pub fn administers(&self, group: Option<GroupId>) -> bool {
        self.grants.iter().any(|g| {
            let groups = match (&g.groups, group) {
                (None, _) => true,
                (Some(gs), Some(group)) => gs.contains(&group),
                (Some(_), None) => false,
            };
            groups && g.queues.is_none() && g.allow.contains(&Permission::Admin)
        })
    }

    /// Why `a` is denied, for the client (`Forbidden`) and the log.
    pub fn denial(&self, a: &Access) -> String {
        match &a.queue {
            Some(q) => format!(
                "principal {:?} may not {} on queue {q:?} of group {}",
                self.name,
                a.permission.name(),
                a.group
            ),
            None => format!(
                "principal {:?} may not {} on group {}",
                self.name,
                a.permission.name(),
                a.group
            ),
        }
    }
}

/// A principal's index in [`Credentials::principals`].
pub type PrincipalId = u32;

/// Every principal of a node, and how each is recognised.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    /// The principals; an id is an index here.
    pub principals: Vec<Principal>,
    /// BLAKE3 of each token -> its principal.
    tokens: HashMap<[u8; 32], PrincipalId>,
    /// A client certificate's subject common name -> its principal.
    certificates: HashMap<String, PrincipalId>,
}

/// A principal as the credentials file spells it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPrincipal {
    /// Its name.
    pub name: String,
    /// A file holding its token (relative to the credentials file).
    pub token_file: Option<std::path::PathBuf>,
    /// The common name (CN) of its client certificate's subject.
    pub cert_common_name: Option<String>,
    /// Its grants.
    #[serde(default)]
    pub grants: Vec<Grant>,
    /// Bytes of writes per second it may make, at most.
    pub quota_bytes_per_s: Option<u64>,
    /// Write requests per second it may make, at most.
    pub quota_requests_per_s: Option<u64>,
}

/// The credentials file as serde sees it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCredentials {
    /// `[[principals]]`.
    #[serde(default)]
    pub principals: Vec<RawPrincipal>,
}

impl Credentials {
    /// Only the cluster token's principal, with every permission.
    pub fn cluster_only(token: &[u8]) -> Credentials {
        let mut c = Credentials::default();
        c.add(
            Principal {
                name: CLUSTER_PRINCIPAL.into(),
                all: true,
                grants: Vec::new(),
                quota: Default::default(),
            },
            Some(token),
            None,
        )
        .expect("the first principal");
        c
    }

    /// Adds `p`, known by `token` and/or `cert_cn`; an error says which
    /// is taken already.
    pub fn add(
        &mut self,
        p: Principal,
        token: Option<&[u8]>,
        cert_cn: Option<&str>,
    ) -> Result<PrincipalId, String> {
        if self.principals.len() >= PRINCIPALS_MAX {
            return Err(format!("more than {PRINCIPALS_MAX} principals"));
        }
        if self.principals.iter().any(|q| q.name == p.name) {
            return Err(format!("principal {:?} is named twice", p.name));
        }
        let id = self.principals.len() as PrincipalId;
        if let Some(t) = token {
            let h = *blake3::hash(t).as_bytes();
            if let Some(&other) = self.tokens.get(&h) {
                return Err(format!(
                    "principal {:?} has the token of principal {:?}",
                    p.name, self.principals[other as usize].name
                ));
            }
            self.tokens.insert(h, id);
        }
        if let Some(cn) = cert_cn {
            if let Some(&other) = self.certificates.get(cn) {
                return Err(format!(
                    "principal {:?} has the certificate name of principal {:?}",
                    p.name, self.principals[other as usize].name
                ));
            }
            self.certificates.insert(cn.to_string(), id);
        }
        self.principals.push(p);
        Ok(id)
    }

    /// The principal a Hello's token authenticates.
    pub fn by_token(&self, token: &[u8]) -> Option<PrincipalId> {
        self.tokens.get(blake3::hash(token).as_bytes()).copied()
    }

    /// The principal a client certificate with subject CN `cn` is.
    pub fn by_certificate(&self, cn: &str) -> Option<PrincipalId> {
        self.certificates.get(cn).copied()
    }

    /// Each token's BLAKE3 and its principal, for the session config.
    pub fn token_hashes(&self) -> impl Iterator<Item = ([u8; 32], PrincipalId)> + '_ {
        self.tokens.iter().map(|(h, &p)| (*h, p))
    }

    /// The principal `id`.
    pub fn principal(&self, id: PrincipalId) -> Option<&Principal> {
        self.principals.get(id as usize)
    }

    /// The names of the principals that hold an `admin` grant.
    pub fn admins(&self) -> impl Iterator<Item = &str> + '_ {
        self.principals
            .iter()
            .filter(|p| {
                p.grants
                    .iter()
                    .any(|g| g.allow.contains(&Permission::Admin))
            })
            .map(|p| p.name.as_str())
    }

    /// Whether some principal holds an `admin` grant.
    pub fn any_admin(&self) -> bool {
        self.admins().next().is_some()
    }

    /// Whether some principal is limited (else no request is checked).
    pub fn any_limited(&self) -> bool {
        self.principals.iter().any(|p| !p.all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(groups: Option<Vec<u32>>, queues: Option<&str>, allow: &[Permission]) -> Grant {
        Grant {
            groups,
            queues: queues.map(str::to_string),
            allow: allow.to_vec(),
        }
    }

    fn access(p: Permission, group: u32, queue: Option<&str>) -> Access {
        Access {
            permission: p,
            group,
            queue: queue.map(str::to_string),
        }
    }

    #[test]
    fn grants_cover_their_groups_prefixes_and_operations() {
        use Permission::*;
        let p = Principal {
            name: "app".into(),
            all: false,
            grants: vec![
                grant(Some(vec![0]), None, &[Read]),
                grant(None, Some("orders-"), &[Append, Consume]),
            ],
            quota: Default::default(),
        };
        assert!(p.allows(&access(Read, 0, None)));
        assert!(p.allows(&access(Read, 0, Some("x"))));
        assert!(!p.allows(&access(Read, 1, None)));
        assert!(
            !p.allows(&access(Append, 0, None)),
            "a queue grant is not a log grant"
        );
        assert!(p.allows(&access(Append, 3, Some("orders-eu"))));
        assert!(!p.allows(&access(Append, 3, Some("payments"))));
        assert!(!p.allows(&access(Create, 3, Some("orders-eu"))));
        assert_eq!(
            p.denial(&access(Create, 3, Some("orders-eu"))),
            "principal \"app\" may not create on queue \"orders-eu\" of group 3"
        );
    }

    #[test]
    fn only_an_admin_grant_administers_and_only_its_groups() {
        use Permission::*;
        let p = |grants| Principal {
            name: "p".into(),
            all: false,
            grants,
            quota: Default::default(),
        };
        let ops = p(vec![grant(Some(vec![0, 2]), None, &[Admin, Read])]);
        assert!(ops.administers(Some(0)) && ops.administers(Some(2)));
        assert!(!ops.administers(Some(1)));
        assert!(!ops.administers(None), "not every group");
        let everywhere = p(vec![grant(None, None, &[Admin])]);
        assert!(everywhere.administers(Some(7)) && everywhere.administers(None));
        let writer = p(vec![grant(
            None,
            None,
            &[Read, Append, Consume, Create, Delete],
        )]);
        assert!(!writer.administers(Some(0)));
        let cluster = Credentials::cluster_only(b"t");
        assert!(
            !cluster.principal(0).unwrap().administers(Some(0)),
            "the cluster token is no admin"
        );
        assert!(!cluster.any_admin());
    }

    #[test]
    fn requests_map_to_their_access() {
        use crate::api::Request;
        let cmd = |c: Command| Request::Command {
            group: 2,
            client_id: 1,
            seq: 1,
            command: c.encode(),
        };
        let r = Request::Read {
            group: 4,
            from: 1,
            max_entries: 1,
            max_bytes: 1,
            stale: false,
        };
        assert_eq!(access_of(&r), Some(access(Permission::Read, 4, None)));
        let r = cmd(Command::DeleteQueue {
            name: "jobs".into(),
        });
        assert_eq!(
            access_of(&r),
            Some(access(Permission::Delete, 2, Some("jobs")))
        );
        assert_eq!(access_of(&Request::Status), None);
    }

    #[test]
    fn tokens_and_names_are_unique() {
        let mut c = Credentials::cluster_only(b"t0");
        let p = |n: &str| Principal {
            name: n.into(),
            all: false,
            grants: Vec::new(),
            quota: Default::default(),
        };
        assert_eq!(c.add(p("a"), Some(b"t1"), Some("cn-a")), Ok(1));
        assert!(c
            .add(p("b"), Some(b"t0"), None)
            .unwrap_err()
            .contains("\"cluster\""));
        assert!(c.add(p("a"), None, None).unwrap_err().contains("twice"));
        assert!(c.add(p("c"), None, Some("cn-a")).is_err());
        assert_eq!(c.by_token(b"t1"), Some(1));
        assert_eq!(c.by_token(b"t2"), None);
        assert_eq!(c.by_certificate("cn-a"), Some(1));
        assert!(c.any_limited());
    }
}
