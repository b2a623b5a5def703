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
//! The protocol spoken with the agent: protocol.rs.

mod agent_link;
mod apply;
mod backing;
mod change;
mod edit;
mod evict;
mod fetch;
mod fetcher;
mod fs;
mod http;
mod inbound;
mod lookup;
mod marks;
mod open;
mod protocol;
mod read;
mod readahead;
mod shared;
mod stats;
mod sweep;
mod tree;
mod unmount;
mod wire;

use std::ffi::CString;
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use fuser::{Config, INodeNo, MountOption, Session, SessionACL};

use agent_link::AgentLink;
use fs::FuseFs;
use inbound::{applier, reader, Event};
use shared::Shared;
use tree::Inval;
use unmount::{mount_dev, unmount_if_ours};

/// How long a FUSE request waits for the agent (a read may try every
/// holder, each within its own timeouts) before it fails with EIO.
const AGENT_TIMEOUT: Duration = Duration::from_secs(60);

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
    shared.fetcher = Arc::new(fetcher::Fetcher::new(fetch::AHEAD, args.sweep_mb << 20));
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
