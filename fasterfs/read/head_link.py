"""HeadLink: a reader's way to the Registry on the head, and to this host's copy of the namespace
while the head is away.

Reading needs the head only to learn names. When the Registry does not answer within
namespace.head_timeout_s (the head's machine died, its GCS was killed, it is being started
again), the reader goes on at once with the newest namespace replica on this host's disk (each
StorageNode's, fasterfs.meta.replica: it holds every change the head acknowledged, so a name known
before the head went is known still); the Registry is not asked again on a reader's path until
a background probe finds it back (every namespace.head_retry_s). A reader never waits on the
head more than once per absence. Where this host holds no replica (a machine that is no storage
host, a reader that cannot read the cluster root), a lookup fails with an error that says so.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..control import credentials, identity, registry
from ..control.credentials import Credentials
from ..control.state import ClusterState
from ..core.config import Paths
from ..core.errors import FasterFSError, HeadUnreachable
from ..meta.replica import FILE as REPLICA_FILE
from ..meta.replica import Replica, ReplicaView

log = logging.getLogger("fasterfs.read.head_link")


class HeadAway(Exception):
    """The Registry did not answer: ask `HeadLink.local()`."""


# the Registry's reads a replica answers too: Registry method -> ReplicaView method
LOCAL = {"resolve": "resolve", "list_attrs": "attrs", "listdir": "listdir", "manifest": "manifest"}


def _head_errors() -> tuple[type[BaseException], ...]:
    import ray

    return FasterFSError, ray.exceptions.RayError


class HeadLink:
    """`headless`: this process started while the head was away and never joined Ray; the host's
    copy answers for its whole life (the host's StorageNode keeps that copy current once the head
    is back, so new names still show)."""

    def __init__(self, cluster: str, root: str | Path, timeout_s: float, retry_s: float,
                 ask: Callable | None = None, headless: bool = False):
        self.cluster, self.root, self.timeout_s, self.retry_s = cluster, Path(root), timeout_s, retry_s
        self._ask = ask or self._registry
        self._handle = None  # the Registry's, kept: looking it up asks the GCS, which may be what went away
        self.headless = headless
        self.away_since: float | None = time.time() if headless else None  # when the head last stopped answering
        self.away_count = 0  # absences seen
        self.local_answers = 0  # answers given from the replica meanwhile
        self._view: ReplicaView | None = None
        self._lock = threading.Lock()

    def _registry(self, what: str, *args):
        """The Registry's answer within timeout_s. A call on a kept handle goes to the actor
        itself; a lookup of one waits on the GCS, unbounded while the head is away."""
        import ray

        if self._handle is None:
            self._handle = registry.handle(self.cluster)
        try:
            return ray.get(getattr(self._handle, what).remote(*args), timeout=self.timeout_s)
        except BaseException:
            self._handle = None  # a Registry made again (up on a head back) is another actor: looked up anew
            raise

    def ask(self, what: str, *args):
        """The Registry's answer; HeadAway while the head is away (at once, once it is known to be)."""
        if self.away_since is not None:
            raise HeadAway
        try:
            return self._ask(what, *args)
        except _head_errors() as e:
            self._went_away(e)
            raise HeadAway from None

    def read(self, what: str, *args):
        """The Registry's answer to one of the reads in LOCAL, or this host's copy's while the head is away."""
        try:
            return self.ask(what, *args)
        except HeadAway:
            return getattr(self.local(), LOCAL[what])(*args)

    def _went_away(self, why: BaseException) -> None:
        with self._lock:
            if self.away_since is not None:
                return
            self.away_since = time.time()
            self.away_count += 1
        view = self.local()
        s = view.summary()
        log.warning("the head does not answer (%s: %s); names are answered from this host's namespace copy %s "
                    "(version %d, %d names, last changed %.0f s ago) until it is back", type(why).__name__,
                    str(why)[:200], s.path, s.version, s.names, time.time() - s.updated)
        threading.Thread(target=self._probe, name="head-probe", daemon=True).start()

    def _probe(self) -> None:
        if self.headless:  # not joined: asking would start a Ray of its own
            return
        while True:
            time.sleep(self.retry_s)
            try:
                self._ask("namespace_version")
            except _head_errors():
                continue
            log.warning("the head answers again after %.0f s", time.time() - (self.away_since or time.time()))
            self.away_since = None
            return

    def local(self) -> ReplicaView:
        """The newest namespace replica of this cluster on this host's disk."""
        with self._lock:
            if self._view is None:
                best = None
                for ident in identity.recorded(str(self.root), self.cluster):
                    path = Paths(self.root).node_dir(ident["node"]) / REPLICA_FILE
                    s = Replica.summary(path) if path.exists() else None
                    if s is not None and s.error is None and (best is None or s.version > best.version):
                        best = s
                if best is None:
                    raise FasterFSError(f"the head of cluster {self.cluster!r} does not answer, and this host holds "
                                        f"no copy of the namespace under {self.root} (no storage node's replica "
                                        "readable here): names cannot be looked up until the head is back")
                self._view = ReplicaView(Path(best.path))
            self.local_answers += 1
            return self._view

    def status(self) -> dict:
        """Whether the head answers, and what answers meanwhile (its age stated)."""
        if self.away_since is None:
            return {"head": "answering", "absences": self.away_count}
        if self.headless:
            return {"head": "away when this process started", "since": self.away_since,
                    "answered_locally": self.local_answers, "copy": self._view and self._view.summary().path}
        s = self._view.summary() if self._view is not None else None
        return {"head": "away", "since": self.away_since, "absences": self.away_count,
                "answered_locally": self.local_answers,
                "copy": None if s is None else {"path": s.path, "version": s.version, "names": s.names,
                                                "age_s": round(time.time() - s.updated, 1)}}


def without_head(cfg, root, why: HeadUnreachable) -> tuple[ClusterState, Credentials, HeadLink]:
    """A reader started while nothing answers at the head: the cluster's state from its state file
    on this host, the names from this host's newest replica, the MinIO keys from the copy beside it
    (both 0600, so root's). Where this host holds no state file or no replica, `why` is raised."""
    root = Path(root or cfg.cluster.root)
    try:
        state = ClusterState.load(root).trust()
        link = HeadLink(state.name, root, float(cfg.namespace.head_timeout_s), float(cfg.namespace.head_retry_s),
                        headless=True)
        copy = link.local()
        keys = credentials.load(copy.path.parent / credentials.NODE_COPY).role("reader")
    except (FasterFSError, OSError) as e:
        raise HeadUnreachable(f"{why}; and this host cannot read without the head: {e}") from None
    s = copy.summary()
    log.warning("%s; reading from this host's namespace copy %s (version %d, %d names, last changed %.0f s ago)",
                why, s.path, s.version, s.names, time.time() - s.updated)
    return state, keys, link
