"""The way users drive FasterFS, from a shell without the virtualenv: Hydra's conventions on
every job and the CLI (--help, --cfg job, a bad override as one line with exit code 2 before
anything runs, --multirun sweeps with an output directory per run and a summary), and what
Ray's own dashboard shows. (`ray job submit` of every job is exercised by the jobs' own tests,
through conftest.submit_job; JupyterLab by test_notebook.)"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import CLEAN_ENV, tasks_ray_recorded

from fasterfs.config import PROJECT_DIR

PYTHON = str(PROJECT_DIR / ".venv/bin/python")
JOBS = sorted(p.stem for p in (PROJECT_DIR / "jobs").glob("*.py"))


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=CLEAN_ENV, cwd="/", capture_output=True, text=True, timeout=timeout)


def run_all(*commands: list[str]) -> list[subprocess.CompletedProcess]:
    """Each command as `run` does, side by side (each spends most of a second importing)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda c: run(*c), commands))


def run_in_roots(tmp_path: Path, commands: list[list[str]]) -> list[tuple[Path, subprocess.CompletedProcess]]:
    """Each command with an empty cluster.root of its own (what it leaves there is checked), side by side."""
    where = [tmp_path / str(i) for i in range(len(commands))]
    for root in where:
        root.mkdir()
    return list(zip(where, run_all(*([*c, f"cluster.root={root}"] for c, root in zip(commands, where)))))


def test_help_and_cfg_job(tmp_path):
    """Every job's --help (what it does, what can be overridden) and --cfg job (runs nothing)."""
    scripts = [str(PROJECT_DIR / "jobs" / f"{job}.py") for job in JOBS]
    helps = run_all(*([PYTHON, script, "--help"] for script in scripts))
    cfgs = run_in_roots(tmp_path, [[PYTHON, script, "--cfg", "job", "nodes=3"] for script in scripts])
    for job, script, out, (root, cfg_out) in zip(JOBS, scripts, helps, cfgs):
        first_doc_line = Path(script).read_text().split('"""')[1].strip().splitlines()[0]
        assert out.returncode == 0, (job, out.stderr)
        assert first_doc_line in out.stdout, job                 # what the job does
        assert "== Config ==" in out.stdout and "\nnodes: 2" in out.stdout, job  # what can be overridden
        assert cfg_out.returncode == 0, (job, cfg_out.stderr)
        cfg = yaml.safe_load(cfg_out.stdout)
        assert cfg["nodes"] == 3 and cfg["cluster"]["root"] == str(root), job
        assert list(root.iterdir()) == [], job  # printing the configuration runs nothing


BAD_OVERRIDES = [
    (["nodez=2"], "nodez"),                      # no such key
    (["nodes=abc"], "nodes"),                    # a bad value
    (["nodes=1,2"], "nodes=1,2"),                # a sweep without -m
    (["size=[1"], "size=\\[1"),                   # not Hydra's override grammar
    (["-m", "nodes=1,abc"], "nodes"),            # the second run of a sweep is bad: nothing runs
    (["-m", "size=1MB,2MB", "kernel.mode=imaginary"], "kernel.mode"),
]


def test_bad_override_is_one_line_and_exit_2(tmp_path):
    ran = run_in_roots(tmp_path, [[PYTHON, str(PROJECT_DIR / "jobs/graysort.py"), *args] for args, _ in BAD_OVERRIDES])
    for (args, culprit), (root, out) in zip(BAD_OVERRIDES, ran):
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and re.search(culprit, lines[0]) and lines[0].startswith("graysort: error:"), \
            (args, out.stderr)
        assert list(root.iterdir()) == [], args  # no output directory, nothing started


def test_cli_bad_override_and_cfg(tmp_path):
    fasterfs = str(PROJECT_DIR / ".venv/bin/fasterfs")
    out = run(fasterfs, "status", "nodez=2", f"cluster.root={tmp_path}")
    _one_line_error(out, 2, "nodez")
    out = run(fasterfs, "up", "--cfg", "job", "nodes=4", f"cluster.root={tmp_path}")
    assert out.returncode == 0 and yaml.safe_load(out.stdout)["nodes"] == 4
    assert list(tmp_path.iterdir()) == []


def test_multirun_sweep_runs_each_in_its_own_directory_with_a_summary(live_cluster, overrides):
    """Three runs, the last failing as it runs (7 bytes are no whole record): the others still run
    and are summed up, the failed one is marked and named, and the sweep exits 1."""
    out = run(PYTHON, str(PROJECT_DIR / "jobs/graysort.py"), "-m", "size=1MB,2MB,7B", "graysort.baseline=false",
              "graysort.reference_mb=0", *overrides, timeout=600)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "graysort: 1 run(s) failed: size=7B" in out.stderr, out.stderr[-3000:]
    sweep_dir = Path(re.search(r"^sweep of 3 runs \(1 failed\): (\S+)/summary\.md$", out.stdout, re.M).group(1))
    summary = json.loads((sweep_dir / "sweep.json").read_text())
    assert summary["swept"] == ["size"] and len(summary["runs"]) == 3
    assert [bool(r["failed"]) for r in summary["runs"]] == [False, False, True]
    assert "option size='7B'" in summary["runs"][2]["failed"]
    for size, r in zip(("1MB", "2MB"), summary["runs"]):
        run_dir = Path(r["dir"])
        assert run_dir.parent == sweep_dir.parent and run_dir.name.startswith("graysort-")
        assert f"size={size}" in yaml.safe_load((run_dir / ".hydra/overrides.yaml").read_text())
        report = json.loads((run_dir / "graysort.json").read_text())
        assert report["bytes"] == {"1MB": 1_000_000, "2MB": 2_000_000}[size]
        assert r["figures"] == report["figures"] and r["figures"]["sort end to end (s)"] > 0
    assert len({r["dir"] for r in summary["runs"]}) == 3
    table = (sweep_dir / "summary.md").read_text().splitlines()
    assert len(table) == 5 and "size=1MB" in table[2] and "size=2MB" in table[3] and "FAILED" in table[4]
    assert (sweep_dir / "sweep.png").stat().st_size > 0


def test_ray_dashboard_names_actors_tasks_jobs_and_carries_fasterfs_metrics(live_cluster, overrides):
    """What a Ray user sees in Ray's own tools: named actors, tasks named after the job, its
    part and node, the driver's Hydra overrides as job metadata, and FasterFS's counters among
    the metrics each Ray node exports (ray.util.metrics)."""
    import urllib.request

    import ray
    from conftest import wait_until
    from ray.util.state import list_actors

    from fasterfs import auth, cluster

    out = run(PYTHON, str(PROJECT_DIR / "jobs/graysort.py"), "size=1MB", "graysort.baseline=false",
              "graysort.reference_mb=0", *overrides, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    output = re.search(r"^output: (\S+)$", out.stdout, re.M).group(1)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    token = auth.read(auth.token_file(live_cluster.root))
    request = urllib.request.Request(f"{live_cluster.dashboard_url}/api/jobs/",
                                     headers={"Authorization": f"Bearer {token}"})
    jobs = json.loads(opener.open(request, timeout=30).read())
    mine = [j for j in jobs if (j.get("metadata") or {}).get("fasterfs.output") == output]
    assert len(mine) == 1 and mine[0]["metadata"]["fasterfs.job"] == "graysort", jobs
    assert "size=1MB" in mine[0]["metadata"]["fasterfs.overrides"].split()
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

    from fasterfs import auth

    root = live_cluster.root
    script = (f'eval "$({PROJECT_DIR}/.venv/bin/fasterfs env cluster.root={root})" && '
              "ray job submit --working-dir . -- python jobs/graysort.py size=2MB graysort.baseline=false "
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


def test_every_subcommand_names_its_arguments_and_gives_an_example(capsys):
    """`fasterfs NAME --help` of every command, as the CLI's main() prints it in this process (29
    commands, half a second of imports each as processes); then the installed command itself."""
    from fasterfs.cli import COMMANDS, main

    for name, command in COMMANDS.items():
        with pytest.raises(SystemExit) as exited:
            main([*name.split(), "--help"])
        out = capsys.readouterr().out
        assert exited.value.code == 0, name
        usage = " ".join(out.split("\n\n")[0].split())  # argparse's usage, unwrapped
        for _, spec in command.args:
            assert spec["metavar"] in usage and spec["help"] in " ".join(out.split()), (name, out)
        assert f"example:\n  fasterfs {name}" in out or "example:\n  eval" in out, (name, out)
    usage = run(str(PROJECT_DIR / ".venv/bin/fasterfs"), "put", "--help")
    assert usage.returncode == 0 and "LOCAL [LOCAL ...] DEST" in " ".join(usage.stdout.split()), usage.stderr


BAD_ARGUMENTS = [
    (["cache", "warm", "3-1"], "argument CHUNKS: '3-1'"),
    (["cache", "warm", "x"], "argument CHUNKS: 'x'"),
    (["lab", "power-on", "one"], "argument NODE"),
    (["mount"], "MOUNTPOINT"),
    (["put", "only-one"], "DEST"),
    (["cat", "a", "b"], "unrecognized arguments: b"),
]


def test_bad_arguments_are_one_line_naming_them_exit_2(tmp_path):
    ran = run_in_roots(tmp_path, [[str(PROJECT_DIR / ".venv/bin/fasterfs"), *args] for args, _ in BAD_ARGUMENTS])
    for (args, culprit), (root, out) in zip(BAD_ARGUMENTS, ran):
        _one_line_error(out, 2, culprit, args)
        assert list(root.iterdir()) == [], args


NO_CLUSTER = "no FasterFS cluster is running under"


def _one_line_error(out: subprocess.CompletedProcess, code: int, culprit: str, case: object = None) -> None:
    assert out.returncode == code, (case, out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and culprit in lines[0] and lines[0].startswith("fasterfs"), (case, out.stderr)
    assert "Traceback" not in out.stdout + out.stderr, case


WITHOUT_A_CLUSTER = [
    (["status"], 1, NO_CLUSTER), (["ingest"], 1, NO_CLUSTER), (["down"], 1, NO_CLUSTER),
    (["rm"], 2, "NAME"), (["rm", "team/x"], 1, NO_CLUSTER), (["cat", "team/x"], 1, NO_CLUSTER),
    (["ls"], 1, NO_CLUSTER), (["umount", "/mnt"], 1, NO_CLUSTER), (["lab", "exec", "7", "ls"], 1, NO_CLUSTER),
    (["lab", "down"], 1, "no FasterFS lab is running"),
    (["put", "/nonexistent", "team/x"], 1, "cannot read /nonexistent"),
]


def test_bad_input_without_a_cluster_is_one_line_naming_it(tmp_path):
    ran = run_in_roots(tmp_path, [[str(PROJECT_DIR / ".venv/bin/fasterfs"), *args] for args, _, _ in WITHOUT_A_CLUSTER])
    for (args, code, culprit), (root, out) in zip(WITHOUT_A_CLUSTER, ran):
        _one_line_error(out, code, culprit, args)
        assert list(root.iterdir()) == [], args  # nothing made


def test_bad_input_on_a_live_cluster_is_one_line_naming_it(live_cluster, overrides):
    """Each names what is wrong, exit 1, and the namespace (as the Registry lists it) is unchanged."""
    from fasterfs import cluster, registry

    cluster.connect_ray(live_cluster)
    before = registry.fetch_manifests(live_cluster.name)
    for args, culprit in ((["cat", "nosuch/file"], "nosuch/file: no such dataset"),
                          (["ls", "nosuch"], "nosuch: no such"),
                          (["rm", "nosuch/file"], "'nosuch/file': no such dataset or file in cluster"),
                          (["umount", "/tmp"], "/tmp is not a FasterFS mount"),
                          (["put", "/nonexistent", "team/x"], "cannot read /nonexistent"),
                          (["lab", "exec", "0", "ls"], "node 0 is not a running lab host")):
        _one_line_error(run(str(PROJECT_DIR / ".venv/bin/fasterfs"), *args, *overrides), 1, culprit)
    assert registry.fetch_manifests(live_cluster.name) == before  # the same namespace version and manifests


def test_paths_are_never_taken_for_overrides():
    from fasterfs.cli import split_overrides

    words, overrides = split_overrides(["put", "a=b.csv", "dir/nodes=1.csv", "nodes=3", "data=synthetic",
                                        "research/", "--", "cluster.root=x"])
    assert overrides == ["nodes=3", "data=synthetic"]
    assert words == ["put", "a=b.csv", "dir/nodes=1.csv", "research/", "--", "cluster.root=x"]
    # a command without arguments hands Hydra every KEY=VALUE word: it names an unknown key
    assert split_overrides(["status", "nodez=2"]) == (["status"], ["nodez=2"])
