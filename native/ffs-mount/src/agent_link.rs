//! AgentLink: the daemon's request/reply plumbing over the agent socket (the agent is fasterfs/read/mount_agent.py).
//!
//! FUSE threads call `AgentLink::call`, which registers a one-shot channel under a
//! fresh id and blocks on it; the single reader thread (see inbound.rs) hands
//! each reply to its waiter by id, so replies may arrive in any order.
//! A call may carry a hook that the reader thread runs on the reply first,
//! so what the reply declares takes effect at its place in the stream.
//! Trees and deltas are applied on another thread, behind the reader: a
//! reply that must see the trees the agent sent before it (a refresh, an
//! error such as an open's ESTALE) waits until those are applied.

use std::collections::HashMap;
use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Condvar, Mutex};
use std::time::Duration;

use serde::Serialize;

use crate::wire::{self, Request, Sent};

/// A reply, typed (a `Request`'s `Reply`), and the raw bytes that followed
/// its line (read replies only).
pub struct Reply<R> {
    pub msg: R,
    pub data: Vec<u8>,
}

/// Run by the reader thread on a reply before its waiter sees it.
pub type Hook<R> = Box<dyn FnOnce(&R) + Send>;

/// What the reader thread hands a waiter: the reply's line, parsed into the
/// waiter's type (with its hook run) by `deliver`, the bytes after it, and
/// how many messages the reader had handed to the applier before it.
type Waiter = Box<dyn FnOnce(&[u8], Vec<u8>, u64) + Send>;

struct Pending {
    waiters: HashMap<u64, Waiter>,
    closed: bool,
}

pub struct AgentLink {
    writer: Mutex<UnixStream>,
    pending: Mutex<Pending>,
    next_id: AtomicU64,
    /// How long a call waits for its reply: then EIO, said in the log.
    timeout: Duration,
    /// Calls that waited that long.
    pub timeouts: AtomicU64,
    /// How many messages handed to the applier it has finished, in order.
    applied: Mutex<u64>,
    applied_cv: Condvar,
}

impl AgentLink {
    pub fn new(writer: UnixStream, timeout: Duration) -> AgentLink {
        AgentLink {
            writer: Mutex::new(writer),
            pending: Mutex::new(Pending {
                waiters: HashMap::new(),
                closed: false,
            }),
            next_id: AtomicU64::new(1),
            timeout,
            timeouts: AtomicU64::new(0),
            applied: Mutex::new(0),
            applied_cv: Condvar::new(),
        }
    }

    /// Write `m` as one JSON line; the mutex keeps lines from different
    /// threads whole. The line, without its newline.
    pub fn send<M: Serialize>(&self, m: &M) -> io::Result<Vec<u8>> {
        let mut buf = serde_json::to_vec(m).map_err(io::Error::other)?;
        buf.push(b'\n');
        self.writer.lock().unwrap().write_all(&buf)?;
        buf.pop();
        Ok(buf)
    }

    /// Send request `req` and wait for its reply. Err carries the errno for
    /// the kernel: the agent's own, or EIO when the socket is gone or the
    /// reply is not one to `req` (logged).
    pub fn call<Q: Request>(&self, req: &Q) -> Result<Reply<Q::Reply>, i32> {
        self.call_with(req, None, false)
    }

    /// `call`, returning once the trees and deltas the agent sent before its
    /// reply are applied.
    pub fn call_synced<Q: Request>(&self, req: &Q) -> Result<Reply<Q::Reply>, i32> {
        self.call_with(req, None, true)
    }

    /// `call`, with `hook` run on the reply (error replies included); waits
    /// for the trees sent before the reply if `synced` or if it is an error.
    pub fn call_with<Q: Request>(
        &self,
        req: &Q,
        hook: Option<Hook<Q::Reply>>,
        synced: bool,
    ) -> Result<Reply<Q::Reply>, i32> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::sync_channel(1);
        let waiter: Waiter = Box::new(move |line, data, after| {
            let msg = wire::parse::<Q::Reply>(line, &format!("reply to {} (EIO)", Q::OP));
            if let (Some(m), Some(hook)) = (&msg, hook) {
                hook(m);
            }
            let _ = tx.send((msg, data, after));
        });
        {
            let mut p = self.pending.lock().unwrap();
            if p.closed {
                return Err(libc::EIO);
            }
            p.waiters.insert(id, waiter);
        }
        let Ok(sent) = self.send(&Sent { op: Q::OP, req, id }) else {
            self.pending.lock().unwrap().waiters.remove(&id);
            return Err(libc::EIO);
        };
        let (msg, data, after) = match rx.recv_timeout(self.timeout) {
            Ok(r) => r,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // its late reply finds no waiter and is dropped
                self.pending.lock().unwrap().waiters.remove(&id);
                self.timeouts.fetch_add(1, Ordering::Relaxed);
                eprintln!(
                    "ffs-mount: the agent did not answer {} within {:?}: EIO",
                    String::from_utf8_lossy(&sent),
                    self.timeout
                );
                return Err(libc::EIO);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return Err(libc::EIO), // the socket closed
        };
        // A reply not of its type fails the request like an error reply.
        let errno = msg.as_ref().map_or(Some(0), wire::Reply::errno);
        if synced || errno.is_some() {
            self.wait_applied(after);
        }
        match (msg, errno) {
            (Some(msg), None) => Ok(Reply { msg, data }),
            (_, e) => Err(e.filter(|&e| e > 0).unwrap_or(libc::EIO as i64) as i32),
        }
    }

    /// Called by the reader thread for every message without "op": `line`
    /// and the `data` after it, the reply to request `id`.
    pub fn deliver(&self, id: u64, line: &[u8], data: Vec<u8>, after: u64) {
        let waiter = self.pending.lock().unwrap().waiters.remove(&id);
        if let Some(w) = waiter {
            w(line, data, after);
        }
    }

    /// Called by the applier thread after each message it was handed.
    pub fn applied_one(&self) {
        *self.applied.lock().unwrap() += 1;
        self.applied_cv.notify_all();
    }

    fn wait_applied(&self, n: u64) {
        let mut a = self.applied.lock().unwrap();
        while *a < n {
            a = self.applied_cv.wait(a).unwrap();
        }
    }

    /// Socket closed: fail all current and future calls with EIO.
    pub fn close(&self) {
        let mut p = self.pending.lock().unwrap();
        p.closed = true;
        p.waiters.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_call_the_agent_never_answers_fails_in_its_time() {
        let (ours, _theirs) = UnixStream::pair().unwrap();
        let a = AgentLink::new(ours, Duration::from_millis(200));
        let t = Instant::now();
        let read = wire::ReadRequest {
            handle: 1,
            offset: 0,
            size: 1,
        };
        assert_eq!(a.call(&read).err(), Some(libc::EIO));
        assert!(t.elapsed() >= Duration::from_millis(200) && t.elapsed() < Duration::from_secs(5));
        assert_eq!(a.timeouts.load(Ordering::Relaxed), 1);
        assert!(
            a.pending.lock().unwrap().waiters.is_empty(),
            "its waiter is gone"
        );
        a.deliver(1, br#"{"id":1}"#, vec![], 0); // the late reply is dropped
    }

    #[test]
    fn requests_are_typed_on_the_wire_and_so_are_their_replies() {
        use std::io::{BufRead, BufReader};
        use std::sync::Arc;
        let (ours, theirs) = UnixStream::pair().unwrap();
        let a = Arc::new(AgentLink::new(ours, Duration::from_secs(10)));
        let mut lines = BufReader::new(theirs).lines();
        let mut ask = |q: wire::ReadRequest, reply: &[u8], data: &[u8]| {
            let b = a.clone();
            let t =
                std::thread::spawn(move || b.call(&q).map(|r| (r.msg.cached.is_some(), r.data)));
            let sent: serde_json::Value =
                serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
            let id = sent["id"].as_u64().unwrap();
            let reply = String::from_utf8_lossy(reply).replace("ID", &id.to_string());
            a.deliver(id, reply.as_bytes(), data.to_vec(), 0);
            (sent, t.join().unwrap())
        };
        let q = |handle| wire::ReadRequest {
            handle,
            offset: 5,
            size: 2,
        };
        let (sent, got) = ask(q(7), br#"{"id":ID,"len":2,"more":[1]}"#, b"ab");
        let want = serde_json::json!({"op": "read", "handle": 7, "offset": 5, "size": 2, "id": 1});
        assert_eq!((sent, got), (want, Ok((false, b"ab".to_vec()))));
        let bad = [
            &br#"{"id":ID,"len":"2"}"#[..],            // a field of the wrong type
            br#"{"id":ID,"cached":{"backing":"/b"}}"#, // an object missing fields
            br#"{"id":ID,"errno":0}"#,                 // no errno of its own
        ];
        for reply in bad {
            assert_eq!(ask(q(1), reply, b"").1, Err(libc::EIO));
        }
        assert_eq!(
            ask(q(1), br#"{"id":ID,"errno":2}"#, b"").1,
            Err(libc::ENOENT)
        );
        let why = Some("stale");
        let b = a.clone();
        std::thread::spawn(move || b.call(&wire::RefreshRequest { why }));
        let sent = lines.next().unwrap().unwrap();
        assert_eq!(sent, r#"{"op":"refresh","why":"stale","id":6}"#);
    }
}
