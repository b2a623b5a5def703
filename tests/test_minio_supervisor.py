"""MinioSupervisor with a real MinIO and no Ray: a killed server comes back ready for readers
(its bucket and its read-only user, even from a wiped disk); a held one stays down; the next
incarnation takes over a server serving as it would run it, and stops one it would not; its bucket
counted, and listed in paced slices (bucket_walk)."""
import os
import shutil
import signal
import socket
import threading
import time

import boto3
import pytest
from botocore.config import Config
from conftest import wait_until

from fasterfs.control import credentials
from fasterfs.core import config, manifest, process
from fasterfs.core.config import minio_binary
from fasterfs.node.minio_server import MinioServer
from fasterfs.node.minio_supervisor import MinioSupervisor

ADDRESS = "127.0.77.1"  # no cluster of the suite uses this address


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((ADDRESS, 0))
        return s.getsockname()[1]


@pytest.fixture
def supervisor(tmp_path):
    binary = minio_binary(config.load([]))  # names how to install it when it is missing
    keys = credentials.create(tmp_path / "keys.json")
    server = MinioServer(binary, ADDRESS, _free_port(), _free_port(), tmp_path / "minio", tmp_path / "minio.log",
                         keys.admin)
    sup = MinioSupervisor(server, "bkt", keys.reader, start_timeout_s=30)
    sup.start()
    yield sup, keys
    sup.stop()
    assert sup.server.pid is None


def _reader(sup, keys):
    return boto3.client("s3", endpoint_url=sup.server.endpoint, aws_access_key_id=keys.reader.access_key,
                        aws_secret_access_key=keys.reader.secret_key, region_name="us-east-1",
                        config=Config(retries={"max_attempts": 1}))


def test_a_killed_minio_comes_back_with_its_bucket_and_reader(supervisor):
    sup, keys = supervisor
    assert sup.tick() is False  # alive: nothing to do
    first = sup.server.pid
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: not process.running(first), 10, "the killed MinIO gone")
    shutil.rmtree(sup.server.data_dir)  # the disk was replaced too
    assert sup.tick() is True
    healthy, pid, restarts, held = sup.health()
    assert healthy and pid != first and restarts == 1 and not held
    # what a reader needs, as MinIO itself answers it: the bucket lists with the reader's keys
    assert _reader(sup, keys).list_objects_v2(Bucket="bkt")["KeyCount"] == 0


def test_the_next_incarnation_takes_over_a_serving_minio_and_stops_one_with_other_keys(supervisor, tmp_path):
    """A StorageNode restarted (`fasterfs nodes restart`): the server its last incarnation left
    serving is taken over — the same pid, which the kernel shows running its command line, no
    child of this process (it outlives whoever started it) — and an object put before reads
    after with no restart between (MinIO's own uptime metric, not ours, says so). With rotated
    keys it is not taken over: it is stopped and a new server answers only the new keys."""
    sup, keys = supervisor
    server, first = sup.server, sup.server.pid
    assert int(open(f"/proc/{first}/stat").read().rsplit(")", 1)[1].split()[1]) != os.getpid()  # not our child
    admin = boto3.client("s3", endpoint_url=server.endpoint, aws_access_key_id=keys.admin.access_key,
                         aws_secret_access_key=keys.admin.secret_key, region_name="us-east-1")
    admin.put_object(Bucket="bkt", Key="before", Body=b"kept")
    again = MinioServer(server.binary, server.address, server.port, server.console_port, server.data_dir,
                        server.log_path, keys.admin)
    assert again.adopt(lambda s: boto3.client("s3", endpoint_url=s.endpoint, aws_access_key_id=s.creds.access_key,
                                              aws_secret_access_key=s.creds.secret_key,
                                              region_name="us-east-1").list_buckets()) == first
    assert again.alive() and process.running(first)
    assert _reader(sup, keys).get_object(Bucket="bkt", Key="before")["Body"].read() == b"kept"
    rotated = credentials.create(tmp_path / "rotated.json")
    other = MinioServer(server.binary, server.address, server.port, server.console_port, server.data_dir,
                        server.log_path, rotated.admin)
    assert other.adopt(lambda s: boto3.client("s3", endpoint_url=s.endpoint, aws_access_key_id=s.creds.access_key,
                                              aws_secret_access_key=s.creds.secret_key, region_name="us-east-1",
                                              config=Config(retries={"max_attempts": 1})).list_buckets()) is None
    assert other.reap_stale() == first and not process.running(first)
    sup.server, sup.reader = other, rotated.reader
    sup.start()  # none serves: a new server, with the new keys
    assert other.pid not in (None, first)
    with pytest.raises(Exception, match="InvalidAccessKeyId|SignatureDoesNotMatch|Forbidden"):
        admin.list_buckets()
    assert _reader(sup, rotated).list_objects_v2(Bucket="bkt")["KeyCount"] == 1  # its bucket's object kept


def test_a_held_minio_stays_down_until_released(supervisor):
    sup, keys = supervisor
    sup.hold()
    assert sup.tick() is False
    healthy, pid, restarts, held = sup.health()
    assert not healthy and pid is None and held and restarts == 0
    sup.release()
    assert sup.health()[0] and not sup.held
    assert _reader(sup, keys).list_objects_v2(Bucket="bkt")["KeyCount"] == 0


def test_the_object_count_lists_at_most_a_share_of_the_time(supervisor):
    """Counted by listing MinIO: what boto3 stored, listed in the caller when asked with
    max_age_s=0; asked again at once with any age allowed, the last count (listing more often
    would take over COUNT_SHARE of the time), with its age; once that spacing has passed, the
    last count at once while a listing runs in the background, and the new count after it;
    asked with no bound on its age (the dashboard), the last count however old."""
    from conftest import wait_until

    from fasterfs.control import s3
    from fasterfs.node.minio_supervisor import COUNT_SHARE

    sup, keys = supervisor
    admin = s3.client(sup.server.endpoint, keys.admin)
    for i in range(200):
        admin.put_object(Bucket="bkt", Key=f"k/{i}", Body=b"x" * i)
    getter = s3.MarkedGetter(sup.server.endpoint, keys.reader, 0)
    listings = []

    class Counted:  # the real lister, each listing noted
        def list(self, bucket):
            listings.append(bucket)
            return getter.list(bucket)

    objects, size, age = sup.count(Counted(), 0)
    assert (objects, size, len(listings)) == (200, sum(range(200)), 1) and age < 1
    admin.put_object(Bucket="bkt", Key="k/one-more", Body=b"")
    spacing = sup._counted[3] / COUNT_SHARE
    objects, _, age = sup.count(Counted(), spacing / 10)  # allowed, but too soon for the share
    assert (objects, len(listings)) == (200, 1) and 0 < age < spacing
    release = threading.Event()

    class Held(Counted):  # a listing that ends when the test says so: the count answers before it
        def list(self, bucket):
            release.wait(10)
            return super().list(bucket)
    time.sleep(spacing)
    assert sup.count(Held(), spacing / 10)[0] == 200  # the last count, not waited for
    release.set()
    wait_until(lambda: sup.count(Counted(), 3600)[0] == 201, 10, "the count listed in the background")
    assert len(listings) == 2
    assert sup.count(Counted(), 0)[0] == 201 and len(listings) == 3  # `fasterfs status`: listed now
    time.sleep(3 * spacing)
    assert sup.count(Counted(), float("inf"))[0] == 201 and len(listings) == 3  # the dashboard's: never again
    getter.close()


def test_a_count_asked_for_now_waits_a_bounded_time_then_answers_with_the_last(supervisor):
    """A listing slower than the wait (a million objects take about a minute): asked with
    max_age_s=0, the answer comes after wait_s with no count yet rather than blocking the node;
    asked again meanwhile, the same listing is joined, not a second begun; once it ends, its
    count is what MinIO holds (each key stored by boto3, counted by the listing)."""
    import threading

    from fasterfs.control import s3

    sup, keys = supervisor
    admin = s3.client(sup.server.endpoint, keys.admin)
    for i in range(20):
        admin.put_object(Bucket="bkt", Key=f"k/{i}", Body=b"x")
    getter = s3.MarkedGetter(sup.server.endpoint, keys.reader, 0)
    go, listings = threading.Event(), []

    class Slow:  # the real listing, held back until the test lets it go
        def list(self, bucket):
            listings.append(bucket)
            go.wait(30)
            return getter.list(bucket)

    began = time.monotonic()
    assert sup.count(Slow(), 0, wait_s=0.5) == (None, None, None)
    assert 0.4 < time.monotonic() - began < 5
    assert sup.count(Slow(), 0, wait_s=0.1)[0] is None and len(listings) == 1
    go.set()
    objects, size, age = sup.count(Slow(), 0, wait_s=10)  # a listing of its own, waited for
    assert (objects, size) == (20, 20) and age < 1
    getter.close()


def test_a_paced_walk_lists_every_object_slice_by_slice(supervisor):
    """bucket_walk over a bucket holding objects at its top, under datasets' prefixes and under
    files' hashed prefixes (manifest.object_prefix): the same (key, size) pairs as boto3's own
    paginated listing; one rest after each slice (every top-level prefix, files/ by each of 16
    first digits), each as long as the slice took times (1 / share - 1)."""
    import pytest

    from fasterfs.control import s3
    from fasterfs.write import bucket_walk

    sup, keys = supervisor
    admin = s3.client(sup.server.endpoint, keys.admin)
    stored = {"top.bin": 3, "ds/part-00000": 5, "ds/part-00001": 7, "other/x/y": 1}
    stored |= {f"{manifest.object_prefix(f'team/day-{i}.parquet', 'file')}g/part-00000": i for i in range(60)}
    for key, size in stored.items():
        admin.put_object(Bucket="bkt", Key=key, Body=b"x" * size)
    listed = {o["Key"]: o["Size"] for page in admin.get_paginator("list_objects_v2").paginate(Bucket="bkt")
              for o in page.get("Contents", [])}
    assert listed == stored
    getter = s3.MarkedGetter(sup.server.endpoint, keys.reader, 0)
    rests: list[float] = []
    walked = list(bucket_walk.walk(getter, "bkt", share=0.25, rest=rests.append))
    assert dict(walked) == listed and len(walked) == len(listed)  # each once
    assert len(rests) == 16 + 2 and all(r > 0 for r in rests)
    assert dict(bucket_walk.walk(getter, "bkt")) == listed  # share 1: never rests
    with pytest.raises(ValueError, match="share"):
        list(bucket_walk.walk(getter, "bkt", share=0))
    getter.close()


def test_a_minio_that_exits_at_start_is_named_with_its_last_words(tmp_path):
    """MinIO given a root password it refuses (shorter than its 8 characters): the error names
    the endpoint and carries the end of MinIO's own log, the same lines the log file holds."""
    import dataclasses

    binary = minio_binary(config.load([]))
    keys = credentials.create(tmp_path / "keys.json")
    server = MinioServer(binary, ADDRESS, _free_port(), _free_port(), tmp_path / "minio", tmp_path / "minio.log",
                         dataclasses.replace(keys.admin, secret_key="short"))
    with pytest.raises(Exception) as failed:
        server.start(30)
    said = str(failed.value)
    assert f"MinIO on {server.endpoint} exited at start" in said, said
    logged = [line for line in (tmp_path / "minio.log").read_text().splitlines() if line.strip()]
    assert logged and logged[-1] in said, (said, logged[-3:])
