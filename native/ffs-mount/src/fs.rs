//! The FUSE filesystem: metadata from the pushed tree, opens either native
//! passthrough (hot files, their backings in backing.rs), fetched here
//! (fetch.rs) or forwarded to the agent.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use fuser::{
    BsdFileFlags, Errno, FileAttr, FileHandle, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, ReplyXattr,
    Request, TimeOrNow, WriteFlags,
};
use serde_json::{json, Value};

use crate::agent_link::{AgentLink, Hook};
use crate::backing::{touch, Backing, Cached, Handle, Hot, Opens, Probe, KEPT_MAX};
use crate::fetch::{spawn_anywhere, Fetcher, Remote, AHEAD};
use crate::marks::Pins;
use crate::stats::Stats;
use crate::tree::Tree;

/// Names that lookups found missing even after asking the agent, in the tree
/// of `seq`: asked for again only once a newer tree or delta is applied.
#[derive(Default)]
pub struct Misses {
    seq: u64,
    names: HashSet<(u64, String)>,
}

/// Remembered misses at most (then all are forgotten).
const MISSES_MAX: usize = 65_536;

impl Misses {
    pub fn has(&self, seq: u64, parent: u64, name: &str) -> bool {
        self.seq == seq && self.names.contains(&(parent, name.to_string()))
    }

    /// Missing in the tree of `seq`: remembered unless a newer one is applied already.
    pub fn add(&mut self, seq: u64, parent: u64, name: &str) {
        self.reset(seq);
        if seq == self.seq {
            if self.names.len() >= MISSES_MAX {
                self.names.clear();
            }
            self.names.insert((parent, name.to_string()));
        }
    }

    /// The tree of `seq` is applied: what was missing before may exist now.
    pub fn reset(&mut self, seq: u64) {
        if seq > self.seq {
            self.seq = seq;
            self.names.clear();
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.names.len()
    }
}

pub struct Shared {
    pub tree: RwLock<Arc<Tree>>,
    /// Inode -> how many lookups of it the kernel holds (it FORGETs them):
    /// an inode it holds stays in the tree. Taken before `tree` by whoever
    /// takes both, so an eviction never drops an inode being handed out.
    pub refs: Mutex<HashMap<u64, u64>>,
    /// Entries the tree may hold before the least recently used directories
    /// are evicted (0: no bound).
    pub max_entries: usize,
    pub misses: Mutex<Misses>,
    pub hot: Mutex<HashMap<String, Hot>>,
    pub stats: Stats,
    pub agent: AgentLink,
    pub ttl: Duration,
    pub fetcher: Arc<Fetcher>,
    pins: Pins,
    passthrough_ok: AtomicBool,
    opens: Mutex<Opens>,
    /// Ask for FUSE over io_uring in init (the kernel may not offer it).
    pub uring: bool,
}

impl Shared {
    pub fn new(agent: AgentLink, ttl: Duration) -> Shared {
        Shared {
            tree: RwLock::new(Arc::new(Tree::empty())),
            refs: Mutex::new(HashMap::new()),
            max_entries: 0,
            misses: Mutex::new(Misses::default()),
            hot: Mutex::new(HashMap::new()),
            stats: Stats::default(),
            agent,
            ttl,
            fetcher: Arc::new(Fetcher::new(AHEAD, 0)),
            pins: Pins::default(),
            passthrough_ok: AtomicBool::new(false),
            opens: Mutex::new(Opens::default()),
            uring: false,
        }
    }

    pub fn tree(&self) -> Arc<Tree> {
        self.tree.read().unwrap().clone()
    }

    /// Inodes with handles open (or opens under way).
    pub fn open_inodes(&self) -> HashSet<u64> {
        let st = self.opens.lock().unwrap();
        st.inodes
            .iter()
            .filter(|(_, io)| io.pt_count + io.agent_count > 0)
            .map(|(&i, _)| i)
            .collect()
    }

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

    /// The attributes of `name` in directory `parent`. A name the tree lacks
    /// is asked of the agent, which sends what it is, if anything, before it
    /// replies: in a directory not listed, that name alone ("lookup": the
    /// directory is listed whole only by a readdir); in a listed one, any
    /// change newer than the last push ("refresh": a dataset ingested a
    /// moment ago). A name still missing then is not asked for again until
    /// the next tree, delta or listing. Err: ENOENT, or the errno of a failed
    /// call to the agent.
    /// `find`, the entry counted as held by the kernel (a LOOKUP's reply).
    /// Retried if the tree lost it meanwhile (evicted, removed), so that no
    /// inode missing from the tree is handed out.
    pub fn find_held(&self, parent: u64, name: &str) -> Result<FileAttr, i32> {
        for _ in 0..3 {
            let a = self.find(parent, name)?;
            let mut refs = self.refs.lock().unwrap();
            if self.tree().nodes.contains_key(&a.ino.0) {
                *refs.entry(a.ino.0).or_default() += 1;
                return Ok(a);
            }
        }
        Err(libc::ENOENT)
    }

    /// The kernel let go of `n` lookups of `ino`.
    fn forget(&self, ino: u64, n: u64) {
        let mut refs = self.refs.lock().unwrap();
        if let Some(c) = refs.get_mut(&ino) {
            *c = c.saturating_sub(n);
            if *c == 0 {
                refs.remove(&ino);
            }
        }
    }

    pub fn find(&self, parent: u64, name: &str) -> Result<FileAttr, i32> {
        let find = |t: &Tree| t.child(parent, name).and_then(|i| t.attr(i));
        let t = self.tree();
        t.touch(parent);
        if let Some(a) = find(&t) {
            return Ok(a);
        }
        if self.misses.lock().unwrap().has(t.seq, parent, name) {
            self.stats.negative_hits.fetch_add(1, Relaxed);
            return Err(libc::ENOENT);
        }
        if t.listed(parent) {
            self.stats.lookup_refreshes.fetch_add(1, Relaxed);
            self.agent.call_synced(json!({"op": "refresh"}))?;
        } else {
            let Some(dir) = t.nodes.get(&parent) else {
                return Err(libc::ENOENT);
            };
            let path = match dir.path.is_empty() {
                true => name.to_string(),
                false => format!("{}/{name}", dir.path),
            };
            self.stats.name_lookups.fetch_add(1, Relaxed);
            self.agent
                .call_synced(json!({"op": "lookup", "path": path}))?;
        }
        let t = self.tree();
        let found = find(&t);
        if found.is_none() {
            self.misses.lock().unwrap().add(t.seq, parent, name);
        }
        found.ok_or(libc::ENOENT)
    }

    /// The tree once directory `ino` is listed in it (asked of the agent if
    /// it is not yet).
    pub fn listed_tree(&self, ino: u64) -> Result<Arc<Tree>, i32> {
        let t = self.tree();
        t.touch(ino);
        if t.listed(ino) || !t.children.contains_key(&ino) {
            return Ok(t);
        }
        self.list(ino)
    }

    /// Ask the agent for directory `ino`'s names; the tree they are in.
    fn list(&self, ino: u64) -> Result<Arc<Tree>, i32> {
        let Some(path) = self.tree().nodes.get(&ino).map(|n| n.path.clone()) else {
            return Err(libc::ENOENT);
        };
        self.stats.listings.fetch_add(1, Relaxed);
        self.agent
            .call_synced(json!({"op": "list", "path": path}))?;
        Ok(self.tree())
    }

    /// A hot file's marks say stale: has it been replaced? Asks the agent for
    /// the newest tree (sent before its reply); true if `ino` is not in it.
    /// The open then fails with ESTALE, and the kernel's retry looks the
    /// path up again and finds the new file's inode.
    fn replaced(&self, ino: u64) -> bool {
        let _ = self
            .agent
            .call_synced(json!({"op": "refresh", "why": "stale"}));
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
        let hook: Hook = {
            let (s, path) = (s.clone(), path.clone());
            Box::new(move |v: &Value| {
                if let Some(h) = v.get("hot").and_then(Hot::from_msg) {
                    s.hot.lock().unwrap().insert(path, h);
                }
            })
        };
        let req = json!({"op": "open", "path": path, "gen": gen});
        let r = match s.agent.call_with(req, Some(hook), false) {
            Ok(r) => r,
            Err(e) => {
                let mut st = s.opens.lock().unwrap();
                if let Some(io) = st.inodes.get_mut(&ino) {
                    io.agent_count -= 1;
                }
                st.gc(ino);
                drop(st);
                return reply.error(err(e));
            }
        };
        let h = r.v.get("handle").cloned().unwrap_or(Value::Null);
        if r.v.get("hot").is_some_and(Value::is_object) {
            if let Some((fh, b)) = s.promote(ino, &path, version, size, &reply) {
                s.stats.passthrough_opens.fetch_add(1, Relaxed);
                s.stats.hot_from_open_reply.fetch_add(1, Relaxed);
                reply.opened_passthrough(FileHandle(fh), oflags, &b.id);
                // The agent's handle was never used; the kernel is answered first.
                let _ = s.agent.call(json!({"op": "release", "handle": h}));
                return;
            }
        }
        let cached =
            r.v.get("cached")
                .and_then(|c| Cached::from_msg(c, &s.pins))
                .map(Arc::new);
        let remote =
            r.v.get("fetch")
                .and_then(|f| Remote::from_msg(f, size))
                .map(|f| {
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
        let keep = r.v.get("keep_cache").and_then(Value::as_bool) == Some(true);
        let flags = match keep {
            true => oflags | FopenFlags::FOPEN_KEEP_CACHE,
            false => oflags,
        };
        reply.opened(FileHandle(fh), flags);
    }

    /// Run `f` on a thread of its own when requests come through io_uring: each CPU's queue has
    /// one thread, and a call to the agent there would hold up every request of that CPU (through
    /// /dev/fuse, the other threads go on). Inline when MAX_WORKERS run already.
    fn off_queue(self: Arc<Self>, f: impl FnOnce() + Send + 'static) {
        match self
            .stats
            .uring
            .load(Relaxed)
            .then(|| self.fetcher.worker())
            .flatten()
        {
            Some(w) => {
                spawn_anywhere(move || {
                    let _w = w;
                    f()
                });
            }
            None => f(),
        }
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

    /// What of agent handle `h`'s file (kernel handle `fh`) is cached here
    /// now, if the agent knows more than it said: kept for the handle's reads.
    fn cached_now(&self, fh: u64, h: &Option<Value>) -> Option<Arc<Cached>> {
        let r = self.agent.call(json!({"op": "cached", "handle": h})).ok()?;
        let c = Arc::new(Cached::from_msg(r.v.get("cached")?, &self.pins)?);
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
    fn forward(&self, fh: u64, h: Option<Value>, offset: u64, size: u32, reply: ReplyData) {
        let s = self;
        let req = json!({"op": "read", "handle": h, "offset": offset, "size": size});
        match s.agent.call(req) {
            Ok(r) => {
                let n = r.data.len().min(size as usize);
                s.stats.reads_forwarded.fetch_add(1, Relaxed);
                s.stats.bytes_forwarded.fetch_add(n as u64, Relaxed);
                // More of the file cached since: later reads there are ours. Recorded
                // before the reply, or the reader's next read may race past it.
                if let Some(c) = r.v.get("cached").and_then(|c| Cached::from_msg(c, &s.pins)) {
                    s.keep_cached(fh, Arc::new(c));
                }
                reply.data(&r.data[..n]);
            }
            Err(e) => reply.error(err(e)),
        }
    }
}

pub struct FuseFs(pub Arc<Shared>);

fn err(e: i32) -> Errno {
    Errno::from_i32(e)
}

impl Filesystem for FuseFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Passthrough needs the capability plus a stacking depth of >= 1.
        let ok = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && config.set_max_stack_depth(1).is_ok();
        if !ok {
            eprintln!("ffs-mount: kernel lacks FUSE passthrough; all opens go to the agent");
        }
        self.0.passthrough_ok.store(ok, Relaxed);
        self.0.stats.passthrough_enabled.store(ok, Relaxed);
        // Lookups in one directory may run concurrently across our threads.
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        // Listings carry each entry's attributes when the lister then looks at
        // them (`ls -l`: no LOOKUP per entry, 1,000 round trips for a 1,000-file
        // directory); the kernel's adaptive mode keeps plain names for `find`,
        // whose dentries would cost the kernel ~5 us an entry for nothing.
        let _ = config
            .add_capabilities(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO);
        // Read-only: no write is larger than a read, and each ring entry's payload is sized
        // for the largest of either.
        let _ = config.set_max_write(1 << 20);
        let uring = self.0.uring
            && config
                .add_capabilities(InitFlags::FUSE_OVER_IO_URING)
                .is_ok();
        self.0.stats.uring.store(uring, Relaxed);
        if self.0.uring && !uring {
            eprintln!("ffs-mount: the kernel offers no FUSE over io_uring (fuse.enable_uring); requests go through /dev/fuse");
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let s = &self.0;
        s.stats.lookups.fetch_add(1, Relaxed);
        // Paths are JSON strings: a name that is not UTF-8 is in no tree.
        match name
            .to_str()
            .map_or(Err(libc::ENOENT), |n| s.find_held(parent.0, n))
        {
            Ok(a) => reply.entry(&s.ttl, &a, Generation(0)),
            Err(e) => reply.error(err(e)),
        }
    }

    // (BATCH_FORGET comes here too: fuser's default splits it.)
    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.0.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.0.stats.getattrs.fetch_add(1, Relaxed);
        match self.0.tree().attr(ino.0) {
            Some(a) => reply.attr(&self.0.ttl, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.0.tree().nodes.get(&ino.0) {
            // The kernel keeps the listing it read (a second `find` or `ls` asks
            // nothing); the entry invalidation of a name changed in it (main.rs)
            // bumps the directory's i_version, which drops the kept listing.
            Some(n) if n.dir => reply.opened(
                FileHandle(0),
                FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Some(_) => reply.error(Errno::ENOTDIR),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.0.stats.readdirs.fetch_add(1, Relaxed);
        let t = match self.0.listed_tree(ino.0) {
            Ok(t) => t,
            Err(e) => return reply.error(err(e)),
        };
        // Offsets are positions in the sorted listing; entry k carries k+1.
        let Some(entries) = t.dir_entries(ino.0, offset) else {
            return reply.error(Errno::ENOENT);
        };
        for (i, kind, name, next) in entries {
            if reply.add(INodeNo(i), next, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let s = &self.0;
        s.stats.readdirs.fetch_add(1, Relaxed);
        // Every entry but "." and ".." is a lookup the kernel holds: counted
        // from the tree current under `refs` (an eviction may have come
        // between the listing and now; then it is listed again).
        for _ in 0..3 {
            if let Err(e) = s.listed_tree(ino.0) {
                return reply.error(err(e));
            }
            let mut refs = s.refs.lock().unwrap();
            let t = s.tree();
            if !t.listed(ino.0) && t.children.contains_key(&ino.0) {
                continue;
            }
            let Some(entries) = t.dir_entries(ino.0, offset) else {
                return reply.error(Errno::ENOENT);
            };
            for (i, _, name, next) in entries {
                let Some(attr) = t.attr(i) else { continue };
                if reply.add(INodeNo(i), next, name, &s.ttl, &attr, Generation(0)) {
                    break;
                }
                if name != "." && name != ".." {
                    *refs.entry(i).or_default() += 1;
                }
            }
            return reply.ok();
        }
        reply.error(Errno::EAGAIN);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let f = flags.0;
        if f & libc::O_ACCMODE != libc::O_RDONLY || f & (libc::O_TRUNC | libc::O_APPEND) != 0 {
            return reply.error(Errno::EROFS);
        }
        let s = &self.0;
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

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let s = &self.0;
        let (agent_h, backing, cached, remote, file_size) =
            match s.opens.lock().unwrap().handles.get(&fh.0) {
                Some(Handle::Agent {
                    h,
                    cached,
                    remote,
                    size,
                    ..
                }) => (Some(h.clone()), None, cached.clone(), remote.clone(), *size),
                Some(Handle::Passthrough { b, .. }) => (None, Some(b.clone()), None, None, 0),
                None => return reply.error(Errno::EBADF),
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
        if let Some(b) = backing {
            // The kernel reads passthrough files itself; this is just a safety net.
            let mut buf = vec![0u8; size as usize];
            return match b.file.read_at(&mut buf, offset) {
                Ok(n) => reply.data(&buf[..n]),
                Err(e) => reply.error(e.into()),
            };
        }
        let Some(r) = remote else {
            return s.forward(fh.0, agent_h, offset, size, reply);
        };
        let at_hand = r.at_hand(offset, size);
        let fetch = move |s: &Shared, reply: ReplyData| {
            if !at_hand && r.ask_cached() {
                let now = s.cached_now(fh.0, &agent_h);
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

    // A read-only mount has nothing to flush: ENOSYS once, and the kernel
    // sends no more FLUSHes (each close() waited on one round trip).
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lo: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let s = &self.0;
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
                let _ = a.agent.call(json!({"op": "release", "handle": h}));
            });
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        match self.0.tree().nodes.contains_key(&ino.0) {
            true => reply.ok(),
            false => reply.error(Errno::ENOENT),
        }
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        // ENOSYS, not ENODATA: the kernel then stops asking (no round trip per
        // file for the ACL and SELinux labels `ls -l` looks up).
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: ReplyXattr) {
        if size == 0 {
            reply.size(0)
        } else {
            reply.data(&[])
        }
    }

    // ---- everything that would modify the tree: read-only filesystem ----

    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        reply.error(Errno::EROFS);
    }
    fn mknod(
        &self,
        _r: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _m: u32,
        _u: u32,
        _d: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }
    fn mkdir(&self, _r: &Request, _p: INodeNo, _n: &OsStr, _m: u32, _u: u32, reply: ReplyEntry) {
        reply.error(Errno::EROFS);
    }
    fn unlink(&self, _r: &Request, _p: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }
    fn rmdir(&self, _r: &Request, _p: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }
    fn symlink(&self, _r: &Request, _p: INodeNo, _n: &OsStr, _t: &Path, reply: ReplyEntry) {
        reply.error(Errno::EROFS);
    }
    fn rename(
        &self,
        _r: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _np: INodeNo,
        _nn: &OsStr,
        _f: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }
    fn link(&self, _r: &Request, _i: INodeNo, _np: INodeNo, _nn: &OsStr, reply: ReplyEntry) {
        reply.error(Errno::EROFS);
    }
    fn write(
        &self,
        _r: &Request,
        _i: INodeNo,
        _fh: FileHandle,
        _o: u64,
        _d: &[u8],
        _wf: WriteFlags,
        _f: OpenFlags,
        _lo: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        reply.error(Errno::EROFS);
    }
    fn create(
        &self,
        _r: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _m: u32,
        _u: u32,
        _f: i32,
        reply: ReplyCreate,
    ) {
        reply.error(Errno::EROFS);
    }
    fn setxattr(
        &self,
        _r: &Request,
        _i: INodeNo,
        _n: &OsStr,
        _v: &[u8],
        _f: i32,
        _p: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }
    fn removexattr(&self, _r: &Request, _i: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }
    fn fallocate(
        &self,
        _r: &Request,
        _i: INodeNo,
        _fh: FileHandle,
        _o: u64,
        _l: u64,
        _m: i32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }
}
