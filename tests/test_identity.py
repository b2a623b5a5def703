"""Node identity, decided from what the disks record (fasterfs.control.identity): no cluster.
How the lab's hosts keep their ids across power cycles and swapped disks is test_lab.py's."""
import pytest

from fasterfs.control import identity
from fasterfs.core.errors import FasterFSError

pytestmark = pytest.mark.unit


def _host(address, *ids_at):
    return {"address": address, "identities": [{"node": i, "address": a} for i, a in ids_at]}


def test_identity_keeps_ids_by_address_then_by_disk():
    shared = [(0, "a"), (1, "b")]  # a one-machine cluster: every node sees every identity
    assert identity.assign([_host("a", *shared), _host("b", *shared), _host("c", *shared)]) == {"a": 0, "b": 1, "c": 2}
    # disks moved to other addresses, one new empty host
    assert identity.assign([_host("x", (1, "b")), _host("y", (0, "a")), _host("z")]) == {"x": 1, "y": 0, "z": 2}
    # a host left: the others keep their ids
    assert identity.assign([_host("a", (0, "a")), _host("c", (2, "c"))]) == {"a": 0, "c": 2}


def test_identity_refuses_an_id_on_two_hosts():
    with pytest.raises(FasterFSError, match="node id 1 is recorded on two hosts"):
        identity.assign([_host("a", (1, "a")), _host("b", (1, "b"))])


def test_identity_refuses_another_version():
    with pytest.raises(FasterFSError, match="host h2 runs FasterFS 0.0.1"):
        identity.check_versions([{"address": "h2", "version": "0.0.1"}])

