"""Stamp: when something happened, kept so that a step of the wall clock cannot change its age.

A stamp is kept on disk (JSON), so it carries both clocks: the kernel's CLOCK_MONOTONIC with the
boot it counts from (system-wide: it survives a process restart, and no clock step moves it),
and the wall clock, for after a reboot. Within one boot an age is the monotonic clock's; across
a reboot, the wall clock's, never below 0. Without this a head whose clock jumped an hour ahead
would expire at once every generation readers still hold (ingest.keep_old_s).
"""
from __future__ import annotations

import time
from pathlib import Path

import xxhash


def _boot_id() -> int:
    try:
        raw = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return 0
    return xxhash.xxh3_64_intdigest(raw.encode())


BOOT = _boot_id()


def now() -> dict:
    return {"wall": time.time(), "mono": time.monotonic(), "boot": BOOT}


def age(stamp: dict | float) -> float:
    """Seconds since `stamp` (a bare number: a wall-clock time, as files before stamps kept)."""
    if not isinstance(stamp, dict):
        stamp = {"wall": stamp}
    if stamp.get("boot") == BOOT and "mono" in stamp:
        return time.monotonic() - stamp["mono"]
    return max(0.0, time.time() - stamp["wall"])
