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

use serde_json::{json, Value};

pub struct Reply {
    pub v: Value,
    /// Raw bytes that followed the JSON line (read replies only).
    pub data: Vec<u8>,
    /// How many messages the reader had handed to the applier before this reply.
    pub after: u64,
}

/// Run by the reader thread on a reply's JSON before its waiter sees it.
pub type Hook = Box<dyn FnOnce(&Value) + Send>;

struct Pending {
    waiters: HashMap<u64, (mpsc::SyncSender<Reply>, Option<Hook>)>,
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

    /// Write one JSON line; the mutex keeps lines from different threads whole.
    pub fn send(&self, v: &Value) -> io::Result<()> {
        let mut buf = serde_json::to_vec(v).map_err(io::Error::other)?;
        buf.push(b'\n');
        self.writer.lock().unwrap().write_all(&buf)
    }

    /// Send request `req` (an object without "id") and wait for its reply.
    /// Err carries the errno for the kernel: the agent's own, or EIO when
    /// the socket is gone.
    pub fn call(&self, req: Value) -> Result<Reply, i32> {
        self.call_with(req, None, false)
    }

    /// `call`, returning once the trees and deltas the agent sent before its
    /// reply are applied.
    pub fn call_synced(&self, req: Value) -> Result<Reply, i32> {
        self.call_with(req, None, true)
    }

    /// `call`, with `hook` run on the reply (error replies included); waits
    /// for the trees sent before the reply if `synced` or if it is an error.
    pub fn call_with(
        &self,
        mut req: Value,
        hook: Option<Hook>,
        synced: bool,
    ) -> Result<Reply, i32> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::sync_channel(1);
        {
            let mut p = self.pending.lock().unwrap();
            if p.closed {
                return Err(libc::EIO);
            }
            p.waiters.insert(id, (tx, hook));
        }
        req["id"] = json!(id);
        if self.send(&req).is_err() {
            self.pending.lock().unwrap().waiters.remove(&id);
            return Err(libc::EIO);
        }
        let r = match rx.recv_timeout(self.timeout) {
            Ok(r) => r,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // its late reply finds no waiter and is dropped
                self.pending.lock().unwrap().waiters.remove(&id);
                self.timeouts.fetch_add(1, Ordering::Relaxed);
                let op = req.get("op").and_then(Value::as_str).unwrap_or("?");
                let what = req
                    .get("path")
                    .or_else(|| req.get("handle"))
                    .cloned()
                    .unwrap_or_default();
                eprintln!(
                    "ffs-mount: the agent did not answer {op} of {what} within {:?}: EIO",
                    self.timeout
                );
                return Err(libc::EIO);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return Err(libc::EIO), // the socket closed
        };
        if synced || r.v.get("errno").is_some() {
            self.wait_applied(r.after);
        }
        match r.v.get("errno") {
            Some(e) => Err(e.as_i64().filter(|&e| e > 0).unwrap_or(libc::EIO as i64) as i32),
            None => Ok(r),
        }
    }

    /// Called by the reader thread for every message without "op".
    pub fn deliver(&self, id: u64, r: Reply) {
        let waiter = self.pending.lock().unwrap().waiters.remove(&id);
        if let Some((tx, hook)) = waiter {
            if let Some(hook) = hook {
                hook(&r.v);
            }
            let _ = tx.send(r);
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
        assert_eq!(
            a.call(json!({"op": "read", "handle": 1})).err(),
            Some(libc::EIO)
        );
        assert!(t.elapsed() >= Duration::from_millis(200) && t.elapsed() < Duration::from_secs(5));
        assert_eq!(a.timeouts.load(Ordering::Relaxed), 1);
        assert!(
            a.pending.lock().unwrap().waiters.is_empty(),
            "its waiter is gone"
        );
        let late = Reply {
            v: json!({"id": 1}),
            data: vec![],
            after: 0,
        };
        a.deliver(1, late); // the late reply is dropped
    }
}
