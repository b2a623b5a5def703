"""The installed package's version: what a host's identity records and `fasterfs --version` shows."""
from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("fasterfs")
except PackageNotFoundError:  # a checkout run without installing it
    VERSION = "0+unknown"
