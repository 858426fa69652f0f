//! Who may change the cluster through the admin endpoint. Every request
//! that is not a GET or HEAD (today `POST /membership`) must come from an
//! admin, and none may come from a browser (an `Origin` or
//! `Sec-Fetch-Site` header: a page the operator visits could otherwise
//! reach a loopback listener by DNS rebinding or a cross-site form, as
//! etcd and Consul guard against). An admin is who sends, as
//! `Authorization: Bearer <token>`, the token of `node.admin_token_file`
//! or of a principal with an `admin` grant on the request's group
//! (`node::credentials`), or, over HTTPS, shows a client certificate
//! naming such a principal. With neither an admin token file nor an admin
//! principal configured such requests are refused: the endpoint is never
//! open by default.
//!
//! The token file is read again on every such request, so replacing it
//! rotates the token without a restart; those requests are rare and this
//! thread is off the data path, so the read costs nothing that matters.
//! Refusals are counted for `/metrics` and logged at most once per
//! [`REFUSAL_LOG_INTERVAL_MS`], with how many were not logged since.
//!
//! This module reads the token file and writes log lines to stderr; it
//! never touches the node.

use crate::node::client::credentials::{Credentials, ADMIN_TOKEN_BYTES_MIN};
use crate::transport::GroupId;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// At most one refusal line per this interval; the rest are counted.
pub(crate) const REFUSAL_LOG_INTERVAL_MS: u64 = 1_000;

/// Why a mutating request was refused; each is a `reason` label of
/// `quire_admin_refusals`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No `Authorization` header (401).
    MissingToken,
    /// An `Authorization` header that is not one `Bearer <token>` (401).
    MalformedToken,
    /// A bearer token that is not the admin token nor any principal's
    /// (403).
    WrongToken,
    /// A known principal (by token or client certificate) without an
    /// `admin` grant on the request's group (403).
    NotAdmin,
    /// An `Origin` or `Sec-Fetch-Site` header: sent by a browser (403).
    Browser,
    /// Neither `node.admin_token_file` nor an admin principal in the
    /// config: changes are off (403).
    NotConfigured,
    /// The token file cannot be read now or holds too little (503; the
    /// operator's fault, not the caller's).
    TokenFileUnusable,
}

impl Refusal {
    /// Every reason, in the order of [`RefusalCounts`].
    pub(crate) const ALL: [Refusal; 7] = [
        Refusal::MissingToken,
        Refusal::MalformedToken,
        Refusal::WrongToken,
        Refusal::NotAdmin,
        Refusal::Browser,
        Refusal::NotConfigured,
        Refusal::TokenFileUnusable,
    ];

    /// Its `reason` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Refusal::MissingToken => "missing_token",
            Refusal::MalformedToken => "malformed_token",
            Refusal::WrongToken => "wrong_token",
            Refusal::NotAdmin => "not_admin",
            Refusal::Browser => "browser",
            Refusal::NotConfigured => "not_configured",
            Refusal::TokenFileUnusable => "token_file_unusable",
        }
    }

    /// The HTTP status it is answered with.
    pub(crate) fn status(self) -> u16 {
        match self {
            Refusal::MissingToken | Refusal::MalformedToken => 401,
            Refusal::WrongToken | Refusal::NotAdmin | Refusal::Browser | Refusal::NotConfigured => {
                403
            }
            Refusal::TokenFileUnusable => 503,
        }
    }

    fn index(self) -> usize {
        Refusal::ALL
            .iter()
            .position(|&r| r == self)
            .expect("ALL lists every reason")
    }
}

/// Refusals so far, per reason (indexed as [`Refusal::ALL`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RefusalCounts(pub(crate) [u64; 7]);

impl RefusalCounts {
    /// Each reason's label and count.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Refusal::ALL.iter().map(|r| (r.label(), self.0[r.index()]))
    }
}

/// A refused request's answer.
#[derive(Debug)]
pub(crate) struct Refused {
    /// Why.
    pub(crate) refusal: Refusal,
    /// The body: what to do about it.
    pub(crate) body: String,
}

/// Reads the admin token from `path`: trailing whitespace dropped, at
/// least [`ADMIN_TOKEN_BYTES_MIN`] bytes left.
pub(crate) fn read_admin_token(path: &Path) -> Result<Vec<u8>, String> {
    let bytes = crate::io::private::read_capped(path, crate::io::private::SECRET_FILE_BYTES_MAX)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let token = bytes.trim_ascii_end();
    if token.len() < ADMIN_TOKEN_BYTES_MIN {
        return Err(format!(
            "{} holds {} bytes; an admin token needs at least {ADMIN_TOKEN_BYTES_MIN} (head -c 32 /dev/urandom | base64 > FILE)",
            path.display(),
            token.len()
        ));
    }
    Ok(token.to_vec())
}

/// Whether `presented` is `expected`, in time independent of where they
/// differ and of either length: both are hashed first, and the equal-size
/// digests compared in constant time.
fn same_token(presented: &[u8], expected: &[u8]) -> bool {
    constant_time_eq::constant_time_eq_32(
        blake3::hash(presented).as_bytes(),
        blake3::hash(expected).as_bytes(),
    )
}

/// Rate limit of the refusal lines.
#[derive(Debug, Default)]
struct LogLimit {
    last_line: Option<Instant>,
    suppressed: u64,
}

impl LogLimit {
    /// `Some(n)` if a line may be written at `now` (`n` refusals went
    /// unlogged since the last line); `None` if this one is suppressed.
    fn admit(&mut self, now: Instant) -> Option<u64> {
        let interval = Duration::from_millis(REFUSAL_LOG_INTERVAL_MS);
        match self.last_line {
            Some(t) if now.saturating_duration_since(t) < interval => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last_line = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

/// The check every mutating request passes, with its counters and log
/// limit. One per admin endpoint; only its thread uses it.
#[derive(Debug)]
pub(crate) struct Gate {
    token_file: Option<PathBuf>,
    credentials: Credentials,
    counts: RefusalCounts,
    log: LogLimit,
}

impl Gate {
    /// A gate taking the token in `token_file` and the principals of
    /// `credentials` that hold an `admin` grant; with neither, it refuses
    /// every mutating request.
    pub(crate) fn new(token_file: Option<PathBuf>, credentials: Credentials) -> Gate {
        Gate {
            token_file,
            credentials,
            counts: RefusalCounts::default(),
            log: LogLimit::default(),
        }
    }

    /// Refusals so far.
    pub(crate) fn counts(&self) -> RefusalCounts {
        self.counts
    }

    /// Checks a mutating request on `group` (`None`: it names none) by
    /// its `headers` (name, value) and the verified client certificate's
    /// common name `client_cn`; says who passed (for the log of the
    /// change). `what` (method and URL) and `peer` are for the log line
    /// of a refusal.
    pub(crate) fn check<'a>(
        &mut self,
        headers: impl IntoIterator<Item = (&'a str, &'a str)>,
        client_cn: Option<&str>,
        group: Option<GroupId>,
        what: &str,
        peer: Option<SocketAddr>,
        now: Instant,
    ) -> Result<String, Refused> {
        let result = self.judge(headers, client_cn, group);
        if let Err(r) = &result {
            self.counts.0[r.refusal.index()] += 1;
            if let Some(unlogged) = self.log.admit(now) {
                let peer = peer.map_or("an unknown peer".into(), |p| p.to_string());
                let more = if unlogged > 0 {
                    format!(" ({unlogged} more refused since the last such line)")
                } else {
                    String::new()
                };
                crate::node::log::log_warn!(
                    "quired: admin: refused {what:?} from {peer}: {} {}{more}",
                    r.refusal.status(),
                    r.refusal.label()
                );
            }
        }
        result
    }

    fn judge<'a>(
        &self,
        headers: impl IntoIterator<Item = (&'a str, &'a str)>,
        client_cn: Option<&str>,
        group: Option<GroupId>,
    ) -> Result<String, Refused> {
        let refuse = |refusal, body: String| Err(Refused { refusal, body });
        let mut browser = false;
        let mut auth = Vec::new();
        for (name, value) in headers {
            if name.eq_ignore_ascii_case("origin") || name.eq_ignore_ascii_case("sec-fetch-site") {
                browser = true;
            } else if name.eq_ignore_ascii_case("authorization") {
                auth.push(value);
            }
        }
        if browser {
            return refuse(
                Refusal::Browser,
                "refused: a browser sent this (Origin header); the admin endpoint takes changes from tools only\n".into(),
            );
        }
        if self.token_file.is_none() && !self.credentials.any_admin() {
            return refuse(
                Refusal::NotConfigured,
                "refused: changes through the admin endpoint are off on this node; set node.admin_token_file in its config (a file of its own, not the client token), or give a principal of node.credentials_file an \"admin\" grant, and restart it\n".into(),
            );
        }
        let on = match group {
            Some(g) => format!("group {g}"),
            None => "every group".into(),
        };
        let not_admin = |name: &str| {
            refuse(
                Refusal::NotAdmin,
                format!("refused: principal {name:?} holds no \"admin\" grant on {on} (node.credentials_file); membership changes take the admin token (node.admin_token_file) or an admin principal\n"),
            )
        };
        let presented = match auth.as_slice() {
            [] => {
                // No token: a verified client certificate may name an admin.
                let principal = client_cn.and_then(|cn| {
                    let id = self.credentials.by_certificate(cn)?;
                    self.credentials.principal(id)
                });
                return match principal {
                    Some(p) if p.administers(group) => Ok(format!("principal {:?} (certificate)", p.name)),
                    Some(p) => not_admin(&p.name),
                    None => refuse(
                        Refusal::MissingToken,
                        "refused: send the admin token (node.admin_token_file) or an admin principal's token as Authorization: Bearer <token>, or, over HTTPS, an admin principal's client certificate\n".into(),
                    ),
                };
            }
            [one] => bearer(one),
            _ => None,
        };
        let Some(presented) = presented else {
            return refuse(
                Refusal::MalformedToken,
                "refused: want one header Authorization: Bearer <token>\n".into(),
            );
        };
        let admin_token = self.token_file.as_deref().map(read_admin_token);
        if let Some(Ok(expected)) = &admin_token {
            if same_token(presented.as_bytes(), expected) {
                return Ok("the admin token".into());
            }
        }
        if let Some(p) = self
            .credentials
            .by_token(presented.as_bytes())
            .and_then(|id| self.credentials.principal(id))
        {
            return if p.administers(group) {
                Ok(format!("principal {:?}", p.name))
            } else {
                not_admin(&p.name)
            };
        }
        match admin_token {
            None => refuse(
                Refusal::WrongToken,
                "refused: not an admin principal's token (node.credentials_file), and this node has no node.admin_token_file\n".into(),
            ),
            Some(Err(e)) => refuse(
                Refusal::TokenFileUnusable,
                format!("refused: this node cannot read its admin token (node.admin_token_file): {e}\n"),
            ),
            Some(Ok(_)) => refuse(
                Refusal::WrongToken,
                "refused: not the admin token (node.admin_token_file) nor an admin principal's\n".into(),
            ),
        }
    }
}

/// The token of `Bearer <token>` (the scheme is case-insensitive, RFC
/// 7235 §2.1); `None` for another scheme or an empty token.
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && !token.contains(' '))
        .then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::client::credentials::{Grant, Permission, Principal};

    const TOKEN: &str = "0123456789abcdef0123";
    const CLUSTER_TOKEN: &[u8] = b"cluster-token-0123456789";

    fn gate(dir: &Path) -> Gate {
        let f = dir.join("admin.token");
        std::fs::write(&f, format!("{TOKEN}\n")).unwrap();
        Gate::new(Some(f), Credentials::cluster_only(CLUSTER_TOKEN))
    }

    fn check(g: &mut Gate, headers: &[(&str, &str)]) -> Result<String, Refusal> {
        g.check(
            headers.iter().copied(),
            None,
            Some(0),
            "POST /x",
            None,
            Instant::now(),
        )
        .map_err(|r| r.refusal)
    }

    /// The cluster token, an admin of group 0 by token (`ops`) and one by
    /// certificate (`oncall`), and a reader of everything (`reader`).
    fn principals() -> Credentials {
        let mut c = Credentials::cluster_only(CLUSTER_TOKEN);
        let principal =
            |name: &str, groups: Option<Vec<GroupId>>, allow: &[Permission]| Principal {
                name: name.into(),
                all: false,
                grants: vec![Grant {
                    groups,
                    queues: None,
                    allow: allow.to_vec(),
                }],
                quota: Default::default(),
            };
        use Permission::{Admin, Read};
        c.add(
            principal("ops", Some(vec![0]), &[Admin]),
            Some(b"ops-token-0123456789"),
            None,
        )
        .unwrap();
        c.add(principal("oncall", None, &[Admin]), None, Some("oncall"))
            .unwrap();
        c.add(
            principal("reader", None, &[Read]),
            Some(b"reader-token-0123456789"),
            Some("reader"),
        )
        .unwrap();
        c
    }

    fn check_as(
        g: &mut Gate,
        token: Option<&str>,
        cn: Option<&str>,
        group: Option<GroupId>,
    ) -> Result<String, Refusal> {
        let auth = token.map(|t| ("Authorization", format!("Bearer {t}")));
        let headers = auth.iter().map(|(n, v)| (*n, v.as_str()));
        g.check(headers, cn, group, "POST /x", None, Instant::now())
            .map_err(|r| r.refusal)
    }

    #[test]
    fn only_the_admin_token_from_a_tool_passes() {
        let d = tempfile::tempdir().unwrap();
        let mut g = gate(d.path());
        let right = format!("Bearer {TOKEN}");
        let admin = Ok("the admin token".to_string());
        assert_eq!(check(&mut g, &[("Authorization", &right)]), admin);
        assert_eq!(
            check(&mut g, &[("authorization", &format!("bearer  {TOKEN} "))]),
            admin
        );
        assert_eq!(check(&mut g, &[]), Err(Refusal::MissingToken));
        assert_eq!(
            check(&mut g, &[("Authorization", TOKEN)]),
            Err(Refusal::MalformedToken)
        );
        assert_eq!(
            check(&mut g, &[("Authorization", "Basic eDp5")]),
            Err(Refusal::MalformedToken)
        );
        assert_eq!(
            check(
                &mut g,
                &[("Authorization", &right), ("Authorization", &right)]
            ),
            Err(Refusal::MalformedToken)
        );
        assert_eq!(
            check(&mut g, &[("Authorization", "Bearer 0123456789abcdef012")]),
            Err(Refusal::WrongToken)
        );
        assert_eq!(
            check(
                &mut g,
                &[("Authorization", &right), ("Origin", "http://evil")]
            ),
            Err(Refusal::Browser)
        );
        assert_eq!(
            check(
                &mut g,
                &[("Authorization", &right), ("Sec-Fetch-Site", "cross-site")]
            ),
            Err(Refusal::Browser)
        );
        let counts: Vec<_> = g.counts().iter().collect();
        assert_eq!(
            counts,
            [
                ("missing_token", 1),
                ("malformed_token", 3),
                ("wrong_token", 1),
                ("not_admin", 0),
                ("browser", 2),
                ("not_configured", 0),
                ("token_file_unusable", 0),
            ]
        );
    }

    #[test]
    fn no_token_file_refuses_everything_and_says_which_key() {
        let mut g = Gate::new(None, Credentials::cluster_only(CLUSTER_TOKEN));
        let r = g
            .check(
                [("Authorization", "Bearer anything-at-all")],
                None,
                Some(0),
                "POST /x",
                None,
                Instant::now(),
            )
            .unwrap_err();
        assert_eq!(r.refusal, Refusal::NotConfigured);
        assert_eq!(r.refusal.status(), 403);
        assert!(r.body.contains("node.admin_token_file"), "{}", r.body);
        assert!(r.body.contains("\"admin\" grant"), "{}", r.body);
    }

    #[test]
    fn admin_principals_pass_by_token_or_certificate_on_their_groups_only() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("admin.token");
        std::fs::write(&f, TOKEN).unwrap();
        for token_file in [None, Some(f)] {
            let with_file = token_file.is_some();
            let mut g = Gate::new(token_file, principals());
            let ops = Some("ops-token-0123456789");
            assert_eq!(
                check_as(&mut g, ops, None, Some(0)),
                Ok("principal \"ops\"".into())
            );
            assert_eq!(check_as(&mut g, ops, None, Some(1)), Err(Refusal::NotAdmin));
            assert_eq!(check_as(&mut g, ops, None, None), Err(Refusal::NotAdmin));
            assert_eq!(
                check_as(&mut g, None, Some("oncall"), Some(5)),
                Ok("principal \"oncall\" (certificate)".into())
            );
            // A token, when sent, is what is judged, not the certificate.
            assert_eq!(
                check_as(
                    &mut g,
                    Some("reader-token-0123456789"),
                    Some("oncall"),
                    Some(0)
                ),
                Err(Refusal::NotAdmin)
            );
            assert_eq!(
                check_as(&mut g, None, Some("reader"), Some(0)),
                Err(Refusal::NotAdmin)
            );
            assert_eq!(
                check_as(&mut g, None, Some("stranger"), Some(0)),
                Err(Refusal::MissingToken)
            );
            let cluster = std::str::from_utf8(CLUSTER_TOKEN).unwrap();
            assert_eq!(
                check_as(&mut g, Some(cluster), None, Some(0)),
                Err(Refusal::NotAdmin),
                "the cluster token is every client permission but not admin"
            );
            assert_eq!(
                check_as(&mut g, Some("guess-0123456789abcdef"), None, Some(0)),
                Err(Refusal::WrongToken)
            );
            assert_eq!(
                check_as(&mut g, Some(TOKEN), None, Some(0)).is_ok(),
                with_file
            );
        }
    }

    #[test]
    fn replacing_the_file_rotates_the_token() {
        let d = tempfile::tempdir().unwrap();
        let mut g = gate(d.path());
        let old = format!("Bearer {TOKEN}");
        assert_eq!(
            check(&mut g, &[("Authorization", &old)]),
            Ok("the admin token".into())
        );
        let new = "fedcba9876543210fedcba";
        let tmp = d.path().join("admin.token.new");
        std::fs::write(&tmp, new).unwrap();
        std::fs::rename(&tmp, d.path().join("admin.token")).unwrap();
        assert_eq!(
            check(&mut g, &[("Authorization", &old)]),
            Err(Refusal::WrongToken)
        );
        assert_eq!(
            check(&mut g, &[("Authorization", &format!("Bearer {new}"))]),
            Ok("the admin token".into())
        );
        // A file cut short (or gone) refuses rather than matching less.
        std::fs::write(d.path().join("admin.token"), "short").unwrap();
        assert_eq!(
            check(&mut g, &[("Authorization", "Bearer short")]),
            Err(Refusal::TokenFileUnusable)
        );
    }

    #[test]
    fn refusal_lines_are_rate_limited() {
        let mut l = LogLimit::default();
        let t0 = Instant::now();
        assert_eq!(l.admit(t0), Some(0));
        assert_eq!(l.admit(t0 + Duration::from_millis(10)), None);
        assert_eq!(l.admit(t0 + Duration::from_millis(999)), None);
        assert_eq!(l.admit(t0 + Duration::from_millis(1_000)), Some(2));
        assert_eq!(l.admit(t0 + Duration::from_millis(1_001)), None);
    }
}
