"""TLS for MinIO (minio.tls=true): a certificate authority generated at `fasterfs up` on the
head, whose key never leaves it (0600 under the cluster root); each StorageNode makes its
own key on its own host and has the Registry (over Ray) sign a certificate for its address;
every process that learns the cluster's state learns the CA's certificate with it and
verifies every MinIO against it. Nothing travels but public certificates."""
from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

from ..core.errors import FasterFSError
from ..core.fsutil import atomic_write, owned

VALID_DAYS = 825  # what browsers and most verifiers still accept for a leaf certificate


def _load_ca(ca_dir: Path):
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_private_key((ca_dir / "ca.key").read_bytes(), password=None)
        cert = x509.load_pem_x509_certificate((ca_dir / "ca.crt").read_bytes())
    except (OSError, ValueError) as e:
        raise FasterFSError(f"the cluster's TLS certificate authority in {ca_dir} is unreadable: {e}") from None
    return key, cert


def create_ca(ca_dir: Path, cluster_name: str, rotate: bool = False) -> str:
    """The cluster's CA, made once and kept with the cluster's root (a new one with `rotate`):
    returns its certificate (PEM). Nodes get fresh keys and certificates at every start."""
    for path in (ca_dir, ca_dir / "ca.key", ca_dir / "ca.crt"):
        owned(path, "the cluster's TLS certificate authority:")
    if not rotate and (ca_dir / "ca.crt").exists() and (ca_dir / "ca.key").exists():
        return (ca_dir / "ca.crt").read_text()
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"FasterFS CA of cluster {cluster_name}")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    atomic_write(ca_dir / "ca.key", key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption()), mode=0o600)
    pem = cert.public_bytes(serialization.Encoding.PEM)
    atomic_write(ca_dir / "ca.crt", pem)
    return pem.decode()


def issue(ca_dir: Path, address: str, public_key_pem: str) -> str:
    """A server certificate for `address` (an IP, as MinIO endpoints are), signed by the CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_key, ca_cert = _load_ca(ca_dir)
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise FasterFSError(f"a MinIO certificate is for an IP address, not {address!r}") from None
    public = serialization.load_pem_public_key(public_key_pem.encode())
    if not isinstance(public, (rsa.RSAPublicKey, ec.EllipticCurvePublicKey, ed25519.Ed25519PublicKey,
                               ed448.Ed448PublicKey)):
        raise FasterFSError(f"a MinIO certificate is for an RSA, EC or EdDSA key, not {type(public).__name__}")
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"MinIO at {address}")]))
            .issuer_name(ca_cert.subject).public_key(public).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ip)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def server_files(certs_dir: Path, address: str, sign) -> str:
    """MinIO's --certs-dir for this host: a key made here (0600, never sent anywhere), the
    certificate `sign(address, public_key_pem)` returns with the CA's; returns the CA's."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    cert, ca = sign(address, public)
    atomic_write(certs_dir / "private.key", key.private_bytes(serialization.Encoding.PEM,
                                                              serialization.PrivateFormat.PKCS8,
                                                              serialization.NoEncryption()), mode=0o600)
    atomic_write(certs_dir / "public.crt", cert.encode())
    atomic_write(certs_dir / "CAs" / "ca.crt", ca.encode())
    return ca


# -- verifying: the CA every client of this process trusts --------------------------------

_ca_file: str | None = None


def _ca_path(ca_pem: str) -> Path:
    import hashlib

    digest = hashlib.sha256(ca_pem.encode()).hexdigest()[:16]
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"fasterfs-ca-{digest}.crt"


def trust(ca_pem: str) -> str:
    """Trust `ca_pem` for every https MinIO endpoint this process talks to (ClusterState calls
    this for whoever holds it); returns the file holding it, as botocore and urllib3 want a
    path. A public certificate: one file per CA on each host, removed by `fasterfs down`."""
    global _ca_file
    path = _ca_path(ca_pem)
    try:  # the name is predictable: trusted only if it is ours and holds exactly this CA
        trusted = path.lstat().st_uid == os.geteuid() and path.read_text() == ca_pem
    except OSError:
        trusted = False
    if not trusted:
        try:
            atomic_write(path, ca_pem.encode())
        except OSError:  # another user's file there (/tmp is sticky): a private one instead
            import tempfile

            fd, name = tempfile.mkstemp(prefix="fasterfs-ca-", suffix=".crt")
            with os.fdopen(fd, "w") as f:
                f.write(ca_pem)
            path = Path(name)
    _ca_file = str(path)
    return _ca_file


def forget(ca_pem: str) -> None:
    path = _ca_path(ca_pem)
    try:
        if path.lstat().st_uid == os.geteuid():  # never another user's, left at the same name
            path.unlink()
    except FileNotFoundError:
        pass


def ca_file(endpoint: str) -> str | None:
    """The CA file an https endpoint is verified with; None for http."""
    if not endpoint.startswith("https://"):
        return None
    if _ca_file is None or not Path(_ca_file).exists():
        raise FasterFSError(f"MinIO at {endpoint} speaks TLS but this process has not learnt the cluster's CA "
                            "(it comes with the cluster state from the Registry)")
    return _ca_file


def urllib3_options(endpoint: str) -> dict:
    """For urllib3 pools and pool managers: certificate required, checked against the CA."""
    ca = ca_file(endpoint)
    return {} if ca is None else {"cert_reqs": "CERT_REQUIRED", "ca_certs": ca}
