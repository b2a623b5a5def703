"""Ray Data over a FasterFS dataset, its reads on the nodes holding the chunks:

    ds = fasterfs.data.read("AAPL_2012-06-21_L30")     # a ray.data.Dataset of LOBSTER rows
    ds.filter(lambda r: r["Type"] == 4).count()

Ray Data places a read's tasks as one group, so each node gets its own read (its chunks,
`label_selector` on its Ray node id) and the reads are unioned. Each task reads through
the client: this host's cache first, else the node's own MinIO.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence

from ..control import registry
from ..core import config
from ..core.errors import FasterFSError


def _datasource_class():
    from ray.data import Datasource

    class ChunkSource(Datasource):
        """A node's chunks of one dataset, a read task per chunk."""

        def __init__(self, cluster: tuple[str, ...], dataset: str, generation: str, chunks: list, with_node: bool):
            super().__init__()
            self.cluster, self.dataset, self.generation = cluster, dataset, generation
            self.chunks, self.with_node = chunks, with_node

        def estimate_inmemory_data_size(self):
            return sum(c.bytes for c in self.chunks)

        def get_read_tasks(self, parallelism, per_task_row_limit=None, data_context=None):
            from ray.data.block import BlockMetadata
            from ray.data.datasource import ReadTask

            # each task carries its own chunk's id, not this source (all of a node's chunks)
            read = functools.partial(_read_block, self.cluster, self.dataset, self.generation,
                                     with_node=self.with_node)
            return [ReadTask(functools.partial(read, c.id),
                             BlockMetadata(num_rows=c.rows, size_bytes=c.bytes, input_files=None, exec_stats=None))
                    for c in self.chunks]

    return ChunkSource


@functools.lru_cache(maxsize=8)  # per worker process: the datasets it read last, their connections kept
def _client(cluster: tuple[str, ...], dataset: str, generation: str):
    from .tables import connect

    client = connect(overrides=list(cluster), dataset=dataset)
    if client.manifest.generation != generation:
        raise FasterFSError(f"dataset {dataset} was re-ingested while Ray Data read it: read it again")
    return client


def _read_block(cluster: tuple[str, ...], dataset: str, generation: str, i: int, with_node: bool) -> list:
    return [_read_chunk(cluster, dataset, generation, i, with_node)]


def _read_chunk(cluster: tuple[str, ...], dataset: str, generation: str, i: int, with_node: bool):
    """`cluster`: the overrides naming the driver's cluster (its name and root), never the
    default root's, which may hold another cluster on the same machine."""
    import ray

    client = _client(cluster, dataset, generation)
    table = client.read_table(i).to_arrow()
    if with_node:  # where the read ran, and which node held the chunk: locality, measured
        import pyarrow as pa

        here = ray.get_runtime_context().get_node_id()
        node = next((n.index for n in client.state.nodes if n.ray_node_id == here), -1)
        table = table.append_column("_read_on", pa.array([node] * table.num_rows, pa.int32()))
        table = table.append_column("_holder", pa.array([client.manifest.chunk(i).nodes[0]] * table.num_rows,
                                                        pa.int32()))
    return table


def read(dataset: str | None = None, overrides: Sequence[str] = (), nodes: Sequence[int] | None = None,
         with_node: bool = False):
    """A ray.data.Dataset of `dataset`'s rows (default: the dataset ingested last), read by
    one read per node on that node. `nodes` limits the readers to those nodes (their
    chunks only). with_node adds `_read_on` and `_holder` columns (node ids)."""
    import ray.data

    cfg = config.load(list(overrides))
    state = registry.find(cfg)
    manifest = registry.fetch_manifest(state.name, dataset)
    if manifest is None or manifest.kind != "dataset":
        raise FasterFSError(f"{dataset!r}: no such dataset in cluster {state.name!r} (`fasterfs ls`)")
    source = _datasource_class()
    cluster = (f"cluster.name={state.name}", f"cluster.root={state.root}")
    parts = []
    for node in state.nodes:
        if nodes is not None and node.index not in nodes:
            continue
        mine = [c for c in manifest.chunks if c.nodes[0] == node.index]  # each chunk read once, by its owner
        if mine:
            parts.append(ray.data.read_datasource(
                source(cluster, manifest.name, manifest.generation, mine, with_node),
                label_selector={"ray.io/node-id": node.ray_node_id}))
    if not parts:
        raise FasterFSError(f"dataset {manifest.name}: no chunks on nodes {list(nodes or [])}")
    return parts[0].union(*parts[1:]) if len(parts) > 1 else parts[0]
