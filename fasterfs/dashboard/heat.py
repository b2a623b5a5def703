"""The kernel heatmap's frames for the dashboard's /kernel page (fasterfs.node.heatmap's rows,
one per StorageNode): sampled only while such a page is open, one sampler for every viewer."""
from __future__ import annotations

import threading
import time
from typing import Any

from ..control.node_directory import NodeDirectory
from ..control.state import ClusterState


class Heat:
    """The kernel heatmap's frames (fasterfs.node.heatmap), sampled every `interval` seconds while at
    least one page watches: one sampler for every viewer, the latest frame only (a slow viewer
    skips frames, it never queues them)."""

    def __init__(self, state: ClusterState, interval: float = 1.0, cells: int = 50_000,
                 answer_timeout: float = 2.0, choose_s: float = 5.0):
        self.state, self.interval, self.cells = state, interval, cells
        self.answer_timeout, self.choose_s = answer_timeout, choose_s
        self.nodes = NodeDirectory(state.ray_namespace)
        self.viewers = 0
        self.frame: tuple[int, bytes] = (0, b"")  # (sequence, bytes)
        self.missing: dict[int, str] = {}  # node -> why its row is absent from the latest frame
        self.sample_ms: float | None = None
        # (namespace version, when chosen, the layout, the names it shows or None: every name)
        self._made: tuple[int, float, dict, list[str] | None] | None = None
        self._choosing = threading.Lock()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        threading.Thread(target=self._run, name="heatmap", daemon=True).start()

    def watch(self, delta: int) -> None:
        with self._lock:
            self.viewers += delta
        self._wake.set()

    def current_layout(self) -> dict:
        return self.current()[0]

    def current(self) -> tuple[dict, list[str] | None]:
        """The layout and the names it shows (None: every name), chosen again when the
        namespace changed or, past `cells` chunks (the nodes then choose what is read or
        cached), every `choose_s`."""
        from ..control import registry
        from ..node import heatmap

        with self._choosing:
            version, now = registry.namespace_version(self.state.name), time.monotonic()
            made = self._made
            if made is not None and made[0] == version and (made[3] is None or now - made[1] < self.choose_s):
                return made[2], made[3]
            total, names = self._choose()
            manifests = (registry.fetch_manifests(self.state.name)[1] if names is None
                         else registry.fetch_manifests_of(self.state.name, names))
            layout = heatmap.layout(manifests, [{"index": n.index, "address": n.address} for n in self.state.nodes],
                                    self.state.settings.hot_threshold, total)
            self._made = (version, now, layout, None if names is None else sorted(manifests))
            return layout, self._made[3]

    def _choose(self) -> tuple[int | None, list[str] | None]:
        """(chunks in the namespace, the names to show; None: every one) as the nodes that
        answer choose them; while none does, every name of a namespace of at most `cells`
        names, else none (the page says the nodes' rows are missing)."""
        import ray

        from ..control import registry
        from ..node import heatmap

        refs = [a.heat_names.remote(self.cells) for a in (self.nodes.get(n.index) for n in self.state.nodes)
                if a is not None]
        ready = ray.wait(refs, num_returns=len(refs), timeout=self.answer_timeout)[0] if refs else []
        answers = []
        for ref in ready:
            try:
                answers.append(ray.get(ref))
            except Exception:  # the node is said missing by the frame's own call
                pass
        if not answers:
            count = registry.names_count(self.state.name)
            return (None, None) if count <= self.cells else (None, [])
        if any(names is None for _, names in answers):
            return None, None
        merged = heatmap.merge([names for _, names in answers if names is not None], self.cells)
        return max(total for total, _ in answers), merged

    def _run(self) -> None:
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            if self.viewers <= 0:
                continue
            try:
                self._sample()
            except Exception as e:  # the registry or Ray is gone for a moment: say so, keep going
                self.missing = {n.index: f"{type(e).__name__}: {e}"[:200] for n in self.state.nodes}

    def _sample(self) -> None:
        import ray

        from ..node import heatmap

        t = time.perf_counter()
        layout, names = self.current()
        ncells = sum(len(d["keys"]) for d in layout["datasets"])
        shown = None if names is None else ray.put(names)  # up to `cells` names: pickled once, not per node
        refs: dict[int, Any] = {}  # node -> the ObjectRef of its heat
        missing: dict[int, str] = {}
        for node in self.state.nodes:
            actor = self.nodes.get(node.index)
            if actor is None:
                missing[node.index] = "no StorageNode actor"
            else:
                refs[node.index] = actor.heat.remote(shown)
        ready = set(ray.wait(list(refs.values()), num_returns=len(refs), timeout=self.answer_timeout)[0]
                    if refs else ())
        rows = []
        for node in self.state.nodes:
            ref = refs.get(node.index)
            row = None
            if ref is not None and ref not in ready:
                missing[node.index] = f"no answer within {self.answer_timeout:g} s"
            elif ref is not None:
                try:
                    layout_id, row = ray.get(ref)
                    if layout_id != layout["id"]:
                        missing[node.index], row = "still on an older namespace", None
                except Exception as e:
                    missing[node.index] = f"{type(e).__name__}: {e}"[:200]
                    self.nodes.forget(node.index)
            rows.append(row)
        seq = self.frame[0] + 1
        self.frame = (seq, heatmap.frame(seq, layout["id"], rows, ncells))
        self.missing = missing
        self.sample_ms = (time.perf_counter() - t) * 1e3
