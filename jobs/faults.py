"""The fault harness: readers on every node check every read against the source while the
cluster is hurt on purpose — MinIO servers, StorageNodes and readers SIGKILLed, objects
rewritten, the dataset re-ingested, caches filled past a small capacity, the nodes polled
like an open dashboard; on a lab (`fasterfs lab up`) also the quiet failures: a MinIO frozen,
a host cut from another, a link at 2 Mbit/s, bytes flipped in a host's MinIO files (then
scrubbed), a host's disk full (a lab with lab.disk_mb). Seeded and bounded in time (and, with
faults.rounds, in rounds of every kind of fault once). (The peak is judged against the capacity
each node reported at that moment.)

    python jobs/faults.py [faults.duration_s=120 faults.seed=7 ...]      (on `fasterfs up`)

Overwrites put other bytes in a chunk's objects, let readers see them, and put the original
back. Every read is checked after the run against the history of writes: it must return a
version that was current at some moment while it ran (wrong: bytes no write ever stored;
stale: a version replaced before the read began; late: replaced at most faults.late_ms before it,
shown but not failing: the overwrites go straight to MinIO, and reach other hosts' caches as a message).

Prints and writes (faults.json) reads checked, writes, kills, wrong, stale and failed reads (and,
per quiet fault kind, reads during it, wrong, stale, failed, p99 latency against outside, and the
time from its undoing to full redundancy: every node's MinIO listing every piece it should hold),
and the peak cache bytes against the capacity, and how long each killed StorageNode took to answer
again (faults go on meanwhile, on the other nodes). Exits 1 unless every read was right, none failed,
no cache ever exceeded its capacity and every killed StorageNode came back. It ingests with
faults.replicas (2), so that a killed MinIO leaves a copy to read; it leaves the dataset ingested and
the caches at their capacity.
"""
from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path

import ray
from rich.table import Table
from xxhash import xxh3_64_intdigest

import fasterfs
from fasterfs.control import registry, report, s3
from fasterfs.core import config
from fasterfs.core.errors import FasterFSError
from fasterfs.hosts import lab_disks
from fasterfs.node.repair_survey import survey
from fasterfs.ops import cluster, job
from fasterfs.ops.fault_reads import Reader, WriteHistory, by_kind, disk_bytes, passed, wait_back
from fasterfs.write.ingest import ingest

ACTIONS = ("kill_minio", "kill_storage_node", "kill_reader", "overwrite", "reingest")
# the quiet failures, on a lab only (fasterfs.hosts.lab_faults): each held for faults.every_s, then undone
# (flipped bytes: scrubbed); a full disk on a lab whose hosts have disks of their own (lab.disk_mb)
QUIET = ("freeze_minio", "partition", "slow_link", "flip", "full_disk")


class Harness:
    def __init__(self, cfg, argv: list[str]):
        self.cfg, self.argv = cfg, argv
        f = cfg.faults
        self.rng = random.Random(f.seed)
        self.duration, self.every = float(f.duration_s), float(f.every_s)
        self.capacity = int(f.cache_mb * 1_000_000)
        self.ingest_cfg = config.load(argv + [f"replicas={min(int(f.replicas), cfg.nodes)}"])
        self.manifest = ingest(self.ingest_cfg)
        self.client = fasterfs.connect(overrides=argv)
        self.state = self.client.state
        self.actors = cluster.storage_nodes(self.state)
        self.counts = {"writes": 0, "kills": 0, "reingests": 0, "polls": 0, **{a: 0 for a in ACTIONS + QUIET}}
        self.history = WriteHistory(cfg.faults.late_ms / 1e3)
        self.history.add_manifest(self.manifest)
        self.overwrites: list[tuple[str, int, int]] = []  # (key, the number in its first line, chunk id)
        self.peak = {n.index: 0 for n in self.state.nodes}        # bytes on disk
        self.peak_ratio = {n.index: 0.0 for n in self.state.nodes}  # ... against the capacity in force then
        self.over_capacity = 0
        self._stop = threading.Event()
        self.readers: dict[int, list] = {}
        self.restarting: dict[int, threading.Thread] = {}  # node -> waiting for its killed StorageNode
        self.back_after_s: list[dict] = []   # how long each killed StorageNode took to answer again, its phases
        self.not_back: list[str] = []        # ... or that it never did
        self.killed_readers: set[int] = set()  # the readers' pids this harness killed
        own_disks = bool(self.state.lab) and all(lab_disks.is_mounted(Path(n.disk)) for n in self.state.nodes)
        self.actions = ACTIONS + tuple(k for k in QUIET if self.state.lab and (k != "full_disk" or own_disks))
        self.windows: list[tuple[str, float, float]] = []  # (fault kind, began, undone), wall-clock
        self.to_full: dict[str, list[float | None]] = {}  # fault kind -> seconds from its undoing to full redundancy

    # -- readers -----------------------------------------------------------------------------

    def start_readers(self, nodes: list, seconds: float) -> None:
        """Starts one reader per entry of `nodes`, all at once (a worker takes seconds to start on
        a busy machine; one after the other they would eat the run's time before any fault)."""
        readers = [Reader.options(**cluster.on_node(node)).remote(self.state.root, self.rng.randrange(1 << 30))
                   for node in nodes]
        pids = ray.get([r.pid.remote() for r in readers], timeout=120)
        for node, reader, pid in zip(nodes, readers, pids):
            ref = reader.run.remote(seconds, int(self.cfg.faults.reconnect_every))
            self.readers.setdefault(node.index, []).append((pid, ref, reader))

    # -- watching, like an open dashboard ---------------------------------------------------

    def watch(self) -> None:
        """Polls every node on its own: a node being killed or restarting holds up only its own
        row (one round of calls in flight per node), as on a dashboard that stays live."""
        inflight: dict[int, list] = {}
        while not self._stop.wait(0.2):
            for node, actor in zip(self.state.nodes, self.actors):
                if node.index not in inflight:  # what the dashboard asks each node at every refresh
                    inflight[node.index] = [actor.cache_status.remote(), actor.kernel_status.remote()]
            answered = False
            for node in self.state.nodes:
                refs = inflight[node.index]
                if len(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) < len(refs):
                    continue  # still on its way (a node coming back): looked at next round
                del inflight[node.index]
                try:
                    row = ray.get(refs)[0]
                except Exception:
                    continue  # a node being killed right now
                answered = True
                on_disk = disk_bytes(config.Paths(Path(self.state.root)).cache_dir(node.index))
                used = max(row["bytes"], on_disk)
                self.peak[node.index] = max(self.peak[node.index], used)
                self.peak_ratio[node.index] = max(self.peak_ratio[node.index], used / max(1, row["capacity"]))
                self.over_capacity += used > row["capacity"]
            self.counts["polls"] += answered

    # -- faults -----------------------------------------------------------------------------

    def act(self, action: str, node) -> str:
        actor = self.actors[self.state.nodes.index(node)]
        if action == "kill_minio":
            os.kill(ray.get(actor.status.remote(), timeout=60)["minio_pid"], signal.SIGKILL)
        elif action == "kill_storage_node":
            os.kill(ray.get(actor.status.remote(), timeout=60)["actor_pid"], signal.SIGKILL)
            # Ray restarts it (with the capacity the harness set, kept across a crash); faults go on
            # meanwhile on the other nodes, not on this one until it answers
            waiter = threading.Thread(target=self._wait_back, args=(actor, time.monotonic()), daemon=True)
            self.restarting[node.index] = waiter
            waiter.start()
        elif action == "kill_reader":
            pid, _, _ = self.readers[node.index][-1]
            self.killed_readers.add(pid)
            os.kill(pid, signal.SIGKILL)
            self.start_readers([node], max(1.0, self.deadline - time.monotonic()))
        elif action == "overwrite":  # other bytes, read for a while, then the original back
            m = registry.fetch_manifest(self.state.name)
            chunk = self.cached_chunk(m)
            clients = [s3.client(self.state.node(h).endpoint, registry.fetch_credentials(self.state.name, "admin"))
                       for h in chunk.nodes]
            copies = []
            for c in clients:  # a copy with a flipped byte: MinIO may refuse it (its own bitrot check)
                try:
                    copies.append(c.get_object(Bucket=m.bucket, Key=chunk.key)["Body"].read())
                except Exception:
                    continue
            # the copy that matches the manifest (a flipped byte may have rotted another)
            original = next((b for b in copies if xxh3_64_intdigest(b) == chunk.xxh3), None)
            if original is None:
                return f"no overwrite: no good copy of chunk {chunk.id} answered"
            other = b"overwritten %d\n" % self.counts["writes"] + original[::-1]
            self.overwrites.append((chunk.key, self.counts["writes"], chunk.id))
            for body in (other, original):
                begin = time.time()
                for c in clients:
                    c.put_object(Bucket=m.bucket, Key=chunk.key, Body=body,
                                 Metadata={"xxh3": str(xxh3_64_intdigest(body))})
                    self.counts["writes"] += 1
                self.history.add(chunk.key, xxh3_64_intdigest(body), begin, time.time())
                time.sleep(self.every / 3)  # readers get to see each version
            return f"overwrote chunk {chunk.id} on nodes {chunk.nodes} and put it back"
        elif action == "reingest":
            self.history.add_manifest(ingest(self.ingest_cfg))
            self.counts["reingests"] += 1
            return "re-ingested"
        elif action in QUIET:
            return self.quiet(action, node)
        self.counts["kills"] += action.startswith("kill")
        return f"{action} on node {node.index}"

    def quiet(self, action: str, node) -> str:
        """A quiet failure on lab host `node` for faults.every_s (readers read on), then undone."""
        from fasterfs.hosts import lab_faults

        others = [n for n in self.state.nodes if n.index != node.index]
        began = time.time()
        if action == "freeze_minio":
            lab_faults.freeze(self.state, node.index, "minio")
            what = f"froze node {node.index}'s MinIO"
        elif action == "partition":
            peer = self.rng.choice(others)
            lab_faults.partition(self.state, node.index, [str(peer.index)])
            what = f"cut node {node.index} from node {peer.index}"
        elif action == "slow_link":
            lab_faults.slow(self.state, node.index, 2)
            what = f"node {node.index}'s link at 2 Mbit/s"
        elif action == "full_disk":
            size = lab_faults.fill(self.state, node.index)
            what = f"filled node {node.index}'s disk ({size / 1e6:.0f} MB)"
        else:
            try:
                flipped = lab_faults.flip(self.state, node.index, "minio", 3, self.rng.randrange(1 << 30))
            except FasterFSError as e:  # a host holding fewer than 3 object files
                return f"no flip: {e}"
            what = f"flipped a byte in {len(flipped)} of node {node.index}'s MinIO files"
        try:
            time.sleep(self.every)
        finally:
            lab_faults.thaw(self.state)
            lab_faults.heal(self.state)
        undone = time.time()
        self.windows.append((action, began, undone))
        took = self.until_full(node.index if action == "flip" else None)
        self.to_full.setdefault(action, []).append(took)
        return what + (f"; full redundancy {took:.1f} s after" if took is not None else "; NOT back to full redundancy")

    def until_full(self, scrub: int | None, limit_s: float = 60.0) -> float | None:
        """Seconds until every node's MinIO lists every piece it should hold (repair's survey:
        nothing degraded, no node down), after a scrub of node `scrub`'s objects found each sound
        (flipped bytes are found by reading them; the scrub's own schedule is scrub.interval_s);
        None past limit_s."""
        t = time.monotonic()
        creds = registry.fetch_credentials(self.state.name, "admin")
        actor = self.actors[self.state.nodes.index(self.state.node(scrub))] if scrub is not None else None
        while actor is not None:  # until a pass finds every piece sound: the first repairs what it finds
            found = ray.get(actor.scrub_minio.remote(), timeout=limit_s)
            if not found["bad"] and not found["missing"]:
                break
            if time.monotonic() - t > limit_s:
                return None
            time.sleep(0.5)
        while time.monotonic() - t < limit_s:
            health = survey(self.state, creds, self.cfg.placement.load_slack)
            if not health.degraded_count and not health.lost and not health.nodes_down:
                return time.monotonic() - t
            time.sleep(0.5)
        return None

    def _wait_back(self, actor, killed: float) -> None:
        try:
            started = wait_back(actor)
        except FasterFSError as e:
            self.not_back.append(str(e))
            return
        self.back_after_s.append({"answered_s": round(time.monotonic() - killed, 1), **started})

    def up_nodes(self, every: bool) -> list:
        """The nodes to hurt next: those not restarting (every node, waiting for all, when the fault
        writes: an overwrite or a re-ingest needs each holder's MinIO)."""
        for index, waiter in list(self.restarting.items()):
            if every or len(self.restarting) == len(self.state.nodes):
                waiter.join(120)
            if not waiter.is_alive():
                del self.restarting[index]
        return [n for n in self.state.nodes if n.index not in self.restarting]

    def cached_chunk(self, m):
        """A chunk some node has cached, if one is found among a few: the copies that must go."""
        sample = [m.chunk(self.rng.randrange(len(m))) for _ in range(10)]
        try:
            cached = ray.get([a.cache_contains.remote(c.key) for c in sample for a in self.actors], timeout=30)
        except Exception:
            return sample[0]
        per = len(self.actors)
        return next((c for k, c in enumerate(sample) if any(cached[k * per:(k + 1) * per])), sample[0])

    def run(self) -> dict:
        ray.get([a.cache_resize.remote(self.capacity) for a in self.actors])
        self.start_readers([n for n in self.state.nodes for _ in range(int(self.cfg.faults.readers_per_node))],
                           self.duration)
        self.deadline = time.monotonic() + self.duration  # from when the readers run
        watcher = threading.Thread(target=self.watch, daemon=True)
        watcher.start()
        log = []
        try:
            plan: list[str] = []
            rounds, most = 0, self.cfg.faults.rounds
            while time.monotonic() + self.every < self.deadline:
                time.sleep(self.every)
                if not plan:  # every kind of fault once per round, in a seeded order
                    if rounds == most:
                        break
                    plan = self.rng.sample(self.actions, len(self.actions))
                    rounds += 1
                action = plan.pop()
                node = self.rng.choice(self.up_nodes(every=action in ("overwrite", "reingest")))
                self.counts[action] += 1
                began = time.monotonic() - self.deadline + self.duration
                log.append(f"{began:6.1f} s  {self.act(action, node)}")
            time.sleep(self.every)  # reads after the last fault too
            self.stop_readers()
            collected = self.collect()
        finally:
            self._stop.set()
            watcher.join(5)
            self.up_nodes(every=True)
            ray.get([a.cache_resize.remote(int(self.cfg.cache.capacity_mb * 1_000_000)) for a in self.actors])
        ran_s, errors = time.monotonic() - (self.deadline - self.duration), collected.pop("errors")
        return {"seed": self.cfg.faults.seed, "duration_s": ran_s, "rounds": rounds, **collected, **self.counts,
                "cache_capacity": self.capacity, "peak_cache_bytes": self.peak,
                "peak_fill_of_capacity": self.peak_ratio, "polls_over_capacity": self.over_capacity,
                "storage_node_back_after_s": self.back_after_s, "not_back": len(self.not_back),
                "errors": (self.not_back + errors)[:20], "log": log, "overwrites": self.overwrites}

    def stop_readers(self) -> None:
        """Every reader this harness did not kill ends its reads now (collect() waits for them)."""
        for pid, _, reader in (run for runs in self.readers.values() for run in runs):
            if pid not in self.killed_readers:
                reader.stop.remote()

    def collect(self) -> dict:
        """Every reader's reads, checked against the write history; each reader that died
        reconciled with the kills this harness made: one it did not kill is lost (a bug), and
        fails the run."""
        totals = {"reads": 0, "wrong": 0, "stale": 0, "late": 0, "failed": 0, "readers_killed": 0, "readers_lost": 0,
                  "read_overwritten": 0, "no_good_copy": 0}
        no_good_copy_hosts: dict[str, int] = {}
        errors = []
        all_reads, all_failures, verdicts = [], [], []
        for index, runs in self.readers.items():
            for pid, ref, _ in runs:
                try:
                    r = ray.get(ref, timeout=self.duration + 120)
                except ray.exceptions.RayActorError as e:
                    if pid in self.killed_readers:  # its reads died with it: not a failed read
                        totals["readers_killed"] += 1
                    else:  # a reader that died of something else (a bug): its reads are missing
                        totals["readers_lost"] += 1
                        errors.append(f"lost: reader pid {pid} on node {index} died unkilled: "
                                      f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
                    continue
                totals["failed"] += r["failed"]
                errors += r["errors"]
                all_reads += r["reads"]
                all_failures += r["failures"]
                for _, _, holders in r["no_good_copy"]:
                    totals["no_good_copy"] += 1
                    hosts = ",".join(map(str, holders))
                    no_good_copy_hosts[hosts] = no_good_copy_hosts.get(hosts, 0) + 1
                for key, got, start, end, _ in r["reads"]:
                    totals["reads"] += 1
                    totals["read_overwritten"] += got != self.history.versions.get(key, [(got,)])[0][0]
                    verdict = self.history.check(key, got, start, end)
                    verdicts.append(verdict)
                    if verdict:
                        totals[verdict.split(":")[0]] += 1
                        errors.append(verdict)  # a late read too: shown, though it does not fail the run
        return {**totals, "by_kind": by_kind(self.windows, self.to_full, all_reads, all_failures, verdicts),
                "no_good_copy_holders": no_good_copy_hosts, "errors": errors, "read_log": all_reads}


def main(argv: list[str]) -> dict:
    cfg = config.load(argv)
    f = cfg.faults
    if f.duration_s <= 0 or f.every_s <= 0 or f.cache_mb <= 0 or f.readers_per_node < 1:
        raise FasterFSError("options faults.duration_s, faults.every_s and faults.cache_mb must be > 0, "
                            "faults.readers_per_node >= 1")
    if f.rounds is not None and (not isinstance(f.rounds, int) or f.rounds < 1):
        raise FasterFSError(f"option faults.rounds={f.rounds!r}: a whole number >= 1, or null (run for duration_s)")
    result = Harness(cfg, argv).run()
    result["passed"] = passed(result)
    rounds = f"{result['rounds']} round{'s' if result['rounds'] != 1 else ''}"
    table = Table(title=f"fault harness: {result['duration_s']:.0f} s, {rounds} of faults, seed {result['seed']}")
    for col in ("reads checked", "of other bytes", "wrong", "stale", "late", "failed", "no good copy", "writes",
                "kills", "re-ingests", "polls", "peak cache", "peak of capacity"):
        table.add_column(col)
    peak, ratio = max(result["peak_cache_bytes"].values()), max(result["peak_fill_of_capacity"].values())
    table.add_row(*map(str, [result[k] for k in ("reads", "read_overwritten", "wrong", "stale", "late", "failed",
                                                  "no_good_copy", "writes", "kills", "reingests", "polls")]),
                  report.fmt_bytes(peak), f"{ratio:.0%}")
    console = report.console()
    console.print(table)
    for line in result["log"]:
        console.print("  " + line)
    kinds = result["by_kind"]
    for kind in sorted(k for k in kinds if k != "healthy_p99_ms"):
        k = kinds[kind]
        console.print(f"  {kind}: injected {k['injected']}, {k['reads']} reads during it: {k['wrong']} wrong, "
                      f"{k['stale']} stale, {k['failed']} failed; p99 {k['p99_ms']} ms "
                      f"(outside every fault: {kinds['healthy_p99_ms']} ms); full redundancy at most "
                      f"{k['to_full_redundancy_max_s']} s after it was undone"
                      + (f", {k['not_back_to_full']} times not within 60 s" if k["not_back_to_full"] else ""))
    for back in result["storage_node_back_after_s"]:
        console.print(f"  a killed StorageNode answered again after {back['answered_s']:.1f} s; its own start took "
                      f"{back['total_s']:.1f} s (kernel programs {back['kernel_s']:.1f}, MinIO {back['minio_s']:.1f}, "
                      f"cache {back['cache_s']:.1f}), the rest was Ray restarting its worker")
    for hosts, n in result["no_good_copy_holders"].items():
        console.print(f"  {n} reads found no good copy at once: holders {hosts} (down, cut off, hung or rotten)")
    for e in result["errors"]:
        console.print(f"  [red]{e}[/]")
    result["headline"] = {"reads checked": result["reads"], "wrong": result["wrong"], "stale": result["stale"],
                          f"late (≤ {f.late_ms} ms)": result["late"], "failed": result["failed"],
                          "no good copy": result["no_good_copy"], "kills": result["kills"],
                          "peak cache vs capacity": f"{ratio:.0%}"}
    result["figures"] = {k: result[k] for k in ("reads", "wrong", "stale", "late", "failed")}
    out = report.write_json(report.run_dir(cfg, "faults"), "faults.json", result)
    console.print(f"{'PASSED' if result['passed'] else 'FAILED'}; report: {out}")
    return result


if __name__ == "__main__":
    job.run(main, __doc__, "faults")
