"""paused(): Python's cycle collector held off while a million objects are made at once.

Each collection of the oldest generation walks every object alive; building a namespace of a
million names (its manifests, then a node's index) triggers it again and again as the objects
pile up: at 1M names a node's index took 40 s with it and 12 s without (measured). Nothing
built here has cycles: reference counting frees it all the same. Threads pausing at once
share one pause: the collector is back on when the last of them leaves.

`freeze`: what is alive when the pause ends is moved out of the collector's sight for good
(`gc.freeze`, constant time): a StorageNode's whole namespace lives until replaced, and each
later full collection would walk it again (17 s a collection at 1M names on the loaded 2 cores
here; 0.05 ms frozen). Frozen objects are still freed by reference counting; a cycle of garbage
among them would never be (so only whole builds freeze, not each change).
"""
from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_holders = 0
_was_on = False
_freeze = False


@contextmanager
def paused(freeze: bool = False) -> Iterator[None]:
    global _holders, _was_on, _freeze
    with _lock:
        if _holders == 0:
            _was_on, _freeze = gc.isenabled(), False
            gc.disable()
        _holders += 1
        _freeze = _freeze or freeze
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0:
                if _freeze:
                    gc.freeze()
                if _was_on:
                    gc.enable()
