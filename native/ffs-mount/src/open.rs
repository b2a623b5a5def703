//! Opening a file: a kernel passthrough open of its backing when it is hot
//! here (its marks checked, a backing open already reused), else the
//! agent's handle, with what of the file is cached here or where to fetch
//! it from.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use fuser::{Errno, FileHandle, FopenFlags, INodeNo, OpenFlags, ReplyOpen};

use crate::agent_link::Hook;
use crate::backing::{touch, Backing, Cached, Handle, Hot, Probe};
use crate::fetch::Remote;
use crate::fs::err;
use crate::shared::Shared;
use crate::wire::{OpenReply, OpenRequest, RefreshRequest, ReleaseRequest};

impl Shared {
    /// Ready with the backing file if `path` is hot for tree `version`, its
    /// marks do not say stale, and the backing still is the declared file
    /// (same st_ino, checked with fstat on the opened fd so it cannot change
    /// between check and use; same size).
    fn probe(&self, ino: u64, path: &str, version: u64, size: u64) -> Probe {
        let hot = match self.hot.lock().unwrap().get(path) {
            Some(h) if h.version == version => h.clone(),
            _ => return Probe::Cold,
        };
        if hot.marks.as_ref().is_some_and(|m| self.pins.stale(m)) {
            return Probe::Stale;
        }
        let kept = self.opens.lock().unwrap().kept.remove(&ino);
        if let Some(b) = kept.filter(|b| b.hot.backing == hot.backing && b.hot.inode == hot.inode) {
            // Still the declared entry at its path (not evicted nor refilled)?
            match std::fs::metadata(&hot.backing) {
                Ok(md) if md.ino() == hot.inode && md.len() == size => {
                    touch(&hot.backing, &md);
                    return Probe::Kept(b);
                }
                _ => return Probe::Cold,
            }
        }
        // O_RDONLY|O_CLOEXEC
        let Ok(f) = File::open(Path::new(&hot.backing)) else {
            return Probe::Cold;
        };
        match f.metadata() {
            Ok(md) if md.is_file() && md.ino() == hot.inode && md.len() == size => {
                touch(&hot.backing, &md);
                Probe::Ready(f, hot)
            }
            _ => Probe::Cold,
        }
    }

    /// A hot file's marks say stale: has it been replaced? Asks the agent for
    /// the newest tree (sent before its reply); true if `ino` is not in it.
    /// The open then fails with ESTALE, and the kernel's retry looks the
    /// path up again and finds the new file's inode.
    fn replaced(&self, ino: u64) -> bool {
        let why = Some("stale");
        let _ = self.agent.call_synced(&RefreshRequest { why });
        !self.tree().nodes.contains_key(&ino)
    }

    /// Are the bytes `b` serves stale? Judged by the hot entry's marks while
    /// it still names b's backing file (its fetched_ns may be newer), else by
    /// the marks b was opened with.
    fn reuse_stale(&self, path: &str, b: &Backing) -> bool {
        let marks = match self.hot.lock().unwrap().get(path) {
            Some(h) if h.backing == b.hot.backing && h.inode == b.hot.inode => h.marks.clone(),
            _ => b.hot.marks.clone(),
        };
        marks.is_some_and(|m| self.pins.stale(&m))
    }

    /// An open the agent answers (the file is not hot here, or its inode has such opens):
    /// the agent's handle, and what of the file is cached or where to fetch it from.
    #[allow(clippy::too_many_arguments)]
    fn agent_open(
        self: &Arc<Self>,
        ino: u64,
        path: String,
        gen: String,
        size: u64,
        version: u64,
        oflags: FopenFlags,
        reply: ReplyOpen,
    ) {
        let s = self;
        // The reply's "hot" is recorded by the reader thread, in stream order
        // with "hot" messages, exactly as a "hot" message would be.
        let hook: Hook<OpenReply> = {
            let (s, path) = (s.clone(), path.clone());
            Box::new(move |r: &OpenReply| {
                if let Some(h) = &r.hot {
                    s.hot.lock().unwrap().insert(path, Hot::from(h));
                }
            })
        };
        let fail = |e: i32, reply: ReplyOpen| {
            let mut st = s.opens.lock().unwrap();
            if let Some(io) = st.inodes.get_mut(&ino) {
                io.agent_count -= 1;
            }
            st.gc(ino);
            drop(st);
            reply.error(err(e))
        };
        let req = OpenRequest {
            path: &path,
            gen: &gen,
        };
        let r = match s.agent.call_with(&req, Some(hook), false) {
            Ok(r) => r.msg,
            Err(e) => return fail(e, reply),
        };
        if r.hot.is_some() {
            if let Some((fh, b)) = s.promote(ino, &path, version, size, &reply) {
                s.stats.passthrough_opens.fetch_add(1, Relaxed);
                s.stats.hot_from_open_reply.fetch_add(1, Relaxed);
                reply.opened_passthrough(FileHandle(fh), oflags, &b.id);
                // The agent's handle was never used; the kernel is answered first.
                let _ = s.agent.call(&ReleaseRequest { handle: r.handle });
                return;
            }
        }
        let Some(h) = r.handle else {
            eprintln!("ffs-mount: the agent opened {path} without a handle: EIO");
            return fail(libc::EIO, reply);
        };
        let cached = r
            .cached
            .and_then(|c| Cached::from_msg(&c, &s.pins))
            .map(Arc::new);
        let remote = r.fetch.and_then(|f| Remote::from_msg(&f, size)).map(|f| {
            let here = cached.as_ref().map_or(&[][..], |c| &c.ranges[..]);
            Arc::new(f.cached_here(here))
        });
        let handle = Handle::Agent {
            ino,
            h,
            size,
            cached,
            remote,
        };
        let fh = s.opens.lock().unwrap().add_handle(handle);
        s.stats.agent_opens.fetch_add(1, Relaxed);
        // Without KEEP_CACHE the kernel drops the file's cached pages at this
        // open; with it the agent vouches that they are still right. Never on
        // a passthrough open (above): the kernel fails that combination.
        let flags = match r.keep_cache {
            true => oflags | FopenFlags::FOPEN_KEEP_CACHE,
            false => oflags,
        };
        reply.opened(FileHandle(fh), flags);
    }

    /// An open reply declared `path` hot: make that open (still counted in
    /// agent_count) passthrough, if no other open holds the inode.
    fn promote(
        &self,
        ino: u64,
        path: &str,
        version: u64,
        size: u64,
        reply: &ReplyOpen,
    ) -> Option<(u64, Arc<Backing>)> {
        if !self.passthrough_ok.load(Relaxed) {
            return None;
        }
        let probe = self.probe(ino, path, version, size);
        let mut st = self.opens.lock().unwrap();
        let io = st.inodes.get_mut(&ino)?;
        if io.agent_count != 1 || io.pt.is_some() {
            return None;
        }
        match probe {
            Probe::Ready(file, hot) => st
                .passthrough(ino, file, hot, reply)
                .inspect_err(|e| eprintln!("ffs-mount: backing open for {path}: {e}"))
                .ok(),
            Probe::Kept(b) => {
                (io.pt, io.pt_count, io.agent_count) = (Some(b.clone()), 1, 0);
                Some((st.add_handle(Handle::Passthrough { ino, b: b.clone() }), b))
            }
            Probe::Stale => {
                self.stats.stale_refused.fetch_add(1, Relaxed);
                None
            }
            Probe::Cold => None,
        }
    }

    /// OPEN of file `ino` (read-only): passthrough if it can be, else an
    /// agent open, off the io_uring queue's thread.
    pub fn open(self: &Arc<Self>, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let f = flags.0;
        if f & libc::O_ACCMODE != libc::O_RDONLY || f & (libc::O_TRUNC | libc::O_APPEND) != 0 {
            return reply.error(Errno::EROFS);
        }
        let s = self;
        let t = s.tree();
        let Some(node) = t.nodes.get(&ino.0) else {
            // A file replaced or removed: the kernel's retry looks its path up again.
            let gone = t.orphans.contains_key(&ino.0);
            return reply.error(if gone { Errno::ESTALE } else { Errno::ENOENT });
        };
        if node.dir {
            return reply.error(Errno::EISDIR);
        }
        let ino = ino.0;
        // NOFLUSH: read-only, so close() needs no FLUSH round trip.
        let oflags = FopenFlags::FOPEN_NOFLUSH;

        // Mark checks and backing opens run outside the lock; the mode
        // decision and the counters are re-checked and updated under it.
        let mut reuse: Option<(Arc<Backing>, bool)> = None; // (backing, stale)
        let mut probe = None;
        loop {
            let mut st = s.opens.lock().unwrap();
            let io = st.inodes.entry(ino).or_default();
            if let Some(b) = io.pt.clone() {
                // Inode already passthrough: must stay so (the kernel fails an
                // agent open now), so reuse its backing unless that is stale.
                match reuse.take() {
                    Some((rb, stale)) if Arc::ptr_eq(&rb, &b) => {
                        if stale {
                            drop(st);
                            s.stats.stale_refused.fetch_add(1, Relaxed);
                            s.replaced(ino); // the retry then finds a new file, if it is one
                            eprintln!(
                                "ffs-mount: {} is stale but held open by passthrough: ESTALE",
                                node.path
                            );
                            return reply.error(Errno::ESTALE);
                        }
                        io.pt_count += 1;
                        let fh = st.add_handle(Handle::Passthrough { ino, b: b.clone() });
                        drop(st);
                        s.stats.passthrough_opens.fetch_add(1, Relaxed);
                        return reply.opened_passthrough(FileHandle(fh), oflags, &b.id);
                    }
                    _ => {
                        drop(st);
                        let stale = s.reuse_stale(&node.path, &b);
                        reuse = Some((b, stale));
                        continue;
                    }
                }
            }
            if io.agent_count == 0 && s.passthrough_ok.load(Relaxed) {
                match probe.take() {
                    None => {
                        drop(st);
                        probe = Some(s.probe(ino, &node.path, t.version, node.size));
                        continue;
                    }
                    Some(Probe::Ready(file, hot)) => match st.passthrough(ino, file, hot, &reply) {
                        Ok((fh, b)) => {
                            drop(st);
                            s.stats.passthrough_opens.fetch_add(1, Relaxed);
                            return reply.opened_passthrough(FileHandle(fh), oflags, &b.id);
                        }
                        Err(e) => eprintln!("ffs-mount: backing open for {}: {e}", node.path),
                    },
                    Some(Probe::Kept(b)) => {
                        io.pt = Some(b.clone());
                        io.pt_count = 1;
                        let fh = st.add_handle(Handle::Passthrough { ino, b: b.clone() });
                        drop(st);
                        s.stats.passthrough_opens.fetch_add(1, Relaxed);
                        return reply.opened_passthrough(FileHandle(fh), oflags, &b.id);
                    }
                    Some(Probe::Stale) => {
                        drop(st); // asking the agent must not hold up other opens
                        s.stats.stale_refused.fetch_add(1, Relaxed);
                        if s.replaced(ino) {
                            return reply.error(Errno::ESTALE);
                        }
                        probe = Some(Probe::Cold); // decide again: another open may have come
                        continue;
                    }
                    Some(Probe::Cold) => {}
                }
            }
            // Not hot, stale, or the inode has non-passthrough opens: agent open.
            st.inodes.entry(ino).or_default().agent_count += 1;
            break;
        }
        let (path, gen, size, version) =
            (node.path.clone(), node.gen.clone(), node.size, t.version);
        let s = s.clone();
        s.clone()
            .off_queue(move || s.agent_open(ino, path, gen, size, version, oflags, reply));
    }
}
