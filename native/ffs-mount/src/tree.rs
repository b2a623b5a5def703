//! Immutable metadata snapshots built from the agent's "tree" messages.
//!
//! Each tree message produces a fresh `Tree`; readers swap an `Arc` so FUSE
//! threads never block on a rebuild. Inode numbers come from `InoMap`, which
//! only ever grows: a path keeps its inode across versions while its "gen"
//! stays (a file replaced is a new inode, as a file renamed over is on a
//! local disk: handles open on the old one keep reading it), and an inode is
//! never handed to another path (the kernel may still cache old ones).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{FileAttr, FileType, INodeNo};
use serde_json::Value;

pub const ROOT_INO: u64 = 1;

#[derive(Clone)]
pub struct Node {
    pub path: String,
    pub parent: u64,
    pub dir: bool,
    pub size: u64,
    pub mtime_ns: i64,
    pub gen: String,
}

pub struct Tree {
    pub version: u64,
    pub nodes: HashMap<u64, Node>,
    /// Directory inode -> children by name (BTreeMap: stable readdir order).
    pub children: HashMap<u64, BTreeMap<String, u64>>,
    /// Files gone from the tree (replaced or removed) in its last change, or
    /// still open: no name leads to them, but their attributes stay (fstat
    /// of an open handle, a getattr racing the change); opening one fails
    /// with ESTALE, so the kernel looks the path up again.
    pub orphans: HashMap<u64, Node>,
}

pub struct InoMap {
    by_path: HashMap<String, u64>,
    next: u64,
}

impl InoMap {
    pub fn new() -> Self {
        let mut by_path = HashMap::new();
        by_path.insert(String::new(), ROOT_INO);
        InoMap {
            by_path,
            next: ROOT_INO + 1,
        }
    }

    fn ino(&mut self, path: &str) -> u64 {
        if let Some(&i) = self.by_path.get(path) {
            return i;
        }
        let i = self.next;
        self.next += 1;
        self.by_path.insert(path.to_string(), i);
        i
    }
}

impl Tree {
    /// What the kernel may hold wrongly once `new` replaces `self`: (parent,
    /// name, ino) of every entry removed, or whose kind, size or time changed.
    pub fn changed_in(&self, new: &Tree) -> Vec<(u64, String, u64)> {
        self.nodes
            .iter()
            .filter(|&(ino, old)| {
                *ino != ROOT_INO
                    && new.nodes.get(ino).is_none_or(|n| {
                        (n.dir, n.size, n.mtime_ns) != (old.dir, old.size, old.mtime_ns)
                    })
            })
            .map(|(&ino, old)| {
                let name = old.path.rsplit('/').next().unwrap_or_default().to_string();
                (old.parent, name, ino)
            })
            .collect()
    }

    /// Keep as orphans what `old` had and this tree lacks: all of it that
    /// just went, and of its orphans those still `open`.
    pub fn keep_orphans(&mut self, old: &Tree, open: &HashSet<u64>) {
        let gone = old.nodes.iter().chain(old.orphans.iter().filter(|(i, _)| open.contains(i)));
        for (&ino, n) in gone {
            if !self.nodes.contains_key(&ino) && !n.dir {
                self.orphans.insert(ino, n.clone());
            }
        }
    }

    pub fn empty() -> Tree {
        let mut t = Tree {
            version: 0,
            nodes: HashMap::new(),
            children: HashMap::new(),
            orphans: HashMap::new(),
        };
        t.nodes.insert(
            ROOT_INO,
            Node {
                path: String::new(),
                parent: ROOT_INO,
                dir: true,
                size: 0,
                mtime_ns: 0,
                gen: String::new(),
            },
        );
        t.children.insert(ROOT_INO, BTreeMap::new());
        t
    }

    /// Build from a {"op":"tree","version":V,"entries":[...]} message.
    /// Missing parent directories are created implicitly; entries whose
    /// ancestor is declared as a file are dropped (they cannot be reached).
    pub fn from_msg(msg: &Value, inos: &mut InoMap) -> Tree {
        let mut t = Tree::empty();
        t.version = msg.get("version").and_then(Value::as_u64).unwrap_or(0);
        let empty = Vec::new();
        let entries = msg
            .get("entries")
            .and_then(Value::as_array)
            .unwrap_or(&empty);
        // Declared entries first, so implicit parents never override real metadata.
        let mut declared: HashMap<String, (bool, u64, i64, String)> = HashMap::new();
        for e in entries {
            let Some(p) = e.get("path").and_then(Value::as_str) else {
                continue;
            };
            let p = p.trim_matches('/');
            if p.is_empty() || p.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
                continue;
            }
            let dir = e.get("dir").and_then(Value::as_bool).unwrap_or(false);
            let size = if dir {
                0
            } else {
                e.get("size").and_then(Value::as_u64).unwrap_or(0)
            };
            let mtime = e.get("mtime_ns").and_then(Value::as_i64).unwrap_or(0);
            let gen = e.get("gen").and_then(Value::as_str).unwrap_or_default().to_string();
            declared.insert(p.to_string(), (dir, size, mtime, gen));
        }
        let mut paths: Vec<&String> = declared.keys().collect();
        paths.sort(); // parents sort before their children
        'entry: for p in paths {
            let (dir, size, mtime, ref gen) = declared[p];
            // Ensure ancestors exist as directories.
            let mut parent = ROOT_INO;
            let comps: Vec<&str> = p.split('/').collect();
            for k in 1..comps.len() {
                let anc = comps[..k].join("/");
                let ino = inos.ino(&anc);
                match t.nodes.get(&ino) {
                    Some(n) if !n.dir => continue 'entry,
                    Some(_) => {}
                    // Declared ancestors sort (and were added) before `p`,
                    // so a missing one is undeclared: create it implicitly.
                    None => t.add(
                        ino,
                        Node {
                            path: anc,
                            parent,
                            dir: true,
                            size: 0,
                            mtime_ns: mtime,
                            gen: String::new(),
                        },
                    ),
                }
                parent = ino;
            }
            let ino = if gen.is_empty() { inos.ino(p) } else { inos.ino(&format!("{p}\0{gen}")) };
            t.add(
                ino,
                Node {
                    path: p.clone(),
                    parent,
                    dir,
                    size,
                    mtime_ns: mtime,
                    gen: gen.clone(),
                },
            );
        }
        t
    }

    fn add(&mut self, ino: u64, n: Node) {
        let name = n.path.rsplit('/').next().unwrap_or("").to_string();
        self.children.entry(n.parent).or_default().insert(name, ino);
        if n.dir {
            self.children.entry(ino).or_default();
        }
        self.nodes.insert(ino, n);
    }

    pub fn attr(&self, ino: u64) -> Option<FileAttr> {
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
            perm: if n.dir { 0o555 } else { 0o444 },
            nlink: if n.dir { 2 } else { 1 },
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }
}
