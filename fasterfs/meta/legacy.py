"""The namespace as FasterFS kept it before the store: files under the cluster's root, adopted
into the store once, at the Registry's first start on such a root.

    namespace/<quoted name>.json   each name's manifest
    generations.json               every generation each name had, until its objects went
    retired-pieces.json            pieces repair moved away, deleted after ingest.keep_old_s

Adopted whole or not at all (one transaction), then the files are renamed `*.adopted`, so a
second start does not adopt them again and nothing is deleted. A file that cannot be read
stops the Registry naming it, before anything is adopted."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from ..core.errors import FasterFSError
from ..core.manifest import Manifest
from .store import NamespaceStore

log = logging.getLogger("fasterfs.meta.legacy")
NAMES, GENERATIONS, RETIRED = "namespace", "generations.json", "retired-pieces.json"
ADOPTED = ".adopted"


def _read(path: Path, what: str) -> list:
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        raise FasterFSError(f"{what} of an earlier FasterFS, {path}, cannot be read ({e}): move it away to start "
                            "without it") from None
    if not isinstance(data, list):
        raise FasterFSError(f"{what} of an earlier FasterFS, {path}, is not a list: move it away to start without it")
    return data


def adopt(store: NamespaceStore, root: Path) -> int:
    """The names adopted from the files under `root` (0 when there are none)."""
    directory = Path(root) / NAMES
    if not directory.is_dir():
        return 0
    if store.count():
        log.warning("%s of an earlier FasterFS left as it is: the namespace store already holds names", directory)
        return 0
    manifests = []
    for path in sorted(directory.glob("*.json")):
        try:
            manifests.append(Manifest.from_json(path.read_bytes(), str(path)))
        except (OSError, ValueError) as e:
            raise FasterFSError(f"manifest {path} of an earlier FasterFS cannot be read ({e}): move it away to "
                                "start without it") from None
    files = [Path(root) / GENERATIONS, Path(root) / RETIRED]
    generations, retired = (_read(f, what) if f.exists() else []
                            for f, what in zip(files, ("the generation history", "the retired pieces")))
    try:
        store.adopt(manifests, generations, retired)
    except (KeyError, TypeError) as e:
        raise FasterFSError(f"{files[0]} or {files[1]} of an earlier FasterFS has an entry without {e}: move "
                            "them away to start without them") from None
    for path in (directory, *files):
        if path.exists():
            path.rename(path.with_name(path.name + ADOPTED))
    log.warning("adopted %d names from %s (an earlier FasterFS's files, now %s)", len(manifests), directory,
                directory.name + ADOPTED)
    return len(manifests)
