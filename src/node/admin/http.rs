//! The admin endpoint's HTTP/1.1 server, bounded in everything a peer can
//! make it hold before it has said a word that passes the gate: a fixed
//! pool of threads, a bounded queue of accepted connections (past it a
//! connection is answered 503 at once), a bounded request head and body,
//! and a deadline for the whole request. One request per connection
//! (`Connection: close`): the endpoint serves operators and scrapers, not
//! browsers, so keep-alive would only let an idle peer hold a thread.
//!
//! Parsing is `httparse`'s (hyper's parser) behind [`parse_head`], which
//! the `admin_http` fuzz target drives; what is done with a request is the
//! handler's.
//!
//! Given a [`ServerTls`], it serves HTTPS only: the handshake is done
//! within the request's deadline on the worker (rustls' blocking
//! `StreamOwned` over the socket, whose timeouts bound every read and
//! write), the verified client certificate's common name, if any, goes to
//! the handler with the request, and a peer that speaks plain HTTP to it
//! is answered, in plain HTTP, that the endpoint wants HTTPS.

use crate::node::admin::http_head::{
    parse_head, Head, HeadError, ADMIN_BODY_BYTES_MAX, ADMIN_HEAD_BYTES_MAX,
};
use crate::tls::ServerTls;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Threads serving requests, each one connection at a time.
pub(crate) const ADMIN_WORKERS: usize = 4;
/// Accepted connections waiting for a worker; past this a new one is
/// answered 503 and closed.
pub(crate) const ADMIN_QUEUED_CONNECTIONS_MAX: usize = 64;
/// Time a peer has to send its whole request, in ms.
pub(crate) const ADMIN_REQUEST_TIMEOUT_MS: u64 = 5_000;
/// Time a response (or a busy answer) may take to write, in ms.
const ADMIN_WRITE_TIMEOUT_MS: u64 = 5_000;
/// Pause after a failed accept, doubling while accepts keep failing.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// After refusing a request: how long, and how many bytes, its sender's
/// rest is read and dropped before the connection closes.
const DRAIN_MS: u64 = 200;
const DRAIN_BYTES_MAX: usize = 256 << 10;

/// One request, as the handler sees it: its head (the body is dropped).
#[derive(Debug)]
pub(crate) struct HttpRequest {
    /// Method, target and headers.
    pub(crate) head: Head,
    /// Who sent it.
    pub(crate) peer: Option<SocketAddr>,
    /// Over HTTPS, the common name of the client certificate the peer
    /// showed (verified against the client CA); `None` without one.
    pub(crate) client_cn: Option<String>,
}

/// The handler's answer.
#[derive(Debug)]
pub(crate) struct HttpResponse {
    /// The status code.
    pub(crate) status: u16,
    /// Headers beyond Content-Length and Connection.
    pub(crate) headers: Vec<(&'static str, String)>,
    /// The body (left out for a HEAD).
    pub(crate) body: String,
}

impl HttpResponse {
    /// A plain-text answer.
    pub(crate) fn text(status: u16, body: impl Into<String>) -> HttpResponse {
        HttpResponse {
            status,
            headers: vec![("Content-Type", "text/plain".into())],
            body: body.into(),
        }
    }
}

/// Requests refused before any handler saw them, per reason.
#[derive(Debug, Default)]
pub(crate) struct HttpRefusals {
    busy: AtomicU64,
    head_too_large: AtomicU64,
    body_too_large: AtomicU64,
    malformed: AtomicU64,
    timed_out: AtomicU64,
    panicked: AtomicU64,
    tls_failed: AtomicU64,
    not_https: AtomicU64,
}

impl HttpRefusals {
    /// Each reason's label and count.
    pub(crate) fn counts(&self) -> [(&'static str, u64); 8] {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        [
            ("busy", n(&self.busy)),
            ("head_too_large", n(&self.head_too_large)),
            ("body_too_large", n(&self.body_too_large)),
            ("malformed", n(&self.malformed)),
            ("timed_out", n(&self.timed_out)),
            ("handler_panicked", n(&self.panicked)),
            ("tls_failed", n(&self.tls_failed)),
            ("not_https", n(&self.not_https)),
        ]
    }
}

/// The handler: what each request gets.
pub(crate) type Handler = dyn Fn(&HttpRequest) -> HttpResponse + Send + Sync;

/// A running server; stops when dropped (requests being served finish).
pub(crate) struct HttpServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl HttpServer {
    /// Serves `handler` on `listener` with threads named `name`, over
    /// HTTPS with `tls` if given.
    pub(crate) fn start(
        listener: TcpListener,
        name: &str,
        handler: Arc<Handler>,
        refusals: Arc<HttpRefusals>,
        tls: Option<Arc<ServerTls>>,
    ) -> io::Result<HttpServer> {
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = crossbeam_channel::bounded::<TcpStream>(ADMIN_QUEUED_CONNECTIONS_MAX);
        let mut threads = Vec::new();
        for i in 0..ADMIN_WORKERS {
            let rx = rx.clone();
            let handler = Arc::clone(&handler);
            let refusals = Arc::clone(&refusals);
            let stop = Arc::clone(&stop);
            let tls = tls.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("{name}-{i}"))
                    .spawn(move || {
                        for stream in rx {
                            // Stopping: what still waits is closed unserved.
                            if stop.load(Ordering::Acquire) {
                                continue;
                            }
                            // A handler that panics loses its request, not
                            // the worker.
                            let served =
                                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                    serve(stream, tls.as_deref(), &*handler, &refusals)
                                }));
                            if served.is_err() {
                                refusals.panicked.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    })?,
            );
        }
        let accept_stop = Arc::clone(&stop);
        threads.push(
            std::thread::Builder::new()
                .name(name.to_string())
                .spawn(move || {
                    let mut backoff = ACCEPT_BACKOFF_MIN;
                    for stream in listener.incoming() {
                        if accept_stop.load(Ordering::Acquire) {
                            break;
                        }
                        let stream = match stream {
                            Ok(s) => {
                                backoff = ACCEPT_BACKOFF_MIN;
                                s
                            }
                            Err(_) => {
                                // Out of descriptors (EMFILE), say: they come
                                // back as connections close, and retrying at
                                // once would spin a core meanwhile.
                                std::thread::sleep(backoff);
                                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                                continue;
                            }
                        };
                        if let Err(e) = tx.try_send(stream) {
                            refusals.busy.fetch_add(1, Ordering::Relaxed);
                            // Over HTTPS too: a busy server does no
                            // handshakes, and a TLS client reads this
                            // as a failed one.
                            let mut s = Conn::Plain(e.into_inner());
                            let busy = HttpResponse::text(503, "busy: try again\n");
                            let by = Instant::now() + Duration::from_millis(100);
                            let _ = write_response(&mut s, &busy, false, by);
                        }
                    }
                    // Dropping `tx` ends the workers once the queue drains.
                })?,
        );
        Ok(HttpServer {
            addr,
            stop,
            threads,
        })
    }

    /// The address it listens on.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the accept; it sees the flag and ends.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// How reading a request ended, if not with a request.
enum Refused {
    HeadTooLarge,
    BodyTooLarge,
    Malformed(String),
    TimedOut,
    /// The peer went away, or the socket failed: nothing to answer.
    Gone,
}

/// An accepted connection: plain, or HTTPS past its handshake.
enum Conn {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ServerConnection, TcpStream>>),
}

impl Conn {
    /// The socket under it, whose timeouts bound its reads and writes.
    fn tcp(&self) -> &TcpStream {
        match self {
            Conn::Plain(s) => s,
            Conn::Tls(s) => &s.sock,
        }
    }

    /// Ends the connection: TLS's close_notify, then the TCP write side.
    fn finish(&mut self) {
        if let Conn::Tls(s) = self {
            s.conn.send_close_notify();
            let _ = s.flush();
        }
        let _ = self.tcp().shutdown(std::net::Shutdown::Write);
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.read(buf),
            Conn::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.write(buf),
            Conn::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush(),
            Conn::Tls(s) => s.flush(),
        }
    }
}

/// How a TLS handshake ended, if not with a connection.
enum HandshakeFailed {
    /// The peer spoke plain HTTP: answer it so, in plain HTTP.
    NotHttps(TcpStream),
    /// A TLS error (an alert was sent if rustls had one), a timeout, or
    /// the peer gone (counted where one is a refusal): nothing more to say.
    Failed,
}

/// Completes the server side of a TLS handshake on `stream` before
/// `deadline`.
fn handshake(
    stream: TcpStream,
    tls: &ServerTls,
    deadline: Instant,
    refusals: &HttpRefusals,
) -> Result<Conn, HandshakeFailed> {
    let timed_out = || {
        refusals.timed_out.fetch_add(1, Ordering::Relaxed);
        HandshakeFailed::Failed
    };
    // What an I/O error ends the handshake as; `None`: try again.
    let ended = |e: &io::Error| match e.kind() {
        io::ErrorKind::Interrupted => None,
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Some(timed_out()),
        io::ErrorKind::InvalidData => {
            refusals.tls_failed.fetch_add(1, Ordering::Relaxed);
            Some(HandshakeFailed::Failed)
        }
        _ => Some(HandshakeFailed::Failed),
    };
    let timeout = |s: &TcpStream| {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out());
        }
        s.set_read_timeout(Some(left))
            .and_then(|()| s.set_write_timeout(Some(left)))
            .map_err(|_| HandshakeFailed::Failed)
    };
    // A plain request starts with a method's letters, TLS with a record
    // type (22, a handshake): one byte tells them apart.
    let mut first = [0u8; 1];
    loop {
        timeout(&stream)?;
        match stream.peek(&mut first) {
            Ok(0) => return Err(HandshakeFailed::Failed),
            Ok(_) => break,
            Err(e) => {
                if let Some(end) = ended(&e) {
                    return Err(end);
                }
            }
        }
    }
    if !matches!(first[0], 0x15 | 0x16) {
        refusals.not_https.fetch_add(1, Ordering::Relaxed);
        return Err(HandshakeFailed::NotHttps(stream));
    }
    let Ok(conn) = tls.accept() else {
        refusals.tls_failed.fetch_add(1, Ordering::Relaxed);
        return Err(HandshakeFailed::Failed);
    };
    let mut s = rustls::StreamOwned::new(conn, stream);
    while s.conn.is_handshaking() {
        timeout(&s.sock)?;
        match s.conn.complete_io(&mut s.sock) {
            Ok((0, 0)) if s.conn.wants_read() => return Err(HandshakeFailed::Failed),
            Ok(_) => {}
            Err(e) => {
                if let Some(end) = ended(&e) {
                    return Err(end);
                }
            }
        }
    }
    Ok(Conn::Tls(Box::new(s)))
}

/// The common name of the verified client certificate `conn` was shown.
fn client_cn(conn: &Conn) -> Option<String> {
    let Conn::Tls(s) = conn else { return None };
    let leaf = s.conn.peer_certificates()?.first()?;
    crate::tls::subject::common_name(leaf)
}

/// Reads one request from `stream`, answers it and closes.
fn serve(stream: TcpStream, tls: Option<&ServerTls>, handler: &Handler, refusals: &HttpRefusals) {
    let peer = stream.peer_addr().ok();
    let deadline = Instant::now() + Duration::from_millis(ADMIN_REQUEST_TIMEOUT_MS);
    let mut stream = match tls {
        None => Conn::Plain(stream),
        Some(tls) => match handshake(stream, tls, deadline, refusals) {
            Ok(conn) => conn,
            Err(HandshakeFailed::NotHttps(s)) => {
                let mut plain = Conn::Plain(s);
                let addr = plain
                    .tcp()
                    .local_addr()
                    .map_or("ADDR".into(), |a| a.to_string());
                let answer = HttpResponse::text(
                    400,
                    format!("this admin endpoint serves HTTPS only (node.admin_tls = true): use https://{addr}/ with the cluster's CA (curl --cacert, quire member --ca)\n"),
                );
                let write_by = Instant::now() + Duration::from_millis(ADMIN_WRITE_TIMEOUT_MS);
                let _ = write_response(&mut plain, &answer, false, write_by);
                plain.finish();
                drain(&mut plain);
                return;
            }
            Err(HandshakeFailed::Failed) => return,
        },
    };
    let client_cn = client_cn(&stream);
    let (answer, head_only, refused) = match read_request(&mut stream, deadline, peer, client_cn) {
        Ok(req) => (handler(&req), req.head.method == "HEAD", false),
        Err(refused) => {
            let (counter, answer) = match refused {
                Refused::HeadTooLarge => (
                    &refusals.head_too_large,
                    HttpResponse::text(
                        431,
                        format!("request head over {ADMIN_HEAD_BYTES_MAX} bytes\n"),
                    ),
                ),
                Refused::BodyTooLarge => (
                    &refusals.body_too_large,
                    HttpResponse::text(
                        413,
                        format!("request body over {ADMIN_BODY_BYTES_MAX} bytes\n"),
                    ),
                ),
                Refused::Malformed(why) => (
                    &refusals.malformed,
                    HttpResponse::text(400, format!("malformed request: {why}\n")),
                ),
                Refused::TimedOut => (
                    &refusals.timed_out,
                    HttpResponse::text(
                        408,
                        format!("the request took over {ADMIN_REQUEST_TIMEOUT_MS} ms\n"),
                    ),
                ),
                Refused::Gone => return,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            (answer, false, true)
        }
    };
    let write_by = Instant::now() + Duration::from_millis(ADMIN_WRITE_TIMEOUT_MS);
    let _ = write_response(&mut stream, &answer, head_only, write_by);
    stream.finish();
    if refused {
        // Closing with unread bytes would reset the connection, and a
        // reset can destroy the answer before the peer reads it.
        drain(&mut stream);
    }
}

/// Reads and drops what the peer still sends, briefly and boundedly.
fn drain(stream: &mut Conn) {
    let deadline = Instant::now() + Duration::from_millis(DRAIN_MS);
    let mut scratch = [0u8; 4096];
    let mut left = DRAIN_BYTES_MAX;
    while left > 0 {
        match read_before(stream, &mut scratch, deadline) {
            Ok(n) => left = left.saturating_sub(n),
            Err(_) => return,
        }
    }
}

/// One request whose head and body arrived within their bounds and
/// `deadline`; the body is read and dropped.
fn read_request(
    stream: &mut Conn,
    deadline: Instant,
    peer: Option<SocketAddr>,
    client_cn: Option<String>,
) -> Result<HttpRequest, Refused> {
    let mut buf = vec![0u8; ADMIN_HEAD_BYTES_MAX];
    let mut got = 0;
    // A full buffer is always parsed, and `parse_head` refuses it then: the
    // loop never reads into an empty slice.
    let head = loop {
        let n = read_before(stream, &mut buf[got..], deadline)?;
        // Parse only once the blank line that ends a head may be in: a
        // head sent a byte at a time is not parsed once per byte.
        let seen_from = got.saturating_sub(3);
        got += n;
        if got < buf.len() && !buf[seen_from..got].windows(4).any(|w| w == b"\r\n\r\n") {
            continue;
        }
        match parse_head(&buf[..got]) {
            Ok(None) => continue,
            Ok(Some(head)) => break head,
            Err(HeadError::TooLarge) => return Err(Refused::HeadTooLarge),
            Err(HeadError::BodyTooLarge) => return Err(Refused::BodyTooLarge),
            Err(HeadError::Malformed(why)) => return Err(Refused::Malformed(why)),
        }
    };
    let mut left = head
        .body_bytes
        .saturating_sub((got - head.head_bytes) as u64);
    while left > 0 {
        let want = buf.len().min(left as usize);
        let n = read_before(stream, &mut buf[..want], deadline)?;
        left -= n as u64;
    }
    Ok(HttpRequest {
        head,
        peer,
        client_cn,
    })
}

/// One read of at least a byte before `deadline`.
fn read_before(stream: &mut Conn, buf: &mut [u8], deadline: Instant) -> Result<usize, Refused> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Refused::TimedOut);
        }
        stream
            .tcp()
            .set_read_timeout(Some(left))
            .map_err(|_| Refused::Gone)?;
        match stream.read(buf) {
            Ok(0) => return Err(Refused::Gone),
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(Refused::TimedOut)
            }
            Err(_) => return Err(Refused::Gone),
        }
    }
}

/// The reason phrase of the codes this server and its handler use.
fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Content Too Large",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "",
    }
}

/// Writes `r` whole before `deadline` (a peer that reads slowly holds a
/// worker no longer than that), or gives up.
fn write_response(
    stream: &mut Conn,
    r: &HttpResponse,
    head_only: bool,
    deadline: Instant,
) -> io::Result<()> {
    let mut out = format!("HTTP/1.1 {} {}\r\n", r.status, reason(r.status));
    for (name, value) in &r.headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        r.body.len()
    ));
    if !head_only {
        out.push_str(&r.body);
    }
    let mut left = out.as_bytes();
    while !left.is_empty() {
        let time = deadline.saturating_duration_since(Instant::now());
        if time.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        stream.tcp().set_write_timeout(Some(time))?;
        match stream.write(left) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => left = &left[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    // TLS holds what it has not sent yet; plain TCP holds nothing.
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> (HttpServer, Arc<HttpRefusals>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let refusals = Arc::new(HttpRefusals::default());
        let handler: Arc<Handler> = Arc::new(|r: &HttpRequest| {
            HttpResponse::text(200, format!("{} {}\n", r.head.method, r.head.url))
        });
        let s =
            HttpServer::start(listener, "test-http", handler, Arc::clone(&refusals), None).unwrap();
        (s, refusals)
    }

    fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        // A server that answers before reading everything may reset.
        let _ = s.write_all(request);
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    /// A request, again while it is answered busy (the queue drains as
    /// the workers see their idle peers gone).
    fn common_retry(addr: SocketAddr) -> String {
        let until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < until {
            let out = exchange(addr, b"GET / HTTP/1.1\r\n\r\n");
            if !out.starts_with("HTTP/1.1 503 ") {
                return out;
            }
        }
        panic!("still busy after 30 s");
    }

    fn count(refusals: &HttpRefusals, reason: &str) -> u64 {
        refusals
            .counts()
            .iter()
            .find(|(r, _)| *r == reason)
            .unwrap()
            .1
    }

    #[test]
    fn a_request_is_answered_and_the_connection_closed() {
        let (s, _) = server();
        let out = exchange(s.addr(), b"GET /status?x=1 HTTP/1.1\r\nHost: a\r\n\r\n");
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(out.contains("Connection: close\r\n"), "{out}");
        assert!(out.ends_with("\r\n\r\nGET /status?x=1\n"), "{out}");
        let head = exchange(s.addr(), b"HEAD /status HTTP/1.1\r\n\r\n");
        assert!(head.ends_with("\r\n\r\n"), "no body for a HEAD: {head}");
    }

    #[test]
    fn a_head_past_its_bound_is_refused_not_buffered() {
        let (s, refusals) = server();
        let mut req = b"GET / HTTP/1.1\r\nX-A: ".to_vec();
        req.extend(std::iter::repeat_n(b'a', 4 * ADMIN_HEAD_BYTES_MAX));
        let out = exchange(s.addr(), &req);
        assert!(out.starts_with("HTTP/1.1 431 "), "{out}");
        assert_eq!(count(&refusals, "head_too_large"), 1);
    }

    #[test]
    fn bodies_are_bounded_and_garbage_is_refused() {
        let (s, refusals) = server();
        let big = format!(
            "POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            ADMIN_BODY_BYTES_MAX + 1
        );
        assert!(exchange(s.addr(), big.as_bytes()).starts_with("HTTP/1.1 413 "));
        let small = b"POST /m HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc";
        assert!(exchange(s.addr(), small).ends_with("POST /m\n"));
        let plus = b"POST / HTTP/1.1\r\nContent-Length: +3\r\n\r\nabc";
        assert!(exchange(s.addr(), plus).starts_with("HTTP/1.1 400 "));
        let two = b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd";
        assert!(exchange(s.addr(), two).starts_with("HTTP/1.1 400 "));
        let chunked = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
        assert!(exchange(s.addr(), chunked).starts_with("HTTP/1.1 400 "));
        assert!(exchange(s.addr(), b"\x00\x01garbage\r\n\r\n").starts_with("HTTP/1.1 400 "));
        assert_eq!(count(&refusals, "body_too_large"), 1);
        assert_eq!(count(&refusals, "malformed"), 4);
    }

    #[test]
    fn idle_connections_hold_no_more_than_the_pool_and_the_queue() {
        let (s, refusals) = server();
        // Every worker holds one idle connection and the queue fills
        // (whenever the workers take theirs, the extra ones refill it), so
        // the next connection is answered 503 at once while those wait.
        let idle: Vec<TcpStream> = (0..ADMIN_WORKERS * 2 + ADMIN_QUEUED_CONNECTIONS_MAX)
            .map(|_| TcpStream::connect(s.addr()).unwrap())
            .collect();
        let out = exchange(s.addr(), b"GET / HTTP/1.1\r\n\r\n");
        assert!(
            out.starts_with("HTTP/1.1 503 "),
            "past the pool and the queue: {out}"
        );
        // The probe, and the extra idle ones no worker had taken yet.
        let busy = count(&refusals, "busy");
        assert!((1..=2 * ADMIN_WORKERS as u64 + 1).contains(&busy), "{busy}");
        drop(idle);
        // Once they are gone, requests are served again.
        let out = common_retry(s.addr());
        assert!(out.starts_with("HTTP/1.1 200 "), "{out}");
    }
}
