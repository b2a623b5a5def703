"""What a node's cache directory holds after a restart, or a crash: the entries that are whole
and of this boot (a fill time from an earlier boot cannot be compared with this boot's stale
marks), and the file entries' chunks their indexes vouch for. Temporary files of fills that never
finished, indexes without their file, and entries that fail their check are removed; files that
are no entry at all are left alone and counted.
"""
from __future__ import annotations

import collections
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import xxhash

from ..read.cache_entry import (
    BOOT,
    FILE_SUFFIX,
    HEADER,
    INDEX_SUFFIX,
    SLOT,
    SUFFIX,
    TMP_PREFIX,
    Header,
    Place,
    remove_file,
)

log = logging.getLogger("fasterfs.node.cache")


@dataclass
class Found:
    sizes: dict[str, int] = field(default_factory=dict)      # entry name -> bytes
    places: dict[str, Place] = field(default_factory=dict)   # entry name -> its place in a file entry
    units: dict[str, set[str]] = field(default_factory=dict)  # file entry -> its chunks' entry names
    counts: collections.Counter[str] = field(default_factory=collections.Counter)


def scan(directory: Path, verify: bool) -> Found:
    """The valid entries in `directory`, everything else removed; `verify`: check every checksum."""
    found = Found()
    for f in directory.iterdir():
        if f.name.startswith(TMP_PREFIX):
            f.unlink(missing_ok=True)
            found.counts["stray_temp_removed"] += 1
        elif f.name.endswith(FILE_SUFFIX):
            _file_entry(f, verify, found)
        elif f.name.endswith(INDEX_SUFFIX):
            if not f.with_suffix(FILE_SUFFIX).exists():
                f.unlink(missing_ok=True)
                found.counts["invalid_removed"] += 1
        elif not f.name.endswith(SUFFIX):
            log.warning("cache directory %s: ignoring %s, which is not a cache entry", directory, f.name)
            found.counts["foreign_files"] += 1
        else:
            _entry(f, verify, found)
    return found


def _entry(f: Path, verify: bool, found: Found) -> None:
    try:
        with open(f, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            header = Header.of(fh.fileno(), size)
            damaged = header is not None and verify and \
                xxhash.xxh3_64_intdigest(fh.read(header.size)) != header.checksum
    except OSError:
        return
    if header is None or damaged or header.boot != BOOT:
        f.unlink(missing_ok=True)
        found.counts["invalid_removed"] += 1
        return
    found.sizes[f.name] = size
    found.counts["rebuilt_entries"] += 1


def _file_entry(f: Path, verify: bool, found: Found) -> None:
    """A file entry's whole chunks, from its index. It goes whole if it has none, or one that
    fails its checksum (its slot would still vouch for the bytes)."""
    unit = f.name.removesuffix(FILE_SUFFIX)
    chunks: dict[str, Place] = {}
    try:
        with open(f, "rb") as fh, open(f.with_suffix(INDEX_SUFFIX), "rb") as idx:
            file_size, slots = os.fstat(fh.fileno()).st_size, idx.read()
            for index in range(len(slots) // SLOT.size):
                head, offset, raw_name = SLOT.unpack_from(slots, index * SLOT.size)
                header = Header.parse(head, HEADER.unpack(head)[1])
                if header is None:
                    continue  # never filled
                if header.boot != BOOT or offset + header.size > file_size or (verify and xxhash.xxh3_64_intdigest(
                        os.pread(fh.fileno(), header.size, offset)) != header.checksum):
                    chunks = {}
                    break
                chunks[raw_name.hex() + SUFFIX] = Place(unit, index, offset, header.size, file_size)
    except OSError:
        chunks = {}
    if not chunks:
        remove_file(f)
        found.counts["invalid_removed"] += 1
        return
    for name, place in chunks.items():
        found.places[name] = place
        found.units.setdefault(unit, set()).add(name)
        found.sizes[name] = place.size
        found.counts["rebuilt_entries"] += 1
