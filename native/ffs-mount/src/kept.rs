//! Whole chunks fetched for random readers, kept in one unlinked file.
//!
//! A random reader's small reads of a chunk not at hand are ranged GETs
//! (fast for one read, but each costs a round trip to MinIO); the chunk
//! itself is fetched meanwhile in the background and kept here, so the
//! reader's next reads of it are local. The file holds `slots` slots of the
//! largest chunk size; the oldest kept chunk is written over first. A chunk
//! is found by its xxh3 and length — what was checked is what is kept, so
//! nothing kept is ever stale or another file's. The file is made with
//! O_TMPFILE: it has no name and goes with the daemon, however it ends.

use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use serde_json::{json, Value};

/// A kept chunk's identity: its xxh3 and its length.
pub type Id = (u64, u64);

pub struct Kept {
    file: File,
    slot: u64,
    map: Mutex<Slots>,
    pub hits: AtomicU64,
    pub kept: AtomicU64,
}

struct Slots {
    at: HashMap<Id, usize>,
    order: VecDeque<Id>,
    free: Vec<usize>,
}

impl Kept {
    /// A store of `bytes` (at least one slot of `slot` bytes) in an unnamed
    /// file under `dir`.
    pub fn open(dir: &Path, bytes: u64, slot: u64) -> io::Result<Kept> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_TMPFILE)
            .open(dir)?;
        let slots = (bytes / slot).max(1) as usize;
        Ok(Kept {
            file,
            slot,
            map: Mutex::new(Slots {
                at: HashMap::new(),
                order: VecDeque::new(),
                free: (0..slots).rev().collect(),
            }),
            hits: AtomicU64::new(0),
            kept: AtomicU64::new(0),
        })
    }

    pub fn has(&self, id: Id) -> bool {
        self.map.lock().unwrap().at.contains_key(&id)
    }

    /// Bytes [from, to) of a kept chunk. Read under the lock: a slot is
    /// written over only after it left the map, under the same lock.
    pub fn read(&self, id: Id, from: u64, to: u64) -> Option<Vec<u8>> {
        let map = self.map.lock().unwrap();
        let s = *map.at.get(&id)?;
        let mut buf = vec![0u8; (to - from) as usize];
        self.file
            .read_exact_at(&mut buf, s as u64 * self.slot + from)
            .ok()?;
        drop(map);
        self.hits.fetch_add(1, Relaxed);
        Some(buf)
    }

    /// Keep a checked chunk (one longer than a slot is not kept).
    pub fn put(&self, id: Id, data: &[u8]) {
        if data.len() as u64 > self.slot || data.len() as u64 != id.1 {
            return;
        }
        let s = {
            let mut map = self.map.lock().unwrap();
            if map.at.contains_key(&id) {
                return;
            }
            match map.free.pop() {
                Some(s) => s,
                None => {
                    let Some(old) = map.order.pop_front() else {
                        return; // every slot is being written
                    };
                    map.at.remove(&old).expect("kept in order and in the map")
                }
            }
        };
        let done = self.file.write_all_at(data, s as u64 * self.slot);
        let mut map = self.map.lock().unwrap();
        match done {
            Ok(()) => {
                map.at.insert(id, s);
                map.order.push_back(id);
                self.kept.fetch_add(1, Relaxed);
            }
            Err(e) => {
                map.free.push(s);
                eprintln!("ffs-mount: keeping a chunk for random reads: {e}");
            }
        }
    }

    pub fn json(&self) -> Value {
        let map = self.map.lock().unwrap();
        json!({"chunks": map.at.len(), "slots": map.at.len() + map.free.len(),
               "hits": self.hits.load(Relaxed), "kept": self.kept.load(Relaxed)})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(slots: u64) -> Kept {
        Kept::open(&std::env::temp_dir(), slots * 8, 8).unwrap()
    }

    #[test]
    fn keeps_ranges_of_what_it_was_given_and_writes_over_the_oldest() {
        let k = store(2);
        k.put((1, 8), b"abcdefgh");
        k.put((2, 5), b"ijklm");
        assert_eq!(k.read((1, 8), 2, 5).unwrap(), b"cde");
        assert_eq!(k.read((2, 5), 0, 5).unwrap(), b"ijklm");
        k.put((3, 3), b"xyz"); // the oldest (1) goes
        assert!(k.read((1, 8), 0, 1).is_none());
        assert_eq!(k.read((3, 3), 0, 3).unwrap(), b"xyz");
        assert_eq!(k.read((2, 5), 4, 5).unwrap(), b"m");
        assert_eq!(k.hits.load(Relaxed), 4);
    }

    #[test]
    fn refuses_what_does_not_fit_or_is_not_its_length() {
        let k = store(1);
        k.put((1, 9), b"123456789"); // longer than a slot
        k.put((2, 4), b"12345"); // not the length it is kept as
        assert!(!k.has((1, 9)) && !k.has((2, 4)));
        assert_eq!(k.json()["chunks"], 0);
    }
}
