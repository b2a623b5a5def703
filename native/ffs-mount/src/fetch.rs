//! Misses served by the daemon itself: the chunks of an agent-opened file
//! fetched from a holder's MinIO with GETs the agent presigned at open (the
//! daemon holds no key, only URLs that read those objects for a while), each
//! checked against the manifest's xxh3 before a byte of it is served.
//!
//! The sockets carry no mark, so the kernel counts these GETs as a reader's
//! and makes the chunks hot as before; the agent keeps policy and the
//! namespace, and is asked for bytes only when every holder failed here.
//! A handle keeps a few chunks in a window; a reader that continues where
//! its last read ended gets the next chunks fetched ahead, while fewer than
//! `MAX_AHEAD_FETCHES` such fetches run daemon-wide (more would only take
//! the cores and the link from the reads that wait). A random reader's
//! first small reads are ranged GETs; once they have touched `SWEEP_AFTER`
//! chunks, the whole file is swept into the handle's memory in the
//! background (within the daemon's `--sweep-mb`), as s3fs reads whole parts:
//! a ranged GET costs MinIO about what a whole 4 MiB chunk does, so a
//! reader that touches every chunk is served soonest by fetching each once.
//!
//! Here: a handle's `Remote` and its reads. The GETs and their checks are
//! fetcher.rs's, sweeps sweep.rs's, read-ahead readahead.rs's.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::fetcher::{Chunk, Fetcher, Shard};
use crate::http::Url;
use crate::wire;

/// Chunks fetched ahead of a sequential reader, per handle.
pub const AHEAD: usize = 2;
/// A read this small, of a chunk not at hand, fetches only its range (a
/// random reader would otherwise fetch a whole chunk per read; a sequential
/// one's requests are the kernel's read-ahead, larger).
const SMALL_READ: u64 = 32 << 10;
/// How far from where the last read ended a read still counts as sequential.
const NEAR: u64 = 1 << 20;
/// Chunks a handle keeps (the one being read, the ones ahead, one behind).
const WINDOW: usize = AHEAD + 2;
/// How often a handle's reads ask the agent what of its file is cached now,
/// while answers bring news; each answer without news doubles the wait up to
/// ASK_CACHED_MAX (a cold sequential pass fills nothing: ~50 asks a second of
/// the Python agent for nothing, a fifth of the mount's CPU per GB).
const ASK_CACHED: Duration = Duration::from_millis(25);
const ASK_CACHED_MAX: Duration = Duration::from_secs(1);

/// The URLs this daemon can GET (http://; https stays with the agent).
fn urls(us: &[String]) -> Vec<Url> {
    us.iter().filter_map(|u| Url::parse(u)).collect()
}

/// Where an agent-opened file's bytes are: its chunks in file order, each
/// with its holders' presigned URLs, preferred first (the "fetch" object of
/// an open reply).
pub struct Remote {
    pub chunks: Vec<Chunk>,
    pub size: u64,
    /// When the agent was last asked what of the file is cached here now,
    /// and the wait before the next ask.
    asked: Mutex<(Option<Instant>, Duration)>,
    pub window: Mutex<Window>,
    landed: Condvar,
    /// The daemon's sweep budget this handle holds (its file's size) while
    /// its file is swept; given back when the handle goes.
    pub swept: Mutex<Option<Arc<AtomicU64>>>,
    /// Chunks in this host's cache when the file was opened: a sweep leaves
    /// them (their reads are served from the cache entry, and a GET would
    /// count them again).
    pub here: Vec<bool>,
}

#[derive(Default)]
pub struct Window {
    pub have: HashMap<usize, Arc<Vec<u8>>>,
    order: VecDeque<usize>,
    pub fetching: HashSet<usize>,
    /// Chunks small reads elsewhere than where the last read ended touched
    /// while not at hand (up to SWEEP_AFTER), and whether the file is swept:
    /// then every chunk landed is kept until the handle goes.
    pub touched: HashSet<usize>,
    pub sweeping: bool,
    /// Where the last read ended: a read starting near it is sequential (so
    /// is a first read from the start).
    next: Option<u64>,
}

/// Bytes a read gets: a slice of a chunk at hand, or bytes of their own.
pub enum Got {
    Shared(Arc<Vec<u8>>, usize, usize),
    Owned(Vec<u8>),
}

impl Got {
    pub fn bytes(&self) -> &[u8] {
        match self {
            Got::Shared(d, a, b) => &d[*a..*b],
            Got::Owned(v) => v,
        }
    }
}

impl Remote {
    /// From the "fetch" object of an open reply; None if it describes
    /// nothing this daemon can fetch (then reads go to the agent).
    pub fn from_msg(f: &wire::Fetch, size: u64) -> Option<Remote> {
        let mut chunks = Vec::new();
        for c in &f.chunks {
            let mut shards = Vec::new();
            for s in &c.shards {
                let urls = urls(&s.urls);
                if urls.is_empty() {
                    return None;
                }
                shards.push(Shard {
                    bytes: s.bytes,
                    xxh3: s.xxh3,
                    urls,
                });
            }
            let urls = urls(&c.urls);
            if urls.is_empty() == shards.is_empty() {
                return None; // one way to its bytes: copies or shards
            }
            chunks.push(Chunk {
                start: c.start,
                bytes: c.bytes,
                xxh3: c.xxh3,
                urls,
                shards,
            });
        }
        // Contiguous from 0 to the file's size, or it is not this file.
        let mut at = 0;
        for c in &chunks {
            if c.start != at {
                return None;
            }
            at += c.bytes;
        }
        (at == size).then(|| Remote {
            chunks,
            size,
            asked: Mutex::new((None, ASK_CACHED)),
            window: Mutex::new(Window::default()),
            landed: Condvar::new(),
            swept: Mutex::new(None),
            here: Vec::new(),
        })
    }

    /// Marks the chunks that lie wholly in `ranges` ([start, end) byte
    /// ranges of the file in this host's cache, sorted and disjoint, as
    /// `Cached` keeps them): no sweep fetches them. A binary search a chunk:
    /// a file of many chunks, many cached, costs no scan of every range each.
    pub fn cached_here(mut self, ranges: &[(u64, u64)]) -> Remote {
        self.here = self
            .chunks
            .iter()
            .map(|c| {
                let i = ranges.partition_point(|&(a, _)| a <= c.start);
                i > 0 && c.start + c.bytes <= ranges[i - 1].1
            })
            .collect();
        self
    }

    /// Bytes [offset, offset+size) (fewer at the end of the file); None if a
    /// chunk could be had from no holder (the caller asks the agent).
    pub fn read(self: &Arc<Self>, f: &Arc<Fetcher>, offset: u64, size: u32) -> Option<Got> {
        let end = (offset + size as u64).min(self.size);
        if offset >= end {
            return Some(Got::Owned(Vec::new())); // at or past the end (an empty file has no chunk)
        }
        let sequential = {
            // near where the last read ended: the kernel's read-ahead sends a
            // sequential reader's requests on several threads, not in order
            let mut w = self.window.lock().unwrap();
            let seq = w.next.map_or(offset == 0, |n| offset.abs_diff(n) <= NEAR);
            w.next = Some(end.max(offset));
            seq
        };
        let mut k = self
            .chunks
            .partition_point(|c| c.start <= offset)
            .saturating_sub(1);
        // a small read of a chunk not here: its range, unless a random reader's file is swept
        if end - offset <= SMALL_READ && self.away(k, end) && (sequential || !self.swept(f, k)) {
            let c = &self.chunks[k];
            if let Some(out) = f.range(c, offset - c.start, end - c.start) {
                return Some(f.served(Got::Owned(out)));
            }
        }
        let c = &self.chunks[k];
        let got = if end <= c.start + c.bytes {
            // within one chunk (most reads): served from it without a copy
            let data = self.chunk(f, k)?;
            Got::Shared(data, (offset - c.start) as usize, (end - c.start) as usize)
        } else {
            let mut out = Vec::with_capacity((end - offset) as usize);
            let mut pos = offset;
            while pos < end {
                let c = &self.chunks[k];
                let data = self.chunk(f, k)?;
                let to = ((end - c.start) as usize).min(data.len());
                out.extend_from_slice(&data[(pos - c.start) as usize..to]);
                pos = c.start + to as u64;
                if pos < end {
                    k += 1;
                }
            }
            Got::Owned(out)
        };
        if sequential && end - offset > SMALL_READ {
            for j in k + 1..(k + 1 + f.ahead).min(self.chunks.len()) {
                self.ahead(f, j);
            }
        }
        Some(f.served(got))
    }

    /// Whether to ask the agent what of the file is cached here now (chunks
    /// are filled while it is read: the kernel made them hot): at most once
    /// per wait, the first time one wait after the open (whose reply said
    /// what was cached then).
    pub fn ask_cached(&self) -> bool {
        let mut asked = self.asked.lock().unwrap();
        let now = Instant::now();
        match asked.0 {
            Some(t) if now.duration_since(t) < asked.1 => false,
            Some(_) => {
                asked.0 = Some(now);
                true
            }
            None => {
                asked.0 = Some(now);
                false
            }
        }
    }

    /// What the last ask brought: news keeps the asks frequent, none spaces
    /// them out.
    pub fn answered(&self, news: bool) {
        let mut asked = self.asked.lock().unwrap();
        asked.1 = match news {
            true => ASK_CACHED,
            false => (asked.1 * 2).min(ASK_CACHED_MAX),
        };
    }

    /// Whether every chunk of bytes [offset, offset+size) is in the window
    /// (a read then waits on nothing).
    pub fn at_hand(&self, offset: u64, size: u32) -> bool {
        let end = (offset + size as u64).min(self.size);
        let first = self
            .chunks
            .partition_point(|c| c.start <= offset)
            .saturating_sub(1);
        let last = self
            .chunks
            .partition_point(|c| c.start < end)
            .saturating_sub(1);
        let w = self.window.lock().unwrap();
        offset >= end || (first..=last).all(|k| w.have.contains_key(&k))
    }

    /// Whether bytes up to `end` lie in chunk k, and it is neither at hand nor
    /// on its way.
    fn away(&self, k: usize, end: u64) -> bool {
        let c = &self.chunks[k];
        let w = self.window.lock().unwrap();
        end <= c.start + c.bytes && !w.have.contains_key(&k) && !w.fetching.contains(&k)
    }

    /// Chunk k: from the window, after a fetch of it already under way, or
    /// fetched now by this thread.
    fn chunk(&self, f: &Fetcher, k: usize) -> Option<Arc<Vec<u8>>> {
        let mut w = self.window.lock().unwrap();
        loop {
            if let Some(d) = w.have.get(&k) {
                return Some(d.clone());
            }
            if !w.fetching.contains(&k) {
                break;
            }
            w = self.landed.wait(w).unwrap();
        }
        w.fetching.insert(k);
        drop(w);
        let got = f.chunk(&self.chunks[k]).map(Arc::new);
        self.land(k, got.clone());
        got
    }

    pub fn land(&self, k: usize, got: Option<Arc<Vec<u8>>>) {
        let mut w = self.window.lock().unwrap();
        w.fetching.remove(&k);
        if let Some(d) = got {
            w.have.insert(k, d);
            w.order.push_back(k);
            while !w.sweeping && w.order.len() > WINDOW {
                let old = w.order.pop_front().expect("longer than the window");
                w.have.remove(&old);
            }
        }
        self.landed.notify_all();
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        if let Some(free) = self.swept.get_mut().unwrap().take() {
            free.fetch_add(self.size, Relaxed);
        }
    }
}

#[path = "tests/fetch_tests.rs"]
#[cfg(test)]
mod tests;
