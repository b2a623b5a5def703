//! The daemon's GETs to the holders' MinIO servers: kept-alive connections
//! shared by every handle, each chunk checked against the manifest's xxh3
//! (an erasure-coded one joined from its data shards), ranged GETs, the
//! counters, and the threads reads wait on MinIO in.

use std::collections::HashMap;
use std::io::{self, BufReader};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use xxhash_rust::xxh3::xxh3_64;

use crate::fetch::Got;
use crate::http::{connect, exchange, Answer, Url};
use crate::wire::FetchCounters;

/// Reads waiting on MinIO on threads of their own, at most.
const MAX_WORKERS: usize = 64;
/// Idle kept-alive connections per MinIO.
const IDLE_MAX: usize = 8;

pub struct Chunk {
    pub start: u64,
    pub bytes: u64,
    pub xxh3: u64,
    pub urls: Vec<Url>,
    /// An erasure-coded chunk's data shards, in order (its `urls` empty):
    /// each fetched and checked, their payloads joined (parity, for a shard
    /// missing or wrong, is the agent's).
    pub shards: Vec<Shard>,
}

pub struct Shard {
    pub bytes: u64,
    pub xxh3: u64,
    pub urls: Vec<Url>,
}

/// The header pyeclib's codec (liberasurecode) puts before each shard's
/// payload: the payload's length (u32, little-endian) at 4, the chunk's at
/// 12 (u64). What is joined is checked against the chunk's xxh3 whatever
/// the header says.
pub const EC_HEADER: usize = 80;

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
    pub fn counters(&self) -> FetchCounters {
        let g = |a: &AtomicU64| a.load(Relaxed);
        FetchCounters {
            reads: g(&self.reads),
            bytes: g(&self.bytes),
            gets: g(&self.gets),
            get_bytes: g(&self.get_bytes),
            ahead: g(&self.ahead),
            ranged: g(&self.ranged),
            bad_checksum: g(&self.bad_checksum),
            failed_gets: g(&self.failed_gets),
            fallbacks: g(&self.fallbacks),
            sweeps: g(&self.sweeps),
            sweeps_refused: g(&self.sweeps_refused),
        }
    }
}

/// Kept-alive connections to the MinIO servers, shared by every handle.
pub struct Fetcher {
    /// Kept-alive connections by host.
    idle: Mutex<HashMap<String, Vec<BufReader<TcpStream>>>>,
    pub ahead: usize,
    pub ahead_running: AtomicUsize,
    workers: Arc<AtomicUsize>,
    pub stats: FetchStats,
    /// Bytes of memory left for swept files (--sweep-mb), and threads sweeping.
    pub sweep_free: Arc<AtomicU64>,
    pub sweepers: Arc<AtomicUsize>,
}

/// A thread free to run on any of the daemon's CPUs. A thread inherits its
/// creator's affinity, and a request over io_uring is handled on its CPU's
/// queue thread, pinned there: a read's worker, its fetches and a sweep
/// started from it would all share that one CPU with the reader, leaving the
/// other idle (measured: a quarter of the machine idle through a random
/// pass). They take the main thread's affinity, which nothing pins, and a
/// name of their own (Linux gives an unnamed thread its creator's: a queue
/// thread's name on an unpinned thread).
pub fn spawn_anywhere<F: FnOnce() + Send + 'static>(f: F) {
    let named = std::thread::Builder::new().name("ffs-worker".into());
    let spawned = named.spawn(move || {
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
    if let Err(e) = spawned {
        eprintln!("ffs-mount: cannot start a worker thread: {e}");
    }
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

    pub fn served(&self, got: Got) -> Got {
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
    pub fn chunk(&self, c: &Chunk) -> Option<Vec<u8>> {
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
    pub fn range(&self, c: &Chunk, from: u64, to: u64) -> Option<Vec<u8>> {
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
    pub fn get(&self, u: &Url, range: Option<(u64, u64)>, expect: u64) -> io::Result<Answer> {
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
