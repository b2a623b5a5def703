"""Run on a machine of the lab network that is not part of the cluster (tests/test_lab.py):
tries every way in, without the secrets and with them, and prints what each attempt got as
JSON. The secrets come in a 0600 file named on the command line, never the values.

    python tests/outsider.py <facts.json>
"""
import json
import subprocess
import sys
import urllib.error
import urllib.request


def http(url: str, token: str | None = None, data: bytes | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if data is not None:
        headers["Content-Type"] = "application/json"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(url, data=data, headers=headers), timeout=20) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError as e:
        return -1 if "refused" in str(e).lower() else -2


def s3_try(endpoint: str, bucket: str, key: str, keys: tuple[str, str] | None, ca: str | None) -> dict:
    """GET, PUT and DELETE of an object, signed with `keys` (None: anonymous), verifying
    MinIO's certificate against the cluster's CA (the file `ca`)."""
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    extra = {"aws_access_key_id": keys[0], "aws_secret_access_key": keys[1]} if keys else {}
    cfg = Config(signature_version=UNSIGNED if keys is None else "s3v4", s3={"addressing_style": "path"},
                 retries={"max_attempts": 1}, connect_timeout=5, read_timeout=20)
    c = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", config=cfg, verify=ca, **extra)
    out = {}
    for op, call in (("get", lambda: c.get_object(Bucket=bucket, Key=key)["Body"].read()),
                     ("put", lambda: c.put_object(Bucket=bucket, Key=f"outsider/{key}", Body=b"x")),
                     ("delete", lambda: c.delete_object(Bucket=bucket, Key=f"outsider/{key}"))):
        try:
            call()
            out[op] = "ok"
        except Exception as e:  # the S3 error code is the answer
            out[op] = getattr(e, "response", {}).get("Error", {}).get("Code", type(e).__name__)
    return out


def tls_try(endpoint: str, ca: str) -> dict:
    """MinIO's health URL over plain HTTP, over HTTPS trusting only the system's CAs, and
    over HTTPS verified against the cluster's CA."""
    import ssl

    plain = endpoint.replace("https://", "http://")
    out = {}
    for how, url, context in (("plain_http", plain, None), ("system_cas", endpoint, ssl.create_default_context()),
                              ("cluster_ca", endpoint, ssl.create_default_context(cafile=ca))):
        try:
            with urllib.request.urlopen(url + "/minio/health/live", timeout=10, context=context) as r:
                out[how] = r.status
        except urllib.error.HTTPError as e:
            out[how] = e.code
        except OSError as e:
            out[how] = type(getattr(e, "reason", e)).__name__
    return out


def ray_join(ray_bin: str, address: str, me: str, env: dict, timeout: float) -> dict:
    """`ray start --address` as a new node (the test counts the cluster's nodes afterwards,
    and stops whatever this started: it runs in a cgroup of the test's)."""
    try:
        p = subprocess.run([ray_bin, "start", f"--address={address}", f"--node-ip-address={me}", "--num-cpus=0",
                            "--disable-usage-stats"], capture_output=True, text=True, timeout=timeout, env=env)
        return {"exit": p.returncode, "said": (p.stdout + p.stderr)[-600:]}
    except subprocess.TimeoutExpired:
        return {"exit": None, "said": f"no answer within {timeout} s"}


def main() -> None:
    facts = json.load(open(sys.argv[1]))
    token, head = facts["token"], facts["head"]
    result = {"ray_dashboard": {}, "fasterfs_dashboard": {}, "jobs": {}, "minio": {}}
    for who, t in (("none", None), ("wrong", "not-the-token"), ("token", token)):
        result["ray_dashboard"][who] = http(f"http://{head}:{facts['ray_dashboard_port']}/api/jobs/", t)
        result["fasterfs_dashboard"][who] = http(f"http://{head}:{facts['dashboard_port']}/api/snapshot", t)
        job = json.dumps({"entrypoint": "true", "submission_id": f"outsider-{who}"}).encode()
        result["jobs"][who] = http(f"http://{head}:{facts['ray_dashboard_port']}/api/jobs/", t, job)
    endpoint, bucket, key = facts["minio"], facts["bucket"], facts["key"]
    ca = None
    if facts.get("ca"):  # MinIO over TLS: the CA certificate is public; trust it from a file of our own
        import tempfile

        ca = tempfile.NamedTemporaryFile("w", suffix=".crt", delete=False)
        ca.write(facts["ca"])
        ca.close()
        ca = ca.name
        result["tls"] = tls_try(endpoint, ca)
    result["minio"] = {who: s3_try(endpoint, bucket, key, k, ca) for who, k in
                       (("none", None), ("wrong", ("ffs-nobody", "not-a-secret-at-all")),
                        ("reader", tuple(facts["reader"])), ("admin", tuple(facts["admin"])))}
    # Ray tries the GCS once a second, 20 times by default: 3 tell a refusal as well
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_gcs_server_port_wait_time_s": "3"}
    result["join"] = ray_join(facts["ray"], facts["ray_address"], facts["me"], env, facts["join_timeout"])
    if ca:
        import os

        os.unlink(ca)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
