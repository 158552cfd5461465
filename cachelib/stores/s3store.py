"""``s3://bucket/prefix``: objects as S3 objects under ``prefix/``.

Small objects go up in one PUT, larger ones as a multipart upload with parts sized for
the object and uploaded in parallel; S3 shows the object only once the upload completes,
so readers never see a partial object. An upload that fails on any path (an error, a
timeout, an exception raised into it such as the publish command's SIGTERM) is aborted at
once, without waiting for parts in flight, and the abort is tried again for up to
:data:`ABORT_SECONDS` while the server does not answer (a frozen or restarting server),
so that no incomplete upload keeps its parts' storage. The upload's opening request may have been
answered too late (a frozen server): the client asked again, and each request the server did receive opened an
upload whose id the publisher never learnt. After a failed upload, and after one whose opening was asked for more
than once, every other incomplete upload of the same object is listed and aborted too, within the same
:data:`ABORT_SECONDS`: an object key names one bundle, which one publisher at a time uploads (the operator starts one
warm-up per key), so an incomplete upload of it that is not the publisher's own is one it lost. (The time an upload
was opened cannot tell them apart: S3-compatible servers do not all keep it, moto's answers a fixed date.)
A process killed outright cannot abort: a bucket lifecycle rule (AbortIncompleteMultipartUpload) cleans those up.
Reads are parallel ranged GETs pinned to the ETag seen at open (``If-Match``): a reader racing a re-publish
either reads the version it opened or gets :class:`ObjectChanged`.
The object's sha256 travels as user metadata (``x-amz-meta-sha256``), given with the upload
itself: a single PUT hashes its body, a multipart upload of a stream that can seek (a local
bundle file, as ``publish`` gives) hashes it first and checks the digest again before it
completes. A multipart upload of a stream that cannot seek records none.
Credentials come from boto3's standard chain (``AWS_*`` environment, config files,
instance roles); the endpoint from the URL, else ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for_futures
from contextlib import AbstractContextManager, contextmanager
from itertools import chain
from typing import TYPE_CHECKING, Any, BinaryIO, cast

import boto3
import botocore.config
import botocore.exceptions

from cachelib.stores._stream import OrderedFetchStream, as_binary, read_pieces, seekable_sha256
from cachelib.stores.base import (
    InvalidObjectKey,
    NotFound,
    ObjectChanged,
    ObjectInfo,
    Store,
    StoreError,
    StoreUnavailable,
    check_key,
)
from cachelib.stores.urls import S3_MAX_PART, S3_MAX_PARTS, S3StoreURL
from cachelib.units import MiB

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

log = logging.getLogger(__name__)

DEFAULT_PART = 8 * MiB
UNKNOWN_SIZE_PART = 16 * MiB
"""Part size when the size is not announced: up to 160 GiB in 10,000 parts."""
ABORT_SECONDS = 60.0
"""How long an upload that failed keeps trying to abort itself while the server does not answer."""
ABORT_ATTEMPT_SECONDS = 5.0
"""The longest one abort request waits (less when the URL's timeout= is shorter): a frozen server is asked again
rather than waited for."""

_UNAVAILABLE_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "ExpiredToken",
        "InvalidAccessKeyId",
        "InvalidToken",
        "NoSuchBucket",
        "SignatureDoesNotMatch",
        "InternalError",
        "ServiceUnavailable",
        "SlowDown",
        "503",
        "500",
        "403",
    }
)
_MISSING_CODES = frozenset({"404", "NoSuchKey", "NotFound"})
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def plan_part_size(size: int | None) -> int:
    """Multipart part size for an object of ``size`` bytes.

    8 MiB parts (few requests, bounded memory per part in flight), grown in whole MiB for
    objects that would otherwise need more than S3's 10,000 parts.
    """
    if size is None:
        return UNKNOWN_SIZE_PART
    needed = math.ceil(size / S3_MAX_PARTS / MiB) * MiB
    return min(S3_MAX_PART, max(DEFAULT_PART, needed))


class S3Store(Store):
    """Objects in an S3 bucket (or an S3-compatible server) under a key prefix."""

    def __init__(
        self, config: S3StoreURL, url: str, *, endpoint: str | None, credentials: Mapping[str, str] | None = None
    ) -> None:
        """``credentials`` (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``)
        replace boto3's standard chain when given."""
        self.config = config
        self.url = url
        self.endpoint = endpoint
        self._base = f"{config.prefix}/" if config.prefix else ""
        client_config = botocore.config.Config(
            connect_timeout=config.timeout,
            read_timeout=config.timeout,
            retries={"total_max_attempts": config.retries + 1, "mode": "standard"},
            max_pool_connections=2 * config.workers + 2,
            s3=cast(Any, {"addressing_style": config.addressing}),
        )
        given = credentials or {}
        session = boto3.session.Session(
            aws_access_key_id=given.get("AWS_ACCESS_KEY_ID"),
            aws_secret_access_key=given.get("AWS_SECRET_ACCESS_KEY"),
            aws_session_token=given.get("AWS_SESSION_TOKEN"),
        )
        self._client: S3Client = session.client(
            "s3", endpoint_url=endpoint, region_name=config.region, config=client_config
        )
        attempt = min(config.timeout, ABORT_ATTEMPT_SECONDS)
        # Aborts go through a client of their own: one short attempt each, repeated by _abort until it answers.
        self._abort_client: S3Client = session.client(
            "s3", endpoint_url=endpoint, region_name=config.region,
            config=client_config.merge(botocore.config.Config(
                connect_timeout=attempt, read_timeout=attempt, retries={"total_max_attempts": 1})),
        )  # fmt: skip

    def object_key(self, key: str) -> str:
        return self._base + check_key(key)

    # -- put ------------------------------------------------------------------------------
    def put(self, key: str, stream: BinaryIO, size: int | None = None) -> ObjectInfo:
        name = self.object_key(key)
        part_size = self.config.part or plan_part_size(size)
        ahead = seekable_sha256(stream)
        digest = hashlib.sha256()
        with self._errors(key):
            pieces = read_pieces(stream, part_size, size, f"{self.url}: put {key}", digest)
            first = next(pieces, b"")
            second = next(pieces, None)
            if second is None:
                metadata = {"sha256": digest.hexdigest()}
                self._client.put_object(Bucket=self.config.bucket, Key=name, Body=first, Metadata=metadata)
            else:

                def same_bytes() -> None:
                    if ahead is not None and digest.hexdigest() != ahead:
                        raise StoreError(f"{self.url}: put {key}: the stream changed while it was uploaded")

                metadata = {"sha256": ahead} if ahead else {}
                self._multipart(name, chain([first, second], pieces), metadata, same_bytes)
        info = self.head(key)
        if info is None:
            raise StoreError(f"{self.url}: {key!r} is not visible after publishing it")
        return info

    def _multipart(
        self,
        name: str,
        pieces: Iterator[bytes],
        metadata: dict[str, str],
        before_complete: Callable[[], None],
    ) -> None:
        bucket = self.config.bucket
        try:
            opened = self._client.create_multipart_upload(Bucket=bucket, Key=name, Metadata=metadata)
        except BaseException:
            self._abort_orphans(name, keep=None, deadline=time.monotonic() + ABORT_SECONDS)
            raise
        upload_id = opened["UploadId"]
        asked_again = int(opened.get("ResponseMetadata", {}).get("RetryAttempts", 0)) > 0

        def upload(number: int, piece: bytes) -> dict[str, Any]:
            answer = self._client.upload_part(
                Bucket=bucket, Key=name, UploadId=upload_id, PartNumber=number, Body=piece
            )
            return {"PartNumber": number, "ETag": answer["ETag"]}

        parts: list[dict[str, Any]] = []
        pending: deque[Future[dict[str, Any]]] = deque()
        pool = ThreadPoolExecutor(max_workers=self.config.workers, thread_name_prefix="s3-put")
        try:
            for number, piece in enumerate(pieces, 1):
                if number > S3_MAX_PARTS:
                    raise StoreError(
                        f"{self.url}: {name!r} needs more than {S3_MAX_PARTS} parts; "
                        "announce the size or raise part= in the URL"
                    )
                if len(pending) >= self.config.workers:
                    parts.append(pending.popleft().result())
                pending.append(pool.submit(upload, number, piece))
            while pending:
                parts.append(pending.popleft().result())
            before_complete()
            self._client.complete_multipart_upload(
                Bucket=bucket,
                Key=name,
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},  # type: ignore[typeddict-item]
            )
        except BaseException:
            for future in pending:
                future.cancel()
            deadline = time.monotonic() + ABORT_SECONDS
            self._abort(name, upload_id, in_flight=[f for f in pending if not f.cancelled()], deadline=deadline)
            self._abort_orphans(name, keep=upload_id, deadline=deadline)
            raise
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        if asked_again:  # an opening request answered late may have opened an upload nobody completes
            self._abort_orphans(name, keep=upload_id, deadline=time.monotonic() + ABORT_SECONDS)

    def _abort(self, name: str, upload_id: str, in_flight: Collection[Future[dict[str, Any]]], deadline: float
               ) -> None:
        """Abort a failed upload at once, not waiting for the parts in flight (a frozen server would hold them
        until their timeouts, past a SIGTERM's grace period). Asked again while the server does not answer, up
        to :data:`ABORT_SECONDS`; and once more after the parts that were in flight have ended, since S3 may
        keep a part that arrived after the abort."""
        if not self._abort_until(name, upload_id, deadline):
            return
        if in_flight:
            wait_for_futures(in_flight, timeout=max(0.0, deadline - time.monotonic()))
            if any(f.done() and f.exception() is None for f in in_flight):
                self._abort_until(name, upload_id, deadline)

    def _abort_orphans(self, name: str, *, keep: str | None, deadline: float) -> None:
        """Abort the incomplete uploads of ``name`` but ``keep`` (one already aborted or completed): those whose
        opening answer never reached this publisher. Listed again while the server does not
        answer, until ``deadline``; what cannot be listed is left to the bucket's lifecycle rule, said once."""
        while True:
            try:
                orphans = [upload["UploadId"] for upload in self._uploads_of(name) if upload["UploadId"] != keep]
                break
            except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
                if time.monotonic() >= deadline:
                    log.warning("%s: could not list the incomplete uploads of %r (%s); a bucket lifecycle rule "
                                "(AbortIncompleteMultipartUpload) removes them", self.url, name, exc)
                    return
                time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        for orphan in orphans:
            self._abort_until(name, orphan, deadline)

    def _uploads_of(self, name: str) -> Iterator[Mapping[str, Any]]:
        """The incomplete multipart uploads of the object ``name`` (of it alone, not of names it begins)."""
        pages = self._abort_client.get_paginator("list_multipart_uploads")
        for page in pages.paginate(Bucket=self.config.bucket, Prefix=name):
            for upload in page.get("Uploads", []):
                if upload.get("Key") == name:
                    yield cast(Mapping[str, Any], upload)

    def _abort_until(self, name: str, upload_id: str, deadline: float) -> bool:
        """One abort, asked again until it is answered or ``deadline`` passes; whether the upload is gone."""
        while True:
            try:
                self._abort_client.abort_multipart_upload(Bucket=self.config.bucket, Key=name, UploadId=upload_id)
                return True
            except botocore.exceptions.ClientError as exc:
                if _code(exc) in ("NoSuchUpload", "404"):
                    return True  # gone already (an earlier attempt the server answered late)
                problem: Exception = exc
            except botocore.exceptions.BotoCoreError as exc:
                problem = exc
            if time.monotonic() >= deadline:
                log.warning("%s: could not abort the multipart upload of %r (%s); a bucket lifecycle rule "
                            "(AbortIncompleteMultipartUpload) removes it", self.url, name, problem)
                return False
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))

    # -- get / head -----------------------------------------------------------------------
    def _head(self, key: str) -> dict[str, Any] | None:
        with self._errors(key):
            try:
                answer = self._client.head_object(Bucket=self.config.bucket, Key=self.object_key(key))
            except botocore.exceptions.ClientError as exc:
                if _code(exc) in _MISSING_CODES:
                    return None
                raise
        return dict(answer)

    def head(self, key: str) -> ObjectInfo | None:
        answer = self._head(key)
        if answer is None:
            return None
        recorded = str(answer.get("Metadata", {}).get("sha256", "")).lower()
        return ObjectInfo(
            key=key,
            size=int(answer["ContentLength"]),
            modified=answer["LastModified"].timestamp(),
            sha256=recorded if _SHA256.match(recorded) else None,
        )

    def get(self, key: str) -> AbstractContextManager[BinaryIO]:
        answer = self._head(key)
        if answer is None:
            raise NotFound(f"{self.url}: no object {key!r}")
        size = int(answer["ContentLength"])
        etag = str(answer["ETag"])
        step = self.config.range
        count = math.ceil(size / step)
        name = self.object_key(key)

        def fetch(index: int) -> bytes:
            start = index * step
            end = min(size, start + step) - 1
            with self._errors(key):
                try:
                    body = self._client.get_object(
                        Bucket=self.config.bucket, Key=name, Range=f"bytes={start}-{end}", IfMatch=etag
                    )["Body"]
                    data = body.read()
                except botocore.exceptions.ClientError as exc:
                    if _code(exc) in _MISSING_CODES | {"PreconditionFailed", "412"}:
                        raise ObjectChanged(f"{self.url}: {key!r} was replaced or deleted while being read") from exc
                    raise
            if len(data) != end - start + 1:
                raise StoreError(f"{self.url}: {key!r}: range {start}-{end} returned {len(data)} bytes")
            return data

        workers = self.config.workers
        return as_binary(
            OrderedFetchStream(fetch, count, workers=workers, window=2 * workers, name="s3-get", size=size)
        )

    # -- list / delete --------------------------------------------------------------------
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        paginator = self._client.get_paginator("list_objects_v2")
        pages = paginator.paginate(Bucket=self.config.bucket, Prefix=self._base + prefix)
        with self._errors(prefix):
            for page in pages:
                for item in page.get("Contents", []):
                    key = item["Key"][len(self._base) :]
                    try:
                        check_key(key)
                    except InvalidObjectKey:
                        continue  # not one of ours (e.g. a folder marker)
                    yield ObjectInfo(key=key, size=int(item["Size"]), modified=item["LastModified"].timestamp())

    def delete(self, key: str) -> bool:
        if self._head(key) is None:
            return False
        with self._errors(key):
            self._client.delete_object(Bucket=self.config.bucket, Key=self.object_key(key))
        return True

    def close(self) -> None:
        self._client.close()
        self._abort_client.close()

    # -- errors ---------------------------------------------------------------------------
    @contextmanager
    def _errors(self, key: str) -> Iterator[None]:
        where = f"{self.url}" + (f" (endpoint {self.endpoint})" if self.endpoint else "")
        try:
            yield
        except (
            botocore.exceptions.ConnectionError,  # refused, DNS, connect timeout
            botocore.exceptions.HTTPClientError,  # read timeout, connection closed
            botocore.exceptions.NoCredentialsError,
            botocore.exceptions.PartialCredentialsError,
            botocore.exceptions.CredentialRetrievalError,
        ) as exc:
            raise StoreUnavailable(f"{where}: {exc}") from exc
        except botocore.exceptions.ClientError as exc:
            if _code(exc) in _UNAVAILABLE_CODES:
                raise StoreUnavailable(f"{where}: {key!r}: {exc}") from exc
            raise StoreError(f"{where}: {key!r}: {exc}") from exc
        except botocore.exceptions.BotoCoreError as exc:
            raise StoreError(f"{where}: {key!r}: {exc}") from exc


def _code(exc: botocore.exceptions.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))
