"""Who gets in: Ray's token on every entry point, FasterFS's dashboard behind the same token,
read-only reader keys, rotation without data loss, and no secret in anything the cluster
writes. (From outside the cluster, over a network: tests/test_lab.py.)"""
import os
import subprocess
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import CLEAN_ENV, command_lines, dashboard_headers, submit_job, try_driver

import fasterfs
from fasterfs.control import auth, credentials, registry, s3
from fasterfs.core import config
from fasterfs.core.config import Paths

PROJECT = config.PROJECT_DIR
def http_status(url: str, headers: dict | None = None, data: bytes | None = None) -> tuple[int, dict, bytes]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}, data=data), timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a 303 is the answer under test, not something to follow


def test_ray_refuses_drivers_and_jobs_without_the_token(live_cluster, tmp_path):
    token_file = auth.token_file(live_cluster.root)
    assert oct(os.stat(token_file).st_mode & 0o777) == "0o600"
    address, ip = live_cluster.ray_address, live_cluster.head_address
    wrong = tmp_path / "wrong-token"
    auth.create(wrong)
    with ThreadPoolExecutor(3) as pool:  # a refusal takes seconds of retries: side by side
        denied, refused, allowed = pool.map(lambda env: try_driver(address, ip, env),
                                            [{}, auth.ray_env(wrong), auth.ray_env(token_file)])
    assert denied.returncode != 0 and "ran 42" not in denied.stdout
    assert refused.returncode != 0 and "ran 42" not in refused.stdout
    assert allowed.returncode == 0 and "ran 42" in allowed.stdout, allowed.stderr[-2000:]

    # Ray's dashboard and jobs API: 401 without the bearer token, 403 with a wrong one, 200 with it
    jobs_api = f"{live_cluster.dashboard_url}/api/jobs/"
    assert http_status(jobs_api)[0] == 401
    assert http_status(jobs_api, {"Authorization": f"Bearer {wrong.read_text()}"})[0] == 403
    assert http_status(jobs_api, {"Authorization": f"Bearer {token_file.read_text()}"})[0] == 200
    submit = subprocess.run([str(PROJECT / ".venv/bin/ray"), "job", "submit", "--address", live_cluster.dashboard_url,
                             "--submission-id", "test-no-token", "--", "true"], capture_output=True, text=True,
                            timeout=120, env=dict(CLEAN_ENV, HOME="/nonexistent"), cwd="/")
    assert submit.returncode != 0
    from ray.job_submission import JobSubmissionClient

    # asked with this cluster's token, whatever this process's environment names (an earlier test's cluster)
    jobs = JobSubmissionClient(live_cluster.dashboard_url,
                               headers={"Authorization": f"Bearer {token_file.read_text()}"})
    assert "test-no-token" not in {j.submission_id for j in jobs.list_jobs()}


def test_readers_hold_read_only_keys(live_cluster, ingest_as):
    manifest = ingest_as(reuse=True)
    reader = registry.fetch_credentials(live_cluster.name)
    admin = registry.fetch_credentials(live_cluster.name, "admin")
    assert reader.access_key != admin.access_key and reader.secret_key not in repr(reader)
    chunk = manifest.chunks[0]
    node = live_cluster.node(chunk.nodes[0])
    bucket = live_cluster.config["minio"]["bucket"]
    as_reader, as_admin = s3.client(node.endpoint, reader), s3.client(node.endpoint, admin)
    before = as_admin.get_object(Bucket=bucket, Key=chunk.key)["Body"].read()
    assert as_reader.get_object(Bucket=bucket, Key=chunk.key)["Body"].read() == before
    assert as_reader.list_objects_v2(Bucket=bucket, MaxKeys=5)["KeyCount"] > 0
    attempts = {"put new": lambda: as_reader.put_object(Bucket=bucket, Key="security-test/new", Body=b"x"),
                "overwrite": lambda: as_reader.put_object(Bucket=bucket, Key=chunk.key, Body=b"garbage"),
                "delete": lambda: as_reader.delete_object(Bucket=bucket, Key=chunk.key),
                "new bucket": lambda: as_reader.create_bucket(Bucket="security-test")}
    for what, attempt in attempts.items():
        with pytest.raises(as_reader.exceptions.ClientError, match="AccessDenied"):
            attempt()
            pytest.fail(f"MinIO let the reader {what}")
    # DeleteObjects answers 200 and refuses key by key
    many = as_reader.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": chunk.key}]})
    assert [e["Code"] for e in many.get("Errors", [])] == ["AccessDenied"] and not many.get("Deleted")
    assert as_admin.get_object(Bucket=bucket, Key=chunk.key)["Body"].read() == before  # nothing changed
    # every reader FasterFS hands out signs as that user: the client (and so the mount and fasterfs://)
    client = fasterfs.connect(live_cluster.root)
    signer = client.session._s3[node.index]._request_signer._credentials
    assert signer.access_key == reader.access_key
    assert client.read_chunk(chunk.id) == before


@pytest.fixture
def gated_dashboard(live_cluster):
    """A second FasterFS dashboard of the live cluster, in this process, that wants the token
    even on loopback (dashboard.require_token=always), as every non-loopback one does."""
    from fasterfs.dashboard.dashboard import DashboardServer

    port = live_cluster.config["dashboard"]["port"] + 50
    server = DashboardServer(live_cluster.root, live_cluster.head_address, port, 2.0, "always")
    try:
        yield server.ready()
    finally:
        server.stop()


def test_dashboard_behind_the_token(live_cluster, gated_dashboard):
    url = gated_dashboard
    token = auth.read(auth.token_file(live_cluster.root))
    assert http_status(f"{url}/healthz")[0] == 200  # liveness needs nothing
    status, headers, _ = http_status(f"{url}/kernel", {"Accept": "text/html"})
    assert status == 303 and headers["location"] == "/login?next=/kernel"
    for path in ("/api/snapshot", "/metrics", "/fragment", "/api/runs", "/api/kernel/layout"):
        assert http_status(url + path)[0] == 401, path
        assert http_status(url + path, {"Authorization": "Bearer not-the-token"})[0] == 401, path
    status, _, body = http_status(f"{url}/metrics", {"Authorization": f"Bearer {token}"})
    assert status == 200 and b"fasterfs_" in body  # a Prometheus scrape with the token
    assert http_status(f"{url}/login", data=b"token=wrong&next=/kernel")[0] == 401
    status, headers, _ = http_status(f"{url}/login", data=f"token={token}&next=/kernel".encode())
    assert status == 303 and headers["location"] == "/kernel"
    cookie = headers["set-cookie"].split(";")[0]
    assert token not in cookie and "httponly" in headers["set-cookie"].lower()
    status, _, page = http_status(f"{url}/", {"Cookie": cookie, "Accept": "text/html"})
    assert status == 200 and b"FasterFS" in page
    assert http_status(f"{url}/login", data=f"token={token}&next=//evil.example/".encode())[1]["location"] == "/"

    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    ws_url = url.replace("http://", "ws://") + "/ws/kernel"
    with pytest.raises(InvalidStatus):
        connect(ws_url, open_timeout=10, proxy=None).close()
    with connect(ws_url, additional_headers={"Cookie": cookie}, open_timeout=10, proxy=None) as ws:
        assert ws.recv(timeout=30)  # the heatmap's first frame


def _secrets(root: str) -> dict[str, str]:
    keys = credentials.load(Paths(Path(root)).credentials_file)
    return {"Ray token": auth.read(auth.token_file(root)), "MinIO admin secret": keys.admin.secret_key,
            "MinIO reader secret": keys.reader.secret_key}


def _files_holding(top: Path, secrets: dict[str, str], skip) -> list[str]:
    found = []
    for path in top.rglob("*"):
        if not path.is_file() or path.is_symlink() or skip(path):
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        found += [f"{what} in {path}" for what, value in secrets.items() if value.encode() in data]
    return found


def test_no_secret_in_anything_the_cluster_wrote(live_cluster, overrides, ingest_as):
    """After the suite's workloads on this cluster (jobs run and submitted, ingest, the mount,
    the notebook, repairs): no token or key in its files, Ray's logs and job logs, the
    dashboard's answers, or any process's command line."""
    from ray.job_submission import JobSubmissionClient

    secrets = _secrets(live_cluster.root)
    root = Path(live_cluster.root)
    # where they belong (0600): the head's, and each storage host's copy a head that lost its disk takes back
    kept = {Paths(root).credentials_file, auth.token_file(root)}
    kept |= {Paths(root).node_dir(n.index) / credentials.NODE_COPY for n in live_cluster.nodes}
    assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in kept), [(p, oct(p.stat().st_mode)) for p in kept]
    # MinIO's own user store holds the reader's identity, as any MinIO does
    leaks = _files_holding(root, secrets, lambda p: p in kept or ".minio.sys" in p.parts)
    import ray

    session = Path(ray._private.worker._global_node.get_session_dir_path())
    leaks += _files_holding(session / "logs", secrets, lambda p: False)
    jobs = JobSubmissionClient(live_cluster.dashboard_url)
    if not any(j.submission_id for j in jobs.list_jobs()):  # this test run alone: submit one
        ingest_as()
        submit_job(live_cluster, "readback", overrides)
    submitted = [j.submission_id for j in jobs.list_jobs() if j.submission_id]
    for sid in submitted:
        leaks += [f"{what} in `ray job logs {sid}`" for what, v in secrets.items() if v in jobs.get_job_logs(sid)]
    for path in ("/", "/fragment", "/api/snapshot", "/metrics", "/api/runs", "/kernel", "/runs", "/api/jobs"):
        _, _, body = http_status(live_cluster.web_url + path, dashboard_headers(live_cluster))
        leaks += [f"{what} in dashboard {path}" for what, v in secrets.items() if v.encode() in body]
    for pid, cmd in command_lines():
        leaks += [f"{what} on the command line of pid {pid}" for what, v in secrets.items() if v.encode() in cmd]
    assert not leaks, leaks


def test_certificate_authority(tmp_path):
    """minio.tls: the CA signs certificates for IP addresses only, its key is private, a
    client trusts it once told, and refuses an https endpoint before."""
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

    from fasterfs.control import tls
    from fasterfs.core.errors import FasterFSError

    ca_dir = tmp_path / "ca"
    pem = tls.create_ca(ca_dir, "t")
    assert oct(os.stat(ca_dir / "ca.key").st_mode & 0o777) == "0o600"
    assert tls.create_ca(ca_dir, "t") == pem and tls.create_ca(ca_dir, "t", rotate=True) != pem
    pem = (ca_dir / "ca.crt").read_text()
    signed = {}

    def sign(address, public):
        signed["cert"] = tls.issue(ca_dir, address, public)
        return signed["cert"], pem

    certs = tmp_path / "certs"
    assert tls.server_files(certs, "127.0.9.2", sign) == pem
    assert oct(os.stat(certs / "private.key").st_mode & 0o777) == "0o600"
    leaf, ca = x509.load_pem_x509_certificate(signed["cert"].encode()), x509.load_pem_x509_certificate(pem.encode())
    leaf.verify_directly_issued_by(ca)
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.9.2"]
    with pytest.raises(FasterFSError, match="not 'minio.example'"):
        tls.issue(ca_dir, "minio.example", _public_pem(ec))
    assert tls.ca_file("http://127.0.9.2:9000") is None
    tls._ca_file = None
    with pytest.raises(FasterFSError, match="has not learnt the cluster's CA"):
        tls.ca_file("https://127.0.9.2:9000")
    path = tls.trust(pem)
    try:
        assert tls.ca_file("https://127.0.9.2:9000") == path
        assert tls.urllib3_options("https://127.0.9.2:9000") == {"cert_reqs": "CERT_REQUIRED", "ca_certs": path}
    finally:
        tls.forget(pem)
        tls._ca_file = None
    assert not Path(path).exists()


def _public_pem(ec) -> str:
    from cryptography.hazmat.primitives import serialization

    return ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
