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

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{self, BufReader};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use xxhash_rust::xxh3::xxh3_64;

use crate::http::{connect, exchange, Answer, Url};

/// Chunks fetched ahead of a sequential reader, per handle.
pub const AHEAD: usize = 2;
/// Read-ahead fetches running at once in the whole daemon.
const MAX_AHEAD_FETCHES: usize = 4;
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
/// Distinct chunks a handle's small reads elsewhere than where the last read
/// ended must touch before its file is swept whole (a reader of a footer and
/// a few columns is not; one reading at random all over the file is).
const SWEEP_AFTER: usize = 4;
/// Threads sweeping one file (more measured no faster on 2 cores: MinIO and
/// the checks take the CPUs), and sweeping daemon-wide at most.
const SWEEPERS: usize = 2;
const MAX_SWEEPERS: usize = 8;
/// Reads waiting on MinIO on threads of their own, at most.
const MAX_WORKERS: usize = 64;
/// Idle kept-alive connections per MinIO.
const IDLE_MAX: usize = 8;

struct Chunk {
    start: u64,
    bytes: u64,
    xxh3: u64,
    urls: Vec<Url>,
    /// An erasure-coded chunk's data shards, in order (its `urls` empty):
    /// each fetched and checked, their payloads joined (parity, for a shard
    /// missing or wrong, is the agent's).
    shards: Vec<Shard>,
}

struct Shard {
    bytes: u64,
    xxh3: u64,
    urls: Vec<Url>,
}

/// The header pyeclib's codec (liberasurecode) puts before each shard's
/// payload: the payload's length (u32, little-endian) at 4, the chunk's at
/// 12 (u64). What is joined is checked against the chunk's xxh3 whatever
/// the header says.
const EC_HEADER: usize = 80;

fn urls(v: &Value) -> Vec<Url> {
    v.get("urls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|u| Url::parse(u.as_str()?))
        .collect()
}

/// Where an agent-opened file's bytes are: its chunks in file order, each
/// with its holders' presigned URLs, preferred first (the "fetch" object of
/// an open reply).
pub struct Remote {
    chunks: Vec<Chunk>,
    size: u64,
    /// When the agent was last asked what of the file is cached here now,
    /// and the wait before the next ask.
    asked: Mutex<(Option<Instant>, Duration)>,
    window: Mutex<Window>,
    landed: Condvar,
    /// The daemon's sweep budget this handle holds (its file's size) while
    /// its file is swept; given back when the handle goes.
    swept: Mutex<Option<Arc<AtomicU64>>>,
    /// Chunks in this host's cache when the file was opened: a sweep leaves
    /// them (their reads are served from the cache entry, and a GET would
    /// count them again).
    here: Vec<bool>,
}

#[derive(Default)]
struct Window {
    have: HashMap<usize, Arc<Vec<u8>>>,
    order: VecDeque<usize>,
    fetching: HashSet<usize>,
    /// Chunks small reads elsewhere than where the last read ended touched
    /// while not at hand (up to SWEEP_AFTER), and whether the file is swept:
    /// then every chunk landed is kept until the handle goes.
    touched: HashSet<usize>,
    sweeping: bool,
    /// Where the last read ended: a read starting near it is sequential (so
    /// is a first read from the start).
    next: Option<u64>,
}

#[derive(Default)]
pub struct FetchStats {
    pub reads: AtomicU64,
    pub bytes: AtomicU64,
    pub gets: AtomicU64,
    pub get_bytes: AtomicU64,
    pub ahead: AtomicU64,
    pub ranged: AtomicU64,
    pub bad_checksum: AtomicU64,
    pub failed_gets: AtomicU64,
    pub fallbacks: AtomicU64,
    /// Files swept whole for random readers, and sweeps the budget refused.
    pub sweeps: AtomicU64,
    pub sweeps_refused: AtomicU64,
}

impl FetchStats {
    pub fn json(&self) -> Value {
        let g = |a: &AtomicU64| a.load(Relaxed);
        json!({
            "reads": g(&self.reads), "bytes": g(&self.bytes), "gets": g(&self.gets),
            "get_bytes": g(&self.get_bytes), "ahead": g(&self.ahead), "ranged": g(&self.ranged),
            "bad_checksum": g(&self.bad_checksum), "failed_gets": g(&self.failed_gets),
            "fallbacks": g(&self.fallbacks), "sweeps": g(&self.sweeps),
            "sweeps_refused": g(&self.sweeps_refused),
        })
    }
}

/// Kept-alive connections to the MinIO servers, shared by every handle.
pub struct Fetcher {
    /// Kept-alive connections by host.
    idle: Mutex<HashMap<String, Vec<BufReader<TcpStream>>>>,
    ahead: usize,
    ahead_running: AtomicUsize,
    workers: Arc<AtomicUsize>,
    pub stats: FetchStats,
    /// Bytes of memory left for swept files (--sweep-mb), and threads sweeping.
    sweep_free: Arc<AtomicU64>,
    sweepers: Arc<AtomicUsize>,
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
    pub fn from_msg(v: &Value, size: u64) -> Option<Remote> {
        let mut chunks = Vec::new();
        for c in v.get("chunks")?.as_array()? {
            let n = |k: &str| c.get(k).and_then(Value::as_u64);
            let mut shards = Vec::new();
            for s in c
                .get("shards")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let n = |k: &str| s.get(k).and_then(Value::as_u64);
                let urls = urls(s);
                if urls.is_empty() {
                    return None;
                }
                shards.push(Shard {
                    bytes: n("bytes")?,
                    xxh3: n("xxh3")?,
                    urls,
                });
            }
            let urls = urls(c);
            if urls.is_empty() == shards.is_empty() {
                return None; // one way to its bytes: copies or shards
            }
            chunks.push(Chunk {
                start: n("start")?,
                bytes: n("bytes")?,
                xxh3: n("xxh3")?,
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

    /// Whether this file is swept, once a random reader's small read of chunk
    /// k (not at hand) is counted: the SWEEP_AFTER-th such chunk starts the
    /// sweep, if the daemon's budget holds the file and its sweepers are not
    /// all busy. A read of a swept file fetches its chunk whole (the sweep
    /// will not GET it again: a ranged GET now would make it hot by itself).
    fn swept(self: &Arc<Self>, f: &Arc<Fetcher>, k: usize) -> bool {
        {
            let mut w = self.window.lock().unwrap();
            if w.sweeping {
                return true;
            }
            w.touched.insert(k);
            if w.touched.len() < SWEEP_AFTER {
                return false;
            }
        }
        let fits = f
            .sweep_free
            .fetch_update(Relaxed, Relaxed, |free| free.checked_sub(self.size))
            .is_ok();
        let threads = fits
            && f.sweepers
                .fetch_update(Relaxed, Relaxed, |n| {
                    (n + SWEEPERS <= MAX_SWEEPERS).then_some(n + SWEEPERS)
                })
                .is_ok();
        if !threads {
            if fits {
                f.sweep_free.fetch_add(self.size, Relaxed);
            }
            f.stats.sweeps_refused.fetch_add(1, Relaxed);
            self.window.lock().unwrap().touched.clear(); // asked again after as many
            return false;
        }
        {
            let mut w = self.window.lock().unwrap();
            if w.sweeping {
                // another read started it meanwhile: this one's share goes back
                f.sweep_free.fetch_add(self.size, Relaxed);
                f.sweepers.fetch_sub(SWEEPERS, Relaxed);
                return true;
            }
            w.sweeping = true;
        }
        *self.swept.lock().unwrap() = Some(f.sweep_free.clone());
        f.stats.sweeps.fetch_add(1, Relaxed);
        let next = Arc::new(AtomicUsize::new(0));
        for _ in 0..SWEEPERS {
            let (r, f, next) = (Arc::downgrade(self), f.clone(), next.clone());
            spawn_anywhere(move || {
                // the handle's release ends the sweep: a sweeper holds it only while fetching
                while let Some(r) = r.upgrade() {
                    let k = next.fetch_add(1, Relaxed);
                    if k >= r.chunks.len() {
                        break;
                    }
                    {
                        let mut w = r.window.lock().unwrap();
                        let here = r.here.get(k).copied().unwrap_or(false);
                        if here || w.have.contains_key(&k) || !w.fetching.insert(k) {
                            continue;
                        }
                    }
                    let got = f.chunk(&r.chunks[k]).map(Arc::new);
                    r.land(k, got);
                }
                f.sweepers.fetch_sub(1, Relaxed);
            });
        }
        true
    }

    /// Start fetching chunk k on a thread of its own, unless it is here, on
    /// its way, or the daemon's read-ahead budget is spent.
    fn ahead(self: &Arc<Self>, f: &Arc<Fetcher>, k: usize) {
        {
            let mut w = self.window.lock().unwrap();
            if w.have.contains_key(&k) || w.fetching.contains(&k) {
                return;
            }
            if f.ahead_running.fetch_add(1, Relaxed) >= MAX_AHEAD_FETCHES {
                f.ahead_running.fetch_sub(1, Relaxed);
                return;
            }
            w.fetching.insert(k);
        }
        f.stats.ahead.fetch_add(1, Relaxed);
        let (r, f) = (self.clone(), f.clone());
        spawn_anywhere(move || {
            let got = f.chunk(&r.chunks[k]).map(Arc::new);
            f.ahead_running.fetch_sub(1, Relaxed);
            r.land(k, got);
        });
    }

    fn land(&self, k: usize, got: Option<Arc<Vec<u8>>>) {
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

/// A thread free to run on any of the daemon's CPUs. A thread inherits its
/// creator's affinity, and a request over io_uring is handled on its CPU's
/// queue thread, pinned there: a read's worker, its fetches and a sweep
/// started from it would all share that one CPU with the reader, leaving the
/// other idle (measured: a quarter of the machine idle through a random
/// pass). They take the main thread's affinity, which nothing pins.
pub fn spawn_anywhere<F: FnOnce() + Send + 'static>(f: F) {
    std::thread::spawn(move || {
        // SAFETY: a cpu_set_t of the size given, read then applied to this thread alone.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            let size = std::mem::size_of::<libc::cpu_set_t>();
            if libc::sched_getaffinity(libc::getpid(), size, &mut set) == 0 {
                libc::sched_setaffinity(0, size, &set);
            }
        }
        f()
    });
}

/// A read's own thread, counted while it lives.
pub struct Worker(Arc<AtomicUsize>);

impl Drop for Worker {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

impl Fetcher {
    /// A thread of its own for a read, unless MAX_WORKERS run already (then
    /// the FUSE thread does it: a bound on threads, at the cost of waiting).
    pub fn worker(&self) -> Option<Worker> {
        if self.workers.fetch_add(1, Relaxed) >= MAX_WORKERS {
            self.workers.fetch_sub(1, Relaxed);
            return None;
        }
        Some(Worker(self.workers.clone()))
    }

    fn served(&self, got: Got) -> Got {
        self.stats.reads.fetch_add(1, Relaxed);
        self.stats
            .bytes
            .fetch_add(got.bytes().len() as u64, Relaxed);
        got
    }

    /// `ahead`: chunks fetched ahead of a sequential reader; `sweep_bytes`:
    /// memory for files swept whole for random readers (0: none is).
    pub fn new(ahead: usize, sweep_bytes: u64) -> Fetcher {
        Fetcher {
            idle: Mutex::default(),
            ahead,
            ahead_running: AtomicUsize::new(0),
            workers: Arc::default(),
            stats: FetchStats::default(),
            sweep_free: Arc::new(AtomicU64::new(sweep_bytes)),
            sweepers: Arc::default(),
        }
    }

    /// A chunk's bytes from the first holder whose copy matches its xxh3
    /// (an erasure-coded one's from its data shards).
    fn chunk(&self, c: &Chunk) -> Option<Vec<u8>> {
        if !c.shards.is_empty() {
            return self.coded(c);
        }
        for u in &c.urls {
            match self.get(u, None, c.bytes) {
                Ok(a) if a.body.len() as u64 == c.bytes && a.xxh3 == Some(c.xxh3) => {
                    self.stats.gets.fetch_add(1, Relaxed);
                    self.stats.get_bytes.fetch_add(c.bytes, Relaxed);
                    return Some(a.body);
                }
                Ok(Answer { body, .. }) => {
                    self.stats.bad_checksum.fetch_add(1, Relaxed);
                    eprintln!(
                        "ffs-mount: {} sent {} bytes that do not match the manifest's checksum: next holder",
                        u.shown(),
                        body.len()
                    );
                }
                Err(e) => {
                    self.stats.failed_gets.fetch_add(1, Relaxed);
                    eprintln!("ffs-mount: GET {}: {e}", u.shown());
                }
            }
        }
        None
    }

    /// An erasure-coded chunk from its data shards, fetched at once, each
    /// checked against its xxh3, their payloads joined and the whole checked
    /// against the chunk's; None if any of that fails.
    fn coded(&self, c: &Chunk) -> Option<Vec<u8>> {
        let parts: Vec<Option<Vec<u8>>> = std::thread::scope(|scope| {
            let running: Vec<_> = c
                .shards
                .iter()
                .map(|s| scope.spawn(move || self.shard(s)))
                .collect();
            running
                .into_iter()
                .map(|t| t.join().ok().flatten())
                .collect()
        });
        let mut out = Vec::with_capacity(c.bytes as usize + EC_HEADER);
        for part in parts {
            let part = part?;
            let size = u32::from_le_bytes(part.get(4..8)?.try_into().ok()?) as usize;
            out.extend_from_slice(part.get(EC_HEADER..EC_HEADER + size)?);
        }
        out.truncate(c.bytes as usize);
        if out.len() as u64 != c.bytes || xxh3_64(&out) != c.xxh3 {
            self.stats.bad_checksum.fetch_add(1, Relaxed);
            eprintln!("ffs-mount: a chunk joined from its data shards does not match its checksum");
            return None;
        }
        self.stats.gets.fetch_add(c.shards.len() as u64, Relaxed);
        self.stats.get_bytes.fetch_add(c.bytes, Relaxed);
        Some(out)
    }

    /// One shard whole, from its node, if it matches its xxh3.
    fn shard(&self, s: &Shard) -> Option<Vec<u8>> {
        let u = s.urls.first()?;
        match self.get(u, None, s.bytes) {
            Ok(a) if a.xxh3 == Some(s.xxh3) => Some(a.body),
            Ok(_) => {
                self.stats.bad_checksum.fetch_add(1, Relaxed);
                eprintln!(
                    "ffs-mount: {} sent a shard that does not match its checksum",
                    u.shown()
                );
                None
            }
            Err(e) => {
                self.stats.failed_gets.fetch_add(1, Relaxed);
                eprintln!("ffs-mount: GET {} (a shard): {e}", u.shown());
                None
            }
        }
    }

    /// Bytes [from, to) of chunk `c` by a ranged GET from its first holder
    /// that answers. A range cannot be checked against the chunk's xxh3
    /// (MinIO's own bitrot checks cover it, as for the agent's ranged reads).
    fn range(&self, c: &Chunk, from: u64, to: u64) -> Option<Vec<u8>> {
        for u in &c.urls {
            match self.get(u, Some((from, to)), to - from) {
                Ok(Answer { body, .. }) if body.len() as u64 == to - from => {
                    self.stats.ranged.fetch_add(1, Relaxed);
                    return Some(body);
                }
                Ok(Answer { body, .. }) => eprintln!(
                    "ffs-mount: {} sent {} bytes for a range of {}",
                    u.shown(),
                    body.len(),
                    to - from
                ),
                Err(e) => {
                    self.stats.failed_gets.fetch_add(1, Relaxed);
                    eprintln!("ffs-mount: GET {} (a range): {e}", u.shown());
                }
            }
        }
        None
    }

    /// One GET (of bytes [a, b) if `range`) over a kept-alive connection (a
    /// fresh one if the kept one was closed under it).
    fn get(&self, u: &Url, range: Option<(u64, u64)>, expect: u64) -> io::Result<Answer> {
        let kept = self
            .idle
            .lock()
            .unwrap()
            .get_mut(&u.host)
            .and_then(Vec::pop);
        if let Some(mut conn) = kept {
            match exchange(&mut conn, u, range, expect) {
                Ok(a) => {
                    self.put_back(&u.host, conn, a.keep);
                    return Ok(a);
                }
                Err(e) if e.kind() != io::ErrorKind::InvalidData => {} // closed while idle: anew
                Err(e) => return Err(e),
            }
        }
        let mut conn = BufReader::with_capacity(1 << 16, connect(&u.host)?);
        let a = exchange(&mut conn, u, range, expect)?;
        self.put_back(&u.host, conn, a.keep);
        Ok(a)
    }

    fn put_back(&self, host: &str, conn: BufReader<TcpStream>, keep: bool) {
        if keep {
            let mut idle = self.idle.lock().unwrap();
            let list = idle.entry(host.to_string()).or_default();
            if list.len() < IDLE_MAX {
                list.push(conn);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, Write};
    use std::net::TcpListener;

    /// Answers one GET on `r` with `bodies[path]` (its range if asked);
    /// its path, or None once the client closed.
    fn answer(r: &mut BufReader<TcpStream>, bodies: &HashMap<String, Vec<u8>>) -> Option<String> {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return None;
        }
        let path = line
            .split_whitespace()
            .nth(1)?
            .split('?')
            .next()?
            .to_string();
        let mut range = None;
        loop {
            let mut h = String::new();
            r.read_line(&mut h).ok()?;
            if h.trim().is_empty() {
                break;
            }
            if let Some(v) = h.trim().strip_prefix("Range: bytes=") {
                let (a, b) = v.split_once('-').unwrap();
                range = Some((a.parse::<usize>().unwrap(), b.parse::<usize>().unwrap() + 1));
            }
        }
        let (status, body) = match (bodies.get(&path), range) {
            (Some(b), None) => ("200 OK", b.clone()),
            (Some(b), Some((x, y))) => ("206 Partial Content", b[x..y].to_vec()),
            (None, _) => ("404 Not Found", b"<Error/>".to_vec()),
        };
        // "/huge" claims a terabyte and sends nothing
        let claimed = if path == "/huge" { 1 << 40 } else { body.len() };
        let body = if path == "/huge" { vec![] } else { body };
        let head = format!("HTTP/1.1 {status}\r\nContent-Length: {claimed}\r\n\r\n");
        let s = r.get_mut();
        s.write_all(head.as_bytes()).ok()?;
        s.write_all(&body).ok()?;
        Some(path)
    }

    /// A one-connection-at-a-time HTTP server of `bodies`; the thread ends
    /// with the GETs served once "/last" is asked for.
    fn serve(bodies: HashMap<String, Vec<u8>>) -> (String, std::thread::JoinHandle<usize>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let host = l.local_addr().unwrap().to_string();
        let h = std::thread::spawn(move || {
            let mut served = 0;
            while let Ok((s, _)) = l.accept() {
                let mut r = BufReader::new(s);
                while let Some(path) = answer(&mut r, &bodies) {
                    served += 1;
                    if path == "/last" {
                        return served;
                    }
                }
            }
            served
        });
        (host, h)
    }

    /// An HTTP server of `bodies` with a thread per connection, counting the
    /// GETs of each path.
    fn serve_concurrently(
        bodies: HashMap<String, Vec<u8>>,
    ) -> (String, Arc<Mutex<HashMap<String, usize>>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let host = l.local_addr().unwrap().to_string();
        let (counts, bodies) = (Arc::new(Mutex::new(HashMap::new())), Arc::new(bodies));
        let c = counts.clone();
        std::thread::spawn(move || {
            while let Ok((s, _)) = l.accept() {
                let (c, bodies) = (c.clone(), bodies.clone());
                std::thread::spawn(move || {
                    let mut r = BufReader::new(s);
                    while let Some(path) = answer(&mut r, &bodies) {
                        *c.lock().unwrap().entry(path).or_insert(0) += 1;
                    }
                });
            }
        });
        (host, counts)
    }

    fn remote(host: &str, parts: &[&[u8]], urls: &[&str]) -> Remote {
        let mut start = 0;
        let chunks: Vec<Value> = parts
            .iter()
            .zip(urls)
            .map(|(p, u)| {
                let c = json!({"start": start, "bytes": p.len(), "xxh3": xxh3_64(p),
                               "urls": [format!("http://{host}{u}?X-Amz-Signature=s")]});
                start += p.len() as u64;
                c
            })
            .collect();
        Remote::from_msg(&json!({ "chunks": chunks }), start).unwrap()
    }

    #[test]
    fn reads_across_chunks_over_one_kept_connection_and_refuses_bad_bytes() {
        let (a, b) = (vec![1u8; 1000], vec![2u8; 700]);
        let bodies = HashMap::from([
            ("/bk/a".to_string(), a.clone()),
            ("/bk/b".to_string(), b.clone()),
            ("/bk/bad".to_string(), vec![9u8; 700]),
            ("/last".to_string(), vec![]),
        ]);
        let (host, server) = serve(bodies);
        let f = Arc::new(Fetcher::new(0, 0)); // no read-ahead: one connection, GETs counted
        let r = Arc::new(remote(&host, &[&a, &b], &["/bk/a", "/bk/b"]));
        let got = r.read(&f, 900, 200).unwrap().bytes().to_vec();
        assert_eq!(got, [&a[900..], &b[..100]].concat());
        assert_eq!(r.read(&f, 1600, 500).unwrap().bytes(), &b[600..]); // the end of the file
                                                                       // the same bytes' checksum, other bytes: never served
        let wrong = Arc::new(remote(&host, &[&a, &b], &["/bk/a", "/bk/bad"]));
        assert!(wrong.read(&f, 0, 1100).is_none()); // both chunks whole: the bad one refused
        assert_eq!(f.stats.bad_checksum.load(Relaxed), 1);
        assert!(wrong.read(&f, 0, 10).is_some()); // its good chunk still reads
                                                  // a small read away from the last: its range alone
        let far = Arc::new(remote(&host, &[&a, &b], &["/bk/a", "/bk/b"]));
        assert_eq!(far.read(&f, 1500, 100).unwrap().bytes(), &b[500..600]);
        assert_eq!(f.stats.ranged.load(Relaxed), 1);
        let _ = f.get(
            &Url::parse(&format!("http://{host}/last")).unwrap(),
            None,
            0,
        );
        assert_eq!(
            server.join().unwrap(),
            6,
            "one connection carried every GET"
        );
    }

    #[test]
    fn a_chunk_hashed_piece_by_piece_as_it_arrives_is_checked_whole() {
        // over several of the pieces it is hashed in, and not a whole number of them
        let good: Vec<u8> = (0..300 * 1024 + 7).map(|i| (i * 31 % 251) as u8).collect();
        let mut late = good.clone();
        *late.last_mut().unwrap() ^= 1; // a byte of its last piece flipped
        let bodies = HashMap::from([
            ("/bk/good".to_string(), good.clone()),
            ("/bk/late".to_string(), late),
        ]);
        let (host, _server) = serve(bodies);
        let f = Arc::new(Fetcher::new(0, 0));
        let r = Arc::new(remote(&host, &[&good], &["/bk/good"]));
        let n = good.len() as u32;
        assert_eq!(r.read(&f, 0, n).unwrap().bytes(), &good[..]);
        let wrong = Arc::new(remote(&host, &[&good], &["/bk/late"]));
        assert!(wrong.read(&f, 0, n).is_none());
        assert_eq!(f.stats.bad_checksum.load(Relaxed), 1);
    }

    /// Polls `done` for up to 5 s.
    fn eventually(what: &str, done: impl Fn() -> bool) {
        let t = Instant::now();
        while !done() {
            assert!(t.elapsed() < Duration::from_secs(5), "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_random_readers_file_is_swept_whole_within_the_budget() {
        // chunks of 1 MiB: a read more than NEAR from the last one's end is not sequential
        const P: u64 = 1 << 20;
        let parts: Vec<Vec<u8>> = (0..6u8).map(|i| vec![i; P as usize]).collect();
        let paths: Vec<String> = (0..6).map(|i| format!("/bk/{i}")).collect();
        let (host, gets) =
            serve_concurrently(paths.iter().cloned().zip(parts.iter().cloned()).collect());
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        let urls: Vec<&str> = paths.iter().map(String::as_str).collect();
        let budget = 10 * P;
        let f = Arc::new(Fetcher::new(0, budget));
        let r = Arc::new(remote(&host, &refs, &urls));
        let byte = |at: u64| parts[(at / P) as usize][0];
        // small reads at random in chunks 4, 1, 3: a ranged GET each
        for at in [4 * P + 100, P + 200, 3 * P + 900] {
            assert_eq!(r.read(&f, at, 10).unwrap().bytes(), &[byte(at); 10]);
        }
        assert_eq!(
            (f.stats.ranged.load(Relaxed), f.stats.sweeps.load(Relaxed)),
            (3, 0)
        );
        // the fourth chunk touched: the file is swept, this read's chunk fetched whole
        assert_eq!(r.read(&f, 5 * P + 500, 10).unwrap().bytes(), &[5; 10]);
        eventually("every chunk at hand", || {
            (0..6).all(|k| r.at_hand(k * P, P as u32))
        });
        assert_eq!(f.stats.sweeps.load(Relaxed), 1);
        assert_eq!(f.sweep_free.load(Relaxed), budget - 6 * P);
        for at in [2 * P + 345, 5, 5 * P - 1, 3 * P] {
            assert_eq!(r.read(&f, at, 1).unwrap().bytes(), &[byte(at)]);
        }
        // each chunk GET whole once, besides the three ranges: nothing read twice
        let got: Vec<usize> = paths.iter().map(|p| gets.lock().unwrap()[p]).collect();
        assert_eq!(got, [1, 2, 1, 2, 2, 1]);
        assert_eq!(f.stats.ranged.load(Relaxed), 3);
        // the handle gone, its memory is the budget's again
        drop(r);
        eventually("the budget given back", || {
            f.sweep_free.load(Relaxed) == budget
        });
        // chunks wholly in this host's cache at open are left to it: 2, not 5 (a few bytes of it)
        let count = || -> Vec<usize> { paths.iter().map(|p| gets.lock().unwrap()[p]).collect() };
        let before = count();
        let r = Arc::new(
            remote(&host, &refs, &urls).cached_here(&[(2 * P, 3 * P), (5 * P, 5 * P + 10)]),
        );
        for at in [4 * P + 100, P + 200, 3 * P + 900, 10] {
            assert_eq!(r.read(&f, at, 10).unwrap().bytes(), &[byte(at); 10]);
        }
        eventually("the sweep done", || f.sweepers.load(Relaxed) == 0);
        assert!(
            [0, 1, 3, 4, 5].iter().all(|&k| r.at_hand(k * P, P as u32)) && !r.at_hand(2 * P, 1)
        );
        let fetched: Vec<usize> = count().iter().zip(&before).map(|(a, b)| a - b).collect();
        assert_eq!(fetched, [1, 2, 0, 2, 2, 1]);
        drop(r);
        // a file larger than what is left is not swept: its reads stay ranged
        let small = Arc::new(Fetcher::new(0, 6 * P - 1));
        let r = Arc::new(remote(&host, &refs, &urls));
        for at in [4 * P + 100, P + 200, 3 * P + 900, 5 * P + 500, 2 * P] {
            assert_eq!(r.read(&small, at, 10).unwrap().bytes(), &[byte(at); 10]);
        }
        assert_eq!(small.stats.sweeps_refused.load(Relaxed), 1);
        assert_eq!(
            (
                small.stats.ranged.load(Relaxed),
                small.stats.gets.load(Relaxed)
            ),
            (5, 0)
        );
    }

    fn shard_of(payload: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; EC_HEADER];
        out[4..8].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn an_erasure_coded_chunk_is_joined_from_its_data_shards_and_checked() {
        let chunk: Vec<u8> = (0..999u32).map(|i| (i * 7) as u8).collect();
        let (s0, s1) = (
            shard_of(&chunk[..500]),
            shard_of(&[&chunk[500..], &[0u8][..]].concat()),
        ); // padded
           // each shard on a node of its own (fetched at once)
        let node = |path: &str, body: &Vec<u8>| {
            serve(HashMap::from([
                (path.to_string(), body.clone()),
                ("/last".to_string(), vec![]),
            ]))
        };
        let ((h0, n0), (h1, n1)) = (node("/bk/c.s0", &s0), node("/bk/c.s1", &s1));
        let shard = |host: &str, path: &str, body: &[u8], x: u64| json!({"bytes": body.len(), "xxh3": x, "urls": [format!("http://{host}{path}?X-Amz-Signature=s")]});
        let plan = |x1: u64| {
            json!({"chunks": [{"start": 0, "bytes": 999, "xxh3": xxh3_64(&chunk), "urls": [],
                              "shards": [shard(&h0, "/bk/c.s0", &s0, xxh3_64(&s0)),
                                         shard(&h1, "/bk/c.s1", &s1, x1)]}]})
        };
        let f = Arc::new(Fetcher::new(0, 0));
        let r = Arc::new(Remote::from_msg(&plan(xxh3_64(&s1)), 999).unwrap());
        assert_eq!(r.read(&f, 0, 999).unwrap().bytes(), &chunk[..]);
        assert_eq!(f.stats.gets.load(Relaxed), 2);
        // a shard whose bytes are not its checksum's: nothing served (the agent reads parity)
        let wrong = Arc::new(Remote::from_msg(&plan(1), 999).unwrap());
        assert!(wrong.read(&f, 0, 10).is_none());
        assert_eq!(f.stats.bad_checksum.load(Relaxed), 1);
        // copies and shards at once, or neither: not a plan
        let both = json!({"chunks": [{"start": 0, "bytes": 999, "xxh3": 1, "urls": ["http://h:1/b/k"],
                                      "shards": [shard(&h0, "/bk/c.s0", &s0, 1)]}]});
        assert!(Remote::from_msg(&both, 999).is_none());
        for (h, n) in [(h0, n0), (h1, n1)] {
            let _ = f.get(&Url::parse(&format!("http://{h}/last")).unwrap(), None, 0);
            assert_eq!(
                n.join().unwrap(),
                3,
                "each shard twice over one connection, then /last"
            );
        }
    }

    #[test]
    fn a_plan_that_is_not_the_file_is_refused() {
        let c = |start: u64| json!({"start": start, "bytes": 10, "xxh3": 1, "urls": ["http://h:1/b/k"]});
        assert!(Remote::from_msg(&json!({"chunks": [c(0), c(10)]}), 20).is_some());
        assert!(Remote::from_msg(&json!({"chunks": [c(0), c(11)]}), 21).is_none());
        assert!(Remote::from_msg(&json!({"chunks": [c(0)]}), 20).is_none());
        let https =
            json!({"chunks": [{"start": 0, "bytes": 1, "xxh3": 1, "urls": ["https://h:1/b/k"]}]});
        assert!(Remote::from_msg(&https, 1).is_none());
    }

    #[test]
    fn a_length_other_than_the_chunks_is_refused_unread() {
        let huge = vec![5u8; 10];
        let bodies = HashMap::from([
            ("/huge".to_string(), huge.clone()),
            ("/last".to_string(), vec![]),
        ]);
        let (host, server) = serve(bodies);
        let f = Arc::new(Fetcher::new(0, 0));
        let r = Arc::new(remote(&host, &[&huge], &["/huge"]));
        assert!(
            r.read(&f, 0, 10).is_none(),
            "a terabyte claimed for 10 bytes"
        );
        // its range first (a small read), then the whole chunk: each refused, its connection dropped
        assert_eq!(f.stats.failed_gets.load(Relaxed), 2);
        let _ = f.get(
            &Url::parse(&format!("http://{host}/last")).unwrap(),
            None,
            0,
        );
        assert_eq!(server.join().unwrap(), 3);
    }
}
