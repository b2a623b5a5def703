"""MarkKeeper over the real kernel programs (their maps, no traffic): a suspect mark leads to a
check of every entry and is cleared after it, never while a newer suspect write is unchecked;
old marks are swept; a full map sends a write to the suspect mark instead of losing it."""
import threading
import time

import pytest

from fasterfs import bpf
from fasterfs.bpf.events import key_hash
from fasterfs.node.mark_keeper import MarkKeeper


@pytest.fixture
def kernel():
    progs = bpf.load("real", stale_marks=32)
    yield progs
    progs.close()


def test_a_suspect_mark_is_checked_then_cleared_and_told_once(kernel):
    checks, told = [], []
    keeper = MarkKeeper(kernel, lambda: checks.append(kernel.marks.suspect_mark()) or 0, lambda: told.append(1), 60)
    kernel.marks.mark_suspect()  # as the kernel does for a lost event
    keeper.resync()
    assert len(checks) == 1 and checks[0] > 0  # the entries were checked while the mark stood
    assert kernel.marks.suspect_mark() == 0 and told == [1]
    keeper.suspect(from_peer=True)  # a peer's word: checked here, not told back
    keeper.resync()
    assert len(checks) == 2 and told == [1] and kernel.marks.suspect_mark() == 0


def test_a_suspect_write_during_the_check_gets_a_check_of_its_own(kernel):
    marked = []

    def check() -> int:
        if not marked:  # a write nobody can name lands while the entries are being checked
            marked.append(1)
            kernel.marks.mark_suspect()
        return 0
    checks = []
    keeper = MarkKeeper(kernel, lambda: checks.append(1) or check(), lambda: None, 60)
    kernel.marks.mark_suspect()
    keeper.resync()
    assert len(checks) == 2 and kernel.marks.suspect_mark() == 0


def test_the_keeper_runs_on_its_own_and_sweeps_old_marks(kernel, monkeypatch):
    from fasterfs.node import mark_keeper

    monkeypatch.setattr(mark_keeper, "SWEEP_S", 0.1)
    checks = []
    keeper = MarkKeeper(kernel, lambda: checks.append(1) or 0, lambda: None, keep_s=1)
    kernel.marks.mark_stale(key_hash("/fasterfs/old"))
    time.sleep(1.1)
    kernel.marks.mark_stale(key_hash("/fasterfs/new"))
    stop = threading.Event()
    t = threading.Thread(target=keeper.run, args=(stop,))
    t.start()
    try:
        kernel.marks.mark_suspect()
        deadline = time.monotonic() + 5
        while (kernel.marks.suspect_mark() or not keeper.marks_swept) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        t.join()
    assert checks and kernel.marks.suspect_mark() == 0
    table = kernel.bpf[b"stale_keys"]
    held = {k for k, _ in table.items_lookup_batch()}
    assert key_hash("/fasterfs/new") in held and key_hash("/fasterfs/old") not in held
    assert keeper.marks_swept == 1


def test_a_peers_write_that_finds_the_map_full_marks_the_bucket_suspect(kernel):
    for i in range(64):
        kernel.marks.mark_stale(key_hash(f"/fasterfs/flood/{i}"))
    assert kernel.marks.marks_held() == 32  # the map's size, as configured
    assert kernel.marks.suspect_mark() > 0
