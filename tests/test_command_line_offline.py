"""The command line with no cluster to talk to: every job's and command's --help and --cfg job,
bad overrides and arguments as one line with exit code 2 before anything runs, commands that need a
cluster saying there is none. Nothing here starts a cluster (so it runs beside the lab tier)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from commands import JOBS, PYTHON, one_line_error, run, run_in_roots

from fasterfs.core.config import PROJECT_DIR


def _run_job_here(script: str, *args: str) -> tuple[int, str]:
    """A job's command line run in this process, as `python jobs/<job>.py ARGS` runs it: its
    exit code and what it printed (a job's --help and --cfg import nothing new: no need to pay
    a process each)."""
    import contextlib
    import io
    import runpy
    import sys

    out, argv = io.StringIO(), sys.argv
    sys.argv = [script, *args]
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        sys.argv = argv
    return code, out.getvalue()


def test_help_and_cfg_job(tmp_path, monkeypatch):
    """Every job's --help (what it does, what can be overridden) and --cfg job (runs nothing)."""
    from fasterfs.control import state

    monkeypatch.setattr(state, "leave", lambda: None)  # a job leaves Ray as it exits: not this process's
    for job in JOBS:
        script = str(PROJECT_DIR / "jobs" / f"{job}.py")
        first_doc_line = Path(script).read_text().split('"""')[1].strip().splitlines()[0]
        code, out = _run_job_here(script, "--help")
        assert code == 0 and first_doc_line in out, (job, out)                   # what the job does
        assert "== Config ==" in out and "\nnodes: 2" in out, job  # what can be overridden
        root = tmp_path / job
        root.mkdir()
        code, out = _run_job_here(script, "--cfg", "job", "nodes=3", f"cluster.root={root}")
        assert code == 0, (job, out)
        cfg = yaml.safe_load(out)
        assert cfg["nodes"] == 3 and cfg["cluster"]["root"] == str(root), job
        assert list(root.iterdir()) == [], job  # printing the configuration runs nothing


BAD_OVERRIDES = [
    (["nodez=2"], "nodez"),                      # no such key
    (["nodes=abc"], "nodes"),                    # a bad value
    (["nodes=1,2"], "nodes=1,2"),                # a sweep without -m
    (["graysort.size=[1"], "graysort.size=\\[1"),  # not Hydra's override grammar
    (["-m", "nodes=1,abc"], "nodes"),            # the second run of a sweep is bad: nothing runs
    (["-m", "graysort.size=1MB,2MB", "kernel.mode=imaginary"], "kernel.mode"),
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
    one_line_error(out, 2, "nodez")
    out = run(fasterfs, "up", "--cfg", "job", "nodes=4", f"cluster.root={tmp_path}")
    assert out.returncode == 0 and yaml.safe_load(out.stdout)["nodes"] == 4
    assert list(tmp_path.iterdir()) == []


def test_every_subcommand_names_its_arguments_and_gives_an_example(capsys):
    """`fasterfs NAME --help` of every command, as the CLI's main() prints it in this process (29
    commands, half a second of imports each as processes); then the installed command itself."""
    from fasterfs.ui.cli import COMMANDS, main

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
        one_line_error(out, 2, culprit, args)
        assert list(root.iterdir()) == [], args


NO_CLUSTER = "no FasterFS cluster is running under"


WITHOUT_A_CLUSTER = [
    (["status"], 1, NO_CLUSTER), (["ingest"], 1, NO_CLUSTER), (["down"], 1, NO_CLUSTER),
    (["rm"], 2, "NAME"), (["rm", "team/x"], 1, NO_CLUSTER), (["cat", "team/x"], 1, NO_CLUSTER),
    (["ls"], 1, NO_CLUSTER), (["umount", "/mnt"], 1, NO_CLUSTER), (["lab", "exec", "7", "ls"], 1, NO_CLUSTER),
    (["lab", "down"], 1, "no FasterFS lab is running"),
    (["put", "/nonexistent", "team/x"], 1, "cannot read /nonexistent"),
    # Ray's own driver would retry for minutes where nothing listens
    (["status", "cluster.ray_address=127.0.0.9:1"], 1, "cannot join the Ray cluster at 127.0.0.9:1"),
]


def test_bad_input_without_a_cluster_is_one_line_naming_it(tmp_path):
    ran = run_in_roots(tmp_path, [[str(PROJECT_DIR / ".venv/bin/fasterfs"), *args] for args, _, _ in WITHOUT_A_CLUSTER])
    for (args, code, culprit), (root, out) in zip(WITHOUT_A_CLUSTER, ran):
        one_line_error(out, code, culprit, args)
        assert list(root.iterdir()) == [], args  # nothing made


def test_paths_are_never_taken_for_overrides():
    from fasterfs.ui.cli import split_overrides

    words, overrides = split_overrides(["put", "a=b.csv", "dir/nodes=1.csv", "nodes=3", "data=synthetic",
                                        "research/", "--", "cluster.root=x"])
    assert overrides == ["nodes=3", "data=synthetic"]
    assert words == ["put", "a=b.csv", "dir/nodes=1.csv", "research/", "--", "cluster.root=x"]
    # a command without arguments hands Hydra every KEY=VALUE word: it names an unknown key
    assert split_overrides(["status", "nodez=2"]) == (["status"], ["nodez=2"])
