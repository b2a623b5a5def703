"""Hydra's composition of conf/ with overrides, at the cost of a copy for most of them.

Hydra composes in two steps: the defaults list (config.yaml and the groups' choices, e.g.
`data=synthetic`) is loaded and merged, then the value overrides (`nodes=4`, `+x=1`, `~x`) are
applied to the result, in order. The first step is most of the cost (YAML parsed in Python,
merges: ~90 ms a composition); it depends only on the group choices. So it is done once per
process for each set of them, and the value overrides are applied to a copy by Hydra's own
code: the same result (tests/test_config.py holds the two against each other) in ~2 ms.
"""
from __future__ import annotations

import functools
import pickle
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig

from .errors import ConfigError


def compose(conf_dir: Path, overrides: Sequence[str], in_job: bool, name: str) -> DictConfig:
    """conf_dir/<name>.yaml composed with `overrides`, as Hydra's compose() returns it (not yet
    resolved). in_job: inside a job's @hydra.main, whose Hydra already knows conf_dir."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.errors import HydraException

    try:
        parsed = _parser().parse_overrides(list(overrides))
        groups = {p.name for p in conf_dir.iterdir() if p.is_dir()}
        for_hydra = tuple(o.input_line for o in parsed if _shapes_the_defaults(o, groups))
        cfg = pickle.loads(_defaults(str(conf_dir), for_hydra, in_job, name))
        ConfigLoaderImpl._apply_overrides_to_config([o for o in parsed if o.input_line not in for_hydra], cfg)
        return cfg
    except HydraException as e:
        raise ConfigError(f"bad override{_culprit(overrides)}: {one_line(e)}") from None


def _shapes_the_defaults(override, groups: set[str]) -> bool:
    """An override Hydra must see while it builds the defaults list: a group's choice, one of
    Hydra's own settings, a sweep (which compose refuses), a package."""
    key = override.key_or_group
    return (key in groups or key.split(".")[0] == "hydra" or override.is_sweep_override()
            or override.package is not None)


@functools.lru_cache(maxsize=16)
def _defaults(conf_dir: str, overrides: tuple[str, ...], in_job: bool, name: str) -> bytes:
    """Hydra's composition with `overrides` only, pickled: each caller gets a copy of its own."""
    from hydra import compose, initialize_config_dir

    if in_job:  # inside a job's @hydra.main: same conf/
        return pickle.dumps(compose(config_name=name, overrides=list(overrides)))
    with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
        return pickle.dumps(compose(config_name=name, overrides=list(overrides)))


@functools.cache
def _parser():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def _culprit(overrides: Sequence[str]) -> str:
    """ ' x=[1' when Hydra's grammar refuses that override (its message does not say which)."""
    for o in overrides:
        try:
            _parser().parse_override(o)
        except Exception:
            return f" {o!r}"
    return ""


def one_line(e: BaseException) -> str:
    """Hydra's and OmegaConf's multi-line messages (with their full_key/object_type trailers)
    as one line."""
    lines = [line.strip() for line in str(e).splitlines()]
    return "; ".join(line.rstrip(".") for line in lines if line and not line.startswith(("full_key:", "object_type=",
                                                                              "reference_type=")))
