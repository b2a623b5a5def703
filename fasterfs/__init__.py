"""FasterFS: market data on per-node MinIO servers, read where it lives, cached where it is hot."""
from .core.errors import FasterFSError
from .core.version import VERSION as __version__

__all__ = ["FasterFSError", "__version__", "connect", "data"]


def connect(root=None, overrides=(), use_cache: bool = True, dataset: str | None = None):
    """A client of a dataset (default: the one ingested last) or a file of the running
    cluster (see fasterfs.read.client.Client)."""
    from .read.tables import connect as _connect

    return _connect(root, overrides, use_cache, dataset)


def __getattr__(name):  # fasterfs.data (Ray Data), imported when first used
    if name == "data":
        import importlib

        return importlib.import_module(".read.data", __name__)
    raise AttributeError(name)
