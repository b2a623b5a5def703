"""Readers that outlive whoever started them: one detached actor per storage host named, each
reading every file of a local source tree in turn at `<dest><relative path>` — through
`fasterfs.read.reader.Namespace`, or with the standard library through the host's mount when `dest`
is a directory (starts with /) — and checking its bytes against the source read with the standard
library, one JSON line per read in its own log (when, how long, ok / wrong / failed, and whether
the head answered), until `seconds` have passed or `<log prefix>stop` exists (`stop`), then a last
line saying it ended (`ended`). Used by tests/test_head_loss.py and bench/head_loss.py to read through the
head's absence; the driver that starts them leaves at once (a driver on the head's Ray node would
go with it).

    python bench/checked_reader.py '<json: [overrides, [ray node ids], source dir, dest prefix, log prefix, seconds]>'

Writes <log prefix><i>.jsonl for the i-th node id.
"""
import json
import sys
import threading
import time
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from fasterfs.control.state import ClusterState, connect_ray
from fasterfs.core import config


@ray.remote(num_cpus=0)
class CheckedReader:
    def start(self, overrides: list[str], src: str, dest: str, out: str, stop: str, seconds: float) -> bool:
        from fasterfs.read.reader import Namespace

        ns = Namespace(config.load(overrides))
        files = sorted(p for p in Path(src).rglob("*") if p.is_file())

        def loop() -> None:
            t0, i = time.monotonic(), 0
            with open(out, "w") as f:
                while time.monotonic() - t0 < seconds and not Path(stop).exists():
                    p = files[i % len(files)]
                    i += 1
                    began = time.monotonic()
                    try:
                        at = dest + str(p.relative_to(src))
                        data = Path(at).read_bytes() if at.startswith("/") else ns.cat(at)
                        got = "ok" if data == p.read_bytes() else "wrong"
                    except Exception as e:  # every failure is what is measured
                        got = f"failed: {type(e).__name__}: {e}"[:300]
                    f.write(json.dumps({"t": round(began - t0, 2), "s": round(time.monotonic() - began, 3),
                                        "got": got, "head": ns.head.status()["head"]}) + "\n")
                    f.flush()
                    time.sleep(max(0.0, 0.2 - (time.monotonic() - began)))
                f.write(json.dumps({"t": round(time.monotonic() - t0, 2), "ended": True}) + "\n")
        threading.Thread(target=loop, daemon=True).start()
        return True


def main(arg: str) -> None:
    overrides, node_ids, src, dest, log_prefix, seconds = json.loads(arg)
    state = ClusterState.load(config.Layout.of(config.load(overrides)).paths.root)
    connect_ray(state)
    readers = [CheckedReader.options(name=f"checked-reader-{Path(log_prefix).name}{i}", lifetime="detached",
                                     namespace=state.ray_namespace,
                                     scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
               for i, node in enumerate(node_ids)]
    assert all(ray.get([r.start.remote(overrides, src, dest, f"{log_prefix}{i}.jsonl", f"{log_prefix}stop", seconds)
                        for i, r in enumerate(readers)], timeout=120))


def lines(log_prefix: str, count: int) -> list[dict]:
    """Every whole line the readers logged, each with its reader's index."""
    return [dict(json.loads(line), reader=i) for i in range(count) if Path(f"{log_prefix}{i}.jsonl").exists()
            for line in Path(f"{log_prefix}{i}.jsonl").read_text().splitlines(keepends=True) if line.endswith("\n")]


def reads(log_prefix: str, count: int) -> list[dict]:
    """Every read the readers logged, each with its reader's index."""
    return [line for line in lines(log_prefix, count) if "ended" not in line]


def stop(log_prefix: str) -> None:
    """Tell the readers of `log_prefix` to end after the read each is making."""
    Path(f"{log_prefix}stop").touch()


def ended(log_prefix: str, count: int) -> bool:
    """Whether all `count` readers have ended (their logs whole)."""
    return sum("ended" in line for line in lines(log_prefix, count)) == count


if __name__ == "__main__":
    main(sys.argv[1])
