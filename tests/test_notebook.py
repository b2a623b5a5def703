"""The quickstart notebook runs top to bottom against the live cluster."""
import os

import nbformat
from nbclient import NotebookClient

from fasterfs import config


def test_quickstart_notebook_executes(ingest_as, cluster_root):
    manifest = ingest_as("csv")
    nb = nbformat.read(config.PROJECT_DIR / "notebooks" / "quickstart.ipynb", as_version=4)
    os.environ["FASTERFS_ROOT"] = str(cluster_root)  # the kernel inherits it: connect() finds this cluster
    try:
        NotebookClient(nb, timeout=300, kernel_name="python3",
                       resources={"metadata": {"path": str(config.PROJECT_DIR / "notebooks")}}).execute()
    finally:
        del os.environ["FASTERFS_ROOT"]
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs)
    assert f"dataset {manifest.dataset}: {len(manifest)} csv chunks" in text
    assert "kernel mode real" in text and "FasterFS dashboard: http://127.0.1.2:" in text
    status_html = "".join(o.get("data", {}).get("text/plain", "") for o in outputs)
    assert "true" in status_html  # the nodes' health column
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the mid-price chart
