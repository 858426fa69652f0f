//! A request head of the admin endpoint, parsed whole and within its
//! bounds by `httparse` (hyper's parser): the first thing the endpoint
//! does with a peer's bytes, and what the `admin_http` fuzz target
//! drives. Reading the socket, TLS and answering are `http`'s.

/// Bytes of a request's head (request line and headers).
pub const ADMIN_HEAD_BYTES_MAX: usize = 16 << 10;
/// Headers in a request's head.
pub const ADMIN_HEADERS_MAX: usize = 64;
/// Bytes of a request's body (read and dropped: no route takes one).
pub const ADMIN_BODY_BYTES_MAX: u64 = 64 << 10;

/// A request head, parsed whole.
#[derive(Debug, PartialEq, Eq)]
pub struct Head {
    /// `GET`, `HEAD`, `POST`, ...
    pub method: String,
    /// The request target: path and query.
    pub url: String,
    /// Each header's name and value (values that are not UTF-8 are lossy).
    pub headers: Vec<(String, String)>,
    /// Bytes of the head, up to and with its blank line.
    pub head_bytes: usize,
    /// Bytes of the body that follows (its `Content-Length`).
    pub body_bytes: u64,
}

/// Why a head is refused.
#[derive(Debug, PartialEq, Eq)]
pub enum HeadError {
    /// Its head does not end within `ADMIN_HEAD_BYTES_MAX` bytes.
    TooLarge,
    /// Its `Content-Length` passes `ADMIN_BODY_BYTES_MAX`.
    BodyTooLarge,
    /// Not HTTP/1.x as this server takes it, and why.
    Malformed(String),
}

/// The head at the start of `bytes` (what a peer sent so far): `None`
/// while it may still come whole, within the bounds.
pub fn parse_head(bytes: &[u8]) -> Result<Option<Head>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; ADMIN_HEADERS_MAX];
    let mut req = httparse::Request::new(&mut headers);
    let head_bytes = match req.parse(bytes) {
        Ok(httparse::Status::Partial) if bytes.len() >= ADMIN_HEAD_BYTES_MAX => {
            return Err(HeadError::TooLarge)
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Ok(httparse::Status::Complete(n)) if n > ADMIN_HEAD_BYTES_MAX => {
            return Err(HeadError::TooLarge)
        }
        Ok(httparse::Status::Complete(n)) => n,
        Err(httparse::Error::TooManyHeaders) => {
            return Err(HeadError::Malformed(format!(
                "over {ADMIN_HEADERS_MAX} headers"
            )))
        }
        Err(e) => return Err(HeadError::Malformed(e.to_string())),
    };
    let method = req.method.unwrap_or_default().to_string();
    let url = req.path.unwrap_or_default().to_string();
    let headers: Vec<(String, String)> = req
        .headers
        .iter()
        .map(|h| {
            let value = String::from_utf8_lossy(h.value).into_owned();
            (h.name.to_string(), value)
        })
        .collect();
    let values = |name: &str| -> Vec<&str> {
        headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim())
            .collect()
    };
    if !values("Transfer-Encoding").is_empty() {
        return Err(HeadError::Malformed(
            "Transfer-Encoding is not taken: send Content-Length".into(),
        ));
    }
    let lengths = values("Content-Length");
    let body_bytes: u64 = match lengths.first() {
        None => 0,
        Some(v) if lengths.iter().any(|o| o != v) => {
            return Err(HeadError::Malformed(format!(
                "Content-Length given as {lengths:?}"
            )))
        }
        Some(v) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => {
            v.parse().map_err(|_| HeadError::BodyTooLarge)?
        }
        Some(v) => return Err(HeadError::Malformed(format!("Content-Length {v:?}"))),
    };
    if body_bytes > ADMIN_BODY_BYTES_MAX {
        return Err(HeadError::BodyTooLarge);
    }
    Ok(Some(Head {
        method,
        url,
        headers,
        head_bytes,
        body_bytes,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_parses_once_whole_and_within_its_bounds() {
        assert_eq!(parse_head(b"GET /status HTTP/1.1\r\nHost: a"), Ok(None));
        let head = parse_head(b"POST /m?x HTTP/1.1\r\nContent-Length: 2\r\n\r\nab")
            .unwrap()
            .unwrap();
        assert_eq!((head.method.as_str(), head.url.as_str()), ("POST", "/m?x"));
        assert_eq!((head.head_bytes, head.body_bytes), (41, 2));
        let many: String = (0..=ADMIN_HEADERS_MAX)
            .map(|i| format!("H{i}: v\r\n"))
            .collect();
        let many = format!("GET / HTTP/1.1\r\n{many}\r\n");
        assert!(matches!(
            parse_head(many.as_bytes()),
            Err(HeadError::Malformed(_))
        ));
        assert!(
            parse_head(&[b'a'; ADMIN_HEAD_BYTES_MAX]).is_err(),
            "no head"
        );
        let mut unended = b"GET / HTTP/1.1\r\nX: ".to_vec();
        unended.resize(ADMIN_HEAD_BYTES_MAX, b'a');
        assert_eq!(parse_head(&unended), Err(HeadError::TooLarge));
        let huge = b"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n";
        assert_eq!(parse_head(huge), Err(HeadError::BodyTooLarge));
    }

    /// The fuzz target's properties over seeded heads built from HTTP's
    /// own pieces, cut anywhere (the fuzz target needs a nightly tool).
    #[test]
    fn random_heads_keep_the_fuzz_targets_properties() {
        use rand::{Rng, SeedableRng};
        let pieces: [&[u8]; 14] = [
            b"GET ",
            b"POST ",
            b"/status",
            b"?a=1",
            b" HTTP/1.1",
            b"\r\n",
            b"\r\n\r\n",
            b"Content-Length: ",
            b"12",
            b"+3",
            b"Transfer-Encoding: x",
            b"Host: h",
            b"\x00",
            b": ",
        ];
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let mut taken = 0;
        for _ in 0..20_000 {
            let mut data = Vec::new();
            if rng.gen_bool(0.5) {
                data.extend_from_slice(b"POST /membership?group=0 HTTP/1.1\r\n");
            }
            for _ in 0..rng.gen_range(0..24) {
                data.extend_from_slice(pieces[rng.gen_range(0..pieces.len())]);
            }
            data.truncate(rng.gen_range(0..=data.len()));
            match parse_head(&data) {
                Ok(Some(head)) => {
                    assert!(head.head_bytes <= data.len());
                    assert!(head.body_bytes <= ADMIN_BODY_BYTES_MAX);
                    let again = parse_head(&data[..head.head_bytes]).unwrap();
                    assert_eq!(again.as_ref(), Some(&head), "{data:?}");
                    taken += 1;
                }
                Ok(None) => assert!(data.len() < ADMIN_HEAD_BYTES_MAX),
                Err(_) => {}
            }
        }
        assert!(
            taken > 100,
            "only {taken} heads were taken: the cases miss them"
        );
    }
}
