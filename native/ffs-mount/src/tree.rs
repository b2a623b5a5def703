//! Immutable metadata snapshots built from the agent's "tree" and "delta"
//! messages.
//!
//! The applier thread (inbound.rs) makes each new `Tree` and swaps an `Arc`, so
//! FUSE threads never block on it. Its maps are persistent (rpds): a clone
//! is O(1) and shares everything, an edit copies O(log n) nodes, so a delta
//! costs O(its size * log n), not O(tree), and snapshots still in use keep
//! their own view. Inode numbers come from `InoMap`: a path keeps its inode
//! while its "gen" stays (a file replaced is a new inode, as a file renamed
//! over is on a local disk: handles open on the old one keep reading it),
//! and an inode is never handed to another path (the kernel may still cache
//! old ones). Once a path is neither in the tree nor an orphan its inode is
//! forgotten: if it comes back, it gets a new one.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{FileAttr, FileType, INodeNo};
use rpds::{HashTrieMapSync, RedBlackTreeMapSync};

pub const ROOT_INO: u64 = 1;

/// What the kernel may hold wrongly after a change: (parent, name, ino);
/// ino 0: the entry alone (an eviction's: the inode's pages stay good).
pub type Inval = (u64, String, u64);

/// Who the mount's files belong to and their modes, set once from the
/// command line (mountpoint-s3's --uid, --gid, --file-mode, --dir-mode). The
/// kernel enforces them (default_permissions); without --allow-other only
/// the mounting user (root) gets in at all.
#[derive(Clone, Copy)]
pub struct Access {
    pub uid: u32,
    pub gid: u32,
    pub file_mode: u16,
    pub dir_mode: u16,
}

impl Default for Access {
    fn default() -> Self {
        Access {
            uid: 0,
            gid: 0,
            file_mode: 0o440,
            dir_mode: 0o550,
        }
    }
}

pub static ACCESS: std::sync::OnceLock<Access> = std::sync::OnceLock::new();

#[derive(Clone)]
pub struct Node {
    pub path: String,
    pub parent: u64,
    pub dir: bool,
    pub size: u64,
    pub mtime_ns: i64,
    pub gen: String,
}

impl Node {
    pub fn name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or_default()
    }
}

/// The InoMap key of a path and gen: a new gen is another file.
pub fn key<'a>(path: &'a str, gen: &str) -> Cow<'a, str> {
    match gen.is_empty() {
        true => Cow::Borrowed(path),
        false => Cow::Owned(format!("{path}\0{gen}")),
    }
}

/// A directory's entries by name. Its sorted listing is built by the first
/// readdir that needs it and kept while the names stay: an edit makes a new
/// `Dir` (sharing the map), with no listing yet. `listed`: its names are all
/// here (a lazy tree's directory is not until the agent's "listing" of it:
/// a name missing from an unlisted directory may exist). `used`: when it was
/// last looked in (a tick of USES), the order of eviction.
#[derive(Default)]
pub struct Dir {
    pub names: RedBlackTreeMapSync<Arc<str>, u64>,
    pub listing: OnceLock<Vec<(Arc<str>, u64)>>,
    pub listed: bool,
    pub used: AtomicU64,
}

/// Lookups and listings counted, to order directories by their last use.
static USES: AtomicU64 = AtomicU64::new(0);

impl Clone for Dir {
    fn clone(&self) -> Dir {
        Dir {
            names: self.names.clone(),
            listing: OnceLock::new(),
            listed: self.listed,
            used: AtomicU64::new(self.used.load(Relaxed)),
        }
    }
}

impl Dir {
    pub fn new(listed: bool) -> Arc<Dir> {
        Arc::new(Dir {
            listed,
            ..Dir::default()
        })
    }

    pub fn get(&self, name: &str) -> Option<u64> {
        self.names.get(name).copied()
    }

    /// Entries in name order: readdir offset k is index k - 2 (after "." and "..").
    pub fn listing(&self) -> &[(Arc<str>, u64)] {
        self.listing
            .get_or_init(|| self.names.iter().map(|(n, &i)| (n.clone(), i)).collect())
    }
}

#[derive(Clone)]
pub struct Tree {
    pub version: u64,
    /// How many trees and deltas have been applied, this one included.
    pub seq: u64,
    pub nodes: HashTrieMapSync<u64, Node>,
    /// Directory inode -> its entries.
    pub children: HashTrieMapSync<u64, Arc<Dir>>,
    /// Files gone from the tree (replaced or removed) in its last change, or
    /// still open: no name leads to them, but their attributes stay (fstat
    /// of an open handle, a getattr racing the change); opening one fails
    /// with ESTALE, so the kernel looks the path up again. A plain map: each
    /// change builds it anew from its own removals and the old one's open
    /// files, which is proportional to the changes, not the tree.
    pub orphans: HashMap<u64, Node>,
}

pub struct InoMap {
    pub by_key: HashMap<String, u64>,
    next: u64,
}

impl InoMap {
    pub fn new() -> Self {
        let mut by_key = HashMap::new();
        by_key.insert(String::new(), ROOT_INO);
        InoMap {
            by_key,
            next: ROOT_INO + 1,
        }
    }

    pub fn ino(&mut self, key: &str) -> u64 {
        if let Some(&i) = self.by_key.get(key) {
            return i;
        }
        let i = self.next;
        self.next += 1;
        self.by_key.insert(key.to_string(), i);
        i
    }

    /// `ino` left for good: its key gets a new inode if it comes back.
    pub fn forget(&mut self, node: &Node, ino: u64) {
        let k = key(&node.path, &node.gen);
        if self.by_key.get(k.as_ref()) == Some(&ino) {
            self.by_key.remove(k.as_ref());
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_key.len()
    }
}

impl Tree {
    /// What the kernel may hold wrongly once `new` replaces `self`: (parent,
    /// name, ino) of every entry removed, or whose kind, size or time changed.
    pub fn changed_in(&self, new: &Tree) -> Vec<Inval> {
        self.nodes
            .iter()
            .filter(|&(ino, old)| {
                *ino != ROOT_INO
                    && new.nodes.get(ino).is_none_or(|n| {
                        (n.dir, n.size, n.mtime_ns) != (old.dir, old.size, old.mtime_ns)
                    })
            })
            .map(|(&ino, old)| (old.parent, old.name().to_string(), ino))
            .collect()
    }

    /// Keep as orphans what `old` had and this tree lacks: all of it that
    /// just went, and of its orphans those still `open`.
    pub fn keep_orphans(&mut self, old: &Tree, open: &HashSet<u64>) {
        let gone = old
            .nodes
            .iter()
            .chain(old.orphans.iter().filter(|(i, _)| open.contains(i)));
        for (&ino, n) in gone {
            if !self.nodes.contains_key(&ino) && !n.dir {
                self.orphans.insert(ino, n.clone());
            }
        }
    }

    pub fn empty() -> Tree {
        let mut t = Tree {
            version: 0,
            seq: 0,
            nodes: HashTrieMapSync::new_sync(),
            children: HashTrieMapSync::new_sync(),
            orphans: HashMap::new(),
        };
        let root = Node {
            path: String::new(),
            parent: ROOT_INO,
            dir: true,
            size: 0,
            mtime_ns: 0,
            gen: String::new(),
        };
        t.nodes.insert_mut(ROOT_INO, root);
        t.children.insert_mut(ROOT_INO, Dir::new(true));
        t
    }

    /// The inode named `name` in directory `parent`.
    pub fn child(&self, parent: u64, name: &str) -> Option<u64> {
        self.children.get(&parent)?.get(name)
    }

    /// Whether directory `ino` has all its names here (else a lookup that
    /// misses, or a readdir, asks the agent for its listing first).
    pub fn listed(&self, ino: u64) -> bool {
        self.children.get(&ino).is_some_and(|d| d.listed)
    }

    /// Directory `ino` is being looked in: the last to be evicted.
    pub fn touch(&self, ino: u64) {
        if let Some(d) = self.children.get(&ino) {
            d.used.store(USES.fetch_add(1, Relaxed) + 1, Relaxed);
        }
    }

    /// Entries (directories and files) held, the root included.
    pub fn len(&self) -> usize {
        self.nodes.size()
    }

    /// Directory `ino`'s entries from position `offset` of its listing ("."
    /// and ".." first, then the names in order), each with the offset of
    /// the next one: (ino, kind, name, offset). Starts in O(1).
    pub fn dir_entries(
        &self,
        ino: u64,
        offset: u64,
    ) -> Option<impl Iterator<Item = (u64, FileType, &str, u64)>> {
        let (node, dir) = (self.nodes.get(&ino)?, self.children.get(&ino)?);
        let off = usize::try_from(offset).unwrap_or(usize::MAX);
        let dots = [(ino, "."), (node.parent, "..")];
        let dots = dots
            .into_iter()
            .enumerate()
            .skip(off)
            .map(|(k, (i, name))| (i, FileType::Directory, name, k));
        let list = dir.listing();
        let first = off.saturating_sub(2).min(list.len());
        let kids = list[first..].iter().enumerate().map(move |(j, (name, i))| {
            let dir = self.nodes.get(i).is_some_and(|n| n.dir);
            let kind = if dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            (*i, kind, name.as_ref(), first + 2 + j)
        });
        Some(
            dots.chain(kids)
                .map(|(i, kind, name, k)| (i, kind, name, k as u64 + 1)),
        )
    }

    /// A node's attributes: its owner and modes are the mount's (ACCESS).
    pub fn attr(&self, ino: u64) -> Option<FileAttr> {
        let a = ACCESS.get().copied().unwrap_or_default();
        let n = self.nodes.get(&ino).or_else(|| self.orphans.get(&ino))?;
        let t = if n.mtime_ns >= 0 {
            UNIX_EPOCH + Duration::from_nanos(n.mtime_ns as u64)
        } else {
            UNIX_EPOCH - Duration::from_nanos(n.mtime_ns.unsigned_abs())
        };
        Some(FileAttr {
            ino: INodeNo(ino),
            size: n.size,
            blocks: n.size.div_ceil(512),
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind: if n.dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            },
            perm: if n.dir { a.dir_mode } else { a.file_mode },
            nlink: if n.dir { 2 } else { 1 },
            uid: a.uid,
            gid: a.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }
}

#[path = "tests/tree_tests.rs"]
#[cfg(test)]
mod tests;

#[path = "tests/tree_more_tests.rs"]
#[cfg(test)]
mod more_tests;

#[path = "tests/tree_bench_tests.rs"]
#[cfg(test)]
mod bench_tests;
