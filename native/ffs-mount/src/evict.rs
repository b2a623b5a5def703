//! Keeping the tree within --max-entries: the directories looked in longest
//! ago lose the names the kernel holds no lookup of.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use crate::tree::{InoMap, Inval, Tree};

impl Tree {
    /// Past `max` entries: the tree without the names of the directories
    /// used longest ago, until it holds about nine tenths of `max`, and the
    /// entries the kernel should let go of; None if within `max`. Each
    /// directory evicted is no longer listed (its next readdir asks the agent
    /// again); it keeps the names `kept` says the kernel holds (their inodes
    /// must stay valid: it is told to drop them, and they go at a later
    /// eviction once forgotten) and its subdirectories that still have names.
    /// What goes is forgotten by `inos`. Orphans stay as they are.
    pub fn evict(
        &self,
        max: usize,
        kept: impl Fn(u64) -> bool,
        inos: &mut InoMap,
    ) -> Option<(Tree, Vec<Inval>)> {
        if self.len() <= max {
            return None;
        }
        let mut dirs: Vec<(u64, u64)> = self
            .children
            .iter()
            .filter(|(_, d)| !d.names.is_empty())
            .map(|(&i, d)| (d.used.load(Relaxed), i))
            .collect();
        dirs.sort_unstable();
        let mut excess = self.len() - max / 10 * 9;
        let mut t = self.clone();
        let mut inval = Vec::new();
        for (_, d) in dirs {
            if excess == 0 {
                break;
            }
            let mut dir = (**t.children.get(&d).expect("a directory")).clone();
            dir.listed = false;
            for (name, &c) in self.children[&d].names.iter() {
                let n = &t.nodes[&c];
                let has_names = n.dir && t.children.get(&c).is_some_and(|cd| !cd.names.is_empty());
                if kept(c) || has_names {
                    inval.push((d, name.to_string(), 0));
                    continue;
                }
                inos.forget(n, c);
                excess = excess.saturating_sub(1);
                dir.names.remove_mut(name);
                t.nodes.remove_mut(&c);
                t.children.remove_mut(&c);
            }
            t.children.insert_mut(d, Arc::new(dir));
        }
        Some((t, inval))
    }
}
