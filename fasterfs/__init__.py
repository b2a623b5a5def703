"""FasterFS: market data on per-node MinIO servers, read where it lives, cached where it is hot."""
from importlib.metadata import PackageNotFoundError, version

from .errors import FasterFSError

try:
    __version__ = version("fasterfs")
except PackageNotFoundError:  # a checkout run without installing it
    __version__ = "0+unknown"

__all__ = ["connect", "FasterFSError"]


def connect(root=None, overrides=(), use_cache: bool = True):
    """A client for the running cluster (see fasterfs.client.Client)."""
    from .client import connect as _connect

    return _connect(root, overrides, use_cache)
