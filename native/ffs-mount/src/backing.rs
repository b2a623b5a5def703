//! What a file is read from besides the agent: a hot file's backing (a
//! local file of the cache, opened by kernel passthrough: registered once per
//! inode and kept while any handle holds it, and a while after), the cached
//! ranges of a file read through the agent, and the open handles with the
//! per-inode mode the kernel enforces (passthrough or not, never both).

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{BackingId, ReplyOpen};

use crate::fetch::Remote;
use crate::marks::{Marks, Pins};
use crate::wire;

/// A "hot" declaration: `path` of tree `version` is byte-identical to
/// `backing`, unless `marks` show a write after it was fetched.
#[derive(Clone)]
pub struct Hot {
    pub backing: String,
    pub inode: u64,
    pub version: u64,
    pub marks: Option<Marks>,
}

impl From<&wire::Hot> for Hot {
    /// From a "hot" message or the "hot" object of an open reply.
    fn from(h: &wire::Hot) -> Hot {
        Hot {
            backing: h.backing.clone(),
            inode: h.inode,
            version: h.version,
            marks: Marks::new(h.pin.as_deref(), &h.keys, h.bucket, h.fetched_ns),
        }
    }
}

/// Byte ranges of an agent-opened file that lie at the same offsets in a
/// local file (a file entry of the cache, partly filled): reads inside them
/// are served from it here, the rest go to the agent.
pub struct Cached {
    pub(crate) file: File,
    pub(crate) ranges: Vec<(u64, u64)>, // [start, end), sorted
}

impl Cached {
    /// From the "cached" object of an open or read reply: None unless the
    /// backing opens as a regular file with the declared inode and the marks
    /// do not say stale.
    pub(crate) fn from_msg(c: &wire::Cached, pins: &Pins) -> Option<Cached> {
        let file = File::open(&c.backing).ok()?;
        let md = file.metadata().ok()?;
        if !md.is_file() || md.ino() != c.inode {
            return None;
        }
        let marks = Marks::new(c.pin.as_deref(), &c.keys, c.bucket, c.fetched_ns);
        if marks.is_some_and(|m| pins.stale(&m)) {
            return None;
        }
        let mut ranges: Vec<(u64, u64)> = c
            .ranges
            .iter()
            .copied()
            .filter(|&(a, b)| a < b && b <= md.len())
            .collect();
        ranges.sort_unstable();
        Some(Cached { file, ranges })
    }

    /// The bytes [offset, offset+size) (cut at `file_size`) if they are all
    /// inside one range; else None.
    pub(crate) fn read(
        &self,
        offset: u64,
        size: u32,
        file_size: u64,
    ) -> Option<io::Result<Vec<u8>>> {
        let end = (offset + size as u64).min(file_size);
        let k = self
            .ranges
            .partition_point(|&(a, _)| a <= offset)
            .checked_sub(1)?;
        let (_, b) = self.ranges[k];
        if end > b || offset >= end {
            return None;
        }
        let mut buf = vec![0u8; (end - offset) as usize];
        Some(self.file.read_exact_at(&mut buf, offset).map(|_| buf))
    }
}

/// Kernel backing registration shared by all passthrough handles of one inode.
/// The kernel rejects (EIO) a passthrough open whose backing differs from the
/// one already attached to the inode, so every handle reuses this one; the
/// BackingId's Drop closes the kernel id, so it lives until the last release.
pub(crate) struct Backing {
    pub(crate) id: BackingId,
    pub(crate) file: File, // only for the pread fallback; the kernel holds its own ref
    pub(crate) hot: Hot,   // the declaration it was opened for
}

/// Outcome of checking whether an open may be passthrough.
pub(crate) enum Probe {
    Cold,
    Stale,
    Ready(File, Hot),
    Kept(Arc<Backing>),
}

pub(crate) enum Handle {
    Passthrough {
        ino: u64,
        b: Arc<Backing>,
    },
    Agent {
        ino: u64,
        /// The agent's handle.
        h: u64,
        size: u64,
        cached: Option<Arc<Cached>>,
        /// Where its bytes are, if the agent said: misses fetched here.
        remote: Option<Arc<Remote>>,
    },
}

/// Per-inode open modes. The kernel fails a non-passthrough open while a
/// passthrough one is open and vice versa, so each inode is in one mode.
#[derive(Default)]
pub(crate) struct InodeOpens {
    pub(crate) pt: Option<Arc<Backing>>,
    pub(crate) pt_count: u64,
    pub(crate) agent_count: u64, // includes agent opens still in flight
}

#[derive(Default)]
pub(crate) struct Opens {
    pub(crate) inodes: HashMap<u64, InodeOpens>,
    pub(crate) handles: HashMap<u64, Handle>,
    pub(crate) next_fh: u64,
    /// Backings of hot files no longer open, registered with the kernel still:
    /// the next open of the file reuses one after a stat instead of opening
    /// the entry and registering it again (two ioctls and an open per open).
    pub(crate) kept: HashMap<u64, Arc<Backing>>,
}

/// Kept backings hold their files, evicted or not: at most this many.
pub(crate) const KEPT_MAX: usize = 128;

impl Opens {
    pub(crate) fn add_handle(&mut self, h: Handle) -> u64 {
        self.next_fh += 1;
        self.handles.insert(self.next_fh, h);
        self.next_fh
    }
    /// Make `ino` passthrough with `file` as its backing and one handle. The
    /// caller checked that no other open holds the inode; its own pending
    /// agent open, if any, becomes this one.
    pub(crate) fn passthrough(
        &mut self,
        ino: u64,
        file: File,
        hot: Hot,
        reply: &ReplyOpen,
    ) -> io::Result<(u64, Arc<Backing>)> {
        let id = reply.open_backing(&file)?;
        let b = Arc::new(Backing { id, file, hot });
        let io = self.inodes.entry(ino).or_default();
        io.pt = Some(b.clone());
        io.pt_count = 1;
        io.agent_count = 0;
        let fh = self.add_handle(Handle::Passthrough { ino, b: b.clone() });
        Ok((fh, b))
    }

    pub(crate) fn gc(&mut self, ino: u64) {
        if let Some(io) = self.inodes.get(&ino) {
            if io.pt_count == 0 && io.agent_count == 0 {
                self.inodes.remove(&ino);
            }
        }
    }
}

/// A passthrough open is a read of the cache entry the agent never sees:
/// move it up the cache's LRU order (its mtime; at most once a second, the
/// cache's own rule for readers).
pub(crate) fn touch(backing: &str, md: &std::fs::Metadata) {
    let age = SystemTime::now()
        .duration_since(md.modified().unwrap_or(SystemTime::UNIX_EPOCH))
        .unwrap_or_default();
    if age >= Duration::from_secs(1) {
        if let Ok(p) = std::ffi::CString::new(backing) {
            // SAFETY: a valid C string; NULL times means "now".
            unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), std::ptr::null(), 0) };
        }
    }
}
