//! ffs-mount: read-only FUSE daemon for FasterFS.
//!
//! Usage: ffs-mount MOUNTPOINT --agent-fd N [--attr-ttl-ms 60000] [--threads 2]
//!        [--max-entries 0] [--sweep-mb 0] [--uring]
//!
//! --uring: ask for FUSE over io_uring at INIT (the kernel offers it while the
//! fuse module's enable_uring is set): requests then come through a ring per
//! CPU, each served by a thread pinned to that CPU (fuser-uring.patch); the
//! --threads threads keep reading /dev/fuse (FORGET, INTERRUPT, and whatever
//! comes before the rings are registered).
//!
//! --sweep-mb M: memory for files a random reader gets swept whole into its
//! handle (fetch.rs), daemon-wide; a file larger than what is left is not.
//!
//! The Python agent (our parent) owns the other end of the socketpair at fd N.
//! Metadata is served from the tree it pushes; opens of files it declared hot
//! become kernel passthrough opens; everything else is forwarded to it.
//! We exit (unmounting) when the socket closes, on SIGTERM/SIGINT/SIGHUP
//! (PR_SET_PDEATHSIG turns the parent's death into SIGTERM), or when the
//! filesystem gets unmounted from outside.
//!
//! # Protocol (the agent must follow it exactly)
//!
//! Every message and field below is listed in protocol.json, which
//! tests/test_mount_protocol.py checks both sides' sources against.
//!
//! Framing: each message is one compact JSON object on one line ending in
//! "\n". A reply with "len": L is followed by exactly L raw bytes. Each side
//! must write a message (line plus raw bytes) contiguously. Lines that are
//! not JSON are logged and skipped. Integers are JSON numbers: u64 unless
//! said otherwise; a field of the wrong type counts as absent.
//! A message with "op" is a request or notice, one without is a reply,
//! matched by "id". The two directions have separate id spaces.
//!
//! ## Agent -> daemon
//!
//! {"op":"tree","version":V,"entries":[{"path":P,"dir":bool,"size":S,
//!   "mtime_ns":i64,"gen":G}, ...]}
//!   Replaces the whole tree; the first one triggers the mount. P is
//!   relative to the mount root, "/"-separated, outer slashes stripped;
//!   entries with empty, "." or ".." components are skipped, missing parents
//!   become directories, entries below a file are dropped. A path keeps its
//!   inode number across trees and deltas while its G (a string) stays the
//!   same; a new G is a new inode, and the old one's entry is invalidated in
//!   the kernel. A file inode that leaves the tree keeps its attributes
//!   while open (and until the next tree or delta); opening it fails with
//!   ESTALE (the kernel looks the path up again and retries). Once out of
//!   the tree and not kept so, an inode number is forgotten: a path coming
//!   back later gets a new one (numbers are never reused).
//!   Best sent starting exactly {"op":"tree", (a delta {"op":"delta",):
//!   then even its parsing is off the thread that delivers replies.
//!   Defaults: version 0, dir false, size 0, mtime_ns 0, G "". Owner and modes: --uid, --gid, --file-mode, --dir-mode (0440, 0550, root).
//!   With "lazy":true the tree holds the root alone, not listed (entries
//!   are ignored): a directory not listed asks the agent for a name it
//!   lacks alone ("lookup"), and for all its names at its first readdir
//!   ("list").
//!
//! {"op":"listing","path":P,"entries":[...as in "tree"...]}
//!   Directory P ("" the root) now has these entries (its children: others
//!   are skipped) and no others, and is listed; a subdirectory new to the
//!   daemon is not listed. Ignored if P is not a directory in the tree (the
//!   delta removing it came first). Must follow every delta of a version
//!   older than the listing's, and precede every delta of a newer one
//!   (a delta re-applying changes the listing has is harmless). In a delta,
//!   a new name below a directory not listed is skipped (its listing will
//!   have it; a name it holds is changed as anywhere), and a directory a
//!   delta makes is listed: every name in it comes in deltas. With
//!   "partial":true the entries are added to P, its other names kept, and P
//!   stays as listed as it was (the reply to a "lookup"). Sent asked for
//!   ("list", "lookup") or not (the agent listing the tree ahead).
//!
//! {"op":"delta","version":V,"since":S,"entries":[...as in "tree"...],
//!  "gone":[P, ...]}
//!   Changes tree S into tree V, in O(size of the delta), not of the tree.
//!   Ignored (and logged) before the first tree and unless the daemon's
//!   tree is version S: after any doubt, send a whole "tree". First each
//!   path of "gone" leaves the tree (list every path removed, descendants
//!   too; those left unlisted go with their directory), then each entry is
//!   applied as in "tree": a new path is added (missing parents become
//!   directories, an entry below a file is dropped), an existing one takes
//!   its attributes (a directory that becomes a file loses its entries), or
//!   is a new inode if its G changed. What left or changed is invalidated
//!   in the kernel, and files that left are kept as with a new "tree".
//!   Optional "exact":[P, ...]: directories whose contents are now exactly
//!   the delta's entries below them (a dataset replaced): whatever else is
//!   below them leaves, as if in "gone"; they keep their inodes.
//!
//! {"op":"hot","path":P,"backing":B,"inode":I,"version":V,
//!  "pin":S,"keys":[K...],"bucket":K2,"fetched_ns":F}
//!   P of tree V is byte-identical to the local file B (st_ino I); replaces
//!   any entry for P (needs "path" and "backing"; inode and version default
//!   to 0). An open of P becomes a kernel passthrough open of B only if all
//!   hold: the tree version is V; B, opened O_RDONLY, is a regular file with
//!   st_ino I and P's tree size; the marks do not say stale; no agent handle
//!   of P's inode is open or being opened. Otherwise the open goes to the
//!   agent. Stored entries of other versions stay but do not apply. A
//!   passthrough open sets B's mtime to now if it is a second old or more
//!   (the cache's LRU order: such reads never reach the agent).
//!   Marks (the last four fields) are checked only if "pin", "fetched_ns"
//!   and at least one of "keys"/"bucket" are present (a file of several
//!   chunks lists each chunk's key in "keys"). "pin" is a BPF map
//!   pinned on a bpffs: BPF_MAP_TYPE_HASH or LRU_HASH, 8-byte key and value,
//!   native-endian u64s. The entry is stale if map[k] > F for any K of
//!   "keys" or K2 (equal is fresh); no entry, or nothing pinned at S, means 0. Marks and
//!   F are compared as plain numbers: they must come from the same clock.
//!   A map that cannot be read or has another shape counts as stale
//!   (logged). The map fd is kept per pin path and the pin re-stat'ed at
//!   most once a second: a map re-pinned or removed is seen within ~1 s.
//!   While passthrough handles of P's inode are open, every new open must
//!   reuse their backing (even after a "hot" naming another file): the kernel fails an agent open then. Such an open checks the
//!   marks of the current entry if it names the same B and I, else those the
//!   backing was opened with; if stale it fails with ESTALE (116) (the
//!   kernel retries it once, so two ESTALEs and two stale_refused). When
//!   no passthrough handle is open, a stale open goes to the agent.
//!
//! {"op":"stats","id":N}
//!   Answered with {"id":N,"stats":{...}}: u64 counters since start:
//!   passthrough_opens, agent_opens (agent handles kept), reads_forwarded,
//!   bytes_forwarded, lookups, getattrs, readdirs, stale_refused (opens
//!   whose marks said stale, whatever then happened), hot_from_open_reply
//!   (opens made passthrough by their open reply's "hot"; also counted in
//!   passthrough_opens, not in agent_opens), reads_cached, bytes_cached
//!   (reads of agent handles served from their "cached" ranges), releases
//!   (RELEASEs handled: passthrough_opens + agent_opens once all are closed),
//!   lookup_refreshes (lookup misses asked of the agent), listings
//!   (directories of a lazy tree asked of the agent), name_lookups (names
//!   asked alone, in directories not listed), entries_received (entries of
//!   trees, deltas and listings applied), negative_hits
//!   (lookup misses answered ENOENT at once, as asked before: see "refresh"),
//!   and "fetch": {reads, bytes (served from chunks fetched here), gets,
//!   get_bytes (good chunks fetched), ahead (read-ahead fetches started),
//!   ranged (ranged GETs),
//!   bad_checksum, failed_gets, fallbacks (reads then sent to the agent),
//!   sweeps (files swept whole for random readers), sweeps_refused (sweeps
//!   --sweep-mb or the sweepers' bound did not allow)}.
//!   agent_timeouts: requests to the agent unanswered within 60 s (each
//!   failed with EIO, said in the daemon's log). Not counters: entries_held
//!   (entries in the tree now, the root included), kernel_held (inodes the
//!   kernel holds lookups of); and evicted (entries dropped by
//!   --max-entries, below).
//!
//! With --max-entries N (> 0), once a change leaves more than N entries in
//! the tree, the directories looked in longest ago are evicted until about
//! nine tenths of N remain: each is no longer listed (its next readdir asks
//! "list" again, a name it lacks "lookup") and loses every entry the kernel
//! holds no lookup of (LOOKUP and READDIRPLUS replies count, FORGET
//! uncounts), except subdirectories that still have entries; the kernel is
//! told to drop the entries it holds, which go at a later eviction. An
//! entry that goes is a new inode if it comes back. The agent should send
//! no more than N entries unasked.
//!
//! Messages are applied in stream order, and an open reply's "hot" at its
//! place in that order. Trees and deltas are applied by their own thread,
//! so replies keep coming while a big tree is applied; a "stats" is
//! answered after the trees and deltas before it, and a "refresh" reply or
//! any error reply takes effect once those sent before it are applied.
//! Unknown ops are logged and ignored; replies with unknown ids are dropped.
//!
//! ## Daemon -> agent
//!
//! Every request must be answered: the FUSE thread that sent it waits for
//! the reply (for a release, after answering the kernel), so up to
//! --threads requests (and one per CPU's ring with --uring) are outstanding
//! at once; after 60 s it gives up (EIO) and drops the reply when it comes.
//! Reply in any order.
//! {"id":N,"errno":E} fails any request with errno E (E > 0, else EIO).
//!
//! {"op":"open","path":P,"gen":G,"id":N} (read-only opens only)
//!   G is P's "gen" in the daemon's tree: an agent whose P is another file
//!   now fails the open with ESTALE, after sending the newer tree.
//!   -> {"id":N,"handle":H} with optionally
//!      "keep_cache":true  the kernel keeps the pages it has cached for P
//!                         (else it drops them at this open);
//!      "hot":{"backing":B,"inode":I,"version":V,"pin":S,"keys":[K...],
//!             "bucket":K2,"fetched_ns":F}
//!                         recorded exactly like a "hot" message for P,
//!                         then, if this open can now be passthrough, it is
//!                         (no keep_cache) and H is released right away,
//!                         having served no read; else H is used as usual.
//!      "cached":{"backing":B,"inode":I,"ranges":[[S,E],...],"pin":S,
//!                "keys":[K...],"bucket":K2,"fetched_ns":F}
//!                         bytes [S,E) of P are the same bytes at the same
//!                         offsets of the local file B (st_ino I); the
//!                         daemon reads those itself for this handle (only
//!                         a read inside one range). Taken only if B opens
//!                         with inode I and the marks (as for "hot") do
//!                         not say stale; ranges past B's size are dropped.
//!      "fetch":{"chunks":[{"start":S,"bytes":B,"xxh3":X,"urls":[U,...]},...]}
//!                         the file's bytes are these chunks in order (S
//!                         from 0, each B long, together the file's size):
//!                         a read the "cached" ranges do not cover GETs
//!                         the chunk here, from the first URL (http://,
//!                         presigned; never logged whole) whose body has
//!                         B bytes and xxh3_64 X, and goes to the agent
//!                         only if none has; but a read of <= 32 KiB away
//!                         from the last one, of a chunk not at hand, GETs
//!                         only its range (unchecked: a range has no xxh3).
//!                         An erasure-coded chunk has "urls":[] and
//!                         "shards":[{"bytes":SB,"xxh3":SX,"urls":[U]},...]:
//!                         its data shards in order, each GET whole and
//!                         checked (SB bytes, xxh3_64 SX), their payloads
//!                         (after pyeclib's 80-byte header) joined, cut to
//!                         B and checked against X; any failure sends the
//!                         read to the agent (parity is its).
//!                         Ignored unless it is so.
//!   H is any JSON value (null if absent), echoed back verbatim.
//!
//! {"op":"read","handle":H,"offset":O,"size":S,"id":N}
//!   -> {"id":N,"len":L} + L raw bytes. L < S means end of file; bytes
//!   beyond S are read off the socket and dropped. Never put "len" in any
//!   other reply without the bytes. A "cached" object (as in the open
//!   reply) replaces the handle's.
//!
//! {"op":"cached","handle":H,"id":N} -> {"id":N} with optionally "cached"
//!   (as in the open reply) if more of the file is cached here than the
//!   daemon was told: asked at most every 25 ms by the reads of a handle
//!   with "fetch" that are not at hand, since those never reach the agent.
//!
//! {"op":"lookup","path":P,"id":N} -> {"id":N}
//!   A lookup in a directory not listed found no such name: the agent sends
//!   a "partial" "listing" of P's directory holding P, if P exists, before
//!   its reply. A name still missing is remembered as after a "refresh".
//!
//! {"op":"list","path":P,"id":N} -> {"id":N}
//!   The agent sends directory P's "listing" (P as in the tree, "" the
//!   root) before its reply, or fails with ENOENT if it is no directory
//!   now (after sending the delta that removes it).
//!
//! {"op":"refresh","id":N} or {"op":"refresh","why":"stale","id":N} -> {"id":N}
//!   A lookup found no such name, or (why "stale") an open found a hot
//!   file's marks stale: the agent sends its newest tree (or delta) first,
//!   if newer (for a lookup it may skip that if it looked a moment ago). A
//!   name still missing then is remembered (at most 65536 of them): its
//!   lookups fail with ENOENT without asking until the next tree or delta
//!   is applied, so the agent must push its changes unasked. A stale
//!   open whose inode is then gone from the tree (its file replaced or
//!   removed) fails with ESTALE; the kernel looks the path up again and
//!   retries the open, on the new file's inode.
//!
//! {"op":"release","handle":H,"id":N} -> {"id":N}
//!   H gets no further request.
//!
//! {"id":N,"stats":{...}}: the reply to the agent's "stats".
//!
//! Closing the socket makes the daemon unmount and exit; its pending and
//! later FUSE requests to the agent fail with EIO.

mod agent_link;
mod backing;
mod change;
mod fetch;
mod fs;
mod http;
mod marks;
mod stats;
mod tree;

use std::ffi::CString;
use std::io::{BufRead, BufReader, Read};
use std::os::fd::FromRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use fuser::{Config, INodeNo, MountOption, Session, SessionACL};
use serde_json::{json, Value};

use agent_link::{AgentLink, Reply};
use backing::Hot;
use change::Change;
use fs::{FuseFs, Shared};
use tree::{InoMap, Inval, Tree};

/// How long a FUSE request waits for the agent (a read may try every
/// holder, each within its own timeouts) before it fails with EIO.
const AGENT_TIMEOUT: Duration = Duration::from_secs(60);

enum Event {
    FirstTree,
    AgentClosed,
    Signal(i32),
}

struct Args {
    mountpoint: PathBuf,
    agent_fd: i32,
    ttl_ms: u64,
    threads: usize,
    max_entries: usize,
    access: tree::Access,
    allow_other: bool,
    /// Memory for files swept whole for random readers, MiB.
    sweep_mb: u64,
    /// Ask for FUSE over io_uring (a queue per CPU) when the kernel offers it.
    uring: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: ffs-mount MOUNTPOINT --agent-fd N [--attr-ttl-ms 60000] [--threads 2] \
         [--max-entries 0] [--uid 0] [--gid 0] [--file-mode 288] [--dir-mode 360] [--allow-other] \
         [--sweep-mb 0] [--uring]"
    );
    std::process::exit(2);
}

fn parse_args() -> Args {
    let mut mountpoint = None;
    let (mut agent_fd, mut ttl_ms, mut threads, mut max_entries) = (None, 60_000u64, 2usize, 0);
    let mut access = tree::Access::default();
    let (mut allow_other, mut uring) = (false, false);
    let mut sweep_mb = 0;
    let mut it = std::env::args_os().skip(1);
    while let Some(a) = it.next() {
        let mut num = || -> u64 {
            it.next()
                .and_then(|v| v.to_str()?.parse().ok())
                .unwrap_or_else(|| usage())
        };
        match a.to_str() {
            Some("--agent-fd") => agent_fd = Some(num() as i32),
            Some("--attr-ttl-ms") => ttl_ms = num(),
            Some("--threads") => threads = num().max(1) as usize,
            Some("--max-entries") => max_entries = num() as usize,
            Some("--uid") => access.uid = num() as u32,
            Some("--gid") => access.gid = num() as u32,
            Some("--file-mode") => access.file_mode = (num() & 0o777) as u16,
            Some("--dir-mode") => access.dir_mode = (num() & 0o777) as u16,
            Some("--allow-other") => allow_other = true,
            Some("--uring") => uring = true,
            Some("--sweep-mb") => sweep_mb = num(),
            Some(s) if s.starts_with("--") => usage(),
            _ if mountpoint.is_none() => mountpoint = Some(PathBuf::from(a)),
            _ => usage(),
        }
    }
    match (mountpoint, agent_fd) {
        (Some(mountpoint), Some(agent_fd)) => Args {
            mountpoint,
            agent_fd,
            ttl_ms,
            threads,
            max_entries,
            access,
            allow_other,
            uring,
            sweep_mb,
        },
        _ => usage(),
    }
}

/// fuser asserts that /dev/fuse is not fd 0-2; make sure those are taken
/// even if the agent spawned us with closed stdio.
fn ensure_stdio() {
    for fd in 0..3 {
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            let null = CString::new("/dev/null").unwrap();
            unsafe { libc::open(null.as_ptr(), libc::O_RDWR) };
        }
    }
}

/// What the reader hands to the applier thread.
enum Apply {
    /// A "tree" or "delta" line, still to parse.
    Line(Vec<u8>),
    /// A "tree", "delta" or "stats" message.
    Msg(Value),
}

/// Reader thread: dispatches replies by id and applies unsolicited messages,
/// but hands trees, deltas and stats to the applier thread, in order.
fn reader(sock: UnixStream, s: Arc<Shared>, ev: mpsc::Sender<Event>, apply: mpsc::Sender<Apply>) {
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
fn applier(
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

/// Device ("major:minor") of the topmost mount at `mp`, from mountinfo.
/// Reading mountinfo never calls into our own filesystem.
fn mount_dev(mp: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = mp.as_os_str().as_bytes();
    // Later lines are mounted on top of earlier ones: search from the end.
    info.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.len() > 4 && unescape(f[4]) == want).then(|| f[2].to_string())
    })
}

/// mountinfo escapes space, tab, newline and backslash as \ooo.
fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// Unmount only if the topmost mount at `mp` is still ours (the agent may
/// already have detached it and mounted a successor at the same path).
fn unmount_if_ours(mp: &Path, dev: &Option<String>) {
    if dev.is_none() || mount_dev(mp) != *dev {
        return;
    }
    let c = CString::new(mp.as_os_str().as_bytes()).unwrap();
    // Plain umount first; if files are still open, detach lazily. Our exit
    // then closes /dev/fuse, which aborts the connection for those files.
    if unsafe { libc::umount2(c.as_ptr(), 0) } != 0 {
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

fn main() {
    ensure_stdio();
    // The agent is our parent: if it dies, so do we (and we unmount).
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) };
    let args = parse_args();
    let _ = tree::ACCESS.set(args.access);
    // Fetched chunks (4 MiB) from the heap, not each from a fresh mmap: a
    // fresh mapping costs a page fault and a zeroed page per 4 KiB (a fifth
    // of the daemon's CPU on a cold sequential read, measured by perf).
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 << 20);
    }

    // Block the exit signals in every thread; one thread sigwait()s for them.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    let (ev_tx, ev_rx) = mpsc::channel();
    {
        let ev = ev_tx.clone();
        std::thread::spawn(move || loop {
            let mut sig = 0;
            if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
                let _ = ev.send(Event::Signal(sig));
            }
        });
    }

    if unsafe { libc::fcntl(args.agent_fd, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        eprintln!("ffs-mount: --agent-fd {} is not an open fd", args.agent_fd);
        std::process::exit(2);
    }
    let sock = unsafe { UnixStream::from_raw_fd(args.agent_fd) };
    let writer = sock.try_clone().expect("dup agent socket");
    let mut shared = Shared::new(
        AgentLink::new(writer, AGENT_TIMEOUT),
        Duration::from_millis(args.ttl_ms),
    );
    shared.max_entries = args.max_entries;
    shared.uring = args.uring;
    shared.fetcher = Arc::new(fetch::Fetcher::new(fetch::AHEAD, args.sweep_mb << 20));
    let shared = Arc::new(shared);
    // Entries and attributes are cached by the kernel for --attr-ttl-ms; what a
    // new tree changes is invalidated at once, once the session can notify.
    let (inval_tx, inval_rx) = mpsc::channel::<Vec<Inval>>();
    let (apply_tx, apply_rx) = mpsc::channel();
    {
        let s = shared.clone();
        let ev = ev_tx.clone();
        std::thread::spawn(move || applier(apply_rx, s, ev, inval_tx));
    }
    {
        let s = shared.clone();
        let ev = ev_tx.clone();
        std::thread::spawn(move || reader(sock, s, ev, apply_tx));
    }

    // Mount only once the first tree has arrived.
    match ev_rx.recv() {
        Ok(Event::FirstTree) => {}
        _ => {
            eprintln!("ffs-mount: agent socket closed or signal before the first tree");
            std::process::exit(1);
        }
    }

    let mountpoint = args.mountpoint.canonicalize().unwrap_or_else(|e| {
        eprintln!("ffs-mount: mountpoint {}: {e}", args.mountpoint.display());
        std::process::exit(1);
    });
    let mut cfg = Config::default();
    cfg.mount_options = vec![
        MountOption::RO,
        MountOption::FSName("fasterfs".into()),
        MountOption::DefaultPermissions,
    ];
    // fuser 0.18's spelling of allow_other; without it only the mounting user gets in
    cfg.acl = if args.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    cfg.n_threads = Some(args.threads);
    cfg.clone_fd = true; // a /dev/fuse fd per worker thread: no queue shared between them
    let session = match Session::new(FuseFs(shared.clone()), &mountpoint, &cfg) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ffs-mount: mount {}: {e}", mountpoint.display());
            std::process::exit(1);
        }
    };
    let notifier = session.notifier();
    std::thread::spawn(move || {
        for changed in inval_rx {
            for (parent, name, ino) in changed {
                let _ = notifier.inval_entry(INodeNo(parent), std::ffi::OsStr::new(&name));
                if ino != 0 {
                    let _ = notifier.inval_inode(INodeNo(ino), 0, 0);
                }
            }
        }
    });
    let dev = mount_dev(&mountpoint);
    // The BackgroundSession is deliberately never dropped: its Drop would
    // unmount by path without checking that the mount is still ours.
    let bg = session.spawn().unwrap_or_else(|e| {
        eprintln!("ffs-mount: session: {e}");
        unmount_if_ours(&mountpoint, &dev);
        std::process::exit(1);
    });
    eprintln!(
        "ffs-mount: mounted {} ({} threads)",
        mountpoint.display(),
        args.threads
    );

    let code = loop {
        match ev_rx.recv_timeout(Duration::from_millis(200)) {
            Ok(Event::AgentClosed) => break 0,
            Ok(Event::Signal(sig)) => {
                eprintln!("ffs-mount: signal {sig}, exiting");
                break 0;
            }
            Ok(Event::FirstTree) => {}
            Err(mpsc::RecvTimeoutError::Timeout) if bg.guard.is_finished() => break 0, // unmounted elsewhere
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break 1,
        }
    };
    unmount_if_ours(&mountpoint, &dev);
    // exit() without running destructors: closing /dev/fuse ends the session.
    std::process::exit(code);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::sync::Mutex;

    use fs::Misses;
    use tree::ROOT_INO;

    /// The daemon's reader and applier threads (no mount) on one end of a
    /// socketpair; the test is the agent on the other, answering a "refresh"
    /// after sending what `on_refresh` holds.
    struct Daemon {
        s: Arc<Shared>,
        w: Mutex<UnixStream>,
        refreshes: Arc<AtomicU64>,
        on_refresh: Arc<Mutex<Vec<Value>>>,
        replies: Mutex<mpsc::Receiver<Value>>,
    }

    impl Daemon {
        fn start() -> Daemon {
            let (ours, theirs) = UnixStream::pair().unwrap();
            let s = Arc::new(Shared::new(
                AgentLink::new(ours.try_clone().unwrap(), Duration::from_secs(10)),
                Duration::from_secs(1),
            ));
            let (ev, _) = mpsc::channel();
            let (inval, _) = mpsc::channel();
            let (apply_tx, apply_rx) = mpsc::channel();
            let (s1, s2, ev2) = (s.clone(), s.clone(), ev.clone());
            std::thread::spawn(move || applier(apply_rx, s1, ev, inval));
            std::thread::spawn(move || reader(ours, s2, ev2, apply_tx));
            let (refreshes, on_refresh) = (
                Arc::new(AtomicU64::new(0)),
                Arc::new(Mutex::new(Vec::new())),
            );
            let (tx, replies) = mpsc::channel();
            let (r, o, mut w) = (
                refreshes.clone(),
                on_refresh.clone(),
                theirs.try_clone().unwrap(),
            );
            let rd = theirs.try_clone().unwrap();
            std::thread::spawn(move || {
                for line in BufReader::new(rd).lines() {
                    let v: Value = serde_json::from_str(&line.unwrap()).unwrap();
                    match v.get("op").and_then(Value::as_str) {
                        Some("refresh") => {
                            r.fetch_add(1, Relaxed);
                            for m in o.lock().unwrap().drain(..) {
                                writeln!(w, "{m}").unwrap();
                            }
                            writeln!(w, "{}", json!({"id": v["id"]})).unwrap();
                        }
                        Some("lookup") => {
                            // every name but "x*" exists, as a file
                            let p = v["path"].as_str().unwrap();
                            let (dir, name) = p.rsplit_once('/').unwrap_or(("", p));
                            if !name.starts_with('x') {
                                let l = json!({"op": "listing", "path": dir, "partial": true,
                                               "entries": [{"path": p, "size": 2}]});
                                writeln!(w, "{l}").unwrap();
                            }
                            writeln!(w, "{}", json!({"id": v["id"]})).unwrap();
                        }
                        Some("list") => {
                            // every directory holds "f" and "d/" (for the test below)
                            let p = v["path"].as_str().unwrap();
                            let at = |n: &str| {
                                if p.is_empty() {
                                    n.to_string()
                                } else {
                                    format!("{p}/{n}")
                                }
                            };
                            let l = json!({"op": "listing", "path": p,
                                           "entries": [{"path": at("f"), "size": 1}, {"path": at("d"), "dir": true}]});
                            writeln!(w, "{l}").unwrap();
                            writeln!(w, "{}", json!({"id": v["id"]})).unwrap();
                        }
                        None => tx.send(v).unwrap(),
                        Some(op) => panic!("unexpected request {op}"),
                    }
                }
            });
            Daemon {
                s,
                w: Mutex::new(theirs),
                refreshes,
                on_refresh,
                replies: Mutex::new(replies),
            }
        }

        fn send(&self, m: Value) {
            writeln!(self.w.lock().unwrap(), "{m}").unwrap();
        }

        /// Once the daemon has applied all sent before (its "stats" reply comes after them).
        fn stats(&self) -> Value {
            self.send(json!({"op": "stats", "id": 7}));
            let r = self
                .replies
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(10))
                .unwrap();
            r["stats"].clone()
        }

        fn refreshes(&self) -> u64 {
            self.refreshes.load(Relaxed)
        }
    }

    #[test]
    fn lookup_misses_are_asked_once_until_the_tree_changes() {
        let d = Daemon::start();
        d.send(json!({"op": "tree", "version": 1, "entries": [{"path": "a"}]}));
        d.stats();
        assert!(d.s.find(ROOT_INO, "a").is_ok());
        assert!(d.s.find(ROOT_INO, "b").is_err());
        assert_eq!(d.refreshes(), 1);
        assert!(d.s.find(ROOT_INO, "b").is_err());
        assert_eq!(d.refreshes(), 1, "a known miss is not asked again");
        assert!(d.s.find(ROOT_INO, "c").is_err());
        assert_eq!(d.refreshes(), 2, "another name is");
        let st = d.stats();
        assert_eq!(
            (
                st["negative_hits"].as_u64(),
                st["lookup_refreshes"].as_u64()
            ),
            (Some(1), Some(2))
        );

        // Any change to the namespace forgets the misses.
        d.send(json!({"op": "delta", "version": 2, "since": 1, "entries": [{"path": "x"}], "gone": []}));
        d.stats();
        assert!(d.s.find(ROOT_INO, "b").is_err());
        assert_eq!(d.refreshes(), 3);

        // A delta sent before the refresh reply is seen by the retry.
        // (Big, so that the reply would otherwise overtake it.)
        let mut e: Vec<Value> = (0..20_000)
            .map(|i| json!({"path": format!("n/f{i}")}))
            .collect();
        e.push(json!({"path": "n/m", "size": 4}));
        let delta = json!({"op": "delta", "version": 3, "since": 2, "entries": e, "gone": ["x"]});
        d.on_refresh.lock().unwrap().push(delta);
        let n = d.s.find(ROOT_INO, "n").expect("applied before the retry");
        assert_eq!(n.kind, fuser::FileType::Directory);
        assert_eq!(d.s.tree().version, 3);
        assert!(d.s.find(ROOT_INO, "x").is_err());
        assert_eq!(d.refreshes(), 5);

        // A delta that does not follow the tree is ignored (and changes nothing).
        d.send(json!({"op": "delta", "version": 9, "since": 2, "entries": [{"path": "b"}], "gone": ["a"]}));
        d.stats();
        let t = d.s.tree();
        assert_eq!(t.version, 3);
        assert!(t.child(ROOT_INO, "a").is_some() && t.child(ROOT_INO, "b").is_none());
        assert!(d.s.find(ROOT_INO, "x").is_err());
        assert_eq!(d.refreshes(), 5, "the misses stay: nothing changed");

        // A whole tree forgets them too.
        d.send(json!({"op": "tree", "version": 10, "entries": [{"path": "a"}]}));
        d.stats();
        assert!(d.s.find(ROOT_INO, "x").is_err());
        assert_eq!(d.refreshes(), 6);
    }

    #[test]
    fn a_lazy_tree_asks_for_a_name_at_a_lookup_and_for_a_directory_at_a_readdir() {
        let d = Daemon::start();
        d.send(json!({"op": "tree", "version": 1, "lazy": true, "entries": []}));
        d.stats();
        assert_eq!(d.s.find(ROOT_INO, "x").err(), Some(libc::ENOENT));
        assert_eq!(d.s.find(ROOT_INO, "x").err(), Some(libc::ENOENT));
        let g = d.s.find(ROOT_INO, "g").expect("asked, then found");
        assert_eq!((g.kind, g.size), (fuser::FileType::RegularFile, 2));
        assert!(!d.s.tree().listed(ROOT_INO));
        let st = d.stats();
        assert_eq!(
            (
                st["name_lookups"].as_u64(),
                st["negative_hits"].as_u64(),
                st["listings"].as_u64()
            ),
            (Some(2), Some(1), Some(0)),
            "each name asked alone; a known miss not again"
        );
        // A readdir's listing: the root's names are the agent's, "g" gone.
        let t = d.s.listed_tree(ROOT_INO).unwrap();
        assert!(t.listed(ROOT_INO) && t.child(ROOT_INO, "g").is_none());
        let dir = d.s.find(ROOT_INO, "d").unwrap();
        assert_eq!(dir.kind, fuser::FileType::Directory);
        assert_eq!(d.s.find(ROOT_INO, "y").err(), Some(libc::ENOENT));
        assert_eq!(
            d.refreshes(),
            1,
            "in a listed directory a missing name may be newer: refreshed"
        );
        assert!(
            d.s.find(dir.ino.0, "f2").is_ok(),
            "a subdirectory is asked name by name"
        );
        assert_eq!(d.stats()["listings"].as_u64(), Some(1));
    }

    #[test]
    fn a_delta_before_the_first_tree_is_ignored() {
        let d = Daemon::start();
        d.send(json!({"op": "delta", "version": 1, "since": 0, "entries": [{"path": "a"}], "gone": []}));
        d.stats();
        assert!(d.s.tree().child(ROOT_INO, "a").is_none());
    }

    #[test]
    fn misses_are_bounded_and_kept_per_tree() {
        let mut m = Misses::default();
        m.add(1, 1, "x");
        assert!(m.has(1, 1, "x") && !m.has(1, 2, "x") && !m.has(2, 1, "x"));
        m.add(0, 1, "y"); // found missing in an older tree: not remembered
        assert!(!m.has(0, 1, "y") && !m.has(1, 1, "y"));
        for i in 0..70_000 {
            m.add(1, 1, &format!("n{i}"));
            assert!(m.len() <= 65_536);
        }
        m.reset(2);
        assert_eq!(m.len(), 0);
    }
}
