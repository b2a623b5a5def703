//! Stale marks: a pinned BPF hash map (u64 key -> u64 mark) in which a kernel
//! program records, per file key and per bucket, when it last saw a write.
//! A hot entry fetched at `fetched_ns` is stale once any of its marks is
//! newer: the kernel saw a write the agent had not fetched.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The marks fields of a hot declaration.
#[derive(Clone)]
pub struct Marks {
    pub pin: String,
    /// Every number of "keys", then "bucket".
    pub keys: Vec<u64>,
    pub fetched_ns: u64,
}

impl Marks {
    /// From the marks fields of a "hot" or "cached" object: None when there
    /// is nothing to check (no pin, no fetched_ns, or no keys or bucket).
    pub fn new(
        pin: Option<&str>,
        keys: &[u64],
        bucket: Option<u64>,
        fetched_ns: Option<u64>,
    ) -> Option<Marks> {
        let keys: Vec<u64> = keys.iter().copied().chain(bucket).collect();
        let m = Marks {
            pin: pin?.to_string(),
            keys,
            fetched_ns: fetched_ns?,
        };
        (!m.keys.is_empty()).then_some(m)
    }
}

const BPF_MAP_LOOKUP_ELEM: libc::c_int = 1;
const BPF_OBJ_GET: libc::c_int = 7;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_int = 15;
const BPF_F_RDONLY: u32 = 1 << 3;
const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_MAP_TYPE_LRU_HASH: u32 = 9;

// The members of the kernel's `union bpf_attr` used here, at its offsets
// (its u64s are __aligned_u64). The kernel wants every byte past a
// command's last field zero, so an attr always starts zeroed.
#[repr(C)]
#[derive(Clone, Copy)]
struct ObjGet {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
    path_fd: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct MapElem {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct InfoByFd {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

#[repr(C, align(8))]
union BpfAttr {
    obj: ObjGet,
    elem: MapElem,
    info: InfoByFd,
}

/// Head of `struct bpf_map_info`; the kernel fills at most `info_len` bytes.
#[repr(C)]
#[derive(Default)]
struct MapInfo {
    map_type: u32,
    id: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
}

fn bpf(cmd: libc::c_int, attr: &mut BpfAttr) -> io::Result<libc::c_long> {
    let size = size_of::<BpfAttr>() as libc::c_uint;
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut BpfAttr, size) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Get the map pinned at `pin` (read-only: we only look up) and check it is
/// u64 -> u64 and not per-CPU, so a lookup never writes past our 8 bytes.
fn open_map(pin: &str) -> io::Result<OwnedFd> {
    let path = CString::new(pin).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut a: BpfAttr = unsafe { std::mem::zeroed() };
    a.obj = ObjGet {
        pathname: path.as_ptr() as u64,
        bpf_fd: 0,
        file_flags: BPF_F_RDONLY,
        path_fd: 0,
    };
    // The kernel makes the new fd O_CLOEXEC.
    let fd = unsafe { OwnedFd::from_raw_fd(bpf(BPF_OBJ_GET, &mut a)? as i32) };
    let mut info = MapInfo::default();
    let mut a: BpfAttr = unsafe { std::mem::zeroed() };
    a.info = InfoByFd {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: size_of::<MapInfo>() as u32,
        info: &mut info as *mut MapInfo as u64,
    };
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut a)?;
    let hash = matches!(info.map_type, BPF_MAP_TYPE_HASH | BPF_MAP_TYPE_LRU_HASH);
    if hash && info.key_size == 8 && info.value_size == 8 {
        Ok(fd)
    } else {
        Err(io::Error::other(format!(
            "not a u64 -> u64 hash map (type {}, key {} B, value {} B)",
            info.map_type, info.key_size, info.value_size
        )))
    }
}

/// The mark for `key`: 0 when the map has no entry (never written).
fn lookup(fd: &OwnedFd, key: u64) -> io::Result<u64> {
    let mut value = 0u64;
    let mut a: BpfAttr = unsafe { std::mem::zeroed() };
    a.elem = MapElem {
        map_fd: fd.as_raw_fd() as u32,
        _pad: 0,
        key: &key as *const u64 as u64,
        value: &mut value as *mut u64 as u64,
        flags: 0,
    };
    match bpf(BPF_MAP_LOOKUP_ELEM, &mut a) {
        Ok(_) => Ok(value),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(0),
        Err(e) => Err(e),
    }
}

#[derive(Clone)]
enum Map {
    Unpinned, // nothing at the pin path (the node restarting): nothing is vouched for
    Open(Arc<OwnedFd>),
    Broken, // not a usable map: nothing can vouch for the backing files
}

struct Pin {
    map: Map,
    id: Option<(u64, u64)>, // (st_dev, st_ino) of the pin `map` was got from
    checked: Instant,
    err: String, // last error logged, so a broken pin logs once
}

/// Map fds by pin path (a handful of paths per agent, never evicted).
#[derive(Default)]
pub struct Pins(Mutex<HashMap<String, Pin>>);

const RECHECK: Duration = Duration::from_secs(1);

impl Pins {
    /// The map at `pin`. Its fd is kept; the pin is re-stat'ed at most once
    /// a second and a changed inode (map re-pinned) means getting it again.
    fn map(&self, pin: &str) -> Map {
        let mut pins = self.0.lock().unwrap();
        let now = Instant::now();
        if let Some(p) = pins.get(pin) {
            if now.duration_since(p.checked) < RECHECK {
                return p.map.clone();
            }
        }
        // stat before BPF_OBJ_GET: if the pin is replaced in between, the
        // next check sees a new inode and merely gets the fd once more.
        let id = match std::fs::metadata(pin) {
            Ok(md) => Ok(Some((md.dev(), md.ino()))),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => Ok(None),
            Err(e) => Err(e),
        };
        let p = pins.entry(pin.to_string()).or_insert_with(|| Pin {
            map: Map::Broken,
            id: None,
            checked: now,
            err: String::new(),
        });
        p.checked = now;
        let got = match id {
            Ok(None) => Ok(Map::Unpinned),
            Ok(id) if id == p.id && !matches!(p.map, Map::Broken) => Ok(p.map.clone()),
            Ok(id) => {
                p.id = id;
                match open_map(pin) {
                    Ok(fd) => Ok(Map::Open(Arc::new(fd))),
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(Map::Unpinned),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        };
        p.map = match got {
            Ok(m) => {
                p.err.clear();
                m
            }
            Err(e) => {
                let msg = e.to_string();
                if msg != p.err {
                    eprintln!(
                        "ffs-mount: marks at {pin} unusable (its hot files go to the agent): {msg}"
                    );
                    p.err = msg;
                }
                Map::Broken
            }
        };
        if matches!(p.map, Map::Unpinned) {
            p.id = None;
        }
        p.map.clone()
    }

    /// True if the kernel marked a write newer than `m.fetched_ns` for its
    /// key or bucket, or if the marks cannot be read or are not pinned (the
    /// node restarting): then nothing vouches for the backing file. The agent
    /// sends no pin where the node keeps no marks (simulated mode).
    pub fn stale(&self, m: &Marks) -> bool {
        let fd = match self.map(&m.pin) {
            Map::Unpinned | Map::Broken => return true,
            Map::Open(fd) => fd,
        };
        for &k in &m.keys {
            match lookup(&fd, k) {
                Ok(mark) if mark <= m.fetched_ns => {}
                Ok(_) => return true,
                Err(e) => {
                    eprintln!("ffs-mount: lookup of {k} in {}: {e}", m.pin);
                    return true;
                }
            }
        }
        false
    }
}
