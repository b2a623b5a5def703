"""MarkKeeper: keeps the kernel's stale marks worth trusting.

Readers trust a cache entry when no mark newer than its fetch is set for its key or its bucket.
Two things would break that silently, and both end in the suspect mark instead (the bucket's
key, marked by the kernel, fasterfs.bpf): a write the kernel cannot name (a multi-object delete)
or cannot record (its STALE event lost to a full ring, its key finding the mark map full). While
it is set every entry fetched before it reads as stale; the keeper then checks every entry
against its holders (an ETag each), drops what changed, is gone or cannot be vouched for, and
clears the mark — unless another suspect write came meanwhile, when it checks again.

It also removes marks older than `keep_s`: by then their STALE event was acted on (or lost, and
the suspect check covered it) and no fill that began before the write is still running, so the
map holds only recent writes and fills only under a flood.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..bpf.backend import KernelBackend

log = logging.getLogger("fasterfs.node.mark_keeper")
POLL_S = 0.2
SWEEP_S = 10.0


class MarkKeeper:
    """`check()` verifies every cache entry and returns how many it dropped; `tell_peers()` asks
    the other nodes to check theirs (a write this kernel lost may be cached there too)."""

    def __init__(self, kernel: KernelBackend, check: Callable[[], int], tell_peers: Callable[[], None],
                 keep_s: float):
        self.kernel, self.check, self.tell_peers, self.keep_s = kernel, check, tell_peers, keep_s
        self._wake = threading.Event()
        self._asked = False      # suspect() was called: check even where the kernel keeps no marks
        self._from_peers = 0     # suspect marks made here for a peer's word (not told back)
        self._kernel_seen = 0    # the kernel's own suspect marks already acted on
        self.checks = self.entries_dropped = self.marks_swept = 0
        self.last_check_s: float | None = None

    def stats(self) -> dict:
        return {"checks": self.checks, "entries_dropped": self.entries_dropped, "last_check_s": self.last_check_s,
                "marks_swept": self.marks_swept}

    def suspect(self, from_peer: bool = False) -> None:
        """Every entry fetched before now is to be checked before it is served again."""
        if from_peer:
            self._from_peers += 1
        self.kernel.marks.mark_suspect()
        self._asked = True
        self._wake.set()

    def run(self, stopping: threading.Event) -> None:
        swept = time.monotonic()
        while not stopping.is_set():
            self._wake.wait(POLL_S)
            self._wake.clear()
            try:
                if self._asked or self.kernel.marks.suspect_mark():
                    self.resync()
                if time.monotonic() - swept >= SWEEP_S:
                    swept = time.monotonic()
                    self.sweep()
            except Exception:
                log.exception("keeping the stale marks failed")

    def resync(self) -> int:
        """Check every entry, then clear the suspect mark; again while new suspect writes come.
        Returns the entries dropped."""
        dropped = 0
        while True:
            began = time.monotonic()
            self._asked = False
            seq = self.kernel.marks.suspect_seq()
            own = seq - self._from_peers
            if own != self._kernel_seen:  # this kernel lost or could not name a write: peers may hold it
                self._kernel_seen = own
                self.tell_peers()
            dropped += self.check()
            self.checks += 1
            self.last_check_s = round(time.monotonic() - began, 3)
            if self.kernel.marks.clear_suspect(seq):
                break
        self.entries_dropped += dropped
        if dropped:
            log.info("suspect writes: %d cache entries changed, gone or unverifiable, dropped", dropped)
        return dropped

    def sweep(self) -> int:
        gone = self.kernel.marks.sweep_marks(time.monotonic_ns() - int(self.keep_s * 1e9))
        self.marks_swept += gone
        return gone
