"""kernel.host_interface=auto: the interface holding a node's address, as the kernel lists it."""
import json
import subprocess

import pytest

from fasterfs.bpf.tc import interface_of
from fasterfs.core.errors import FasterFSError

pytestmark = pytest.mark.unit


def test_auto_finds_the_interface_that_holds_each_address_and_names_one_none_holds():
    listed = json.loads(subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=True).stdout)
    held = {a["local"]: link["ifname"] for link in listed for a in link.get("addr_info", [])}
    assert held, "ip lists no address"
    for address, ifname in held.items():
        assert interface_of(address) == ifname
    assert interface_of("127.0.7.9") == "lo"  # a node's loopback address: lo's /8, not an address on it
    assert "198.51.100.254" not in held  # TEST-NET-2: on no machine
    with pytest.raises(FasterFSError, match="no interface of this host holds address 198.51.100.254"):
        interface_of("198.51.100.254")
