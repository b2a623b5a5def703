"""FasterFS's kernel side: eBPF programs that learn which chunks are hot (TC) and tune
MinIO connections (SOCK_OPS), or a labelled simulation where eBPF cannot run."""
from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

from ..core.errors import FasterFSError
from .backend import KernelBackend


def unavailable_reason() -> str | None:
    """Why real eBPF cannot run here, or None if it can."""
    if sys.platform != "linux":
        return f"not Linux ({sys.platform})"
    if os.geteuid() != 0:
        return "not running as root"
    try:
        import bcc  # noqa: F401  (Debian's python3-bpfcc, linked into the virtualenv by setup)
    except ImportError:
        return "BCC's Python module is missing (apt-get install python3-bpfcc; make setup)"
    if not Path(f"/lib/modules/{platform.release()}/build/include").exists():
        return f"no kernel headers at /lib/modules/{platform.release()}/build (make setup links Debian's)"
    return None


def load(mode: str = "auto", hot_threshold: int = 2, fill_mark: int = 0, delack_max_us: int = 5000,
         on_event=None, **maps) -> KernelBackend:
    """KernelPrograms where eBPF works (mode auto or real), else SimulatedPrograms (mode auto
    or simulated). mode=real fails loudly instead of falling back. `maps`: the bucket and map
    sizes (KernelPrograms' bucket, stale_marks, ring_pages)."""
    if mode not in ("auto", "real", "simulated"):
        raise FasterFSError(f"option kernel.mode={mode!r}: must be auto, real or simulated")
    reason = "kernel.mode=simulated" if mode == "simulated" else unavailable_reason()
    if reason is None:
        from .programs import KernelPrograms

        return KernelPrograms(hot_threshold, fill_mark, delack_max_us, on_event, **maps)
    if mode == "real":
        raise FasterFSError(f"kernel.mode=real but eBPF cannot run here: {reason}")
    from .simulated import SimulatedPrograms

    return SimulatedPrograms(hot_threshold, fill_mark, delack_max_us, on_event, reason=reason)
