"""The way users drive a running cluster, from a shell without the virtualenv: --multirun sweeps
with an output directory per run and a summary, `ray job submit` from a new shell, bad input on a
live cluster, and what Ray's own dashboard shows. (Without a cluster: test_command_line_offline;
`ray job submit` of the backtest, Demo B, cross-host and GraySort jobs: their own tests, through
conftest.submit_job; JupyterLab: test_notebook.)"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml
from commands import PYTHON, one_line_error, run
from conftest import CLEAN_ENV, tasks_ray_recorded

from fasterfs.core.config import PROJECT_DIR


def test_multirun_sweep_runs_each_in_its_own_directory_with_a_summary(live_cluster, overrides):
    """Three runs, the last failing as it runs (7 bytes are no whole record): the others still run
    and are summed up, the failed one is marked and named, and the sweep exits 1."""
    out = run(PYTHON, str(PROJECT_DIR / "jobs/graysort.py"), "-m", "graysort.size=1MB,2MB,7B",
              "graysort.baseline=false", "graysort.reference_mb=0", *overrides, timeout=600)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "graysort: 1 run(s) failed: graysort.size=7B" in out.stderr, out.stderr[-3000:]
    sweep_dir = Path(re.search(r"^sweep of 3 runs \(1 failed\): (\S+)/summary\.md$", out.stdout, re.M).group(1))
    summary = json.loads((sweep_dir / "sweep.json").read_text())
    assert summary["swept"] == ["graysort.size"] and len(summary["runs"]) == 3
    assert [bool(r["failed"]) for r in summary["runs"]] == [False, False, True]
    assert "option graysort.size='7B'" in summary["runs"][2]["failed"]
    for size, r in zip(("1MB", "2MB"), summary["runs"]):
        run_dir = Path(r["dir"])
        assert run_dir.parent == sweep_dir.parent and run_dir.name.startswith("graysort-")
        assert f"graysort.size={size}" in yaml.safe_load((run_dir / ".hydra/overrides.yaml").read_text())
        report = json.loads((run_dir / "graysort.json").read_text())
        assert report["bytes"] == {"1MB": 1_000_000, "2MB": 2_000_000}[size]
        assert r["figures"] == report["figures"] and r["figures"]["sort end to end (s)"] > 0
    assert len({r["dir"] for r in summary["runs"]}) == 3
    table = (sweep_dir / "summary.md").read_text().splitlines()
    assert len(table) == 5 and "FAILED" in table[4]
    assert "graysort.size=1MB" in table[2] and "graysort.size=2MB" in table[3]
    assert (sweep_dir / "sweep.png").stat().st_size > 0


def test_ray_dashboard_names_actors_tasks_jobs_and_carries_fasterfs_metrics(live_cluster, overrides):
    """What a Ray user sees in Ray's own tools: named actors, tasks named after the job, its
    part and node, the driver's Hydra overrides as job metadata, and FasterFS's counters among
    the metrics each Ray node exports (ray.util.metrics)."""
    import urllib.request

    import ray
    from conftest import wait_until
    from ray.util.state import list_actors

    from fasterfs.control import auth
    from fasterfs.ops import cluster

    out = run(PYTHON, str(PROJECT_DIR / "jobs/graysort.py"), "graysort.size=1MB", "graysort.baseline=false",
              "graysort.reference_mb=0", *overrides, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    output = re.search(r"^output: (\S+)$", out.stdout, re.M).group(1)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    token = auth.read(auth.token_file(live_cluster.root))
    request = urllib.request.Request(f"{live_cluster.dashboard_url}/api/jobs/",
                                     headers={"Authorization": f"Bearer {token}"})
    jobs = json.loads(opener.open(request, timeout=30).read())
    mine = [j for j in jobs if (j.get("metadata") or {}).get("fasterfs.output") == output]
    assert len(mine) == 1 and mine[0]["metadata"]["fasterfs.ops.job"] == "graysort", jobs
    assert "graysort.size=1MB" in mine[0]["metadata"]["fasterfs.overrides"].split()
    named = {"graysort.map[part 0 @ node 0]", "graysort.reduce[part 1 @ node 1]", "graysort.generate[part 1 @ node 1]"}
    tasks_ray_recorded(live_cluster, [("job_id", "=", mine[0]["job_id"])],
                       lambda tasks: named <= {t.name for t in tasks})
    actors = {a.name for a in list_actors(address=live_cluster.dashboard_url, filters=[("state", "=", "ALIVE")],
                                          limit=1000, timeout=60) if a.ray_namespace == live_cluster.ray_namespace}
    assert {"registry", "dashboard", "storage-node-0", "storage-node-1"} <= actors
    # FasterFS's gauges in Ray's own Prometheus export, as the dashboard actor last sampled them
    cluster.connect_ray(live_cluster)
    ports = [f"{n['NodeManagerAddress']}:{n['MetricsExportPort']}" for n in ray.nodes() if n["Alive"]]

    def exported() -> str:
        return "".join(opener.open(f"http://{p}/metrics", timeout=10).read().decode() for p in ports)
    wait_until(lambda: re.search(r'^ray_fasterfs_minio_up\{[^}]*node="1"[^}]*\} 1\.0$', exported(), re.M), 90,
               "FasterFS's gauges among Ray's metrics")
    text = exported()
    assert re.search(r'^ray_fasterfs_kernel_real\{[^}]*node="0"[^}]*\} 1\.0$', text, re.M)  # real eBPF, as measured


def test_fasterfs_env_lets_a_new_shell_submit_a_job(live_cluster, overrides):
    """The README's way from a new shell: `eval "$(.venv/bin/fasterfs env)"`, then Ray's own
    `ray job submit` with no address or token on its command line; Ray records it SUCCEEDED."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    from fasterfs.control import auth

    root = live_cluster.root
    script = (f'eval "$({PROJECT_DIR}/.venv/bin/fasterfs env cluster.root={root})" && '
              "ray job submit --working-dir . -- python jobs/graysort.py graysort.size=2MB graysort.baseline=false "
              "graysort.reference_mb=0")
    out = subprocess.run(["env", "-i", "HOME=/root", "PATH=/usr/bin:/bin", "bash", "-c", script], cwd=PROJECT_DIR,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    sid = re.search(r"Job '(raysubmit_\w+)' submitted successfully", out.stdout + out.stderr).group(1)
    token = auth.read(auth.token_file(root))
    jobs = JobSubmissionClient(live_cluster.dashboard_url, headers={"Authorization": f"Bearer {token}"})
    assert jobs.get_job_status(sid) == JobStatus.SUCCEEDED
    output = Path(re.search(r"^output: (\S+)$", jobs.get_job_logs(sid), re.M).group(1))
    assert output.is_relative_to(root) and (output / "graysort.json").is_file()  # its own cluster's disk
    env = subprocess.run([f"{PROJECT_DIR}/.venv/bin/fasterfs", "env", f"cluster.root={root}"], env=CLEAN_ENV,
                         capture_output=True, text=True, timeout=120).stdout
    assert token not in env  # the token by its file only
    assert f"export RAY_AUTH_TOKEN_PATH={auth.token_file(root)}" in env.splitlines()


def test_bad_input_on_a_live_cluster_is_one_line_naming_it(live_cluster, overrides):
    """Each names what is wrong, exit 1, and the namespace (as the Registry lists it) is unchanged."""
    from fasterfs.control import registry
    from fasterfs.ops import cluster

    cluster.connect_ray(live_cluster)
    before = registry.fetch_manifests(live_cluster.name)
    for args, culprit in ((["cat", "nosuch/file"], "nosuch/file: no such dataset"),
                          (["ls", "nosuch"], "nosuch: no such"),
                          (["rm", "nosuch/file"], "'nosuch/file': no such dataset or file in cluster"),
                          (["umount", "/tmp"], "/tmp is not a FasterFS mount"),
                          (["put", "/nonexistent", "team/x"], "cannot read /nonexistent"),
                          (["lab", "exec", "0", "ls"], "node 0 is not a running lab host")):
        one_line_error(run(str(PROJECT_DIR / ".venv/bin/fasterfs"), *args, *overrides), 1, culprit)
    assert registry.fetch_manifests(live_cluster.name) == before  # the same namespace version and manifests


