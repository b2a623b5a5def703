"""The command line every job shares: Hydra's own (`@hydra.main`).

    python jobs/graysort.py nodes=2 graysort.size=100MB        one run, in <output_dir>/graysort-<time>/
    python jobs/graysort.py --help                    what can be overridden, with the defaults
    python jobs/graysort.py --cfg job                 the composed configuration
    python jobs/graysort.py -m nodes=1,2 graysort.size=50MB,100MB
        a sweep: every combination runs in its own <output_dir>/graysort-<time>_<n>/, and
        <output_dir>/sweep_graysort-<time>/ puts them side by side (summary.md, sweep.png)

Every override (each combination of a sweep) is composed and checked before anything runs:
a bad one is a line naming it and exit code 2. A job's own error (no cluster running, bad
input) is one line and exit code 1; in a sweep the other runs go on and the summary marks it.
"""
from __future__ import annotations

import sys
from collections.abc import Callable

from ..core.errors import ConfigError, FasterFSError

_failed: list[str] = []  # runs that ended in a FasterFSError or did not pass their own checks


def _check(overrides: list[str], multirun: bool) -> None:
    """Compose every run's configuration as the job will (raises ConfigError)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from ..core import config

    if not multirun:
        config.load(overrides)
        return
    try:
        parsed = OverridesParser.create().parse_overrides([o for o in overrides if not o.startswith("hydra.")])
    except Exception as e:
        raise ConfigError(f"bad override: {config.one_line(e)}") from None
    for batch in BasicSweeper.split_arguments(parsed, None):
        for combination in batch:
            config.load(list(combination))


def failure(result: dict) -> str | None:
    """Why a job's result is a failure: the error it raised, or (a job that checks itself, like
    the fault harness) its checks not passed; None when it is not."""
    if result.get("error"):
        return str(result["error"])
    return "did not pass its checks" if result.get("passed") is False else None


def run(main: Callable[[list[str]], dict], doc: str | None, name: str) -> None:
    """`main(overrides)` under Hydra's command line; `name` (the script's) prefixes messages.
    Exits the process."""
    import hydra
    from hydra._internal.utils import get_args_parser
    from hydra.core.hydra_config import HydraConfig

    from ..control.state import DRIVER_METADATA, leave
    from ..core import config

    args = get_args_parser().parse_args(sys.argv[1:])  # argparse: an unknown flag exits 2
    if args.help and doc:
        print(doc.strip() + "\n")
    if not (args.help or args.hydra_help or args.cfg or args.info or args.shell_completion):
        try:
            _check(args.overrides, args.multirun)
        except ConfigError as e:
            print(f"{name}: error: {e}", file=sys.stderr)
            sys.exit(2)

    @hydra.main(version_base="1.3", config_path=str(config.CONF_DIR), config_name=config.config_name(args.overrides))
    def task(_cfg) -> dict | None:
        overrides = list(HydraConfig.get().overrides.task)
        DRIVER_METADATA.update({"fasterfs.ops.job": name, "fasterfs.overrides": " ".join(overrides),
                                "fasterfs.output": HydraConfig.get().runtime.output_dir})
        try:
            result = main(overrides)
        except FasterFSError as e:
            result = {"error": str(e)}
            print(f"{name}: error: {e}", file=sys.stderr)
            if not args.multirun:
                sys.exit(2 if isinstance(e, ConfigError) else 1)
        if failure(result):
            _failed.append(" ".join(overrides) or "(no overrides)")
        for k, v in (result.get("headline") or {}).items():  # what `ray job logs` ends with
            print(f"  {k}: {v}")
        print(f"output: {HydraConfig.get().runtime.output_dir}", flush=True)
        return result

    # Hydra names a job after the module of its task function (here fasterfs.ops.job, for every
    # job): name it after the script instead, for its output directories and --help
    task.__wrapped__.__module__ = name
    try:
        task()
    finally:
        leave()
    if _failed:
        print(f"{name}: {len(_failed)} run(s) failed: {'; '.join(_failed)}", file=sys.stderr)
        sys.exit(1)
    sys.exit(0)
