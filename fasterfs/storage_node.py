"""StorageNode: the Ray actor pinned to each node that owns the node's storage.

It launches the node's MinIO server bound to the node's own address and keeps it
alive (a supervisor thread restarts it when it dies); owns the node's kernel programs
(the TC request tracker and the SOCK_OPS tuner on the node's cgroup); and owns the
node's cache, which it fills when the kernel reports a chunk hot and empties of what
the kernel reports overwritten. Clients never go through the actor to read data: they
talk to MinIO or read the cache directly, and the actor answers management calls.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from . import bpf, erasure, heatmap, identity, reader_stats, registry, repair, s3, tls
from .bpf.events import key_hash
from .bpf.pinned import mount_bpffs, unmount_bpffs
from .cache import ChunkCache, entry_name, places
from .cache_filler import CacheFiller
from .cgroup import own_cgroup
from .config import Layout, as_cfg, minio_binary
from .credentials import ClusterKeys
from .errors import FasterFSError
from .fsutil import atomic_write
from .manifest import Manifest
from .minio_server import MinioServer
from .mount_supervisor import Mounts
from .state import ClusterState, actor_name, filter_prefix, host_id

log = logging.getLogger("fasterfs.storage_node")


class StorageNode:
    """Node `index` at `address`: everything it needs comes in its arguments (the MinIO
    keys included) or from the cluster's Registry, never from another host's files. It signs
    with the admin keys and sets up the read-only user its MinIO gives readers."""

    def __init__(self, index: int, address: str, cfg: dict, keys: ClusterKeys):
        began = time.monotonic()
        self.started: dict[str, float] = {}  # seconds per phase of this start (a restart's recovery time)
        self.cfg = as_cfg(cfg)
        self.index, self.address = index, address
        paths = Layout.of(self.cfg).paths
        identity.record(paths, index, self.cfg.cluster.name, address)  # the id travels with the data
        certs = None
        if self.cfg.minio.tls:  # a fresh key made here, its certificate signed by the Registry on the head
            certs = paths.minio_certs_dir(index)
            tls.trust(tls.server_files(certs, address, partial(registry.issue_certificate, self.cfg.cluster.name)))
        self.minio = MinioServer(minio_binary(self.cfg), self.address, self.cfg.minio.port,
                                 self.cfg.minio.console_port, paths.node_dir(index) / "minio",
                                 paths.log_dir / f"minio-{index}.log", keys.admin, self.cfg.minio.md5_etags, certs)
        self.bucket = self.cfg.minio.bucket
        self.restarts = 0
        self._held = False  # maintenance hold: MinIO stopped on purpose, not restarted
        self._lock = threading.Lock()
        self._stopping = threading.Event()

        self.paths = paths
        self._manifests: dict[str, Manifest] = {}  # the namespace: every dataset's and file's current one
        self._names: dict = {"hashes": {}, "entries": {}, "holders": {}, "shards": {}, "ec": {}, "pieces": {}}
        self._cluster: ClusterState | None = None
        self._peers: dict[int, object] = {}
        self.last_invalidation: float | None = None  # when this host last learnt of a write (own kernel or a peer's)
        self.health: dict | None = None  # the namespace's redundancy, as this node last surveyed it (when it leads)
        self.repairs: list[dict] = []    # what this node's own repairs did, latest last
        self.scrubbed = {"passes": 0, "objects": 0, "bytes": 0, "bad": 0, "repaired": 0, "last_bad": []}
        self._peer_caches: dict[int, frozenset[str]] = {}  # node -> entries in its cache (the peer tier's index)
        self._heat = heatmap.Index({})
        self._counted = (float("-inf"), 0, 0)  # (when, objects, bytes) of the last listing
        self._outbox: dict[tuple[int, str | None], None] = {}  # writes seen here, for the other nodes
        self._outbox_lock = threading.Lock()
        self._outbox_ready = threading.Event()
        self._recent: dict[str, int] = {}  # entry -> EVICTED or STALE, for the heatmap (bounded)
        stale = self.minio.reap_stale()  # an earlier incarnation of this actor may have left one
        if stale:
            log.warning("stopped MinIO pid %d left by a previous StorageNode", stale)
        self._own_bpffs = False
        phase = time.monotonic()
        self.kernel = self._load_kernel()  # before MinIO, so its first connections are tuned too
        self.started["kernel_s"], phase = time.monotonic() - phase, time.monotonic()
        # The cache index is rebuilt from the directory: entries survive a restart, temp files do
        # not. After the kernel programs: a smaller capacity evicts, which resets kernel counts.
        self.cache = ChunkCache(paths.cache_dir(index), self._capacity(), on_evict=self._on_evict)
        self.minio.start(self.cfg.minio.health_timeout_s)
        self._s3 = s3.client(self.minio.endpoint, self.minio.creds)
        self._reader_keys = keys.reader
        self._prepare_minio()
        self.started["minio_s"], phase = time.monotonic() - phase, time.monotonic()
        self._getters: dict[str, s3.MarkedGetter] = {}
        self._shard_pool = ThreadPoolExecutor(8, thread_name_prefix="fill-shards")
        self.filler = CacheFiller(self.cache, self._getter_for, self.bucket, self.cfg.cache.fill_threads,
                                  self.cfg.cache.prefetch.max_queue)
        _, manifests = registry.fetch_manifests(self.cfg.cluster.name)  # a restarted node learns the current ones
        self._manifests = manifests
        self._derive_names()
        self._revalidate()
        self.started["cache_s"] = time.monotonic() - phase
        self.kernel.start_events()  # HOT and STALE events now have a filler to go to
        threading.Thread(target=self._scrub, name="cache-scrub", daemon=True).start()
        threading.Thread(target=self._scrub_minio, name="minio-scrub", daemon=True).start()
        threading.Thread(target=self._watch_cluster, name="repair-watch", daemon=True).start()
        threading.Thread(target=self._share_cache_index, name="cache-index", daemon=True).start()
        threading.Thread(target=self._tell_peers, name="tell-peers", daemon=True).start()
        self.mounts = Mounts(paths.node_dir(index) / "mounts.json", paths.log_dir, self._mount_overrides(),
                             self.cfg.mount.read_ahead_kb)
        threading.Thread(target=self.mounts.adopt, name="mounts-adopt", daemon=True).start()
        self._supervisor = threading.Thread(target=self._supervise, name="minio-supervisor", daemon=True)
        self._supervisor.start()
        self.started["total_s"] = time.monotonic() - began
        self.started = {k: round(v, 2) for k, v in self.started.items()}
        log.info("StorageNode %d started in %.2f s: %s", index, self.started["total_s"], self.started)

    def _load_kernel(self):
        k = self.cfg.kernel
        programs = bpf.load(k.mode, k.hot_threshold, k.fill_mark, k.delack_max_us, on_event=self._on_kernel_event)
        try:
            programs.watch(self.address if k.watch == "own" else None, self.cfg.minio.port)
            # Local reads cross lo; on a host with an interface of its own, its reads of other
            # hosts leave on it (egress) and other hosts' writes arrive on it (ingress).
            # Names are exact, and replace filters a crashed earlier incarnation left.
            prefix = filter_prefix(self.cfg.cluster.name, self.index)
            programs.attach_tc(k.interface, f"{prefix}{k.interface}:egress")
            if k.host_interface:
                for direction in ("egress", "ingress"):
                    programs.attach_tc(k.host_interface, f"{prefix}{k.host_interface}:{direction}", direction,
                                       sole_owner=True)  # one StorageNode per host
            if programs.mode == "real":  # this host's own bpffs, so its readers see its stale marks
                try:
                    self._own_bpffs = mount_bpffs(self.paths.bpffs)
                except OSError as e:
                    raise FasterFSError(f"host {self.address}: cannot mount a bpffs for the stale marks: {e}") from None
                programs.pin_stale_marks(str(self.paths.stale_pin(self.index)))
            cgroup = own_cgroup()
            self.sockops_skipped = None
            if k.tune_sockets and cgroup is not None:
                programs.attach_sockops(str(cgroup))
            elif k.tune_sockets:
                # the root cgroup would mean every socket on the host: not ours to tune
                self.sockops_skipped = "this process is in the root cgroup (or there is no cgroup2)"
        except BaseException:
            programs.close()
            self._release_bpffs()
            raise
        return programs

    def _on_kernel_event(self, event: dict) -> None:
        """HOT: fill the cache with the chunk. STALE / COMMITTED (a write's request / its
        completion): drop it, let the key become hot anew, and tell every other host, whose
        caches may hold a copy too."""
        if event["path"] == f"/{self.bucket}" and event["method"] == "POST":
            key = None  # DeleteObjects: its keys are in the body, so every entry of the bucket goes
        elif event["path"].startswith(f"/{self.bucket}/") and event["key"] == key_hash(event["path"]):
            key = event["path"][len(self.bucket) + 2:]
        else:
            return  # another bucket, or a path cut at the kernel's bound: not one of ours to resolve
        hashed = event["key"]
        if key in self._names["shards"]:  # a shard of an erasure-coded chunk: the chunk is what is cached
            key, slot = self._names["shards"][key]
            if event["type"] == "HOT":
                # Where readers' GETs leave this host (kernel.watch=any) the chunk is this host's
                # readers' own; where each node counts only requests to its MinIO, the chunk's
                # first holder fills it for every reader of the machine.
                if self.cfg.kernel.watch == "any" or self._names["holders"][key][0] == self.index:
                    self._fill_at_home(key, "hot")
                return
            hashed = key_hash(f"/{self.bucket}/{key}")
            self.kernel.mark_stale(hashed)  # readers check the chunk's mark; the kernel marked the shard
        if event["type"] == "HOT":
            self._fill_at_home(key, "hot")
            return
        # STALE at the request line, COMMITTED when the write is done: both drop and tell
        self._forget(hashed, key)
        with self._outbox_lock:
            self._outbox[(hashed, key)] = None
        self._outbox_ready.set()

    def _tell_peers(self) -> None:
        """Send the writes this kernel saw to every other node: at once when idle, and in one
        call per peer for whatever piled up meanwhile (an ingest of many objects would
        otherwise queue a call per object per peer)."""
        while not self._stopping.is_set():
            if not self._outbox_ready.wait(1.0):
                continue
            with self._outbox_lock:
                batch, self._outbox = list(self._outbox), {}
                self._outbox_ready.clear()
            try:
                for peer in self._peer_actors():
                    peer.invalidate_many.remote(batch)  # fire and forget: a dead peer has no cache to serve
            except Exception:
                log.exception("telling the other nodes of %d writes failed", len(batch))

    def _forget(self, key_hash_: int, key: str | None) -> None:
        """Drop `key` (None: every entry) and let it become hot anew."""
        if key is None:
            self.cache.clear()
            self.kernel.new_epoch()
            self._recent.clear()
        else:
            if self.cache.contains(key):
                self._note(entry_name(key), heatmap.STALE)
            self.filler.mark_stale(key)
            self.kernel.reset_key(key_hash_)
        self.last_invalidation = time.time()

    def invalidate(self, key_hash_: int, key: str | None) -> None:
        """Another host's kernel saw `key` (None: the bucket) written: mark it stale here too
        (readers check the pinned mark on every hit) and drop the cached copy."""
        self.kernel.mark_stale(key_hash_)
        self._forget(key_hash_, key)

    def invalidate_many(self, batch: list[tuple[int, str | None]]) -> None:
        for key_hash_, key in batch:
            self.invalidate(key_hash_, key)

    def _cluster_state(self, refresh: bool = False) -> ClusterState:
        if self._cluster is None or refresh:
            self._cluster = registry.find_in_ray(self.cfg.cluster.name)
        return self._cluster

    def _peer(self, index: int):
        """Node `index`'s StorageNode actor, None if it is not running."""
        import ray

        if index not in self._peers:
            self._cluster_state()
            try:
                self._peers[index] = ray.get_actor(actor_name(index), namespace=self._cluster.namespace)
            except ValueError:
                return None
        return self._peers[index]

    def _peer_actors(self) -> list:
        return [a for n in self._cluster_state().nodes if n.index != self.index
                for a in [self._peer(n.index)] if a is not None]

    def _marked(self, node: int) -> s3.MarkedGetter:
        """GETs to `node`'s MinIO that this host's kernel does not count (the filler's own)."""
        endpoint = self.minio.endpoint if node == self.index else self._cluster_state().node(node).endpoint
        if endpoint not in self._getters:
            self._getters[endpoint] = s3.MarkedGetter(endpoint, self.minio.creds, self.cfg.kernel.fill_mark)
        return self._getters[endpoint]

    def _home_of(self, key: str) -> int:
        """The node whose cache a fill of `key` goes to: where each node counts only what its
        MinIO serves (kernel.watch=own), a file's chunks are all cached at its home, so the
        whole file is one backing file for the mount's passthrough; else this node."""
        place = self._names["places"].get(key)
        return place.home if place is not None and self.cfg.kernel.watch == "own" else self.index

    def _elsewhere(self, keys) -> tuple[list[str], dict[int, list[str]]]:
        """`keys` split into those filled here and those filled at another home, by home."""
        here, away = [], {}
        for k in keys:
            home = self._home_of(k)
            if home == self.index:
                here.append(k)
            else:
                away.setdefault(home, []).append(k)
        return here, away

    def _fill_at_home(self, key: str, reason: str) -> None:
        home = self._home_of(key)
        if home == self.index:
            self.filler.request(key, reason)
        elif (peer := self._peer(home)) is not None:
            peer.fill.remote(key, reason)

    def fill(self, key: str, reason: str) -> None:
        """Another node asks for a fill of a chunk whose file is at home here (reason: its
        kernel found it hot, or a reader found its entry damaged)."""
        self.filler.request(key, reason)

    def _getter_for(self, key: str):
        """How a fill fetches `key`: an erasure-coded chunk from its shards' nodes; a replica
        from this node if it holds a copy, else from the chunk's owner (a reader on this host
        made the chunk hot, wherever it lives)."""
        if key in self._names["ec"]:
            return ShardedGetter(*self._names["ec"][key], self._marked, self._shard_pool)
        holders = self._names["holders"].get(key)
        return self._marked(self.index if not holders or self.index in holders else holders[0])

    def _object_keys(self, key: str) -> list[str]:
        """The objects behind a cached key: its shards when erasure-coded, else itself."""
        ec = self._names["ec"].get(key)
        return [erasure.shard_key(key, s) for s in range(ec[1] + ec[2])] if ec else [key]

    def _note(self, entry: str, state: int) -> None:
        self._recent.pop(entry, None)
        self._recent[entry] = state
        while len(self._recent) > 100_000:  # oldest first: dicts keep insertion order
            del self._recent[next(iter(self._recent))]

    def _on_evict(self, entry: str) -> None:
        self._note(entry, heatmap.EVICTED)
        key = self._names["entries"].get(entry)
        for obj in self._object_keys(key) if key else ():  # the key may become hot again, and be cached again
            self.kernel.reset_key(key_hash(f"/{self.bucket}/{obj}"))

    def set_manifest(self, manifest: Manifest) -> int:
        """A name's new current generation (pushed by the Registry when a write switches to it)."""
        self._mark_replaced(self._manifests.get(manifest.name), manifest)
        self._manifests[manifest.name] = manifest
        self._derive_names()
        self._cluster_state(refresh=True)  # a new generation may place data on nodes that joined since
        return len(manifest.chunks)

    def _mark_replaced(self, old: Manifest | None, new: Manifest | None) -> None:
        """Mark a replaced or removed generation's chunks written, before the write that
        replaced them returns: whoever still holds the old view (the mount's hot files, opened
        without asking anyone) finds them stale at its next open and looks again."""
        if old is not None and (new is None or new.generation != old.generation):
            for c in old.chunks:
                self.kernel.mark_stale(key_hash(f"/{old.bucket}/{c.key}"))

    def drop_manifest(self, name: str) -> None:
        """`name` left the namespace: its entries go from the cache."""
        self._mark_replaced(self._manifests.pop(name, None), None)
        self._derive_names()

    def _derive_names(self) -> None:
        """Lookups over the whole namespace: key hash -> chunk, cache entry -> key, key -> holders;
        entries of replaced generations and removed names would only take room."""
        chunks = [(m.bucket, c) for m in self._manifests.values() for c in m.chunks]
        # this node's own objects: key -> (name, chunk id, the xxh3 of its shard's bytes or None), for the scrub
        pieces = {key: (m.name, c.id, c.shards[slot] if m.layout == "ec" else None)
                  for m in self._manifests.values() for c in m.chunks
                  for slot, (node, key) in enumerate(repair.pieces(m, c)) if node == self.index}
        shards = {erasure.shard_key(c.key, s): (c.key, s) for _, c in chunks for s in range(len(c.shards))}
        self._names = {"hashes": {key_hash(f"/{bucket}/{k}"): c for bucket, c in chunks  # shards name their chunk
                                  for k in [c.key] + [erasure.shard_key(c.key, s) for s in range(len(c.shards))]},
                       "entries": {entry_name(c.key): c.key for _, c in chunks},
                       "holders": {c.key: c.nodes for _, c in chunks},
                       "shards": shards,  # shard key -> (chunk key, slot)
                       "ec": {c.key: (c, m.ec_data, m.ec_parity) for m in self._manifests.values()
                              for c in m.chunks if m.layout == "ec"},
                       "pieces": pieces,
                       # a file's chunks are cached together: key -> its place in the file's entry
                       "places": {c.key: p for m in self._manifests.values()
                                  for c, p in zip(m.chunks, places(m)) if p is not None}}
        self.cache.set_places(self._names["places"])
        self.cache.retain(self._names["holders"])
        self._heat = heatmap.Index(self._manifests)

    def _revalidate(self) -> int:
        """Drop cached entries whose object changed while this StorageNode was not running:
        no kernel event and no peer's invalidation reached it then (or the directory holds
        another cluster's entries under this cluster's keys). One HEAD per entry, to the
        chunk's holders; an entry no holder can vouch for is kept (it may be the only copy
        readable) and logged."""
        from concurrent.futures import ThreadPoolExecutor

        etags = self.cache.etags()
        if not etags:
            return 0
        clients = {n.index: s3.client(n.endpoint, self.minio.creds, 1.0, 5.0) for n in self._cluster_state().nodes}

        def current(name: str):
            key = self._names["entries"].get(name)
            if key in self._names["ec"]:  # filled from shards, each checked against the current manifest
                return key, ShardedGetter.etag(self._names["ec"][key][0])
            for node in self._names["holders"].get(key, []) if key else []:
                try:
                    return key, clients[node].head_object(Bucket=self.bucket, Key=key)["ETag"].strip('"')
                except Exception:  # holder down or gone from the cluster: ask the next
                    continue
            return key, None

        with ThreadPoolExecutor(8) as pool:
            found = dict(zip(etags, pool.map(current, etags)))
        changed = [name for name, (key, now) in found.items() if now is not None and now != etags[name]]
        unverified = [key for key, now in found.values() if key and now is None]
        for name in changed:
            log.warning("cache entry for %s was filled from ETag %s; its holders now have %s: written while this "
                        "node was down, or another cluster's entry; dropped", found[name][0], etags[name],
                        found[name][1])
        if unverified:
            log.warning("%d cache entries kept unverified (no holder answered), e.g. %s", len(unverified), unverified[0])
        return self.cache.drop_changed(changed)

    def resolve(self, key: int) -> str | None:
        """The chunk a key hash names in the current generation, or None."""
        chunk = self._names["hashes"].get(key)
        return chunk and f"chunk {chunk.id} ({chunk.key})"

    def _scrub(self) -> None:
        interval = self.cfg.cache.scrub_interval_s
        while interval and not self._stopping.wait(interval):
            try:
                self.cache.scrub()
            except Exception:
                log.exception("cache scrub failed")

    # -- redundancy: repair, the MinIO scrub, the caches as a peer tier ----------------------

    def _watch_cluster(self) -> None:
        """Auto repair, with no coordinator: every node probes the others each repair.check_s;
        the lowest-numbered node whose MinIO answers surveys the namespace and repairs it.
        Pieces on a node down for less than repair.after_s are left alone (it may come back).
        A survey lists every node's bucket (most of a StorageNode's idle CPU with 10,000 chunks
        when done every check_s), so the leader surveys when something changed (nodes down or
        back, one down past after_s, the namespace), while the last survey found anything to
        do, and at least every repair.survey_s (objects lost behind MinIO's back)."""
        r = self.cfg.repair
        down_since: dict[int, float] = {}
        seen, surveyed = None, float("-inf")  # what the last survey saw, and when
        while not self._stopping.wait(r.check_s):
            try:
                state = self._cluster_state()
                alive = repair.answering(state, self._marked)  # the fills' pooled connections
                now = time.monotonic()
                for node in state.nodes:
                    if node.index in alive:
                        down_since.pop(node.index, None)
                    else:
                        down_since.setdefault(node.index, now)
                if not alive or min(alive) != self.index:
                    self.health, seen = None, None
                    continue
                # a node is gone only after after_s down; one that answered the probe but not the
                # survey's listing (just back, busy) must not have its pieces rebuilt elsewhere
                waiting = {n.index for n in state.nodes} - {n for n, t in down_since.items() if now - t >= r.after_s}
                now_seen = (frozenset(alive), frozenset(waiting), registry.namespace_version(self.cfg.cluster.name))
                settled = self.health is not None and not self.health["degraded"] and not self.health["misplaced"]
                if now_seen == seen and settled and now - surveyed < r.survey_s:
                    continue
                seen, surveyed = now_seen, now
                if not r.auto:
                    self.health = repair.survey(state, self.minio.creds, self.cfg.placement.load_slack).to_dict()
                    continue
                out = repair.run(self.cfg, state, self.minio.creds, waiting=waiting)
                self.health = out.health.to_dict()
                if out.repaired or out.failed:
                    self._note_repair("auto", out)
                    self.health = repair.survey(state, self.minio.creds, self.cfg.placement.load_slack).to_dict()
            except Exception:
                log.exception("cluster watch failed")

    def _note_repair(self, why: str, out: repair.Outcome) -> None:
        log.warning("%s repair: %d chunks repaired, %d pieces written (%d moved home), %d failed; found %s",
                    why, out.repaired, out.pieces_written, out.moved, len(out.failed), out.health.summary())
        self.repairs.append({"why": why, "time": time.time(), "repaired": out.repaired,
                             "pieces_written": out.pieces_written, "moved": out.moved,
                             "bytes_written": out.bytes_written, "seconds": out.seconds,
                             "failed": out.failed[:10], "found": out.health.to_dict()})
        del self.repairs[:-20]

    def _scrub_minio(self) -> None:
        interval = self.cfg.scrub.interval_s
        while interval and not self._stopping.wait(interval):
            try:
                self.scrub_minio()
            except Exception:
                log.exception("MinIO scrub failed")

    def scrub_minio(self) -> dict:
        """Re-read every object of the namespace this node holds, at most scrub.mb_per_s, and
        check it as a reader would (a shard against the manifest's checksum; a replica against
        the one stored with it: an object another tool rewrote is served as it now is); a bad
        one is reported and rewritten from the chunk's other pieces. The reads carry the filler's mark: the kernel does not
        count them. Returns this pass's figures."""
        throttle = repair.Throttle(self.cfg.scrub.mb_per_s * 1e6)
        getter = s3.MarkedGetter(self.minio.endpoint, self.minio.creds, self.cfg.kernel.fill_mark)
        checked = nbytes = 0
        bad: dict[str, set[int]] = {}
        bad_pieces = set()
        try:
            for key, (name, cid, expected) in list(self._names["pieces"].items()):
                if self._stopping.is_set():
                    break
                try:
                    data, headers = getter.get_object(self.bucket, key)
                except KeyError:
                    continue  # missing: the survey sees it, and repair puts it back
                throttle.take(len(data))
                checked, nbytes = checked + 1, nbytes + len(data)
                stored = headers.get("x-amz-meta-xxh3")
                expected = expected if expected is not None else int(stored) if stored and stored.isdigit() else None
                if expected is not None and erasure.checksum(data) != expected:
                    log.warning("scrub: %s on node %d does not match its checksum", key, self.index)
                    bad.setdefault(name, set()).add(cid)
                    bad_pieces.add((self.index, key))
        finally:
            getter.close()
        repaired = 0
        if bad:
            out = repair.run(self.cfg, self._cluster_state(), self.minio.creds, bad=bad_pieces, only=bad)
            self._note_repair("scrub", out)
            repaired = out.repaired
        s = self.scrubbed
        s.update(passes=s["passes"] + 1, objects=s["objects"] + checked, bytes=s["bytes"] + nbytes,
                 bad=s["bad"] + len(bad_pieces), repaired=s["repaired"] + repaired,
                 last_bad=sorted(k for _, k in bad_pieces)[:20])
        return {"checked": checked, "bytes": nbytes, "bad": sorted(k for _, k in bad_pieces), "repaired": repaired}

    def _share_cache_index(self) -> None:
        """Tell the other nodes what this node's cache holds, when it changes (and every 30 s,
        for a peer that restarted): each node keeps the whole index, so a reader asks one."""
        sent, last = None, 0.0
        while not self._stopping.wait(1.0):
            names = self.cache.names()
            if names == sent and time.monotonic() - last < 30:
                continue
            if time.monotonic() - last >= 30:  # a peer that came back is a new actor on a new Ray node
                self._peers.clear()
                self._cluster_state(refresh=True)
            try:
                for peer in self._peer_actors():
                    peer.peer_cache.remote(self.index, names)  # fire and forget
                sent, last = names, time.monotonic()
            except Exception:
                log.exception("sharing the cache index failed")

    def peer_cache(self, node: int, names: frozenset[str]) -> None:
        self._peer_caches[node] = names

    def cached_on(self, key: str) -> list[int]:
        """The nodes whose caches hold `key` (this one's included), as they last told."""
        name = entry_name(key)
        here = [self.index] if name in self.cache.names() else []
        return here + sorted(n for n, names in self._peer_caches.items() if name in names)

    def cache_read(self, key: str) -> bytes | None:
        """`key`'s bytes from this node's cache (checked), for a reader on another host whose
        holders are down; None if not cached (the caller checks it against its manifest)."""
        got = self.cache.read(key)
        return got if isinstance(got, bytes) else None

    def _prepare_minio(self) -> None:
        """What a MinIO needs before readers come, on every start: a MinIO whose disk was lost or
        replaced comes back with neither the bucket nor the reader user (MinIO keeps its users on
        that disk), and readers' GETs would be refused until they were made again."""
        try:
            self._s3.head_bucket(Bucket=self.bucket)
        except self._s3.exceptions.ClientError:
            self._s3.create_bucket(Bucket=self.bucket)
        self.minio.ensure_reader(self._reader_keys, self.bucket)

    def _mount_overrides(self) -> list[str]:
        """What a FUSE daemon on this host needs to find the cluster (its facts then come from the
        Registry): named explicitly, root included, so it never takes the token of another
        cluster under the default root."""
        import ray

        return [f"cluster.name={self.cfg.cluster.name}", f"cluster.root={self.cfg.cluster.root}",
                f"cluster.ray_address={ray.get_runtime_context().gcs_address}"]

    def _supervise(self) -> None:
        while not self._stopping.wait(self.cfg.minio.supervise_interval_s):
            try:
                self.mounts.supervise()
            except Exception:
                log.exception("mount supervision failed")
            with self._lock:
                if self._held or self._stopping.is_set() or self.minio.alive():
                    continue
                log.warning("MinIO on %s died; restarting", self.minio.endpoint)
                self.restarts += 1
                try:
                    self.minio.start(self.cfg.minio.health_timeout_s)
                    self._prepare_minio()  # a MinIO that lost its disk comes back empty: repair refills it
                except Exception:  # keep supervising; the next round tries again
                    log.exception("MinIO restart failed")

    # -- management API ------------------------------------------------------------

    def ready(self) -> dict:
        import ray

        return {"index": self.index, "address": self.address, "endpoint": self.minio.endpoint,
                "node_id": ray.get_runtime_context().get_node_id(), "kernel_mode": self.kernel.mode,
                "host_id": host_id()}

    def _count_objects(self, max_age_s: float) -> tuple[int, int]:
        """Objects and bytes in this node's bucket, from a listing at most max_age_s old."""
        at, chunks, size = self._counted
        if time.monotonic() - at >= max_age_s:
            chunks = size = 0
            for _, nbytes in self._marked(self.index).list(self.bucket):  # pooled: no new connection each time
                chunks, size = chunks + 1, size + nbytes
            self._counted = (time.monotonic(), chunks, size)
        return chunks, size

    def status(self, max_age_s: float = 0.0) -> dict:
        """max_age_s: how old the object count may be (the dashboard asks every second, and
        listing many objects is not free; `fasterfs status` wants it now)."""
        import ray

        with self._lock:  # not in the middle of a restart
            healthy, pid, restarts = self.minio.healthy(), self.minio.pid, self.restarts
        chunks = size = None
        if healthy:
            chunks, size = self._count_objects(max_age_s)
        return {"index": self.index, "address": self.address, "node_id": ray.get_runtime_context().get_node_id(),
                "actor_pid": os.getpid(),
                "endpoint": self.minio.endpoint, "healthy": healthy, "held": self._held,
                "minio_pid": pid, "minio_restarts": restarts, "objects": chunks, "bytes": size,
                "kernel_mode": self.kernel.mode, "redundancy": self.health, "repairs": self.repairs[-5:],
                "scrub": self.scrubbed, "started": self.started, "mounts": self.mounts.status()}

    def kernel_status(self, top: int = 10) -> dict:
        snap = self.kernel.snapshot(top, resolve=self.resolve)
        snap.update(index=self.index, address=self.address)
        chunks = self._names["hashes"]
        for t in snap["top_keys"]:  # did the hot chunk reach this node's cache?
            chunk = chunks.get(int(t["key"], 16))
            t["cached"] = None if chunk is None else self.cache.contains(chunk.key)
        if self.sockops_skipped:
            snap["sockops"]["skipped"] = self.sockops_skipped
        return snap

    def heat(self) -> tuple[int, bytes]:
        """This node's row of the kernel heatmap (fasterfs.heatmap) and the layout it is in."""
        index = self._heat
        return index.id, index.cells(self.kernel.all_counts(), self.cache.names(), self._recent,
                                     self.cfg.kernel.hot_threshold)

    def kernel_key_count(self, path: str) -> int:
        """GETs of `path` (/bucket/key) the kernel counted in the current epoch."""
        return self.kernel.key_count(key_hash(path))

    def kernel_reset(self, key: int | None = None) -> int:
        """Forget one key's count (key given) or start a new epoch (every key cold again)."""
        if key is None:
            return self.kernel.new_epoch()
        self.kernel.reset_key(key)
        return self.kernel.epoch

    def observe(self, method: str, path: str) -> None:
        """A request a reader reports because this host's kernel cannot read it: SIMULATED
        mode, or MinIO over TLS (the kernel sees the connection, not the request line)."""
        if self.kernel.mode == "simulated" or self.cfg.minio.tls:
            self.kernel.count_reported(method, path, self.cfg.minio.port)

    # -- cache ---------------------------------------------------------------------------

    def cache_status(self) -> dict:
        readers = reader_stats.collect(self.paths.reader_stats_dir(self.index))
        return {"index": self.index, "address": self.address, "kernel_mode": self.kernel.mode,
                "directory": str(self.cache.dir), **self.cache.stats(), "readers": readers,
                "filler": dict(self.filler.counters), "fills_pending": self.filler.pending(),
                "last_invalidation": self.last_invalidation}

    def cache_contains(self, key: str) -> bool:
        return self.cache.contains(key)

    def cache_warm(self, keys: list[str]) -> int:
        """Fill these keys now, each at its home (waits); returns how many are cached afterwards."""
        import ray

        here, away = self._elsewhere(keys)
        refs = [peer.cache_warm.remote(ks) for home, ks in away.items() if (peer := self._peer(home)) is not None]
        futures = [self.filler.request(k, "warm") for k in here]
        for f in futures:
            if f is not None:
                f.result()
        return sum(self.cache.contains(k) for k in here) + sum(ray.get(refs))

    def prefetch(self, keys: list[str]) -> int:
        """Queue fills ahead of a sequential reader, each at its home; sheds them under load.
        Returns how many were queued here."""
        here, away = self._elsewhere(keys)
        for home, ks in away.items():
            if (peer := self._peer(home)) is not None:
                peer.prefetch.remote(ks)
        return sum(self.filler.request(k, "prefetch") is not None for k in here)

    def _capacity(self) -> int:
        """The configured capacity; after a crash, the one set at run time (cache_resize) if any:
        a restarted node must not grow its cache back behind the operator's back."""
        import ray

        override = self.paths.node_dir(self.index) / "cache-capacity"
        if not ray.get_runtime_context().was_current_actor_reconstructed:
            override.unlink(missing_ok=True)  # a new `up`: its configuration counts
        elif override.exists():
            return int(override.read_text())
        return int(self.cfg.cache.capacity_mb * 1_000_000)

    def cache_resize(self, capacity_bytes: int) -> dict:
        self.cache.resize(capacity_bytes)
        atomic_write(self.paths.node_dir(self.index) / "cache-capacity", str(int(capacity_bytes)).encode())
        return self.cache.stats()

    def heal(self, key: str) -> None:
        """A reader found this key's entry damaged and dropped it: fetch it again (at its home)."""
        self._fill_at_home(key, "heal")

    def cache_scrub(self) -> int:
        """Verify every cache entry now; returns how many damaged ones were dropped."""
        return self.cache.scrub()

    def cache_clear(self) -> int:
        """Empty the cache and start a new kernel epoch, so every key can become hot again.
        Fills still queued from the old epoch's heat go too, or they would land afterwards."""
        self.filler.cancel_all()
        removed = self.cache.clear()
        self.kernel.new_epoch()
        self._recent.clear()
        return removed

    def hold_minio(self) -> None:
        """Stop MinIO for maintenance (or a failover drill) and keep it down until release."""
        with self._lock:
            self._held = True
            self.minio.stop()

    def release_minio(self) -> None:
        with self._lock:
            if self._held:
                self.minio.start(self.cfg.minio.health_timeout_s)
                self._prepare_minio()  # its disk may have been replaced meanwhile
                self._held = False

    def mount(self, path: str) -> str:
        """Mount the namespace read-only at `path` on this host (one daemon, supervised)."""
        return self.mounts.mount(path)

    def umount(self, path: str) -> bool:
        return self.mounts.unmount(path)

    def mount_status(self) -> list[dict]:
        return self.mounts.status()

    def stop(self) -> None:
        self._stopping.set()
        self.mounts.unmount_all()
        self.kernel.close()
        self.filler.close()
        self._shard_pool.shutdown(wait=False)
        self.cache.close()
        for getter in self._getters.values():
            getter.close()
        with self._lock:
            self.minio.stop()
        self._release_bpffs()

    def _release_bpffs(self) -> None:
        """Unmount the bpffs this node mounted once no sibling's pin is left in it."""
        if self._own_bpffs and os.path.isdir(self.paths.bpffs) and not os.listdir(self.paths.bpffs):
            unmount_bpffs(self.paths.bpffs)
            self._own_bpffs = False


class ShardedGetter:
    """A fill of an erasure-coded chunk: its shards fetched over `marked(node)` (sockets the
    kernel does not count), joined or decoded, and checked against the manifest like a reader's."""

    def __init__(self, chunk, data: int, parity: int, marked, pool):
        self.chunk, self.data, self.parity, self.marked, self.pool = chunk, data, parity, marked, pool

    @staticmethod
    def etag(chunk) -> str:
        """What the cache records as the entry's version: the chunk's checksum in the manifest."""
        return f"xxh3-{chunk.xxh3:016x}"

    def get(self, bucket: str, key: str) -> tuple[bytes, str]:
        def fetch(slot: int) -> bytes:
            return self.marked(self.chunk.nodes[slot]).get(bucket, erasure.shard_key(key, slot))[0]
        data, _, _ = erasure.gather(self.chunk, self.data, self.parity, fetch, self.pool)
        return data, self.etag(self.chunk)
