"""The notebooks run top to bottom against the session's live cluster, and so do the README's
Python blocks."""
import json
import os
import re
import subprocess
import sys

import nbformat
from nbclient import NotebookClient

from fasterfs.core import config
from fasterfs.ops import cluster


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


def test_window_replay_notebook_executes(ingest_as, cluster_root):
    ingest_as("arrow", reuse=True)
    text, outputs = execute("backtest_window.ipynb", cluster_root)
    assert "(arrow): window" in text and "replays took" in text
    served = int(text.split("; ")[-1].split(" of ")[0])
    assert served > 0  # the third replay read cached chunks
    assert any("image/png" in o.get("data", {}) for o in outputs)


def test_jupyterlab_serves_the_notebooks_with_a_kernel_that_reaches_the_cluster(ingest_as, live_cluster, overrides,
                                                                               cluster_root, tmp_path):
    """`fasterfs notebook` from a shell without the virtualenv: JupyterLab on the head's
    address behind its token, a kernel of that server runs the quickstart notebook against the
    cluster (what it prints and shows: the dataset, the kernel's mode, the dashboard's link, each
    node healthy, the chart), Chromium loads the Lab page, status and the dashboard link to it,
    stop ends it."""
    import json
    import subprocess
    import urllib.error
    import urllib.request

    from browser import Browser
    from conftest import CLEAN_ENV, dashboard_headers
    from jupyter_client import BlockingKernelClient

    from fasterfs.dashboard import notebook

    manifest = ingest_as("csv", reuse=True)
    fasterfs = str(config.PROJECT_DIR / ".venv/bin/fasterfs")
    out = subprocess.run([fasterfs, "notebook", *overrides], env=CLEAN_ENV, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    state = cluster.ClusterState.load(cluster_root)
    info = state.notebook
    assert info["url"].startswith(f"http://{live_cluster.head_address}:")
    token = open(info["token_file"]).read().strip()
    assert oct(os.stat(info["token_file"]).st_mode & 0o777) == "0o600"
    assert token not in open(f"/proc/{info['pid']}/cmdline").read()  # handed over in the environment
    base = info["url"].rsplit("/lab", 1)[0]
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def api(path, method="GET", body=None, auth=True):
        req = urllib.request.Request(base + path, method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"token {token}"} if auth else {})
        with opener.open(req, timeout=30) as r:
            return json.loads(r.read() or b"null")

    try:
        try:
            api("/api/contents", auth=False)
            raise AssertionError("JupyterLab answered without its token")
        except urllib.error.HTTPError as e:
            assert e.code == 403
        assert {f["name"] for f in api("/api/contents")["content"]} >= {"quickstart.ipynb", "backtest_window.ipynb"}
        # a kernel of this server runs the quickstart notebook, cell by cell
        kernel = api("/api/kernels", "POST", {"name": "python3"})
        kc = BlockingKernelClient(connection_file=str(cluster_root / "jupyter/runtime" / f"kernel-{kernel['id']}.json"))
        kc.load_connection_file()
        # Jupyter's 1 s for a heartbeat: a kernel starting beside the suite's other work on 2 busy
        # cores missed it, alive, and was called dead
        kc.hb_channel.time_to_dead = 10.0
        kc.start_channels()
        texts = []
        try:
            kc.wait_for_ready(timeout=60)
            # the kernel is the project's interpreter (the server runs from an environment of its own)
            kc.execute_interactive("import sys; print('prefix', sys.prefix)", timeout=60,
                                   output_hook=lambda m: texts.append(m["content"].get("text", "")))
            assert f"prefix {config.PROJECT_DIR / '.venv'}" in "".join(texts), texts
            nb = nbformat.read(config.PROJECT_DIR / "notebooks/quickstart.ipynb", as_version=4)
            shown: list[dict] = []  # what the cells displayed (tables, charts) by MIME type
            for cell in (c for c in nb.cells if c.cell_type == "code"):
                reply = kc.execute_interactive(
                    cell.source, timeout=300,
                    output_hook=lambda m: (texts.append(m["content"].get("text", "")) if m["msg_type"] == "stream"
                                           else shown.append(m["content"]["data"])
                                           if m["msg_type"] in ("display_data", "execute_result") else None))
                assert reply["content"]["status"] == "ok", (cell.source[:200], reply["content"])
        finally:
            kc.stop_channels()
            api(f"/api/kernels/{kernel['id']}", "DELETE")
        text = "".join(texts)
        assert f"dataset {manifest.dataset}: {len(manifest)} csv chunks" in text
        assert "kernel mode real" in text and f"FasterFS dashboard: http://{live_cluster.head_address}:" in text
        status_table = "".join(d.get("text/plain", "") for d in shown)
        for address in (n.address for n in live_cluster.nodes):  # each node's row says healthy
            row = next(line for line in status_table.splitlines() if f"┆ {address} ┆" in line)
            assert row.split("┆")[3].strip() == "true", row
        assert any("image/png" in d for d in shown)  # the mid-price chart
        # the Lab page itself, in a real browser
        b = Browser()
        try:
            b.open(f"{info['url']}?token={token}")
            b.wait("document.querySelector('#jp-main-dock-panel') !== null", 90, "JupyterLab's main area")
            assert "JupyterLab" in b.js("document.title")
            b.screenshot(tmp_path / "jupyterlab.png")
        finally:
            b.close()
        # linked from `fasterfs status` and from the FasterFS dashboard
        status = subprocess.run([fasterfs, "status", *overrides], env=CLEAN_ENV, capture_output=True, text=True,
                                timeout=180)
        assert f"JupyterLab: {info['url']}" in status.stdout
        dashboard = urllib.request.Request(live_cluster.web_url + "/", headers=dashboard_headers(live_cluster))
        page = opener.open(dashboard, timeout=30).read().decode()
        assert f'href="{info["url"]}"' in page
    finally:
        pid = info["pid"]
        assert notebook.stop(state)
        state.save()
    try:  # gone, or a zombie its new parent has yet to reap
        assert open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        pass


def python_blocks() -> str:
    """The README's two Python blocks and docs/api.md's, as printed there, each followed by a line
    of what it made (JSON, tagged): one interpreter runs them all, as a user's session would."""
    def block(page: str, k: int) -> str:
        return re.findall(r"```python\n(.*?)```", (config.PROJECT_DIR / page).read_text(), re.S)[k]
    return "\n".join([
        "import hashlib, json",
        block("README.md", 0),
        "print('readme0', json.dumps([hashlib.sha256(raw).hexdigest(), len(df), len(window)]))",
        block("README.md", 1),
        "print('readme1', json.dumps([len(df), book.to_pydict(), ds.count()]))",
        block("docs/api.md", 0),
        "print('api', json.dumps([len(book), len(window), ds.count()]))"])


def test_the_python_blocks_of_the_readme_and_the_api_page_run(ingest_as, overrides, cluster_root, tmp_path):
    """The README's blocks and docs/api.md's, in a process of their own against the test cluster
    (a Parquet file stored at research/aapl first), each held to what it was given: the README's
    chunk 3 is the source files' rows of that chunk (gzip's read of them), its window every message
    of 10:00-10:30; pandas over fasterfs:// reads that chunk's rows, the pyarrow dataset the table
    pyarrow wrote, Ray Data every row; the API page's chunk 0 has the source's first rows and its
    window every message of 9:30-9:40."""
    import hashlib

    import pyarrow as pa
    import pyarrow.parquet as pq
    from conftest import data_overrides, source_csv, source_lines

    from fasterfs.write.ingest import put, remove

    manifest = ingest_as("csv", reuse=True)  # connect()'s default: the dataset ingested last
    table = pa.table({"price": list(range(1000)), "size": [i % 7 for i in range(1000)]})
    pq.write_table(table, tmp_path / "book.parquet")
    put(config.load(overrides), tmp_path / "book.parquet", "research/aapl/book.parquet")
    try:
        done = subprocess.run([sys.executable, "-c", f"dataset = {manifest.name!r}\n" + python_blocks()],
                              capture_output=True, timeout=240, env={**os.environ, "FASTERFS_ROOT": str(cluster_root)},
                              cwd=config.PROJECT_DIR)
    finally:
        remove(config.load(overrides), "research/aapl/book.parquet")
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    said = {line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1])
            for line in done.stdout.decode().splitlines() if line.startswith(("readme0 ", "readme1 ", "api "))}
    times = [float(line.split(b",")[0]) for line in source_lines([])[0]]
    chunk = manifest.chunk(3)
    rows = source_csv(chunk.first_row, chunk.rows)
    assert said["readme0"] == [hashlib.sha256(rows).hexdigest(), chunk.rows, sum(36000 <= t < 37800 for t in times)]
    assert said["readme1"] == [rows.count(b"\n"), table.to_pydict(), len(times)]
    first = min(len(times), config.load(data_overrides()).data.rows_per_chunk)  # the source's first rows
    assert said["api"] == [first, sum(34200.0 <= t < 34800.0 for t in times), len(times)] and said["api"][1] > 0
