"""An S3 upload cut off mid-way leaves no incomplete multipart upload behind, against moto's S3 server behind a relay
that is cut off mid-part (as a frozen server or a network partition looks to the client) and restored a few seconds
later: whatever the client sent while cut off is lost, so only an abort asked for again after the thaw can clean up.

- ``S3Store.put`` whose part times out: the error surfaces, and the upload is aborted once the server answers again.
- ``compilecache publish`` (the warm-up's publish container) sent SIGTERM while its part hangs: it aborts the upload
  before it exits (status 143, the termination message says why), as Kubernetes' grace period allows."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import boto3
import pytest

from cachelib.keyformat import CacheKey
from cachelib.publish import pack
from cachelib.stores import StoreUnavailable, open_store
from cachelib.stores.s3store import ABORT_SECONDS
from cachelib.units import MiB
from tests.cachelib.helpers import BASE_FIELDS, make_outdir
from tests.infra.relay import PartitionRelay
from testsupport.servers import S3Server
from testsupport.wait import wait_for

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

pytestmark = pytest.mark.slow  # starts a server

REPO = Path(__file__).resolve().parents[2]
CUT_SECONDS = 3.0
"""How long the relay stays cut off: longer than a part's timeout (1 s), so the upload fails while it lasts."""


def relayed_bucket(s3_server: S3Server, relay: PartitionRelay, retries: int = 0) -> tuple[str, str]:
    """A new bucket's store URL through ``relay`` (5 MiB parts, one at a time, 1 s timeouts, ``retries`` client
    retries), and its bucket."""
    url = s3_server.new_bucket(part="5M", workers="1", timeout="1", retries=str(retries))
    url = url.replace(s3_server.endpoint, f"http://{relay.host}:{relay.port}")
    return url, urlsplit(url).netloc


def incomplete_uploads(s3_server: S3Server, bucket: str) -> list[str]:
    client: S3Client = boto3.client("s3", endpoint_url=s3_server.endpoint)
    return [u["Key"] for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


def relay_to(s3_server: S3Server, freeze_after: int, answers_only: bool = False) -> PartitionRelay:
    upstream = urlsplit(s3_server.endpoint)
    return PartitionRelay(("127.0.0.1", 0), (str(upstream.hostname), int(upstream.port or 80)), freeze_after,
                          answers_only=answers_only)


def thaw_later(relay: PartitionRelay, seconds: float = CUT_SECONDS) -> threading.Thread:
    """Restore ``relay`` ``seconds`` after it was cut off."""
    def run() -> None:
        relay.frozen.wait(60)
        time.sleep(seconds)
        relay.thaw()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_put_cut_off_mid_part_aborts_its_upload_once_the_server_answers(s3_server: S3Server) -> None:
    with relay_to(s3_server, freeze_after=7 * MiB) as relay:  # the second of three 5 MiB parts
        url, bucket = relayed_bucket(s3_server, relay)
        thawed = thaw_later(relay)
        started = time.monotonic()
        with open_store(url) as store, pytest.raises(StoreUnavailable):
            store.put("big", io.BytesIO(os.urandom(11 * MiB + 5)), 11 * MiB + 5)
        took = time.monotonic() - started
        thawed.join(30)
        assert relay.sent >= 7 * MiB, "the relay was cut off mid-upload"
        assert incomplete_uploads(s3_server, bucket) == []
        assert CUT_SECONDS <= took < ABORT_SECONDS, "the abort was asked for again until the server answered"


@pytest.mark.parametrize(("retries", "held"), [(2, 12.0), (3, 1.5)], ids=["the-put-fails", "a-later-attempt-succeeds"])
def test_uploads_opened_by_requests_answered_too_late_are_aborted(s3_server: S3Server, retries: int, held: float
                                                                  ) -> None:
    """The server receives the upload's opening request (and the client's retries of it) but its answers are held:
    past every attempt (3 of 1 s each, with the client's pauses between them), or for 1.5 s, past the first one only.
    Each request the server received opened an upload whose id the put never learnt. Failed or not, the put leaves
    no incomplete upload of the object behind (an upload of another object of the bucket is left alone), and a
    bundle that did go up is whole."""
    with relay_to(s3_server, freeze_after=1, answers_only=True) as relay:
        url, bucket = relayed_bucket(s3_server, relay, retries=retries)
        client: S3Client = boto3.client("s3", endpoint_url=s3_server.endpoint)
        other = client.create_multipart_upload(Bucket=bucket, Key="someone-else")["UploadId"]
        thawed = thaw_later(relay, held)
        body = os.urandom(11 * MiB + 5)
        with open_store(url) as store:
            if held > retries * 3:
                with pytest.raises(StoreUnavailable):
                    store.put("big", io.BytesIO(body), len(body))
            else:
                store.put("big", io.BytesIO(body), len(body))
                with store.get("big") as stream:
                    assert stream.read() == body
        thawed.join(30)
    assert incomplete_uploads(s3_server, bucket) == ["someone-else"]
    client.abort_multipart_upload(Bucket=bucket, Key="someone-else", UploadId=other)


def test_publish_sent_sigterm_mid_part_aborts_its_upload_before_it_exits(s3_server: S3Server,
                                                                          tmp_path: Path) -> None:
    out = make_outdir(tmp_path / "out", CacheKey(**BASE_FIELDS), files={"blob": os.urandom(11 * MiB)})
    bundle = tmp_path / "big.ccb"
    pack(out, bundle, level=1)  # random bytes do not shrink: three 5 MiB parts
    termination = tmp_path / "termination-log"
    with relay_to(s3_server, freeze_after=7 * MiB) as relay:
        url, bucket = relayed_bucket(s3_server, relay)
        env = {**os.environ, **s3_server.env, "COMPILECACHE_TERMINATION_LOG": str(termination)}
        publish = subprocess.Popen([sys.executable, "-m", "cachelib.cli", "publish", str(bundle), "--store", url],
                                   cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            wait_for(relay.frozen.is_set, 60, "the publish to be cut off mid-part")
            publish.send_signal(signal.SIGTERM)  # the pod is deleted: the kubelet's SIGTERM
            thawed = thaw_later(relay)
            _, err = publish.communicate(timeout=ABORT_SECONDS)
            thawed.join(30)
        finally:
            if publish.poll() is None:
                publish.kill()
    assert publish.returncode == 128 + signal.SIGTERM, err.decode()
    assert "stopped by SIGTERM" in err.decode()
    message = json.loads(termination.read_text())
    assert message["result"] == "error" and "Terminated" in message["reason"], message
    assert incomplete_uploads(s3_server, bucket) == []

