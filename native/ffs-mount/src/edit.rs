//! `Edit`: a change being made to a fresh clone of a tree (tree.rs), entry
//! by entry, recording what the kernel must forget. Trees, deltas and
//! listings (apply.rs) are made with it.

use std::sync::Arc;

use crate::tree::{key, Dir, InoMap, Inval, Node, Tree, ROOT_INO};
use crate::wire::Entry;

/// A change being made to a fresh clone of a tree.
pub struct Edit<'a> {
    pub t: &'a mut Tree,
    pub inos: &'a mut InoMap,
    pub inval: Vec<Inval>,
    /// The parent directory of the last entry upserted: sorted entries
    /// mostly share it, and a check costs less than a walk from the root.
    pub last_dir: u64,
    /// Whether directories this change makes have all their names in it (a
    /// whole tree's, a delta's new ones) or are to be listed (a lazy tree's,
    /// a listing's subdirectories).
    pub listed: bool,
    /// The directory a listing is of: it takes entries even if not listed
    /// (a "partial" one leaves it so). 0: none.
    pub into: u64,
}

impl Edit<'_> {
    pub fn node(&self, ino: u64) -> Option<&Node> {
        self.t.nodes.get(&ino)
    }

    /// Directory `ino`'s entries, to change: a new `Dir` unless this change
    /// made it (then it is ours alone); either way without a listing.
    pub fn dir_mut(&mut self, ino: u64) -> &mut Dir {
        let d = Arc::make_mut(
            self.t
                .children
                .get_mut(&ino)
                .expect("a directory has its entries"),
        );
        d.listing.take();
        d
    }

    /// The inode at `path` in the tree, if any.
    pub fn resolve(&self, path: &str) -> Option<u64> {
        path.split('/')
            .try_fold(ROOT_INO, |dir, name| self.t.children.get(&dir)?.get(name))
    }

    /// Add `n` as `ino` under its parent (whatever had its name there is
    /// gone already).
    fn insert(&mut self, ino: u64, n: Node) {
        self.dir_mut(n.parent)
            .names
            .insert_mut(Arc::from(n.name()), ino);
        if n.dir && !self.t.children.contains_key(&ino) {
            self.t.children.insert_mut(ino, Dir::new(self.listed));
        }
        self.t.orphans.remove(&ino); // back before its orphan was dropped: the same inode
        self.t.nodes.insert_mut(ino, n);
    }

    /// Whether directory `ino` takes entries: it has all its names in the
    /// tree, or this change is its listing.
    fn listed(&self, ino: u64) -> bool {
        ino == self.into || self.t.children.get(&ino).is_some_and(|d| d.listed)
    }

    /// Make the tree hold `e`: its attributes if the path keeps its inode,
    /// else a new inode in place of the old one. Missing ancestors become
    /// directories; an entry below a file is dropped. A directory not listed
    /// takes no new name (its listing, when asked for, will have it), but
    /// the names it holds are changed like any.
    pub fn upsert(&mut self, e: &Entry) {
        let (mut parent, mut start) = (ROOT_INO, 0);
        if let Some((dir_path, _)) = e.path.rsplit_once('/') {
            if self
                .node(self.last_dir)
                .is_some_and(|n| n.dir && n.path == dir_path)
            {
                (parent, start) = (self.last_dir, dir_path.len() + 1);
            }
        }
        let base = start;
        for (i, _) in e.path[base..].match_indices('/') {
            let i = base + i;
            let name = &e.path[start..i];
            start = i + 1;
            parent = match self.t.children.get(&parent).and_then(|d| d.get(name)) {
                Some(ino) if self.node(ino).is_some_and(|n| n.dir) => ino,
                Some(_) => return,
                None if !self.listed(parent) => return,
                None => {
                    let anc = &e.path[..i];
                    let ino = self.inos.ino(anc);
                    let n = Node {
                        path: anc.to_string(),
                        parent,
                        dir: true,
                        size: 0,
                        mtime_ns: e.mtime_ns,
                        gen: String::new(),
                    };
                    self.insert(ino, n);
                    ino
                }
            };
        }
        self.last_dir = parent;
        let name = &e.path[start..];
        let old = self.t.children.get(&parent).and_then(|d| d.get(name));
        if old.is_none() && !self.listed(parent) {
            return;
        }
        let ino = self.inos.ino(&key(&e.path, &e.gen));
        let new = Node {
            path: e.path.clone(),
            parent,
            dir: e.dir,
            size: e.size,
            mtime_ns: e.mtime_ns,
            gen: e.gen.clone(),
        };
        match old.and_then(|o| Some((o, self.node(o)?.dir))) {
            None => self.insert(ino, new),
            Some((o, was_dir)) if o == ino => {
                let n = self.node(ino).expect("just found");
                if (n.dir, n.size, n.mtime_ns) != (new.dir, new.size, new.mtime_ns) {
                    self.inval.push((parent, name.to_string(), ino));
                }
                if was_dir && !new.dir {
                    let d = self.t.children.get(&ino).cloned();
                    self.t.children.remove_mut(&ino);
                    self.drop_all(d.iter().flat_map(|d| d.names.values().copied()).collect());
                } else if !was_dir && new.dir {
                    self.t.children.insert_mut(ino, Dir::new(self.listed));
                }
                self.t.nodes.insert_mut(ino, new);
            }
            Some((o, true)) if new.dir => {
                // A directory with a new gen: its entries move to the new inode.
                let d = self.t.children.get(&o).cloned().unwrap_or_default();
                if let Some(n) = self.node(o).cloned() {
                    self.inos.forget(&n, o);
                }
                self.t.children.remove_mut(&o);
                self.t.nodes.remove_mut(&o);
                self.inval.push((parent, name.to_string(), o));
                for &c in d.names.values() {
                    if let Some(cn) = self.node(c) {
                        let cn = Node {
                            parent: ino,
                            ..cn.clone()
                        };
                        self.t.nodes.insert_mut(c, cn);
                    }
                }
                self.t.children.insert_mut(ino, d);
                self.insert(ino, new);
            }
            Some((o, _)) => {
                self.remove(o);
                self.insert(ino, new);
            }
        }
    }

    /// `ino` and everything below it leave the tree.
    pub fn remove(&mut self, ino: u64) {
        let Some(n) = self.node(ino).cloned() else {
            return;
        };
        if self.t.children.get(&n.parent).and_then(|d| d.get(n.name())) == Some(ino) {
            self.dir_mut(n.parent).names.remove_mut(n.name());
        }
        self.drop_all(vec![ino]);
    }

    /// Drop these inodes and everything below them (their names are gone
    /// already): files become orphans, directories are forgotten.
    fn drop_all(&mut self, mut stack: Vec<u64>) {
        while let Some(i) = stack.pop() {
            let Some(n) = self.node(i).cloned() else {
                continue;
            };
            self.t.nodes.remove_mut(&i);
            self.inval.push((n.parent, n.name().to_string(), i));
            if n.dir {
                if let Some(d) = self.t.children.get(&i).cloned() {
                    stack.extend(d.names.values());
                    self.t.children.remove_mut(&i);
                }
                self.inos.forget(&n, i);
            } else {
                self.t.orphans.insert(i, n);
            }
        }
    }
}
