"""Debian's libbpf1 through ctypes: what bcc 0.26 has no Python wrapper for (pinning and
reading maps from any process, BPF_PROG_TEST_RUN). Loaded once per process."""
from __future__ import annotations

import ctypes as ct
import ctypes.util
import functools

from ..core.errors import FasterFSError


@functools.cache
def lib() -> ct.CDLL:
    name = ctypes.util.find_library("bpf") or "libbpf.so.1"
    try:
        return ct.CDLL(name, use_errno=True)
    except OSError as e:
        raise FasterFSError(f"libbpf not found ({e}): apt-get install libbpf1") from None
