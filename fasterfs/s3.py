"""boto3 clients for the nodes' MinIO servers: path-style requests (GET /bucket/key,
which the kernel programs parse), pooled connections, and fail-fast timeouts so a
dead node costs milliseconds before a replica is tried."""
from __future__ import annotations

import boto3
from botocore.config import Config

from .credentials import Credentials


def client(endpoint: str, creds: Credentials, connect_timeout: float = 1.0, read_timeout: float = 10.0,
           pool: int = 16):
    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=creds.access_key,
        aws_secret_access_key=creds.secret_key,
        region_name="us-east-1",
        config=Config(
            signature_version="s3v4",
            s3={"addressing_style": "path"},
            max_pool_connections=pool,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"max_attempts": 1, "mode": "standard"},
            # MinIO needs no checksums beyond ours; skipping them keeps GETs lean.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )
