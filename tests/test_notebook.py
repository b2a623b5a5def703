"""The notebooks run top to bottom against the live cluster."""
import os

import nbformat
from nbclient import NotebookClient

from fasterfs import config


def execute(name: str, cluster_root) -> tuple[str, list]:
    """Run notebooks/<name> against the test cluster; (printed text, outputs)."""
    nb = nbformat.read(config.PROJECT_DIR / "notebooks" / name, as_version=4)
    os.environ["FASTERFS_ROOT"] = str(cluster_root)  # the kernel inherits it: connect() finds this cluster
    try:
        NotebookClient(nb, timeout=300, kernel_name="python3",
                       resources={"metadata": {"path": str(config.PROJECT_DIR / "notebooks")}}).execute()
    finally:
        del os.environ["FASTERFS_ROOT"]
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    return "".join(o.get("text", "") for o in outputs), outputs


def test_quickstart_notebook_executes(ingest_as, cluster_root):
    manifest = ingest_as("csv")
    text, outputs = execute("quickstart.ipynb", cluster_root)
    assert f"dataset {manifest.dataset}: {len(manifest)} csv chunks" in text
    assert "kernel mode real" in text and "FasterFS dashboard: http://127.0.1.2:" in text
    status_html = "".join(o.get("data", {}).get("text/plain", "") for o in outputs)
    for address in ("127.0.1.2", "127.0.1.3"):  # each node's row says healthy
        row = next(line for line in status_html.splitlines() if f"┆ {address} ┆" in line)
        assert row.split("┆")[3].strip() == "true", row
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the mid-price chart


def test_window_replay_notebook_executes(ingest_as, cluster_root):
    ingest_as("arrow")
    text, outputs = execute("backtest_window.ipynb", cluster_root)
    assert "(arrow): window" in text and "replays took" in text
    served = int(text.split("; ")[-1].split(" of ")[0])
    assert served > 0  # the third replay read cached chunks
    assert any("image/png" in o.get("data", {}) for o in outputs)
