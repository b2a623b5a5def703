//! What comes from the agent: the reader thread dispatches replies by id
//! and records "hot" notices; the applier thread applies trees, deltas and
//! listings in stream order, publishing each as the snapshot FUSE threads
//! read, and answers "stats" after them.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{mpsc, Arc};

use crate::backing::Hot;
use crate::shared::Shared;
use crate::tree::{InoMap, Inval, Tree};
use crate::wire::{self, DeltaMsg, Frame, HotMsg, ListingMsg, Notice, StatsMsg, TreeMsg};

/// What the main thread waits for: the first tree (then it mounts), or the end.
pub enum Event {
    FirstTree,
    AgentClosed,
    Signal(i32),
}

/// What the reader hands to the applier thread.
pub enum Apply {
    /// A "tree", "delta" or "listing" line, still to parse.
    Line(Notice, Vec<u8>),
    Stats(StatsMsg),
}

/// Reader thread: dispatches replies by id and applies unsolicited messages,
/// but hands trees, deltas and stats to the applier thread, in order.
pub fn reader(
    sock: UnixStream,
    s: Arc<Shared>,
    ev: mpsc::Sender<Event>,
    apply: mpsc::Sender<Apply>,
) {
    let mut r = BufReader::with_capacity(1 << 20, sock);
    let mut handed = 0u64; // messages handed to the applier
    let mut line = Vec::new();
    loop {
        line.clear();
        match r.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        // Parsed by the applier: a big tree parsed here would hold up the
        // replies behind it. (Not sent "op" first: its frame is read here.)
        let prefixed = Notice::PREFIXES.iter().find(|(p, _)| line.starts_with(p));
        if let Some(&(_, n)) = prefixed {
            handed += 1;
            let _ = apply.send(Apply::Line(n, std::mem::take(&mut line)));
            continue;
        }
        let Some(f) = wire::parse::<Frame>(&line, "message") else {
            continue;
        };
        let Some(op) = f.op else {
            // A reply. Read replies carry `len` raw bytes after the line.
            let mut data = vec![0u8; f.len.unwrap_or(0) as usize];
            if r.read_exact(&mut data).is_err() {
                break;
            }
            if let Some(id) = f.id {
                s.agent.deliver(id, &line, data, handed);
            }
            continue;
        };
        match Notice::of(&op) {
            Some(n @ (Notice::Tree | Notice::Delta | Notice::Listing)) => {
                handed += 1;
                let _ = apply.send(Apply::Line(n, std::mem::take(&mut line)));
            }
            Some(Notice::Stats) => {
                if let Some(m) = wire::parse::<StatsMsg>(&line, "stats") {
                    handed += 1;
                    let _ = apply.send(Apply::Stats(m));
                }
            }
            Some(Notice::Hot) => {
                if let Some(m) = wire::parse::<HotMsg>(&line, "hot") {
                    let path = m.path.trim_matches('/').to_string();
                    s.hot.lock().unwrap().insert(path, Hot::from(&m.hot));
                }
            }
            None => eprintln!("ffs-mount: unknown op from agent: {op}"),
        }
    }
    s.agent.close();
    let _ = ev.send(Event::AgentClosed);
}

/// Applier thread: applies trees and deltas in stream order, publishing each
/// result as the snapshot FUSE threads read, and answers "stats" after them.
pub fn applier(
    rx: mpsc::Receiver<Apply>,
    s: Arc<Shared>,
    ev: mpsc::Sender<Event>,
    inval: mpsc::Sender<Vec<Inval>>,
) {
    let mut inos = InoMap::new();
    let mut have_tree = false;
    let received = |n: usize| s.stats.entries_received.fetch_add(n as u64, Relaxed);
    for m in rx {
        match m {
            Apply::Stats(m) => {
                let stats = s.stats.counters(
                    s.fetcher.stats.counters(),
                    s.agent.timeouts.load(Relaxed),
                    s.tree().len() as u64,
                    s.refs.lock().unwrap().len() as u64,
                );
                let _ = s.agent.send(&wire::StatsReply { id: m.id, stats });
            }
            Apply::Line(Notice::Tree, l) => {
                let m = wire::parse::<TreeMsg>(&l, "tree");
                drop(l);
                if let Some(m) = m {
                    received(m.entries.len());
                    let (t, changed) = Tree::from_msg(&s.tree(), &m, &mut inos, &s.open_inodes());
                    drop(m);
                    publish(&s, t, changed, &inval);
                    if !have_tree {
                        have_tree = true;
                        let _ = ev.send(Event::FirstTree);
                    }
                }
            }
            Apply::Line(Notice::Listing, l) => {
                let m = wire::parse::<ListingMsg>(&l, "listing");
                drop(l);
                if let Some(m) = m {
                    received(m.entries.len());
                    if !have_tree {
                        eprintln!("ffs-mount: listing before the first tree, ignored");
                    } else {
                        let (t, changed) = s.tree().apply_listing(&m, &mut inos);
                        publish(&s, t, changed, &inval);
                    }
                }
            }
            Apply::Line(_, l) => {
                let m = wire::parse::<DeltaMsg>(&l, "delta");
                drop(l);
                if let Some(m) = m {
                    received(m.entries.len());
                    if !have_tree {
                        eprintln!("ffs-mount: delta before the first tree, ignored");
                    } else {
                        match s.tree().apply_delta(&m, &mut inos, &s.open_inodes()) {
                            Ok((t, changed)) => publish(&s, t, changed, &inval),
                            Err(e) => eprintln!("ffs-mount: {e}: ignored"),
                        }
                    }
                }
            }
        }
        evict(&s, &mut inos, &inval);
        s.agent.applied_one();
    }
}

/// Make `t` the tree FUSE threads see.
fn publish(s: &Shared, t: Tree, changed: Vec<Inval>, inval: &mpsc::Sender<Vec<Inval>>) {
    let seq = t.seq;
    let old = std::mem::replace(&mut *s.tree.write().unwrap(), Arc::new(t));
    s.misses.lock().unwrap().reset(seq);
    // Not from this thread: an invalidation waits for the directory locks
    // of requests in flight, which may wait for a reply (a refresh) that
    // waits for this thread.
    let _ = inval.send(changed);
    drop(old); // here, rather than in a FUSE thread, unless one still holds it
}

/// Keep the tree within --max-entries: the least recently used directories
/// lose the names the kernel does not hold (see Tree::evict), under `refs`,
/// so no lookup hands out an inode meanwhile.
fn evict(s: &Shared, inos: &mut InoMap, inval: &mpsc::Sender<Vec<Inval>>) {
    if s.max_entries == 0 || s.tree().len() <= s.max_entries {
        return;
    }
    let refs = s.refs.lock().unwrap();
    let open = s.open_inodes();
    let t = s.tree();
    let held = |i: u64| refs.contains_key(&i) || open.contains(&i);
    if let Some((smaller, let_go)) = t.evict(s.max_entries, held, inos) {
        s.stats
            .evicted
            .fetch_add((t.len() - smaller.len()) as u64, Relaxed);
        drop(t);
        publish(s, smaller, let_go, inval);
    }
}

#[path = "tests/inbound_tests.rs"]
#[cfg(test)]
mod tests;
