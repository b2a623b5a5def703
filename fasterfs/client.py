"""The reader's side: `fasterfs.connect()` and `Client.read_chunk` / `read_table`.

A read goes straight to a MinIO server that holds the chunk: this node's own copy
when it has one, else the owner, then the other replicas when a server is down.
No actor call and no central service sits on the read path.
"""
from __future__ import annotations

import zlib
from pathlib import Path
from typing import Sequence

import polars as pl

from . import config, credentials, lobster, s3
from .cluster import ClusterState
from .config import Paths
from .errors import FasterFSError
from .manifest import Manifest


class Client:
    def __init__(self, state: ClusterState, creds: credentials.Credentials, manifest: Manifest, cfg):
        self.state, self.manifest = state, manifest
        self.verify = bool(cfg.client.verify_checksum)
        self._s3 = [s3.client(n.endpoint, creds, cfg.client.connect_timeout_s, cfg.client.read_timeout_s)
                    for n in state.nodes]
        self.local_node = self._local_node()

    def _local_node(self) -> int | None:
        """The node this process runs on, when it runs inside a Ray worker of the cluster."""
        try:
            import ray

            if not ray.is_initialized():
                return None
            node_id = ray.get_runtime_context().get_node_id()
        except Exception:
            return None
        return next((n.index for n in self.state.nodes if n.ray_node_id == node_id), None)

    def __len__(self) -> int:
        return len(self.manifest)

    def sources(self, i: int) -> list[int]:
        """Nodes to try for chunk i, in order: this node if it holds a copy, then the owner first."""
        nodes = list(self.manifest.chunk(i).nodes)
        if self.local_node in nodes:
            nodes.remove(self.local_node)
            nodes.insert(0, self.local_node)
        return nodes

    def read_chunk(self, i: int) -> bytes:
        chunk = self.manifest.chunk(i)
        errors = []
        for node in self.sources(i):
            try:
                body = self._s3[node].get_object(Bucket=self.manifest.bucket, Key=chunk.key)["Body"].read()
            except Exception as e:  # node down or object missing: try the next holder
                errors.append(f"node {node} ({self.state.nodes[node].endpoint}): {type(e).__name__}: {e}"[:300])
                continue
            if self.verify and zlib.crc32(body) != chunk.crc32:
                errors.append(f"node {node}: checksum mismatch for {chunk.key}")
                continue
            return body
        raise FasterFSError(f"chunk {i} ({chunk.key}) could not be read from any holder: " + "; ".join(errors))

    def read_table(self, i: int) -> pl.DataFrame:
        """Chunk i as a DataFrame with LOBSTER column names; prices are integers (USD x 10000)."""
        return lobster.decode_chunk(self.read_chunk(i), self.manifest.format, self.manifest.level)


def connect(root=None, overrides: Sequence[str] = ()) -> Client:
    """A client for the running cluster under `root` (default: cluster.root of the configuration)."""
    cfg = config.load(overrides)
    paths = Paths(Path(root or cfg.cluster.root))
    state = ClusterState.load(paths.root)
    return Client(state, credentials.load(paths.credentials_file), Manifest.load(paths.manifest_file), cfg)
