//! What comes from the agent: the reader thread dispatches replies by id
//! and records "hot" notices; the applier thread applies trees, deltas and
//! listings in stream order, publishing each as the snapshot FUSE threads
//! read, and answers "stats" after them.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::net::UnixStream;
use std::sync::{mpsc, Arc};

use serde_json::{json, Value};

use crate::agent_link::Reply;
use crate::backing::Hot;
use crate::change::Change;
use crate::shared::Shared;
use crate::tree::{InoMap, Inval, Tree};

/// What the main thread waits for: the first tree (then it mounts), or the end.
pub enum Event {
    FirstTree,
    AgentClosed,
    Signal(i32),
}

/// What the reader hands to the applier thread.
pub enum Apply {
    /// A "tree" or "delta" line, still to parse.
    Line(Vec<u8>),
    /// A "tree", "delta" or "stats" message.
    Msg(Value),
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
        // replies behind it. (Not sent "op" first: parsed here, see below.)
        if [
            &br#"{"op":"tree","#[..],
            br#"{"op":"delta","#,
            br#"{"op":"listing","#,
        ]
        .iter()
        .any(|p| line.starts_with(p))
        {
            handed += 1;
            let _ = apply.send(Apply::Line(std::mem::take(&mut line)));
            continue;
        }
        let v: Value = match serde_json::from_slice(&line) {
            Ok(v) => v,
            Err(e) => {
                eprintln!("ffs-mount: bad message from agent: {e}");
                continue;
            }
        };
        match v.get("op").and_then(Value::as_str) {
            None => {
                // A reply. Read replies carry `len` raw bytes after the line.
                let len = v.get("len").and_then(Value::as_u64).unwrap_or(0) as usize;
                let mut data = vec![0u8; len];
                if r.read_exact(&mut data).is_err() {
                    break;
                }
                if let Some(id) = v.get("id").and_then(Value::as_u64) {
                    s.agent.deliver(
                        id,
                        Reply {
                            v,
                            data,
                            after: handed,
                        },
                    );
                }
            }
            Some("tree" | "delta" | "listing" | "stats") => {
                handed += 1;
                let _ = apply.send(Apply::Msg(v));
            }
            Some("hot") => {
                let (Some(path), Some(hot)) =
                    (v.get("path").and_then(Value::as_str), Hot::from_msg(&v))
                else {
                    continue;
                };
                s.hot
                    .lock()
                    .unwrap()
                    .insert(path.trim_matches('/').to_string(), hot);
            }
            Some(op) => eprintln!("ffs-mount: unknown op from agent: {op}"),
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
    for m in rx {
        let c = match m {
            Apply::Line(l) => Change::parse(&l)
                .inspect_err(|e| eprintln!("ffs-mount: bad message from agent: {e}"))
                .ok(),
            Apply::Msg(v) if v.get("op").and_then(Value::as_str) == Some("stats") => {
                let mut stats = s.stats.json();
                stats["fetch"] = s.fetcher.stats.json();
                stats["agent_timeouts"] =
                    json!(s.agent.timeouts.load(std::sync::atomic::Ordering::Relaxed));
                stats["entries_held"] = json!(s.tree().len());
                stats["kernel_held"] = json!(s.refs.lock().unwrap().len());
                let _ = s.agent.send(&json!({"id": v.get("id"), "stats": stats}));
                None
            }
            Apply::Msg(v) => Some(Change::from_value(&v)),
        };
        if let Some(c) = &c {
            s.stats
                .entries_received
                .fetch_add(c.entries.len() as u64, std::sync::atomic::Ordering::Relaxed);
        }
        match c {
            Some(c) if c.op == "tree" => {
                let (t, changed) = Tree::from_msg(&s.tree(), &c, &mut inos, &s.open_inodes());
                drop(c);
                publish(&s, t, changed, &inval);
                if !have_tree {
                    have_tree = true;
                    let _ = ev.send(Event::FirstTree);
                }
            }
            Some(_) if !have_tree => eprintln!("ffs-mount: delta before the first tree, ignored"),
            Some(c) if c.op == "listing" => {
                let (t, changed) = s.tree().apply_listing(&c, &mut inos);
                publish(&s, t, changed, &inval);
            }
            Some(c) => match s.tree().apply_delta(&c, &mut inos, &s.open_inodes()) {
                Ok((t, changed)) => publish(&s, t, changed, &inval),
                Err(e) => eprintln!("ffs-mount: {e}: ignored"),
            },
            None => {}
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
        s.stats.evicted.fetch_add(
            (t.len() - smaller.len()) as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        drop(t);
        publish(s, smaller, let_go, inval);
    }
}

#[path = "tests/inbound_tests.rs"]
#[cfg(test)]
mod tests;
