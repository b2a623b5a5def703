//! Reading an open handle: a passthrough one's backing (a safety net: the
//! kernel reads those itself), an agent one's cached ranges, its chunks
//! fetched here, or the agent; and releasing a handle.

use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use fuser::{Errno, FileHandle, ReplyData, ReplyEmpty};

use crate::backing::{Cached, Handle, KEPT_MAX};
use crate::fetcher::spawn_anywhere;
use crate::fs::err;
use crate::shared::Shared;
use crate::wire::{CachedRequest, ReadRequest, ReleaseRequest};

impl Shared {
    /// What of agent handle `h`'s file (kernel handle `fh`) is cached here
    /// now, if the agent knows more than it said: kept for the handle's reads.
    fn cached_now(&self, fh: u64, h: u64) -> Option<Arc<Cached>> {
        let r = self.agent.call(&CachedRequest { handle: h }).ok()?;
        let c = Arc::new(Cached::from_msg(r.msg.cached.as_ref()?, &self.pins)?);
        self.keep_cached(fh, c.clone());
        Some(c)
    }

    /// The cached parts of kernel handle `fh`'s file, for its next reads.
    fn keep_cached(&self, fh: u64, c: Arc<Cached>) {
        if let Some(Handle::Agent { cached, .. }) = self.opens.lock().unwrap().handles.get_mut(&fh)
        {
            *cached = Some(c);
        }
    }

    /// A read of agent handle `h` (kernel handle `fh`) answered by the agent.
    fn forward(&self, fh: u64, h: u64, offset: u64, size: u32, reply: ReplyData) {
        let s = self;
        let req = ReadRequest {
            handle: h,
            offset,
            size,
        };
        match s.agent.call(&req) {
            Ok(r) => {
                let n = r.data.len().min(size as usize);
                s.stats.reads_forwarded.fetch_add(1, Relaxed);
                s.stats.bytes_forwarded.fetch_add(n as u64, Relaxed);
                // More of the file cached since: later reads there are ours. Recorded
                // before the reply, or the reader's next read may race past it.
                if let Some(c) = r.msg.cached.and_then(|c| Cached::from_msg(&c, &s.pins)) {
                    s.keep_cached(fh, Arc::new(c));
                }
                reply.data(&r.data[..n]);
            }
            Err(e) => reply.error(err(e)),
        }
    }

    /// READ of kernel handle `fh`: bytes [offset, offset+size).
    pub fn read(self: &Arc<Self>, fh: FileHandle, offset: u64, size: u32, reply: ReplyData) {
        let s = self;
        let found = match s.opens.lock().unwrap().handles.get(&fh.0) {
            Some(Handle::Agent {
                h,
                cached,
                remote,
                size,
                ..
            }) => Ok((*h, cached.clone(), remote.clone(), *size)),
            Some(Handle::Passthrough { b, .. }) => Err(Some(b.clone())),
            None => Err(None),
        };
        let (agent_h, cached, remote, file_size) = match found {
            Ok(a) => a,
            Err(None) => return reply.error(Errno::EBADF),
            Err(Some(b)) => {
                // The kernel reads passthrough files itself; this is just a safety net.
                let mut buf = vec![0u8; size as usize];
                return match b.file.read_at(&mut buf, offset) {
                    Ok(n) => reply.data(&buf[..n]),
                    Err(e) => reply.error(e.into()),
                };
            }
        };
        if let Some(got) = cached.and_then(|c| c.read(offset, size, file_size)) {
            return match got {
                Ok(buf) => {
                    s.stats.reads_cached.fetch_add(1, Relaxed);
                    s.stats.bytes_cached.fetch_add(buf.len() as u64, Relaxed);
                    reply.data(&buf)
                }
                Err(e) => reply.error(e.into()),
            };
        }
        let Some(r) = remote else {
            return s.forward(fh.0, agent_h, offset, size, reply);
        };
        let at_hand = r.at_hand(offset, size);
        let fetch = move |s: &Shared, reply: ReplyData| {
            if !at_hand && r.ask_cached() {
                let now = s.cached_now(fh.0, agent_h);
                r.answered(now.is_some());
                if let Some(Some(Ok(buf))) = now.map(|c| c.read(offset, size, file_size)) {
                    s.stats.reads_cached.fetch_add(1, Relaxed);
                    s.stats.bytes_cached.fetch_add(buf.len() as u64, Relaxed);
                    return reply.data(&buf);
                }
            }
            match r.read(&s.fetcher, offset, size) {
                Some(got) => reply.data(got.bytes()),
                None => {
                    // no holder gave good bytes: the agent's path (peers' caches, repair hints)
                    s.fetcher.stats.fallbacks.fetch_add(1, Relaxed);
                    s.forward(fh.0, agent_h, offset, size, reply)
                }
            }
        };
        // A read that waits on MinIO runs on a thread of its own: this FUSE
        // thread goes on serving others (hot opens, the bytes at hand).
        if at_hand {
            return fetch(s, reply);
        }
        match s.fetcher.worker() {
            Some(w) => {
                let s = s.clone();
                spawn_anywhere(move || {
                    let _w = w;
                    fetch(&s, reply)
                });
            }
            None => fetch(s, reply),
        }
    }

    /// RELEASE of kernel handle `fh`: the kernel is answered first, the
    /// agent told after (off the io_uring queue's thread).
    pub fn release(self: &Arc<Self>, fh: FileHandle, reply: ReplyEmpty) {
        let s = self;
        let mut st = s.opens.lock().unwrap();
        let agent_h = match st.handles.remove(&fh.0) {
            Some(Handle::Passthrough { ino, .. }) => {
                if let Some(io) = st.inodes.get_mut(&ino) {
                    io.pt_count -= 1;
                    if io.pt_count == 0 {
                        if let Some(b) = io.pt.take() {
                            if st.kept.len() >= KEPT_MAX {
                                st.kept.clear(); // drops close their kernel backing ids
                            }
                            st.kept.insert(ino, b);
                        }
                    }
                }
                st.gc(ino);
                None
            }
            Some(Handle::Agent { ino, h, .. }) => {
                if let Some(io) = st.inodes.get_mut(&ino) {
                    io.agent_count -= 1;
                }
                st.gc(ino);
                Some(h)
            }
            None => None,
        };
        drop(st);
        s.stats.releases.fetch_add(1, Relaxed);
        reply.ok(); // the kernel does not wait on the agent's bookkeeping
        if let Some(h) = agent_h {
            let a = s.clone();
            s.clone().off_queue(move || {
                let _ = a.agent.call(&ReleaseRequest { handle: Some(h) });
            });
        }
    }
}
