"""KernelPrograms: the real eBPF side of a StorageNode.

One BPF object holds both programs and all their maps — the TC request tracker
(requests.bpf.c) and the SOCK_OPS tuner (sockops.bpf.c) — so no program can end up
writing a private copy of a map another one reads (the original FasterFS lost its
measurements that way). A thread drains the ring buffer and hands HOT/STALE events
to a callback.
"""
from __future__ import annotations

import collections
import ctypes as ct
import ipaddress
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..core.errors import FasterFSError
from . import events as ev
from . import map_figures, tc
from .backend import KernelSnapshot
from .write_marks import WriteMarks

log = logging.getLogger("fasterfs.bpf")
MAX_NAMES = 65536
SEEN_SHARE = 32  # a second-chance generation takes bits / SEEN_SHARE keys before it is aged
SOURCE_DIR = Path(__file__).resolve().parent
SOURCES = ("requests.bpf.c", "sockops.bpf.c")
STALE_SOURCE = "the kernel: a PUT, DELETE or multi-delete MinIO answered 2xx, seen on TC"


def endpoint(address: str | None, port: int) -> ev.Endpoint:
    e = ev.Endpoint()
    e.port = port
    if address:
        packed = ipaddress.ip_address(address).packed
        ct.memmove(e.addr, packed, len(packed))
    return e


class KernelPrograms:
    mode = "real"

    def __init__(self, hot_threshold: int = 2, fill_mark: int = 0, delack_max_us: int = 5000,
                 on_event: Callable[[dict], None] | None = None, bucket: str = "fasterfs",
                 stale_marks: int = ev.STALE_MARKS, ring_pages: int = ev.RING_PAGES,
                 count_keys: int = ev.KEY_COUNTS, seen_bits: int = ev.SEEN_WORDS * 64):
        from bcc import BPF

        self._BPF = BPF
        text = "".join((SOURCE_DIR / name).read_text() for name in SOURCES)
        sizes = [f"-DFFS_STALE_MARKS={int(stale_marks)}", f"-DFFS_RING_PAGES={int(ring_pages)}",
                 f"-DFFS_KEY_COUNTS={int(count_keys)}", f"-DFFS_SEEN_WORDS={int(seen_bits) // 64}"]
        try:
            self.bpf = BPF(text=text.encode(), cflags=[f"-I{SOURCE_DIR}", *sizes])
            self.tc_fns = {"egress": self.bpf.load_func(b"ffs_tc", BPF.SCHED_CLS),
                           "ingress": self.bpf.load_func(b"ffs_tc_ingress", BPF.SCHED_CLS)}
            self.sockops_fn = self.bpf.load_func(b"ffs_sockops", BPF.SOCK_OPS)
        except Exception as e:
            raise FasterFSError(f"loading the eBPF programs failed: {e}") from e
        self.stale_marks, self.ring_pages, self.count_keys = stale_marks, ring_pages, count_keys
        # The second-chance filter's generation takes seen_bits / SEEN_SHARE keys before it is aged:
        # a key is remembered for one to two of those, and a bit another key set makes at most
        # about 2 / SEEN_SHARE of first GETs look like second ones.
        self.seen_bits, self.seen_gen, self.seen_rotations = int(seen_bits), 0, 0
        self._seen_set_at_rotation = 0
        self._keys_deleted = 0  # count entries user space removed (reset_key): not the LRU's doing
        # The suspect key is the bucket's own mark, which readers check already
        self.suspect_key = ev.key_hash(f"/{bucket}")
        self.marks = WriteMarks(self.bpf, self.suspect_key)
        self.hot_threshold, self.fill_mark, self.delack_max_us = hot_threshold, fill_mark, delack_max_us
        self.epoch = 0
        self._write_config()
        self.on_event = on_event
        self.names: dict[int, str] = {}            # key hash -> path, learnt from events
        self.recent: collections.deque[dict] = collections.deque(maxlen=256)
        self.received: collections.Counter[str] = collections.Counter()
        self.reported: collections.Counter[str] = collections.Counter()  # GETs readers reported (TLS), their HOTs
        # (interface, name, netns, direction, sole_owner)
        self.tc_attachments: list[tuple[str, str, str | None, str, bool]] = []
        self.cgroup_fd: int | None = None
        self.cgroup_path: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- configuration ---------------------------------------------------------------

    def _write_config(self) -> None:
        self.bpf[b"config"][ct.c_int(0)] = ev.Config(hot_threshold=self.hot_threshold, suspect_key=self.suspect_key,
                                                    fill_mark=self.fill_mark, epoch=self.epoch,
                                                    delack_max_us=self.delack_max_us, seen_gen=self.seen_gen)

    def watch(self, address: str | None, port: int) -> None:
        """Track requests to (address, port); address None means any address on the port."""
        self.bpf[b"endpoints"][endpoint(address, port)] = ct.c_uint8(1)
        self.bpf[b"tune_ports"][ct.c_uint16(port)] = ct.c_uint8(1)

    def new_epoch(self) -> int:
        """Every key starts cold again (counts reset lazily, in the kernel, on next access; the
        second-chance filter emptied)."""
        self.epoch += 1
        self._write_config()
        for generation in (0, 1):
            self._zero_seen(generation)
        return self.epoch

    def age_seen(self) -> bool:
        """Once the second-chance filter's current generation has taken its share of keys, the old
        one is zeroed and becomes the current. Called by the event thread (every poll)."""
        if not self.seen_bits:
            return False
        counters = self.bpf[b"counters"]
        set_now = counters[counters.Key(ev.COUNTERS.index("seen_set"))].value
        if set_now - self._seen_set_at_rotation < self.seen_bits // SEEN_SHARE:
            return False
        self._zero_seen(1 - self.seen_gen)
        self.seen_gen = 1 - self.seen_gen
        self._write_config()
        self._seen_set_at_rotation = set_now
        self.seen_rotations += 1
        return True

    def _zero_seen(self, generation: int) -> None:
        if not self.seen_bits:
            return
        table, words = self.bpf[b"seen"], self.seen_bits // 64
        table.items_update_batch((table.Key * words)(*range(generation * words, (generation + 1) * words)),
                                 (table.Leaf * words)())

    def reset_key(self, key: int) -> None:
        """Forget one key's count, so it can become hot again (after a cache eviction)."""
        try:
            del self.bpf[b"key_counts"][ct.c_uint64(key)]
            self._keys_deleted += 1
        except KeyError:
            pass

    def _counted(self) -> list[tuple[int, int, int]]:
        """(key, count, epoch) of every entry of the counting map, read in batches (one syscall
        per batch: ~20x an entry-by-entry walk, which took ~2 s per 100,000 keys)."""
        return [(int(k), v.count, v.epoch) for k, v in self.bpf[b"key_counts"].items_lookup_batch()]

    def all_counts(self) -> dict[int, int]:
        """Every key's GET count this epoch (the whole map: the dashboard's heatmap)."""
        return {k: count for k, count, epoch in self._counted() if epoch == self.epoch}

    def key_count(self, key: int) -> int:
        try:
            st = self.bpf[b"key_counts"][ct.c_uint64(key)]
        except KeyError:
            return 0
        return st.count if st.epoch == self.epoch else 0

    def count_reported(self, method: str, path: str, port: int) -> None:
        """A GET a reader reported because this kernel cannot read it (MinIO over TLS: the
        request line is ciphertext), counted in the kernel's own map with the kernel's rule
        (HOT exactly at the threshold), so epochs, resets, the heatmap and the cache hold."""
        if method != "GET":
            return  # writes: the kernel cannot see them either (README, Security)
        key = ev.key_hash(path)
        with self._lock:
            try:
                st = self.bpf[b"key_counts"][ct.c_uint64(key)]
                count = st.count if st.epoch == self.epoch else 0
            except KeyError:
                count = 0
            count += 1
            self.bpf[b"key_counts"][ct.c_uint64(key)] = ev.KeyStat(count=count, last_ns=time.monotonic_ns(),
                                                                   epoch=self.epoch)
            self.reported["gets"] += 1
            hot = ev.becomes_hot(count, self.hot_threshold)
            if hot:
                event = {"type": "HOT", "method": method, "key": key, "path": path, "count": count, "port": port,
                         "ts_ns": time.monotonic_ns(), "reported": True}
                self.reported["hot_events"] += 1
                self.names[key] = path
                self.recent.append(event)
                self.received["HOT"] += 1
        if hot and self.on_event:
            self.on_event(event)

    # -- attachment ----------------------------------------------------------------------

    def attach_tc(self, interface: str, name: str, direction: str = "egress", netns: str | None = None,
                  sole_owner: bool = False) -> None:
        """sole_owner: no other StorageNode attaches to this interface (a host's own NIC), so
        the clsact qdisc can go with this node's last filter."""
        tc.remove(interface, name, netns, exact=True)  # a crashed earlier owner's filter of the same name
        tc.attach(self.tc_fns[direction].fd, interface, name, direction, netns)
        self.tc_attachments.append((interface, name, netns, direction, sole_owner))

    def attach_sockops(self, cgroup_path: str) -> None:
        from bcc import BPFAttachType

        fd = os.open(cgroup_path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            # Without flags the attachment replaces a stale one left on this cgroup.
            self.bpf.attach_func(self.sockops_fn, fd, BPFAttachType.CGROUP_SOCK_OPS)
        except Exception:
            os.close(fd)
            raise
        self.cgroup_fd, self.cgroup_path = fd, cgroup_path

    def start_events(self) -> None:
        self.bpf[b"events"].open_ring_buffer(self._on_ring_event)
        self._thread = threading.Thread(target=self._poll, name="bpf-events", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.bpf.ring_buffer_poll(100)
            self.age_seen()

    def _on_ring_event(self, ctx, data, size) -> int:
        event = ct.cast(data, ct.POINTER(ev.Event)).contents.to_dict()
        with self._lock:
            if event["path"]:
                self.names[event["key"]] = event["path"]
            if len(self.names) > MAX_NAMES:  # as many as the kernel tracks keys
                self.names.pop(next(iter(self.names)))
            self.recent.append(event)
            self.received[event["type"]] += 1
        if self.on_event:
            try:
                self.on_event(event)
            except Exception:
                log.exception("kernel event callback failed for %s", event["path"])
        return 0

    def close(self) -> None:
        """Detach everything (TC filters, SOCK_OPS) and unload. Safe to call twice."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=2)
            self._thread = None
        self.close_attachments()
        self.marks.unpin()
        if getattr(self, "bpf", None) is not None:
            self.bpf.cleanup()
            self.bpf = None

    def close_attachments(self) -> None:
        """Detach the TC filters and the SOCK_OPS program; the maps and their counts stay."""
        for interface, name, netns, _, sole_owner in self.tc_attachments:
            try:
                tc.remove(interface, name, netns, exact=True, drop_qdisc=sole_owner)
            except Exception:
                log.exception("removing TC filter %s from %s", name, interface)
        self.tc_attachments = []
        if self.cgroup_fd is not None:
            from bcc import BPFAttachType

            try:
                self.bpf.detach_func(self.sockops_fn, self.cgroup_fd, BPFAttachType.CGROUP_SOCK_OPS)
            except Exception:
                log.exception("detaching SOCK_OPS from %s", self.cgroup_path)
            os.close(self.cgroup_fd)
            self.cgroup_fd = None

    # -- metrics -------------------------------------------------------------------------

    def snapshot(self, top: int = 10, resolve: Callable[[int], str | None] | None = None) -> KernelSnapshot:
        """Everything the maps say, plus the events user space received."""
        counters = map_figures.counters(self.bpf)
        counted = self._counted()
        keys = sorted(((k, c) for k, c, e in counted if e == self.epoch), key=lambda kv: kv[1], reverse=True)
        with self._lock:
            names = dict(self.names)
            received = dict(self.received)
            recent = list(self.recent)[-10:]
        top_keys = [{"key": f"{key:016x}", "count": count,
                     "name": (resolve(key) if resolve else None) or names.get(key)} for key, count in keys[:top]]
        return {
            "mode": self.mode, "simulated_because": None, "stale_source": STALE_SOURCE,
            "hot_threshold": self.hot_threshold, "epoch": self.epoch,
            "tc": [{"interface": i, "filter": n, "netns": ns, "direction": d}
                   for i, n, ns, d, _ in self.tc_attachments],
            "sockops_cgroup": self.cgroup_path,
            "counters": counters, "keys_tracked": len(keys),
            # what the LRU let go: entries made, less those user space removed and those still there
            "key_counts": {"capacity": self.count_keys, "held": len(counted),
                           "evicted": max(0, counters.get("keys_new", 0) - self._keys_deleted - len(counted)),
                           # keys whose count had gone, known again by the filter: started at one GET
                           "second_chances": counters.get("second_chances", 0),
                           "second_chance_bits": self.seen_bits, "second_chance_ages": self.seen_rotations},
            "stale_marks": {"held": self.marks.marks_held(), "capacity": self.stale_marks,
                            "suspect_since_ns": self.marks.suspect_mark() or None},
            "ring_pages": self.ring_pages, "top_keys": top_keys, "ports": map_figures.ports(self.bpf),
            "events_received": received, "recent_events": recent,
            "reported_by_readers": dict(self.reported),
            "sockops": map_figures.sockops(self.bpf),
        }
