"""The fault harness's (jobs/faults.py) readers and what their reads are judged by: Reader, an
actor reading random chunks and recording each read's bytes and time; WriteHistory, every
version each object has had, against which each read is checked afterwards; and the verdict."""
from __future__ import annotations

import os
import random
import threading
import time

import ray
from xxhash import xxh3_64_intdigest

from ..core.errors import FasterFSError
from ..read.read_session import NoGoodCopy
from ..read.tables import connect


@ray.remote(num_cpus=0, max_restarts=0, max_concurrency=2)  # type: ignore[call-overload]  # stop() while run() reads
class Reader:
    """Reads random chunks for a while (or until stopped), recording what each read returned and
    when (checked against the write history afterwards); reconnects now and then to follow new
    generations."""

    def __init__(self, root: str, seed: int):
        self.root, self.rng = root, random.Random(seed)
        self.counts = {"failed": 0, "generations": 0}
        self.errors: list[str] = []
        self.reads: list[tuple] = []  # (key, xxh3 of the bytes, start, end, chunk id), wall-clock
        self.failures: list[tuple] = []  # (start, end) of each failed read
        self.no_good_copy: list[tuple] = []  # (start, end, holders) of each read no copy could serve
        self.stopped = threading.Event()

    def pid(self) -> int:
        return os.getpid()

    def stop(self) -> None:
        self.stopped.set()

    def run(self, seconds: float, reconnect_every: int) -> dict:
        deadline = time.monotonic() + seconds
        client = connect(self.root)
        seen, n = {client.manifest.generation}, 0
        while time.monotonic() < deadline and not self.stopped.is_set():
            if n and n % reconnect_every == 0:
                client = connect(self.root)
                seen.add(client.manifest.generation)
            n += 1
            i = self.rng.randrange(len(client))
            start = time.time()
            try:
                data = client.read_chunk(i)
            except NoGoodCopy as e:  # every copy down, cut off, hung or rotten at once: reported, with the hosts
                self.no_good_copy.append((start, time.time(), e.nodes))
                continue
            except Exception as e:
                self.counts["failed"] += 1
                self.failures.append((start, time.time()))
                self.errors.append(f"chunk {i}: {type(e).__name__}: {e}"[:1000])
                continue
            self.reads.append((client.manifest.chunk(i).key, xxh3_64_intdigest(data), start, time.time(), i))
        self.counts["generations"] = len(seen)
        return {**self.counts, "reads": self.reads, "failures": self.failures, "no_good_copy": self.no_good_copy,
                "errors": self.errors[-10:]}


class WriteHistory:
    """Every version each object has had: (xxh3, write began, write ended), in order."""

    def __init__(self, late_s: float = 0.0):
        self.versions: dict[str, list[tuple[int, float, float]]] = {}
        self.late_s = late_s  # a version replaced at most this long before the read: 'late', not 'stale'

    def add_manifest(self, manifest) -> None:
        now = time.time()
        for c in manifest.chunks:
            self.versions.setdefault(c.key, []).append((c.xxh3, float("-inf"), now))

    def add(self, key: str, checksum: int, begin: float, end: float) -> None:
        self.versions[key].append((checksum, begin, end))

    def check(self, key: str, got: int, start: float, end: float) -> str | None:
        """None if `got` was a current version of `key` at some moment in [start, end]:
        written (begun) before the read ended, not replaced (a later write ended) before it
        began. Otherwise 'wrong: ...', 'late: ...' (replaced at most late_s before the read began:
        the word of a write on another host still on its way) or 'stale: ...'."""
        versions = self.versions.get(key, [])
        replaced_at = []
        for k, (checksum, begun, _) in enumerate(versions):
            if checksum != got:
                continue
            replaced = versions[k + 1][2] if k + 1 < len(versions) else float("inf")
            if begun <= end and start <= replaced:
                return None
            replaced_at.append(replaced)
        if not replaced_at:
            return f"wrong: {key}: bytes no write stored (read {start:.3f}-{end:.3f})"
        late = start - max(r for r in replaced_at if r < start)
        kind = "late" if late <= self.late_s else "stale"
        return f"{kind}: {key}: a version replaced {late * 1e3:.1f} ms before the read began (read at {start:.3f})"


def max_or_none(xs: list[float | None]) -> float | None:
    done = [x for x in xs if x is not None]
    return round(max(done), 1) if done else None


def p99(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(0.99 * len(xs)))]


def disk_bytes(directory) -> int:
    total = 0
    try:
        for f in os.scandir(directory):
            try:
                total += f.stat().st_size if f.is_file() else 0
            except FileNotFoundError:
                pass
    except FileNotFoundError:
        return 0
    return total


def wait_back(actor, timeout: float = 90) -> dict:
    """The restarted StorageNode's start, phase by phase, once it answers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return ray.get(actor.status.remote(), timeout=10)["started"]
        except Exception:
            time.sleep(0.5)
    raise FasterFSError(f"a killed StorageNode did not come back within {timeout:.0f} s")


def passed(result: dict) -> bool:
    """No read wrong, stale or failed, no reader lost, no cache past its capacity, every killed
    StorageNode back and every fault's chunks back to full redundancy."""
    return (result["wrong"] == 0 and result["stale"] == 0 and result["failed"] == 0
            and result["readers_lost"] == 0 and result["polls_over_capacity"] == 0
            and result["not_back"] == 0
            and not any(k["not_back_to_full"] for n, k in result["by_kind"].items() if n != "healthy_p99_ms"))


def by_kind(windows: list[tuple[str, float, float]], to_full: dict[str, list[float | None]], reads: list[tuple],
            failures: list[tuple], verdicts: list[str | None]) -> dict:
    """Per fault kind: how often injected, reads while in force, wrong, stale, failed, and the
    p99 read latency then against the reads outside every fault window."""
    def during(kind: str, start: float, end: float) -> bool:
        return any(k == kind and start <= e and b <= end for k, b, e in windows)
    quiet_kinds = sorted({k for k, _, _ in windows})
    outside = [r[3] - r[2] for r in reads if not any(during(k, r[2], r[3]) for k in quiet_kinds)]
    out: dict = {"healthy_p99_ms": round(p99(outside) * 1e3, 1) if outside else None}
    for kind in quiet_kinds:
        inside = [(r, v) for r, v in zip(reads, verdicts) if during(kind, r[2], r[3])]
        lat = [r[3] - r[2] for r, _ in inside]
        out[kind] = {"injected": sum(k == kind for k, _, _ in windows), "reads": len(inside),
                     "wrong": sum((v or "").startswith("wrong") for _, v in inside),
                     "stale": sum((v or "").startswith("stale") for _, v in inside),
                     "failed": sum(during(kind, b, e) for b, e in failures),
                     "p99_ms": round(p99(lat) * 1e3, 1) if lat else None,
                     "to_full_redundancy_max_s": max_or_none(to_full.get(kind, [])),
                     "not_back_to_full": sum(t is None for t in to_full.get(kind, []))}
    return out
