"""The read-only FUSE mount of the namespace: `fasterfs mount /mnt/ffs`, then any program
reads `/mnt/ffs/<dataset>/chunks/chunk-00003.csv` or a file stored with `put`.

Two processes per mount, started and supervised by the host's StorageNode (restarted with
the mount point cleaned up if they die):

- `ffs-mount` (native/ffs-mount: Rust on the `fuser` crate) talks to the kernel. It answers
  lookups, attributes and listings from its tree: the root alone at the start (whatever the
  namespace's size), then every directory's names as this agent lists them in the background
  (`warm`, up to mount.warm_entries); a name it lacks meanwhile is asked of this agent alone, a
  directory's names at its first listing (one store call each); the changes come as the store
  logs them, each with the changed names alone. It
  answers opens of hot files by itself: a file whose bytes are one fresh entry of this
  host's cache (a file of one chunk: its entry; a stored file of several: its file entry,
  every chunk filled) is opened with FUSE passthrough on that file, so the kernel reads it
  as a local file, with no daemon on the way. Before such an open it checks that the entry is
  still the one declared (its inode) and that the kernel has seen no write of the chunk
  since it was fetched (the pinned stale marks, as every reader does).
- this agent, its parent, holds the namespace (`reader.Namespace`). Every other open comes
  here; its reply tells the daemon where the file's bytes are (each chunk's holders as
  presigned GETs, `_fetch`), so the daemon fetches misses from MinIO itself, checked by xxh3,
  and the kernel counts those GETs and makes chunks hot. Reads come here only where the daemon
  cannot fetch (MinIO over TLS, a simulated kernel, no good copy at any holder; an
  erasure-coded chunk with a data shard missing or wrong: the parity is read here) and take
  the client's path (this host's cache, else a holder's MinIO). Once all of a
  file's chunks are cached, the agent declares it hot to the daemon.

    python -m fasterfs.read.mount MOUNTPOINT [overrides...]     (what the StorageNode runs)

Messages on the socket pair: newline-delimited JSON; a read's reply is followed by its bytes.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading

from ..control.state import leave
from ..core import config
from ..core.errors import FasterFSError
from . import fuse_uring
from .mount_agent import Agent
from .reader import Namespace

log = logging.getLogger("fasterfs.read.mount")
DAEMON = config.PROJECT_DIR / "native" / "ffs-mount" / "target" / "release" / "ffs-mount"


def daemon_binary() -> str:
    if not os.access(DAEMON, os.X_OK):
        raise FasterFSError(f"the native FUSE daemon {DAEMON} is not built: run `make setup` (it needs cargo)")
    return str(DAEMON)


def daemon_args(cfg, uring: bool = False) -> list[str]:
    """The daemon's options from config `mount.*`: its FUSE threads, its bound, who may read,
    whether it asks for FUSE over io_uring (`uring`: the kernel's side is on), and the memory
    it may hold of files swept whole for random readers."""
    m = cfg.mount
    return ["--threads", str(int(m.threads)), "--max-entries", str(int(m.max_entries)),
            "--uid", str(m.uid), "--gid", str(m.gid),
            "--file-mode", str(config.mode(m.file_mode)), "--dir-mode", str(config.mode(m.dir_mode)),
            *(["--allow-other"] if m.allow_other else []),
            *(["--uring"] if uring else []), "--sweep-mb", str(int(m.sweep_mb))]


def warm_bound(m) -> int:
    """Entries listed to the daemon unasked: mount.warm_entries, and room left under its bound
    (it evicts down to nine tenths of mount.max_entries once past it)."""
    warm, most = int(m.warm_entries), int(m.max_entries)
    return min(warm, most * 9 // 10) if most else warm


def serve(mountpoint: str, overrides: list[str]) -> None:
    cfg = config.load(overrides)
    ns = Namespace(cfg)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    agent = Agent(ns, ours, native_fetch=bool(cfg.mount.native_fetch))
    uring = bool(cfg.mount.uring) and fuse_uring.enable()  # before the daemon's INIT
    daemon = subprocess.Popen([daemon_binary(), mountpoint, "--agent-fd", str(theirs.fileno()),
                               *daemon_args(cfg, uring)],
                              pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
    theirs.close()
    agent.tree.start_tree()  # the daemon mounts once it has the first tree
    log.info("serving namespace version %d of cluster %s at %s (daemon %d)", ns.version, ns.state.name,
             mountpoint, daemon.pid)

    def stop(*_) -> None:
        daemon.terminate()
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    threading.Thread(target=agent.tree.watch, name="namespace-watch", daemon=True).start()
    threading.Thread(target=agent.hot_soon, name="hot-soon", daemon=True).start()
    threading.Thread(target=agent.tree.warm, args=(warm_bound(cfg.mount),), name="warm", daemon=True).start()
    try:
        agent.serve()  # until the daemon closes its end (unmounted, or it died)
    finally:
        if daemon.poll() is None:
            daemon.terminate()
        daemon.wait(timeout=30)
        if uring:
            fuse_uring.release(os.getpid())
        leave()  # the unmount waits for this process


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve(sys.argv[1], sys.argv[2:])
