//! Names: a lookup answered from the tree, else asked of the agent (misses
//! remembered until the tree changes), the kernel's lookups counted, and a
//! directory's listing (READDIR, READDIRPLUS), asked of the agent when the
//! directory is not listed yet.

use std::collections::HashSet;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use fuser::{Errno, FileAttr, Generation, INodeNo, ReplyDirectory, ReplyDirectoryPlus};

use crate::fs::err;
use crate::shared::Shared;
use crate::tree::Tree;
use crate::wire::{ListRequest, LookupRequest, RefreshRequest};

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

impl Shared {
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
    pub fn forget(&self, ino: u64, n: u64) {
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
            self.agent.call_synced(&RefreshRequest { why: None })?;
        } else {
            let Some(dir) = t.nodes.get(&parent) else {
                return Err(libc::ENOENT);
            };
            let path = match dir.path.is_empty() {
                true => name.to_string(),
                false => format!("{}/{name}", dir.path),
            };
            self.stats.name_lookups.fetch_add(1, Relaxed);
            self.agent.call_synced(&LookupRequest { path: &path })?;
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
        self.agent.call_synced(&ListRequest { path: &path })?;
        Ok(self.tree())
    }

    /// READDIR of directory `ino` from `offset` (its listing asked of the
    /// agent first if it is not listed).
    pub fn readdir(&self, ino: INodeNo, offset: u64, mut reply: ReplyDirectory) {
        self.stats.readdirs.fetch_add(1, Relaxed);
        let t = match self.listed_tree(ino.0) {
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

    /// READDIRPLUS of directory `ino` from `offset`: READDIR's entries with
    /// their attributes, each a lookup the kernel then holds.
    pub fn readdirplus(&self, ino: INodeNo, offset: u64, mut reply: ReplyDirectoryPlus) {
        let s = self;
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
}
