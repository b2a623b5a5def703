"""The FUSE daemon's own tests (native/ffs-mount: `cargo test`), in the suite so that CI runs
them: its tree and deltas, the protocol against a scripted agent, and its fetch path against a
small HTTP server (bytes refused by their checksum, kept-alive connections). Built in the
release profile by `make setup-test`; in the cluster tier, as it runs cargo and its build."""
import shutil
import subprocess
from pathlib import Path

CRATE = Path(__file__).resolve().parents[1] / "native" / "ffs-mount"


def test_the_daemons_own_tests_pass():
    cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
    r = subprocess.run([cargo, "test", "--release", "--locked", "--manifest-path", str(CRATE / "Cargo.toml")],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "test result: ok" in r.stdout and " 0 failed" in r.stdout, r.stdout[-2000:]
