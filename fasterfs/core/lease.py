"""Lease: one holder at a time of a role (the repair leader), granted by one granter (the
Registry, on the head) for `ttl_s` of the granter's own monotonic clock.

A holder that cannot renew in time loses it: a host cut off from the head, a frozen process, a
host whose wall clock stepped (no host's clock is read). Every grant to a new holder raises the
epoch; a write made under an older epoch is refused (a fencing token), so a leader that was
cut off and does not know it yet cannot apply what it repaired over its successor's work.
"""
from __future__ import annotations

import time
from collections.abc import Callable


class Lease:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.holder: int | None = None
        self.epoch = 0
        self._until = float("-inf")

    def acquire(self, who: int, ttl_s: float) -> int | None:
        """Grant or renew the lease to `who` for ttl_s; its epoch, or None while another holds it."""
        now = self.clock()
        if self.holder != who and now < self._until:
            return None
        if self.holder != who:
            self.holder, self.epoch = who, self.epoch + 1
        self._until = now + ttl_s
        return self.epoch

    def valid(self, who: int, epoch: int) -> bool:
        """`who` holds the lease of `epoch` now (what a fenced write checks)."""
        return self.holder == who and self.epoch == epoch and self.clock() < self._until

    def to_dict(self) -> dict:
        return {"holder": self.holder, "epoch": self.epoch, "left_s": max(0.0, self._until - self.clock())}
