"""Credentials handed to open_store (for callers serving several owners in one process)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import ClassVar

import pytest

from cachelib.stores import StoreURLError, open_store


@pytest.mark.parametrize(
    ("url", "credentials", "message"),
    [
        ("file:///tmp/x", {"COMPILECACHE_REDIS_PASSWORD": "p"}, "does not apply to file:// stores (they take: none)"),
        ("redis://h/0", {"AWS_ACCESS_KEY_ID": "k"}, "does not apply to redis:// stores"),
        ("s3://bucket", {"COMPILECACHE_REDIS_PASSWORD": "p"}, "does not apply to s3:// stores"),
        ("s3://bucket", {"AWS_ACCESS_KEY_ID": "k"}, "need both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
    ],
)
def test_credentials_that_do_not_fit_the_store_are_refused(url: str, credentials: dict[str, str], message: str) -> None:
    with pytest.raises(StoreURLError) as caught:
        open_store(url, credentials=credentials)
    assert message in str(caught.value)


def test_empty_credentials_are_ignored() -> None:
    open_store("file:///tmp/x", credentials={"COMPILECACHE_REDIS_PASSWORD": ""}).close()


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[str]] = []

    def do_HEAD(self) -> None:
        self.seen.append(self.headers.get("Authorization", ""))
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recording_endpoint() -> Iterator[str]:
    """A plain HTTP server on loopback that records the Authorization header of each request."""
    _Recorder.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_s3_requests_are_signed_with_the_given_credentials(
    recording_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "FROM-THE-ENVIRONMENT")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    credentials = {"AWS_ACCESS_KEY_ID": "GIVEN-KEY-ID", "AWS_SECRET_ACCESS_KEY": "given-secret"}
    url = f"s3://bucket/p?endpoint={recording_endpoint}&region=us-east-1&retries=0"
    with open_store(url, credentials=credentials) as store:
        assert store.head("k") is None
    with open_store(url) as store:
        assert store.head("k") is None
    assert len(_Recorder.seen) == 2
    assert "Credential=GIVEN-KEY-ID/" in _Recorder.seen[0]
    assert "Credential=FROM-THE-ENVIRONMENT/" in _Recorder.seen[1]
