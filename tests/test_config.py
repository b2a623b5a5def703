"""Configuration and credentials: overrides, clear errors, secrets kept private."""
import json
import os
import shutil
import stat
import subprocess
import sys

import pytest

from fasterfs.control import credentials
from fasterfs.core import config
from fasterfs.core.errors import FasterFSError

pytestmark = pytest.mark.unit  # no root, no Ray, no MinIO


def test_defaults_and_overrides():
    cfg = config.load(["nodes=4", "data.rows_per_chunk=500"])
    assert cfg.nodes == 4 and cfg.data.rows_per_chunk == 500
    assert config.Layout.of(cfg).addresses == ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
    assert config.load([]).data.rows_per_chunk == 1000


@pytest.mark.parametrize("overrides", [
    [], ["nodes=3", "replicas=2"], ["data=synthetic", "data.rows=5000"], ["data.rows=null", "data=synthetic"],
    ["lab=unlimited", "lab.link_mbit=5"], ["+extra.x=1", "++nodes=2"], ["~bench"],
    ["cluster.worker_ports=[20500,20600]"],
    ["hydra.job.name=x", "cluster.root=/var/tmp/y", "dashboard.port=${minio.port}"]])
def test_a_composition_is_what_hydra_composes(overrides):
    """Composition takes Hydra's defaults once and applies value overrides to a copy: held
    against Hydra's compose() of the same overrides, as its own API gives it."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from fasterfs.core import composition

    name = config.config_name(overrides)
    with initialize_config_dir(config_dir=str(config.CONF_DIR), version_base="1.3"):
        by_hydra = OmegaConf.to_container(compose(config_name=name, overrides=overrides))
    assert OmegaConf.to_container(composition.compose(config.CONF_DIR, overrides, False, name)) == by_hydra


def test_each_load_is_a_copy_composed_for_the_environment_of_the_moment(monkeypatch):
    """load() hands out copies of what it composed before: a caller's change stays its own, and
    FASTERFS_ROOT (read by conf/ through oc.env) is read again when it changes."""
    first = config.load(["nodes=3"])
    first.nodes = 7
    first.cluster.root = "/elsewhere"
    again = config.load(["nodes=3"])
    assert again.nodes == 3 and again.cluster.root != "/elsewhere"
    monkeypatch.setenv("FASTERFS_ROOT", "/var/tmp/ffs-other")
    assert config.load(["nodes=3"]).cluster.root == "/var/tmp/ffs-other"
    monkeypatch.delenv("FASTERFS_ROOT")
    assert config.load(["nodes=3"]).cluster.root == again.cluster.root


def test_the_lab_group_only_where_the_lab_is_named():
    """conf/lab/ joins the lab's commands and whatever names it; other commands compose without it."""
    assert "lab" not in config.load([])
    assert config.load([], lab=True).lab.profile == "laptops"  # conf/with_lab.yaml's default
    assert config.load(["lab=unlimited"]).lab.disk_mbit is None
    assert config.load(["lab.subnet=198.18.7"]).lab.subnet == "198.18.7"
    assert config.load([]).faults.replicas == 2 and config.load([]).chaos.layout == "ec"  # groups of their own


def test_synthetic_data_group():
    cfg = config.load(["data=synthetic", "data.rows=5000", "data.level=5"])
    assert cfg.data.source == "synthetic" and cfg.data.name == "SYNTH_L5_5000"


@pytest.mark.parametrize("override, culprit", [
    (["nodes=0"], "nodes"),
    (["replicas=3"], "replicas"),
    (["data.format=parquet"], "data.format"),
    (["data.rows_per_chunk=0"], "data.rows_per_chunk"),
    (["cluster.first_address=127.0.0.1"], "cluster.first_address"),
    (["cluster.first_address=10.0.0.2"], "cluster.first_address"),
    (["minio.port=70000"], "minio.port"),
    (["no_such_option=1"], "no_such_option"),
    (["cache.peer_slower_ms=-1"], "cache.peer_slower_ms"),
    (["minio.tls=maybe"], "minio.tls"),
    (["cluster.insecure=1"], "cluster.insecure"),
    (["dashboard.require_token=never"], "dashboard.require_token"),
    (["namespace.shed_read_ahead_above=150"], "namespace.shed_read_ahead_above"),
    (["client.hedge.factor=0.5"], "client.hedge.factor"),
    (["client.hedge.min_ms=-1"], "client.hedge.min_ms"),
    (["lab.disk_mb=10"], "lab.disk_mb"),
    (["mount.max_entries=-1"], "mount.max_entries"),
    (["mount.hung_s=0"], "mount.hung_s"),
    (["cluster.idle_worker_s=-1"], "cluster.idle_worker_s"),
    (["repair.move_threads=0"], "repair.move_threads"),
    (["repair.threads=true"], "repair.threads"),
    (["ingest.keep_old_s=soon"], "ingest.keep_old_s"),
    (["cluster.client_port=11001"], r"cluster.client_port=11001: 11001 overlaps cluster.worker_ports \[10002, 19999\]"),
    (["cluster.agent_port=19950"], r"cluster.agent_port=19950: 19950..20049 overlaps"),  # node i at + i, head + 99
    (["cluster.worker_ports=[20500,20600]"], "cluster.node_ports=20100: 20100..21096 overlaps"),
    (["cluster.worker_ports=5"], "cluster.worker_ports=5: must be a list of two"),
])
def test_bad_option_named(override, culprit):
    with pytest.raises(FasterFSError, match=culprit):
        config.load(override)


def test_read_ahead_is_shed_while_the_cpus_are_contended(tmp_path):
    """CpuPressure reads the kernel's PSI line; the figure decides, once a second at most."""
    from fasterfs.read.open_file import CpuPressure

    psi = tmp_path / "cpu"
    psi.write_text("some avg10=72.50 avg60=10.00 avg300=1.00 total=1\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    assert CpuPressure(50, str(psi)).busy() and not CpuPressure(80, str(psi)).busy()
    assert not CpuPressure(50, str(tmp_path / "none")).busy()  # no PSI: never shed
    now = [0.0]
    pressure = CpuPressure(50, str(psi), clock=lambda: now[0])
    assert pressure.busy()
    psi.write_text("some avg10=3.00 avg60=1.00 avg300=1.00 total=1\n")
    now[0] = 0.99
    assert pressure.busy()  # read at most once a second: still the figure it read
    now[0] = 1.0
    assert not pressure.busy()  # a second later, the new one


def test_credentials_private_and_stable(tmp_path):
    path = tmp_path / "credentials.json"
    keys = credentials.create(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert credentials.create(path) == keys  # never regenerated under existing data
    assert all(secret not in repr(keys) for secret in keys.secrets())
    assert keys.reader.access_key != keys.admin.access_key  # readers sign as a user of their own
    other = credentials.create(tmp_path / "other.json")
    assert other.admin != keys.admin and other.reader != keys.reader  # per cluster, not a default
    rotated = credentials.create(path, rotate=True)
    assert rotated.admin != keys.admin and rotated.reader.secret_key != keys.reader.secret_key
    assert credentials.load(path) == rotated and stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_credentials_with_loose_mode_refused(tmp_path):
    path = tmp_path / "credentials.json"
    credentials.create(path)
    os.chmod(path, 0o644)
    with pytest.raises(FasterFSError, match="mode 644"):
        credentials.load(path)


def test_missing_minio_binary_says_how_to_install(tmp_path):
    cfg = config.load([f"minio.binary={tmp_path}/minio"])
    with pytest.raises(FasterFSError, match="make setup"):
        config.minio_binary(cfg)


def test_a_jobs_result_fails_only_on_an_error_or_its_own_checks():
    """What makes `python jobs/x.py` (and a sweep's run) exit 1: a count of failed reads that is
    0 in a passing harness run is not a failure (it was: 20 clean minutes reported as failed)."""
    from fasterfs.ops.job import failure

    assert failure({"failed": 0, "passed": True, "reads": 131509}) is None
    assert failure({"figures": {"mb_s": 1.0}}) is None
    assert failure({"error": "option graysort.size='7B': ..."}) == "option graysort.size='7B': ..."
    assert failure({"failed": 0, "passed": False}) == "did not pass its checks"


def _load_in_a_new_process(env: dict, *overrides: str) -> dict:
    code = ("import json, sys; from omegaconf import OmegaConf; from fasterfs.core import config; "
            "print(json.dumps(OmegaConf.to_container(config.load(sys.argv[1:]))))")
    out = subprocess.run([sys.executable, "-c", code, *overrides], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_composition_is_kept_for_other_processes_of_its_user_alone(tmp_path, monkeypatch):
    """A second process takes the first one's composition from the user's cache (as Hydra composes
    it); a kept file someone else owns, or in a directory others may write to, is not used."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from fasterfs.core import config_cache

    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    first = _load_in_a_new_process(env, "nodes=3", "replicas=2")
    with initialize_config_dir(config_dir=str(config.CONF_DIR), version_base="1.3"):
        by_hydra = compose(config_name="config", overrides=["nodes=3", "replicas=2"])
        OmegaConf.resolve(by_hydra)
    assert first == OmegaConf.to_container(by_hydra)
    kept = list((tmp_path / "cache" / "fasterfs" / "config").glob("*.json"))
    assert len(kept) == 1 and stat.S_IMODE(kept[0].stat().st_mode) == 0o600
    assert stat.S_IMODE(kept[0].parent.stat().st_mode) == 0o700
    # what is kept is what the next process uses (changed here by its owner, to see it read)
    changed = dict(json.loads(kept[0].read_text()), nodes=5)
    kept[0].write_text(json.dumps(changed))
    assert _load_in_a_new_process(env, "nodes=3", "replicas=2")["nodes"] == 5
    # what the next process would refuse, asked here (the same reads as in that process)
    monkeypatch.setenv("XDG_CACHE_HOME", env["XDG_CACHE_HOME"])
    assert config_cache.get(kept[0].stem) == changed
    kept[0].chmod(0o666)  # one others could have written: not used
    assert config_cache.get(kept[0].stem) is None
    kept[0].chmod(0o600)
    if os.geteuid() == 0:  # only root can hand a file to another user
        os.chown(kept[0], 65534, 65534)  # another user's file: not used
        assert config_cache.get(kept[0].stem) is None
        os.chown(kept[0], 0, 0)
    assert config_cache.get(kept[0].stem) == changed
    kept[0].parent.chmod(0o777)  # a directory others may write to: not used at all
    assert config_cache.directory() is None and config_cache.get(kept[0].stem) is None
    # conf/ changed: another key
    conf = tmp_path / "conf"
    shutil.copytree(config.CONF_DIR, conf)
    before = config_cache.key(("nodes=3",), conf_dir=conf)
    (conf / "config.yaml").write_text((conf / "config.yaml").read_text() + "\n# an edit\n")
    assert config_cache.key(("nodes=3",), conf_dir=conf) != before
