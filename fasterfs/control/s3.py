"""boto3 clients for the nodes' MinIO servers: path-style requests (GET /bucket/key,
which the kernel programs parse), pooled connections, and fail-fast timeouts so a
dead node costs milliseconds before a replica is tried."""
from __future__ import annotations

import functools
import threading

import boto3
import urllib3
from botocore.config import Config

from ..core.errors import FasterFSError
from . import tls
from .credentials import Credentials

_session = None
_session_lock = threading.Lock()


def client(endpoint: str, creds: Credentials, connect_timeout: float = 1.0, read_timeout: float = 10.0,
           pool: int = 16):
    """A boto3 client of one MinIO, shared in this process by everyone who asks for the same
    (clients are thread-safe): making one took 5 ms of CPU, which every `fasterfs.connect` paid
    once per node."""
    return _client(endpoint, tls.ca_file(endpoint), creds.access_key, creds.secret_key, connect_timeout, read_timeout,
                   pool)


@functools.lru_cache(maxsize=256)
def _client(endpoint: str, verify, access_key: str, secret_key: str, connect_timeout: float, read_timeout: float,
            pool: int):
    # One session per process: it loads S3's service model once (a fresh session reads and
    # parses it again, 0.15 s per client). Sessions are not thread-safe: clients are made under a lock.
    global _session
    with _session_lock:
        _session = _session or boto3.session.Session()
        return _session.client(
            "s3",
            endpoint_url=endpoint,
            verify=verify,  # https (minio.tls): the cluster's CA, nothing else
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            region_name="us-east-1",
            config=Config(
                signature_version="s3v4",
                # UNSIGNED-PAYLOAD: SigV4 would SHA-256 every PUT body on both ends (PUTs 1.6x
                # slower here). Traffic stays on loopback or the project's own links, and FasterFS
                # checks content end to end itself (xxh3 per chunk, CRC32 sums per sort).
                s3={"addressing_style": "path", "payload_signing_enabled": False},
                max_pool_connections=pool,
                connect_timeout=connect_timeout,
                read_timeout=read_timeout,
                retries={"max_attempts": 1, "mode": "standard"},
                # MinIO needs no checksums beyond ours; skipping them keeps GETs lean.
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )



class ServerError(OSError):
    """MinIO answered a GET with an error status (a 5xx: it could not serve the object, e.g. its
    own bitrot check failed)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status

def is_missing(error: BaseException) -> bool:
    """Whether `error` is MinIO answering that the object is not there (404: deleted, or never
    written), as opposed to a MinIO that could not answer."""
    from botocore.exceptions import ClientError

    if isinstance(error, ClientError):
        return error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404
    return isinstance(error, ServerError) and error.status == 404


_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"  # S3's XML namespace
DELETE_BATCH = 1000  # S3's most keys in one DeleteObjects
Listed = list[tuple[str, int]]  # (key, size) of objects; named here, where `list` is not MarkedGetter.list
Prefixes = list[str]
Keys = list[str]


def _own_address(host: str) -> bool:
    """Whether `host` (an address) is this host's own: a socket can be bound to it."""
    import ipaddress
    import socket

    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:  # a name, not an address
        return False
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((host, 0))
        except OSError:
            return False
    return True


class MarkedGetter:
    """Signed GETs over sockets that carry SO_MARK, so the kernel's request tracker can
    tell the cache filler's own traffic from readers' (it skips packets with the mark).
    boto3 cannot set socket options, hence this small signed-request client."""

    def __init__(self, endpoint: str, creds: Credentials, mark: int, timeout: float | urllib3.Timeout = 10.0,
                 pool: int = 8):
        import socket
        from urllib.parse import urlparse

        from botocore.auth import S3SigV4Auth
        from botocore.credentials import Credentials as BotoCredentials
        from urllib3 import HTTPConnectionPool, HTTPSConnectionPool
        from urllib3.connection import HTTPConnection

        url = urlparse(endpoint)
        if url.hostname is None:
            raise FasterFSError(f"MinIO endpoint {endpoint!r} names no host")
        self.endpoint, self.mark, self.host = endpoint, mark, url.hostname
        options = HTTPConnection.default_socket_options + ([(socket.SOL_SOCKET, socket.SO_MARK, mark)] if mark else [])
        pool_cls = HTTPSConnectionPool if url.scheme == "https" else HTTPConnectionPool
        self.pool = pool_cls(url.hostname, url.port, maxsize=pool, block=False, timeout=timeout,
                             retries=False, socket_options=options, **tls.urllib3_options(endpoint))
        self.creds = BotoCredentials(creds.access_key, creds.secret_key)
        self.signer = S3SigV4Auth(self.creds, "s3", "us-east-1")

    def get(self, bucket: str, key: str) -> tuple[bytes, str]:
        """The object's bytes and ETag; KeyError if it does not exist."""
        data, headers = self.get_object(bucket, key)
        return data, headers.get("ETag", "").strip('"')

    def get_object(self, bucket: str, key: str, start: int | None = None,
                   stop: int | None = None) -> tuple[bytes, dict]:
        """The object's bytes (or bytes [start, stop): a ranged GET) and response headers (its
        metadata among them)."""
        from urllib.parse import quote

        path = f"/{bucket}/{quote(key)}"
        headers = {"Range": f"bytes={start}-{stop - 1}"} if start is not None and stop is not None else {}
        ranged = bool(headers)
        response = self._signed("GET", path, headers)
        if response.status == 404:
            raise KeyError(f"{path} not found on {self.endpoint}")
        if response.status != (206 if ranged else 200):
            raise ServerError(response.status, f"GET {path} on {self.endpoint}: HTTP {response.status} "
                                               f"{response.data[:200]!r}")
        return response.data, response.headers

    def presign(self, bucket: str, key: str, expires_s: int) -> str:
        """A URL that GETs the object for `expires_s` seconds without the key: what the mount's
        daemon fetches with (it holds no secret). The URL is a capability: never logged."""
        from urllib.parse import quote

        from botocore.auth import S3SigV4QueryAuth
        from botocore.awsrequest import AWSRequest

        request = AWSRequest(method="GET", url=f"{self.endpoint}/{bucket}/{quote(key)}")
        S3SigV4QueryAuth(self.creds, "s3", "us-east-1", expires=expires_s).add_auth(request)
        return request.url

    def holds(self, bucket: str, key: str) -> bool:
        """Whether the object is there now (a HEAD: unlike a listing, which MinIO may answer
        from its metacache, it sees a write at once)."""
        from urllib.parse import quote

        response = self._signed("HEAD", f"/{bucket}/{quote(key)}")
        if response.status not in (200, 404):
            raise ServerError(response.status, f"HEAD /{bucket}/{key} on {self.endpoint}: HTTP {response.status}")
        return response.status == 200

    def list(self, bucket: str, prefix: str = ""):
        """(key, size) of every object under `prefix`, page by page (ListObjectsV2). Parsed with
        ElementTree, not boto3: boto3's parser (and its date parsing) cost ~150 us per object,
        1.5 s of CPU to list 10,000 chunks."""
        for root in self._pages(bucket, prefix):
            yield from self._objects(root)

    def top(self, bucket: str) -> tuple[Prefixes, Listed]:
        """The bucket's top-level prefixes ("name/") and the (key, size) of the objects beside them."""
        prefixes: Prefixes = []
        objects: Listed = []
        for root in self._pages(bucket, "", "/"):
            prefixes += [p.findtext(f"{_NS}Prefix") for p in root.iter(f"{_NS}CommonPrefixes")]
            objects += self._objects(root)
        return prefixes, objects

    @staticmethod
    def _objects(root) -> Listed:
        return [(item.findtext(f"{_NS}Key"), int(item.findtext(f"{_NS}Size") or 0))
                for item in root.iter(f"{_NS}Contents")]

    def _pages(self, bucket: str, prefix: str, delimiter: str = ""):
        from urllib.parse import urlencode
        from xml.etree import ElementTree

        token = None
        while True:
            query = {"list-type": "2", "prefix": prefix, **({"delimiter": delimiter} if delimiter else {}),
                     **({"continuation-token": token} if token else {})}
            response = self._signed("GET", f"/{bucket}?{urlencode(sorted(query.items()))}")
            if response.status != 200:
                raise OSError(f"listing {bucket}/{prefix} on {self.endpoint}: HTTP {response.status} "
                              f"{response.data[:200]!r}")
            root = ElementTree.fromstring(response.data)
            yield root
            token = root.findtext(f"{_NS}NextContinuationToken")
            if root.findtext(f"{_NS}IsTruncated") != "true" or not token:
                return

    def delete(self, bucket: str, keys: Keys) -> Keys:
        """Delete `keys`; those MinIO did not delete. To a MinIO of this host, over sockets with
        the mark the kernel programs skip: a thousand a request (DeleteObjects, which they would
        see as a write to the whole bucket). Elsewhere the mark does not travel (a packet's mark
        is its host's own): one DELETE a key, which the programs there see key by key. A key
        cost boto3 1.4 ms of this process's CPU and 2.7 ms (measured); a DeleteObjects, 0.012 ms
        and 0.29 ms, a signed DELETE 0.6 ms and 1.7 ms."""
        from urllib.parse import quote

        if self.mark and _own_address(self.host):
            return [key for i in range(0, len(keys), DELETE_BATCH)
                    for key in self._delete_many(bucket, keys[i:i + DELETE_BATCH])]
        missed = []
        for key in keys:
            response = self._signed("DELETE", f"/{bucket}/{quote(key)}")
            if response.status != 204:
                missed.append(key)
        return missed

    def _delete_many(self, bucket: str, keys: Keys) -> Keys:
        import base64
        import hashlib
        from xml.etree import ElementTree
        from xml.sax.saxutils import escape

        body = ("<Delete><Quiet>true</Quiet>" + "".join(f"<Object><Key>{escape(k)}</Key></Object>" for k in keys)
                + "</Delete>").encode()
        headers = {"Content-MD5": base64.b64encode(hashlib.md5(body).digest()).decode(),  # MinIO requires it
                   "Content-Type": "application/xml"}
        response = self._signed("POST", f"/{bucket}?delete", headers, body)
        if response.status != 200:
            raise ServerError(response.status, f"DeleteObjects in {bucket} on {self.endpoint}: HTTP "
                                               f"{response.status} {response.data[:200]!r}")
        return [e.findtext(f"{_NS}Key") or "" for e in ElementTree.fromstring(response.data).iter(f"{_NS}Error")]

    def answers(self, bucket: str, timeout: float = 1.0) -> bool:
        """Whether this MinIO serves `bucket` now: a signed HEAD of it within `timeout`."""
        return self._probe(lambda **o: self._signed("HEAD", f"/{bucket}", None, **o), timeout)

    def live(self, timeout: float = 1.0) -> bool:
        """Whether the server is up, by MinIO's own liveness probe (no bucket, no keys needed:
        what its supervisor asks of a server it just started)."""
        return self._probe(lambda **o: self.pool.request("GET", "/minio/health/live", preload_content=True, **o),
                           timeout)

    @staticmethod
    def _probe(request, timeout: float) -> bool:
        """One retry: the server may have closed the kept-alive connection just as it was reused.
        The one probe of a MinIO's health, whoever asks (its supervisor, repair, status)."""
        from urllib3 import Retry
        from urllib3.exceptions import HTTPError

        try:
            return request(timeout=timeout, retries=Retry(total=1, connect=1, read=1, redirect=0, status=0)).status \
                == 200
        except (HTTPError, OSError):
            return False

    def _signed(self, method: str, path: str, headers: dict | None = None, body: bytes | None = None, **options):
        from botocore.awsrequest import AWSRequest

        request = AWSRequest(method=method, url=self.endpoint + path, headers=headers or {}, data=body)
        self.signer.add_auth(request)
        return self.pool.request(method, path, headers=dict(request.headers.items()), body=body, **options)

    def close(self) -> None:
        self.pool.close()


class MarkedPool:
    """One MarkedGetter per node's MinIO, made on first use and kept (their kept-alive connections
    are what the kernel and SOCK_OPS see of a node's own traffic). `endpoint_of(node)` names a
    node's MinIO."""

    def __init__(self, creds: Credentials, mark: int, endpoint_of, timeout: float = 10.0):
        self.creds, self.mark, self.endpoint_of, self.timeout = creds, mark, endpoint_of, timeout
        self._getters: dict[str, MarkedGetter] = {}
        self._lock = threading.Lock()

    def __call__(self, node: int) -> MarkedGetter:
        endpoint = self.endpoint_of(node)
        with self._lock:
            if endpoint not in self._getters:
                self._getters[endpoint] = MarkedGetter(endpoint, self.creds, self.mark, self.timeout)
            return self._getters[endpoint]

    def close(self) -> None:
        with self._lock:
            for getter in self._getters.values():
                getter.close()
            self._getters.clear()
