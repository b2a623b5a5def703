"""When a reader asks the peer tier (another host's cache) before a chunk's holders."""
import pytest

from fasterfs.read.read_session import prefer_peer

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("holders, peer, slower, want", [
    ([100.0], None, 250, False),          # holders fast: never a peer first
    ([300.0], None, 250, True),           # slow, the peer tier not timed yet: tried once, to learn
    ([300.0], 120.0, 250, True),          # slow, and the peers answered faster
    ([300.0], 600.0, 250, False),         # slow, but the peers slower still (a link below the disk)
    ([300.0, 100.0], None, 250, False),   # one holder fast: it
    ([300.0, 400.0], 350.0, 250, False),  # the fastest holder beats the peers
    ([900.0], None, 0, False),            # cache.peer_slower_ms=0: peers only when holders are down
])
def test_the_peer_tier_goes_first_only_when_it_has_been_the_faster(holders, peer, slower, want):
    assert prefer_peer(holders, peer, slower) is want
