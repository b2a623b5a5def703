"""paused(): Python's cycle collector held off while a million objects are made at once.

Each collection of the oldest generation walks every object alive; building a namespace of a
million names (its manifests, then a node's index) triggers it again and again as the objects
pile up, which at 1M names tripled the build (40 s of 52 s for an index, measured). Nothing
built here has cycles: reference counting frees it all the same. Threads pausing at once
share one pause: the collector is back on when the last of them leaves."""
from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_holders = 0
_was_on = False


@contextmanager
def paused() -> Iterator[None]:
    global _holders, _was_on
    with _lock:
        if _holders == 0:
            _was_on = gc.isenabled()
            gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _was_on:
                gc.enable()
