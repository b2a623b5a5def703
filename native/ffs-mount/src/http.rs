//! Plain HTTP/1.1 GETs of presigned URLs from MinIO, on kept-alive
//! connections: what the daemon's own fetches speak on the wire (not the
//! agent protocol). What answers is bounded before anything is allocated
//! for it: it may not be MinIO (a port taken while it was down).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
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
const HASH_PIECE: usize = 128 << 10;

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

/// A connection to `host`. Its packets carry no mark: the kernel counts the
/// GETs on it as a reader's.
pub(crate) fn connect(host: &str) -> io::Result<TcpStream> {
    let addr = host
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::other(format!("{host} resolves to no address")))?;
    let s = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)?;
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
    let mut hash = (status == wanted && range.is_none()).then(Xxh3::new);
    let body = read_body(conn, len, hash.as_mut())?;
    if status != wanted {
        let said = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
        return Err(bad(format!("HTTP {status}: {said}")));
    }
    let xxh3 = hash.map(|h| h.digest());
    Ok(Answer { body, xxh3, keep })
}

/// `len` bytes of a body: what the reader has buffered, then the rest
/// straight from the socket into the vector's spare capacity (not zeroed
/// first, not copied through the reader's buffer), hashed a piece at a time
/// while the piece is still in the CPU's cache.
fn read_body(
    conn: &mut BufReader<TcpStream>,
    len: usize,
    mut hash: Option<&mut Xxh3>,
) -> io::Result<Vec<u8>> {
    let mut body = Vec::with_capacity(len);
    let n = conn.buffer().len().min(len);
    body.extend_from_slice(&conn.buffer()[..n]);
    conn.consume(n);
    if let Some(h) = hash.as_mut() {
        h.update(&body);
    }
    let fd = conn.get_ref().as_raw_fd();
    while body.len() < len {
        let from = body.len();
        let want = (len - from).min(HASH_PIECE);
        let spare = &mut body.spare_capacity_mut()[..want];
        // SAFETY: recv writes at most `want` bytes into the spare capacity,
        // and the length grows by what it wrote alone.
        let got = unsafe { libc::recv(fd, spare.as_mut_ptr().cast(), want, libc::MSG_WAITALL) };
        match got {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n if n < 0 => match io::Error::last_os_error() {
                e if e.kind() == io::ErrorKind::Interrupted => continue,
                // SO_RCVTIMEO ran out
                e if e.kind() == io::ErrorKind::WouldBlock => {
                    return Err(io::ErrorKind::TimedOut.into())
                }
                e => return Err(e),
            },
            // SAFETY: the bytes up to from + n were written by recv.
            n => unsafe { body.set_len(from + n as usize) },
        }
        if let Some(h) = hash.as_mut() {
            h.update(&body[from..]);
        }
    }
    Ok(body)
}
