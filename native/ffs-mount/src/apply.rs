//! The agent's messages applied to a tree: a whole "tree", a "delta" and a
//! "listing", each making a new `Tree` (with `Edit`, edit.rs) and saying
//! what the kernel must forget.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::change::dir_path;
use crate::edit::Edit;
use crate::tree::{Dir, InoMap, Inval, Tree, ROOT_INO};
use crate::wire::{DeltaMsg, ListingMsg, TreeMsg};

impl Tree {
    /// The tree of a {"op":"tree","version":V,"entries":[...]} message, which
    /// replaces `old` (open: inodes with handles open), and what the kernel
    /// must forget. Missing parent directories are created implicitly;
    /// entries whose ancestor is declared as a file are dropped (they cannot
    /// be reached).
    pub fn from_msg(
        old: &Tree,
        msg: &TreeMsg,
        inos: &mut InoMap,
        open: &HashSet<u64>,
    ) -> (Tree, Vec<Inval>) {
        let mut t = Tree::empty();
        t.version = msg.version;
        t.seq = old.seq + 1;
        t.children.insert_mut(ROOT_INO, Dir::new(!msg.lazy));
        let mut ed = Edit {
            t: &mut t,
            inos,
            inval: Vec::new(),
            last_dir: ROOT_INO,
            listed: !msg.lazy,
            into: 0,
        };
        // Sorted: declared parents come first, so implicit ones never override real metadata.
        for e in &msg.entries {
            ed.upsert(e);
        }
        t.keep_orphans(old, open);
        inos.by_key
            .retain(|_, i| t.nodes.contains_key(i) || t.orphans.contains_key(i));
        let inval = old.changed_in(&t);
        (t, inval)
    }

    /// `self` changed by a {"op":"delta","version":V,"since":S,"entries":[...],
    /// "gone":[...]} message, and what the kernel must forget; Err if S is
    /// not this tree's version. Costs O(delta * log tree), plus the orphans
    /// of the last change.
    pub fn apply_delta(
        &self,
        msg: &DeltaMsg,
        inos: &mut InoMap,
        open: &HashSet<u64>,
    ) -> Result<(Tree, Vec<Inval>), String> {
        if msg.since != Some(self.version) {
            let since = msg.since.map_or("none".to_string(), |s| s.to_string());
            return Err(format!(
                "delta since {since}, but the tree is version {}",
                self.version
            ));
        }
        let mut t = Tree {
            version: msg.version,
            seq: self.seq + 1,
            nodes: self.nodes.clone(),
            children: self.children.clone(),
            orphans: HashMap::new(),
        };
        let mut ed = Edit {
            t: &mut t,
            inos,
            inval: Vec::new(),
            last_dir: ROOT_INO,
            listed: true, // a directory new in a delta: every name in it came in deltas
            into: 0,
        };
        // Removals first: a path gone as a file may come back as a directory.
        for p in &msg.gone {
            if let Some(ino) = ed.resolve(p) {
                ed.remove(ino);
            }
        }
        for e in &msg.entries {
            ed.upsert(e);
        }
        if !msg.exact.is_empty() {
            let sent: HashSet<&str> = msg.entries.iter().map(|e| e.path.as_str()).collect();
            for p in &msg.exact {
                let mut stack: Vec<u64> = ed.resolve(p).into_iter().collect();
                while let Some(d) = stack.pop() {
                    let kids =
                        ed.t.children
                            .get(&d)
                            .map_or(Vec::new(), |d| d.names.values().copied().collect());
                    for k in kids {
                        match ed.node(k).map(|n| (sent.contains(n.path.as_str()), n.dir)) {
                            Some((false, _)) => ed.remove(k),
                            Some((true, true)) => stack.push(k),
                            _ => {}
                        }
                    }
                }
            }
        }
        let inval = ed.inval;
        // The last change's orphans stay while open; the others go for good.
        for (&ino, n) in &self.orphans {
            if t.nodes.contains_key(&ino) || t.orphans.contains_key(&ino) {
                continue;
            }
            if open.contains(&ino) {
                t.orphans.insert(ino, n.clone());
            } else {
                inos.forget(n, ino);
            }
        }
        Ok((t, inval))
    }

    /// `self` with directory `msg.path` listed: its names become those of
    /// a {"op":"listing","path":P,"entries":[...]} message (its children;
    /// their subdirectories are not listed, unless they were), and what the
    /// kernel must forget; with "partial" its entries are added, the others
    /// kept, and the directory stays as listed as it was. Nothing changes if
    /// P is no directory here (gone meanwhile). Costs O(listing * log tree).
    pub fn apply_listing(&self, msg: &ListingMsg, inos: &mut InoMap) -> (Tree, Vec<Inval>) {
        let mut t = Tree {
            seq: self.seq + 1,
            ..self.clone()
        };
        let path = dir_path(&msg.path);
        let dir = match path {
            Some("") => Some(ROOT_INO),
            Some(p) => p
                .split('/')
                .try_fold(ROOT_INO, |d, name| self.children.get(&d)?.get(name))
                .filter(|i| self.children.contains_key(i)),
            None => None,
        };
        let Some(dir) = dir else {
            return (t, Vec::new());
        };
        let prefix = path.map_or(String::new(), |p| {
            if p.is_empty() {
                String::new()
            } else {
                format!("{p}/")
            }
        });
        let before: Vec<(Arc<str>, u64)> = t.children.get(&dir).map_or(Vec::new(), |d| {
            d.names.iter().map(|(n, &i)| (n.clone(), i)).collect()
        });
        let mut ed = Edit {
            t: &mut t,
            inos,
            inval: Vec::new(),
            last_dir: dir,
            listed: false,
            into: dir,
        };
        if !msg.partial {
            ed.dir_mut(dir).listed = true;
        }
        let mut kept = HashSet::new();
        for e in &msg.entries {
            // its children only, each at most one level below
            if let Some(name) = e
                .path
                .strip_prefix(prefix.as_str())
                .filter(|n| !n.contains('/'))
            {
                ed.upsert(e);
                kept.insert(name);
            }
        }
        for (name, ino) in before {
            if !msg.partial && !kept.contains(name.as_ref()) {
                ed.remove(ino);
            }
        }
        let inval = ed.inval;
        (t, inval)
    }
}
