"""Reed-Solomon erasure coding of chunks: `layout=ec ec.data=K ec.parity=M` stores each chunk
as K data shards and M parity shards on K+M distinct nodes; any K of them rebuild it.

Systematic code (pyeclib over its bundled ISA-L): the data shards are the chunk's bytes in
K slices, so a healthy read only fetches and joins them; parity is read only when a data
shard is missing or fails its checksum. Each shard is an object of its own
(`<chunk key>.s<index>`) carrying the xxh3 of its bytes, which the manifest records too:
a shard from another chunk or generation, or garbage from a host, fails the check.
"""
from __future__ import annotations

import functools
from concurrent.futures import FIRST_COMPLETED, wait

import xxhash

from .errors import FasterFSError

BACKEND = "isa_l_rs_vand"  # Vandermonde RS from ISA-L, in pyeclib's wheel: nothing to build


def shard_key(key: str, index: int) -> str:
    return f"{key}.s{index}"


def checksum(shard: bytes) -> int:
    return xxhash.xxh3_64_intdigest(shard)


def check_layout(data: int, parity: int, nodes: int) -> None:
    """The options of an erasure-coded write, checked against the nodes it goes on."""
    if not isinstance(data, int) or data < 1:
        raise FasterFSError(f"option ec.data={data!r}: give the number of data shards per chunk, >= 1")
    if not isinstance(parity, int) or parity < 1:
        raise FasterFSError(f"option ec.parity={parity!r}: an erasure-coded layout needs >= 1 parity shard "
                            "(parity 0 survives no lost host; use replicas=1 for no redundancy)")
    if data + parity > nodes:
        raise FasterFSError(f"options ec.data={data} + ec.parity={parity}: each of the {data + parity} shards of a "
                            f"chunk needs its own node, and the data goes on {nodes}")


@functools.lru_cache(maxsize=8)
def _driver(data: int, parity: int):
    from pyeclib.ec_iface import ECDriver

    _keep_freed_memory()
    return ECDriver(k=data, m=parity, ec_type=BACKEND)


@functools.lru_cache(maxsize=1)
def _keep_freed_memory() -> None:
    """Shards are fresh multi-MiB buffers, freed right after use; glibc hands such buffers back
    to the kernel (munmap, heap trim) and faults them in again on the next chunk: encode ran
    at 0.5 GB/s per core here instead of 5. Keeping up to 64 MiB of freed heap fixes it."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 16 << 20)  # M_MMAP_THRESHOLD: buffers below 16 MiB come from the heap
        libc.mallopt(-1, 64 << 20)  # M_TRIM_THRESHOLD: the heap keeps up to 64 MiB freed at its top
    except OSError:  # not glibc: slower, still right
        pass


def encode(chunk: bytes, data: int, parity: int) -> list[bytes]:
    """The chunk's data + parity shards, in shard order."""
    return _driver(data, parity).encode(chunk)


def fragment_size(chunk_bytes: int, data: int, parity: int) -> int:
    """The length of each shard `encode` makes of a chunk this long (its header included)."""
    return _driver(data, parity).get_segment_info(chunk_bytes, chunk_bytes)["fragment_size"]


def decode(shards: dict[int, bytes], data: int, parity: int, what: str) -> bytes:
    """The chunk from any `data` good shards ({index: bytes}); names `what` if too few."""
    if len(shards) < data:
        raise FasterFSError(f"{what}: only {len(shards)} of its {data + parity} shards are readable, "
                            f"{data} are needed")
    ordered = [shards[i] for i in sorted(shards)[:data]]  # data shards first: a plain join when all are there
    return _driver(data, parity).decode(ordered)


def gather(chunk, data: int, parity: int, fetch, pool, late=lambda slot: False,
           what: str = "", hedge_s: float | None = None) -> tuple[bytes, bool, list[str]]:
    """Chunk `chunk` (a manifest Chunk) from its shards: `fetch(slot)` returns a shard's bytes
    or raises. The data shards are fetched in parallel on `pool` (those `late` names, on hosts
    down or silent now, last); a shard missing, unreadable or failing its checksum is replaced by
    the next parity shard, and so is one still out after `hedge_s` (a hung or slow host: a hedged
    request, whichever answers first is used; never to a `late` host, which would hang too). Returns
    (the chunk, whether parity was needed, why: each shard that failed or was late); checked
    against the manifest's xxh3. Readers and the cache filler both read this way."""
    what = what or f"chunk {chunk.id} ({chunk.key})"

    def get(slot: int) -> tuple[int, bytes | None, str]:
        try:
            body = fetch(slot)
        except Exception as e:
            return slot, None, f"shard {slot} on node {chunk.nodes[slot]}: {type(e).__name__}: {e}"[:300]
        if checksum(body) != chunk.shards[slot]:
            return slot, None, f"shard {slot} on node {chunk.nodes[slot]} does not match its checksum"
        return slot, body, ""

    good: dict[int, bytes] = {}
    errors: list[str] = []
    order = sorted(range(data + parity), key=lambda s: (late(s), s))  # data shards first, then parity
    spare = order[data:]
    running = {pool.submit(get, s): s for s in order[:data]}
    budget = hedge_s
    while len(good) < data and (running or spare):
        need = max(data - len(good) - len(running), 0)  # shards that failed: their replacements start now
        for s in spare[:need]:
            running[pool.submit(get, s)] = s
        spare = spare[need:]
        if not running:
            break
        done, _ = wait(running, timeout=budget if spare else None, return_when=FIRST_COMPLETED)
        if not done and budget is not None:  # spent: as many parity shards as shards still out, in parallel
            for s in running.values():
                errors.append(f"shard {s} on node {chunk.nodes[s]}: no answer within {budget * 1e3:.0f} ms")
            extra = [s for s in spare if not late(s)][:len(running)]  # never a hung host's: only for a failure
            spare = [s for s in spare if s not in extra]
            for s in extra:
                running[pool.submit(get, s)] = s
            budget = None  # hedged once: now the first good answers
            continue
        for f in done:
            slot, body, error = f.result()
            del running[f]
            if body is None:
                errors.append(error)
            else:
                good[slot] = body
    for f in running:
        f.cancel()  # not started yet; one that is running ends at its own timeout, unread
    if len(good) < data:
        raise FasterFSError(f"{what}: {len(good)} of its {data + parity} shards readable, {data} needed: "
                            + "; ".join(errors))
    out = decode(good, data, parity, what)
    if len(out) != chunk.bytes or xxhash.xxh3_64_intdigest(out) != chunk.xxh3:
        raise FasterFSError(f"{what}: rebuilt from shards {sorted(good)[:data]} it does not match its checksum")
    return out, any(s >= data for s in sorted(good)[:data]), errors
