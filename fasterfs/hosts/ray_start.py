"""`ray start` without the command groups it never uses. Ray's command line imports Ray Serve's
and the jobs API's commands whenever it loads (FastAPI, pydantic models, pandas): `ray start --help`
took 2.47 s of CPU, 0.90 s this way (user + system, measured); a node's whole `ray start` 0.75 s less.
And without Ray Client's server unless `--ray-client-server-port` is given (`cluster.client_port`):
Ray starts one on 10001 of every head whenever its packages are there; a cluster's `up` and `down`
took 3 to 4 s of CPU less without it (measured).

    python -m fasterfs.hosts.ray_start start --block ...      (fasterfs.hosts.ray_nodes builds the arguments)
"""
import sys


def main() -> int:
    # An import of these now fails at once and Ray's command line goes on without the group (it
    # catches the error, the path a Ray without Serve installed takes).
    for unused in ("ray.serve.scripts", "ray.dashboard.modules.job.cli"):
        sys.modules[unused] = None  # type: ignore[assignment]
    import ray.scripts.scripts as ray_scripts

    if not any(arg.startswith("--ray-client-server-port") for arg in sys.argv):
        # the path of a Ray without the client's packages: no port, no server
        ray_scripts.get_ray_client_dependency_error = lambda: ImportError("Ray Client is off (cluster.client_port)")
    return ray_scripts.main()


if __name__ == "__main__":
    sys.exit(main())
