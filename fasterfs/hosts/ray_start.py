"""`ray start` without the command groups it never uses. Ray's command line imports Ray Serve's
and the jobs API's commands whenever it loads (FastAPI, pydantic models, pandas): `ray start --help`
took 2.47 s of CPU, 0.90 s this way (user + system, measured); a node's whole `ray start` 0.75 s less.

    python -m fasterfs.hosts.ray_start start --block ...      (fasterfs.hosts.ray_nodes builds the arguments)
"""
import sys


def main() -> int:
    # An import of these now fails at once and Ray's command line goes on without the group (it
    # catches the error, the path a Ray without Serve installed takes).
    for unused in ("ray.serve.scripts", "ray.dashboard.modules.job.cli"):
        sys.modules[unused] = None  # type: ignore[assignment]
    from ray.scripts.scripts import main as ray_main

    return ray_main()


if __name__ == "__main__":
    sys.exit(main())
