//! A rustls connection driven by hand over a non-blocking socket: the
//! caller reads and writes plaintext as it would a socket, and says when
//! the socket is readable or writable; the channel moves the ciphertext.
//!
//! Ciphertext is read from the socket in one large read into the
//! channel's inbox and fed to rustls from there (rustls itself would read
//! 4 KiB at a time: four times the system calls at full rate); the inbox
//! is bounded ([`INBOX_BYTES`]) and refilled only once rustls has taken
//! all of it.

use std::io::{self, ErrorKind, Read, Write};

/// Ciphertext bytes one read of the socket takes at most.
pub(crate) const INBOX_BYTES: usize = 64 << 10;

/// One TLS connection, client or server end.
pub struct TlsChannel {
    conn: rustls::Connection,
    /// Ciphertext read and not yet taken by rustls: `inbox[at..]`.
    inbox: Vec<u8>,
    at: usize,
    /// The socket has said end of stream (and rustls has been told).
    eof: bool,
}

impl TlsChannel {
    /// A channel over `conn` (a fresh client or server connection).
    pub fn new(conn: impl Into<rustls::Connection>) -> TlsChannel {
        TlsChannel {
            conn: conn.into(),
            inbox: Vec::new(),
            at: 0,
            eof: false,
        }
    }

    /// Reads plaintext into `out`, like a non-blocking socket: `Ok(0)` is
    /// the end of the stream (the peer's close_notify or its TCP FIN),
    /// `WouldBlock` that nothing is ready. A TLS failure (a bad
    /// certificate, a corrupt record) is `InvalidData` carrying rustls'
    /// error; the alert for the peer is then queued: [`send`](Self::send)
    /// it before closing.
    pub fn read(&mut self, sock: &mut impl Read, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Err(ErrorKind::WouldBlock.into());
        }
        loop {
            match self.conn.reader().read(out) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                // The TCP stream ended without a close_notify: our frames
                // carry their own lengths, so a cut is seen there.
                Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(e),
            }
            if self.eof {
                return Ok(0);
            }
            if self.at == self.inbox.len() {
                self.inbox.resize(INBOX_BYTES, 0);
                self.at = 0;
                let n = match sock.read(&mut self.inbox) {
                    Ok(n) => n,
                    Err(e) => {
                        self.inbox.clear();
                        return Err(e);
                    }
                };
                self.inbox.truncate(n);
                if n == 0 {
                    self.eof = true;
                }
            }
            // Nothing decrypted waits (the reader said so), so rustls'
            // plaintext buffer has room for what this record brings.
            let mut rest = &self.inbox[self.at..];
            let took = self.conn.read_tls(&mut rest)?;
            self.at += took;
            self.conn
                .process_new_packets()
                .map_err(|e| io::Error::new(ErrorKind::InvalidData, e))?;
        }
    }

    /// Takes as much of `plain` as rustls buffers now (64 KiB of records
    /// at most); the records go out with [`send`](Self::send).
    pub fn write(&mut self, plain: &[u8]) -> io::Result<usize> {
        self.conn.writer().write(plain)
    }

    /// True while records (handshake, data or an alert) wait to be sent.
    pub fn wants_write(&self) -> bool {
        self.conn.wants_write()
    }

    /// True until the handshake is done.
    pub fn is_handshaking(&self) -> bool {
        self.conn.is_handshaking()
    }

    /// Writes waiting records to `sock` until it is full (`WouldBlock`)
    /// or they are all out.
    pub fn send(&mut self, sock: &mut impl Write) -> io::Result<()> {
        while self.conn.wants_write() {
            match self.conn.write_tls(sock) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Moves `out[*out_at..]` through the channel onto `sock` until both
    /// are empty, the socket is full (`WouldBlock`) or rustls takes no
    /// more (mid-handshake): rustls takes 64 KiB of records at a time, so
    /// this may take several rounds.
    pub fn write_from(
        &mut self,
        sock: &mut impl Write,
        out: &[u8],
        out_at: &mut usize,
    ) -> io::Result<()> {
        loop {
            let took = if *out_at < out.len() {
                self.write(&out[*out_at..])?
            } else {
                0
            };
            *out_at += took;
            self.send(sock)?;
            // Done, or rustls takes no more for now: during the handshake
            // it holds up to 64 KiB of plaintext until the keys are there.
            if *out_at == out.len() || took == 0 {
                return Ok(());
            }
        }
    }

    /// Queues the close_notify alert (then [`send`](Self::send) it).
    pub fn close(&mut self) {
        self.conn.send_close_notify();
    }

    /// The peer's certificate chain, leaf first, once the handshake has
    /// got that far (a client certificate under mTLS).
    pub fn peer_certificates(&self) -> Option<&[rustls::pki_types::CertificateDer<'static>]> {
        self.conn.peer_certificates()
    }
}

/// The TLS failure behind `e` (a handshake that failed, an alert from
/// the peer, a corrupt record), in rustls' words; `None` for any other
/// I/O error.
pub fn tls_failure(e: &io::Error) -> Option<String> {
    let t = e.get_ref()?.downcast_ref::<rustls::Error>()?;
    Some(match t {
        // What a node serving plain TCP answers a ClientHello with.
        rustls::Error::InvalidMessage(_) => {
            format!("TLS: {t} (does the node serve plain TCP, client.plain = true? then leave out --ca)")
        }
        _ => format!("TLS: {t}"),
    })
}

/// Whether `bytes`, the first a peer sent, look like a TLS record (an
/// alert or a handshake, version 3.x) rather than a quire frame: a
/// plain client's way to tell that the node serves TLS.
pub fn looks_like_tls(bytes: &[u8]) -> bool {
    matches!(bytes, [0x15 | 0x16, 0x03, ..])
}
