//! Plain HTTP/1.1 GETs of presigned URLs from MinIO, on kept-alive
//! connections: what the daemon's own fetches speak on the wire (not the
//! agent protocol). What answers is bounded before anything is allocated
//! for it: it may not be MinIO (a port taken while it was down).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;
use xxhash_rust::xxh3::Xxh3;

pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(20);
/// Bounds on what a response may make the daemon read before its body.
pub(crate) const HEADER_LINE_MAX: u64 = 8 << 10;
pub(crate) const HEADERS_MAX: usize = 100;
/// An error's body is read (for the log) only up to this size.
pub(crate) const ERROR_BODY_MAX: usize = 64 << 10;
/// A whole body is hashed as it arrives, this much at a time: each piece is
/// hashed while the socket's copy of it is still in the CPU's cache (hashing
/// a 4 MiB chunk after the fact read it back from memory: a fifth of the
/// daemon's CPU on a cold read).
const HASH_PIECE: u64 = 128 << 10;

/// What a GET answered: the body, its xxh3 (whole bodies only), and whether
/// the connection may be reused.
pub(crate) struct Answer {
    pub(crate) body: Vec<u8>,
    pub(crate) xxh3: Option<u64>,
    pub(crate) keep: bool,
}

/// A presigned GET: where to connect, and the request target.
pub(crate) struct Url {
    pub(crate) host: String, // host:port, also the Host header the signature covers
    pub(crate) target: String,
}

impl Url {
    pub(crate) fn parse(u: &str) -> Option<Url> {
        let rest = u.strip_prefix("http://")?; // https stays with the agent
        let (host, path) = rest.split_at(rest.find('/')?);
        Some(Url {
            host: host.to_string(),
            target: path.to_string(),
        })
    }

    /// The URL without its query (the signature), for messages.
    pub(crate) fn shown(&self) -> String {
        let path = self.target.split('?').next().unwrap_or_default();
        format!("{}{}", self.host, path)
    }
}

/// A connection to `host`; with `mark` > 0 its packets carry that SO_MARK
/// (set before the first request: the kernel's counting reads requests' marks).
pub(crate) fn connect(host: &str, mark: u32) -> io::Result<TcpStream> {
    let addr = host
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::other(format!("{host} resolves to no address")))?;
    let s = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)?;
    if mark > 0 {
        let v = mark as libc::c_int;
        // SAFETY: a valid socket fd and a c_int of the size given.
        let rc = unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&s),
                libc::SOL_SOCKET,
                libc::SO_MARK,
                &v as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// GET `u` on `conn`: the body of a 200 (a 206 if `range`). Another status
/// is InvalidData (the server answered). The signature covers the host
/// alone, so a Range may be added.
pub(crate) fn exchange(
    conn: &mut BufReader<TcpStream>,
    u: &Url,
    range: Option<(u64, u64)>,
    expect: u64,
) -> io::Result<Answer> {
    let extra = range.map_or(String::new(), |(a, b)| {
        format!("Range: bytes={a}-{}\r\n", b - 1)
    });
    let req = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\n{extra}\r\n",
        u.target, u.host
    );
    conn.get_mut().write_all(req.as_bytes())?;
    let bad = |m: String| io::Error::new(io::ErrorKind::InvalidData, m);
    // what answers may not be MinIO (a port taken while it was down): lines and
    // lengths are bounded before anything is allocated for them
    let mut line = String::new();
    let mut next_line = |line: &mut String| -> io::Result<()> {
        line.clear();
        match conn.by_ref().take(HEADER_LINE_MAX).read_line(line)? {
            0 => Err(io::ErrorKind::UnexpectedEof.into()),
            _ if !line.ends_with('\n') => {
                Err(bad(format!("a header line over {HEADER_LINE_MAX} bytes")))
            }
            _ => Ok(()),
        }
    };
    next_line(&mut line)?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not an HTTP response"))?;
    let (mut len, mut keep, mut chunked) = (None, true, false);
    for n in 0.. {
        if n == HEADERS_MAX {
            return Err(bad(format!("over {HEADERS_MAX} header lines")));
        }
        next_line(&mut line)?;
        let h = line.trim_end();
        if h.is_empty() {
            break;
        }
        let Some((name, value)) = h.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match name.to_ascii_lowercase().as_str() {
            "content-length" => len = value.parse::<usize>().ok(),
            "connection" => keep = !value.eq_ignore_ascii_case("close"),
            "transfer-encoding" => chunked = !value.eq_ignore_ascii_case("identity"),
            _ => {}
        }
    }
    let len = match (len, chunked) {
        (Some(n), false) => n,
        _ => return Err(bad(format!("HTTP {status} without a plain Content-Length"))),
    };
    let wanted = if range.is_some() { 206 } else { 200 };
    if status == wanted && len as u64 != expect {
        return Err(bad(format!(
            "HTTP {status} of {len} bytes, {expect} expected"
        )));
    }
    if status != wanted && len > ERROR_BODY_MAX {
        return Err(bad(format!("HTTP {status} with a body of {len} bytes")));
    }
    // into spare capacity: the body is not zeroed first
    let mut body = Vec::with_capacity(len);
    let mut hash = (status == wanted && range.is_none()).then(Xxh3::new);
    let mut rest = conn.by_ref().take(len as u64);
    loop {
        let from = body.len();
        if rest.by_ref().take(HASH_PIECE).read_to_end(&mut body)? == 0 {
            break;
        }
        if let Some(h) = hash.as_mut() {
            h.update(&body[from..]);
        }
    }
    if body.len() < len {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    if status != wanted {
        let said = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
        return Err(bad(format!("HTTP {status}: {said}")));
    }
    let xxh3 = hash.map(|h| h.digest());
    Ok(Answer { body, xxh3, keep })
}
