//! `quire member` and `quire leader`: one POST to the admin endpoint of
//! a group's leader (HTTPS with `--ca`), with the admin token or an admin
//! principal's certificate.

use super::cli::TlsArgs;
use std::net::SocketAddr;
use std::time::Duration;

/// What `quire member` asks for.
pub(crate) struct MemberChange<'a> {
    pub(crate) group: u32,
    pub(crate) change: &'a str,
    pub(crate) node: u64,
    pub(crate) force: bool,
}

/// A byte stream both ways: TCP, or TLS over it.
trait Duplex: std::io::Read + std::io::Write {}
impl<T: std::io::Read + std::io::Write> Duplex for T {}

/// `quire member`: the leader's answer once the change applied, or why
/// not.
pub(crate) fn member(
    admin: SocketAddr,
    m: &MemberChange,
    token_file: Option<&std::path::Path>,
    tls: &TlsArgs,
) -> Result<String, String> {
    let force = if m.force { "&force=1" } else { "" };
    let (group, change, node) = (m.group, m.change, m.node);
    let path = format!("/membership?group={group}&change={change}&node={node}{force}");
    admin_post(admin, &path, token_file, tls)
}

/// One POST of `path` (with its query) to the admin endpoint (over HTTPS
/// with `tls`), with the admin token in `token_file` or as the principal
/// of `tls`'s certificate: the body of a 200 answer, or the status and
/// why.
pub(crate) fn admin_post(
    admin: SocketAddr,
    path: &str,
    token_file: Option<&std::path::Path>,
    tls: &TlsArgs,
) -> Result<String, String> {
    use std::io::{Read, Write};
    let auth = match token_file {
        None => String::new(),
        Some(f) => {
            let token =
                quire::io::private::read_capped(f, quire::io::private::SECRET_FILE_BYTES_MAX)
                    .map_err(|e| format!("{}: {e}", f.display()))?;
            let token = String::from_utf8(token.trim_ascii_end().to_vec())
                .map_err(|_| format!("{}: the admin token is not text", f.display()))?;
            format!("Authorization: Bearer {token}\r\n")
        }
    };
    let client_tls = tls.load()?;
    let tcp = std::net::TcpStream::connect_timeout(&admin, Duration::from_secs(5))
        .map_err(|e| format!("{admin}: {e}"))?;
    tcp.set_read_timeout(Some(Duration::from_secs(30)))
        .and_then(|()| tcp.set_write_timeout(Some(Duration::from_secs(30))))
        .map_err(|e| e.to_string())?;
    let mut s: Box<dyn Duplex> = match &client_tls {
        None => Box::new(tcp),
        Some(t) => {
            let conn = t.connect(admin).map_err(|e| format!("{admin}: TLS: {e}"))?;
            Box::new(rustls::StreamOwned::new(conn, tcp))
        }
    };
    let io_failed = |e: std::io::Error| {
        let rustls_error = e.get_ref().and_then(|r| r.downcast_ref::<rustls::Error>());
        if matches!(rustls_error, Some(rustls::Error::InvalidMessage(_))) {
            // What a plain HTTP endpoint answers a ClientHello with.
            return format!("{admin}: TLS: the endpoint does not speak it (node.admin_tls is off there?): leave out --ca");
        }
        let why = quire::tls::tls_failure(&e).unwrap_or_else(|| e.to_string());
        format!("{admin}: {why}")
    };
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: quire\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .and_then(|()| s.flush())
    .map_err(io_failed)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(io_failed)?;
    let text = String::from_utf8_lossy(&raw);
    let code = text.split_whitespace().nth(1).unwrap_or("?");
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b).trim();
    if code == "200" {
        Ok(body.to_string())
    } else {
        Err(format!("{admin}: {code}: {body}"))
    }
}
