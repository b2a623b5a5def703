"""Bounds on background work: a rate of units (bytes, keys) per second, and a share of the time.

A rate suits work whose cost is its size (repair's bytes); a share suits work whose cost per
step is not known in advance and grows with nothing the caller counts (a MinIO listing's slice,
a GET of a small object): each step is timed and followed by a rest, so that the steps take at
most that share of the wall-clock time whatever the machine.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger("fasterfs.core.pace")


class Throttle:
    """At most `rate` units per second, over the whole run (0: unbounded)."""

    def __init__(self, rate: float):
        self.rate, self.next, self.lock = rate, time.monotonic(), threading.Lock()

    def take(self, n: int) -> None:
        if self.rate <= 0:
            return
        with self.lock:
            now = time.monotonic()
            self.next = max(self.next, now) + n / self.rate
            wait = self.next - now - n / self.rate
        if wait > 0:
            time.sleep(wait)


class Pacer:
    """Steps that take at most `share` (0 < share <= 1) of the time: after each, a rest of what
    it took times (1 / share - 1). `rest` is time.sleep but for tests."""

    def __init__(self, share: float, rest: Callable[[float], None] = time.sleep):
        if not 0 < share <= 1:
            raise ValueError(f"a share of the time must be in (0, 1], not {share}")
        self.share, self.rest = share, rest

    @contextmanager
    def step(self) -> Iterator[None]:
        began = time.monotonic()
        yield
        if self.share < 1:
            self.rest((time.monotonic() - began) * (1 / self.share - 1))


def every(interval_s: float, fn: Callable[[], object], stopping: threading.Event, what: str) -> None:
    """Run `fn` every `interval_s` (0: never) in a thread of its own until `stopping`; a failed
    round is logged and the next one comes."""
    def loop() -> None:
        while interval_s and not stopping.wait(interval_s):
            try:
                fn()
            except Exception:
                log.exception("%s failed", what)
    threading.Thread(target=loop, name=what, daemon=True).start()
